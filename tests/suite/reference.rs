//! A naive reference model of the whole lock manager, written from
//! LOCKS.md and Ganeti 3.0's own algorithm (`Ganeti.Locking.Allocation`
//! and `Ganeti.Locking.Waiting`), independently of `src/`.
//!
//! Speed is no goal; being obviously right is. Holdings are one map per
//! owner and every conflict is found by scanning all of them. The waiting
//! structure is Ganeti's `LockWaiting` as it is: pending requests filed by
//! the blocker they wait for (a set of `(priority, owner, request)`, so a
//! set iterates in retry order) plus, per waiting owner, where its request
//! is filed. `revisit` is Ganeti's `revisitRequests`, recursion and all.
//!
//! Ganeti answers notifications as a set; warden answers them in the order
//! the requests were granted. The model records every grant as it is
//! applied (depth first, as Ganeti's recursion applies them) and answers
//! Ganeti's set in that order.

use std::collections::{BTreeMap, BTreeSet};

use warden::locks::{
    Action, Entry, Level, LockError, LockName, Mode, Owner, Priority, SavedPending, SavedState,
};

use crate::harness::lock;

/// A waiting request as Ganeti files it. Tuples order lexicographically, so
/// a set of them iterates in ascending (priority, owner) order.
pub type Waiter = (Priority, Owner, Vec<Entry>);

/// The answer to `try_update` / `update_waiting`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// Owner order, no duplicates; empty if the request was applied.
    pub blockers: Vec<Owner>,
    /// Owners whose waiting requests were granted, in grant order.
    pub notify: Vec<Owner>,
}

/// The blockers of an allocation update (empty: applied), or why it was
/// refused.
type Blocked = Result<BTreeSet<Owner>, LockError>;

#[derive(Clone, Debug, Default)]
pub struct Reference {
    /// Direct holdings of every owner holding something (never empty maps).
    holdings: BTreeMap<Owner, BTreeMap<LockName, Mode>>,
    /// Ganeti's `lwPending`: blocker -> the requests filed under it.
    pending: BTreeMap<Owner, BTreeSet<Waiter>>,
    /// Ganeti's `lwPendingOwners`: waiting owner -> (blocker, its request).
    pending_owners: BTreeMap<Owner, (Owner, Waiter)>,
}

/// Does holding `held` in `held_mode` stand in the way of a request for
/// `lock` in `mode`? LOCKS.md, "Conflicts":
/// - exclusive on L is blocked by every direct holder of L, everyone
///   holding a member of L, and the (exclusive or shared) holders of L's
///   group;
/// - shared on L is blocked by an exclusive holder of L, owners holding a
///   member of L exclusively, and the exclusive holder of L's group.
pub fn blocks(held: &LockName, held_mode: Mode, lock: &LockName, mode: Mode) -> bool {
    let same_lock = held == lock;
    let held_is_member_of_lock = held.group().as_ref() == Some(lock);
    let held_is_group_of_lock = lock.group().as_ref() == Some(held);
    match mode {
        Mode::Exclusive => same_lock || held_is_member_of_lock || held_is_group_of_lock,
        Mode::Shared => {
            held_mode == Mode::Exclusive
                && (same_lock || held_is_member_of_lock || held_is_group_of_lock)
        }
    }
}

impl Reference {
    pub fn new() -> Reference {
        Reference::default()
    }

    fn held(&self, owner: &Owner, lock: &LockName) -> Option<Mode> {
        self.holdings
            .get(owner)
            .and_then(|held| held.get(lock))
            .copied()
    }

    // ---- Allocation (Ganeti's Locking.Allocation.updateLocks) ----

