//! The lock manager: the allocation plus waiting requests (Ganeti's
//! `Locking.Waiting`), the whole lock state of wconfd.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use super::allocation::{
    Allocation, Cycle, Holding, LockError, OwnerRef, RaisedAndReleased, check_against,
    conflicting_holdings, is_satisfied_by,
};
use super::fairness::{Deadlocks, Fairness, LockPolicy, WaitIndex, WaiterKey};
use super::grants::{Death, Grant, Grants, SavedGrants, Token};
use super::name::{Level, LockName};
use super::owner::{Action, Entry, Mode, Owner, Priority};

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

/// Members of a group lock named per owner in a deadlock's cycle.
const CYCLE_MEMBERS_MAX: usize = 10;

/// The key of a `tryUpdateLocks`: it cannot wait, so in fifo mode it comes
/// after every waiter.
fn try_key(owner: &Owner) -> WaiterKey {
    (Priority::MAX, u64::MAX, Arc::new(owner.clone()))
}

/// Waiting requests are kept in groups: requests with the same entries,
/// filed under the same owner. Requests with the same entries are blocked
/// by the same owners (less the requester itself), so a revisit decides a
/// whole run of a group at once instead of retrying each member: draining
/// n waiters one after another costs O(n log n), not Ganeti's O(n^2).
type GroupId = u64;

/// The saved form of what a [`SavedState`] leaves out, the extensions'
/// state: the policy, the grants' tokens and death marks, and the
/// waiters' arrival order (fifo mode).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedExtensions {
    pub policy: LockPolicy,
    pub grants: SavedGrants,
    /// Each waiter's arrival number (0 for all in Ganeti mode).
    pub arrivals: Vec<(Owner, u64)>,
    pub next_arrival: u64,
}

/// What `whatIfLocks` finds: the answer a request would get now, changing
/// nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhatIf {
    /// The error it would get (it would not wait).
    pub error: Option<LockError>,
    /// The owners blocking it (empty: it would be granted at once).
    pub blockers: Vec<OwnerRef>,
    /// The owner it would be filed under: retried when that one changes.
    pub filed_under: Option<OwnerRef>,
    /// The waiting requests it conflicts with that come before it in the
    /// grant order, in that order: granted first when its blockers go.
    pub ahead: Vec<PendingRequest>,
}

/// A group's entries, and whether its members hold locks in fifo mode
/// (such an owner never queues behind waiters, so it is not grouped with
/// owners that do; always false in Ganeti mode).
type GroupKey = (Arc<[Entry]>, bool);

#[derive(Debug)]
struct Group {
    request: Arc<[Entry]>,
    exempt: bool,
    /// The owner the group is filed under; `None` while a revisit has it.
    filed_under: Option<OwnerRef>,
    members: BTreeSet<WaiterKey>,
}

/// The one pending request of an owner.
#[derive(Debug)]
struct Pending {
    priority: Priority,
    /// Arrival number in fifo mode, 0 in Ganeti mode.
    order: u64,
    request: Arc<[Entry]>,
    group: GroupId,
}

impl Pending {
    fn key(&self, owner: &OwnerRef) -> WaiterKey {
        (self.priority, self.order, Arc::clone(owner))
    }
}

#[derive(Debug, Default)]
pub struct LockManager {
    allocation: Allocation,
    pending: HashMap<OwnerRef, Pending>,
    groups: HashMap<GroupId, Group>,
    /// Per blocker, its groups by their entries (at most one per entries).
    filed: HashMap<OwnerRef, HashMap<GroupKey, GroupId>>,
    next_group: GroupId,
    /// Bumped by every change of the state, so that a caller can tell
    /// whether an operation changed anything (and must be made durable).
    changes: u64,
    /// The token counter and the deaths (each holding's token is in the
    /// allocation).
    grants: Grants,
    policy: LockPolicy,
    /// Fifo mode only: who waits for what, to find the waiters ahead.
    waits: WaitIndex,
    next_arrival: u64,
    /// The locks one update raises and releases, when there are deaths,
    /// kept between updates so that an update allocates nothing for them.
    scratch: RaisedAndReleased,
}

/// One level of a revisit cascade (Ganeti's `revisitRequests`): the groups
/// being retried, and the owners granted in this pass, whose requests get
/// a second look once the pass is over.
struct Revisit {
    queue: BinaryHeap<Reverse<(WaiterKey, GroupId)>>,
    granted_this_pass: Vec<OwnerRef>,
    granted_before: Vec<OwnerRef>,
}

/// A group taken out for retrying, with the owners its entries conflict with.
struct Evaluated {
    group: GroupId,
    conflicts: Vec<OwnerRef>,
}

impl LockManager {
    /// A lock manager with Ganeti's behaviour exactly.
    pub fn new() -> LockManager {
        LockManager::default()
    }

    pub fn policy(&self) -> LockPolicy {
        self.policy
    }

    /// `tryUpdateLocks`: apply the whole request now, or answer its blockers
    /// and change nothing.
    pub fn try_update(&mut self, owner: &Owner, request: &[Entry]) -> Result<Update, LockError> {
        if !self.pending.contains_key(owner) && self.allocation.is_satisfied(owner, request) {
            return Ok(Update::default());
        }
        if self.pending.contains_key(owner) {
            return Err(LockError::PendingRequest);
        }
        self.allocation.check(owner, request)?;
        let blockers = self.blockers_at(owner, None, request);
        if !blockers.is_empty() {
            return Ok(Update {
                blockers,
                notify: Vec::new(),
            });
        }
        let owner = self.intern(owner);
        self.apply_granting(&owner, request);
        self.changes += 1;
        let notify = self.revisit(owner);
        Ok(Update {
            blockers: Vec::new(),
            notify,
        })
    }

    /// The key a new waiting request of `owner` gets.
    fn new_key(&self, owner: &Owner, priority: Priority) -> WaiterKey {
        let order = match self.policy.fairness {
            Fairness::Ganeti => 0,
            Fairness::Fifo => self.next_arrival,
        };
        (priority, order, Arc::new(owner.clone()))
    }

