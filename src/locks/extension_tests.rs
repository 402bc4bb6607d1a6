//! Unit tests of the lock manager's extensions (D65 to D69): fencing
//! tokens, death marks, fifo fairness, deadlock refusal and `whatIf`.
//!
//! Every change goes through [`LockOp`] and [`LockManager::apply`], the
//! path of the daemon and of journal replay, and is followed by
//! `check_invariants`. Owners J1..J6 are job owners; tokens are counted
//! from a fresh manager, so each test can name them.

use std::sync::Arc;

use super::allocation::OwnerRef;
use super::{
    Deadlocks, Death, Entry, Fairness, Ident, LockError, LockManager, LockName, LockOp, LockPolicy,
    Mode, OpOutcome, Owner, Priority, Token, Update,
};
use crate::limits::DEATH_MARKS_MAX;

/// Job owner `J<n>`.
fn job(n: u64) -> Owner {
    let pid = 100 + u32::try_from(n % 1_000_000).expect("small");
    Owner::job(n, format!("/root/livelocks/job_{n:06}_1"), pid)
}

/// The job id of one of these tests' owners.
fn id(owner: &Owner) -> u64 {
    match owner.ident {
        Ident::Job(id) => id,
        Ident::Name(_) => panic!("only jobs in these tests"),
    }
}

fn ids(owners: &[OwnerRef]) -> Vec<u64> {
    owners.iter().map(|owner| id(owner)).collect()
}

fn lock(text: &str) -> LockName {
    LockName::parse(text).expect("valid lock name")
}

fn x(text: &str) -> Entry {
    Entry::exclusive(lock(text))
}

fn s(text: &str) -> Entry {
    Entry::shared(lock(text))
}

fn manager(fairness: Fairness, deadlocks: Deadlocks) -> LockManager {
    let mut locks = LockManager::new();
    run(
        &mut locks,
        LockOp::SetPolicy {
            policy: LockPolicy {
                fairness,
                deadlocks,
            },
        },
    );
    locks
}

/// Runs one operation and checks the invariants after it.
fn run(locks: &mut LockManager, op: LockOp) -> OpOutcome {
    let outcome = locks.apply(&op);
    locks.check_invariants();
    outcome
}

fn update(locks: &mut LockManager, op: LockOp) -> Result<Update, LockError> {
    match run(locks, op) {
        OpOutcome::Update(result) => result,
        other => panic!("an update answered {other:?}"),
    }
}

/// A `tryUpdateLocks` that must be granted.
#[track_caller]
fn take(locks: &mut LockManager, owner: &Owner, request: &[Entry]) {
    let answer = update(
        locks,
        LockOp::TryUpdate {
            owner: owner.clone(),
            request: request.to_vec(),
        },
    );
    let answer = answer.expect("no error");
    assert!(answer.blockers.is_empty(), "blocked: {answer:?}");
}

/// An `updateLocksWaiting`: its error, or its blockers and notified owners.
fn wait(
    locks: &mut LockManager,
    owner: &Owner,
    priority: Priority,
    request: &[Entry],
) -> Result<(Vec<u64>, Vec<u64>), LockError> {
    update(
        locks,
        LockOp::UpdateWaiting {
            owner: owner.clone(),
            priority,
            request: request.to_vec(),
        },
    )
    .map(|answer| (ids(&answer.blockers), ids(&answer.notify)))
}

fn freed(outcome: OpOutcome) -> Vec<u64> {
    match outcome {
        OpOutcome::Freed(notify) => ids(&notify),
        other => panic!("a release answered {other:?}"),
    }
}

fn free(locks: &mut LockManager, owner: &Owner) -> Vec<u64> {
    freed(run(
        locks,
        LockOp::FreeLocks {
            owner: owner.clone(),
        },
    ))
}

fn free_dead(locks: &mut LockManager, owner: &Owner) -> Vec<u64> {
    freed(run(
        locks,
        LockOp::FreeDead {
            owner: owner.clone(),
        },
    ))
}

fn union(locks: &mut LockManager, owner: &Owner, wanted: &[(&str, Mode)]) -> Vec<String> {
    let wanted = wanted.iter().map(|(name, mode)| (lock(name), *mode));
    match run(
        locks,
        LockOp::OpportunisticUnion {
            owner: owner.clone(),
            wanted: wanted.collect(),
        },
    ) {
        OpOutcome::Acquired(locks) => locks.iter().map(LockName::to_string).collect(),
        other => panic!("a union answered {other:?}"),
    }
}

#[track_caller]
fn token(locks: &LockManager, owner: &Owner, name: &str) -> Token {
    locks
        .grant(owner, &lock(name))
        .unwrap_or_else(|| panic!("J{} holds {name}", id(owner)))
        .token
}

/// The deaths the grant of `name` to `owner` was told of: (lock, dead
/// job, its token).
#[track_caller]
fn told(locks: &LockManager, owner: &Owner, name: &str) -> Vec<(String, u64, Token)> {
    let grant = locks
        .grant(owner, &lock(name))
        .unwrap_or_else(|| panic!("J{} holds {name}", id(owner)));
    deaths(&grant.died)
}

fn deaths(died: &[Death]) -> Vec<(String, u64, Token)> {
    died.iter()
        .map(|death| (death.lock.to_string(), id(&death.owner), death.token))
        .collect()
}

