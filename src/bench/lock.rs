//! lock-bench: throughput and scaling of the in-process lock core
//! ([`crate::locks::LockManager`]), against the targets recorded in
//! design/PERFORMANCE.md.
//!
//! ```text
//! cargo run --release --bin lock-bench [single|scale|drain|cycle] [--runs N] [--quick]
//!     [--fairness ganeti|fifo] [--deadlock-check refuse|off]
//! ```
//!
//! The lock policy defaults to wconfd's default settings, so the figures
//! are those of the daemon as shipped.
//!
//! Scenarios:
//! - `single`: one owner takes and drops `node/n1` through `try_update`;
//!   updates per second.
//! - `scale`: cost of one update with a tiny table and with 1,000 owners
//!   holding 100,000 node locks; the ratio large/small.
//! - `drain`: thousands of owners wait for one lock; time to grant and free
//!   them one after the other, plain and with every waiter holding the BGL
//!   shared (as job runners do).
//! - `cycle`: the deadlock check of a blocked request with 10,000 owners
//!   waiting, as the cost of a blocked `update_waiting` with the check on
//!   less the same with it off, alternating; waiters fanned out behind
//!   holders that wait for nothing (the usual shape), one chain of waits
//!   through every waiter (the worst shape), and a refused conversion.
//!
//! The box this runs on is shared and noisy, so every scenario runs several
//! times and the summary shows medians; ratios are computed within one run
//! (both sides saw the same noise) before taking their median. Correctness
//! is asserted along the way: a benchmark of wrong answers is worthless.
//! Missing a target is reported, not an error: this is a benchmark, not a
//! timed test.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::{CommandLine, Context, Measure, Report, Target, Unit, counted, grouped, print_mode};
use crate::bench;
use crate::locks::{
    Deadlocks, Entry, Fairness, LockError, LockManager, LockName, LockPolicy, Owner, Update,
};

const USAGE: &str = "usage: lock-bench [single|scale|drain|cycle] [--runs N] [--quick] \
                     [--fairness ganeti|fifo] [--deadlock-check refuse|off]";

/// Runs per scenario unless `--runs` says otherwise: enough for a median to
/// shrug off one disturbed run.
const RUNS_DEFAULT: usize = 5;

// The targets of design/PERFORMANCE.md.
const SINGLE_UPDATES_PER_SECOND_MIN: f64 = 1_000_000.0;
const SCALE_RATIO_MAX: f64 = 2.0;
const DRAIN_SECONDS_MAX: f64 = 1.0;
const DRAIN_TARGET_WAITERS: usize = 10_000;
const CYCLE_CHECK_NANOS_MAX: f64 = 50_000.0;

/// The bench binary: its command line, its scenarios, its exit code.
pub fn main() -> ExitCode {
    bench::main("lock-bench", USAGE, Options::parse, |options| {
        bench(&options)
    })
}

fn bench(options: &Options) -> super::Result<()> {
    print_context(options);
    options.run(|scenario| Ok(run_scenario(scenario, options)))
}

// ---------------------------------------------------------------------------
// Options and sizes

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Single,
    Scale,
    Drain,
    Cycle,
}

impl bench::Scenario for Scenario {
    const ALL: &'static [Scenario] = &[
        Scenario::Single,
        Scenario::Scale,
        Scenario::Drain,
        Scenario::Cycle,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Single => "single",
            Scenario::Scale => "scale",
            Scenario::Drain => "drain",
            Scenario::Cycle => "cycle",
        }
    }
}

impl Scenario {
    fn run(self, sizes: &Sizes, policy: LockPolicy) -> Vec<Measure> {
        match self {
            Scenario::Single => single(sizes, policy),
            Scenario::Scale => scale(sizes, policy),
            Scenario::Drain => drain(sizes, policy),
            Scenario::Cycle => cycle(sizes, policy.fairness),
        }
    }
}

struct Options {
    shared: CommandLine<Scenario>,
    /// The policy of every lock manager the scenarios build.
    policy: LockPolicy,
}

impl std::ops::Deref for Options {
    type Target = CommandLine<Scenario>;

    fn deref(&self) -> &CommandLine<Scenario> {
        &self.shared
    }
}