    /// The owners blocking `request` of `owner`, were it the waiter `key`
    /// (`None`: a try, behind every waiter): the holders in its way and, in
    /// fifo mode for an owner holding nothing, the conflicting waiters
    /// ahead of it.
    fn blockers_at(
        &self,
        owner: &Owner,
        key: Option<&WaiterKey>,
        request: &[Entry],
    ) -> Vec<OwnerRef> {
        let mut blockers = self.allocation.blockers(owner, request);
        if self.policy.fairness == Fairness::Fifo && self.allocation.holdings(owner).is_none() {
            // Built only here: a try's key costs a copy of the owner.
            let ahead = match key {
                Some(key) => self.waits.ahead(key, request),
                None => self.waits.ahead(&try_key(owner), request),
            };
            if !ahead.is_empty() {
                blockers.extend(ahead);
                blockers.sort_unstable();
                blockers.dedup();
            }
        }
        blockers
    }

    /// Applies a checked, unblocked request, giving the locks it raises one
    /// fencing token and telling its grant of the deaths it covers.
    fn apply_granting(&mut self, owner: &OwnerRef, request: &[Entry]) {
        let token = self.grants.next_token();
        if !self.grants.follows_updates() {
            // The usual case: no marks to tell, no told deaths to forget.
            if self.allocation.apply(owner, request, token, None) {
                self.grants.issued(token);
            }
            return;
        }
        let mut noted = std::mem::take(&mut self.scratch);
        noted.clear();
        if self
            .allocation
            .apply(owner, request, token, Some(&mut noted))
        {
            self.grants.issued(token);
        }
        self.grants.changed(owner, token, &mut noted);
        self.scratch = noted;
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
        if let Some((known, pending)) = self.pending.get_key_value(owner) {
            if *pending.request != *request {
                return Err(LockError::PendingRequest);
            }
            return Ok(Update {
                blockers: self.blockers_at(owner, Some(&pending.key(known)), request),
                notify: Vec::new(),
            });
        }
        if self.allocation.is_satisfied(owner, request) {
            return Ok(Update::default());
        }
        self.allocation.check(owner, request)?;
        let key = self.new_key(owner, priority);
        let blockers = self.blockers_at(owner, Some(&key), request);
        if blockers.is_empty() {
            let owner = self.intern(owner);
            self.apply_granting(&owner, request);
            self.changes += 1;
            let notify = self.revisit(owner);
            return Ok(Update { blockers, notify });
        }
        if self.policy.deadlocks == Deadlocks::Refuse
            && let Some(cycle) = self.cycle_closed_by(owner, request, &blockers)
        {
            return Err(LockError::Deadlock(cycle));
        }
        let owner = self.intern(owner);
        self.file(owner, key.0, key.1, Arc::from(request), &blockers[0]);
        Ok(Update {
            blockers,
            notify: Vec::new(),
        })
    }

    /// The cycle of waits that `owner` waiting for `request` (blocked by
    /// `blockers`) would close, if any: each owner on it with the locks it
    /// holds that the one before it waits for, starting with a blocker of
    /// `owner` and ending with the owner that waits for `owner`. Only holds
    /// make cycles: waiters queued behind waiters (fifo) hold nothing, so
    /// nobody waits for them; an owner holding nothing closes no cycle.
    fn cycle_closed_by(
        &self,
        owner: &Owner,
        request: &[Entry],
        blockers: &[OwnerRef],
    ) -> Option<Cycle> {
        self.allocation.holdings(owner)?;
        // Depth first over "waits for a holder", each owner once.
        let mut seen: HashSet<OwnerRef> = HashSet::new();
        let mut path: Vec<(OwnerRef, std::vec::IntoIter<OwnerRef>)> = Vec::new();
        #[allow(clippy::unnecessary_to_owned)] // the path keeps owned iterators
        let mut next: std::vec::IntoIter<OwnerRef> = blockers.to_vec().into_iter();
        loop {
            let Some(blocker) = next.next() else {
                let (_, rest) = path.pop()?;
                next = rest;
                continue;
            };
            if !seen.insert(Arc::clone(&blocker)) {
                continue;
            }
            let Some(pending) = self.pending.get(&blocker) else {
                continue;
            };
            let onward = self.allocation.blockers(&blocker, &pending.request);
            if onward.iter().any(|other| **other == *owner) {
                path.push((blocker, Vec::new().into_iter()));
                break;
            }
            path.push((blocker, std::mem::replace(&mut next, onward.into_iter())));
        }
        // Each owner on the cycle, with what it holds that the one before
        // it (the requester first) asks for.
        let mut cycle = Vec::with_capacity(path.len() + 1);
        let mut asked: Vec<Entry> = request.to_vec();
        for (member, _) in path {
            let holds = self.held_of(&member, &asked, CYCLE_MEMBERS_MAX);
            asked = self.pending[&member].request.to_vec();
            cycle.push((member, holds));
        }
        let holds = self.held_of(owner, &asked, CYCLE_MEMBERS_MAX);
        cycle.push((Arc::new(owner.clone()), holds));
        Some(cycle)
    }

    /// A counter that moves whenever the state changes: equal before and
    /// after an operation means the operation changed nothing.
    /// From now on every change of a holding is kept for
    /// [`LockManager::take_lock_changes`] (the event sequence).
    pub fn record_lock_changes(&mut self) {
        self.allocation.record_changes();
    }

    /// The holdings changed since the last call, in order.
    pub fn take_lock_changes(&mut self) -> Vec<crate::locks::allocation::LockChange> {
        self.allocation.take_changes()
    }

    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn has_pending_request(&self, owner: &Owner) -> bool {
        self.pending.contains_key(owner)
    }

    /// True while the owner holds a lock or waits for one.
    pub fn has_owner(&self, owner: &Owner) -> bool {
        self.pending.contains_key(owner) || self.allocation.holdings(owner).is_some()
    }

    /// The owners blocking the pending request of `owner` now, as its
    /// answers name them: the holders in its way and, in fifo mode, the
    /// conflicting waiters ahead of it. `None` if it has none pending.
    pub fn pending_blockers(&self, owner: &Owner) -> Option<Vec<OwnerRef>> {
        let (known, pending) = self.pending.get_key_value(owner)?;
        Some(self.blockers_at(owner, Some(&pending.key(known)), &pending.request))
    }

    /// The owners blocking `request` of `owner` now (empty: it would be
    /// granted).
    pub fn blockers(&self, owner: &Owner, request: &[Entry]) -> Vec<OwnerRef> {
        self.allocation.blockers(owner, request)
    }

