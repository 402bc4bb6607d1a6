//! Property tests of the lock extensions (DECISIONS D65 to D69): random
//! sequences of every operation (those of [`crate::lock_properties`], plus
//! deaths, upgrades of shared locks, requests for locks others hold or
//! wait for, restarts and policy changes) through [`LockManager::apply`],
//! over the same five owners and nine locks, under each policy. The
//! upgrades and the requests for used locks are there to make the
//! conversions that close cycles and the requests fifo queues behind
//! waiters common; each test fails if its run met what it is about too
//! seldom ([`Reach`]).
//!
//! The manager is checked against naive models written from the decisions,
//! not from `src/`:
//! - [`Model`]: one token counter, a token per holding, and a plain list of
//!   the deaths not told yet. Each step it finds the grants from the
//!   holdings before and after (a lock newly held, or raised to exclusive)
//!   and the grant order (the updater, then those notified), draws one
//!   token per grant, and tells each grant the deaths it covers.
//! - The waits-for graph ([`waits_for`]): each waiting owner points at the
//!   owners holding something its request conflicts with (scanned by
//!   [`Reference::conflicts`]) and, in fifo mode for an owner holding
//!   nothing, at the waiters ahead of it whose requests conflict with its
//!   own, in the order the waiters arrived ([`Model::arrivals`]).
//!
//! Each test runs a fixed seed of its own (`WARDEN_PROPTEST_RANDOM=1`
//! explores fresh cases). Failure output names owners as
//! [`crate::lock_properties`] does (`o0` .. `o4`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestCaseError, TestRng, TestRunner};

use warden::locks::{
    Action, Deadlocks, Entry, Fairness, LockError, LockManager, LockName, LockOp, LockPolicy, Mode,
    OpOutcome, Owner, Priority, SavedExtensions, SavedState, Token, WhatIf,
};
use warden::store::lock_state::LockStore;

use crate::harness::{
    LADDER, Op, Outcome, UNUSED_LEVEL, answer_of, apply_reference, compare_outcomes,
    compare_states, ensure, owned, resolve,
};
use crate::lock_properties::{
    SEQUENCE_OPS_MAX, config, op_strategy, owners, priority_strategy, queue_op_strategy,
    request_strategy,
};
use crate::reference::{Reference, blocks};

const CASES: u32 = 256;
/// Each case of the store test writes a journal file of a megabyte and
/// syncs it, twice or more.
const STORE_CASES: u32 = 64;
/// The fifo progress tests must find a blocked waiting request in at
/// least this share of their cases.
const FOUND_PERCENT_MIN: usize = 50;

/// A death not told yet: the lock, the dead owner, its token.
type Mark = (LockName, Owner, Token);

// ---- Steps ----

#[derive(Clone)]
enum Step {
    Op(Op),
    /// The death of an owner that holds or waits (the one at `pick`, modulo
    /// their number; with none, owner `pick`).
    Die {
        pick: usize,
    },
    /// An owner that holds its highest lock shared and does not wait (the
    /// one at `pick`, modulo their number) waits to hold it exclusively:
    /// with others sharing it (or holding members of it, a group), the
    /// conversions that close cycles.
    Upgrade {
        pick: usize,
        priority: Priority,
    },
    /// An owner holding nothing waits, in `mode`, for a lock others use:
    /// the one at `pick` (modulo their number) of the first locks waiters
    /// ask for, the highest locks of holders and the groups of both; with
    /// none, a lock of the ladder. One holding locks frees them (its next
    /// `Join` asks). The requests fifo queues behind waiters, and the
    /// sharers whose upgrades close cycles.
    Join {
        owner: usize,
        priority: Priority,
        pick: usize,
        mode: Mode,
    },
    /// The manager rebuilt from its saved forms.
    Restart,
    Policy(LockPolicy),
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Op(op) => op.fmt(f),
            Step::Die { pick } => write!(f, "die({pick})"),
            Step::Upgrade { pick, priority } => write!(f, "upgrade({pick}, prio {priority})"),
            Step::Join {
                owner,
                priority,
                pick,
                mode,
            } => write!(f, "join(o{owner}, prio {priority}, waiter {pick}, {mode})"),
            Step::Restart => f.write_str("restart"),
            Step::Policy(policy) => write!(f, "policy({})", show_policy(*policy)),
        }
    }
}

fn show_policy(policy: LockPolicy) -> String {
    format!(
        "{}, deadlocks {}",
        policy.fairness.as_str(),
        policy.deadlocks.as_str()
    )
}

fn policy_strategy() -> impl Strategy<Value = LockPolicy> {
    let fairness = prop_oneof![Just(Fairness::Ganeti), Just(Fairness::Fifo)];
    let deadlocks = prop_oneof![Just(Deadlocks::Wait), Just(Deadlocks::Refuse)];
    (fairness, deadlocks).prop_map(|(fairness, deadlocks)| LockPolicy {
        fairness,
        deadlocks,
    })
}

/// What a sequence may hold besides operations and deaths.
#[derive(Clone, Copy)]
enum Extras {
    None,
    Restarts,
    RestartsAndPolicies,
}

fn step_strategy(base: BoxedStrategy<Op>, extras: Extras) -> BoxedStrategy<Step> {
    let owner = || 0..owners().len();
    let upgrade = (0usize..8, priority_strategy())
        .prop_map(|(pick, priority)| Step::Upgrade { pick, priority });
    let mode = prop_oneof![Just(Mode::Shared), Just(Mode::Exclusive)];
    let join = (owner(), priority_strategy(), 0usize..16, mode).prop_map(
        |(owner, priority, pick, mode)| Step::Join {
            owner,
            priority,
            pick,
            mode,
        },
    );
    let mut options: Vec<(u32, BoxedStrategy<Step>)> = vec![
        (10, base.prop_map(Step::Op).boxed()),
        (3, (0usize..8).prop_map(|pick| Step::Die { pick }).boxed()),
        (5, upgrade.boxed()),
        (6, join.boxed()),
    ];
    if let Extras::Restarts | Extras::RestartsAndPolicies = extras {
        options.push((1, Just(Step::Restart).boxed()));
    }
    if let Extras::RestartsAndPolicies = extras {
        options.push((1, policy_strategy().prop_map(Step::Policy).boxed()));
    }
    prop::strategy::Union::new_weighted(options).boxed()
}

/// Sequences of every operation, or queue-building ones (as the Ganeti
/// properties have them), with deaths among them.
fn steps_strategy(extras: Extras) -> impl Strategy<Value = Vec<Step>> {
    let any = step_strategy(op_strategy().boxed(), extras);
    let queues = step_strategy(queue_op_strategy().boxed(), extras);
    prop_oneof![
        prop::collection::vec(any, 0..=SEQUENCE_OPS_MAX),
        prop::collection::vec(queues, 0..=SEQUENCE_OPS_MAX),
    ]
}

