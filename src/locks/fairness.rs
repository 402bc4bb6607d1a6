//! The lock policy *(extension)*: fairness between waiters and new
//! requests, and what to do with a request that would close a cycle of
//! waits. The default is Ganeti's behaviour exactly.
//!
//! In fifo mode a request queues behind every waiting request ahead of it
//! in (priority, arrival) order whose entries conflict with its own, as
//! if that waiter held what it asks for, so a stream of compatible
//! requests cannot overtake a waiting exclusive one. An owner that holds
//! locks is never made to queue behind a waiter: it may be what the waiter
//! waits for. That rule also keeps fifo mode free of new deadlocks: the
//! owners queued behind waiters hold nothing, so nobody waits for them,
//! and queueing goes only towards earlier waiters, so it never closes a
//! cycle by itself.

use std::collections::{BTreeSet, HashMap};

use super::allocation::OwnerRef;
use super::name::LockName;
use super::owner::{Action, Entry, Mode, Priority};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fairness {
    /// Priorities order waiters among themselves only; a compatible new
    /// request is granted at once even if others wait.
    #[default]
    Ganeti,
    /// A new request queues behind conflicting earlier waiters.
    Fifo,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Deadlocks {
    /// A request that closes a cycle waits, as in Ganeti (forever).
    #[default]
    Wait,
    /// A waiting request that would close a cycle is refused, naming it.
    Refuse,
}

/// How the lock manager treats waiters. Part of the saved state: a journal
/// replays under the policy it was written with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockPolicy {
    pub fairness: Fairness,
    pub deadlocks: Deadlocks,
}

impl Fairness {
    pub fn as_str(self) -> &'static str {
        match self {
            Fairness::Ganeti => "ganeti",
            Fairness::Fifo => "fifo",
        }
    }

    pub fn parse(text: &str) -> Option<Fairness> {
        match text {
            "ganeti" => Some(Fairness::Ganeti),
            "fifo" => Some(Fairness::Fifo),
            _ => None,
        }
    }
}

impl Deadlocks {
    pub fn as_str(self) -> &'static str {
        match self {
            Deadlocks::Wait => "off",
            Deadlocks::Refuse => "refuse",
        }
    }

    pub fn parse(text: &str) -> Option<Deadlocks> {
        match text {
            "off" => Some(Deadlocks::Wait),
            "refuse" => Some(Deadlocks::Refuse),
            _ => None,
        }
    }
}

/// A waiter's place in the grant order: priority, then arrival (0 for
/// every waiter in Ganeti mode, which orders by owner), then owner.
pub type WaiterKey = (Priority, u64, OwnerRef);

/// Who waits for each lock, by mode, as the allocation indexes holders:
/// the conflicts of a request with the waiters ahead of it.
#[derive(Debug, Default)]
pub struct WaitIndex {
    locks: HashMap<LockName, Waiting>,
}

#[derive(Debug, Default)]
struct Waiting {
    exclusive: BTreeSet<WaiterKey>,
    shared: BTreeSet<WaiterKey>,
    /// Group locks only: waiters asking for members, in any mode.
    members: BTreeSet<WaiterKey>,
    /// Group locks only: waiters asking for members exclusively.
    member_exclusives: BTreeSet<WaiterKey>,
}

impl Waiting {
    fn is_empty(&self) -> bool {
        self.exclusive.is_empty()
            && self.shared.is_empty()
            && self.members.is_empty()
            && self.member_exclusives.is_empty()
    }
}

fn acquires(request: &[Entry]) -> impl Iterator<Item = (&LockName, Mode)> {
    request.iter().filter_map(|entry| match entry.action {
        Action::Acquire(mode) => Some((&entry.lock, mode)),
        Action::Release => None,
    })
}

