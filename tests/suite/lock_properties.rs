//! Property tests of the lock core: random sequences of every public
//! mutating operation of [`LockManager`], over five owners and a universe of
//! nine locks (two groups of two members each, the BGL under its cluster
//! group, and `cluster/config`).
//!
//! - `the_real_manager_agrees_with_the_reference`: the differential test
//!   against [`Reference`] after every operation.
//! - One proptest per property of LOCKS.md, "Properties every
//!   implementation must keep", each named after it. Most check every step
//!   of a random sequence (`drive`); the waiting-progress ones build Ganeti's
//!   `forAllBlocked` situation (a state, an owner, and a waiting request of
//!   it that is blocked) and release owners from there.
//! - `a_cascade_of_grants_is_depth_first_as_in_ganeti`: one fixed sequence
//!   where a depth-first and a breadth-first revisit differ.
//!
//! Sequences come in two flavours, half and half: every operation with
//! random requests ([`op_strategy`]), and queues ([`queue_op_strategy`]):
//! owners climbing a ladder of locks with hand-offs, and releases of the
//! owners others wait for. Uniform random requests rarely make a release
//! grant more than one waiter; the queues do, including the recursive
//! grants of Ganeti's revisit (a granted waiter that hands a lock off lets
//! the requests filed under it through). Per 512 sequences the mix gives
//! about 550 steps that notify, 80 that notify two or more, and 40
//! recursive grants.
//!
//! Failure output names owners by their index in [`owners`] (`o0` is the
//! named owner, `o1`..`o4` are jobs, in owner order); `resend`, `climb` and
//! `free_blocker` are resolved against the state when applied (the step
//! message shows the resolved operation).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestCaseError, TestRng, TestRunner};

use warden::locks::{
    Action, Entry, Level, LockError, LockManager, LockName, Mode, Owner, Priority, SavedPending,
    SavedState,
};

use crate::harness::{
    LADDER, Op, Outcome, all_locks_owners, answer_of, apply_real, apply_reference,
    compare_managers, compare_outcomes, compare_states, copy, drop_pending, ensure, lock, owned,
    pending_by_value, resolve, restore,
};
use crate::reference::{Answer, Reference};

const CASES: u32 = 512;
const DIFFERENTIAL_CASES: u32 = 2048;
pub(crate) const SEQUENCE_OPS_MAX: usize = 40;
/// The scenario tests must find a blocked waiting request in at least this
/// share of their cases, or they test too little.
const SCENARIO_FOUND_PERCENT_MIN: usize = 50;

/// Five owners, in owner order: a named client before the jobs, jobs by
/// number (10 after 2), then by livelock.
pub(crate) fn owners() -> Vec<Owner> {
    let owners = vec![
        Owner::named("watcher", "/ll/watcher", 7),
        Owner::job(1, "/ll/job-1", 101),
        Owner::job(2, "/ll/job-2", 102),
        Owner::job(2, "/ll/job-2b", 103),
        Owner::job(10, "/ll/job-10", 110),
    ];
    assert!(owners.windows(2).all(|pair| pair[0] < pair[1]));
    owners
}

fn universe_locks() -> Vec<LockName> {
    [
        "cluster/[lockset]",
        "cluster/BGL",
        "instance/[lockset]",
        "instance/a",
        "instance/b",
        "node/[lockset]",
        "node/n1",
        "node/n2",
        "cluster/config",
    ]
    .into_iter()
    .map(lock)
    .collect()
}

pub(crate) fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A runner with a fixed seed, so that a run is repeatable and CI never
/// fails on a case nobody ran before; `WARDEN_PROPTEST_RANDOM=1` explores
/// fresh cases instead.
fn seeded_runner(config: ProptestConfig) -> TestRunner {
    if std::env::var_os("WARDEN_PROPTEST_RANDOM").is_some() {
        return TestRunner::new(config);
    }
    TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &[0x5a; 32]),
    )
}

// ---- Strategies ----

/// Members more often than groups, so that several waiters meet on one
/// lock and a release grants more than one of them.
fn lock_strategy() -> impl Strategy<Value = LockName> {
    let locks = universe_locks();
    let weights = [1, 3, 1, 3, 2, 1, 3, 2, 2];
    let weighted: Vec<(u32, Just<LockName>)> = weights
        .into_iter()
        .zip(locks)
        .map(|(weight, lock)| (weight, Just(lock)))
        .collect();
    prop::strategy::Union::new_weighted(weighted)
}

fn mode_strategy() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Shared), Just(Mode::Exclusive)]
}

fn entry_strategy() -> impl Strategy<Value = Entry> {
    let action = prop_oneof![
        1 => Just(Action::Release),
        4 => Just(Action::Acquire(Mode::Shared)),
        3 => Just(Action::Acquire(Mode::Exclusive)),
    ];
    (lock_strategy(), action).prop_map(|(lock, action)| Entry::new(lock, action))
}

pub(crate) fn request_strategy() -> impl Strategy<Value = Vec<Entry>> {
    prop_oneof![
        1 => prop::collection::vec(entry_strategy(), 0..=0),
        8 => prop::collection::vec(entry_strategy(), 1..=1),
        4 => prop::collection::vec(entry_strategy(), 2..=2),
        2 => prop::collection::vec(entry_strategy(), 3..=3),
    ]
}

pub(crate) fn priority_strategy() -> impl Strategy<Value = Priority> {
    -2i64..=2
}

fn level_strategy() -> impl Strategy<Value = Level> {
    prop::sample::select(vec![
        Level::Cluster,
        Level::Instance,
        Level::Node,
        Level::Config,
        Level::NodeGroup,
    ])
}

fn wanted_strategy() -> impl Strategy<Value = Vec<(LockName, Mode)>> {
    prop::collection::vec((lock_strategy(), mode_strategy()), 0..=4)
}

