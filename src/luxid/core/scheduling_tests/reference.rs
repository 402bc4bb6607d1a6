//! A property test of the core's scheduling against a naive reference
//! scheduler, written plainly from SCHEDULING.md ("How a pass decides")
//! and D60: random jobs (priorities, dependencies, reasons with
//! rate-limit buckets, workers), random filter rules added, replaced and
//! deleted, random ends of jobs (a runner that ends its job then exits,
//! one that dies and is reaped), cancels, priority changes, workers
//! given, and restarts of luxid that find runners it follows by pid,
//! dying ones and claimants (which record a pid, or let go of their job
//! unstarted). After every step the jobs the core started are the jobs the
//! reference starts, every job is where the reference has it, and on the
//! core's state: no more runners than `max_running_jobs`, no bucket or
//! `RATE_LIMIT` rule a job started in the step is in holds more than its
//! limit, and no queued job that may start is left while a slot is free.

use std::cell::Cell;

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestCaseError, TestRng, TestRunner};

use super::*;

const CASES: u32 = 512;

const SOURCES: [&str; 2] = ["gnt:client", "cron"];
/// Reason texts: buckets of 1, 2 and 3 places (two of the same label and
/// different sizes), plain reasons, and one a leading space makes plain.
const TEXTS: [&str; 7] = [
    "rate-limit:1:a",
    "rate-limit:2:a",
    "rate-limit:2:b",
    "rate-limit:3:c",
    "nightly",
    "backup",
    " rate-limit:1:a",
];
const UUIDS: [&str; 5] = ["r0", "r1", "r2", "r3", "r4"];
const TIMESTAMP: i64 = 1_700_000_000;

// ----- the steps -----