/// The death marks not told yet, in lock order.
fn marks(locks: &LockManager) -> Vec<(String, u64, Token)> {
    deaths(&locks.saved_extensions().grants.marks)
}

fn death(name: &str, owner: u64, token: Token) -> (String, u64, Token) {
    (name.to_owned(), owner, token)
}

/// An independent copy through both saved forms.
fn copy(locks: &LockManager) -> LockManager {
    let copy = LockManager::restore_with(&locks.saved(), &locks.saved_extensions())
        .expect("a saved state restores");
    copy.check_invariants();
    copy
}

/// Everything the saved forms and the lock listing show, and the change
/// counter.
type Fingerprint = (
    super::SavedState,
    super::SavedExtensions,
    u64,
    Vec<(LockName, Vec<(OwnerRef, Mode)>)>,
);

fn fingerprint(locks: &LockManager) -> Fingerprint {
    (
        locks.saved(),
        locks.saved_extensions(),
        locks.changes(),
        locks.list_all_locks_owners(),
    )
}

fn filed_under(locks: &LockManager, owner: &Owner) -> Option<u64> {
    locks
        .saved()
        .pending
        .iter()
        .find(|pending| pending.owner == *owner)
        .map(|pending| id(&pending.filed_under))
}

// ---------------------------------------------------------------------------
// Fencing tokens (D65).

#[test]
fn a_direct_grant_draws_one_token_for_every_lock_it_raises() {
    let mut locks = LockManager::new();
    let (j1, j2) = (job(1), job(2));
    assert_eq!(locks.last_token(), 0);
    take(&mut locks, &j1, &[s("cluster/BGL"), x("instance/a")]);
    assert_eq!(token(&locks, &j1, "cluster/BGL"), 1);
    assert_eq!(token(&locks, &j1, "instance/a"), 1);
    take(&mut locks, &j2, &[s("cluster/BGL")]);
    assert_eq!(token(&locks, &j2, "cluster/BGL"), 2);
    take(&mut locks, &j1, &[x("node/n1")]);
    assert_eq!(token(&locks, &j1, "node/n1"), 3);
    assert_eq!(
        token(&locks, &j1, "cluster/BGL"),
        1,
        "the others keep theirs"
    );
    assert_eq!(locks.last_token(), 3);

    let fence = locks.fence_of(&j1, &[s("cluster/BGL"), x("instance/a"), x("node/n1")]);
    assert_eq!(
        fence,
        Some((3, Vec::new())),
        "the fence is the highest token"
    );
    assert_eq!(locks.fence_of(&j2, &[x("instance/a")]), None);
    assert!(locks.check_fence(&j1, &lock("instance/a"), 1));
    assert!(!locks.check_fence(&j1, &lock("instance/a"), 3));
    assert!(locks.check_fence(&j2, &lock("cluster/BGL"), 2));
    assert!(!locks.check_fence(&j2, &lock("instance/a"), 2));
    // A member's fence is its group's token when only the group is held.
    take(&mut locks, &j2, &[x("nodegroup/[lockset]")]);
    assert!(locks.check_fence(&j2, &lock("nodegroup/g1"), 4));
    assert_eq!(
        locks.fence_of(&j2, &[x("nodegroup/g1")]),
        Some((4, Vec::new()))
    );
}

#[test]
fn a_waiting_request_gets_its_token_when_it_is_granted() {
    let mut locks = LockManager::new();
    let (j1, j2, j3, j4) = (job(1), job(2), job(3), job(4));
    take(&mut locks, &j1, &[x("instance/a")]);
    assert_eq!(
        wait(&mut locks, &j2, 0, &[x("instance/a")]),
        Ok((vec![1], vec![]))
    );
    assert_eq!(locks.last_token(), 1, "waiting draws no token");
    take(&mut locks, &j3, &[x("node/n1")]);
    assert_eq!(free(&mut locks, &j1), [2]);
    assert_eq!(token(&locks, &j2, "instance/a"), 3);

    // Every lock of a granted waiting request shares its token.
    let both = [s("node/n1"), s("node/n2")];
    assert_eq!(wait(&mut locks, &j4, 0, &both), Ok((vec![3], vec![])));
    assert_eq!(free(&mut locks, &j3), [4]);
    assert_eq!(token(&locks, &j4, "node/n1"), 4);
    assert_eq!(token(&locks, &j4, "node/n2"), 4);
    assert_eq!(locks.last_token(), 4);
}