    /// The mode in which `owner` holds `lock` directly, if it does.
    pub fn mode_held(&self, owner: &Owner, lock: &LockName) -> Option<Mode> {
        self.allocation.mode_held(owner, lock)
    }

    /// `freeLocks`: drops the pending request and every lock. Answers the
    /// owners to notify.
    pub fn free_locks(&mut self, owner: &Owner) -> Vec<OwnerRef> {
        self.rewrite_holdings(owner, |_, _| Some(Action::Release))
    }

    /// The release of a dead owner: as `free_locks`, and the next grantee
    /// of each lock it held is told that its holder died.
    pub fn free_dead(&mut self, owner: &Owner) -> Vec<OwnerRef> {
        if let Some(holdings) = self.allocation.holdings(owner) {
            self.grants
                .died(owner, holdings, crate::limits::DEATH_MARKS_MAX);
            self.changes += 1;
        }
        self.free_locks(owner)
    }

    /// `freeLocksLevel`: drops the pending request and the locks of `level`.
    pub fn free_locks_level(&mut self, owner: &Owner, level: Level) -> Vec<OwnerRef> {
        self.rewrite_holdings(owner, |lock, _| {
            (lock.level() == level).then_some(Action::Release)
        })
    }

    /// `downGradeLocksLevel`: drops the pending request; the locks of `level`
    /// become shared.
    pub fn downgrade_locks_level(&mut self, owner: &Owner, level: Level) -> Vec<OwnerRef> {
        self.rewrite_holdings(owner, |lock, _| {
            (lock.level() == level).then_some(Action::Acquire(Mode::Shared))
        })
    }

    /// `intersectLocks`: drops the pending request and every lock not listed.
    pub fn intersect_locks(&mut self, owner: &Owner, keep: &[LockName]) -> Vec<OwnerRef> {
        let keep: HashSet<&LockName> = keep.iter().collect();
        self.rewrite_holdings(owner, |lock, _| {
            (!keep.contains(lock)).then_some(Action::Release)
        })
    }

    /// The shape of Ganeti's `manipulateLocksPredicate`: drop the pending
    /// request, then one update of the held locks `rewrite` picks.
    fn rewrite_holdings(
        &mut self,
        owner: &Owner,
        rewrite: impl Fn(&LockName, Mode) -> Option<Action>,
    ) -> Vec<OwnerRef> {
        let had_pending = self.remove_pending(owner);
        let request: Vec<Entry> = self
            .allocation
            .holdings(owner)
            .into_iter()
            .flatten()
            .filter_map(|(lock, held)| Some(Entry::new(lock.clone(), rewrite(lock, held.mode)?)))
            .collect();
        let unchanged = self.allocation.is_satisfied(owner, &request);
        let update = self
            .try_update(owner, &request)
            .expect("releasing or downgrading held locks without a pending request never fails");
        debug_assert!(update.blockers.is_empty());
        // In fifo mode waiters may be filed under a waiter: one that goes
        // away without changing its locks lets them be retried too.
        if let Some(owner) = had_pending
            && unchanged
            && self.policy.fairness == Fairness::Fifo
        {
            return self.revisit(owner);
        }
        update.notify
    }

    /// `opportunisticLockUnion`: the locks newly acquired, in the order they
    /// were acquired. Never errors, never blocks, notifies nobody.
    pub fn opportunistic_union(
        &mut self,
        owner: &Owner,
        wanted: &[(LockName, Mode)],
    ) -> Vec<LockName> {
        let plan = self.plan_union(owner, wanted);
        self.apply_union(owner, plan)
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
        let plan = self.plan_union(owner, wanted);
        if plan.len() < count {
            return Vec::new();
        }
        self.apply_union(owner, plan)
    }

    /// Which entries of an opportunistic union succeed, without changing
    /// anything: each is tried alone, in (lock, mode) order, against the
    /// owner's holdings as the earlier entries left them. Other owners'
    /// holdings cannot change meanwhile (acquiring never grants a waiter).
    fn plan_union(&self, owner: &Owner, wanted: &[(LockName, Mode)]) -> Vec<(LockName, Mode)> {
        if self.pending.contains_key(owner) {
            return Vec::new();
        }
        let mut held = self.allocation.holdings(owner).cloned().unwrap_or_default();
        let mut tries: Vec<(LockName, Mode)> = wanted
            .iter()
            .filter(|(lock, mode)| held.get(lock).map(|holding| holding.mode) < Some(*mode))
            .cloned()
            .collect();
        tries.sort();
        let mut plan = Vec::new();
        for (lock, mode) in tries {
            let entry = [Entry::new(lock.clone(), Action::Acquire(mode))];
            let acquired = is_satisfied_by(Some(&held), &entry)
                || (check_against(Some(&held), &entry).is_ok()
                    && self.blockers_at(owner, None, &entry).is_empty());
            if acquired {
                // Only the modes count for the plan: the token is drawn
                // when the union is applied.
                held.insert(lock.clone(), Holding { mode, token: 0 });
                plan.push((lock, mode));
            }
        }
        plan
    }

    fn apply_union(&mut self, owner: &Owner, plan: Vec<(LockName, Mode)>) -> Vec<LockName> {
        let mut acquired = Vec::with_capacity(plan.len());
        // One grant, one token, for the whole union.
        self.grants.begin_grant();
        for (lock, mode) in plan {
            let update = self
                .try_update(owner, &[Entry::new(lock.clone(), Action::Acquire(mode))])
                .expect("a planned union entry passes its checks");
            debug_assert!(update.blockers.is_empty() && update.notify.is_empty());
            acquired.push(lock);
        }
        self.grants.end_grant();
        acquired
    }

    /// The grant `owner` holds `lock` with, if it holds it directly.
    pub fn grant(&self, owner: &Owner, lock: &LockName) -> Option<Grant> {
        let holding = self.allocation.holding(owner, lock)?;
        Some(Grant {
            token: holding.token,
            died: self.grants.told(owner, lock).to_vec(),
        })
    }

    /// The last fencing token issued (0: none yet).
    pub fn last_token(&self) -> Token {
        self.grants.last_token()
    }