impl Options {
    /// `None` for `--help`.
    fn parse(args: &[String]) -> std::result::Result<Option<Options>, String> {
        let mut policy = crate::settings::WconfdSettings::default().lock_policy();
        let shared = CommandLine::parse("lock-bench", args, RUNS_DEFAULT, |arg, rest| {
            match arg {
                "--fairness" => {
                    let text = rest.next().ok_or("--fairness needs ganeti or fifo")?;
                    policy.fairness = Fairness::parse(text)
                        .ok_or_else(|| format!("--fairness wants ganeti or fifo, not '{text}'"))?;
                }
                "--deadlock-check" => {
                    let text = rest.next().ok_or("--deadlock-check needs refuse or off")?;
                    policy.deadlocks = Deadlocks::parse(text).ok_or_else(|| {
                        format!("--deadlock-check wants refuse or off, not '{text}'")
                    })?;
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(shared.map(|shared| Options { shared, policy }))
    }
}

/// A lock manager under the bench's policy.
fn manager(policy: LockPolicy) -> LockManager {
    let mut manager = LockManager::new();
    manager.set_policy(policy);
    manager
}

fn sizes(options: &Options) -> Sizes {
    if options.quick {
        Sizes::QUICK
    } else {
        Sizes::FULL
    }
}

/// How much work each scenario does per run.
struct Sizes {
    /// Updates per run of `single` (half acquires, half releases).
    single_updates: u64,
    /// Acquire+release pairs per measurement of `scale`.
    scale_pairs: u64,
    /// Owners of the small and the large `scale` table; each holds the BGL
    /// shared plus `scale_locks_per_owner` node locks, so the measured
    /// existing owner looks the same in both and only the table grows.
    scale_owners: [usize; 2],
    scale_locks_per_owner: usize,
    /// Waiter counts of `drain`, smallest first, so growth is visible.
    drain_waiters: [usize; 3],
    /// Owners waiting in `cycle`, and blocked requests timed per mode.
    cycle_waiters: usize,
    cycle_blocks: usize,
}

impl Sizes {
    const FULL: Sizes = Sizes {
        single_updates: 2_000_000,
        scale_pairs: 250_000,
        scale_owners: [1, 1_000],
        scale_locks_per_owner: 100,
        drain_waiters: [1_000, 5_000, DRAIN_TARGET_WAITERS],
        cycle_waiters: 10_000,
        cycle_blocks: 2_000,
    };

    /// A smoke run for CI: every code path and assertion, in well under a
    /// second. Its figures mean nothing, so targets are not judged.
    const QUICK: Sizes = Sizes {
        single_updates: 20_000,
        scale_pairs: 2_000,
        scale_owners: [1, 20],
        scale_locks_per_owner: 100,
        drain_waiters: [100, 500, 1_000],
        cycle_waiters: 500,
        cycle_blocks: 50,
    };
}

// ---------------------------------------------------------------------------
// Runs

/// Runs one scenario `options.runs` times and prints every run and the
/// median of each figure.
fn run_scenario(scenario: Scenario, options: &Options) -> Report {
    let sizes = sizes(options);
    let description = describe(scenario, &sizes);
    bench::run_scenario(scenario, &description, options.runs, || {
        Ok(scenario.run(&sizes, options.policy))
    })
    .expect("the lock core's runs report no errors")
}

fn describe(scenario: Scenario, sizes: &Sizes) -> String {
    match scenario {
        Scenario::Single => format!(
            "one owner, try_update [node/n1 exclusive] then [node/n1 release]; \
             {} updates per run",
            grouped(sizes.single_updates)
        ),
        Scenario::Scale => {
            let [small, large] = sizes.scale_owners;
            let locks = sizes.scale_locks_per_owner;
            format!(
                "acquire+release of one lock, {} pairs per figure;\n   \
                 small table: {}, large table: {} ({} node locks); \
                 each owner holds cluster/BGL shared + {locks} node locks exclusive;\n   \
                 fresh = an owner holding nothing takes an unheld lock; \
                 existing = an owner of the table takes one above its highest",
                grouped(sizes.scale_pairs),
                owners(small),
                owners(large),
                grouped((large * locks) as u64),
            )
        }
        Scenario::Drain => format!(
            "N owners wait (priority 0) for [node/n1 exclusive] behind one holder; \
             the holder frees, then each notified owner frees in turn;\n   \
             time from the first free to the last, N = {}; \
             'bgl' = each waiter first holds cluster/BGL shared",
            sizes
                .drain_waiters
                .map(|waiters| grouped(waiters as u64))
                .join(", ")
        ),
        Scenario::Cycle => format!(
            "{} owners wait, each holding cluster/BGL shared and a node lock; \
             a fresh owner holding the BGL shared files a request they block, \
             {} times per figure;\n   \
             check = its update_waiting with deadlock_check refuse less the same with off \
             (alternating); fan = 100 holders that wait for nothing block the waiters; \
             chain = each waiter waits for the next, the request walks them all; \
             refused = the second of two shared holders asking exclusive",
            grouped(sizes.cycle_waiters as u64),
            grouped(sizes.cycle_blocks as u64),
        ),
    }
}

// ---------------------------------------------------------------------------
// Scenario: single

fn single(sizes: &Sizes, policy: LockPolicy) -> Vec<Measure> {
    let mut manager = manager(policy);
    let owner = job_owner(1);
    let node = lock("node/n1");
    let pairs = sizes.single_updates / 2;
    acquire_release(&mut manager, &owner, &node, pairs / 10); // warm-up
    let elapsed = acquire_release(&mut manager, &owner, &node, pairs);
    assert!(
        manager.list_all_locks().is_empty(),
        "everything was released"
    );
    vec![
        Measure::new("updates/s", Unit::PerSecond, rate(2 * pairs, elapsed))
            .with_target(Target::AtLeast(SINGLE_UPDATES_PER_SECOND_MIN)),
    ]
}

/// `pairs` times: `owner` takes `lock` exclusively, then releases it, one
/// `try_update` each. Every update must be granted.
fn acquire_release(
    manager: &mut LockManager,
    owner: &Owner,
    lock: &LockName,
    pairs: u64,
) -> Duration {
    let acquire = [Entry::exclusive(lock.clone())];
    let release = [Entry::release(lock.clone())];
    let started = Instant::now();
    for _ in 0..pairs {
        expect_granted(manager.try_update(black_box(owner), black_box(&acquire)));
        expect_granted(manager.try_update(black_box(owner), black_box(&release)));
    }
    started.elapsed()
}

fn expect_granted(update: Result<Update, LockError>) {
    let update = black_box(update).expect("the bench sends only valid requests");
    assert!(update.blockers.is_empty(), "nobody else holds the lock");
    assert!(update.notify.is_empty(), "nobody waits");
}

// ---------------------------------------------------------------------------
// Scenario: scale

fn scale(sizes: &Sizes, policy: LockPolicy) -> Vec<Measure> {
    let [small_owners, large_owners] = sizes.scale_owners;
    let costs = |owners| {
        update_costs(
            owners,
            sizes.scale_locks_per_owner,
            sizes.scale_pairs,
            policy,
        )
    };
    let small = costs(small_owners);
    let large = costs(large_owners);
    let ratio_target = Target::AtMost(SCALE_RATIO_MAX);
    vec![
        Measure::new("fresh owner, small table", Unit::Nanos, small.fresh_ns),
        Measure::new("fresh owner, large table", Unit::Nanos, large.fresh_ns),
        Measure::new(
            "fresh owner, ratio large/small",
            Unit::Ratio,
            large.fresh_ns / small.fresh_ns,
        )
        .with_target(ratio_target),
        Measure::new(
            "existing owner, small table",
            Unit::Nanos,
            small.existing_ns,
        ),
        Measure::new(
            "existing owner, large table",
            Unit::Nanos,
            large.existing_ns,
        ),
        Measure::new(
            "existing owner, ratio large/small",
            Unit::Ratio,
            large.existing_ns / small.existing_ns,
        )
        .with_target(ratio_target),
    ]
}

struct UpdateCosts {
    fresh_ns: f64,
    existing_ns: f64,
}

/// Fills a table with `owners` owners and answers the nanoseconds per update
/// of a fresh owner and of one of the table's owners.
fn update_costs(
    owners: usize,
    locks_per_owner: usize,
    pairs: u64,
    policy: LockPolicy,
) -> UpdateCosts {
    let mut manager = manager(policy);
    for index in 0..owners {
        let owner = table_owner(index);
        // Job-like: the BGL shared first, then the node level in one request.
        let bgl = [Entry::shared(LockName::Bgl)];
        let nodes: Vec<Entry> = (0..locks_per_owner)
            .map(|slot| Entry::exclusive(table_lock(index, slot)))
            .collect();
        expect_granted(manager.try_update(&owner, &bgl));
        expect_granted(manager.try_update(&owner, &nodes));
    }
    manager.check_invariants();
    // The node locks, the BGL, and the groups cluster/[lockset], node/[lockset].
    let locks_in_use = owners * locks_per_owner + 3;
    assert_eq!(manager.list_all_locks().len(), locks_in_use);

    let fresh = job_owner(owners as u64 + 1);
    let unheld = lock("node/unheld");
    let existing_index = owners / 2;
    let existing = table_owner(existing_index);
    // Zero-padded names: slot `locks_per_owner` sorts above every held slot.
    let above_highest = table_lock(existing_index, locks_per_owner);

    let cost = |manager: &mut LockManager, owner: &Owner, lock: &LockName| {
        acquire_release(manager, owner, lock, pairs / 10); // warm-up
        nanos_per(2 * pairs, acquire_release(manager, owner, lock, pairs))
    };
    let costs = UpdateCosts {
        fresh_ns: cost(&mut manager, &fresh, &unheld),
        existing_ns: cost(&mut manager, &existing, &above_highest),
    };
    manager.check_invariants();
    assert_eq!(
        manager.list_all_locks().len(),
        locks_in_use,
        "the table is back"
    );
    costs
}

fn table_owner(index: usize) -> Owner {
    job_owner(index as u64 + 1)
}

fn table_lock(owner_index: usize, slot: usize) -> LockName {
    lock(&format!("node/n{owner_index:05}-{slot:03}"))
}

// ---------------------------------------------------------------------------
// Scenario: drain

fn drain(sizes: &Sizes, policy: LockPolicy) -> Vec<Measure> {
    let mut measures = Vec::new();
    for (variant, bgl_first) in [("", false), (", bgl", true)] {
        let seconds = sizes
            .drain_waiters
            .map(|waiters| drain_once(waiters, bgl_first, policy).as_secs_f64());
        for (waiters, seconds) in sizes.drain_waiters.iter().zip(seconds) {
            let label = format!("{} waiters{variant}", grouped(*waiters as u64));
            let measure = Measure::new(label, Unit::Seconds, seconds);
            measures.push(if *waiters == DRAIN_TARGET_WAITERS {
                measure.with_target(Target::AtMost(DRAIN_SECONDS_MAX))
            } else {
                measure
            });
        }
        // Growth between the smallest and largest N, within this run.
        let (first, last) = (0, sizes.drain_waiters.len() - 1);
        let exponent = (seconds[last] / seconds[first]).ln()
            / (sizes.drain_waiters[last] as f64 / sizes.drain_waiters[first] as f64).ln();
        let label = format!("growth exponent{variant} (1 linear, 2 quadratic)");
        measures.push(Measure::new(label, Unit::Exponent, exponent));
    }
    measures
}

/// One holder, `waiters` owners waiting behind it, then the drain: answers
/// the time from the holder's free to the last waiter's free.
fn drain_once(waiters: usize, bgl_first: bool, policy: LockPolicy) -> Duration {
    let mut manager = manager(policy);
    let bgl = [Entry::shared(LockName::Bgl)];
    let wanted = [Entry::exclusive(lock("node/n1"))];
    let take = |manager: &mut LockManager, owner: &Owner| {
        if bgl_first {
            expect_granted(manager.try_update(owner, &bgl));
        }
    };

    let holder = job_owner(0);
    take(&mut manager, &holder);
    expect_granted(manager.try_update(&holder, &wanted));
    // Owners in owner order, which is the order they must be granted in.
    let owners: Vec<Owner> = (1..=waiters as u64).map(job_owner).collect();
    // Filed in a scrambled order, so arrival order cannot pass for owner order.
    for index in scrambled(waiters) {
        let owner = &owners[index];
        take(&mut manager, owner);
        let update = manager
            .update_waiting(owner, 0, &wanted)
            .expect("the bench sends only valid requests");
        assert!(
            update.blockers.len() == 1 && *update.blockers[0] == holder,
            "waiter {owner} is blocked by the holder alone, not {:?}",
            update.blockers
        );
    }
    manager.check_invariants();

    let started = Instant::now();
    let mut notified = manager.free_locks(&holder);
    let mut granted = Vec::with_capacity(waiters);
    for step in 0..waiters {
        assert_eq!(notified.len(), 1, "free number {step} notifies one owner");
        let owner = notified.pop().expect("one owner was notified");
        notified = manager.free_locks(&owner);
        granted.push(owner);
    }
    let elapsed = started.elapsed();

    assert!(notified.is_empty(), "the last free notifies nobody");
    assert!(
        granted.iter().map(|owner| &**owner).eq(&owners),
        "waiters are granted in (priority, owner) order"
    );
    assert!(
        manager.owners().is_empty(),
        "everyone was granted and freed"
    );
    manager.check_invariants();
    elapsed
}

/// 0..n in a fixed pseudo-random order (Fisher-Yates over xorshift64), the
/// same every run.
fn scrambled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for last in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(last, (state % (last as u64 + 1)) as usize);
    }
    order
}

// ---------------------------------------------------------------------------
// Scenario: cycle

fn cycle(sizes: &Sizes, fairness: Fairness) -> Vec<Measure> {
    let mut measures = Vec::new();
    for shape in [Shape::Fan, Shape::Chain] {
        let (refuse, off) = blocked_costs(shape, sizes, fairness);
        let name = shape.name();
        measures.push(Measure::new(
            format!("{name}: blocked, check on"),
            Unit::Nanos,
            refuse,
        ));
        measures.push(Measure::new(
            format!("{name}: blocked, check off"),
            Unit::Nanos,
            off,
        ));
        let check = Measure::new(format!("{name}: the check"), Unit::Nanos, refuse - off);
        measures.push(match shape {
            Shape::Fan => check.with_target(Target::AtMost(CYCLE_CHECK_NANOS_MAX)),
            Shape::Chain => check,
        });
    }
    measures.push(Measure::new(
        "refused, a cycle of 2",
        Unit::Nanos,
        refused_cost(sizes.cycle_blocks, fairness),
    ));
    measures
}

#[derive(Clone, Copy)]
enum Shape {
    /// Every waiter is blocked by one of 100 holders that wait for nothing.
    Fan,
    /// Waiter i waits for a lock waiter i+1 holds; the last waits for a
    /// holder that waits for nothing.
    Chain,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Fan => "fan",
            Shape::Chain => "chain",
        }
    }
}