#[test]
fn an_opportunistic_union_is_one_grant_with_one_token() {
    let mut locks = LockManager::new();
    let (j1, j4, j5) = (job(1), job(4), job(5));
    take(&mut locks, &j1, &[x("node/n2")]);
    let wanted = [
        ("node/n1", Mode::Exclusive),
        ("node/n2", Mode::Exclusive),
        ("node/n3", Mode::Exclusive),
    ];
    assert_eq!(union(&mut locks, &j5, &wanted), ["node/n1", "node/n3"]);
    assert_eq!(token(&locks, &j5, "node/n1"), 2);
    assert_eq!(token(&locks, &j5, "node/n3"), 2);
    assert_eq!(locks.last_token(), 2);

    // Acquiring nothing, or too little for the guard, is no grant.
    assert!(union(&mut locks, &j4, &[("node/n2", Mode::Shared)]).is_empty());
    let guarded = run(
        &mut locks,
        LockOp::GuardedOpportunisticUnion {
            count: 3,
            owner: j4.clone(),
            wanted: wanted
                .iter()
                .map(|(name, mode)| (lock(name), *mode))
                .collect(),
        },
    );
    assert_eq!(guarded, OpOutcome::Acquired(Vec::new()));
    assert_eq!(locks.last_token(), 2);

    // A lock named in both modes is raised twice within the one grant.
    let twice = [("node/n5", Mode::Shared), ("node/n5", Mode::Exclusive)];
    assert_eq!(union(&mut locks, &j5, &twice), ["node/n5", "node/n5"]);
    assert_eq!(
        locks.mode_held(&j5, &lock("node/n5")),
        Some(Mode::Exclusive)
    );
    assert_eq!(token(&locks, &j5, "node/n5"), 3);
    assert_eq!(token(&locks, &j5, "node/n1"), 2, "held locks keep theirs");
    assert_eq!(locks.last_token(), 3);
}

#[test]
fn a_lock_already_held_keeps_its_token_and_an_upgrade_is_a_grant() {
    let mut locks = LockManager::new();
    let j1 = job(1);
    take(&mut locks, &j1, &[s("cluster/BGL")]);
    take(&mut locks, &j1, &[s("cluster/BGL"), x("instance/a")]);
    assert_eq!(token(&locks, &j1, "cluster/BGL"), 1);
    assert_eq!(token(&locks, &j1, "instance/a"), 2);
    // A satisfied request changes nothing.
    take(&mut locks, &j1, &[s("cluster/BGL"), x("instance/a")]);
    assert_eq!(locks.last_token(), 2);
    take(&mut locks, &j1, &[s("node/n1")]);
    take(&mut locks, &j1, &[x("node/n1")]);
    assert_eq!(token(&locks, &j1, "node/n1"), 4, "shared to exclusive");
    assert_eq!(token(&locks, &j1, "instance/a"), 2);
    assert_eq!(locks.last_token(), 4);
}

#[test]
fn a_downgrade_is_not_a_grant() {
    let mut locks = LockManager::new();
    let j1 = job(1);
    take(&mut locks, &j1, &[x("instance/a"), x("node/n1")]);
    let notify = run(
        &mut locks,
        LockOp::DowngradeLocksLevel {
            owner: j1.clone(),
            level: super::Level::Node,
        },
    );
    assert_eq!(freed(notify), Vec::<u64>::new());
    assert_eq!(locks.mode_held(&j1, &lock("node/n1")), Some(Mode::Shared));
    assert_eq!(token(&locks, &j1, "node/n1"), 1);
    // A downgrade through an update (allowed below the highest lock, which
    // it covers) keeps the token too.
    take(&mut locks, &j1, &[s("instance/a")]);
    assert_eq!(
        locks.mode_held(&j1, &lock("instance/a")),
        Some(Mode::Shared)
    );
    assert_eq!(token(&locks, &j1, "instance/a"), 1);
    assert_eq!(locks.last_token(), 1);
    // A released lock has no grant left.
    take(&mut locks, &j1, &[Entry::release(lock("node/n1"))]);
    assert!(locks.grant(&j1, &lock("node/n1")).is_none());
    assert!(!locks.check_fence(&j1, &lock("node/n1"), 1));
    assert_eq!(locks.last_token(), 1);
}

#[test]
fn tokens_and_marks_survive_the_saved_form() {
    let mut locks = LockManager::new();
    let (j1, j2, j3, j4, j5) = (job(1), job(2), job(3), job(4), job(5));
    take(&mut locks, &j1, &[x("instance/a")]);
    take(&mut locks, &j2, &[s("node/n1")]);
    assert_eq!(
        wait(&mut locks, &j3, 0, &[x("instance/a")]),
        Ok((vec![1], vec![]))
    );
    assert_eq!(free_dead(&mut locks, &j1), [3]);
    take(&mut locks, &j4, &[x("instance/b")]);
    assert_eq!(free_dead(&mut locks, &j4), Vec::<u64>::new());
    assert_eq!(
        wait(&mut locks, &j5, 0, &[x("node/n1")]),
        Ok((vec![2], vec![]))
    );

    let mut restored = copy(&locks);
    assert_eq!(restored.saved(), locks.saved());
    assert_eq!(restored.saved_extensions(), locks.saved_extensions());
    assert_eq!(restored.last_token(), 4);
    assert_eq!(token(&restored, &j3, "instance/a"), 3);
    assert_eq!(
        told(&restored, &j3, "instance/a"),
        [death("instance/a", 1, 1)]
    );
    assert_eq!(marks(&restored), [death("instance/b", 4, 4)]);

    // Both go on alike: the next tokens are above every earlier one.
    let j6 = job(6);
    for state in [&mut locks, &mut restored] {
        take(state, &j6, &[s("instance/b")]);
        assert_eq!(token(state, &j6, "instance/b"), 5);
        assert_eq!(told(state, &j6, "instance/b"), [death("instance/b", 4, 4)]);
        assert_eq!(free(state, &j2), [5]);
        assert_eq!(token(state, &j5, "node/n1"), 6);
    }
    assert_eq!(restored.saved_extensions(), locks.saved_extensions());

    // A state saved without tokens holds with token 0, never current.
    let untokened = LockManager::restore(&locks.saved()).expect("restores");
    untokened.check_invariants();
    assert_eq!(untokened.last_token(), 0);
    assert_eq!(token(&untokened, &j5, "node/n1"), 0);
    assert!(!untokened.check_fence(&j5, &lock("node/n1"), 0));
}