    /// Steps 3 to 5 of tryUpdateLocks, in order.
    fn check(&self, owner: &Owner, request: &[Entry]) -> Result<(), LockError> {
        for entry in request {
            if request
                .iter()
                .any(|other| other.lock == entry.lock && other.action != entry.action)
            {
                return Err(LockError::Inconsistent(entry.lock.clone()));
            }
        }
        let empty = BTreeMap::new();
        let held = self.holdings.get(owner).unwrap_or(&empty);
        if let Some(highest) = held.keys().max() {
            for entry in request {
                let Action::Acquire(mode) = entry.action else {
                    continue;
                };
                // Held in a mode at least as strong as the one asked for.
                let covers = |lock: &LockName| match held.get(lock) {
                    Some(Mode::Exclusive) => true,
                    Some(Mode::Shared) => mode == Mode::Shared,
                    None => false,
                };
                let covered = covers(&entry.lock) || entry.lock.group().is_some_and(|g| covers(&g));
                if entry.lock < *highest && !covered {
                    return Err(LockError::OrderViolation {
                        requested: entry.lock.clone(),
                        highest: highest.clone(),
                    });
                }
            }
        }
        for entry in request {
            if entry.action != Action::Acquire(Mode::Exclusive) {
                continue;
            }
            if let Some(group) = entry.lock.group()
                && held.get(&group) == Some(&Mode::Shared)
            {
                return Err(LockError::MemberUnderSharedGroup {
                    requested: entry.lock.clone(),
                    group,
                });
            }
        }
        Ok(())
    }

    /// Every other owner holding something in the way of `request`.
    pub fn conflicts(&self, owner: &Owner, request: &[Entry]) -> BTreeSet<Owner> {
        let mut found = BTreeSet::new();
        for entry in request {
            let Action::Acquire(mode) = entry.action else {
                continue;
            };
            for (other, held) in &self.holdings {
                if other == owner {
                    continue;
                }
                if held
                    .iter()
                    .any(|(lock, held_mode)| blocks(lock, *held_mode, &entry.lock, mode))
                {
                    found.insert(other.clone());
                }
            }
        }
        found
    }

    fn apply(&mut self, owner: &Owner, request: &[Entry]) {
        let held = self.holdings.entry(owner.clone()).or_default();
        for entry in request {
            match entry.action.target() {
                Some(mode) => {
                    held.insert(entry.lock.clone(), mode);
                }
                None => {
                    held.remove(&entry.lock);
                }
            }
        }
        if held.is_empty() {
            self.holdings.remove(owner);
        }
    }

    /// Ganeti's `Allocation.updateLocks`: check, find blockers, and apply
    /// only if there are none.
    fn allocation_update(&mut self, owner: &Owner, request: &[Entry]) -> Blocked {
        self.check(owner, request)?;
        let blockers = self.conflicts(owner, request);
        if blockers.is_empty() {
            self.apply(owner, request);
        }
        Ok(blockers)
    }

    // ---- Waiting (Ganeti's Locking.Waiting) ----

    /// `revisitRequests notify todo`: retry every request filed under an
    /// owner in `todo`, in (priority, owner) order; then do the same for
    /// the owners granted on the way that were not visited yet. Answers
    /// every owner visited (`todo` included). Each grant is appended to
    /// `granted` as it is applied.
    fn revisit(
        &mut self,
        notify: BTreeSet<Owner>,
        todo: BTreeSet<Owner>,
        granted: &mut Vec<Owner>,
    ) -> BTreeSet<Owner> {
        if todo.is_empty() {
            return notify;
        }
        let mut requests: BTreeSet<Waiter> = BTreeSet::new();
        for owner in &todo {
            if let Some(filed) = self.pending.remove(owner) {
                requests.extend(filed);
            }
        }
        for (_, owner, _) in &requests {
            self.pending_owners.remove(owner);
        }
        let mut notify_after = notify.clone();
        for (priority, owner, request) in requests {
            let (_, newly) = self.update_locks_waiting_inner(priority, &owner, &request, granted);
            notify_after.extend(newly);
        }
        let done: BTreeSet<Owner> = notify.union(&todo).cloned().collect();
        let next: BTreeSet<Owner> = notify_after.difference(&done).cloned().collect();
        self.revisit(done, next, granted)
    }