#[derive(Clone, Debug)]
struct NewJob {
    priority: i64,
    /// Picks among the jobs submitted before it.
    depends: Vec<usize>,
    /// Per opcode: its duration and its reasons (a source and a text).
    opcodes: Vec<(u64, Vec<(usize, usize)>)>,
    workers: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum Pred {
    AfterWatermark,
    UpToWatermark,
    IdBelow(u64),
    Reason(usize),
    Source(usize),
    DurationAtLeast(u64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Accept,
    Pause,
    Reject,
    Continue,
    RateLimit(u64),
}

/// A step; `usize` picks choose among the jobs (or rules) a step can
/// apply to, by id, and a step with none to choose from does nothing.
#[derive(Clone, Debug)]
enum Step {
    Submit {
        jobs: Vec<NewJob>,
        /// How many runners a commit spawns before it returns.
        commit_spawns: usize,
    },
    SetRule {
        uuid: usize,
        priority: u64,
        predicates: Vec<Pred>,
        action: Act,
    },
    DeleteRule(usize),
    /// A running job's runner writes its end.
    Finish(usize),
    /// The runner of a job that ended exits.
    Exit(usize),
    FinishAndExit(usize),
    /// A running job's runner records its pid and livelock in its file.
    Record(usize),
    /// A running job's runner finds the job held by another one (of a
    /// luxid before): that one is followed, as a claimant.
    FoundAnother(usize),
    /// A running job's runner dies with its job unfinished.
    Die(usize),
    /// A dead runner's job is ended, once its livelock is released.
    Reap(usize),
    Cancel(usize),
    Reprioritize(usize, i64),
    GiveWorkers(usize),
    /// luxid restarts, with this `max_running_jobs`: what it finds is
    /// what the job files say.
    Restart(usize),
    /// A claimant records its pid: followed by it.
    ClaimantRecords(usize),
    /// A claimant lets go of its job without recording a pid: the job
    /// never started.
    ClaimantLetsGo(usize),
}

impl Pred {
    fn to_json(&self) -> Value {
        match self {
            Pred::AfterWatermark => json!(["jobid", [">", "id", "watermark"]]),
            Pred::UpToWatermark => json!(["jobid", ["<=", "id", "watermark"]]),
            Pred::IdBelow(id) => json!(["jobid", ["<", "id", id]]),
            Pred::Reason(text) => json!(["reason", ["=", "reason", TEXTS[*text]]]),
            Pred::Source(source) => json!(["reason", ["=", "source", SOURCES[*source]]]),
            Pred::DurationAtLeast(seconds) => json!(["opcode", [">=", "duration", seconds]]),
        }
    }
}

impl Act {
    fn to_json(self) -> Value {
        match self {
            Act::Accept => json!("ACCEPT"),
            Act::Pause => json!("PAUSE"),
            Act::Reject => json!("REJECT"),
            Act::Continue => json!("CONTINUE"),
            Act::RateLimit(limit) => json!(["RATE_LIMIT", limit]),
        }
    }
}

fn new_job() -> impl Strategy<Value = NewJob> {
    let reason = (0..SOURCES.len(), 0..TEXTS.len());
    let opcode = (0u64..3, prop::collection::vec(reason, 0..=2));
    (
        prop::sample::select(vec![-10i64, 0, 0, 10]),
        prop::collection::vec(any::<usize>(), 0..=2),
        prop::collection::vec(opcode, 1..=2),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(priority, depends, opcodes, workers)| NewJob {
            priority,
            depends,
            opcodes,
            workers,
        })
}

fn predicate() -> impl Strategy<Value = Pred> {
    prop_oneof![
        Just(Pred::AfterWatermark),
        Just(Pred::UpToWatermark),
        (1u64..12).prop_map(Pred::IdBelow),
        (0..TEXTS.len()).prop_map(Pred::Reason),
        (0..SOURCES.len()).prop_map(Pred::Source),
        (0u64..3).prop_map(Pred::DurationAtLeast),
    ]
}

fn action() -> impl Strategy<Value = Act> {
    prop_oneof![
        2 => Just(Act::Accept),
        2 => Just(Act::Pause),
        1 => Just(Act::Reject),
        2 => Just(Act::Continue),
        4 => (1u64..=3).prop_map(Act::RateLimit),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (prop::collection::vec(new_job(), 1..=3), 0usize..4)
            .prop_map(|(jobs, commit_spawns)| Step::Submit { jobs, commit_spawns }),
        2 => (
            0..UUIDS.len(),
            0u64..3,
            prop::collection::vec(predicate(), 0..=2),
            action(),
        )
            .prop_map(|(uuid, priority, predicates, action)| Step::SetRule {
                uuid,
                priority,
                predicates,
                action,
            }),
        1 => any::<usize>().prop_map(Step::DeleteRule),
        2 => any::<usize>().prop_map(Step::Finish),
        2 => any::<usize>().prop_map(Step::Record),
        1 => any::<usize>().prop_map(Step::FoundAnother),
        2 => any::<usize>().prop_map(Step::Exit),
        3 => any::<usize>().prop_map(Step::FinishAndExit),
        1 => any::<usize>().prop_map(Step::Die),
        1 => any::<usize>().prop_map(Step::Reap),
        1 => any::<usize>().prop_map(Step::Cancel),
        1 => (any::<usize>(), prop::sample::select(vec![-20i64, -10, 0, 10, 19]))
            .prop_map(|(pick, priority)| Step::Reprioritize(pick, priority)),
        2 => any::<usize>().prop_map(Step::GiveWorkers),
        1 => (1usize..=4).prop_map(Step::Restart),
        1 => any::<usize>().prop_map(Step::ClaimantRecords),
        1 => any::<usize>().prop_map(Step::ClaimantLetsGo),
    ]
}

fn case() -> impl Strategy<Value = (usize, Vec<Step>)> {
    (1usize..=4, prop::collection::vec(step(), 1..80))
}

// ----- the reference -----

/// Where a job is, as the reference sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Queued,
    /// Started; its runner runs.
    Running,
    /// Started; its runner died, its job is not ended yet.
    Dying,
    /// Held by a runner that has not recorded its pid.
    Claimed,
    /// Its runner wrote its end and has not exited.
    Ended,
    /// Final, no runner.
    Done(Status),
}

#[derive(Clone, Debug)]
struct RefJob {
    id: JobId,
    priority: i64,
    depends: Vec<JobId>,
    /// `(source, text)` of every reason of every opcode.
    reasons: Vec<(&'static str, &'static str)>,
    durations: Vec<u64>,
    /// Asks for workers: whether it was given them.
    workers: Option<bool>,
    place: Place,
    /// Its file records its runner's pid and livelock.
    recorded: bool,
}

impl RefJob {
    fn has_runner(&self) -> bool {
        matches!(
            self.place,
            Place::Running | Place::Dying | Place::Claimed | Place::Ended
        )
    }

    fn started_unfinished(&self) -> bool {
        matches!(self.place, Place::Running | Place::Dying | Place::Claimed)
    }

    fn finished(&self) -> bool {
        matches!(self.place, Place::Ended | Place::Done(_))
    }