    /// The fence of the locks `request` acquires, as `owner` holds them
    /// now: the highest of their tokens (each lock, or its group when
    /// only that is held) and the deaths their grants were told of.
    /// `None` unless it holds them all.
    pub fn fence_of(&self, owner: &Owner, request: &[Entry]) -> Option<(Token, Vec<Death>)> {
        let mut token = 0;
        let mut died: Vec<Death> = Vec::new();
        for entry in request {
            if entry.action == Action::Release {
                continue;
            }
            let (lock, holding) = match self.allocation.holding(owner, &entry.lock) {
                Some(holding) => (entry.lock.clone(), holding),
                None => {
                    let group = entry.lock.group()?;
                    let holding = self.allocation.holding(owner, &group)?;
                    (group, holding)
                }
            };
            token = token.max(holding.token);
            for death in self.grants.told(owner, &lock) {
                if !died.contains(death) {
                    died.push(death.clone());
                }
            }
        }
        Some((token, died))
    }

    /// `checkFence`: whether `token` is the grant `owner` holds `lock` (or
    /// its group) with now.
    pub fn check_fence(&self, owner: &Owner, lock: &LockName, token: Token) -> bool {
        let current = |lock: &LockName| {
            self.allocation
                .holding(owner, lock)
                .is_some_and(|holding| holding.token == token && token != 0)
        };
        current(lock) || lock.group().is_some_and(|group| current(&group))
    }

    /// Changes the policy: every waiting request is judged again under it,
    /// in its grant order (fifo arrivals follow the old order), granted if
    /// nothing is in its way now, else filed again. Answers the owners
    /// granted, to notify.
    pub fn set_policy(&mut self, policy: LockPolicy) -> Vec<OwnerRef> {
        if policy == self.policy {
            return Vec::new();
        }
        let mut waiting: Vec<(WaiterKey, Arc<[Entry]>)> = self
            .pending
            .iter()
            .map(|(owner, pending)| (pending.key(owner), Arc::clone(&pending.request)))
            .collect();
        waiting.sort_unstable();
        for ((_, _, owner), _) in &waiting {
            self.remove_pending(owner);
        }
        debug_assert!(self.groups.is_empty() && !self.waits.has_waiters());
        self.policy = policy;
        self.changes += 1;
        let mut granted = Vec::new();
        for ((priority, _, owner), request) in waiting {
            let key = self.new_key(&owner, priority);
            let blockers = self.blockers_at(&owner, Some(&key), &request);
            if blockers.is_empty() {
                self.apply_granting(&owner, &request);
                granted.push(Arc::clone(&owner));
                granted.extend(self.revisit(owner));
            } else {
                self.file(owner, key.0, key.1, request, &blockers[0]);
            }
        }
        granted
    }

    /// `whatIfLocks`: what `request` of `owner` at `priority` would meet
    /// now, changing nothing.
    pub fn what_if(&self, owner: &Owner, priority: Priority, request: &[Entry]) -> WhatIf {
        let mut answer = WhatIf {
            error: None,
            blockers: Vec::new(),
            filed_under: None,
            ahead: Vec::new(),
        };
        let key = match self.pending.get_key_value(owner) {
            Some((known, pending)) if *pending.request == *request => pending.key(known),
            Some(_) => {
                answer.error = Some(LockError::PendingRequest);
                return answer;
            }
            None => self.new_key(owner, priority),
        };
        if !self.pending.contains_key(owner) && self.allocation.is_satisfied(owner, request) {
            return answer;
        }
        if let Err(error) = self.allocation.check(owner, request) {
            answer.error = Some(error);
            return answer;
        }
        answer.blockers = self.blockers_at(owner, Some(&key), request);
        if answer.blockers.is_empty() {
            return answer;
        }
        if !self.pending.contains_key(owner)
            && self.policy.deadlocks == Deadlocks::Refuse
            && let Some(cycle) = self.cycle_closed_by(owner, request, &answer.blockers)
        {
            answer.error = Some(LockError::Deadlock(cycle));
            return answer;
        }
        // A request already waiting stays where it is filed (possibly
        // under a blocker other than its smallest one now).
        answer.filed_under = match self.pending.get(owner) {
            Some(pending) => self.groups[&pending.group].filed_under.clone(),
            None => answer.blockers.first().cloned(),
        };
        let wants: Vec<(LockName, Mode)> = request
            .iter()
            .filter_map(|entry| Some((entry.lock.clone(), entry.action.target()?)))
            .collect();
        let mut ahead: Vec<(WaiterKey, PendingRequest)> = self
            .pending
            .iter()
            .filter(|(other, pending)| {
                other.as_ref() != owner
                    && pending.key(other) < key
                    && !conflicting_holdings(&wants, &pending.request).is_empty()
            })
            .filter_map(|(other, pending)| Some((pending.key(other), self.pending_of(other)?)))
            .collect();
        ahead.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        answer.ahead = ahead.into_iter().map(|(_, pending)| pending).collect();
        answer
    }

    /// `listLocks`: the owner's direct holdings in lock order.
    pub fn list_locks(&self, owner: &Owner) -> Vec<(LockName, Mode)> {
        self.allocation
            .holdings(owner)
            .map(|held| {
                held.iter()
                    .map(|(lock, holding)| (lock.clone(), holding.mode))
                    .collect()
            })
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
        let mut listing: Vec<PendingRequest> = self
            .pending
            .iter()
            .map(|(owner, pending)| PendingRequest {
                priority: pending.priority,
                owner: Arc::clone(owner),
                request: pending.request.to_vec(),
            })
            .collect();
        listing.sort_unstable_by(|a, b| (a.priority, &a.owner).cmp(&(b.priority, &b.owner)));
        listing
    }

    /// The pending request of an owner.
    pub fn pending_of(&self, owner: &Owner) -> Option<PendingRequest> {
        let (owner, pending) = self.pending.get_key_value(owner)?;
        Some(PendingRequest {
            priority: pending.priority,
            owner: Arc::clone(owner),
            request: pending.request.to_vec(),
        })
    }

    /// The pending requests of the owners that are job `job` (one, but for
    /// a dead runner's successor), in owner order.
    pub fn pending_of_job(&self, job: u64) -> Vec<PendingRequest> {
        let mut found: Vec<PendingRequest> = self
            .pending
            .keys()
            .filter(|owner| owner.ident == crate::locks::owner::Ident::Job(job))
            .filter_map(|owner| self.pending_of(owner))
            .collect();
        found.sort_unstable_by(|a, b| a.owner.cmp(&b.owner));
        found
    }