    /// Ganeti's `updateLocks'`: the pending check, the allocation update,
    /// and on success the revisit of what waits for this owner.
    fn update_locks_inner(
        &mut self,
        owner: &Owner,
        request: &[Entry],
        granted: &mut Vec<Owner>,
    ) -> (Blocked, BTreeSet<Owner>) {
        if self.pending_owners.contains_key(owner) {
            return (Err(LockError::PendingRequest), BTreeSet::new());
        }
        let result = self.allocation_update(owner, request);
        if !matches!(&result, Ok(blockers) if blockers.is_empty()) {
            return (result, BTreeSet::new());
        }
        granted.push(owner.clone());
        let visited = self.revisit(BTreeSet::new(), BTreeSet::from([owner.clone()]), granted);
        let notify = visited
            .into_iter()
            .filter(|visited| !self.pending_owners.contains_key(visited))
            .collect();
        (result, notify)
    }

    /// Ganeti's `updateLocksWaiting'`: a blocked request is filed under the
    /// smallest of its blockers. Errors are never queued.
    fn update_locks_waiting_inner(
        &mut self,
        priority: Priority,
        owner: &Owner,
        request: &[Entry],
        granted: &mut Vec<Owner>,
    ) -> (Blocked, BTreeSet<Owner>) {
        let (result, notify) = self.update_locks_inner(owner, request, granted);
        if let Ok(blockers) = &result
            && let Some(blocker) = blockers.first()
        {
            let waiter: Waiter = (priority, owner.clone(), request.to_vec());
            self.pending_owners
                .insert(owner.clone(), (blocker.clone(), waiter.clone()));
            self.pending
                .entry(blocker.clone())
                .or_default()
                .insert(waiter);
        }
        (result, notify)
    }

    /// Ganeti's `requestFulfilled`: no pending request and every entry
    /// holds exactly as asked (a release of an unheld lock counts).
    fn request_fulfilled(&self, owner: &Owner, request: &[Entry]) -> bool {
        !self.pending_owners.contains_key(owner)
            && request
                .iter()
                .all(|entry| self.held(owner, &entry.lock) == entry.action.target())
    }

    /// The public answer: Ganeti's notification set minus the updating
    /// owner, in the order the grants were applied.
    fn answer(
        owner: &Owner,
        result: Blocked,
        mut notify: BTreeSet<Owner>,
        granted: Vec<Owner>,
    ) -> Result<Answer, LockError> {
        let blockers = result?;
        notify.remove(owner);
        let in_grant_order: Vec<Owner> = granted
            .into_iter()
            .filter(|granted| notify.contains(granted))
            .collect();
        assert_eq!(
            in_grant_order.len(),
            notify.len(),
            "reference: the owners notified are exactly the owners granted, each once"
        );
        Ok(Answer {
            blockers: blockers.into_iter().collect(),
            notify: in_grant_order,
        })
    }

    /// `tryUpdateLocks` (Ganeti's `Waiting.updateLocks`).
    pub fn try_update(&mut self, owner: &Owner, request: &[Entry]) -> Result<Answer, LockError> {
        if self.request_fulfilled(owner, request) {
            return Ok(Answer::default());
        }
        let mut granted = Vec::new();
        let (result, notify) = self.update_locks_inner(owner, request, &mut granted);
        Reference::answer(owner, result, notify, granted)
    }

    /// Ganeti's `Waiting.updateLocksWaiting`.
    fn update_locks_waiting(
        &mut self,
        priority: Priority,
        owner: &Owner,
        request: &[Entry],
    ) -> Result<Answer, LockError> {
        if self.request_fulfilled(owner, request) {
            return Ok(Answer::default());
        }
        let mut granted = Vec::new();
        let (result, notify) =
            self.update_locks_waiting_inner(priority, owner, request, &mut granted);
        Reference::answer(owner, result, notify, granted)
    }