/// Nanoseconds per blocked `update_waiting` of a fresh owner holding the
/// BGL shared, behind `sizes.cycle_waiters` waiters of `shape`: with the
/// deadlock check on, and off, in two identical tables, alternating.
fn blocked_costs(shape: Shape, sizes: &Sizes, fairness: Fairness) -> (f64, f64) {
    let mut tables = [Deadlocks::Refuse, Deadlocks::Wait].map(|deadlocks| {
        waiting_table(
            shape,
            sizes.cycle_waiters,
            LockPolicy {
                fairness,
                deadlocks,
            },
        )
    });
    let bgl = [Entry::shared(LockName::Bgl)];
    let requester = job_owner(u64::from(u32::MAX - 10_000));
    let request = [Entry::exclusive(lock(match shape {
        Shape::Fan => "node/w000",
        Shape::Chain => "node/c000000",
    }))];
    let mut elapsed = [Duration::ZERO; 2];
    for round in 0..2 * sizes.cycle_blocks {
        let manager = &mut tables[round % 2];
        expect_granted(manager.try_update(&requester, &bgl));
        let started = Instant::now();
        let update = manager.update_waiting(black_box(&requester), 0, black_box(&request));
        elapsed[round % 2] += started.elapsed();
        let update = update.expect("the request closes no cycle");
        assert_eq!(update.blockers.len(), 1, "the request is blocked");
        assert!(
            manager.free_locks(&requester).is_empty(),
            "nobody waits for it"
        );
    }
    for manager in &tables {
        manager.check_invariants();
        assert_eq!(
            manager.pending_count(),
            sizes.cycle_waiters,
            "the waiters are left as they were"
        );
    }
    let per_block = |elapsed: Duration| nanos_per(sizes.cycle_blocks as u64, elapsed);
    (per_block(elapsed[0]), per_block(elapsed[1]))
}