    /// What `holder` holds of the locks of `request`: each lock, its
    /// group, or (for a group) up to `members_max` of its members.
    pub fn held_of(
        &self,
        holder: &Owner,
        request: &[Entry],
        members_max: usize,
    ) -> Vec<(LockName, Mode)> {
        let Some(holdings) = self.allocation.holdings(holder) else {
            return Vec::new();
        };
        let mut held = Vec::new();
        for entry in request {
            let lock = &entry.lock;
            if let Some(holding) = holdings.get(lock) {
                held.push((lock.clone(), holding.mode));
            }
            if let Some(group) = lock.group()
                && let Some(holding) = holdings.get(&group)
            {
                held.push((group, holding.mode));
            }
            if lock.is_group() {
                held.extend(
                    holdings
                        .iter()
                        .filter(|(member, _)| member.group().as_ref() == Some(lock))
                        .take(members_max)
                        .map(|(member, holding)| (member.clone(), holding.mode)),
                );
            }
        }
        held.sort();
        held.dedup();
        held
    }

    /// The first `max` locks `holder` holds, in lock order, each with its
    /// mode and the token it was granted with.
    pub fn holdings_with_tokens(&self, holder: &Owner, max: usize) -> Vec<(LockName, Mode, Token)> {
        let Some(holdings) = self.allocation.holdings(holder) else {
            return Vec::new();
        };
        holdings
            .iter()
            .take(max)
            .map(|(lock, holding)| (lock.clone(), holding.mode, holding.token))
            .collect()
    }

    /// How many locks `holder` holds.
    pub fn held_count(&self, holder: &Owner) -> usize {
        self.allocation
            .holdings(holder)
            .map_or(0, |held| held.len())
    }

    /// Every owner holding a lock or waiting for one, in owner order: the
    /// owners death detection must probe.
    pub fn owners(&self) -> Vec<OwnerRef> {
        let mut owners = self.allocation.holders();
        owners.extend(
            self.pending
                .keys()
                .filter(|owner| self.allocation.holdings(owner).is_none())
                .cloned(),
        );
        owners.sort_unstable();
        owners
    }

    /// Number of pending requests.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Number of (owner, lock) holdings.
    pub fn holding_count(&self) -> usize {
        self.allocation.holding_count()
    }

    pub fn saved(&self) -> SavedState {
        let holdings = self
            .allocation
            .holders()
            .into_iter()
            .map(|owner| {
                let locks = self.list_locks(&owner);
                (Owner::clone(&owner), locks)
            })
            .collect();
        let pending = self
            .list_pending()
            .into_iter()
            .map(|listed| {
                let group = &self.groups[&self.pending[&listed.owner].group];
                let filed_under = group
                    .filed_under
                    .as_ref()
                    .expect("outside a revisit every group is filed");
                SavedPending {
                    priority: listed.priority,
                    owner: Owner::clone(&listed.owner),
                    request: listed.request,
                    filed_under: Owner::clone(filed_under),
                }
            })
            .collect();
        SavedState { holdings, pending }
    }

    /// Rebuilds a state from its saved form, refusing an impossible one
    /// (conflicting holders, a pending request that is not blocked by the
    /// owner it is filed under, an owner listed twice).
    pub fn restore(saved: &SavedState) -> Result<LockManager, RestoreError> {
        LockManager::restore_with(saved, &SavedExtensions::default())
    }

    /// What [`LockManager::saved`] leaves out: the extensions' state.
    pub fn saved_extensions(&self) -> SavedExtensions {
        let mut arrivals: Vec<(Owner, u64)> = self
            .pending
            .iter()
            .filter(|(_, pending)| pending.order != 0)
            .map(|(owner, pending)| (Owner::clone(owner), pending.order))
            .collect();
        arrivals.sort_unstable();
        SavedExtensions {
            policy: self.policy,
            grants: self.grants.saved(self.allocation.all_holdings()),
            arrivals,
            next_arrival: self.next_arrival,
        }
    }

    /// Rebuilds a state from both saved forms. A holding without a saved
    /// grant gets token 0 (never issued: no fence check passes with it).
    pub fn restore_with(
        saved: &SavedState,
        extensions: &SavedExtensions,
    ) -> Result<LockManager, RestoreError> {
        let mut manager = LockManager {
            policy: extensions.policy,
            next_arrival: extensions.next_arrival,
            ..LockManager::default()
        };
        for (owner, locks) in &saved.holdings {
            if manager.allocation.holdings(owner).is_some() {
                return Err(RestoreError(format!("owner {owner} is listed twice")));
            }
            let request: Vec<Entry> = locks
                .iter()
                .map(|(lock, mode)| Entry::new(lock.clone(), Action::Acquire(*mode)))
                .collect();
            manager.allocation.check(owner, &request).map_err(|error| {
                RestoreError(format!("inconsistent lock status for {owner}: {error}"))
            })?;
            let blockers = manager.allocation.blockers(owner, &request);
            if !blockers.is_empty() {
                return Err(RestoreError(format!(
                    "inconsistent lock status for {owner}: blocked on {}",
                    owner_list(&blockers)
                )));
            }
            // Token 0 (never issued) until the saved grants give theirs.
            let owner = Arc::new(owner.clone());
            manager.allocation.apply(&owner, &request, 0, None);
        }
        let allocation = &mut manager.allocation;
        manager.grants = Grants::restore(&extensions.grants, |owner, lock, token| {
            if !allocation.set_token(owner, lock, token) {
                return None;
            }
            allocation.owner_ref(owner).cloned()
        })
        .map_err(|reason| RestoreError(format!("impossible grant: {reason}")))?;
        let arrivals: HashMap<&Owner, u64> = extensions
            .arrivals
            .iter()
            .map(|(owner, order)| (owner, *order))
            .collect();
        let fifo = manager.policy.fairness == Fairness::Fifo;
        for waiter in &saved.pending {
            let owner = &waiter.owner;
            if manager.pending.contains_key(owner) {
                return Err(RestoreError(format!(
                    "owner {owner} has two pending requests"
                )));
            }
            manager
                .allocation
                .check(owner, &waiter.request)
                .map_err(|error| {
                    RestoreError(format!("pending request of {owner} is invalid: {error}"))
                })?;
            let order = arrivals.get(owner).copied().unwrap_or(0);
            if order != 0 && (!fifo || order >= manager.next_arrival) {
                return Err(RestoreError(format!(
                    "pending request of {owner} has the arrival {order}, which was not issued"
                )));
            }
            // Waiters ahead are all filed only at the end: check the
            // holders here, the rest below.
            let blockers = manager.allocation.blockers(owner, &waiter.request);
            let filed_under = match blockers.iter().find(|b| ***b == waiter.filed_under) {
                Some(blocker) => Arc::clone(blocker),
                None if fifo => Arc::new(waiter.filed_under.clone()),
                None => {
                    return Err(RestoreError(format!(
                        "pending request of {owner} is not blocked by {}, the owner it is filed \
                         under (blocked on {})",
                        waiter.filed_under,
                        owner_list(&blockers)
                    )));
                }
            };
            let owner = manager.intern(owner);
            manager.file(
                owner,
                waiter.priority,
                order,
                Arc::from(waiter.request.as_slice()),
                &filed_under,
            );
        }
        if fifo {
            for waiter in &saved.pending {
                let (owner, pending) = manager
                    .pending
                    .get_key_value(&waiter.owner)
                    .expect("just filed");
                let blockers =
                    manager.blockers_at(owner, Some(&pending.key(owner)), &pending.request);
                if !blockers.iter().any(|b| **b == waiter.filed_under) {
                    return Err(RestoreError(format!(
                        "pending request of {owner} is not blocked by {}, the owner it is filed \
                         under (blocked on {})",
                        waiter.filed_under,
                        owner_list(&blockers)
                    )));
                }
            }
        }
        Ok(manager)
    }