    /// `updateLocksWaiting` (Ganeti's `safeUpdateLocksWaiting`): re-sending
    /// the identical pending request answers what sending it afresh would,
    /// and changes nothing (so it keeps its original priority).
    pub fn update_waiting(
        &mut self,
        owner: &Owner,
        priority: Priority,
        request: &[Entry],
    ) -> Result<Answer, LockError> {
        let identical = matches!(
            self.pending_owners.get(owner),
            Some((_, (_, _, pending))) if pending.as_slice() == request
        );
        if identical {
            let mut probe = self.clone();
            probe.remove_pending_request(owner);
            return probe.update_locks_waiting(priority, owner, request);
        }
        self.update_locks_waiting(priority, owner, request)
    }

    /// Ganeti's `removePendingRequest`.
    fn remove_pending_request(&mut self, owner: &Owner) {
        let Some((blocker, waiter)) = self.pending_owners.remove(owner) else {
            return;
        };
        if let Some(filed) = self.pending.get_mut(&blocker) {
            filed.remove(&waiter);
            if filed.is_empty() {
                self.pending.remove(&blocker);
            }
        }
    }

    /// Ganeti's `manipulateLocksPredicate`: drop the pending request, then
    /// one update applying `action` to every held lock selected.
    fn manipulate(
        &mut self,
        owner: &Owner,
        selected: impl Fn(&LockName) -> bool,
        action: Action,
    ) -> Vec<Owner> {
        let request: Vec<Entry> = self
            .holdings
            .get(owner)
            .map(|held| {
                held.keys()
                    .filter(|lock| selected(lock))
                    .map(|lock| Entry::new(lock.clone(), action))
                    .collect()
            })
            .unwrap_or_default();
        self.remove_pending_request(owner);
        // Ganeti ignores the result: such an update cannot be refused.
        self.try_update(owner, &request)
            .map(|answer| answer.notify)
            .unwrap_or_default()
    }

    /// `freeLocks` (Ganeti's `releaseResources`).
    pub fn free_locks(&mut self, owner: &Owner) -> Vec<Owner> {
        self.manipulate(owner, |_| true, Action::Release)
    }

    pub fn free_locks_level(&mut self, owner: &Owner, level: Level) -> Vec<Owner> {
        self.manipulate(owner, |lock| lock.level() == level, Action::Release)
    }

    pub fn downgrade_locks_level(&mut self, owner: &Owner, level: Level) -> Vec<Owner> {
        self.manipulate(
            owner,
            |lock| lock.level() == level,
            Action::Acquire(Mode::Shared),
        )
    }

    pub fn intersect_locks(&mut self, owner: &Owner, keep: &[LockName]) -> Vec<Owner> {
        self.manipulate(owner, |lock| !keep.contains(lock), Action::Release)
    }

    /// `opportunisticLockUnion`: skip what is already held at least as
    /// asked, sort by (lock, mode), try each alone; the locks acquired, in
    /// acquisition order. Notifications are dropped, as in Ganeti.
    pub fn opportunistic_union(
        &mut self,
        owner: &Owner,
        wanted: &[(LockName, Mode)],
    ) -> Vec<LockName> {
        let mut requests: Vec<(LockName, Mode)> = wanted
            .iter()
            .filter(|(lock, mode)| self.held(owner, lock) < Some(*mode))
            .cloned()
            .collect();
        requests.sort();
        let mut acquired = Vec::new();
        for (lock, mode) in requests {
            let entry = Entry::new(lock.clone(), Action::Acquire(mode));
            if let Ok(answer) = self.try_update(owner, &[entry])
                && answer.blockers.is_empty()
            {
                acquired.push(lock);
            }
        }
        acquired
    }

    pub fn guarded_opportunistic_union(
        &mut self,
        count: usize,
        owner: &Owner,
        wanted: &[(LockName, Mode)],
    ) -> Vec<LockName> {
        let before = self.clone();
        let acquired = self.opportunistic_union(owner, wanted);
        if acquired.len() < count {
            *self = before;
            return Vec::new();
        }
        acquired
    }

    // ---- Listings and the saved form ----

    pub fn has_pending_request(&self, owner: &Owner) -> bool {
        self.pending_owners.contains_key(owner)
    }