    /// Its ad-hoc buckets: each text `rate-limit:<n>:<label>` (n a
    /// positive integer) names the bucket `<n>:<label>` of n places.
    fn buckets(&self) -> BTreeMap<&'static str, u64> {
        let mut buckets = BTreeMap::new();
        for (_, text) in &self.reasons {
            if let Some(rest) = text.strip_prefix("rate-limit:")
                && let Some((count, _label)) = rest.split_once(':')
                && let Ok(limit) = count.parse::<u64>()
                && limit > 0
            {
                buckets.insert(rest, limit);
            }
        }
        buckets
    }
}

#[derive(Clone, Debug)]
struct RefRule {
    uuid: &'static str,
    priority: u64,
    watermark: u64,
    predicates: Vec<Pred>,
    action: Act,
}

impl RefRule {
    fn holds(&self, job: &RefJob) -> bool {
        self.predicates.iter().all(|predicate| match predicate {
            Pred::AfterWatermark => job.id > self.watermark,
            Pred::UpToWatermark => job.id <= self.watermark,
            Pred::IdBelow(id) => job.id < *id,
            Pred::Reason(text) => job.reasons.iter().any(|(_, given)| *given == TEXTS[*text]),
            Pred::Source(source) => job
                .reasons
                .iter()
                .any(|(given, _)| *given == SOURCES[*source]),
            Pred::DurationAtLeast(seconds) => job.durations.iter().any(|given| given >= seconds),
        })
    }
}

/// Why a queued job may not start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Why {
    Dependency,
    Workers,
    Pause,
    Reject,
    RuleFull,
    BucketFull,
}

/// What the started, unfinished jobs hold: places in buckets, slots of
/// `RATE_LIMIT` rules (by uuid).
#[derive(Clone, Debug, Default)]
struct Held {
    buckets: BTreeMap<&'static str, u64>,
    rules: BTreeMap<&'static str, u64>,
}

struct Reference {
    max_running: usize,
    serial: JobId,
    jobs: BTreeMap<JobId, RefJob>,
    rules: Vec<RefRule>,
}

impl Reference {
    /// The rule that applies to `job`: the first, in (priority,
    /// watermark, uuid) order, whose predicates all hold and whose action
    /// is not `CONTINUE`.
    fn applying(&self, job: &RefJob) -> Option<&RefRule> {
        let mut rules: Vec<&RefRule> = self.rules.iter().collect();
        rules.sort_by_key(|rule| (rule.priority, rule.watermark, rule.uuid));
        rules
            .into_iter()
            .find(|rule| rule.action != Act::Continue && rule.holds(job))
    }

    fn queued(&self) -> Vec<&RefJob> {
        let mut queued: Vec<&RefJob> = self
            .jobs
            .values()
            .filter(|job| job.place == Place::Queued)
            .collect();
        queued.sort_by_key(|job| (job.priority, job.id));
        queued
    }

    fn runners(&self) -> usize {
        self.jobs.values().filter(|job| job.has_runner()).count()
    }

    fn takes(&self, job: &RefJob, held: &mut Held) {
        for bucket in job.buckets().into_keys() {
            *held.buckets.entry(bucket).or_default() += 1;
        }
        if let Some(rule) = self.applying(job)
            && let Act::RateLimit(_) = rule.action
        {
            *held.rules.entry(rule.uuid).or_default() += 1;
        }
    }

    fn held(&self) -> Held {
        let mut held = Held::default();
        for job in self.jobs.values().filter(|job| job.started_unfinished()) {
            self.takes(job, &mut held);
        }
        held
    }

    /// Why `job` may not start, given what is held, or `None`: it may.
    fn why_not(&self, job: &RefJob, held: &Held) -> Option<Why> {
        let unfinished_dependency = job.depends.iter().any(|dep| {
            self.jobs
                .get(dep)
                .is_some_and(|dependency| !dependency.finished())
        });
        if unfinished_dependency {
            return Some(Why::Dependency);
        }
        if job.workers == Some(false) {
            return Some(Why::Workers);
        }
        match self.applying(job).map(|rule| (rule.uuid, rule.action)) {
            Some((_, Act::Pause)) => return Some(Why::Pause),
            Some((_, Act::Reject)) => return Some(Why::Reject),
            Some((uuid, Act::RateLimit(limit)))
                if held.rules.get(uuid).copied().unwrap_or(0) >= limit =>
            {
                return Some(Why::RuleFull);
            }
            _ => {}
        }
        let full = job
            .buckets()
            .into_iter()
            .any(|(bucket, limit)| held.buckets.get(bucket).copied().unwrap_or(0) >= limit);
        full.then_some(Why::BucketFull)
    }

