//! Property-based and exhaustive tests of the lock core
//! ([`warden::locks::LockManager`]), in one test binary:
//!
//! - [`reference`]: a naive model of the whole lock manager, transcribing
//!   Ganeti 3.0's `Locking.Allocation` and `Locking.Waiting`, with the
//!   worked examples of LOCKS.md run on it.
//! - [`lock_properties`]: proptest over random operation sequences: the
//!   real manager against the model after every step, and every property
//!   of LOCKS.md, "Properties every implementation must keep".
//! - [`lock_exhaustive`]: every sequence of up to four operations in a
//!   small scope, against the model.
//! - [`lock_extensions`]: proptest of fencing tokens, death marks, fifo
//!   fairness, deadlock refusal and whatIf (D65 to D69) against naive
//!   models, under every policy, through restarts and the store.
//! - [`harness`]: operations as data, applying them, comparing answers and
//!   states.
//! - [`queue_reference`]: a naive model of luxid's queue, and the queue
//!   core in a simulated world of job files and runner processes.
//! - [`queue_properties`]: proptest and an exhaustive small scope of the
//!   queue core against that model.
//! - [`torture`]: a short sweep of the crash harness (`bin/torture.rs`).

mod cli;
mod corpus;
mod daemon;
mod damaged_lock_state;
mod damaged_state;
mod events;
mod filter_cli;
mod ganeti_client;
mod harness;
mod load;
mod lock_exhaustive;
mod lock_extensions;
mod lock_properties;
mod luxid;
mod luxid_bad_input;
mod luxid_query;
mod luxid_workers;
mod prometheus_rules;
mod queue_properties;
mod queue_reference;
mod reference;
mod reporter;
mod runner;
mod scheduling;
mod storage_faults;
mod sync_faults;
mod timeouts;
mod torture;
mod wconfd_bad_input;
mod wconfd_config_check;
mod wconfd_fencing;
mod wconfd_liveness;
mod wconfd_rpc;
mod wconfd_security;
mod wconfd_workers;
mod why;