    pub fn list_locks(&self, owner: &Owner) -> Vec<(LockName, Mode)> {
        self.holdings
            .get(owner)
            .map(|held| {
                held.iter()
                    .map(|(lock, mode)| (lock.clone(), *mode))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every lock held directly, plus the group of every member held; with
    /// its direct holders in owner order.
    pub fn list_all_locks_owners(&self) -> Vec<(LockName, Vec<(Owner, Mode)>)> {
        let mut rows: BTreeMap<LockName, Vec<(Owner, Mode)>> = BTreeMap::new();
        for (owner, held) in &self.holdings {
            for (lock, mode) in held {
                rows.entry(lock.clone())
                    .or_default()
                    .push((owner.clone(), *mode));
                if let Some(group) = lock.group() {
                    rows.entry(group).or_default();
                }
            }
        }
        rows.into_iter().collect()
    }

    pub fn list_all_locks(&self) -> Vec<LockName> {
        self.list_all_locks_owners()
            .into_iter()
            .map(|(lock, _)| lock)
            .collect()
    }

    /// Every pending request, in (priority, owner) order.
    pub fn list_pending(&self) -> Vec<Waiter> {
        let all: BTreeSet<Waiter> = self.pending.values().flatten().cloned().collect();
        all.into_iter().collect()
    }

    pub fn owners(&self) -> Vec<Owner> {
        let all: BTreeSet<Owner> = self
            .holdings
            .keys()
            .chain(self.pending_owners.keys())
            .cloned()
            .collect();
        all.into_iter().collect()
    }

    pub fn saved(&self) -> SavedState {
        let holdings = self
            .holdings
            .iter()
            .map(|(owner, held)| {
                let locks = held
                    .iter()
                    .map(|(lock, mode)| (lock.clone(), *mode))
                    .collect();
                (owner.clone(), locks)
            })
            .collect();
        let mut pending: Vec<SavedPending> = self
            .pending_owners
            .values()
            .map(|(blocker, (priority, owner, request))| SavedPending {
                priority: *priority,
                owner: owner.clone(),
                request: request.clone(),
                filed_under: blocker.clone(),
            })
            .collect();
        pending.sort_by(|a, b| (a.priority, &a.owner).cmp(&(b.priority, &b.owner)));
        SavedState { holdings, pending }
    }

    pub fn from_saved(saved: &SavedState) -> Reference {
        let mut reference = Reference::new();
        for (owner, locks) in &saved.holdings {
            reference
                .holdings
                .insert(owner.clone(), locks.iter().cloned().collect());
        }
        for pending in &saved.pending {
            let waiter: Waiter = (
                pending.priority,
                pending.owner.clone(),
                pending.request.clone(),
            );
            reference.pending_owners.insert(
                pending.owner.clone(),
                (pending.filed_under.clone(), waiter.clone()),
            );
            reference
                .pending
                .entry(pending.filed_under.clone())
                .or_default()
                .insert(waiter);
        }
        reference
    }

    /// Panics unless the model's own two pending indexes agree and no
    /// owner is recorded with an empty set of locks.
    pub fn check_consistent(&self) {
        assert!(self.holdings.values().all(|held| !held.is_empty()));
        let filed: usize = self.pending.values().map(BTreeSet::len).sum();
        assert_eq!(filed, self.pending_owners.len());
        for (owner, (blocker, waiter)) in &self.pending_owners {
            assert_eq!(&waiter.1, owner);
            assert!(
                self.pending
                    .get(blocker)
                    .is_some_and(|set| set.contains(waiter))
            );
        }
        assert!(self.pending.values().all(|set| !set.is_empty()));
    }
}

// ---- The worked examples of LOCKS.md, on the model alone ----

fn job(id: u64) -> Owner {
    Owner::job(id, format!("/ll/job-{id}"), 1000 + id as u32)
}

fn x(text: &str) -> Entry {
    Entry::exclusive(lock(text))
}

fn s(text: &str) -> Entry {
    Entry::shared(lock(text))
}

fn r(text: &str) -> Entry {
    Entry::release(lock(text))
}

fn granted() -> Result<Answer, LockError> {
    Ok(Answer::default())
}

fn blocked_by(owners: &[&Owner]) -> Result<Answer, LockError> {
    Ok(Answer {
        blockers: owners.iter().map(|owner| (*owner).clone()).collect(),
        notify: Vec::new(),
    })
}

fn order_violation(requested: &str, highest: &str) -> Result<Answer, LockError> {
    Err(LockError::OrderViolation {
        requested: lock(requested),
        highest: lock(highest),
    })
}

#[test]
fn the_reference_follows_the_allocation_examples_of_locks_md() {
    let (j1, j2) = (job(1), job(2));
    // 1. Both share the BGL.
    let mut m = Reference::new();
    assert_eq!(m.try_update(&j1, &[s("cluster/BGL")]), granted());
    assert_eq!(m.try_update(&j2, &[s("cluster/BGL")]), granted());
    // 2. A member held exclusively blocks its group in either mode.
    let mut m = Reference::new();
    assert_eq!(m.try_update(&j1, &[x("instance/a")]), granted());
    assert_eq!(
        m.try_update(&j2, &[s("instance/[lockset]")]),
        blocked_by(&[&j1])
    );
    assert_eq!(
        m.try_update(&j2, &[x("instance/[lockset]")]),
        blocked_by(&[&j1])
    );
    // 3. Order violation.
    let mut m = Reference::new();
    let held = [s("cluster/BGL"), x("instance/a"), x("node/n1")];
    assert_eq!(m.try_update(&j1, &held), granted());
    assert_eq!(
        m.try_update(&j1, &[x("instance/b")]),
        order_violation("instance/b", "node/n1")
    );
    // 4. A member exclusively under a shared group; members of a group held
    //    exclusively in any order.
    let mut m = Reference::new();
    assert_eq!(m.try_update(&j1, &[s("instance/[lockset]")]), granted());
    assert_eq!(
        m.try_update(&j1, &[x("instance/a")]),
        Err(LockError::MemberUnderSharedGroup {
            requested: lock("instance/a"),
            group: lock("instance/[lockset]"),
        })
    );
    let mut m = Reference::new();
    assert_eq!(
        m.try_update(&j1, &[x("instance/[lockset]"), s("node/n1")]),
        granted()
    );
    assert_eq!(m.try_update(&j1, &[s("instance/z")]), granted());
    // 5. The order check uses the holdings before the request.
    let mut m = Reference::new();
    assert_eq!(m.try_update(&j1, &[s("node/n1")]), granted());
    assert_eq!(
        m.try_update(&j1, &[r("node/n1"), x("instance/a")]),
        order_violation("instance/a", "node/n1")
    );
    // 6. Upgrading the highest held lock is fine, a lower one is not.
    let mut m = Reference::new();
    assert_eq!(
        m.try_update(&j1, &[s("cluster/BGL"), s("instance/a")]),
        granted()
    );
    assert_eq!(
        m.try_update(&j1, &[x("cluster/BGL")]),
        order_violation("cluster/BGL", "instance/a")
    );
    assert_eq!(m.try_update(&j1, &[x("instance/a")]), granted());
    // Inconsistent requests; identical duplicates are fine.
    assert_eq!(
        m.try_update(&j2, &[s("node/n1"), x("node/n1")]),
        Err(LockError::Inconsistent(lock("node/n1")))
    );
    assert_eq!(m.try_update(&j2, &[s("node/n1"), s("node/n1")]), granted());
}

#[test]
fn the_reference_follows_the_waiting_examples_of_locks_md() {
    let (j1, j2, j3, j4, j5) = (job(1), job(2), job(3), job(4), job(5));
    let mut m = Reference::new();
    // 7. Priorities order the waiters; only the granted one is notified.
    assert_eq!(m.try_update(&j1, &[x("instance/a")]), granted());
    assert_eq!(
        m.update_waiting(&j2, 0, &[x("instance/a")]),
        blocked_by(&[&j1])
    );
    assert_eq!(
        m.update_waiting(&j3, -10, &[s("instance/a")]),
        blocked_by(&[&j1])
    );
    assert_eq!(m.free_locks(&j1), vec![j3.clone()]);
    assert!(m.has_pending_request(&j2) && !m.has_pending_request(&j3));
    assert_eq!(m.saved().pending[0].filed_under, j3);
    // 8. A compatible request is granted at once even while others wait.
    assert_eq!(m.try_update(&j4, &[s("instance/a")]), granted());
    // 9. A pending owner cannot update; the identical request answers the
    //    current blockers and keeps its priority.
    let before = m.saved();
    assert_eq!(
        m.try_update(&j2, &[s("node/n1")]),
        Err(LockError::PendingRequest)
    );
    assert_eq!(
        m.update_waiting(&j2, 0, &[s("instance/a")]),
        Err(LockError::PendingRequest)
    );
    assert_eq!(
        m.update_waiting(&j2, -20, &[x("instance/a")]),
        blocked_by(&[&j3, &j4])
    );
    assert_eq!(m.saved(), before);
    assert_eq!(m.free_locks(&j4), Vec::<Owner>::new());
    assert_eq!(m.free_locks(&j3), vec![j2.clone()]);
    assert_eq!(
        m.list_locks(&j2),
        vec![(lock("instance/a"), Mode::Exclusive)]
    );
    // 9. Freeing a level drops the pending request.
    assert_eq!(
        m.update_waiting(&j1, 0, &[s("instance/a")]),
        blocked_by(&[&j2])
    );
    assert_eq!(m.free_locks_level(&j1, Level::Node), Vec::<Owner>::new());
    assert!(!m.has_pending_request(&j1));
    // 10. Opportunistic union, plain and guarded.
    let mut m = Reference::new();
    assert_eq!(m.try_update(&j1, &[x("node/n2")]), granted());
    let wanted = [
        (lock("node/n1"), Mode::Exclusive),
        (lock("node/n2"), Mode::Exclusive),
        (lock("node/n3"), Mode::Exclusive),
    ];
    let before = m.saved();
    assert_eq!(
        m.guarded_opportunistic_union(3, &j5, &wanted),
        Vec::<LockName>::new()
    );
    assert_eq!(m.saved(), before);
    assert_eq!(
        m.opportunistic_union(&j5, &wanted),
        vec![lock("node/n1"), lock("node/n3")]
    );
    // 11. Repeating a granted update changes nothing.
    let before = m.saved();
    assert_eq!(m.try_update(&j1, &[x("node/n2")]), granted());
    assert_eq!(m.saved(), before);
}

#[test]
fn the_reference_revisits_depth_first_and_notifies_in_grant_order() {
    // j3, j4 and j2 all wait behind j1 and are retried in (priority, owner)
    // order when j1 frees: j3 and j4 are granted (and notified in that
    // order); j2, wanting the whole group, is now blocked by both and filed
    // under the smaller, j3. Freeing j3 re-files it under j4; freeing j4
    // grants it.
    let (j1, j2, j3, j4) = (job(1), job(2), job(3), job(4));
    let mut m = Reference::new();
    assert_eq!(m.try_update(&j1, &[x("node/n1"), x("node/n2")]), granted());
    assert_eq!(
        m.update_waiting(&j3, 0, &[s("node/n1")]),
        blocked_by(&[&j1])
    );
    assert_eq!(
        m.update_waiting(&j4, 0, &[s("node/n2")]),
        blocked_by(&[&j1])
    );
    assert_eq!(
        m.update_waiting(&j2, 5, &[x("node/[lockset]")]),
        blocked_by(&[&j1])
    );
    // All three are filed under j1; retried as (0, j3), (0, j4), (5, j2).
    assert_eq!(m.free_locks(&j1), vec![j3.clone(), j4.clone()]);
    assert_eq!(m.saved().pending[0].filed_under, j3);
    assert_eq!(m.free_locks(&j3), Vec::<Owner>::new());
    assert_eq!(m.saved().pending[0].filed_under, j4);
    assert_eq!(m.free_locks(&j4), vec![j2.clone()]);
}