// ---------------------------------------------------------------------------
// Death marks (D66).

#[test]
fn a_death_is_told_to_the_waiter_granted_the_lock() {
    let mut locks = LockManager::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));
    take(&mut locks, &j1, &[x("instance/a")]);
    assert_eq!(
        wait(&mut locks, &j2, 0, &[x("instance/a")]),
        Ok((vec![1], vec![]))
    );
    assert_eq!(free_dead(&mut locks, &j1), [2]);
    assert_eq!(told(&locks, &j2, "instance/a"), [death("instance/a", 1, 1)]);
    assert!(marks(&locks).is_empty(), "the mark is taken away");
    let (fence, died) = locks.fence_of(&j2, &[x("instance/a")]).expect("held");
    assert_eq!((fence, deaths(&died)), (2, vec![death("instance/a", 1, 1)]));

    // The next holder after a plain release is told nothing.
    assert_eq!(
        wait(&mut locks, &j3, 0, &[x("instance/a")]),
        Ok((vec![2], vec![]))
    );
    assert_eq!(free(&mut locks, &j2), [3]);
    assert!(told(&locks, &j3, "instance/a").is_empty());
}

#[test]
fn a_mark_waits_for_the_next_grant_and_a_surviving_holder_is_told_when_it_upgrades() {
    let mut locks = LockManager::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));
    take(&mut locks, &j1, &[s("instance/a")]);
    take(&mut locks, &j2, &[s("instance/a")]);
    assert_eq!(free_dead(&mut locks, &j1), Vec::<u64>::new());
    assert_eq!(marks(&locks), [death("instance/a", 1, 1)]);
    assert!(
        told(&locks, &j2, "instance/a").is_empty(),
        "it held it before"
    );
    // Raising the lock is a grant, and it is told.
    take(&mut locks, &j2, &[x("instance/a")]);
    assert_eq!(token(&locks, &j2, "instance/a"), 3);
    assert_eq!(told(&locks, &j2, "instance/a"), [death("instance/a", 1, 1)]);
    assert!(marks(&locks).is_empty());

    // Nobody waits: the mark stays until a later grant.
    take(&mut locks, &j3, &[x("node/n1")]);
    assert_eq!(free_dead(&mut locks, &j3), Vec::<u64>::new());
    assert_eq!(marks(&locks), [death("node/n1", 3, 4)]);
    take(&mut locks, &j1, &[s("node/n1")]);
    assert_eq!(told(&locks, &j1, "node/n1"), [death("node/n1", 3, 4)]);
    assert!(marks(&locks).is_empty());
}

#[test]
fn a_group_grant_is_told_of_every_member_death_and_takes_the_marks() {
    let mut locks = LockManager::new();
    let (j1, j2) = (job(1), job(2));
    take(&mut locks, &j1, &[x("node/n1"), x("node/n2")]);
    assert_eq!(free_dead(&mut locks, &j1), Vec::<u64>::new());
    assert_eq!(
        marks(&locks),
        [death("node/n1", 1, 1), death("node/n2", 1, 1)]
    );
    take(&mut locks, &j2, &[s("node/[lockset]")]);
    assert_eq!(
        told(&locks, &j2, "node/[lockset]"),
        [death("node/n1", 1, 1), death("node/n2", 1, 1)]
    );
    assert!(marks(&locks).is_empty());
}

#[test]
fn a_member_grant_is_told_of_its_groups_death_and_leaves_the_mark() {
    let mut locks = LockManager::new();
    let (j1, j2, j3, j4, j5) = (job(1), job(2), job(3), job(4), job(5));
    take(&mut locks, &j1, &[x("instance/[lockset]"), x("instance/a")]);
    assert_eq!(free_dead(&mut locks, &j1), Vec::<u64>::new());
    assert_eq!(
        marks(&locks),
        [death("instance/[lockset]", 1, 1), death("instance/a", 1, 1)]
    );
    take(&mut locks, &j2, &[s("instance/b")]);
    assert_eq!(
        told(&locks, &j2, "instance/b"),
        [death("instance/[lockset]", 1, 1)]
    );
    take(&mut locks, &j3, &[x("instance/a")]);
    assert_eq!(
        told(&locks, &j3, "instance/a"),
        [death("instance/[lockset]", 1, 1), death("instance/a", 1, 1)]
    );
    assert_eq!(marks(&locks), [death("instance/[lockset]", 1, 1)]);
    // Plain releases of the members; the group's grant takes its mark.
    free(&mut locks, &j2);
    free(&mut locks, &j3);
    take(&mut locks, &j4, &[s("instance/[lockset]")]);
    assert_eq!(
        told(&locks, &j4, "instance/[lockset]"),
        [death("instance/[lockset]", 1, 1)]
    );
    assert!(marks(&locks).is_empty());
    take(&mut locks, &j5, &[s("instance/b")]);
    assert!(told(&locks, &j5, "instance/b").is_empty());
}