    /// The shared handle of an owner, reusing the one already indexed.
    fn intern(&self, owner: &Owner) -> OwnerRef {
        if let Some(known) = self.allocation.owner_ref(owner) {
            return Arc::clone(known);
        }
        if let Some((known, _)) = self.pending.get_key_value(owner) {
            return Arc::clone(known);
        }
        Arc::new(owner.clone())
    }

    /// Makes `request` the pending request of `owner`, filed under `blocker`.
    fn file(
        &mut self,
        owner: OwnerRef,
        priority: Priority,
        order: u64,
        request: Arc<[Entry]>,
        blocker: &OwnerRef,
    ) {
        let exempt =
            self.policy.fairness == Fairness::Fifo && self.allocation.holdings(&owner).is_some();
        let existing = self
            .filed
            .get(blocker)
            .and_then(|groups| groups.get(&(Arc::clone(&request), exempt)))
            .copied();
        let group_id = match existing {
            Some(group_id) => group_id,
            None => {
                let group_id = self.new_group(Arc::clone(&request), exempt, BTreeSet::new());
                self.attach(group_id, blocker);
                group_id
            }
        };
        let group = self
            .groups
            .get_mut(&group_id)
            .expect("a filed group exists");
        let request = Arc::clone(&group.request);
        let key = (priority, order, Arc::clone(&owner));
        group.members.insert(key.clone());
        if self.policy.fairness == Fairness::Fifo {
            self.waits.insert(&key, &request);
            self.next_arrival = self.next_arrival.max(order + 1);
        }
        self.changes += 1;
        self.pending.insert(
            owner,
            Pending {
                priority,
                order,
                request,
                group: group_id,
            },
        );
    }

    /// Takes `owner`'s pending request out of the pending map and the
    /// waiter index (not out of its group).
    fn take_pending(&mut self, owner: &Owner) -> Option<(OwnerRef, Pending)> {
        let (owner, pending) = self.pending.remove_entry(owner)?;
        if self.policy.fairness == Fairness::Fifo {
            self.waits.remove(&pending.key(&owner), &pending.request);
        }
        Some((owner, pending))
    }

    /// Drops the pending request of `owner`, if it has one; answers the
    /// owner's handle if it had.
    fn remove_pending(&mut self, owner: &Owner) -> Option<OwnerRef> {
        let (owner, pending) = self.take_pending(owner)?;
        self.changes += 1;
        let group = self
            .groups
            .get_mut(&pending.group)
            .expect("a pending request's group exists");
        let removed = group.members.remove(&pending.key(&owner));
        debug_assert!(removed, "a pending request is a member of its group");
        if group.members.is_empty() {
            self.drop_group(pending.group);
        }
        Some(owner)
    }

    /// A new group of `members`, each of which is pointed at it.
    fn new_group(
        &mut self,
        request: Arc<[Entry]>,
        exempt: bool,
        members: BTreeSet<WaiterKey>,
    ) -> GroupId {
        let group_id = self.next_group;
        self.next_group += 1;
        for (_, _, owner) in &members {
            self.pending
                .get_mut(owner)
                .expect("a group member is pending")
                .group = group_id;
        }
        self.groups.insert(
            group_id,
            Group {
                request,
                exempt,
                filed_under: None,
                members,
            },
        );
        group_id
    }

    /// Files a detached group under `blocker`, merging it into the group
    /// with the same entries already there (the smaller moves).
    fn attach(&mut self, group_id: GroupId, blocker: &OwnerRef) {
        let group = &self.groups[&group_id];
        let key: GroupKey = (Arc::clone(&group.request), group.exempt);
        let existing = self
            .filed
            .get(blocker)
            .and_then(|groups| groups.get(&key))
            .copied();
        let Some(existing) = existing else {
            self.groups
                .get_mut(&group_id)
                .expect("attached group exists")
                .filed_under = Some(Arc::clone(blocker));
            self.filed
                .entry(Arc::clone(blocker))
                .or_default()
                .insert(key, group_id);
            return;
        };
        let (into, from) =
            if self.groups[&existing].members.len() >= self.groups[&group_id].members.len() {
                (existing, group_id)
            } else {
                (group_id, existing)
            };
        let moved = std::mem::take(
            &mut self
                .groups
                .get_mut(&from)
                .expect("merged group exists")
                .members,
        );
        for (_, _, owner) in &moved {
            self.pending
                .get_mut(owner)
                .expect("a group member is pending")
                .group = into;
        }
        self.groups.remove(&from);
        let target = self.groups.get_mut(&into).expect("merge target exists");
        target.members.extend(moved);
        target.filed_under = Some(Arc::clone(blocker));
        self.filed
            .entry(Arc::clone(blocker))
            .or_default()
            .insert(key, into);
    }