    /// The queued jobs a pass starts: in (priority, id) order while slots
    /// are free, each that may start given the jobs running and the ones
    /// chosen before it.
    fn choose(&self) -> Vec<JobId> {
        let mut free = self.max_running.saturating_sub(self.runners());
        let mut held = self.held();
        let mut chosen = Vec::new();
        for job in self.queued() {
            if free == 0 {
                break;
            }
            if self.why_not(job, &held).is_some() {
                continue;
            }
            self.takes(job, &mut held);
            chosen.push(job.id);
            free -= 1;
        }
        chosen
    }

    /// Passes until nothing changes: the queued jobs a `REJECT` applies
    /// to are canceled (a write: they are final, and free the jobs that
    /// depend on them, only for the next pass), and the jobs chosen
    /// start. The jobs started.
    fn schedule(&mut self) -> BTreeSet<JobId> {
        let mut started = BTreeSet::new();
        loop {
            let rejected: Vec<JobId> = self
                .queued()
                .into_iter()
                .filter(|job| {
                    self.applying(job)
                        .is_some_and(|rule| rule.action == Act::Reject)
                })
                .map(|job| job.id)
                .collect();
            let chosen = self.choose();
            if chosen.is_empty() && rejected.is_empty() {
                return started;
            }
            for id in &chosen {
                self.set(*id, Place::Running);
            }
            for id in rejected {
                self.set(id, Place::Done(Status::Canceled));
            }
            started.extend(chosen);
        }
    }

    fn set(&mut self, id: JobId, place: Place) {
        self.jobs.get_mut(&id).expect("a known job").place = place;
    }

    /// The jobs in `place`, by id; `pick` chooses one.
    fn pick(&self, pick: usize, wanted: impl Fn(&RefJob) -> bool) -> Option<JobId> {
        let ids: Vec<JobId> = self
            .jobs
            .values()
            .filter(|job| wanted(job))
            .map(|job| job.id)
            .collect();
        (!ids.is_empty()).then(|| ids[pick % ids.len()])
    }
}

// ----- what the cases reached -----

/// Steps (over all cases) after which each situation held.
#[derive(Debug, Default)]
struct Reached {
    started: Cell<u64>,
    rejected: Cell<u64>,
    slots_full: Cell<u64>,
    dependency: Cell<u64>,
    workers: Cell<u64>,
    paused: Cell<u64>,
    rule_full: Cell<u64>,
    bucket_full: Cell<u64>,
    /// A job fell through a `CONTINUE` that held for it.
    continued: Cell<u64>,
    /// A watermark predicate held for some unfinished jobs and not others.
    watermark_split: Cell<u64>,
    /// A rule holds more started jobs than its limit (a rule changed).
    rule_overfull: Cell<u64>,
    dying_holds: Cell<u64>,
    claimed_holds: Cell<u64>,
    ended_holds: Cell<u64>,
    restarts: Cell<u64>,
    /// More runners than `max_running_jobs` (found at a start).
    over_limit: Cell<u64>,
    /// A claimant let go of its job.
    let_go: Cell<u64>,
}

fn bump(cell: &Cell<u64>, reached: bool) {
    if reached {
        cell.set(cell.get() + 1);
    }
}

fn note(reference: &Reference, started: &BTreeSet<JobId>, reached: &Reached) {
    let held = reference.held();
    let queued = reference.queued();
    let whys: BTreeSet<Option<Why>> = queued
        .iter()
        .map(|job| reference.why_not(job, &held))
        .collect();
    bump(&reached.started, !started.is_empty());
    bump(&reached.slots_full, whys.contains(&None));
    bump(&reached.dependency, whys.contains(&Some(Why::Dependency)));
    bump(&reached.workers, whys.contains(&Some(Why::Workers)));
    bump(&reached.paused, whys.contains(&Some(Why::Pause)));
    bump(&reached.rule_full, whys.contains(&Some(Why::RuleFull)));
    bump(&reached.bucket_full, whys.contains(&Some(Why::BucketFull)));
    let unfinished: Vec<&RefJob> = reference
        .jobs
        .values()
        .filter(|job| !job.finished())
        .collect();
    let mut ordered: Vec<&RefRule> = reference.rules.iter().collect();
    ordered.sort_by_key(|rule| (rule.priority, rule.watermark, rule.uuid));
    let continued = unfinished.iter().any(|job| {
        let applying = reference.applying(job).map(|rule| rule.uuid);
        ordered
            .iter()
            .take_while(|rule| Some(rule.uuid) != applying)
            .any(|rule| rule.action == Act::Continue && rule.holds(job))
            && applying.is_some()
    });
    bump(&reached.continued, continued);
    let split = reference.rules.iter().any(|rule| {
        rule.predicates
            .iter()
            .any(|predicate| matches!(predicate, Pred::AfterWatermark | Pred::UpToWatermark))
            && unfinished.iter().any(|job| rule.holds(job))
            && unfinished.iter().any(|job| !rule.holds(job))
    });
    bump(&reached.watermark_split, split);
    let overfull = reference.rules.iter().any(|rule| match rule.action {
        Act::RateLimit(limit) => held.rules.get(rule.uuid).copied().unwrap_or(0) > limit,
        _ => false,
    });
    bump(&reached.rule_overfull, overfull);
    let waiting = !queued.is_empty();
    bump(
        &reached.over_limit,
        reference.runners() > reference.max_running,
    );
    bump(
        &reached.dying_holds,
        waiting && reference.jobs.values().any(|job| job.place == Place::Dying),
    );
    bump(
        &reached.claimed_holds,
        waiting
            && reference
                .jobs
                .values()
                .any(|job| job.place == Place::Claimed),
    );
    bump(
        &reached.ended_holds,
        waiting && reference.jobs.values().any(|job| job.place == Place::Ended),
    );
}

