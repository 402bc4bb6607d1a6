//! The lock allocation: who holds which lock, directly or (through a member)
//! indirectly, and the checks of one atomic update (Ganeti's
//! `Locking.Allocation`).
//!
//! Two indexes that must always agree: per lock, its direct holders and,
//! for a group lock, the owners holding members; per owner, its direct
//! holdings in lock order, each with its mode and the fencing token it was
//! granted with (the token lives here, not in an index of its own, so
//! that a grant touches one index). `check_invariants` rebuilds the first
//! from the second and compares.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use super::grants::Token;
use super::name::LockName;
use super::owner::{Action, Entry, Mode, Owner};

/// Owners are shared between the indexes; they compare by value.
pub type OwnerRef = Arc<Owner>;

/// Why an update was refused. Being blocked is not an error: blocked
/// requests answer their blockers instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockError {
    /// The owner has a pending request and asked for a different update.
    PendingRequest,
    /// The same lock twice with different actions in one request.
    Inconsistent(LockName),
    /// Acquiring below the highest held lock without holding it or its group.
    OrderViolation {
        requested: LockName,
        highest: LockName,
    },
    /// A member exclusively while holding its group shared.
    MemberUnderSharedGroup {
        requested: LockName,
        group: LockName,
    },
    /// *(extension)* Waiting would close a cycle of waits: each owner on
    /// it with what it holds that the one before it (the requester first)
    /// asks for; the last is the requester.
    Deadlock(Cycle),
}