fn fifo_strategy() -> impl Strategy<Value = LockPolicy> {
    prop_oneof![Just(Deadlocks::Wait), Just(Deadlocks::Refuse)].prop_map(|deadlocks| LockPolicy {
        fairness: Fairness::Fifo,
        deadlocks,
    })
}

fn refuse_strategy() -> impl Strategy<Value = LockPolicy> {
    prop_oneof![Just(Fairness::Ganeti), Just(Fairness::Fifo)].prop_map(|fairness| LockPolicy {
        fairness,
        deadlocks: Deadlocks::Refuse,
    })
}

/// A runner with a fixed seed per test, so that a run is repeatable.
fn runner(cases: u32, seed: u8) -> TestRunner {
    if std::env::var_os("WARDEN_PROPTEST_RANDOM").is_some() {
        return TestRunner::new(config(cases));
    }
    TestRunner::new_with_rng(
        config(cases),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    )
}

/// Runs `test` on `cases` values of `strategy`; panics with the shrunk
/// failing case.
fn check_all<S: Strategy>(
    cases: u32,
    seed: u8,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: fmt::Debug,
{
    if let Err(error) = runner(cases, seed).run(&strategy, test) {
        panic!("{error}");
    }
}

/// How often a run met a situation its property is about; a run that met
/// it too seldom fails, since it tested too little.
struct Reach {
    what: &'static str,
    min: usize,
    count: std::cell::Cell<usize>,
}

impl Reach {
    fn new(what: &'static str, min: usize) -> Reach {
        Reach {
            what,
            min,
            count: std::cell::Cell::new(0),
        }
    }

    fn add(&self, met: bool) {
        if met {
            self.count.set(self.count.get() + 1);
        }
    }

    fn check(&self) {
        let count = self.count.get();
        eprintln!("{}: {count}", self.what);
        assert!(
            count >= self.min,
            "only {count} {} (at least {} wanted)",
            self.what,
            self.min
        );
    }
}

// ---- Resolving and applying a step ----

enum Act {
    Lock(LockOp),
    Restart,
}

fn name_of(owner: &Owner, owners: &[Owner]) -> String {
    owners
        .iter()
        .position(|known| known == owner)
        .map_or_else(|| owner.to_string(), |index| format!("o{index}"))
}

fn lock_op(op: &Op, owners: &[Owner]) -> LockOp {
    let owner = owners[op.owner()].clone();
    match op {
        Op::TryUpdate { request, .. } => LockOp::TryUpdate {
            owner,
            request: request.clone(),
        },
        Op::UpdateWaiting {
            priority, request, ..
        } => LockOp::UpdateWaiting {
            owner,
            priority: *priority,
            request: request.clone(),
        },
        Op::FreeLocks { .. } => LockOp::FreeLocks { owner },
        Op::FreeLocksLevel { level, .. } => LockOp::FreeLocksLevel {
            owner,
            level: *level,
        },
        Op::Downgrade { level, .. } => LockOp::DowngradeLocksLevel {
            owner,
            level: *level,
        },
        Op::Intersect { keep, .. } => LockOp::IntersectLocks {
            owner,
            keep: keep.clone(),
        },
        Op::Union { wanted, .. } => LockOp::OpportunisticUnion {
            owner,
            wanted: wanted.clone(),
        },
        Op::Guarded { count, wanted, .. } => LockOp::GuardedOpportunisticUnion {
            count: *count,
            owner,
            wanted: wanted.clone(),
        },
        Op::Resend { .. } | Op::FreeBlocker { .. } | Op::Climb { .. } => {
            unreachable!("operations are resolved before they are applied")
        }
    }
}

/// The step as it applies to `real` now, and how to show it.
fn resolve_step(step: &Step, real: &LockManager, owners: &[Owner]) -> (Act, String) {
    match step {
        Step::Op(op) => {
            let op = resolve(op, real, owners);
            (Act::Lock(lock_op(&op, owners)), format!("{op:?}"))
        }
        Step::Die { pick } => {
            let involved = owned(&real.owners());
            let owner = match involved.get(pick % involved.len().max(1)) {
                Some(owner) => owner.clone(),
                None => owners[pick % owners.len()].clone(),
            };
            let label = format!("die({})", name_of(&owner, owners));
            (Act::Lock(LockOp::FreeDead { owner }), label)
        }
        Step::Upgrade { pick, priority } => {
            let sharers: Vec<(usize, LockName)> = owners
                .iter()
                .enumerate()
                .filter(|(_, owner)| !real.has_pending_request(owner))
                .filter_map(|(index, owner)| match real.list_locks(owner).pop() {
                    Some((lock, Mode::Shared)) => Some((index, lock)),
                    _ => None,
                })
                .collect();
            let op = match sharers.get(pick % sharers.len().max(1)) {
                Some((owner, lock)) => Op::UpdateWaiting {
                    owner: *owner,
                    priority: *priority,
                    request: vec![Entry::exclusive(lock.clone())],
                },
                None => Op::FreeLocks {
                    owner: pick % owners.len(),
                },
            };
            (Act::Lock(lock_op(&op, owners)), format!("{op:?}"))
        }
        Step::Join {
            owner,
            priority,
            pick,
            mode,
        } => {
            let me = &owners[*owner];
            let mut used: Vec<LockName> = real
                .list_pending()
                .iter()
                .filter_map(|waiter| {
                    acquires(&waiter.request)
                        .next()
                        .map(|(lock, _)| lock.clone())
                })
                .collect();
            used.extend(
                owners
                    .iter()
                    .filter_map(|holder| real.list_locks(holder).pop().map(|(lock, _)| lock)),
            );
            let groups: Vec<LockName> = used.iter().filter_map(LockName::group).collect();
            used.extend(groups);
            let op = if let Some(mine) = real.pending_of(me) {
                Op::UpdateWaiting {
                    owner: *owner,
                    priority: *priority,
                    request: mine.request,
                }
            } else if !real.list_locks(me).is_empty() {
                Op::FreeLocks { owner: *owner }
            } else {
                let wanted = used
                    .get(pick % used.len().max(1))
                    .cloned()
                    .unwrap_or_else(|| crate::harness::lock(LADDER[pick % LADDER.len()]));
                Op::UpdateWaiting {
                    owner: *owner,
                    priority: *priority,
                    request: vec![Entry::new(wanted, Action::Acquire(*mode))],
                }
            };
            (Act::Lock(lock_op(&op, owners)), format!("{op:?}"))
        }
        Step::Restart => (Act::Restart, "restart".to_owned()),
        Step::Policy(policy) => (
            Act::Lock(LockOp::SetPolicy { policy: *policy }),
            format!("policy({})", show_policy(*policy)),
        ),
    }
}

/// The answer of an operation in the terms of the harness.
fn outcome_of(outcome: &OpOutcome) -> Outcome {
    match outcome {
        OpOutcome::Update(result) => Outcome::Update(result.clone().map(answer_of)),
        OpOutcome::Freed(notify) => Outcome::Notify(owned(notify)),
        OpOutcome::Acquired(locks) => Outcome::Acquired(locks.clone()),
    }
}

/// A copy through both saved forms.
fn copy(real: &LockManager) -> LockManager {
    LockManager::restore_with(&real.saved(), &real.saved_extensions())
        .expect("a saved state restores")
}

// ---- Naive views of a saved state ----

fn held(saved: &SavedState, owner: &Owner) -> BTreeMap<LockName, Mode> {
    saved
        .holdings
        .iter()
        .find(|(holder, _)| holder == owner)
        .map(|(_, locks)| locks.iter().cloned().collect())
        .unwrap_or_default()
}

fn pending<'s>(saved: &'s SavedState, owner: &Owner) -> Option<&'s warden::locks::SavedPending> {
    saved.pending.iter().find(|waiter| waiter.owner == *owner)
}