    /// Forgets an empty group, wherever it is filed.
    fn drop_group(&mut self, group_id: GroupId) {
        let group = self.groups.remove(&group_id).expect("dropped group exists");
        debug_assert!(group.members.is_empty());
        if let Some(blocker) = group.filed_under {
            let groups = self
                .filed
                .get_mut(&blocker)
                .expect("a filed group is indexed");
            groups.remove(&(group.request, group.exempt));
            if groups.is_empty() {
                self.filed.remove(&blocker);
            }
        }
    }

    /// Retries the requests filed under `changed` after it changed its
    /// locks, granting what can be granted, exactly as Ganeti's
    /// `revisitRequests`: in (priority, owner) order; each grant first
    /// revisits the requests filed under the granted owner (depth first);
    /// the owners granted in a pass are revisited again once it ends. A
    /// still-blocked request is re-filed under its smallest blocker. Answers
    /// the owners granted, in grant order. An explicit stack, not recursion:
    /// cascades are as deep as clients make them.
    fn revisit(&mut self, changed: OwnerRef) -> Vec<OwnerRef> {
        if !self.filed.contains_key(&changed) {
            return Vec::new();
        }
        let mut granted_all = Vec::new();
        let mut stack = vec![self.start_revisit(&[changed])];
        while let Some(mut level) = stack.pop() {
            if let Some(granted) = self.grant_next(&mut level.queue) {
                granted_all.push(Arc::clone(&granted));
                level.granted_this_pass.push(Arc::clone(&granted));
                let nested = self.start_revisit(&[granted]);
                stack.push(level);
                stack.push(nested);
            } else if !level.granted_this_pass.is_empty() {
                let again = std::mem::take(&mut level.granted_this_pass);
                level.queue = self.start_revisit(&again).queue;
                level.granted_before.extend(again);
                stack.push(level);
            } else if let Some(parent) = stack.last_mut() {
                parent.granted_this_pass.extend(level.granted_before);
            }
        }
        granted_all
    }

    /// Takes the groups filed under `owners` out for retrying.
    fn start_revisit(&mut self, owners: &[OwnerRef]) -> Revisit {
        let mut queue = BinaryHeap::new();
        for owner in owners {
            let Some(groups) = self.filed.remove(owner) else {
                continue;
            };
            for group_id in groups.into_values() {
                let group = self
                    .groups
                    .get_mut(&group_id)
                    .expect("a filed group exists");
                group.filed_under = None;
                let head = group
                    .members
                    .first()
                    .expect("groups are never empty")
                    .clone();
                queue.push(Reverse((head, group_id)));
            }
        }
        Revisit {
            queue,
            granted_this_pass: Vec::new(),
            granted_before: Vec::new(),
        }
    }