#[test]
fn no_release_but_a_death_marks_a_lock() {
    let mut locks = LockManager::new();
    let (j1, j2, j3, j4, j5) = (job(1), job(2), job(3), job(4), job(5));
    take(&mut locks, &j1, &[x("instance/a"), x("node/n1")]);
    assert_eq!(
        wait(&mut locks, &j2, 0, &[x("instance/a")]),
        Ok((vec![1], vec![]))
    );
    assert_eq!(
        wait(&mut locks, &j3, 0, &[x("node/n1")]),
        Ok((vec![1], vec![]))
    );
    let level = run(
        &mut locks,
        LockOp::FreeLocksLevel {
            owner: j1.clone(),
            level: super::Level::Node,
        },
    );
    assert_eq!(freed(level), [3]);
    assert_eq!(free(&mut locks, &j1), [2]);
    assert!(told(&locks, &j2, "instance/a").is_empty());
    assert!(told(&locks, &j3, "node/n1").is_empty());
    assert_eq!(
        wait(&mut locks, &j4, 0, &[x("instance/a")]),
        Ok((vec![2], vec![]))
    );
    let intersect = run(
        &mut locks,
        LockOp::IntersectLocks {
            owner: j2.clone(),
            keep: Vec::new(),
        },
    );
    assert_eq!(freed(intersect), [4]);
    assert!(told(&locks, &j4, "instance/a").is_empty());
    assert!(marks(&locks).is_empty());

    // A dead owner that only waited, or holds nothing, marks nothing.
    assert_eq!(
        wait(&mut locks, &j5, 0, &[x("node/n1")]),
        Ok((vec![3], vec![]))
    );
    assert_eq!(free_dead(&mut locks, &j5), Vec::<u64>::new());
    assert!(!locks.has_pending_request(&j5));
    let before = locks.changes();
    assert_eq!(free_dead(&mut locks, &j5), Vec::<u64>::new());
    assert_eq!(locks.changes(), before, "nothing to free, nothing changed");
    assert!(marks(&locks).is_empty());
}

#[test]
fn owners_sharing_a_lock_that_all_died_are_all_told() {
    let mut locks = LockManager::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));
    take(&mut locks, &j1, &[s("cluster/BGL")]);
    take(&mut locks, &j2, &[s("cluster/BGL")]);
    free_dead(&mut locks, &j1);
    free_dead(&mut locks, &j2);
    assert_eq!(
        marks(&locks),
        [death("cluster/BGL", 1, 1), death("cluster/BGL", 2, 2)]
    );
    let restored = copy(&locks);
    assert_eq!(marks(&restored), marks(&locks));
    take(&mut locks, &j3, &[x("cluster/BGL")]);
    assert_eq!(
        told(&locks, &j3, "cluster/BGL"),
        [death("cluster/BGL", 1, 1), death("cluster/BGL", 2, 2)]
    );
    assert!(marks(&locks).is_empty());
}

#[test]
fn death_marks_are_bounded_and_the_oldest_are_forgotten_first() {
    let mut locks = LockManager::new();
    let name = |n: usize| format!("instance/i{n:05}");
    // One more dead owner than marks are kept, each with its own lock and
    // token (1 for the first). Not through `run`: checking the invariants
    // (every mark) after every step would take 10^8 steps.
    for n in 0..=DEATH_MARKS_MAX {
        let owner = job(n as u64 + 1);
        let answer = locks.try_update(&owner, &[x(&name(n))]).expect("free lock");
        assert!(answer.blockers.is_empty());
        locks.free_dead(&owner);
    }
    locks.check_invariants();
    let kept = locks.saved_extensions().grants.marks;
    assert_eq!(kept.len(), DEATH_MARKS_MAX);
    assert!(kept.iter().all(|death| death.lock != lock(&name(0))));
    assert_eq!(kept.iter().map(|death| death.token).min(), Some(2));
    let late = job(2_000_000);
    take(&mut locks, &late, &[s(&name(0)), s(&name(1))]);
    assert!(told(&locks, &late, &name(0)).is_empty(), "forgotten");
    assert_eq!(told(&locks, &late, &name(1)), [death(&name(1), 2, 2)]);
    assert_eq!(marks(&locks).len(), DEATH_MARKS_MAX - 1);
}

// ---------------------------------------------------------------------------
// Fifo fairness (D67).

/// J1 holds node/n1 shared and J2 waits for it exclusively at
/// `waiter_priority`.
fn fifo_with_a_waiter(waiter_priority: Priority) -> LockManager {
    let mut locks = manager(Fairness::Fifo, Deadlocks::Wait);
    take(&mut locks, &job(1), &[s("node/n1")]);
    assert_eq!(
        wait(&mut locks, &job(2), waiter_priority, &[x("node/n1")]),
        Ok((vec![1], vec![]))
    );
    locks
}