pub(crate) fn op_strategy() -> impl Strategy<Value = Op> {
    let owner = || 0..owners().len();
    prop_oneof![
        3 => (owner(), request_strategy())
            .prop_map(|(owner, request)| Op::TryUpdate { owner, request }),
        10 => (owner(), priority_strategy(), request_strategy()).prop_map(
            |(owner, priority, request)| Op::UpdateWaiting { owner, priority, request }
        ),
        1 => (owner(), priority_strategy()).prop_map(|(owner, priority)| Op::Resend { owner, priority }),
        3 => owner().prop_map(|owner| Op::FreeLocks { owner }),
        3 => (0usize..8).prop_map(|pick| Op::FreeBlocker { pick }),
        2 => (owner(), level_strategy()).prop_map(|(owner, level)| Op::FreeLocksLevel { owner, level }),
        2 => (owner(), level_strategy()).prop_map(|(owner, level)| Op::Downgrade { owner, level }),
        1 => (owner(), prop::collection::vec(lock_strategy(), 0..=3))
            .prop_map(|(owner, keep)| Op::Intersect { owner, keep }),
        2 => (owner(), wanted_strategy()).prop_map(|(owner, wanted)| Op::Union { owner, wanted }),
        1 => (0usize..=3, owner(), wanted_strategy())
            .prop_map(|(count, owner, wanted)| Op::Guarded { count, owner, wanted }),
    ]
}

/// Queues: single-entry waiting requests on a few hot locks, downgrades,
/// and frequent releases of blockers, so that several waiters pile up
/// behind one owner and a release grants a cascade of them.
pub(crate) fn queue_op_strategy() -> impl Strategy<Value = Op> {
    let owner = || 0..owners().len();
    let hot = prop::sample::select(
        [
            "cluster/BGL",
            "instance/[lockset]",
            "instance/a",
            "node/n1",
            "node/n2",
        ]
        .into_iter()
        .map(lock)
        .collect::<Vec<_>>(),
    );
    // A waiter that releases or downgrades a lock when granted lets the
    // requests filed under it through: the recursive part of the revisit.
    let acquire = (hot.clone(), mode_strategy())
        .prop_map(|(lock, mode)| Entry::new(lock, Action::Acquire(mode)));
    let hand_off = (
        hot,
        prop_oneof![Just(Action::Release), Just(Action::Acquire(Mode::Shared))],
    )
        .prop_map(|(lock, action)| Entry::new(lock, action));
    let request = (acquire, prop::option::of(hand_off), any::<bool>()).prop_map(
        |(acquire, hand_off, hand_off_first)| match hand_off {
            None => vec![acquire],
            Some(hand_off) if hand_off_first => vec![hand_off, acquire],
            Some(hand_off) => vec![acquire, hand_off],
        },
    );
    let climb = (
        owner(),
        priority_strategy(),
        0..LADDER.len(),
        mode_strategy(),
        prop_oneof![
            1 => Just(None),
            2 => Just(Some(Action::Release)),
            1 => Just(Some(Action::Acquire(Mode::Shared))),
        ],
    )
        .prop_map(|(owner, priority, start, mode, hand_off)| Op::Climb {
            owner,
            priority,
            start,
            mode,
            hand_off,
        });
    prop_oneof![
        16 => climb,
        1 => (owner(), priority_strategy(), request).prop_map(|(owner, priority, request)| {
            Op::UpdateWaiting { owner, priority, request }
        }),
        2 => (0usize..8).prop_map(|pick| Op::FreeBlocker { pick }),
        1 => owner().prop_map(|owner| Op::FreeLocks { owner }),
        1 => (owner(), level_strategy()).prop_map(|(owner, level)| Op::Downgrade { owner, level }),
        1 => (owner(), priority_strategy()).prop_map(|(owner, priority)| Op::Resend { owner, priority }),
    ]
}

/// Sequences of every operation, or queue-building ones.
fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    prop_oneof![
        1 => prop::collection::vec(op_strategy(), 0..=SEQUENCE_OPS_MAX),
        1 => prop::collection::vec(queue_op_strategy(), 0..=SEQUENCE_OPS_MAX),
    ]
}

// ---- Driving a sequence ----

/// One applied operation, for the checks.
struct Step<'a> {
    owners: &'a [Owner],
    /// The resolved operation.
    op: &'a Op,
    before: &'a SavedState,
    outcome: &'a Outcome,
    after: &'a SavedState,
    /// The manager after the operation.
    real: &'a LockManager,
}

impl Step<'_> {
    fn me(&self) -> &Owner {
        &self.owners[self.op.owner()]
    }
}

/// Applies `ops` to a fresh manager, checking its invariants and `check`
/// after every step. Answers the final manager.
fn drive(
    ops: &[Op],
    mut check: impl FnMut(&Step<'_>) -> Result<(), String>,
) -> Result<LockManager, TestCaseError> {
    let owners = owners();
    let mut real = LockManager::new();
    for (index, op) in ops.iter().enumerate() {
        let op = resolve(op, &real, &owners);
        let before = real.saved();
        let outcome = apply_real(&mut real, &op, &owners);
        real.check_invariants();
        let after = real.saved();
        let step = Step {
            owners: &owners,
            op: &op,
            before: &before,
            outcome: &outcome,
            after: &after,
            real: &real,
        };
        check(&step).map_err(|message| {
            TestCaseError::fail(format!(
                "after step {index}, {op:?} answered {outcome:?}: {message}"
            ))
        })?;
    }
    Ok(real)
}

fn fail(message: String) -> TestCaseError {
    TestCaseError::fail(message)
}

fn holdings_of(saved: &SavedState, owner: &Owner) -> BTreeMap<LockName, Mode> {
    saved
        .holdings
        .iter()
        .find(|(holder, _)| holder == owner)
        .map(|(_, locks)| locks.iter().cloned().collect())
        .unwrap_or_default()
}

fn pending_of<'s>(saved: &'s SavedState, owner: &Owner) -> Option<&'s SavedPending> {
    saved.pending.iter().find(|pending| pending.owner == *owner)
}

/// Every entry holds exactly as asked.
fn satisfies(held: &BTreeMap<LockName, Mode>, request: &[Entry]) -> bool {
    request
        .iter()
        .all(|entry| held.get(&entry.lock).copied() == entry.action.target())
}

fn held_map(real: &LockManager, owner: &Owner) -> BTreeMap<LockName, Mode> {
    real.list_locks(owner).into_iter().collect()
}

/// The same lock, or one is the group of the other.
fn related(a: &LockName, b: &LockName) -> bool {
    a == b || a.group().as_ref() == Some(b) || b.group().as_ref() == Some(a)
}