/// `waiters` owners waiting in `shape`, each holding the BGL shared and a
/// node lock of its own.
fn waiting_table(shape: Shape, waiters: usize, policy: LockPolicy) -> LockManager {
    const HOLDERS: usize = 100;
    let mut manager = manager(policy);
    let bgl = [Entry::shared(LockName::Bgl)];
    let take = |manager: &mut LockManager, owner: &Owner, name: &str| {
        expect_granted(manager.try_update(owner, &bgl));
        expect_granted(manager.try_update(owner, &[Entry::exclusive(lock(name))]));
    };
    let wanted: Vec<String> = match shape {
        Shape::Fan => {
            for holder in 0..HOLDERS {
                let name = format!("node/w{holder:03}");
                take(&mut manager, &job_owner(holder as u64 + 1), &name);
            }
            (0..waiters)
                .map(|index| format!("node/w{:03}", index % HOLDERS))
                .collect()
        }
        Shape::Chain => {
            take(&mut manager, &job_owner(1), &format!("node/c{waiters:06}"));
            (1..=waiters)
                .map(|index| format!("node/c{index:06}"))
                .collect()
        }
    };
    let waiter = |index: usize| job_owner((HOLDERS + 1 + index) as u64);
    for index in 0..waiters {
        let own = match shape {
            Shape::Fan => format!("node/a{index:06}"),
            Shape::Chain => format!("node/c{index:06}"),
        };
        take(&mut manager, &waiter(index), &own);
    }
    for (index, name) in wanted.iter().enumerate() {
        let update = manager
            .update_waiting(&waiter(index), 0, &[Entry::exclusive(lock(name))])
            .expect("no cycle among the waiters");
        assert_eq!(update.blockers.len(), 1, "one holder blocks waiter {index}");
    }
    manager.check_invariants();
    assert_eq!(manager.pending_count(), waiters);
    manager
}