// ----- driving both -----

/// The core's copy of a started job, ended by its runner.
fn ended(shell: &Shell, id: JobId) -> Job {
    let mut job = shell.core.job(id).expect("a known job").into_owned();
    job = with_status(job, Status::Success);
    job.end_timestamp = Some(crate::jobs::Timestamp(2000, 0));
    job
}

/// The core's copy of a started job as its runner writes it once it
/// runs: its pid and livelock recorded.
fn running_file(shell: &Shell, id: JobId) -> Job {
    let job = shell.core.job(id).expect("a known job").into_owned();
    let mut job = with_status(job, Status::Running);
    job.start_timestamp = Some(crate::jobs::Timestamp(1500, 0));
    job.livelock = Some(format!("/ll/job_{id:06}_1000"));
    job.process_id = Some(pid_of(id));
    job
}

/// luxid starts again and finds what the job files and the livelocks
/// say: every runner lives on (a dying one's job still holds its
/// livelock); one whose file records its pid is followed by it (dying:
/// by its livelock), one whose file does not is a claimant. An ended
/// job's runner is no longer counted. Workers are given again by wconfd
/// after a restart: the reference waits for them as for new ones.
fn restart(shell: &mut Shell, reference: &mut Reference) {
    let core = &shell.core;
    let mut jobs: Vec<Job> = core.unfinished().values().cloned().collect();
    jobs.extend(core.finished().values().map(|job| job.job()));
    let mut restored = Restored {
        serial: core.serial(),
        jobs,
        filter_rules: core.filter_rules().to_vec(),
        ..Restored::default()
    };
    for job in reference.jobs.values_mut() {
        match (job.place, job.recorded) {
            (Place::Running, true) => {
                restored.held.insert(job.id);
                restored.watched.insert(job.id);
            }
            (Place::Dying, true) => {
                restored.held.insert(job.id);
            }
            (Place::Running | Place::Dying | Place::Claimed, _) => {
                restored.held.insert(job.id);
                job.place = Place::Claimed;
            }
            (Place::Ended, _) => job.place = Place::Done(Status::Success),
            (Place::Queued | Place::Done(_), _) => {}
        }
        if job.workers.is_some() {
            job.workers = Some(false);
        }
    }
    let started = std::mem::take(&mut shell.started);
    *shell = Shell::new(reference.max_running, restored);
    shell.started = started;
}

