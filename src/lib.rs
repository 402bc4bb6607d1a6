//! warden: a job executor with a lock-daemon core.
//!
//! The library holds everything the binaries in `bin/` run: the pure lock
//! core ([`locks`]), the pure worker registry ([`workers`]), the wire
//! protocol ([`protocol`]), LUXI's generic query and its filter language
//! ([`query`]), a client of both
//! daemons ([`client`]), the `warden` command ([`cli`]), what both daemons
//! share at their edges ([`daemon`]), durable files
//! ([`store`]), the wconfd daemon ([`wconfd`]), the job runner that runs
//! one job's opcodes ([`runner`]), the settings file
//! `warden.toml` ([`settings`]), livelock files and the death probe
//! ([`liveness`]), the limits every part shares ([`limits`]), the few
//! raw OS calls std lacks ([`sys`]), and the measuring and reporting of the
//! benchmark binaries ([`bench`]), and the crash harness
//! of `bin/torture.rs` ([`torture`]); see `design/ARCHITECTURE.md` for the
//! whole plan.

#![deny(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod client;
pub mod connection;
pub mod daemon;
pub mod events;
pub mod jobs;
pub mod limits;
pub mod liveness;
pub mod locks;
pub mod logging;
pub mod luxid;
pub mod paths;
pub mod protocol;
pub mod query;
pub mod queue;
pub mod reporter;
pub mod runner;
pub mod scheduling;
pub mod settings;
pub mod store;
// The one module allowed `unsafe`, each use with its reason there.
#[allow(unsafe_code)]
pub mod sys;
pub mod text;
pub mod torture;
pub mod wconfd;
pub mod workers;