fn acquires(request: &[Entry]) -> impl Iterator<Item = (&LockName, Mode)> {
    request.iter().filter_map(|entry| match entry.action {
        Action::Acquire(mode) => Some((&entry.lock, mode)),
        Action::Release => None,
    })
}

/// Two requests conflict as if one held what it asks for.
fn conflict(a: &[Entry], b: &[Entry]) -> bool {
    acquires(a).any(|(held, held_mode)| {
        acquires(b).any(|(lock, mode)| blocks(held, held_mode, lock, mode))
    })
}

/// A waiter's place in fifo's order: priority, then arrival (a request
/// not waiting yet comes after every waiter of its priority).
type Place = (Priority, usize);

fn place(model: &Model, owner: &Owner, priority: Priority) -> Place {
    let arrival = model
        .arrivals
        .iter()
        .position(|waiter| waiter == owner)
        .unwrap_or(usize::MAX);
    (priority, arrival)
}

/// The owners blocking `request` of `owner` at `at`, found naively: the
/// holders of anything in its way and, in fifo mode for an owner holding
/// nothing, the waiters ahead of it that want something in its way.
fn naive_blockers(
    saved: &SavedState,
    model: &Model,
    policy: LockPolicy,
    owner: &Owner,
    at: Place,
    request: &[Entry],
) -> BTreeSet<Owner> {
    let mut found = Reference::from_saved(saved).conflicts(owner, request);
    if policy.fairness == Fairness::Fifo && held(saved, owner).is_empty() {
        for waiter in &saved.pending {
            if waiter.owner != *owner
                && place(model, &waiter.owner, waiter.priority) < at
                && conflict(&waiter.request, request)
            {
                found.insert(waiter.owner.clone());
            }
        }
    }
    found
}

/// Whether an update was answered with a blocker that is a waiter holding
/// nothing in its way (fifo's queueing).
fn queued_behind_a_waiter(moment: &Moment<'_>) -> bool {
    let (Some(op), Some(OpOutcome::Update(Ok(update)))) = (moment.op, moment.outcome) else {
        return false;
    };
    let (LockOp::TryUpdate { owner, request } | LockOp::UpdateWaiting { owner, request, .. }) = op
    else {
        return false;
    };
    let holders = Reference::from_saved(moment.before).conflicts(owner, request);
    update
        .blockers
        .iter()
        .any(|blocker| !holders.contains(&**blocker))
}

/// The waits-for graph: every waiting owner with its blockers.
fn waits_for(
    saved: &SavedState,
    model: &Model,
    policy: LockPolicy,
) -> BTreeMap<Owner, BTreeSet<Owner>> {
    saved
        .pending
        .iter()
        .map(|waiter| {
            let at = place(model, &waiter.owner, waiter.priority);
            let blockers = naive_blockers(saved, model, policy, &waiter.owner, at, &waiter.request);
            (waiter.owner.clone(), blockers)
        })
        .collect()
}

/// Whether `to` can be reached from `from` along waits.
fn reaches(graph: &BTreeMap<Owner, BTreeSet<Owner>>, from: &Owner, to: &Owner) -> bool {
    let mut seen: BTreeSet<&Owner> = BTreeSet::new();
    let mut queue: VecDeque<&Owner> = VecDeque::from([from]);
    while let Some(next) = queue.pop_front() {
        if next == to {
            return true;
        }
        if !seen.insert(next) {
            continue;
        }
        queue.extend(graph.get(next).into_iter().flatten());
    }
    false
}

/// The owners on or leading to a cycle of waits (empty: no cycle): what is
/// left after taking away, again and again, every owner that waits only
/// for owners not in the graph.
fn cyclic(graph: &BTreeMap<Owner, BTreeSet<Owner>>) -> BTreeSet<Owner> {
    let mut left: BTreeSet<Owner> = graph.keys().cloned().collect();
    loop {
        let free: Vec<Owner> = left
            .iter()
            .filter(|owner| graph[*owner].iter().all(|blocker| !left.contains(blocker)))
            .cloned()
            .collect();
        if free.is_empty() {
            return left;
        }
        for owner in free {
            left.remove(&owner);
        }
    }
}

// ---- The naive model of tokens, deaths and arrivals ----

#[derive(Clone, Debug, Default)]
struct Model {
    last_token: Token,
    tokens: BTreeMap<(Owner, LockName), Token>,
    /// Deaths not told yet, in the order they happened.
    marks: Vec<Mark>,
    /// The waiting owners in the order they started waiting (the order
    /// fifo mode grants in, within a priority).
    arrivals: Vec<Owner>,
}

/// One grant of a step, as the model sees it.
#[derive(Clone, Debug)]
struct Granted {
    owner: Owner,
    token: Token,
    /// The locks it raised, in the mode they are held now.
    raised: Vec<(LockName, Mode)>,
    /// The deaths it covers.
    told: BTreeSet<Mark>,
}

impl Granted {
    fn entries(&self) -> Vec<Entry> {
        self.raised
            .iter()
            .map(|(lock, mode)| Entry::new(lock.clone(), Action::Acquire(*mode)))
            .collect()
    }
}

/// The locks `owner` holds after a step in a stronger mode than before.
fn raised(before: &SavedState, after: &SavedState, owner: &Owner) -> Vec<(LockName, Mode)> {
    let was = held(before, owner);
    held(after, owner)
        .into_iter()
        .filter(|(lock, mode)| was.get(lock).copied() < Some(*mode))
        .collect()
}