/// A cycle of waits: each owner on it with what it holds that the one
/// before it (the requester first) asks for; the last is the requester.
pub type Cycle = Vec<(OwnerRef, Vec<(LockName, Mode)>)>;

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::PendingRequest => {
                f.write_str("cannot update locks while having pending requests")
            }
            LockError::Inconsistent(lock) => write!(f, "Inconsistent requests for lock {lock}"),
            LockError::OrderViolation { requested, highest } => write!(
                f,
                "Order violation: requesting {requested} while holding {highest}"
            ),
            LockError::MemberUnderSharedGroup { requested, group } => write!(
                f,
                "Order violation: requesting exclusively {requested} while holding a shared \
                 lock on the group lock {group} it belongs to."
            ),
            LockError::Deadlock(cycle) => {
                f.write_str(
                    "Deadlock: waiting would close a cycle of waits: the request waits for",
                )?;
                for (index, (owner, holds)) in cycle.iter().enumerate() {
                    let held: Vec<String> = holds
                        .iter()
                        .map(|(lock, mode)| format!("{lock} {mode}"))
                        .collect();
                    let who = if index + 1 == cycle.len() {
                        "the requester".to_owned()
                    } else {
                        owner.to_string()
                    };
                    if index > 0 {
                        f.write_str(", which waits for")?;
                    }
                    write!(f, " {who} (holding {})", held.join(", "))?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for LockError {}

/// Everything known about one lock that is in use.
#[derive(Debug, Default)]
struct LockState {
    exclusive: Option<OwnerRef>,
    shared: BTreeSet<OwnerRef>,
    /// Group locks only: owners holding members, with how many they hold.
    member_holders: BTreeMap<OwnerRef, u32>,
    /// Group locks only: owners holding members exclusively, with how many.
    member_exclusives: BTreeMap<OwnerRef, u32>,
}

impl LockState {
    fn is_unused(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty() && self.member_holders.is_empty()
    }

    fn direct_holders(&self) -> impl Iterator<Item = &OwnerRef> {
        self.exclusive.iter().chain(self.shared.iter())
    }
}

fn count_up(counts: &mut BTreeMap<OwnerRef, u32>, owner: &OwnerRef) {
    *counts.entry(Arc::clone(owner)).or_insert(0) += 1;
}

fn count_down(counts: &mut BTreeMap<OwnerRef, u32>, owner: &OwnerRef) {
    let count = counts
        .get_mut(owner)
        .expect("a member held by an owner is counted on its group");
    *count -= 1;
    if *count == 0 {
        counts.remove(owner);
    }
}

/// The locks of `held` (one owner's holdings) that stand in the way of
/// `request`, by the rules of [`Allocation::conflicts`]: the same lock
/// when either side is exclusive, the group of a requested lock when
/// either side is exclusive, a member of a requested group when either
/// side is exclusive. In `held`'s order.
///
/// For people: a runner whose lock wait timed out names what each blocker
/// holds with it.
pub fn conflicting_holdings(held: &[(LockName, Mode)], request: &[Entry]) -> Vec<(LockName, Mode)> {
    held.iter()
        .filter(|(lock, mode)| {
            request.iter().any(|entry| {
                let Action::Acquire(wanted) = entry.action else {
                    return false;
                };
                let related = *lock == entry.lock
                    || entry.lock.group().as_ref() == Some(lock)
                    || lock.group().as_ref() == Some(&entry.lock);
                related && (wanted == Mode::Exclusive || *mode == Mode::Exclusive)
            })
        })
        .cloned()
        .collect()
}

/// One direct holding: its mode and the token of the grant that gave it
/// (0 for a holding restored from a state saved without tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    pub mode: Mode,
    pub token: Token,
}

/// One owner's direct holdings, in lock order.
pub type Holdings = BTreeMap<LockName, Holding>;

/// The locks one update raised (newly held, or shared to exclusive), each
/// with the token it was held with before (`None`: not held), and those
/// it let go: what the grants need when there are deaths to tell or told
/// deaths to forget.
#[derive(Debug, Default)]
pub struct RaisedAndReleased {
    pub raised: Vec<(LockName, Option<Token>)>,
    pub released: Vec<LockName>,
}

impl RaisedAndReleased {
    pub fn clear(&mut self) {
        self.raised.clear();
        self.released.clear();
    }
}

/// [`Allocation::is_satisfied`] against given holdings.
pub fn is_satisfied_by(held: Option<&Holdings>, request: &[Entry]) -> bool {
    request.iter().all(|entry| {
        held.and_then(|locks| locks.get(&entry.lock))
            .map(|holding| holding.mode)
            == entry.action.target()
    })
}

/// The first lock, in request order, that the request names with two
/// different actions (linear: requests may name thousands of locks).
fn first_inconsistent(request: &[Entry]) -> Option<&LockName> {
    if request.len() < 2 {
        return None;
    }
    let mut mixed: HashMap<&LockName, (Action, bool)> = HashMap::with_capacity(request.len());
    for entry in request {
        let seen = mixed.entry(&entry.lock).or_insert((entry.action, false));
        if seen.0 != entry.action {
            seen.1 = true;
        }
    }
    request
        .iter()
        .find(|entry| mixed[&entry.lock].1)
        .map(|entry| &entry.lock)
}

/// [`Allocation::check`] against given holdings, so that a sequence of
/// updates can be planned before any is applied.
pub fn check_against(held: Option<&Holdings>, request: &[Entry]) -> Result<(), LockError> {
    if let Some(lock) = first_inconsistent(request) {
        return Err(LockError::Inconsistent(lock.clone()));
    }
    let Some(held) = held else {
        return Ok(());
    };
    let Some((highest, _)) = held.last_key_value() else {
        return Ok(());
    };
    for entry in request {
        let Action::Acquire(mode) = entry.action else {
            continue;
        };
        if entry.lock >= *highest {
            continue;
        }
        let covers = |lock: &LockName| match (held.get(lock).map(|holding| holding.mode), mode) {
            (Some(Mode::Exclusive), _) | (Some(Mode::Shared), Mode::Shared) => true,
            (Some(Mode::Shared), Mode::Exclusive) | (None, _) => false,
        };
        let covered = covers(&entry.lock) || entry.lock.group().as_ref().is_some_and(covers);
        if !covered {
            return Err(LockError::OrderViolation {
                requested: entry.lock.clone(),
                highest: highest.clone(),
            });
        }
    }
    for entry in request {
        if entry.action != Action::Acquire(Mode::Exclusive) {
            continue;
        }
        if let Some(group) = entry.lock.group()
            && held.get(&group).map(|holding| holding.mode) == Some(Mode::Shared)
        {
            return Err(LockError::MemberUnderSharedGroup {
                requested: entry.lock.clone(),
                group,
            });
        }
    }
    Ok(())
}

/// One lock of one owner changing mode (`None`: not held), for the event
/// sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockChange {
    pub owner: OwnerRef,
    pub lock: LockName,
    pub before: Option<Mode>,
    pub after: Option<Mode>,
}