/// Runs `step` on the shell and the reference; the jobs the core started.
fn apply(shell: &mut Shell, reference: &mut Reference, step: &Step) -> Option<Vec<JobId>> {
    let effects = match step {
        Step::Submit {
            jobs,
            commit_spawns,
        } => {
            let mut submitted = Vec::new();
            for new in jobs {
                let id = reference.serial + 1 + submitted.len() as u64;
                let mut depends: Vec<JobId> = match id - 1 {
                    0 => Vec::new(),
                    before => new
                        .depends
                        .iter()
                        .map(|pick| *pick as u64 % before + 1)
                        .collect(),
                };
                depends.sort_unstable();
                depends.dedup();
                let mut reasons = Vec::new();
                let mut opcodes = Vec::new();
                let mut durations = Vec::new();
                for (duration, entries) in &new.opcodes {
                    let entries: Vec<(&str, &str, i64)> = entries
                        .iter()
                        .map(|&(source, text)| (SOURCES[source], TEXTS[text], TIMESTAMP))
                        .collect();
                    reasons.extend(entries.iter().map(|&(source, text, _)| (source, text)));
                    opcodes.push(delay(*duration, &entries));
                    durations.push(*duration);
                }
                reference.jobs.insert(
                    id,
                    RefJob {
                        id,
                        priority: new.priority,
                        depends: depends.clone(),
                        reasons,
                        durations,
                        workers: new.workers.then_some(false),
                        place: Place::Queued,
                        recorded: false,
                    },
                );
                submitted.push(make_job(id, new.priority, &depends, new.workers, opcodes));
            }
            reference.serial += submitted.len() as u64;
            let effects = shell.submit(submitted);
            return Some(shell.settle(effects, *commit_spawns).0);
        }
        Step::SetRule {
            uuid,
            priority,
            predicates,
            action,
        } => {
            let uuid = UUIDS[*uuid];
            let known = reference.rules.iter().any(|rule| rule.uuid == uuid);
            reference.rules.retain(|rule| rule.uuid != uuid);
            reference.rules.push(RefRule {
                uuid,
                priority: *priority,
                watermark: reference.serial,
                predicates: predicates.clone(),
                action: *action,
            });
            let predicates = Value::Array(predicates.iter().map(Pred::to_json).collect());
            let rule =
                crate::scheduling::decode_rule(&json!(priority), &predicates, &action.to_json())
                    .expect("a good rule");
            shell.request(Command::ReplaceFilter {
                uuid: known.then(|| uuid.to_owned()),
                new_uuid: uuid.to_owned(),
                rule,
                reason_trail: Vec::new(),
            })
        }
        Step::DeleteRule(pick) => {
            if reference.rules.is_empty() {
                return None;
            }
            let mut uuids: Vec<&str> = reference.rules.iter().map(|rule| rule.uuid).collect();
            uuids.sort_unstable();
            let uuid = uuids[pick % uuids.len()];
            reference.rules.retain(|rule| rule.uuid != uuid);
            shell.request(Command::DeleteFilter {
                uuid: uuid.to_owned(),
            })
        }
        Step::Finish(pick) | Step::FinishAndExit(pick) => {
            let id = reference.pick(*pick, |job| {
                matches!(job.place, Place::Running | Place::Claimed)
            })?;
            let mut effects = shell.feed(Input::JobFileChanged {
                job: ended(shell, id),
            });
            if reference.jobs[&id].place == Place::Claimed {
                // A claimant's end needs no exit: it is not watched.
                reference.set(id, Place::Done(Status::Success));
            } else if let Step::FinishAndExit(_) = step {
                effects.extend(shell.feed(Input::RunnerExited {
                    id,
                    cause: None,
                    livelock_held: false,
                }));
                reference.set(id, Place::Done(Status::Success));
            } else {
                reference.set(id, Place::Ended);
            }
            effects
        }
        Step::Exit(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Ended)?;
            reference.set(id, Place::Done(Status::Success));
            shell.feed(Input::RunnerExited {
                id,
                cause: None,
                livelock_held: false,
            })
        }
        Step::Record(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Running && !job.recorded)?;
            reference.jobs.get_mut(&id).expect("picked").recorded = true;
            shell.feed(Input::JobFileChanged {
                job: running_file(shell, id),
            })
        }
        Step::FoundAnother(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Running && !job.recorded)?;
            reference.set(id, Place::Claimed);
            shell.feed(Input::RunnerExited {
                id,
                cause: None,
                livelock_held: true,
            })
        }
        Step::Die(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Running)?;
            reference.set(id, Place::Dying);
            shell.feed(Input::RunnerExited {
                id,
                cause: Some("was killed by signal 9"),
                livelock_held: false,
            })
        }
        Step::Reap(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Dying)?;
            reference.set(id, Place::Done(Status::Error));
            shell.feed(Input::Probed { id, released: true })
        }
        Step::Cancel(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Queued)?;
            reference.set(id, Place::Done(Status::Canceled));
            shell.request(Command::Cancel { id, kill: false })
        }
        Step::Reprioritize(pick, priority) => {
            let id = reference.pick(*pick, |job| job.place == Place::Queued)?;
            reference.jobs.get_mut(&id).expect("picked").priority = *priority;
            shell.request(Command::ChangePriority {
                id,
                priority: *priority,
            })
        }
        Step::GiveWorkers(pick) => {
            let id = reference.pick(*pick, |job| {
                job.place == Place::Queued && job.workers == Some(false)
            })?;
            reference.jobs.get_mut(&id).expect("picked").workers = Some(true);
            shell.feed(Input::WorkersAssigned {
                id,
                workers: vec![json!({"name": "w1"})],
            })
        }
        Step::Restart(max_running) => {
            reference.max_running = *max_running;
            restart(shell, reference);
            Vec::new()
        }
        Step::ClaimantRecords(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Claimed)?;
            let job = reference.jobs.get_mut(&id).expect("picked");
            job.place = Place::Running;
            job.recorded = true;
            shell.feed(Input::JobFileChanged {
                job: running_file(shell, id),
            })
        }
        Step::ClaimantLetsGo(pick) => {
            let id = reference.pick(*pick, |job| job.place == Place::Claimed)?;
            reference.set(id, Place::Queued);
            // It may start again.
            shell.started.retain(|started| *started != id);
            shell.feed(Input::Probed { id, released: true })
        }
    };
    let (started, replies) = shell.settle(effects, usize::MAX);
    for reply in replies {
        assert!(
            matches!(
                reply,
                Ok(Answer::FilterReplaced(_) | Answer::FilterDeleted | Answer::Outcome(true, _))
            ),
            "{step:?}: {reply:?}"
        );
    }
    Some(started)
}

