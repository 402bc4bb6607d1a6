//! Operations that change the lock state, as values. The daemon runs every
//! change through [`LockManager::apply`], and the journal records the same
//! values, so replaying a journal is running the same code again: the core
//! is deterministic, so the replayed state is the state that was answered.

use super::allocation::{LockError, OwnerRef};
use super::fairness::LockPolicy;
use super::manager::{LockManager, Update};
use super::name::{Level, LockName};
use super::owner::{Entry, Mode, Owner, Priority};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockOp {
    TryUpdate {
        owner: Owner,
        request: Vec<Entry>,
    },
    UpdateWaiting {
        owner: Owner,
        priority: Priority,
        request: Vec<Entry>,
    },
    /// `freeLocks` of a live owner.
    FreeLocks {
        owner: Owner,
    },
    /// The release of an owner found dead: its locks' next grantees are
    /// told.
    FreeDead {
        owner: Owner,
    },
    FreeLocksLevel {
        owner: Owner,
        level: Level,
    },
    DowngradeLocksLevel {
        owner: Owner,
        level: Level,
    },
    IntersectLocks {
        owner: Owner,
        keep: Vec<LockName>,
    },
    OpportunisticUnion {
        owner: Owner,
        wanted: Vec<(LockName, Mode)>,
    },
    GuardedOpportunisticUnion {
        count: usize,
        owner: Owner,
        wanted: Vec<(LockName, Mode)>,
    },
    /// The settings' policy, when it differs from the saved one (at start).
    SetPolicy {
        policy: LockPolicy,
    },
}

/// What an operation answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpOutcome {
    Update(Result<Update, LockError>),
    /// Owners to notify, from the operations that cannot fail.
    Freed(Vec<OwnerRef>),
    Acquired(Vec<LockName>),
}

impl OpOutcome {
    /// The owners whose waiting requests this operation granted.
    pub fn granted(&self) -> &[OwnerRef] {
        match self {
            OpOutcome::Update(Ok(update)) => &update.notify,
            OpOutcome::Freed(notify) => notify,
            OpOutcome::Update(Err(_)) | OpOutcome::Acquired(_) => &[],
        }
    }
}

impl LockOp {
    /// The owner the operation acts as (`None`: a change of the policy).
    pub fn owner(&self) -> Option<&Owner> {
        Some(match self {
            LockOp::TryUpdate { owner, .. }
            | LockOp::UpdateWaiting { owner, .. }
            | LockOp::FreeLocks { owner }
            | LockOp::FreeDead { owner }
            | LockOp::FreeLocksLevel { owner, .. }
            | LockOp::DowngradeLocksLevel { owner, .. }
            | LockOp::IntersectLocks { owner, .. }
            | LockOp::OpportunisticUnion { owner, .. }
            | LockOp::GuardedOpportunisticUnion { owner, .. } => owner,
            LockOp::SetPolicy { .. } => return None,
        })
    }
}

impl LockManager {
    /// Runs one operation.
    pub fn apply(&mut self, op: &LockOp) -> OpOutcome {
        let outcome = self.apply_unchecked(op);
        #[cfg(debug_assertions)]
        self.check_invariants();
        outcome
    }

    fn apply_unchecked(&mut self, op: &LockOp) -> OpOutcome {
        match op {
            LockOp::TryUpdate { owner, request } => {
                OpOutcome::Update(self.try_update(owner, request))
            }
            LockOp::UpdateWaiting {
                owner,
                priority,
                request,
            } => OpOutcome::Update(self.update_waiting(owner, *priority, request)),
            LockOp::FreeLocks { owner } => OpOutcome::Freed(self.free_locks(owner)),
            LockOp::FreeDead { owner } => OpOutcome::Freed(self.free_dead(owner)),
            LockOp::SetPolicy { policy } => OpOutcome::Freed(self.set_policy(*policy)),
            LockOp::FreeLocksLevel { owner, level } => {
                OpOutcome::Freed(self.free_locks_level(owner, *level))
            }
            LockOp::DowngradeLocksLevel { owner, level } => {
                OpOutcome::Freed(self.downgrade_locks_level(owner, *level))
            }
            LockOp::IntersectLocks { owner, keep } => {
                OpOutcome::Freed(self.intersect_locks(owner, keep))
            }
            LockOp::OpportunisticUnion { owner, wanted } => {
                OpOutcome::Acquired(self.opportunistic_union(owner, wanted))
            }
            LockOp::GuardedOpportunisticUnion {
                count,
                owner,
                wanted,
            } => OpOutcome::Acquired(self.guarded_opportunistic_union(*count, owner, wanted)),
        }
    }
}