#[derive(Debug, Default)]
pub struct Allocation {
    locks: HashMap<LockName, LockState>,
    /// Direct holdings of every owner holding at least one lock.
    held: HashMap<OwnerRef, Holdings>,
    /// Every change since the last take, when asked for.
    changes: Option<Vec<LockChange>>,
}

impl Allocation {
    /// From now on every change is kept for [`Allocation::take_changes`].
    pub fn record_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The changes since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<LockChange> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The direct holdings of `owner`, in lock order.
    pub fn holdings(&self, owner: &Owner) -> Option<&Holdings> {
        self.held.get(owner)
    }

    /// Every owner's direct holdings.
    pub fn all_holdings(&self) -> impl Iterator<Item = (&OwnerRef, &Holdings)> {
        self.held.iter()
    }

    /// The shared handle of an owner that holds locks.
    pub fn owner_ref(&self, owner: &Owner) -> Option<&OwnerRef> {
        self.held.get_key_value(owner).map(|(key, _)| key)
    }

    pub fn mode_held(&self, owner: &Owner, lock: &LockName) -> Option<Mode> {
        Some(self.holding(owner, lock)?.mode)
    }

    pub fn holding(&self, owner: &Owner, lock: &LockName) -> Option<Holding> {
        self.held.get(owner)?.get(lock).copied()
    }

    /// Gives a held lock the token of its grant (restoring a saved state);
    /// false if `owner` does not hold `lock`.
    pub fn set_token(&mut self, owner: &Owner, lock: &LockName, token: Token) -> bool {
        match self.held.get_mut(owner).and_then(|held| held.get_mut(lock)) {
            Some(holding) => {
                holding.token = token;
                true
            }
            None => false,
        }
    }

    /// Every entry already holds exactly as asked (a release of an unheld
    /// lock counts as satisfied).
    pub fn is_satisfied(&self, owner: &Owner, request: &[Entry]) -> bool {
        is_satisfied_by(self.held.get(owner), request)
    }

    /// Steps 3 to 5 of tryUpdateLocks: consistency, lock order, and members
    /// exclusively under a shared group. These depend only on the owner's
    /// own holdings, never on other owners.
    pub fn check(&self, owner: &Owner, request: &[Entry]) -> Result<(), LockError> {
        check_against(self.held.get(owner), request)
    }