fn show(request: &[Entry]) -> String {
    let entries: Vec<String> = request.iter().map(Entry::to_string).collect();
    format!("[{}]", entries.join(", "))
}

// ---- Checks of one state ----

/// One owner's exclusive locks never overlap any other owner's locks.
fn check_exclusive_locks_never_overlap(real: &LockManager, owners: &[Owner]) -> Result<(), String> {
    for a in owners {
        for (lock, mode) in real.list_locks(a) {
            if mode != Mode::Exclusive {
                continue;
            }
            for b in owners.iter().filter(|b| *b != a) {
                for (other, _) in real.list_locks(b) {
                    ensure!(
                        !related(&lock, &other),
                        "{a} holds {lock} exclusively while {b} holds {other}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Nobody else holds a group exclusively while I hold a member.
fn check_no_group_held_exclusively_by_another_while_i_hold_a_member(
    real: &LockManager,
    owners: &[Owner],
) -> Result<(), String> {
    for me in owners {
        for (member, _) in real.list_locks(me) {
            let Some(group) = member.group() else {
                continue;
            };
            for other in owners.iter().filter(|other| *other != me) {
                ensure!(
                    held_map(real, other).get(&group) != Some(&Mode::Exclusive),
                    "{other} holds {group} exclusively while {me} holds its member {member}"
                );
            }
        }
    }
    Ok(())
}

/// Nobody else holds a group at all while I hold a member exclusively.
fn check_no_group_held_by_another_while_i_hold_a_member_exclusively(
    real: &LockManager,
    owners: &[Owner],
) -> Result<(), String> {
    for me in owners {
        for (member, mode) in real.list_locks(me) {
            let Some(group) = member.group() else {
                continue;
            };
            if mode != Mode::Exclusive {
                continue;
            }
            for other in owners.iter().filter(|other| *other != me) {
                ensure!(
                    !held_map(real, other).contains_key(&group),
                    "{other} holds {group} while {me} holds its member {member} exclusively"
                );
            }
        }
    }
    Ok(())
}

/// The listings agree with each other and with what every owner holds.
fn check_listings_agree(real: &LockManager, owners: &[Owner]) -> Result<(), String> {
    let all = real.list_all_locks();
    let rows = all_locks_owners(real);
    let row_locks: Vec<LockName> = rows.iter().map(|(lock, _)| lock.clone()).collect();
    ensure!(
        row_locks == all,
        "list_all_locks {all:?} and list_all_locks_owners {row_locks:?} differ"
    );
    ensure!(
        all.windows(2).all(|pair| pair[0] < pair[1]),
        "list_all_locks is not in lock order without duplicates: {all:?}"
    );
    let mut direct: BTreeMap<LockName, Vec<(Owner, Mode)>> = BTreeMap::new();
    let mut in_use: BTreeSet<LockName> = BTreeSet::new();
    let mut expected_holdings = Vec::new();
    for owner in owners {
        let held = real.list_locks(owner);
        ensure!(
            held.windows(2).all(|pair| pair[0].0 < pair[1].0),
            "list_locks({owner}) is not in lock order: {held:?}"
        );
        for (lock, mode) in &held {
            direct
                .entry(lock.clone())
                .or_default()
                .push((owner.clone(), *mode));
            in_use.insert(lock.clone());
            if let Some(group) = lock.group() {
                in_use.insert(group);
            }
        }
        if !held.is_empty() {
            expected_holdings.push((owner.clone(), held));
        }
    }
    let in_use: Vec<LockName> = in_use.into_iter().collect();
    ensure!(
        all == in_use,
        "list_all_locks {all:?}, but the owners' holdings use {in_use:?}"
    );
    for (lock, holders) in &rows {
        let want = direct.get(lock).cloned().unwrap_or_default();
        ensure!(
            *holders == want,
            "list_all_locks_owners shows {lock} held by {holders:?}, list_locks by {want:?}"
        );
        ensure!(
            !holders.is_empty() || lock.is_group(),
            "{lock} is listed with no holders but is no group"
        );
    }
    let pending = pending_by_value(real.list_pending());
    ensure!(
        pending
            .windows(2)
            .all(|pair| (pair[0].0, &pair[0].1) < (pair[1].0, &pair[1].1)),
        "list_pending is not in (priority, owner) order with one request per owner: {pending:?}"
    );
    for owner in owners {
        let listed = pending.iter().any(|(_, waiter, _)| waiter == owner);
        ensure!(
            real.has_pending_request(owner) == listed,
            "has_pending_request({owner}) is {} but the pending listing says {listed}",
            real.has_pending_request(owner)
        );
    }
    let expected_owners: Vec<Owner> = owners
        .iter()
        .filter(|owner| !real.list_locks(owner).is_empty() || real.has_pending_request(owner))
        .cloned()
        .collect();
    let listed_owners = owned(&real.owners());
    ensure!(
        listed_owners == expected_owners,
        "owners() is {listed_owners:?}, holders and waiters are {expected_owners:?}"
    );
    let saved = real.saved();
    ensure!(
        saved.holdings == expected_holdings,
        "saved holdings {:?} differ from list_locks {expected_holdings:?}",
        saved.holdings
    );
    let saved_pending: Vec<(Priority, Owner, Vec<Entry>)> = saved
        .pending
        .iter()
        .map(|p| (p.priority, p.owner.clone(), p.request.clone()))
        .collect();
    ensure!(
        saved_pending == pending,
        "saved pending {saved_pending:?} differs from list_pending {pending:?}"
    );
    Ok(())
}

/// Every pending request is blocked right now, by the owner it is filed
/// under among others.
fn check_every_pending_request_is_blocked(real: &LockManager) -> Result<(), String> {
    for waiting in real.saved().pending {
        let mut probe = copy(real);
        drop_pending(&mut probe, &waiting.owner);
        match probe.try_update(&waiting.owner, &waiting.request) {
            Ok(update) => {
                let blockers = owned(&update.blockers);
                ensure!(
                    !blockers.is_empty(),
                    "the pending request {} of {} is not blocked",
                    show(&waiting.request),
                    waiting.owner
                );
                ensure!(
                    blockers.contains(&waiting.filed_under),
                    "the pending request of {} is filed under {}, which does not block it \
                     (blockers {blockers:?})",
                    waiting.owner,
                    waiting.filed_under
                );
            }
            Err(error) => {
                return Err(format!(
                    "the pending request {} of {} would be refused: {error}",
                    show(&waiting.request),
                    waiting.owner
                ));
            }
        }
    }
    Ok(())
}

// ---- Checks of one step ----

/// An update by B never changes A's locks (nor A's pending request),
/// unless it granted A's waiting request and so notified A.
fn check_update_by_another_never_changes_my_locks(step: &Step<'_>) -> Result<(), String> {
    let me = step.me();
    let notified = step.outcome.notified();
    for other in step.owners {
        if other == me || notified.contains(other) {
            continue;
        }
        let (before, after) = (
            holdings_of(step.before, other),
            holdings_of(step.after, other),
        );
        ensure!(
            before == after,
            "the locks of {other} changed from {before:?} to {after:?} though it was not notified"
        );
        let waiting = |saved: &SavedState| {
            pending_of(saved, other).map(|pending| (pending.priority, pending.request.clone()))
        };
        ensure!(
            waiting(step.before) == waiting(step.after),
            "the pending request of {other} changed though it was not notified"
        );
    }
    Ok(())
}

/// An update is all or nothing: refused or blocked, it changes no lock;
/// granted, the owner holds exactly its old locks with every entry applied.
fn check_update_is_all_or_nothing(step: &Step<'_>) -> Result<(), String> {
    let Some(request) = step.op.request() else {
        return Ok(());
    };
    let me = step.me();
    let Outcome::Update(result) = step.outcome else {
        return Err("an update answered no update".to_owned());
    };
    match result {
        Err(error) => ensure!(
            step.before == step.after,
            "refused with {error:?}, yet the state changed"
        ),
        Ok(answer) if !answer.blockers.is_empty() => {
            ensure!(
                step.before.holdings == step.after.holdings,
                "a blocked update changed some locks"
            );
            ensure!(answer.notify.is_empty(), "a blocked update notified owners");
            let others = |saved: &SavedState| -> Vec<SavedPending> {
                saved
                    .pending
                    .iter()
                    .filter(|pending| pending.owner != *me)
                    .cloned()
                    .collect()
            };
            ensure!(
                others(step.before) == others(step.after),
                "a blocked update changed other owners' pending requests"
            );
            if let Op::TryUpdate { .. } = step.op {
                ensure!(
                    step.before == step.after,
                    "a blocked try_update changed the state"
                );
            }
        }
        Ok(_) => {
            let mut expected = holdings_of(step.before, me);
            for entry in request {
                match entry.action.target() {
                    Some(mode) => {
                        expected.insert(entry.lock.clone(), mode);
                    }
                    None => {
                        expected.remove(&entry.lock);
                    }
                }
            }
            let after = holdings_of(step.after, me);
            ensure!(
                after == expected,
                "granted, but {me} holds {after:?} instead of {expected:?}"
            );
            ensure!(
                pending_of(step.after, me).is_none(),
                "granted, but {me} is pending"
            );
        }
    }
    Ok(())
}

/// A pure release by an owner without a pending request always succeeds.
fn check_pure_release_always_succeeds(step: &Step<'_>) -> Result<(), String> {
    let Some(request) = step.op.request() else {
        return Ok(());
    };
    let me = step.me();
    let pure_release = request.iter().all(|entry| entry.action == Action::Release);
    if !pure_release || pending_of(step.before, me).is_some() {
        return Ok(());
    }
    ensure!(
        matches!(step.outcome, Outcome::Update(Ok(answer)) if answer.blockers.is_empty()),
        "a pure release did not succeed"
    );
    let held = holdings_of(step.after, me);
    ensure!(
        request.iter().all(|entry| !held.contains_key(&entry.lock)),
        "released, but {me} still holds some of it: {held:?}"
    );
    Ok(())
}

/// Reported blockers are sufficient (once they all free everything, the
/// same request succeeds) and necessary (with two or more, keeping any one
/// still blocks, and it alone is reported). Checked on the state before the
/// step with every pending request dropped, so that no waiter takes what
/// the blockers free.
fn check_blockers_sufficient_and_necessary(step: &Step<'_>) -> Result<(), String> {
    let (Some(request), Some(blockers)) = (step.op.request(), step.outcome.blockers()) else {
        return Ok(());
    };
    if blockers.is_empty() {
        return Ok(());
    }
    let me = step.me();
    let mut base = restore(step.before);
    for waiting in &step.before.pending {
        drop_pending(&mut base, &waiting.owner);
    }
    let mut probe = copy(&base);
    for blocker in blockers {
        probe.free_locks(blocker);
    }
    let answer = probe.try_update(me, request).map(answer_of);
    ensure!(
        answer == Ok(Answer::default()),
        "once its blockers {blockers:?} free everything, {} answers {answer:?}",
        show(request)
    );
    if blockers.len() >= 2 {
        for keep in blockers {
            let mut probe = copy(&base);
            for blocker in blockers.iter().filter(|blocker| *blocker != keep) {
                probe.free_locks(blocker);
            }
            let answer = probe.try_update(me, request).map(answer_of);
            let want = Answer {
                blockers: vec![keep.clone()],
                notify: Vec::new(),
            };
            ensure!(
                answer == Ok(want),
                "with only {keep} of the blockers {blockers:?} left, {} answers {answer:?}",
                show(request)
            );
        }
    }
    Ok(())
}

/// An owner with a pending request cannot update: any other update is the
/// pending-request error, the identical waiting request answers its current
/// blockers, and nothing changes; an opportunistic union acquires nothing.
fn check_pending_owner_cannot_update(step: &Step<'_>) -> Result<(), String> {
    let Some(waiting) = pending_of(step.before, step.me()) else {
        return Ok(());
    };
    let refused = Outcome::Update(Err(LockError::PendingRequest));
    match step.op {
        Op::TryUpdate { .. } => ensure!(*step.outcome == refused, "try_update was not refused"),
        Op::UpdateWaiting { request, .. } if *request != waiting.request => {
            ensure!(
                *step.outcome == refused,
                "a different waiting request was not refused"
            );
        }
        Op::UpdateWaiting { .. } => {
            ensure!(
                matches!(step.outcome, Outcome::Update(Ok(answer))
                    if !answer.blockers.is_empty() && answer.notify.is_empty()),
                "re-sending the identical pending request did not answer its blockers"
            );
            ensure!(
                step.before == step.after,
                "re-sending the identical pending request changed the state"
            );
        }
        Op::Union { .. } | Op::Guarded { .. } => {
            ensure!(
                *step.outcome == Outcome::Acquired(Vec::new()),
                "an opportunistic union of a waiting owner acquired something"
            );
            ensure!(
                step.before == step.after,
                "an opportunistic union of a waiting owner changed the state"
            );
        }
        _ => {}
    }
    Ok(())
}

/// A blocked waiting request makes its owner pending, with the request as
/// sent, filed under its smallest blocker; a re-sent one keeps its priority.
fn check_blocked_waiting_request_makes_owner_pending(step: &Step<'_>) -> Result<(), String> {
    let Op::UpdateWaiting {
        priority, request, ..
    } = step.op
    else {
        return Ok(());
    };
    let Outcome::Update(Ok(answer)) = step.outcome else {
        return Ok(());
    };
    if answer.blockers.is_empty() {
        return Ok(());
    }
    let me = step.me();
    ensure!(step.real.has_pending_request(me), "blocked but not pending");
    let Some(now) = pending_of(step.after, me) else {
        return Err("blocked but not in the saved pending requests".to_owned());
    };
    ensure!(
        now.request == *request,
        "pending with {} instead of {}",
        show(&now.request),
        show(request)
    );
    match pending_of(step.before, me) {
        Some(old) => ensure!(
            now.priority == old.priority,
            "the re-sent request has priority {} instead of its original {}",
            now.priority,
            old.priority
        ),
        None => {
            ensure!(
                now.priority == *priority,
                "pending at priority {}",
                now.priority
            );
            ensure!(
                now.filed_under == answer.blockers[0],
                "filed under {} instead of the smallest blocker {}",
                now.filed_under,
                answer.blockers[0]
            );
        }
    }
    Ok(())
}

/// Whoever is notified held a pending request and now holds what it asked
/// for; whoever's pending request was granted is notified, once.
fn check_notified_owners_hold_what_they_asked_for(step: &Step<'_>) -> Result<(), String> {
    let me = step.me();
    let notified = step.outcome.notified();
    let unique: BTreeSet<&Owner> = notified.iter().collect();
    ensure!(
        unique.len() == notified.len(),
        "an owner is notified twice: {notified:?}"
    );
    for owner in notified {
        ensure!(owner != me, "{me} is notified of its own update");
        let Some(asked) = pending_of(step.before, owner) else {
            return Err(format!("{owner} is notified but was not waiting"));
        };
        ensure!(
            pending_of(step.after, owner).is_none(),
            "{owner} is notified but still pending"
        );
        let held = holdings_of(step.after, owner);
        ensure!(
            satisfies(&held, &asked.request),
            "{owner} is notified but holds {held:?}, having asked for {}",
            show(&asked.request)
        );
    }
    for waiting in &step.before.pending {
        if waiting.owner == *me || pending_of(step.after, &waiting.owner).is_some() {
            continue;
        }
        ensure!(
            notified.contains(&waiting.owner),
            "the pending request of {} was granted but {} was not notified",
            waiting.owner,
            waiting.owner
        );
    }
    Ok(())
}

/// Repeating an applied update (or a free, downgrade or intersect) changes
/// nothing and notifies nobody.
fn check_repeating_changes_nothing(step: &Step<'_>) -> Result<(), String> {
    let me = step.me();
    let mut probe = copy(step.real);
    match (step.op, step.outcome) {
        (
            Op::TryUpdate { request, .. } | Op::UpdateWaiting { request, .. },
            Outcome::Update(Ok(answer)),
        ) if answer.blockers.is_empty() => {
            let again = probe.try_update(me, request).map(answer_of);
            ensure!(
                again == Ok(Answer::default()),
                "try_update again answered {again:?}"
            );
            let again = probe.update_waiting(me, 0, request).map(answer_of);
            ensure!(
                again == Ok(Answer::default()),
                "update_waiting again answered {again:?}"
            );
        }
        (Op::FreeLocks { .. }, _) => {
            let again = owned(&probe.free_locks(me));
            ensure!(again.is_empty(), "free_locks again notified {again:?}");
        }
        (Op::FreeLocksLevel { level, .. }, _) => {
            let again = owned(&probe.free_locks_level(me, *level));
            ensure!(
                again.is_empty(),
                "free_locks_level again notified {again:?}"
            );
        }
        (Op::Downgrade { level, .. }, _) => {
            let again = owned(&probe.downgrade_locks_level(me, *level));
            ensure!(
                again.is_empty(),
                "downgrade_locks_level again notified {again:?}"
            );
        }
        (Op::Intersect { keep, .. }, _) => {
            let again = owned(&probe.intersect_locks(me, keep));
            ensure!(again.is_empty(), "intersect_locks again notified {again:?}");
        }
        _ => return Ok(()),
    }
    ensure!(
        probe.saved() == *step.after,
        "repeating the operation changed the state"
    );
    Ok(())
}

/// An opportunistic union never lowers a held lock, returns only locks it
/// acquired and now holds in a requested mode, and touches nothing else;
/// the guarded form changes nothing unless it acquires at least `count`.
fn check_opportunistic_union(step: &Step<'_>) -> Result<(), String> {
    let (wanted, count) = match step.op {
        Op::Union { wanted, .. } => (wanted, 0),
        Op::Guarded { count, wanted, .. } => (wanted, *count),
        _ => return Ok(()),
    };
    let Outcome::Acquired(acquired) = step.outcome else {
        return Err("a union answered no locks".to_owned());
    };
    let me = step.me();
    let (before, after) = (holdings_of(step.before, me), holdings_of(step.after, me));
    for (lock, mode) in &before {
        ensure!(
            after.get(lock) >= Some(mode),
            "lowered {lock} from {mode} to {:?}",
            after.get(lock)
        );
    }
    for lock in acquired {
        let asked: Vec<Mode> = wanted
            .iter()
            .filter(|(wanted, _)| wanted == lock)
            .map(|(_, mode)| *mode)
            .collect();
        let now = after.get(lock).copied();
        ensure!(
            now.is_some_and(|mode| asked.contains(&mode)),
            "returned {lock}, now held {now:?}, asked {asked:?}"
        );
        ensure!(
            before.get(lock).copied() < now,
            "returned {lock}, which it held as {:?} already",
            before.get(lock)
        );
    }
    for (lock, mode) in &after {
        ensure!(
            before.get(lock) == Some(mode) || acquired.contains(lock),
            "{lock} changed to {mode} but is not returned"
        );
    }
    // What waits stays as it was. Where it is filed may change: the union's
    // updates revisit the requests filed under the owner, and one whose
    // blockers gained a smaller owner since it was filed is re-filed there.
    let waiting = |saved: &SavedState| -> Vec<(Priority, Owner, Vec<Entry>)> {
        saved
            .pending
            .iter()
            .map(|pending| {
                (
                    pending.priority,
                    pending.owner.clone(),
                    pending.request.clone(),
                )
            })
            .collect()
    };
    ensure!(
        waiting(step.before) == waiting(step.after),
        "an opportunistic union changed the pending requests"
    );
    for other in step.owners.iter().filter(|other| *other != me) {
        ensure!(
            holdings_of(step.before, other) == holdings_of(step.after, other),
            "an opportunistic union changed the locks of {other}"
        );
    }
    if acquired.len() < count {
        ensure!(
            acquired.is_empty() && step.before == step.after,
            "the guarded union acquired fewer than {count} but answered {acquired:?} or changed \
             the state"
        );
    }
    Ok(())
}

// ---- The differential test ----

proptest! {
    #![proptest_config(config(DIFFERENTIAL_CASES))]

    /// After every operation the real manager and the reference agree on the
    /// answer and on every listing, and the manager's invariants hold.
    #[test]
    fn the_real_manager_agrees_with_the_reference(ops in ops_strategy()) {
        let owners = owners();
        let mut real = LockManager::new();
        let mut reference = Reference::new();
        for (index, op) in ops.iter().enumerate() {
            let op = resolve(op, &real, &owners);
            let have = apply_real(&mut real, &op, &owners);
            let want = apply_reference(&mut reference, &op, &owners);
            real.check_invariants();
            compare_outcomes(&have, &want)
                .and_then(|()| compare_states(&real, &reference, &owners))
                .map_err(|message| fail(format!("after step {index}, {op:?}: {message}")))?;
        }
    }
}

// ---- Allocation properties ----

proptest! {
    #![proptest_config(config(CASES))]

    #[test]
    fn exclusive_locks_never_overlap(ops in ops_strategy()) {
        drive(&ops, |step| check_exclusive_locks_never_overlap(step.real, step.owners))?;
    }

    #[test]
    fn listings_agree_with_each_other_and_with_holdings(ops in ops_strategy()) {
        drive(&ops, |step| check_listings_agree(step.real, step.owners))?;
    }

    #[test]
    fn an_update_by_one_owner_never_changes_another_owners_locks(ops in ops_strategy()) {
        drive(&ops, check_update_by_another_never_changes_my_locks)?;
    }

    #[test]
    fn an_update_is_all_or_nothing(ops in ops_strategy()) {
        drive(&ops, check_update_is_all_or_nothing)?;
    }

    /// Every pure release in the sequences succeeds; and at the end, each
    /// owner without a pending request releases some of its locks and some
    /// it does not hold, through both update calls.
    #[test]
    fn a_pure_release_always_succeeds(
        ops in ops_strategy(),
        picks in prop::collection::vec(any::<bool>(), 9),
        unheld in prop::collection::vec(lock_strategy(), 0..=2),
    ) {
        let real = drive(&ops, check_pure_release_always_succeeds)?;
        for owner in &owners() {
            if real.has_pending_request(owner) {
                continue;
            }
            let mut request: Vec<Entry> = real
                .list_locks(owner)
                .into_iter()
                .zip(picks.iter())
                .filter(|(_, pick)| **pick)
                .map(|((lock, _), _)| Entry::release(lock))
                .collect();
            request.extend(unheld.iter().map(|lock| Entry::release(lock.clone())));
            for waiting in [false, true] {
                let mut probe = copy(&real);
                let answer = if waiting {
                    probe.update_waiting(owner, 0, &request)
                } else {
                    probe.try_update(owner, &request)
                };
                probe.check_invariants();
                prop_assert!(
                    matches!(&answer, Ok(update) if update.blockers.is_empty()),
                    "releasing {} by {} answered {:?}", show(&request), owner, answer
                );
                let held = held_map(&probe, owner);
                prop_assert!(request.iter().all(|entry| !held.contains_key(&entry.lock)));
            }
        }
    }

    #[test]
    fn reported_blockers_are_sufficient_and_necessary(ops in ops_strategy()) {
        drive(&ops, check_blockers_sufficient_and_necessary)?;
    }

    #[test]
    fn nobody_else_holds_a_group_exclusively_while_i_hold_a_member(ops in ops_strategy()) {
        drive(&ops, |step| {
            check_no_group_held_exclusively_by_another_while_i_hold_a_member(step.real, step.owners)
        })?;
    }

    #[test]
    fn nobody_else_holds_a_group_at_all_while_i_hold_a_member_exclusively(ops in ops_strategy()) {
        drive(&ops, |step| {
            check_no_group_held_by_another_while_i_hold_a_member_exclusively(step.real, step.owners)
        })?;
    }

    /// Freeing every owner the listings show (holders and waiters), in any
    /// order, leaves no lock, no waiter and no owner.
    #[test]
    fn freeing_every_listed_owner_empties_the_table(
        ops in ops_strategy(),
        order in Just((0..5).collect::<Vec<usize>>()).prop_shuffle(),
    ) {
        let owners = owners();
        let mut real = drive(&ops, |_| Ok(()))?;
        let mut listed: BTreeSet<Owner> = BTreeSet::new();
        for (_, holders) in all_locks_owners(&real) {
            listed.extend(holders.into_iter().map(|(owner, _)| owner));
        }
        listed.extend(pending_by_value(real.list_pending()).into_iter().map(|(_, owner, _)| owner));
        let all: BTreeSet<Owner> = owned(&real.owners()).into_iter().collect();
        prop_assert_eq!(&listed, &all);
        for index in order {
            if listed.contains(&owners[index]) {
                real.free_locks(&owners[index]);
                real.check_invariants();
            }
        }
        prop_assert!(real.list_all_locks().is_empty());
        prop_assert!(real.list_all_locks_owners().is_empty());
        prop_assert!(real.list_pending().is_empty());
        prop_assert!(real.owners().is_empty());
        prop_assert_eq!(real.saved(), SavedState::default());
    }

    /// The saved form restores to a state with identical listings that
    /// answers a following random sequence exactly as the original does
    /// (and as the reference rebuilt from the same saved form does).
    #[test]
    fn save_and_restore_gives_a_state_that_behaves_identically(
        ops in ops_strategy(),
        more in ops_strategy(),
    ) {
        let owners = owners();
        let mut real = drive(&ops, |_| Ok(()))?;
        let saved = real.saved();
        let mut restored = LockManager::restore(&saved)
            .map_err(|error| fail(format!("the saved form does not restore: {error}")))?;
        restored.check_invariants();
        compare_managers(&real, &restored, &owners).map_err(fail)?;
        let mut reference = Reference::from_saved(&saved);
        compare_states(&restored, &reference, &owners).map_err(fail)?;
        for (index, op) in more.iter().enumerate() {
            let op = resolve(op, &real, &owners);
            let original = apply_real(&mut real, &op, &owners);
            let again = apply_real(&mut restored, &op, &owners);
            let modelled = apply_reference(&mut reference, &op, &owners);
            real.check_invariants();
            restored.check_invariants();
            let at = |message: String| fail(format!("after step {index} of the restored run, {op:?}: {message}"));
            prop_assert_eq!(&original, &again, "step {} {:?}", index, op);
            compare_managers(&real, &restored, &owners).map_err(at)?;
            compare_outcomes(&again, &modelled).map_err(at)?;
            compare_states(&restored, &reference, &owners).map_err(at)?;
        }
    }
}

// ---- Waiting properties ----

proptest! {
    #![proptest_config(config(CASES))]

    /// Checked at every step, and at the end for every waiting owner with
    /// random requests.
    #[test]
    fn an_owner_with_a_pending_request_cannot_update(
        ops in ops_strategy(),
        requests in prop::collection::vec(request_strategy(), 1..=3),
        wanted in wanted_strategy(),
    ) {
        let real = drive(&ops, check_pending_owner_cannot_update)?;
        for waiting in real.list_pending() {
            let mut candidates = requests.clone();
            candidates.push(waiting.request.clone());
            for request in &candidates {
                let mut probe = copy(&real);
                let answer = probe.try_update(&waiting.owner, request).map(answer_of);
                prop_assert_eq!(answer, Err(LockError::PendingRequest));
                let answer = probe.update_waiting(&waiting.owner, 0, request).map(answer_of);
                if *request == waiting.request {
                    prop_assert!(matches!(&answer, Ok(a) if !a.blockers.is_empty()), "{:?}", answer);
                } else {
                    prop_assert_eq!(answer, Err(LockError::PendingRequest));
                }
                prop_assert!(probe.opportunistic_union(&waiting.owner, &wanted).is_empty());
                prop_assert!(probe.guarded_opportunistic_union(0, &waiting.owner, &wanted).is_empty());
                prop_assert_eq!(probe.saved(), real.saved());
            }
        }
    }

    #[test]
    fn a_blocked_waiting_request_makes_its_owner_pending(ops in ops_strategy()) {
        drive(&ops, check_blocked_waiting_request_makes_owner_pending)?;
    }

    #[test]
    fn notified_owners_hold_what_they_asked_for(ops in ops_strategy()) {
        drive(&ops, check_notified_owners_hold_what_they_asked_for)?;
    }

    #[test]
    fn every_pending_request_is_blocked_right_now(ops in ops_strategy()) {
        drive(&ops, |step| check_every_pending_request_is_blocked(step.real))?;
    }

    #[test]
    fn repeating_an_update_changes_nothing_and_notifies_nobody(ops in ops_strategy()) {
        drive(&ops, check_repeating_changes_nothing)?;
    }

    #[test]
    fn opportunistic_union_never_lowers_a_lock_and_returns_what_it_holds(ops in ops_strategy()) {
        drive(&ops, check_opportunistic_union)?;
    }
}

/// Applies `ops` to the real manager and the reference, comparing after
/// every step; answers the reference's outcomes.
fn run_both(ops: &[Op]) -> Vec<Outcome> {
    let owners = owners();
    let mut real = LockManager::new();
    let mut reference = Reference::new();
    let mut outcomes = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        let have = apply_real(&mut real, op, &owners);
        let want = apply_reference(&mut reference, op, &owners);
        real.check_invariants();
        if let Err(message) =
            compare_outcomes(&have, &want).and_then(|()| compare_states(&real, &reference, &owners))
        {
            panic!("after step {index}, {op:?}: {message}");
        }
        outcomes.push(want);
    }
    outcomes
}

/// Ganeti revisits depth first: a granted waiter's own filed requests are
/// retried before the next request of the outer pass. o1 blocks o3 (which
/// hands instance/a off when granted) and o4; o2 waits for instance/a
/// behind o3. Freeing o1 retries o3, then o4: depth first grants o2 in
/// between (breadth first would grant o4 before o2; owner order would
/// notify o2 first), and in the second variant o2's grant then blocks o4,
/// which breadth first would grant.
#[test]
fn a_cascade_of_grants_is_depth_first_as_in_ganeti() {
    let x = |text: &str| Entry::exclusive(lock(text));
    let s = |text: &str| Entry::shared(lock(text));
    let r = |text: &str| Entry::release(lock(text));
    let (holder, reader, hand_off, late) = (1, 2, 3, 4);
    let owners = owners();
    let setup = |late_request: Vec<Entry>| {
        vec![
            Op::TryUpdate {
                owner: holder,
                request: vec![x("node/n1"), x("node/n2")],
            },
            Op::TryUpdate {
                owner: hand_off,
                request: vec![x("instance/a")],
            },
            Op::UpdateWaiting {
                owner: hand_off,
                priority: 0,
                request: vec![x("node/n1"), r("instance/a")],
            },
            Op::UpdateWaiting {
                owner: reader,
                priority: 0,
                request: vec![s("instance/a")],
            },
            Op::UpdateWaiting {
                owner: late,
                priority: 1,
                request: late_request,
            },
            Op::FreeLocks { owner: holder },
        ]
    };
    let outcomes = run_both(&setup(vec![s("node/n2")]));
    let want = vec![
        owners[hand_off].clone(),
        owners[reader].clone(),
        owners[late].clone(),
    ];
    assert_eq!(outcomes.last(), Some(&Outcome::Notify(want)));
    let outcomes = run_both(&setup(vec![x("instance/a"), s("node/n2")]));
    let want = vec![owners[hand_off].clone(), owners[reader].clone()];
    assert_eq!(outcomes.last(), Some(&Outcome::Notify(want)));
}

// ---- Waiting progress, from a blocked waiting request ----

/// Input of Ganeti's `forAllBlocked`: a state (from `ops`), and candidates
/// for an owner and a waiting request that is blocked in it.
#[derive(Clone, Debug)]
struct Situation {
    ops: Vec<Op>,
    owner: usize,
    priority: Priority,
    requests: Vec<Vec<Entry>>,
}

fn situation_strategy() -> impl Strategy<Value = Situation> {
    (
        ops_strategy(),
        0..owners().len(),
        priority_strategy(),
        prop::collection::vec(request_strategy(), 1..=8),
    )
        .prop_map(|(ops, owner, priority, requests)| Situation {
            ops,
            owner,
            priority,
            requests,
        })
}

/// A waiting request just found blocked.
struct Blocked {
    /// The state before the request.
    before: SavedState,
    /// The state with the request pending.
    state: LockManager,
    owner: Owner,
    request: Vec<Entry>,
    blockers: Vec<Owner>,
}

/// The first owner (from `situation.owner` on) without a pending request
/// with a candidate request that `update_waiting` answers with blockers.
fn find_blocked(situation: &Situation) -> Result<Option<Blocked>, TestCaseError> {
    let owners = owners();
    let real = drive(&situation.ops, |_| Ok(()))?;
    for offset in 0..owners.len() {
        let owner = &owners[(situation.owner + offset) % owners.len()];
        if real.has_pending_request(owner) {
            continue;
        }
        for request in &situation.requests {
            let mut state = copy(&real);
            let answer = state.update_waiting(owner, situation.priority, request);
            if let Ok(update) = answer
                && !update.blockers.is_empty()
            {
                state.check_invariants();
                prop_assert!(state.has_pending_request(owner));
                return Ok(Some(Blocked {
                    before: real.saved(),
                    state,
                    owner: owner.clone(),
                    request: request.clone(),
                    blockers: owned(&update.blockers),
                }));
            }
        }
    }
    Ok(None)
}

/// Runs `check` on the blocked situations of `CASES` random cases, and
/// fails if too few cases had one.
fn for_all_blocked(check: impl Fn(&Blocked) -> Result<(), String>) {
    let mut runner = seeded_runner(config(CASES));
    let found = std::cell::Cell::new(0usize);
    let result = runner.run(&situation_strategy(), |situation| {
        if let Some(blocked) = find_blocked(&situation)? {
            found.set(found.get() + 1);
            check(&blocked).map_err(fail)?;
        }
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    assert!(
        found.get() * 100 >= CASES as usize * SCENARIO_FOUND_PERCENT_MIN,
        "only {} of {CASES} cases found a blocked waiting request",
        found.get()
    );
}

/// Frees `owners` one after the other; answers everyone notified.
fn free_all(real: &mut LockManager, owners: &BTreeSet<Owner>) -> BTreeSet<Owner> {
    let mut notified = BTreeSet::new();
    for owner in owners {
        notified.extend(owned(&real.free_locks(owner)));
        real.check_invariants();
    }
    notified
}

/// Once all its blockers and all earlier waiters release everything, a
/// blocked waiting request is granted and its owner notified.
#[test]
fn a_waiting_request_is_granted_and_notified_once_blockers_and_earlier_waiters_release() {
    for_all_blocked(|blocked| {
        let mut state = copy(&blocked.state);
        let mut releasing: BTreeSet<Owner> = blocked.blockers.iter().cloned().collect();
        releasing.extend(blocked.before.pending.iter().map(|p| p.owner.clone()));
        let notified = free_all(&mut state, &releasing);
        let me = &blocked.owner;
        ensure!(
            !state.has_pending_request(me),
            "{me} still waits for {} after {releasing:?} released",
            show(&blocked.request)
        );
        let held = held_map(&state, me);
        ensure!(
            satisfies(&held, &blocked.request),
            "{me} holds {held:?}, having asked for {}",
            show(&blocked.request)
        );
        ensure!(
            notified.contains(me),
            "{me} was granted but not notified ({notified:?})"
        );
        Ok(())
    });
}

/// When the blockers of a waiting request release everything, someone
/// other than them is notified.
#[test]
fn releasing_the_blockers_makes_progress() {
    for_all_blocked(|blocked| {
        let mut state = copy(&blocked.state);
        let blockers: BTreeSet<Owner> = blocked.blockers.iter().cloned().collect();
        let notified = free_all(&mut state, &blockers);
        ensure!(
            notified.difference(&blockers).next().is_some(),
            "the blockers {blockers:?} released, but only {notified:?} were notified"
        );
        Ok(())
    });
}

/// Ganeti's `prop_ProgressSound`: those notified while the blockers
/// release (other than the blockers) hold what they asked for at the end.
#[test]
fn owners_notified_while_blockers_release_hold_what_they_asked_for() {
    for_all_blocked(|blocked| {
        let mut state = copy(&blocked.state);
        let asked = blocked.state.saved().pending;
        let blockers: BTreeSet<Owner> = blocked.blockers.iter().cloned().collect();
        let notified = free_all(&mut state, &blockers);
        for owner in notified.difference(&blockers) {
            let Some(waiting) = asked.iter().find(|p| p.owner == *owner) else {
                return Err(format!("{owner} is notified but was not waiting"));
            };
            let held = held_map(&state, owner);
            ensure!(
                satisfies(&held, &waiting.request),
                "{owner} is notified but holds {held:?}, having asked for {}",
                show(&waiting.request)
            );
        }
        Ok(())
    });
}