    /// Advances a revisit to its next grant: finds the first waiter, in
    /// (priority, owner) order, that the current allocation lets through;
    /// re-files every waiter before it; grants it and answers its owner.
    /// With no grantable waiter left, re-files everything and answers None.
    fn grant_next(
        &mut self,
        queue: &mut BinaryHeap<Reverse<(WaiterKey, GroupId)>>,
    ) -> Option<OwnerRef> {
        // Groups are taken in the order of their first waiter until no
        // later group can hold an earlier grantable waiter.
        let mut evaluated: Vec<Evaluated> = Vec::new();
        let mut candidate: Option<WaiterKey> = None;
        loop {
            let next_is_earlier = match (queue.peek(), &candidate) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(Reverse((head, _))), Some(best)) => head < best,
            };
            if !next_is_earlier {
                break;
            }
            let Reverse((head, group_id)) = queue.pop().expect("peeked");
            let group = &self.groups[&group_id];
            let mut conflicts = self.allocation.conflicts(&group.request);
            let mut grantable = match conflicts.as_slice() {
                [] => Some(head.clone()),
                // Blocked only by one of its own members: that member may go.
                [only] => self.member_key(group_id, only),
                _ => None,
            };
            // Fifo: members that hold nothing queue behind the conflicting
            // waiters ahead of the first of them, which are ahead of them all.
            if self.policy.fairness == Fairness::Fifo && !group.exempt {
                let ahead = self.waits.ahead(&head, &group.request);
                if !ahead.is_empty() {
                    grantable = None;
                    conflicts.extend(ahead);
                    conflicts.sort_unstable();
                    conflicts.dedup();
                }
            }
            if let Some(key) = grantable
                && candidate.as_ref().is_none_or(|best| key < *best)
            {
                candidate = Some(key);
            }
            evaluated.push(Evaluated {
                group: group_id,
                conflicts,
            });
        }
        let mut granted: Option<(OwnerRef, Arc<[Entry]>)> = None;
        for Evaluated { group, conflicts } in evaluated {
            let (before, from) = match &candidate {
                Some(key) => self.split_group(group, key),
                None => (Some(group), None),
            };
            if let Some(before) = before {
                self.refile_blocked(before, &conflicts);
            }
            let Some(from) = from else { continue };
            let members = &mut self
                .groups
                .get_mut(&from)
                .expect("split part exists")
                .members;
            if members.first() == candidate.as_ref() {
                let (_, _, owner) = members.pop_first().expect("the candidate is first");
                let request = Arc::clone(&self.groups[&from].request);
                let (_, pending) = self
                    .take_pending(&owner)
                    .expect("a group member is pending");
                debug_assert_eq!(pending.group, from);
                granted = Some((owner, request));
            }
            match self.groups[&from].members.first() {
                Some(head) => queue.push(Reverse((head.clone(), from))),
                None => {
                    self.groups.remove(&from);
                }
            }
        }
        let (owner, request) = granted?;
        debug_assert!(self.allocation.check(&owner, &request).is_ok());
        debug_assert!(self.allocation.blockers(&owner, &request).is_empty());
        self.apply_granting(&owner, &request);
        Some(owner)
    }

    /// The key of `owner`'s waiting request if it is a member of the group.
    fn member_key(&self, group_id: GroupId, owner: &OwnerRef) -> Option<WaiterKey> {
        let pending = self.pending.get(owner)?;
        (pending.group == group_id).then(|| pending.key(owner))
    }

    /// Splits a detached group at `key` into the members before it and the
    /// members from it on, answering the group of each part (None if empty).
    /// The smaller part moves to a new group, so splitting stays cheap.
    fn split_group(
        &mut self,
        group_id: GroupId,
        key: &WaiterKey,
    ) -> (Option<GroupId>, Option<GroupId>) {
        let group = self.groups.get_mut(&group_id).expect("split group exists");
        let from = group.members.split_off(key);
        if from.is_empty() {
            return (Some(group_id), None);
        }
        if group.members.is_empty() {
            group.members = from;
            return (None, Some(group_id));
        }
        let request = Arc::clone(&group.request);
        let exempt = group.exempt;
        if from.len() <= group.members.len() {
            (Some(group_id), Some(self.new_group(request, exempt, from)))
        } else {
            let before = std::mem::replace(&mut group.members, from);
            (
                Some(self.new_group(request, exempt, before)),
                Some(group_id),
            )
        }
    }

    /// Re-files a detached group whose members are all blocked by
    /// `conflicts` (less themselves): under the smallest conflict, except
    /// the member that is that smallest conflict itself, which goes under
    /// the next one.
    fn refile_blocked(&mut self, group_id: GroupId, conflicts: &[OwnerRef]) {
        let smallest = conflicts
            .first()
            .expect("a group retried and not granted has conflicts");
        if let Some(key) = self.member_key(group_id, smallest) {
            let next = conflicts
                .get(1)
                .expect("a member blocked only by itself is granted, not re-filed");
            let group = self
                .groups
                .get_mut(&group_id)
                .expect("re-filed group exists");
            if group.members.len() == 1 {
                self.attach(group_id, next);
                return;
            }
            group.members.remove(&key);
            let request = Arc::clone(&group.request);
            let exempt = group.exempt;
            let alone = self.new_group(request, exempt, BTreeSet::from([key]));
            self.attach(alone, next);
        }
        self.attach(group_id, smallest);
    }

    /// Panics unless every internal index agrees with the others and every
    /// pending request is blocked by the owner it is filed under.
    pub fn check_invariants(&self) {
        self.allocation.check_invariants();
        self.grants.check_invariants(self.allocation.all_holdings());
        let fifo = self.policy.fairness == Fairness::Fifo;
        assert!(
            fifo || !self.waits.has_waiters(),
            "a waiter index in Ganeti mode"
        );
        let mut members = 0;
        for (group_id, group) in &self.groups {
            assert!(!group.members.is_empty(), "group {group_id} is empty");
            let blocker = group
                .filed_under
                .as_ref()
                .expect("outside a revisit every group is filed");
            assert_eq!(
                self.filed
                    .get(blocker)
                    .and_then(|groups| groups.get(&(Arc::clone(&group.request), group.exempt))),
                Some(group_id),
                "group {group_id} is not indexed under {blocker}"
            );
            for key in &group.members {
                let (priority, order, owner) = key;
                let pending = self.pending.get(owner).expect("a group member is pending");
                assert_eq!(pending.group, *group_id, "group of {owner}");
                assert_eq!(pending.priority, *priority, "priority of {owner}");
                assert_eq!(pending.order, *order, "arrival of {owner}");
                assert_eq!(*pending.request, *group.request, "request of {owner}");
                assert_eq!(
                    group.exempt,
                    fifo && self.allocation.holdings(owner).is_some(),
                    "fifo grouping of {owner}"
                );
                assert!(fifo || *order == 0, "an arrival number in Ganeti mode");
                if fifo {
                    assert!(*order < self.next_arrival, "arrival of {owner} not issued");
                    assert!(
                        self.waits.contains(key, &group.request),
                        "{owner} is not in the waiter index"
                    );
                }
                assert!(
                    self.allocation.check(owner, &group.request).is_ok(),
                    "pending request of {owner} fails its checks"
                );
                assert!(
                    self.blockers_at(owner, Some(key), &group.request)
                        .contains(blocker),
                    "pending request of {owner} is not blocked by {blocker}, \
                     the owner it is filed under"
                );
            }
            members += group.members.len();
        }
        assert_eq!(
            members,
            self.pending.len(),
            "pending requests outside groups"
        );
        let indexed: usize = self
            .filed
            .values()
            .map(|groups| {
                assert!(!groups.is_empty(), "an empty blocker index");
                groups.len()
            })
            .sum();
        assert_eq!(
            indexed,
            self.groups.len(),
            "groups outside the blocker index"
        );
    }
}

fn owner_list(owners: &[OwnerRef]) -> String {
    let names: Vec<String> = owners.iter().map(|owner| owner.to_string()).collect();
    format!("[{}]", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64) -> Owner {
        Owner::job(
            id,
            format!("/root/livelocks/job_{id:06}_1"),
            1000 + id as u32,
        )
    }

    fn node(name: &str) -> LockName {
        LockName::parse(&format!("node/{name}")).expect("valid")
    }

    /// Waiters on one lock are granted one by one in (priority, owner)
    /// order, each notified exactly once.
    #[test]
    fn a_queue_of_waiters_drains_in_order() {
        let mut locks = LockManager::new();
        let n1 = [Entry::exclusive(node("n1"))];
        locks.try_update(&job(0), &n1).expect("free lock");
        for id in (1..=50).rev() {
            let priority = if id % 7 == 0 { -5 } else { 0 };
            let update = locks
                .update_waiting(&job(id), priority, &n1)
                .expect("valid");
            assert_eq!(update.blockers, vec![Arc::new(job(0))]);
            locks.check_invariants();
        }
        let mut expected: Vec<(Priority, u64)> = (1..=50)
            .map(|id| (if id % 7 == 0 { -5 } else { 0 }, id))
            .collect();
        expected.sort();
        let mut holder = job(0);
        for (_, id) in expected {
            let notify = locks.free_locks(&holder);
            assert_eq!(notify, vec![Arc::new(job(id))]);
            locks.check_invariants();
            holder = job(id);
        }
        assert!(locks.free_locks(&holder).is_empty());
        assert_eq!(locks.owners(), Vec::<OwnerRef>::new());
    }
}