impl WaitIndex {
    pub fn insert(&mut self, key: &WaiterKey, request: &[Entry]) {
        for (lock, mode) in acquires(request) {
            let waiting = self.locks.entry(lock.clone()).or_default();
            match mode {
                Mode::Exclusive => waiting.exclusive.insert(key.clone()),
                Mode::Shared => waiting.shared.insert(key.clone()),
            };
            if let Some(group) = lock.group() {
                let waiting = self.locks.entry(group).or_default();
                waiting.members.insert(key.clone());
                if mode == Mode::Exclusive {
                    waiting.member_exclusives.insert(key.clone());
                }
            }
        }
    }

    pub fn remove(&mut self, key: &WaiterKey, request: &[Entry]) {
        for (lock, mode) in acquires(request) {
            let mut touched = vec![lock.clone()];
            if let Some(waiting) = self.locks.get_mut(lock) {
                match mode {
                    Mode::Exclusive => waiting.exclusive.remove(key),
                    Mode::Shared => waiting.shared.remove(key),
                };
            }
            if let Some(group) = lock.group() {
                if let Some(waiting) = self.locks.get_mut(&group) {
                    waiting.members.remove(key);
                    waiting.member_exclusives.remove(key);
                }
                touched.push(group);
            }
            for lock in touched {
                if self.locks.get(&lock).is_some_and(Waiting::is_empty) {
                    self.locks.remove(&lock);
                }
            }
        }
    }

    /// The waiters ahead of `key` whose requests conflict with `request`
    /// (by the conflict rules of the allocation, as if each held what it
    /// asks for), less the owner of `key` itself; in owner order, without
    /// duplicates.
    pub fn ahead(&self, key: &WaiterKey, request: &[Entry]) -> Vec<OwnerRef> {
        let mut found: Vec<OwnerRef> = Vec::new();
        let mut take = |set: &BTreeSet<WaiterKey>| {
            found.extend(set.range(..key.clone()).map(|(_, _, owner)| owner.clone()));
        };
        for (lock, mode) in acquires(request) {
            if let Some(waiting) = self.locks.get(lock) {
                take(&waiting.exclusive);
                match mode {
                    Mode::Exclusive => {
                        take(&waiting.shared);
                        take(&waiting.members);
                    }
                    Mode::Shared => take(&waiting.member_exclusives),
                }
            }
            if let Some(waiting) = lock.group().and_then(|group| self.locks.get(&group)) {
                take(&waiting.exclusive);
                if mode == Mode::Exclusive {
                    take(&waiting.shared);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found.retain(|owner| **owner != *key.2);
        found
    }

    /// Whether any waiter ahead of `key` conflicts with `request`.
    pub fn any_ahead(&self, key: &WaiterKey, request: &[Entry]) -> bool {
        let before = |set: &BTreeSet<WaiterKey>| {
            set.range(..key.clone())
                .any(|(_, _, owner)| **owner != *key.2)
        };
        acquires(request).any(|(lock, mode)| {
            let here = self.locks.get(lock).is_some_and(|waiting| {
                before(&waiting.exclusive)
                    || match mode {
                        Mode::Exclusive => before(&waiting.shared) || before(&waiting.members),
                        Mode::Shared => before(&waiting.member_exclusives),
                    }
            });
            let in_group = lock
                .group()
                .and_then(|group| self.locks.get(&group))
                .is_some_and(|waiting| {
                    before(&waiting.exclusive)
                        || (mode == Mode::Exclusive && before(&waiting.shared))
                });
            here || in_group
        })
    }

    pub fn has_waiters(&self) -> bool {
        !self.locks.is_empty()
    }

    /// Whether `key` is indexed under every lock of `request`.
    pub fn contains(&self, key: &WaiterKey, request: &[Entry]) -> bool {
        acquires(request).all(|(lock, mode)| {
            self.locks.get(lock).is_some_and(|waiting| match mode {
                Mode::Exclusive => waiting.exclusive.contains(key),
                Mode::Shared => waiting.shared.contains(key),
            })
        })
    }
}
