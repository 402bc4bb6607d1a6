//! Lock owners, modes and request entries (LOCKS.md, "Lock owners").

use std::fmt;

use super::name::LockName;

/// The first field of an owner: a job id or any other client name.
/// The derived order puts names before job ids, as Ganeti's `ClientType`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ident {
    Name(String),
    Job(u64),
}

/// A lock owner, Ganeti's `ClientId`: `[ident, livelock_path, pid]` on the
/// wire. Two owners are the same only if all three fields are equal; the
/// derived order (ident, livelock, pid) is the owner order of LOCKS.md
/// "Lock owners".
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    pub ident: Ident,
    pub livelock: String,
    pub pid: u32,
}

impl Owner {
    pub fn job(job_id: u64, livelock: impl Into<String>, pid: u32) -> Owner {
        Owner {
            ident: Ident::Job(job_id),
            livelock: livelock.into(),
            pid,
        }
    }

    pub fn named(name: impl Into<String>, livelock: impl Into<String>, pid: u32) -> Owner {
        Owner {
            ident: Ident::Name(name.into()),
            livelock: livelock.into(),
            pid,
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ident {
            Ident::Name(name) => write!(f, "[{name:?}, {:?}, {}]", self.livelock, self.pid),
            Ident::Job(id) => write!(f, "[{id}, {:?}, {}]", self.livelock, self.pid),
        }
    }
}

/// How an owner holds a lock. `Shared < Exclusive`, as Ganeti's `OwnerState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Shared,
    Exclusive,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Shared => "shared",
            Mode::Exclusive => "exclusive",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one entry of a request asks for a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Release,
    Acquire(Mode),
}

impl Action {
    /// The mode the owner holds once this entry is applied (`None`: not held).
    pub fn target(self) -> Option<Mode> {
        match self {
            Action::Release => None,
            Action::Acquire(mode) => Some(mode),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Release => "release",
            Action::Acquire(mode) => mode.as_str(),
        }
    }

    pub fn parse(text: &str) -> Option<Action> {
        match text {
            "release" => Some(Action::Release),
            "shared" => Some(Action::Acquire(Mode::Shared)),
            "exclusive" => Some(Action::Acquire(Mode::Exclusive)),
            _ => None,
        }
    }
}

/// One entry of a lock request: `[lockname, "shared" | "exclusive" | "release"]`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub lock: LockName,
    pub action: Action,
}

impl Entry {
    pub fn new(lock: LockName, action: Action) -> Entry {
        Entry { lock, action }
    }

    pub fn shared(lock: LockName) -> Entry {
        Entry::new(lock, Action::Acquire(Mode::Shared))
    }

    pub fn exclusive(lock: LockName) -> Entry {
        Entry::new(lock, Action::Acquire(Mode::Exclusive))
    }

    pub fn release(lock: LockName) -> Entry {
        Entry::new(lock, Action::Release)
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {}]", self.lock, self.action.as_str())
    }
}

/// Priority of a waiting request: smaller is more urgent (jobs use -20..19).
pub type Priority = i64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_order_puts_names_before_jobs_then_livelock_then_pid() {
        let mut owners = vec![
            Owner::job(2, "/l/a", 1),
            Owner::job(10, "/l/a", 1),
            Owner::named("zeta", "/l/a", 1),
            Owner::named("alpha", "/l/b", 1),
            Owner::named("alpha", "/l/a", 2),
            Owner::named("alpha", "/l/a", 1),
            Owner::job(2, "/l/a", 0),
        ];
        owners.sort();
        assert_eq!(
            owners,
            vec![
                Owner::named("alpha", "/l/a", 1),
                Owner::named("alpha", "/l/a", 2),
                Owner::named("alpha", "/l/b", 1),
                Owner::named("zeta", "/l/a", 1),
                Owner::job(2, "/l/a", 0),
                Owner::job(2, "/l/a", 1),
                Owner::job(10, "/l/a", 1),
            ]
        );
    }

    #[test]
    fn actions_parse_their_wire_names() {
        for action in [
            Action::Release,
            Action::Acquire(Mode::Shared),
            Action::Acquire(Mode::Exclusive),
        ] {
            assert_eq!(Action::parse(action.as_str()), Some(action));
        }
        assert_eq!(Action::parse("Exclusive"), None);
        assert!(Mode::Shared < Mode::Exclusive);
    }
}
