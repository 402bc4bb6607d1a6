//! The lock core of wconfd: a pure state machine (no I/O, no clock, no
//! threads) implementing LOCKS.md.
//!
//! - [`name`]: lock names, levels, the lock order and group membership.
//! - [`owner`]: owners, modes, request entries, priorities.
//! - [`allocation`]: who holds what, directly and through groups, and the
//!   checks and blockers of one atomic update.
//! - [`manager`]: [`LockManager`], the allocation plus waiting requests: the
//!   whole of wconfd's lock state and every operation on it.
//! - [`grants`]: the fencing token counter, the deaths told to grants and
//!   the death marks (each holding's token is in the allocation).
//! - [`fairness`]: the lock policy (Ganeti or fifo fairness, deadlocks
//!   waited or refused) and the index of waiters fifo mode needs.
//! - [`op`]: the state-changing operations as values ([`LockOp`]), the one
//!   path both the daemon and journal replay take.

pub mod allocation;
#[cfg(test)]
mod extension_tests;
pub mod fairness;
pub mod grants;
pub mod manager;
pub mod name;
pub mod op;
pub mod owner;
#[cfg(test)]
mod worked_examples;

pub use allocation::LockError;

pub use fairness::{Deadlocks, Fairness, LockPolicy};
pub use grants::{Death, Grant, SavedGrants, Token};
pub use manager::{
    LockManager, PendingRequest, RestoreError, SavedExtensions, SavedPending, SavedState, Update,
    WhatIf,
};
pub use name::{Level, LockName, NameError};
pub use op::{LockOp, OpOutcome};
pub use owner::{Action, Entry, Ident, Mode, Owner, Priority};