impl Model {
    /// Follows one operation from `before` to `after`; `notified` are the
    /// owners it granted, in grant order. Answers its grants, in order.
    fn step(
        &mut self,
        op: &LockOp,
        old_policy: LockPolicy,
        before: &SavedState,
        after: &SavedState,
        notified: &[Owner],
    ) -> Result<Vec<Granted>, String> {
        if let LockOp::FreeDead { owner } = op {
            for lock in held(before, owner).keys() {
                let token = self.tokens[&(owner.clone(), lock.clone())];
                self.marks.push((lock.clone(), owner.clone(), token));
            }
            ensure!(
                self.marks.len() <= warden::limits::DEATH_MARKS_MAX,
                "the test reached the mark bound"
            );
        }
        self.tokens
            .retain(|(owner, lock), _| held(after, owner).contains_key(lock));
        let mut grantees: Vec<Owner> = Vec::new();
        if let Some(owner) = op.owner()
            && !raised(before, after, owner).is_empty()
        {
            grantees.push(owner.clone());
        }
        for owner in notified {
            ensure!(
                !grantees.contains(owner),
                "{owner} is granted twice in one step"
            );
            grantees.push(owner.clone());
        }
        for (owner, _) in &after.holdings {
            ensure!(
                grantees.contains(owner) || raised(before, after, owner).is_empty(),
                "{owner} gained locks without a grant"
            );
        }
        let mut granted = Vec::new();
        for owner in grantees {
            let raised = raised(before, after, &owner);
            ensure!(!raised.is_empty(), "{owner} is notified but gained nothing");
            self.last_token += 1;
            let locks: Vec<&LockName> = raised.iter().map(|(lock, _)| lock).collect();
            let consumed = |lock: &LockName| {
                locks.contains(&lock) || lock.group().is_some_and(|g| locks.contains(&&g))
            };
            let told: BTreeSet<Mark> = self
                .marks
                .iter()
                .filter(|(lock, _, _)| {
                    consumed(lock)
                        || locks
                            .iter()
                            .any(|raised| raised.group().as_ref() == Some(lock))
                })
                .cloned()
                .collect();
            self.marks.retain(|(lock, _, _)| !consumed(lock));
            for (lock, _) in &raised {
                self.tokens
                    .insert((owner.clone(), lock.clone()), self.last_token);
            }
            granted.push(Granted {
                owner,
                token: self.last_token,
                raised,
                told,
            });
        }
        if let LockOp::SetPolicy { .. } = op {
            // Every waiter is judged again in its old grant order, which
            // becomes its new arrival order.
            let mut order: Vec<(Priority, usize, Owner)> = before
                .pending
                .iter()
                .map(|waiter| {
                    let (priority, arrival) = place(self, &waiter.owner, waiter.priority);
                    let arrival = match old_policy.fairness {
                        Fairness::Fifo => arrival,
                        Fairness::Ganeti => 0,
                    };
                    (priority, arrival, waiter.owner.clone())
                })
                .collect();
            order.sort();
            self.arrivals = order.into_iter().map(|(_, _, owner)| owner).collect();
        }
        self.arrivals
            .retain(|owner| pending(after, owner).is_some());
        for waiter in &after.pending {
            if !self.arrivals.contains(&waiter.owner) {
                self.arrivals.push(waiter.owner.clone());
            }
        }
        Ok(granted)
    }
}

// ---- Driving a sequence ----

/// One applied step, for the checks.
struct Moment<'a> {
    owners: &'a [Owner],
    /// `None` for a restart.
    op: Option<&'a LockOp>,
    /// The policy before the step.
    policy: LockPolicy,
    before: &'a SavedState,
    before_ext: &'a SavedExtensions,
    before_model: &'a Model,
    outcome: Option<&'a OpOutcome>,
    /// Asked before a waiting update, of the manager as it was.
    what_if: Option<&'a WhatIf>,
    real: &'a LockManager,
    after: &'a SavedState,
    model: &'a Model,
    granted: &'a [Granted],
}

impl Moment<'_> {
    fn name(&self, owner: &Owner) -> String {
        name_of(owner, self.owners)
    }
}

