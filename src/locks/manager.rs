//! The lock manager: the allocation plus waiting requests (Ganeti's
//! `Locking.Waiting`), the whole lock state of wconfd.

use std::sync::Arc;

use super::allocation::{Allocation, LockError, OwnerRef};
use super::name::{Level, LockName};
use super::owner::{Entry, Mode, Owner, Priority};

/// The answer to an update: the owners blocking it (empty if it was
/// applied) and the owners whose waiting requests it granted, in the order
/// they were granted. Those should be told (SIGHUP), after the new state is
/// durable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    pub blockers: Vec<OwnerRef>,
    pub notify: Vec<OwnerRef>,
}

/// A waiting request as the pending listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRequest {
    pub priority: Priority,
    pub owner: OwnerRef,
    pub request: Vec<Entry>,
}

/// The saved form of a lock state: everything needed to rebuild one that
/// behaves identically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedState {
    /// Each owner holding locks, in owner order, with its locks in lock order.
    pub holdings: Vec<(Owner, Vec<(LockName, Mode)>)>,
    /// Every pending request, in (priority, owner) order.
    pub pending: Vec<SavedPending>,
}

/// One pending request of a [`SavedState`], with the owner it is filed
/// under (one of its blockers; that choice decides when it is retried).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedPending {
    pub priority: Priority,
    pub owner: Owner,
    pub request: Vec<Entry>,
    pub filed_under: Owner,
}

/// Why a saved state cannot be rebuilt: it describes an impossible state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreError(pub String);

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RestoreError {}

#[derive(Debug, Default)]
pub struct LockManager {
    allocation: Allocation,
}

impl LockManager {
    pub fn new() -> LockManager {
        LockManager::default()
    }

    /// `tryUpdateLocks`: apply the whole request now, or answer its blockers
    /// and change nothing.
    pub fn try_update(&mut self, owner: &Owner, request: &[Entry]) -> Result<Update, LockError> {
        let _ = (owner, request);
        todo!()
    }

    /// `updateLocksWaiting`: like `try_update`, but a blocked request stays
    /// pending. Re-sending the identical pending request changes nothing and
    /// answers the current blockers.
    pub fn update_waiting(
        &mut self,
        owner: &Owner,
        priority: Priority,
        request: &[Entry],
    ) -> Result<Update, LockError> {
        let _ = (owner, priority, request);
        todo!()
    }

    pub fn has_pending_request(&self, owner: &Owner) -> bool {
        let _ = owner;
        todo!()
    }

    /// `freeLocks`, and the release of a dead owner: drops the pending
    /// request and every lock. Answers the owners to notify.
    pub fn free_locks(&mut self, owner: &Owner) -> Vec<OwnerRef> {
        let _ = owner;
        todo!()
    }

    /// `freeLocksLevel`: drops the pending request and the locks of `level`.
    pub fn free_locks_level(&mut self, owner: &Owner, level: Level) -> Vec<OwnerRef> {
        let _ = (owner, level);
        todo!()
    }

    /// `downGradeLocksLevel`: drops the pending request; the locks of `level`
    /// become shared.
    pub fn downgrade_locks_level(&mut self, owner: &Owner, level: Level) -> Vec<OwnerRef> {
        let _ = (owner, level);
        todo!()
    }

    /// `intersectLocks`: drops the pending request and every lock not listed.
    pub fn intersect_locks(&mut self, owner: &Owner, keep: &[LockName]) -> Vec<OwnerRef> {
        let _ = (owner, keep);
        todo!()
    }

    /// `opportunisticLockUnion`: the locks newly acquired, in the order they
    /// were acquired. Never errors, never blocks, notifies nobody.
    pub fn opportunistic_union(&mut self, owner: &Owner, wanted: &[(LockName, Mode)]) -> Vec<LockName> {
        let _ = (owner, wanted);
        todo!()
    }

    /// `guardedOpportunisticLockUnion`: as `opportunistic_union` if at least
    /// `count` locks are acquired; otherwise nothing changes and the answer
    /// is empty.
    pub fn guarded_opportunistic_union(
        &mut self,
        count: usize,
        owner: &Owner,
        wanted: &[(LockName, Mode)],
    ) -> Vec<LockName> {
        let _ = (count, owner, wanted);
        todo!()
    }

    /// `listLocks`: the owner's direct holdings in lock order.
    pub fn list_locks(&self, owner: &Owner) -> Vec<(LockName, Mode)> {
        self.allocation
            .holdings(owner)
            .map(|held| held.iter().map(|(lock, mode)| (lock.clone(), *mode)).collect())
            .unwrap_or_default()
    }

    /// `listAllLocks`.
    pub fn list_all_locks(&self) -> Vec<LockName> {
        self.allocation.list_all_locks()
    }

    /// `listAllLocksOwners`.
    pub fn list_all_locks_owners(&self) -> Vec<(LockName, Vec<(OwnerRef, Mode)>)> {
        self.allocation.list_all_locks_owners()
    }

    /// The pending half of `listLocksWaitingStatus`: every pending request
    /// exactly as sent, in (priority, owner) order.
    pub fn list_pending(&self) -> Vec<PendingRequest> {
        todo!()
    }

    /// Every owner holding a lock or waiting for one, in owner order: the
    /// owners death detection must probe.
    pub fn owners(&self) -> Vec<OwnerRef> {
        todo!()
    }

    pub fn saved(&self) -> SavedState {
        todo!()
    }

    pub fn restore(saved: &SavedState) -> Result<LockManager, RestoreError> {
        let _ = saved;
        todo!()
    }

    /// Panics unless every internal index agrees with the others and every
    /// pending request is blocked by the owner it is filed under.
    pub fn check_invariants(&self) {
        self.allocation.check_invariants();
    }

    #[allow(dead_code)]
    fn placeholder(&self) -> Option<Arc<Owner>> {
        None
    }
}
