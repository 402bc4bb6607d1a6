//! warden: a job executor with a lock-daemon core.
//!
//! The library holds everything the binaries in `bin/` run. Today that is the
//! pure lock core ([`locks`]) and the limits every part shares ([`limits`]);
//! see `design/ARCHITECTURE.md` for the whole plan.

pub mod limits;
pub mod locks;
pub mod protocol;
pub mod store;