#[test]
fn fifo_queues_a_later_conflicting_request_behind_an_earlier_waiter() {
    let (j1, j2, j3) = (job(1), job(2), job(3));
    for waiter_priority in [0, -5] {
        let mut locks = fifo_with_a_waiter(waiter_priority);
        // Compatible with the holder, but not with the waiter ahead.
        assert_eq!(
            wait(&mut locks, &j3, 0, &[s("node/n1")]),
            Ok((vec![2], vec![]))
        );
        assert_eq!(filed_under(&locks, &j3), Some(2));
        assert_eq!(free(&mut locks, &j1), [2], "the waiter goes first");
        assert_eq!(filed_under(&locks, &j3), Some(2));
        assert_eq!(free(&mut locks, &j2), [3]);
        assert_eq!(locks.mode_held(&j3, &lock("node/n1")), Some(Mode::Shared));
    }
    // Ganeti's rule for contrast: granted at once, past the waiter.
    let mut locks = LockManager::new();
    take(&mut locks, &j1, &[s("node/n1")]);
    assert_eq!(
        wait(&mut locks, &j2, 0, &[x("node/n1")]),
        Ok((vec![1], vec![]))
    );
    assert_eq!(
        wait(&mut locks, &j3, 0, &[s("node/n1")]),
        Ok((vec![], vec![]))
    );
}

#[test]
fn fifo_lets_a_more_urgent_request_pass_and_never_queues_a_holder() {
    let (j3, j4, j5) = (job(3), job(4), job(5));
    // More urgent than the waiter: priority still wins.
    let mut locks = fifo_with_a_waiter(5);
    assert_eq!(
        wait(&mut locks, &j3, 0, &[s("node/n1")]),
        Ok((vec![], vec![]))
    );
    let mut locks = fifo_with_a_waiter(0);
    assert_eq!(
        wait(&mut locks, &j3, -1, &[s("node/n1")]),
        Ok((vec![], vec![]))
    );
    // An owner holding locks is not queued behind a waiter.
    take(&mut locks, &j4, &[s("cluster/BGL")]);
    assert_eq!(
        wait(&mut locks, &j4, 0, &[s("node/n1")]),
        Ok((vec![], vec![]))
    );
    // A non-conflicting request passes too.
    assert_eq!(
        wait(&mut locks, &j5, 0, &[s("node/n2")]),
        Ok((vec![], vec![]))
    );
}

#[test]
fn fifo_counts_a_try_update_and_a_union_after_every_waiter() {
    let j5 = job(5);
    let mut locks = fifo_with_a_waiter(19);
    let before = fingerprint(&locks);
    let answer = update(
        &mut locks,
        LockOp::TryUpdate {
            owner: j5.clone(),
            request: vec![s("node/n1")],
        },
    )
    .expect("no error");
    assert_eq!(ids(&answer.blockers), [2]);
    assert_eq!(fingerprint(&locks), before, "a blocked try changes nothing");
    let wanted = [("node/n1", Mode::Shared), ("node/n2", Mode::Shared)];
    assert_eq!(union(&mut locks, &j5, &wanted), ["node/n2"]);
}

#[test]
fn fifo_lets_those_queued_behind_a_withdrawn_waiter_through() {
    let (j2, j3, j4) = (job(2), job(3), job(4));
    let mut locks = fifo_with_a_waiter(0);
    assert_eq!(
        wait(&mut locks, &j3, 0, &[s("node/n1")]),
        Ok((vec![2], vec![]))
    );
    assert_eq!(free(&mut locks, &j2), [3], "J2 held nothing, only waited");
    // The same when the waiter is found dead.
    let mut locks = fifo_with_a_waiter(0);
    assert_eq!(
        wait(&mut locks, &j4, 0, &[s("node/n1")]),
        Ok((vec![2], vec![]))
    );
    assert_eq!(free_dead(&mut locks, &j2), [4]);
}

#[test]
fn switching_fifo_off_grants_those_queued_only_behind_waiters() {
    let j3 = job(3);
    let mut locks = fifo_with_a_waiter(0);
    assert_eq!(
        wait(&mut locks, &j3, 0, &[s("node/n1")]),
        Ok((vec![2], vec![]))
    );
    let switched = run(
        &mut locks,
        LockOp::SetPolicy {
            policy: LockPolicy::default(),
        },
    );
    assert_eq!(freed(switched), [3]);
    assert_eq!(locks.policy(), LockPolicy::default());
    assert_eq!(filed_under(&locks, &job(2)), Some(1), "still waits for J1");
    assert!(locks.saved_extensions().arrivals.is_empty());
}

// ---------------------------------------------------------------------------
// Deadlocks (D68).

fn cycle_of(error: &LockError) -> Vec<(u64, Vec<(String, Mode)>)> {
    let LockError::Deadlock(cycle) = error else {
        panic!("not a deadlock: {error}");
    };
    cycle
        .iter()
        .map(|(owner, holds)| {
            let holds = holds
                .iter()
                .map(|(lock, mode)| (lock.to_string(), *mode))
                .collect();
            (id(owner), holds)
        })
        .collect()
}

fn held(name: &str, mode: Mode) -> Vec<(String, Mode)> {
    vec![(name.to_owned(), mode)]
}

/// J1 and J2 share instance/a; J1 waits to hold it exclusively.
fn conversion(deadlocks: Deadlocks) -> LockManager {
    let mut locks = manager(Fairness::Ganeti, deadlocks);
    take(&mut locks, &job(1), &[s("instance/a")]);
    take(&mut locks, &job(2), &[s("instance/a")]);
    assert_eq!(
        wait(&mut locks, &job(1), 0, &[x("instance/a")]),
        Ok((vec![2], vec![]))
    );
    locks
}