    /// Every owner that holds something in the way of `request`, whoever
    /// asks: sorted in owner order, without duplicates. The caller removes
    /// the requester itself (an owner never blocks itself).
    pub fn conflicts(&self, request: &[Entry]) -> Vec<OwnerRef> {
        let mut found: Vec<OwnerRef> = Vec::new();
        for entry in request {
            let Action::Acquire(mode) = entry.action else {
                continue;
            };
            if let Some(state) = self.locks.get(&entry.lock) {
                match mode {
                    Mode::Exclusive => {
                        found.extend(state.direct_holders().cloned());
                        found.extend(state.member_holders.keys().cloned());
                    }
                    Mode::Shared => {
                        found.extend(state.exclusive.iter().cloned());
                        found.extend(state.member_exclusives.keys().cloned());
                    }
                }
            }
            let group_state = entry.lock.group().and_then(|group| self.locks.get(&group));
            if let Some(group_state) = group_state {
                found.extend(group_state.exclusive.iter().cloned());
                if mode == Mode::Exclusive {
                    found.extend(group_state.shared.iter().cloned());
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }

    /// The owners blocking `owner`'s request: conflicts minus itself.
    pub fn blockers(&self, owner: &Owner, request: &[Entry]) -> Vec<OwnerRef> {
        let mut found = self.conflicts(request);
        found.retain(|other| **other != *owner);
        found
    }

    /// Applies every entry: the locks it raises (newly held, or shared to
    /// exclusive) get `token`, the locks held on keep theirs (a downgrade
    /// is not a grant). Answers whether it raised any, that is whether it
    /// used `token`. With `noted`, notes there what it raised and released.
    /// The caller has checked the request and found no blockers.
    pub fn apply(
        &mut self,
        owner: &OwnerRef,
        request: &[Entry],
        token: Token,
        mut noted: Option<&mut RaisedAndReleased>,
    ) -> bool {
        let mut raised_any = false;
        for entry in request {
            let (before, after) = self.apply_entry(owner, entry, token);
            let before_mode = before.map(|holding| holding.mode);
            let raised = after.is_some() && before_mode < after;
            raised_any |= raised;
            if let Some(noted) = noted.as_deref_mut() {
                if raised {
                    let before_token = before.map(|holding| holding.token);
                    noted.raised.push((entry.lock.clone(), before_token));
                } else if before.is_some() && after.is_none() {
                    noted.released.push(entry.lock.clone());
                }
            }
        }
        raised_any
    }

    /// Applies one entry, a raise getting `token`; answers the lock's
    /// holding before and its mode after.
    fn apply_entry(
        &mut self,
        owner: &OwnerRef,
        entry: &Entry,
        token: Token,
    ) -> (Option<Holding>, Option<Mode>) {
        let lock = &entry.lock;
        let held_before = self.holding(owner, lock);
        let before = held_before.map(|holding| holding.mode);
        let after = entry.action.target();
        if before == after {
            return (held_before, after);
        }
        if let Some(changes) = &mut self.changes {
            changes.push(LockChange {
                owner: Arc::clone(owner),
                lock: lock.clone(),
                before,
                after,
            });
        }
        let state = self.locks.entry(lock.clone()).or_default();
        match before {
            Some(Mode::Exclusive) => state.exclusive = None,
            Some(Mode::Shared) => {
                state.shared.remove(owner);
            }
            None => {}
        }
        match after {
            Some(Mode::Exclusive) => {
                debug_assert!(state.exclusive.is_none() && state.shared.is_empty());
                state.exclusive = Some(Arc::clone(owner));
            }
            Some(Mode::Shared) => {
                state.shared.insert(Arc::clone(owner));
            }
            None => {}
        }
        if state.is_unused() {
            self.locks.remove(lock);
        }
        match after {
            Some(mode) => {
                let token = match held_before {
                    Some(kept) if kept.mode > mode => kept.token,
                    _ => token,
                };
                self.held
                    .entry(Arc::clone(owner))
                    .or_default()
                    .insert(lock.clone(), Holding { mode, token });
            }
            None => {
                let held = self
                    .held
                    .get_mut(owner)
                    .expect("a lock held before is in the owner's holdings");
                held.remove(lock);
                if held.is_empty() {
                    self.held.remove(owner);
                }
            }
        }
        if let Some(group) = lock.group() {
            let group_state = self.locks.entry(group.clone()).or_default();
            if before.is_none() {
                count_up(&mut group_state.member_holders, owner);
            }
            if after.is_none() {
                count_down(&mut group_state.member_holders, owner);
            }
            if before == Some(Mode::Exclusive) {
                count_down(&mut group_state.member_exclusives, owner);
            }
            if after == Some(Mode::Exclusive) {
                count_up(&mut group_state.member_exclusives, owner);
            }
            if group_state.is_unused() {
                self.locks.remove(&group);
            }
        }
        (held_before, after)
    }

    /// Every lock in use, directly or only through members, in lock order.
    pub fn list_all_locks(&self) -> Vec<LockName> {
        let mut locks: Vec<LockName> = self.locks.keys().cloned().collect();
        locks.sort_unstable();
        locks
    }

    /// Every lock in use with its direct holders (empty for a group used only
    /// through members), locks in lock order, holders in owner order.
    pub fn list_all_locks_owners(&self) -> Vec<(LockName, Vec<(OwnerRef, Mode)>)> {
        let mut rows: Vec<(LockName, Vec<(OwnerRef, Mode)>)> = self
            .locks
            .iter()
            .map(|(lock, state)| {
                let holders = match &state.exclusive {
                    Some(owner) => vec![(Arc::clone(owner), Mode::Exclusive)],
                    None => state
                        .shared
                        .iter()
                        .map(|owner| (Arc::clone(owner), Mode::Shared))
                        .collect(),
                };
                (lock.clone(), holders)
            })
            .collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// Owners holding at least one lock, in owner order.
    pub fn holders(&self) -> Vec<OwnerRef> {
        let mut owners: Vec<OwnerRef> = self.held.keys().cloned().collect();
        owners.sort_unstable();
        owners
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty() && self.locks.is_empty()
    }

    /// Number of (owner, lock) holdings, for dumps and benchmarks.
    pub fn holding_count(&self) -> usize {
        self.held.values().map(BTreeMap::len).sum()
    }

    /// Panics unless the per-lock index is exactly what the per-owner
    /// holdings imply, and no two owners hold conflicting locks.
    pub fn check_invariants(&self) {
        let mut expected: BTreeMap<LockName, LockState> = BTreeMap::new();
        for (owner, held) in &self.held {
            assert!(!held.is_empty(), "owner {owner} is indexed with no locks");
            for (lock, Holding { mode, .. }) in held {
                let state = expected.entry(lock.clone()).or_default();
                match mode {
                    Mode::Exclusive => {
                        assert!(
                            state.exclusive.is_none() && state.shared.is_empty(),
                            "{lock} held exclusively by {owner} and by others"
                        );
                        state.exclusive = Some(Arc::clone(owner));
                    }
                    Mode::Shared => {
                        assert!(
                            state.exclusive.is_none(),
                            "{lock} held shared by {owner} and exclusively by another"
                        );
                        state.shared.insert(Arc::clone(owner));
                    }
                }
                if let Some(group) = lock.group() {
                    let group_state = expected.entry(group).or_default();
                    count_up(&mut group_state.member_holders, owner);
                    if *mode == Mode::Exclusive {
                        count_up(&mut group_state.member_exclusives, owner);
                    }
                }
            }
        }
        assert_eq!(
            self.locks.len(),
            expected.len(),
            "the lock index has other locks than the holdings imply"
        );
        for (lock, want) in &expected {
            let have = self
                .locks
                .get(lock)
                .unwrap_or_else(|| panic!("{lock} is held but not indexed"));
            assert_eq!(have.exclusive, want.exclusive, "exclusive holder of {lock}");
            assert_eq!(have.shared, want.shared, "shared holders of {lock}");
            assert_eq!(
                have.member_holders, want.member_holders,
                "members of {lock}"
            );
            assert_eq!(
                have.member_exclusives, want.member_exclusives,
                "exclusive members of {lock}"
            );
            // A group held by one owner excludes members held by others.
            for holder in have.direct_holders() {
                let others_in_way = match &have.exclusive {
                    Some(_) => have.member_holders.keys().any(|member| member != holder),
                    None => have.member_exclusives.keys().any(|member| member != holder),
                };
                assert!(
                    !others_in_way,
                    "{lock} held by {holder} while another owner holds a conflicting member"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(text: &str) -> LockName {
        LockName::parse(text).expect("valid lock name")
    }

    #[test]
    fn conflicting_holdings_follow_the_conflict_rules() {
        let held = vec![
            (lock("cluster/BGL"), Mode::Shared),
            (lock("node/n1"), Mode::Shared),
            (lock("node/n2"), Mode::Exclusive),
            (lock("instance/[lockset]"), Mode::Shared),
        ];
        let cases = [
            (vec![Entry::shared(lock("node/n1"))], vec![]),
            (
                vec![Entry::exclusive(lock("node/n1"))],
                vec![(lock("node/n1"), Mode::Shared)],
            ),
            (
                vec![Entry::shared(lock("node/n2"))],
                vec![(lock("node/n2"), Mode::Exclusive)],
            ),
            // A requested group meets its held members.
            (
                vec![Entry::shared(lock("node/[lockset]"))],
                vec![(lock("node/n2"), Mode::Exclusive)],
            ),
            (
                vec![Entry::exclusive(lock("node/[lockset]"))],
                vec![
                    (lock("node/n1"), Mode::Shared),
                    (lock("node/n2"), Mode::Exclusive),
                ],
            ),
            // A requested member meets its held group.
            (vec![Entry::shared(lock("instance/i1"))], vec![]),
            (
                vec![Entry::exclusive(lock("instance/i1"))],
                vec![(lock("instance/[lockset]"), Mode::Shared)],
            ),
            (vec![Entry::new(lock("node/n2"), Action::Release)], vec![]),
        ];
        for (request, expected) in cases {
            assert_eq!(
                conflicting_holdings(&held, &request),
                expected,
                "{request:?}"
            );
        }
    }
}