/// Every job is where the reference has it, and the rules are the same.
fn compare(shell: &Shell, reference: &Reference, at: &str) -> Result<(), TestCaseError> {
    let core = &shell.core;
    let queued: BTreeSet<JobId> = core.queued().collect();
    for job in reference.jobs.values() {
        let id = job.id;
        let status = core.job(id).map(|job| job.status());
        let runner = core.runner(id);
        let (queued_too, runs, final_status) = match job.place {
            Place::Queued => (true, false, None),
            Place::Running => (false, matches!(runner, Some(Runner::Running { .. })), None),
            Place::Dying => (false, matches!(runner, Some(Runner::Dying { .. })), None),
            Place::Claimed => (false, matches!(runner, Some(Runner::Claimant { .. })), None),
            Place::Ended => (
                false,
                matches!(runner, Some(Runner::Running { .. })),
                Some(Status::Success),
            ),
            Place::Done(status) => (false, runner.is_none(), Some(status)),
        };
        prop_assert_eq!(
            queued.contains(&id),
            queued_too,
            "{}: job {} queued",
            at,
            id
        );
        if job.place != Place::Queued {
            prop_assert!(runs, "{}: job {} is {:?}: {:?}", at, id, job.place, runner);
        }
        match final_status {
            Some(expected) => prop_assert_eq!(status, Some(expected), "{}: job {}", at, id),
            None => prop_assert!(
                status.is_some_and(|status| !status.is_final()),
                "{}: job {} is unfinished: {:?}",
                at,
                id,
                status
            ),
        }
    }
    let mut rules: Vec<(String, u64, u64, Value, Value)> = reference
        .rules
        .iter()
        .map(|rule| {
            let predicates = Value::Array(rule.predicates.iter().map(Pred::to_json).collect());
            (
                rule.uuid.to_owned(),
                rule.priority,
                rule.watermark,
                predicates,
                rule.action.to_json(),
            )
        })
        .collect();
    rules.sort_by(|a, b| (a.1, a.2, &a.0).cmp(&(b.1, b.2, &b.0)));
    let in_core: Vec<(String, u64, u64, Value, Value)> = core
        .filter_rules()
        .iter()
        .map(|rule| {
            (
                rule.uuid.clone(),
                rule.priority,
                rule.watermark,
                rule.predicates_json.clone(),
                rule.action.to_json(),
            )
        })
        .collect();
    prop_assert_eq!(in_core, rules, "{}: the rules", at);
    Ok(())
}