#[test]
fn a_conversion_deadlock_is_refused_naming_both_owners_and_changes_nothing() {
    let (j1, j2) = (job(1), job(2));
    let mut locks = conversion(Deadlocks::Refuse);
    let before = fingerprint(&locks);
    let error = wait(&mut locks, &j2, 0, &[x("instance/a")]).expect_err("a deadlock");
    assert_eq!(
        cycle_of(&error),
        [
            (1, held("instance/a", Mode::Shared)),
            (2, held("instance/a", Mode::Shared)),
        ]
    );
    let text = error.to_string();
    assert!(text.starts_with("Deadlock"), "{text}");
    assert!(
        text.contains(&j1.to_string()) && text.contains("the requester"),
        "{text}"
    );
    assert_eq!(fingerprint(&locks), before);
    assert!(!locks.has_pending_request(&j2));
    // The refused owner can still let go, and the other gets its lock.
    take(&mut locks, &j2, &[Entry::release(lock("instance/a"))]);
    assert_eq!(
        locks.mode_held(&j1, &lock("instance/a")),
        Some(Mode::Exclusive)
    );
}

#[test]
fn with_deadlocks_off_a_conversion_waits_as_in_ganeti() {
    let (j1, j2) = (job(1), job(2));
    let mut locks = conversion(Deadlocks::Wait);
    assert_eq!(
        wait(&mut locks, &j2, 0, &[x("instance/a")]),
        Ok((vec![1], vec![]))
    );
    assert!(locks.has_pending_request(&j1) && locks.has_pending_request(&j2));
    assert_eq!(free(&mut locks, &j1), [2]);
    assert_eq!(
        locks.mode_held(&j2, &lock("instance/a")),
        Some(Mode::Exclusive)
    );
}

#[test]
fn a_group_holder_and_a_member_holder_waiting_for_each_other_are_refused() {
    let (j1, j2, j3) = (job(1), job(2), job(3));
    let mut locks = manager(Fairness::Ganeti, Deadlocks::Refuse);
    take(&mut locks, &j1, &[s("instance/[lockset]")]);
    take(&mut locks, &j2, &[s("instance/a")]);
    let group = [x("instance/[lockset]")];
    assert_eq!(wait(&mut locks, &j1, 0, &group), Ok((vec![2], vec![])));
    let error = wait(&mut locks, &j2, 0, &[x("instance/a")]).expect_err("a deadlock");
    assert_eq!(
        cycle_of(&error),
        [
            (1, held("instance/[lockset]", Mode::Shared)),
            (2, held("instance/a", Mode::Shared)),
        ]
    );
    // An owner holding nothing closes no cycle, however it is blocked.
    assert_eq!(
        wait(&mut locks, &j3, 0, &[x("instance/a")]),
        Ok((vec![1, 2], vec![]))
    );
    // A chain of waits that does not come back is no cycle: J6 waits for
    // J4, which waits for J5, which waits for nobody.
    let (j4, j5, j6) = (job(4), job(5), job(6));
    take(&mut locks, &j5, &[x("node/n2")]);
    take(&mut locks, &j4, &[s("node/n1")]);
    assert_eq!(
        wait(&mut locks, &j4, 0, &[x("node/n2")]),
        Ok((vec![5], vec![]))
    );
    take(&mut locks, &j6, &[s("node/n1")]);
    assert_eq!(
        wait(&mut locks, &j6, 0, &[x("node/n1")]),
        Ok((vec![4], vec![]))
    );
}

/// Turning refusal on with a cycle already waiting (a setting changed at
/// start) keeps the cycle: its requests were accepted and answered as
/// waiting, and the switch cannot answer them again. It judges them again
/// for fairness only; the next request that would close a cycle through
/// them is refused.
#[test]
fn switching_refusal_on_keeps_a_cycle_already_waiting_and_refuses_the_next() {
    let (j1, j2, j3) = (job(1), job(2), job(3));
    let mut locks = conversion(Deadlocks::Wait);
    take(&mut locks, &j3, &[s("instance/a")]);
    assert_eq!(
        wait(&mut locks, &j2, 0, &[x("instance/a")]),
        Ok((vec![1, 3], vec![]))
    );
    let refuse = LockPolicy {
        fairness: Fairness::Ganeti,
        deadlocks: Deadlocks::Refuse,
    };
    let changes = locks.changes();
    let switched = run(&mut locks, LockOp::SetPolicy { policy: refuse });
    assert_eq!(freed(switched), Vec::<u64>::new());
    assert!(locks.changes() > changes);
    assert_eq!(locks.saved_extensions().policy, refuse);
    assert!(locks.has_pending_request(&j1) && locks.has_pending_request(&j2));
    assert_eq!(
        (filed_under(&locks, &j1), filed_under(&locks, &j2)),
        (Some(2), Some(1))
    );
    // The waiters' own re-sent requests still wait.
    assert_eq!(
        wait(&mut locks, &j1, 0, &[x("instance/a")]),
        Ok((vec![2, 3], vec![]))
    );
    let error = wait(&mut locks, &j3, 0, &[x("instance/a")]).expect_err("a deadlock");
    assert_eq!(
        cycle_of(&error),
        [
            (1, held("instance/a", Mode::Shared)),
            (3, held("instance/a", Mode::Shared)),
        ]
    );
    // The cycle ends only when one of its owners lets go.
    assert_eq!(free(&mut locks, &j3), Vec::<u64>::new());
    assert_eq!(free(&mut locks, &j1), [2]);
}