/// Applies `steps` to a fresh manager under `policy`, following them with
/// the model and checking the manager's invariants and `check` after each.
/// Answers the final manager and model.
fn drive(
    policy: LockPolicy,
    steps: &[Step],
    mut check: impl FnMut(&Moment<'_>) -> Result<(), String>,
) -> Result<(LockManager, Model), TestCaseError> {
    let owners = owners();
    let mut real = LockManager::new();
    let mut model = Model::default();
    real.apply(&LockOp::SetPolicy { policy });
    for (index, step) in steps.iter().enumerate() {
        let (act, label) = resolve_step(step, &real, &owners);
        let at = |message: String| {
            TestCaseError::fail(format!("after step {index}, {label}: {message}"))
        };
        let policy = real.policy();
        let before = real.saved();
        let before_ext = real.saved_extensions();
        let before_model = model.clone();
        let (op, outcome, what_if, granted) = match act {
            Act::Restart => {
                real = LockManager::restore_with(&before, &before_ext)
                    .map_err(|error| at(format!("the saved form does not restore: {error}")))?;
                if real.saved() != before || real.saved_extensions() != before_ext {
                    return Err(at("the restored state differs".to_owned()));
                }
                (None, None, None, Vec::new())
            }
            Act::Lock(op) => {
                let what_if = match &op {
                    LockOp::UpdateWaiting {
                        owner,
                        priority,
                        request,
                    } => {
                        let changes = real.changes();
                        let what_if = real.what_if(owner, *priority, request);
                        if real.changes() != changes || real.saved() != before {
                            return Err(at("what_if changed the state".to_owned()));
                        }
                        Some(what_if)
                    }
                    _ => None,
                };
                let outcome = real.apply(&op);
                let after = real.saved();
                let notified = owned(outcome.granted());
                let granted = model
                    .step(&op, policy, &before, &after, &notified)
                    .map_err(|message| at(format!("answered {outcome:?}: {message}")))?;
                (Some(op), Some(outcome), what_if, granted)
            }
        };
        real.check_invariants();
        let after = real.saved();
        let moment = Moment {
            owners: &owners,
            op: op.as_ref(),
            policy,
            before: &before,
            before_ext: &before_ext,
            before_model: &before_model,
            outcome: outcome.as_ref(),
            what_if: what_if.as_ref(),
            real: &real,
            after: &after,
            model: &model,
            granted: &granted,
        };
        check(&moment).map_err(|message| at(format!("answered {outcome:?}: {message}")))?;
    }
    Ok((real, model))
}

// ---- Checks of a step ----

/// Tokens: the counter moved by one per grant; every lock a grant raised
/// holds its token; every holding holds the model's token.
fn check_tokens(moment: &Moment<'_>) -> Result<(), String> {
    let real = moment.real;
    ensure!(
        real.last_token() == moment.model.last_token,
        "the last token is {}, the model counts {} grants",
        real.last_token(),
        moment.model.last_token
    );
    let mut previous = moment.before_model.last_token;
    for granted in moment.granted {
        ensure!(granted.token > previous, "tokens do not increase");
        previous = granted.token;
        for (lock, _) in &granted.raised {
            let token = real.grant(&granted.owner, lock).map(|grant| grant.token);
            ensure!(
                token == Some(granted.token),
                "{} was granted {lock} with token {}, holds it with {token:?}",
                moment.name(&granted.owner),
                granted.token
            );
        }
    }
    for (owner, locks) in &moment.after.holdings {
        for (lock, _) in locks {
            let want = moment.model.tokens.get(&(owner.clone(), lock.clone()));
            let have = real.grant(owner, lock).map(|grant| grant.token);
            ensure!(
                have.as_ref() == want,
                "{} holds {lock} with token {have:?}, the model says {want:?}",
                moment.name(owner)
            );
        }
    }
    Ok(())
}

fn marks_of(extensions: &SavedExtensions) -> Vec<Mark> {
    let mut marks: Vec<Mark> = extensions
        .grants
        .marks
        .iter()
        .map(|death| (death.lock.clone(), death.owner.clone(), death.token))
        .collect();
    marks.sort();
    marks
}

/// Deaths: each grant is told exactly the deaths the model says it covers;
/// the holdings it did not raise keep what they were told; the marks left
/// are the model's.
fn check_deaths(moment: &Moment<'_>) -> Result<(), String> {
    let real = moment.real;
    for granted in moment.granted {
        let mut told: BTreeSet<Mark> = BTreeSet::new();
        for (lock, _) in &granted.raised {
            let grant = real
                .grant(&granted.owner, lock)
                .ok_or_else(|| format!("no grant of {lock}"))?;
            told.extend(
                grant
                    .died
                    .iter()
                    .map(|death| (death.lock.clone(), death.owner.clone(), death.token)),
            );
        }
        ensure!(
            told == granted.told,
            "the grant of {:?} to {} was told {told:?}; it covers {:?}",
            granted.raised,
            moment.name(&granted.owner),
            granted.told
        );
    }
    for (owner, lock, grant) in &moment.before_ext.grants.grants {
        let raised = moment.granted.iter().any(|granted| {
            granted.owner == *owner && granted.raised.iter().any(|(held, _)| held == lock)
        });
        if raised {
            continue;
        }
        if let Some(now) = real.grant(owner, lock) {
            ensure!(
                now == *grant,
                "the grant of {lock} to {} changed from {grant:?} to {now:?} without a grant",
                moment.name(owner)
            );
        }
    }
    let mut want = moment.model.marks.clone();
    want.sort();
    let have = marks_of(&real.saved_extensions());
    ensure!(
        have == want,
        "the marks left are {have:?}, the model's {want:?}"
    );
    Ok(())
}

/// Fifo: no owner holding nothing is granted past a waiter ahead of it
/// whose request conflicts with what it was granted, and that still waits.
fn check_no_overtaking(moment: &Moment<'_>) -> Result<(), String> {
    let Some(op) = moment.op else {
        return Ok(());
    };
    for granted in moment.granted {
        if !held(moment.before, &granted.owner).is_empty() {
            continue;
        }
        let at = match pending(moment.before, &granted.owner) {
            Some(waiter) => place(moment.before_model, &granted.owner, waiter.priority),
            None => match op {
                LockOp::UpdateWaiting { priority, .. } => (*priority, usize::MAX),
                _ => (Priority::MAX, usize::MAX),
            },
        };
        let entries = granted.entries();
        for waiter in &moment.before.pending {
            if waiter.owner == granted.owner || pending(moment.after, &waiter.owner).is_none() {
                continue;
            }
            let ahead = place(moment.before_model, &waiter.owner, waiter.priority);
            ensure!(
                !(ahead < at && conflict(&waiter.request, &entries)),
                "{} was granted {:?} past {}, which waits ahead of it (at {ahead:?}, it at \
                 {at:?}) for {:?}",
                moment.name(&granted.owner),
                granted.raised,
                moment.name(&waiter.owner),
                waiter.request
            );
        }
    }
    Ok(())
}

/// The place an update of `owner` at `priority` would take.
fn update_place(moment: &Moment<'_>, op: &LockOp, owner: &Owner) -> Place {
    match (pending(moment.before, owner), op) {
        (Some(waiter), _) => place(moment.before_model, owner, waiter.priority),
        (None, LockOp::UpdateWaiting { priority, .. }) => (*priority, usize::MAX),
        (None, _) => (Priority::MAX, usize::MAX),
    }
}

/// The blockers answered to an update are the naive ones.
fn check_blockers(moment: &Moment<'_>) -> Result<(), String> {
    let (Some(op), Some(OpOutcome::Update(Ok(update)))) = (moment.op, moment.outcome) else {
        return Ok(());
    };
    let (LockOp::TryUpdate { owner, request } | LockOp::UpdateWaiting { owner, request, .. }) = op
    else {
        return Ok(());
    };
    let answered: BTreeSet<Owner> = owned(&update.blockers).into_iter().collect();
    let satisfied = pending(moment.before, owner).is_none()
        && request.iter().all(|entry| {
            held(moment.before, owner).get(&entry.lock).copied() == entry.action.target()
        });
    let want = if satisfied {
        BTreeSet::new()
    } else {
        let at = update_place(moment, op, owner);
        naive_blockers(
            moment.before,
            moment.before_model,
            moment.policy,
            owner,
            at,
            request,
        )
    };
    ensure!(
        answered == want,
        "blockers {answered:?}, the naive ones {want:?}"
    );
    Ok(())
}

/// Refuse mode: a fresh waiting request is refused exactly when it would
/// close a cycle of waits (one of its blockers waits, through others, for
/// its owner), and the cycle it names is made of real waits ending with it.
fn check_refused_exactly_when_closing(moment: &Moment<'_>) -> Result<(), String> {
    let (Some(LockOp::UpdateWaiting { owner, request, .. }), Some(OpOutcome::Update(result))) =
        (moment.op, moment.outcome)
    else {
        return Ok(());
    };
    if pending(moment.before, owner).is_some() {
        return Ok(());
    }
    let graph = waits_for(moment.before, moment.before_model, moment.policy);
    let at = update_place(moment, moment.op.expect("an update"), owner);
    let blockers = naive_blockers(
        moment.before,
        moment.before_model,
        moment.policy,
        owner,
        at,
        request,
    );
    let closes = blockers
        .iter()
        .any(|blocker| reaches(&graph, blocker, owner));
    match result {
        Err(LockError::Deadlock(cycle)) => {
            ensure!(
                closes,
                "refused, but no blocker {blockers:?} waits for it: {graph:?}"
            );
            ensure!(moment.before == moment.after, "a refusal changed the state");
            let members: Vec<&Owner> = cycle.iter().map(|(member, _)| &**member).collect();
            ensure!(
                members.last() == Some(&owner),
                "the cycle {members:?} does not end with the requester"
            );
            ensure!(
                blockers.contains(members[0]),
                "the cycle starts with {}, no blocker",
                moment.name(members[0])
            );
            for pair in members.windows(2) {
                ensure!(
                    graph
                        .get(pair[0])
                        .is_some_and(|edges| edges.contains(pair[1])),
                    "{} on the cycle does not wait for {}",
                    moment.name(pair[0]),
                    moment.name(pair[1])
                );
            }
            for (member, holds) in cycle {
                let holdings = held(moment.before, member);
                ensure!(
                    !holds.is_empty()
                        && holds
                            .iter()
                            .all(|(lock, mode)| holdings.get(lock) == Some(mode)),
                    "the cycle says {} holds {holds:?}; it holds {holdings:?}",
                    moment.name(member)
                );
            }
        }
        Ok(update) if !update.blockers.is_empty() => {
            ensure!(
                !closes,
                "waits, but closes a cycle: its blockers {blockers:?}, the waits {graph:?}"
            );
        }
        _ => {}
    }
    Ok(())
}

/// No owner waits in a cycle.
fn check_no_cycle(moment: &Moment<'_>) -> Result<(), String> {
    let graph = waits_for(moment.after, moment.model, moment.real.policy());
    let stuck = cyclic(&graph);
    ensure!(
        stuck.is_empty(),
        "owners wait in a cycle: {:?} (the waits {graph:?})",
        stuck
            .iter()
            .map(|owner| moment.name(owner))
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// `what_if`, asked before a waiting update, said what it then did: its
/// error, its blockers, the owner it is filed under; and the waiting
/// requests ahead of it are the naive ones.
fn check_what_if(moment: &Moment<'_>) -> Result<(), String> {
    let (
        Some(what_if),
        Some(op @ LockOp::UpdateWaiting { owner, request, .. }),
        Some(OpOutcome::Update(result)),
    ) = (moment.what_if, moment.op, moment.outcome)
    else {
        return Ok(());
    };
    match result {
        Err(error) => {
            ensure!(
                what_if.error.as_ref() == Some(error),
                "what_if said {what_if:?}, the update was refused with {error:?}"
            );
            return Ok(());
        }
        Ok(update) => {
            ensure!(
                what_if.error.is_none() && what_if.blockers == update.blockers,
                "what_if said {what_if:?}, the update answered {update:?}"
            );
        }
    }
    let filed = pending(moment.after, owner).map(|waiter| waiter.filed_under.clone());
    let said = what_if.filed_under.as_deref().cloned();
    ensure!(
        said == filed,
        "what_if said it would be filed under {said:?}; it is under {filed:?}"
    );
    if what_if.blockers.is_empty() {
        return Ok(());
    }
    let at = update_place(moment, op, owner);
    let key = |waiter_owner: &Owner, waiter_priority: Priority| match moment.policy.fairness {
        Fairness::Fifo => {
            let (priority, arrival) = place(moment.before_model, waiter_owner, waiter_priority);
            (priority, arrival, waiter_owner.clone())
        }
        Fairness::Ganeti => (waiter_priority, 0, waiter_owner.clone()),
    };
    let mine = match moment.policy.fairness {
        Fairness::Fifo => (at.0, at.1, owner.clone()),
        Fairness::Ganeti => (at.0, 0, owner.clone()),
    };
    let mut ahead: Vec<(Priority, usize, Owner)> = moment
        .before
        .pending
        .iter()
        .filter(|waiter| waiter.owner != *owner && conflict(&waiter.request, request))
        .map(|waiter| key(&waiter.owner, waiter.priority))
        .filter(|place| *place < mine)
        .collect();
    ahead.sort();
    let want: Vec<Owner> = ahead.into_iter().map(|(_, _, owner)| owner).collect();
    let said: Vec<Owner> = what_if
        .ahead
        .iter()
        .map(|waiter| (*waiter.owner).clone())
        .collect();
    ensure!(
        said == want,
        "what_if names {said:?} ahead, the naive order {want:?}"
    );
    Ok(())
}

// ---- Tokens and deaths ----

#[test]
fn tokens_rise_by_one_per_grant_and_every_lock_a_grant_raises_carries_its_token() {
    let strategy = (
        policy_strategy(),
        steps_strategy(Extras::RestartsAndPolicies),
    );
    let cascades = Reach::new("steps granting two or more owners", 12);
    let unions = Reach::new("opportunistic unions granting", 20);
    check_all(CASES, 1, strategy, |(policy, steps)| {
        drive(policy, &steps, |moment| {
            cascades.add(moment.granted.len() >= 2);
            unions.add(
                matches!(moment.op, Some(LockOp::OpportunisticUnion { .. }))
                    && !moment.granted.is_empty(),
            );
            check_tokens(moment)
        })?;
        Ok(())
    });
    cascades.check();
    unions.check();
}

#[test]
fn a_death_is_told_once_to_the_next_grant_covering_it_and_never_after_a_release() {
    let strategy = (
        policy_strategy(),
        steps_strategy(Extras::RestartsAndPolicies),
    );
    let told = Reach::new("grants told of a death", 120);
    let groups = Reach::new("member grants told of their group's death", 20);
    check_all(CASES, 2, strategy, |(policy, steps)| {
        drive(policy, &steps, |moment| {
            for granted in moment.granted {
                told.add(!granted.told.is_empty());
                groups.add(granted.told.iter().any(|(lock, _, _)| {
                    granted
                        .raised
                        .iter()
                        .any(|(raised, _)| raised.group().as_ref() == Some(lock))
                }));
            }
            check_deaths(moment)
        })?;
        Ok(())
    });
    told.check();
    groups.check();
}

/// Restarts in the middle of a sequence (the manager rebuilt from its two
/// saved forms) change no answer, no listing, no token and no mark: a twin
/// never restarted runs alongside.
#[test]
fn a_restart_from_the_saved_form_keeps_tokens_and_marks_and_changes_no_answer() {
    let strategy = (policy_strategy(), steps_strategy(Extras::Restarts));
    let with_marks = Reach::new("restarts with death marks", 40);
    let with_waiters = Reach::new("restarts with waiters", 30);
    check_all(CASES, 3, strategy, |(policy, steps)| {
        let mut twin = LockManager::new();
        twin.apply(&LockOp::SetPolicy { policy });
        drive(policy, &steps, |moment| {
            if moment.op.is_none() {
                with_marks.add(!moment.before_ext.grants.marks.is_empty());
                with_waiters.add(!moment.before.pending.is_empty());
            }
            if let Some(op) = moment.op {
                let again = twin.apply(op);
                ensure!(
                    Some(&again) == moment.outcome,
                    "the twin answered {again:?}"
                );
            }
            ensure!(twin.saved() == *moment.after, "the saved states differ");
            ensure!(
                twin.saved_extensions() == moment.real.saved_extensions(),
                "the saved extensions differ: twin {:?}, restarted {:?}",
                twin.saved_extensions(),
                moment.real.saved_extensions()
            );
            check_tokens(moment)?;
            check_deaths(moment)
        })?;
        Ok(())
    });
    with_marks.check();
    with_waiters.check();
}

/// The same through the store: every operation that changed the state is
/// journaled, a snapshot is written at a random step, and the store is
/// opened again at every restart and at the end; the manager it rebuilds
/// (from the snapshot and the journal's replay) equals a twin that never
/// left memory, tokens, marks and policy included.
#[test]
fn a_restart_through_the_store_keeps_tokens_and_marks() {
    let strategy = (
        policy_strategy(),
        steps_strategy(Extras::RestartsAndPolicies),
        0..=SEQUENCE_OPS_MAX,
    );
    check_all(STORE_CASES, 4, strategy, |(policy, steps, snapshot_at)| {
        let owners = owners();
        let scratch = tempfile::tempdir().expect("a scratch dir");
        let dir = scratch.path();
        let open = || LockStore::open(dir).map_err(|error| TestCaseError::fail(error.to_string()));
        let (mut store, mut real, mut workers, _) = open()?;
        let mut twin = LockManager::new();
        let policy_op = LockOp::SetPolicy { policy };
        real.apply(&policy_op);
        twin.apply(&policy_op);
        store.record(&policy_op);
        for (index, step) in steps.iter().enumerate() {
            let (act, label) = resolve_step(step, &real, &owners);
            let at = |message: String| {
                TestCaseError::fail(format!("after step {index}, {label}: {message}"))
            };
            let op = match act {
                Act::Lock(op) => op,
                Act::Restart => {
                    store.commit().map_err(|error| at(error.to_string()))?;
                    drop(store);
                    (store, real, workers, _) = open()?;
                    compare_twins(&real, &twin).map_err(at)?;
                    continue;
                }
            };
            let changes = real.changes();
            let outcome = real.apply(&op);
            let again = twin.apply(&op);
            if outcome != again {
                return Err(at(format!("answered {outcome:?}, the twin {again:?}")));
            }
            if real.changes() != changes {
                store.record(&op);
            }
            if index == snapshot_at {
                store.commit().map_err(|error| at(error.to_string()))?;
                store
                    .write_snapshot(&real, &workers)
                    .map_err(|error| at(error.to_string()))?;
            }
        }
        store
            .commit()
            .map_err(|error| TestCaseError::fail(error.to_string()))?;
        drop(store);
        let (_, reopened, _, _) = open()?;
        compare_twins(&reopened, &twin).map_err(TestCaseError::fail)?;
        Ok(())
    });
}

fn compare_twins(real: &LockManager, twin: &LockManager) -> Result<(), String> {
    real.check_invariants();
    ensure!(
        real.saved() == twin.saved(),
        "reopened {:?}, the twin {:?}",
        real.saved(),
        twin.saved()
    );
    ensure!(
        real.saved_extensions() == twin.saved_extensions(),
        "reopened extensions {:?}, the twin's {:?}",
        real.saved_extensions(),
        twin.saved_extensions()
    );
    Ok(())
}

// ---- Fifo ----

#[test]
fn in_fifo_mode_no_waiter_is_overtaken_by_a_later_request_it_conflicts_with() {
    let strategy = (fifo_strategy(), steps_strategy(Extras::Restarts));
    let queued = Reach::new("updates queued behind a waiter", 60);
    check_all(CASES, 5, strategy, |(policy, steps)| {
        drive(policy, &steps, |moment| {
            queued.add(queued_behind_a_waiter(moment));
            check_no_overtaking(moment)
        })?;
        Ok(())
    });
    queued.check();
}

/// Blockers are the holders in the way and, in fifo mode for an owner
/// holding nothing, the waiters ahead it conflicts with; under every policy.
#[test]
fn blockers_are_the_holders_in_the_way_and_in_fifo_mode_the_waiters_ahead() {
    let strategy = (
        policy_strategy(),
        steps_strategy(Extras::RestartsAndPolicies),
    );
    let queued = Reach::new("updates queued behind a waiter", 25);
    check_all(CASES, 6, strategy, |(policy, steps)| {
        drive(policy, &steps, |moment| {
            queued.add(queued_behind_a_waiter(moment));
            check_blockers(moment)
        })?;
        Ok(())
    });
    queued.check();
}

/// A state (from a fifo sequence) and an owner's waiting request that is
/// blocked in it.
struct Blocked {
    state: LockManager,
    owner: Owner,
    request: Vec<Entry>,
    blockers: BTreeSet<Owner>,
    earlier: BTreeSet<Owner>,
}

type Situation = (LockPolicy, Vec<Step>, usize, Priority, Vec<Vec<Entry>>);

fn situation_strategy() -> impl Strategy<Value = Situation> {
    (
        fifo_strategy(),
        steps_strategy(Extras::None),
        0..owners().len(),
        priority_strategy(),
        prop::collection::vec(request_strategy(), 1..=8),
    )
}

fn find_blocked(situation: &Situation) -> Result<Option<Blocked>, TestCaseError> {
    let (policy, steps, first, priority, requests) = situation;
    let owners = owners();
    let (real, _) = drive(*policy, steps, |_| Ok(()))?;
    for offset in 0..owners.len() {
        let owner = &owners[(first + offset) % owners.len()];
        if real.has_pending_request(owner) {
            continue;
        }
        for request in requests {
            let mut state = copy(&real);
            if let Ok(update) = state.update_waiting(owner, *priority, request)
                && !update.blockers.is_empty()
            {
                state.check_invariants();
                return Ok(Some(Blocked {
                    earlier: real
                        .list_pending()
                        .into_iter()
                        .map(|waiter| (*waiter.owner).clone())
                        .collect(),
                    state,
                    owner: owner.clone(),
                    request: request.clone(),
                    blockers: owned(&update.blockers).into_iter().collect(),
                }));
            }
        }
    }
    Ok(None)
}

fn for_all_blocked(seed: u8, check: impl Fn(&Blocked) -> Result<(), String>) {
    let found = std::cell::Cell::new(0usize);
    check_all(CASES, seed, situation_strategy(), |situation| {
        if let Some(blocked) = find_blocked(&situation)? {
            found.set(found.get() + 1);
            check(&blocked).map_err(TestCaseError::fail)?;
        }
        Ok(())
    });
    assert!(
        found.get() * 100 >= CASES as usize * FOUND_PERCENT_MIN,
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

/// Progress in fifo mode: once its blockers (holders and waiters ahead)
/// and every earlier waiter let go, a waiting request is granted and its
/// owner told; once its blockers alone let go, someone else is told.
#[test]
fn in_fifo_mode_a_waiting_request_is_granted_once_its_blockers_and_earlier_waiters_let_go() {
    for_all_blocked(7, |blocked| {
        let mut state = copy(&blocked.state);
        let releasing: BTreeSet<Owner> =
            blocked.blockers.union(&blocked.earlier).cloned().collect();
        let notified = free_all(&mut state, &releasing);
        let me = &blocked.owner;
        ensure!(
            !state.has_pending_request(me),
            "{me} still waits for {:?} after {releasing:?} let go",
            blocked.request
        );
        ensure!(notified.contains(me), "{me} was granted but not told");
        let mut state = copy(&blocked.state);
        let notified = free_all(&mut state, &blocked.blockers);
        ensure!(
            notified.difference(&blocked.blockers).next().is_some(),
            "the blockers {:?} let go, but only {notified:?} were told",
            blocked.blockers
        );
        Ok(())
    });
}

// ---- Deadlocks ----

#[test]
fn in_refuse_mode_a_request_is_refused_exactly_when_it_would_close_a_cycle() {
    let strategy = (refuse_strategy(), steps_strategy(Extras::Restarts));
    let refused = Reach::new("requests refused as deadlocks", 12);
    check_all(CASES, 8, strategy, |(policy, steps)| {
        drive(policy, &steps, |moment| {
            refused.add(matches!(
                moment.outcome,
                Some(OpOutcome::Update(Err(LockError::Deadlock(_))))
            ));
            check_refused_exactly_when_closing(moment)
        })?;
        Ok(())
    });
    refused.check();
}

#[test]
fn in_refuse_mode_no_owner_ever_waits_in_a_cycle() {
    let strategy = (refuse_strategy(), steps_strategy(Extras::Restarts));
    let chains = Reach::new("states with a waiter waiting for a waiter", 80);
    check_all(CASES, 9, strategy, |(policy, steps)| {
        drive(policy, &steps, |moment| {
            let graph = waits_for(moment.after, moment.model, moment.real.policy());
            chains.add(
                graph
                    .values()
                    .any(|blockers| blockers.iter().any(|b| graph.contains_key(b))),
            );
            check_no_cycle(moment)
        })?;
        Ok(())
    });
    chains.check();
}

// ---- whatIf ----

#[test]
fn what_if_answers_what_update_locks_waiting_then_does() {
    let strategy = (
        policy_strategy(),
        steps_strategy(Extras::RestartsAndPolicies),
    );
    let ahead = Reach::new("what_ifs naming waiters ahead", 50);
    let waiting = Reach::new("what_ifs of a waiting request", 100);
    let errors = Reach::new("what_ifs answering an error", 50);
    check_all(CASES, 10, strategy, |(policy, steps)| {
        drive(policy, &steps, |moment| {
            if let (Some(what_if), Some(op)) = (moment.what_if, moment.op) {
                ahead.add(!what_if.ahead.is_empty());
                waiting.add(
                    op.owner()
                        .is_some_and(|owner| pending(moment.before, owner).is_some()),
                );
                errors.add(what_if.error.is_some());
            }
            check_what_if(moment)
        })?;
        Ok(())
    });
    ahead.check();
    waiting.check();
    errors.check();
}

// ---- Ganeti's answers ----

/// With the default policy a death frees as `freeLocks` does: every answer
/// and listing agrees with the reference model of Ganeti, restarts and all.
#[test]
fn with_the_default_policy_deaths_and_restarts_agree_with_the_reference() {
    let deaths = Reach::new("deaths granting a waiter", 25);
    check_all(CASES, 11, steps_strategy(Extras::Restarts), |steps| {
        let mut reference = Reference::new();
        drive(LockPolicy::default(), &steps, |moment| {
            deaths.add(
                matches!(moment.op, Some(LockOp::FreeDead { .. })) && !moment.granted.is_empty(),
            );
            compare_with_reference(moment, &mut reference, false)
        })?;
        Ok(())
    });
    deaths.check();
}

/// Refusing deadlocks changes one answer only: a request the reference
/// leaves waiting (forever, on a cycle) is refused, and nothing else.
#[test]
fn refusing_deadlocks_changes_no_answer_but_the_refusal() {
    let policy = LockPolicy {
        fairness: Fairness::Ganeti,
        deadlocks: Deadlocks::Refuse,
    };
    let refused = Reach::new("requests refused as deadlocks", 12);
    check_all(CASES, 12, steps_strategy(Extras::Restarts), |steps| {
        let mut reference = Reference::new();
        drive(policy, &steps, |moment| {
            refused.add(matches!(
                moment.outcome,
                Some(OpOutcome::Update(Err(LockError::Deadlock(_))))
            ));
            compare_with_reference(moment, &mut reference, true)
        })?;
        Ok(())
    });
    refused.check();
}

fn compare_with_reference(
    moment: &Moment<'_>,
    reference: &mut Reference,
    refusals: bool,
) -> Result<(), String> {
    let (Some(op), Some(outcome)) = (moment.op, moment.outcome) else {
        return compare_states(moment.real, reference, moment.owners);
    };
    let owners = moment.owners;
    let index = |owner: &Owner| {
        owners
            .iter()
            .position(|known| known == owner)
            .expect("an owner of the test")
    };
    let as_op = match op {
        LockOp::TryUpdate { owner, request } => Op::TryUpdate {
            owner: index(owner),
            request: request.clone(),
        },
        LockOp::UpdateWaiting {
            owner,
            priority,
            request,
        } => Op::UpdateWaiting {
            owner: index(owner),
            priority: *priority,
            request: request.clone(),
        },
        LockOp::FreeLocks { owner } | LockOp::FreeDead { owner } => Op::FreeLocks {
            owner: index(owner),
        },
        LockOp::FreeLocksLevel { owner, level } => Op::FreeLocksLevel {
            owner: index(owner),
            level: *level,
        },
        LockOp::DowngradeLocksLevel { owner, level } => Op::Downgrade {
            owner: index(owner),
            level: *level,
        },
        LockOp::IntersectLocks { owner, keep } => Op::Intersect {
            owner: index(owner),
            keep: keep.clone(),
        },
        LockOp::OpportunisticUnion { owner, wanted } => Op::Union {
            owner: index(owner),
            wanted: wanted.clone(),
        },
        LockOp::GuardedOpportunisticUnion {
            count,
            owner,
            wanted,
        } => Op::Guarded {
            count: *count,
            owner: index(owner),
            wanted: wanted.clone(),
        },
        LockOp::SetPolicy { .. } => return Err("no policy changes here".to_owned()),
    };
    let want = apply_reference(reference, &as_op, owners);
    let have = outcome_of(outcome);
    if refusals && let Outcome::Update(Err(LockError::Deadlock(_))) = have {
        ensure!(
            matches!(&want, Outcome::Update(Ok(answer)) if !answer.blockers.is_empty()),
            "refused as a deadlock; the reference answered {want:?}"
        );
        let me = &owners[as_op.owner()];
        let dropped = reference.free_locks_level(me, UNUSED_LEVEL);
        ensure!(
            dropped.is_empty(),
            "dropping the request notified {dropped:?}"
        );
    } else {
        compare_outcomes(&have, &want)?;
    }
    compare_states(moment.real, reference, owners)
}