/// Nanoseconds per refused request: two owners hold `node/s` shared, the
/// first asks for it exclusively and waits, the second's same request would
/// close the cycle.
fn refused_cost(attempts: usize, fairness: Fairness) -> f64 {
    let mut manager = manager(LockPolicy {
        fairness,
        deadlocks: Deadlocks::Refuse,
    });
    let shared = [Entry::shared(lock("node/s"))];
    let exclusive = [Entry::exclusive(lock("node/s"))];
    let (first, second) = (job_owner(1), job_owner(2));
    expect_granted(manager.try_update(&first, &shared));
    expect_granted(manager.try_update(&second, &shared));
    let update = manager
        .update_waiting(&first, 0, &exclusive)
        .expect("the first conversion waits");
    assert_eq!(update.blockers.len(), 1);
    let before = manager.changes();
    let started = Instant::now();
    for _ in 0..attempts {
        let refused = manager.update_waiting(black_box(&second), 0, black_box(&exclusive));
        assert!(
            matches!(refused, Err(LockError::Deadlock(ref cycle)) if cycle.len() == 2),
            "the second conversion closes a cycle of two: {refused:?}"
        );
    }
    let elapsed = started.elapsed();
    assert_eq!(manager.changes(), before, "a refusal changes nothing");
    nanos_per(attempts as u64, elapsed)
}

// ---------------------------------------------------------------------------
// Helpers

fn lock(text: &str) -> LockName {
    LockName::parse(text).expect("the bench's lock names are valid")
}

/// A job owner as a runner would be: job id, livelock file, pid.
fn job_owner(job_id: u64) -> Owner {
    let pid = 10_000 + u32::try_from(job_id).expect("bench job ids fit a pid");
    Owner::job(
        job_id,
        format!("/var/lib/warden/livelocks/job-{job_id}"),
        pid,
    )
}

fn rate(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

fn nanos_per(count: u64, elapsed: Duration) -> f64 {
    elapsed.as_nanos() as f64 / count as f64
}

fn owners(count: usize) -> String {
    counted(count, "owner")
}

// ---------------------------------------------------------------------------
// Output

/// What a figure needs beside it to mean something later: the machine, the
/// code, the build and the load.
fn print_context(options: &Options) {
    Context::read().print(
        "lock-bench: the warden lock core, in process, one thread",
        &options.text,
    );
    print_mode(options.quick, options.runs);
}