// ---------------------------------------------------------------------------
// whatIf (D69).

/// `what_if` changes nothing and answers what `update_waiting` then does:
/// the same error, the same blockers, and the owner it is filed under.
#[track_caller]
fn assert_what_if_matches(
    locks: &LockManager,
    owner: &Owner,
    priority: Priority,
    request: &[Entry],
) -> super::WhatIf {
    let before = fingerprint(locks);
    let what_if = locks.what_if(owner, priority, request);
    assert_eq!(fingerprint(locks), before, "what_if changed the state");
    let mut probe = copy(locks);
    let answer = probe.update_waiting(owner, priority, request);
    probe.check_invariants();
    match answer {
        Err(error) => {
            assert_eq!(what_if.error, Some(error));
            assert!(what_if.filed_under.is_none());
        }
        Ok(answer) => {
            assert_eq!(what_if.error, None);
            assert_eq!(what_if.blockers, answer.blockers);
            let filed = probe
                .saved()
                .pending
                .into_iter()
                .find(|pending| pending.owner == *owner)
                .map(|pending| Arc::new(pending.filed_under));
            assert_eq!(what_if.filed_under, filed);
        }
    }
    what_if
}

#[test]
fn what_if_answers_as_an_update_would_and_changes_nothing() {
    let (j1, j2, j3) = (job(1), job(2), job(3));
    let mut locks = manager(Fairness::Ganeti, Deadlocks::Refuse);
    take(&mut locks, &j1, &[x("instance/a"), s("node/n1")]);
    assert_eq!(
        wait(&mut locks, &j2, 0, &[x("instance/a")]),
        Ok((vec![1], vec![]))
    );

    let granted = assert_what_if_matches(&locks, &j3, 0, &[s("node/n1")]);
    assert!(granted.blockers.is_empty() && granted.ahead.is_empty());
    let satisfied = assert_what_if_matches(&locks, &j1, 0, &[s("node/n1")]);
    assert!(satisfied.blockers.is_empty() && satisfied.error.is_none());
    // Blocked, with the waiter that would be granted first.
    let blocked = assert_what_if_matches(&locks, &j3, 5, &[s("instance/a")]);
    assert_eq!(ids(&blocked.blockers), [1]);
    let ahead: Vec<u64> = blocked
        .ahead
        .iter()
        .map(|pending| id(&pending.owner))
        .collect();
    assert_eq!(ahead, [2]);
    let urgent = assert_what_if_matches(&locks, &j3, -5, &[s("instance/a")]);
    assert!(urgent.ahead.is_empty(), "more urgent than J2");
    // Errors: the order, a pending owner's other request.
    let order = assert_what_if_matches(&locks, &j1, 0, &[x("cluster/BGL")]);
    assert!(matches!(
        order.error,
        Some(LockError::OrderViolation { .. })
    ));
    let pending = assert_what_if_matches(&locks, &j2, 0, &[s("instance/a")]);
    assert_eq!(pending.error, Some(LockError::PendingRequest));
    let same = assert_what_if_matches(&locks, &j2, 0, &[x("instance/a")]);
    assert_eq!(ids(&same.blockers), [1]);
    // A deadlock, with its cycle.
    take(&mut locks, &j3, &[s("node/n1")]);
    assert_eq!(
        wait(&mut locks, &j3, 0, &[x("node/n1")]),
        Ok((vec![1], vec![]))
    );
    let deadlock = assert_what_if_matches(&locks, &j1, 0, &[x("node/n1")]);
    assert_eq!(
        deadlock.error.as_ref().map(cycle_of),
        Some(vec![
            (3, held("node/n1", Mode::Shared)),
            (1, held("node/n1", Mode::Shared)),
        ])
    );
}

/// A waiting request stays filed where it is when a smaller owner starts
/// blocking it too; `what_if` of the same request says so.
#[test]
fn what_if_of_a_waiting_request_names_where_it_is_filed() {
    let (j1, j2, j3) = (job(1), job(2), job(3));
    let mut locks = LockManager::new();
    take(&mut locks, &j2, &[s("node/n2")]);
    assert_eq!(
        wait(&mut locks, &j3, 0, &[x("node/n2")]),
        Ok((vec![2], vec![]))
    );
    take(&mut locks, &j1, &[s("node/n2")]);
    assert_eq!(filed_under(&locks, &j3), Some(2));
    let again = assert_what_if_matches(&locks, &j3, 0, &[x("node/n2")]);
    assert_eq!(ids(&again.blockers), [1, 2]);
    assert_eq!(again.filed_under.as_deref().map(id), Some(2));
}

#[test]
fn what_if_in_fifo_mode_names_the_waiters_ahead_as_blockers() {
    let (j3, j4) = (job(3), job(4));
    let locks = fifo_with_a_waiter(0);
    let behind = assert_what_if_matches(&locks, &j3, 0, &[s("node/n1")]);
    assert_eq!(ids(&behind.blockers), [2]);
    assert_eq!(behind.filed_under.as_deref().map(id), Some(2));
    let ahead: Vec<u64> = behind
        .ahead
        .iter()
        .map(|pending| id(&pending.owner))
        .collect();
    assert_eq!(ahead, [2]);
    let passes = assert_what_if_matches(&locks, &j4, -1, &[s("node/n1")]);
    assert!(passes.blockers.is_empty());
}