/// The properties on the core's own state (which jobs it has started,
/// finished and queued), the rules' and buckets' meaning from the
/// reference: at most `max_running_jobs` runners (more only as found at
/// a start with a lower limit, and then nothing starts); every bucket and
/// `RATE_LIMIT` rule a job started in this step is in within its limit;
/// no queued job a `REJECT` applies to; and, while a slot is free, no
/// queued job that may start.
fn properties(
    shell: &Shell,
    reference: &Reference,
    started: &[JobId],
    at: &str,
) -> Result<(), TestCaseError> {
    let core = &shell.core;
    let runners = core.runners().len();
    prop_assert!(
        runners <= reference.max_running || started.is_empty(),
        "{}: {} runners for {}, {:?} started",
        at,
        runners,
        reference.max_running,
        started
    );
    let job = |id: JobId| reference.jobs.get(&id).expect("a known job");
    let mut held = Held::default();
    for id in core.unfinished().keys().filter(|id| core.is_started(**id)) {
        reference.takes(job(*id), &mut held);
    }
    for &id in started {
        for (bucket, limit) in job(id).buckets() {
            let holding = held.buckets.get(bucket).copied().unwrap_or(0);
            prop_assert!(
                holding <= limit,
                "{}: job {} started into bucket {} of {} holding {}",
                at,
                id,
                bucket,
                limit,
                holding
            );
        }
        if let Some(rule) = reference.applying(job(id))
            && let Act::RateLimit(limit) = rule.action
        {
            let holding = held.rules.get(rule.uuid).copied().unwrap_or(0);
            prop_assert!(
                holding <= limit,
                "{}: job {} started under rule {} of {} holding {}",
                at,
                id,
                rule.uuid,
                limit,
                holding
            );
        }
    }
    for id in core.queued() {
        let why = reference.why_not(job(id), &held);
        prop_assert!(
            why != Some(Why::Reject),
            "{}: job {} is queued with a REJECT applying",
            at,
            id
        );
        prop_assert!(
            runners >= reference.max_running || why.is_some(),
            "{}: job {} may start and a slot is free ({} runners of {})",
            at,
            id,
            runners,
            reference.max_running
        );
    }
    Ok(())
}

fn drive(max_running: usize, steps: &[Step], reached: &Reached) -> Result<(), TestCaseError> {
    let mut shell = Shell::new(max_running, Restored::default());
    let mut reference = Reference {
        max_running,
        serial: 0,
        jobs: BTreeMap::new(),
        rules: Vec::new(),
    };
    for (index, step) in steps.iter().enumerate() {
        let at = format!("step {index} ({step:?})");
        let Some(started) = apply(&mut shell, &mut reference, step) else {
            continue;
        };
        bump(&reached.restarts, matches!(step, Step::Restart(_)));
        bump(&reached.let_go, matches!(step, Step::ClaimantLetsGo(_)));
        let rejected_before = count_canceled(&reference);
        let expected = reference.schedule();
        let started_set: BTreeSet<JobId> = started.iter().copied().collect();
        prop_assert_eq!(&started_set, &expected, "{}: the jobs started", &at);
        compare(&shell, &reference, &at)?;
        properties(&shell, &reference, &started, &at)?;
        bump(
            &reached.rejected,
            count_canceled(&reference) > rejected_before,
        );
        note(&reference, &expected, reached);
    }
    Ok(())
}

fn count_canceled(reference: &Reference) -> usize {
    reference
        .jobs
        .values()
        .filter(|job| job.place == Place::Done(Status::Canceled))
        .count()
}

#[test]
fn the_core_starts_what_a_naive_reference_scheduler_starts() {
    let config = ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    // A fixed seed, so that a run is repeatable and CI never fails on a
    // case nobody ran before; `WARDEN_PROPTEST_RANDOM=1` explores fresh
    // cases instead.
    let mut runner = if std::env::var_os("WARDEN_PROPTEST_RANDOM").is_some() {
        TestRunner::new(config)
    } else {
        TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &[0x5c; 32]),
        )
    };
    let reached = Reached::default();
    let result = runner.run(&case(), |(max_running, steps)| {
        drive(max_running, &steps, &reached)
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    let minima = [
        ("started", reached.started.get(), 500),
        ("rejected", reached.rejected.get(), 50),
        ("slots_full", reached.slots_full.get(), 200),
        ("dependency", reached.dependency.get(), 200),
        ("workers", reached.workers.get(), 100),
        ("paused", reached.paused.get(), 100),
        ("rule_full", reached.rule_full.get(), 100),
        ("bucket_full", reached.bucket_full.get(), 100),
        ("continued", reached.continued.get(), 50),
        ("watermark_split", reached.watermark_split.get(), 100),
        ("rule_overfull", reached.rule_overfull.get(), 20),
        ("dying_holds", reached.dying_holds.get(), 50),
        ("claimed_holds", reached.claimed_holds.get(), 50),
        ("ended_holds", reached.ended_holds.get(), 50),
        ("restarts", reached.restarts.get(), 100),
        ("let_go", reached.let_go.get(), 30),
        ("over_limit", reached.over_limit.get(), 30),
    ];
    for (what, count, minimum) in minima {
        assert!(
            count >= minimum,
            "only {count} steps reached {what} (at least {minimum}): {reached:?}"
        );
    }
}
