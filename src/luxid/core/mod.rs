//! luxid's queue as a pure state machine, driven as
//! [`QueueCore::handle`]`(input, now) -> effects` (JOBS.md, LIVENESS.md).
//!
//! It owns the jobs (unfinished ones as [`Job`], finished ones in their
//! compact [`FinishedJob`] form), the queued set in start order
//! (priority, id), the held `WaitForJobChange`s, the runner of each started
//! job as one [`Runner`] value, the serial, the drain flag and the
//! scheduler. It does no I/O and reads no clock: the shell (`server.rs`)
//! turns sockets, pidfds, inotify and the disk into [`Input`]s, and carries
//! out the [`Effect`]s. A change that must be durable is asked for as an
//! [`Action`] with a [`Ticket`]; the core applies it, and answers the
//! request that wanted it, only once the shell reports it done
//! ([`Input::Done`]): a refused write refuses the request and changes
//! nothing.
//!
//! [`QueueCore::check_invariants`] holds after every `handle`; debug builds
//! check it there.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::RandomState;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::jobs::runner_contract::livelock_secs;
use crate::jobs::{
    Job, JobId, LogEntry, Status, canceled_by_request, digest_values, exec_error, opcode,
};
use crate::limits::SUBMIT_MANY_JOBS_MAX;
use crate::liveness::job_livelock_name;
use crate::queue::FinishedJob;

mod events;
mod requests;
mod runners;
mod scheduling;
#[cfg(test)]
mod scheduling_tests;
#[cfg(test)]
mod tests;
mod why;
mod workers;

use crate::limits::{DEAD_JOB_WRITE_RETRY_INTERVAL, RELEASE_PROBE_INTERVAL};

pub use events::{JobEvents, NewEvent};
pub use scheduling::{ClockOrigin, unique_key};
pub use why::{FittingWorker, Listed, ListedWorker, Reason, WhyJob};

/// A client connection, as the shell names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Conn(pub usize);

impl Conn {
    /// luxid itself, as the submitter of a worker's prepare job and the
    /// canceler of one that lost to a newer state: its answers go nowhere.
    pub const LUXID: Conn = Conn(usize::MAX);
}

/// A change the core asked the shell to make durable (or to do, for a
/// kill whose failure is the answer), named in its [`Input::Done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

/// What the core is built with.
#[derive(Clone, Debug)]
pub struct Config {
    pub max_running_jobs: usize,
    pub queue_jobs_max: usize,
    /// Where runners keep their livelocks (a job's is named for its
    /// submission, see [`runner_livelock`]).
    pub livelock_dir: PathBuf,
    /// The wall clock against the core's, for `start_by`.
    pub clock: ClockOrigin,
}

/// The queue as found on disk at start-up, with what the shell found out
/// about the runners of its unfinished jobs.
#[derive(Debug, Default)]
pub struct Restored {
    pub serial: JobId,
    pub drained: bool,
    pub jobs: Vec<Job>,
    pub finished: Vec<FinishedJob>,
    /// The livelocks finished jobs name that still exist: each is removed
    /// if released (its runner was killed after its job's end, with the
    /// luxid that followed it).
    pub finished_livelocks: Vec<PathBuf>,
    /// Unfinished jobs whose runner's livelock ([`runner_livelock`]) is
    /// held: a runner lives.
    pub held: BTreeSet<JobId>,
    /// Of those with a recorded pid, the ones whose process the shell
    /// watches (its pidfd opened).
    pub watched: BTreeSet<JobId>,
    /// What the event sequence said of the jobs (its checkpoint and the
    /// events after it): the start gives what it missed.
    pub events: JobEvents,
    /// The archived files of jobs the sequence has not said finished and
    /// the queue has no more (archived after their end, which the
    /// sequence lost): their end is told before their archiving.
    pub archived: Vec<Job>,
    /// The job filter rules.
    pub filter_rules: Vec<crate::scheduling::filters::FilterRule>,
}

/// A signal luxid sends a runner, which the runner handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerSignal {
    /// SIGTERM: cancel the job.
    Cancel,
    /// SIGUSR1: apply the priority request file.
    Priority,
}

/// One job of a submission, as the shell made it.
#[derive(Clone, Debug, PartialEq)]
pub enum Submission {
    /// A new job, with the id the core will give it (`serial + 1`, `+ 2`,
    /// ... over the new ones of the submission); `start_by`: when it
    /// must have started (its first opcode's `start_by`, as a deadline).
    New(Job),
    /// Its `unique_key` is the key of this unfinished job: answered with
    /// its id, nothing created (SCHEDULING.md).
    Live(JobId),
    /// Why its opcodes were refused.
    Refused(String),
}

/// A request, decoded and checked as far as it can be without the queue.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// New jobs of one submission. `many`: answered as `SubmitManyJobs`.
    Submit {
        jobs: Vec<Submission>,
        ignore_drain: bool,
        many: bool,
    },
    Cancel {
        id: JobId,
        kill: bool,
    },
    ChangePriority {
        id: JobId,
        priority: i64,
    },
    Archive {
        id: JobId,
    },
    /// `now_secs`: the wall clock, for the jobs' ages.
    AutoArchive {
        age: Option<Duration>,
        timeout: Option<Duration>,
        now_secs: f64,
    },
    SetDrain {
        drained: bool,
    },
    WaitForChange {
        id: JobId,
        fields: Vec<&'static str>,
        previous: Value,
        log_serial: u64,
        timeout: Duration,
    },
    /// Adds (`uuid` `None`: as `new_uuid`) or replaces a filter rule;
    /// `reason_trail`: the client's reasons and luxid's.
    ReplaceFilter {
        uuid: Option<String>,
        new_uuid: String,
        rule: crate::scheduling::RuleParts,
        reason_trail: Vec<Value>,
    },
    DeleteFilter {
        uuid: String,
    },
}

/// A typed answer; the shell encodes it.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Submitted(JobId),
    /// Per job: its id, or why it was refused.
    SubmittedMany(Vec<Result<JobId, String>>),
    /// `[success, message]` of a cancel or a priority change.
    Outcome(bool, String),
    Archived(bool),
    AutoArchived {
        archived: usize,
        left: usize,
    },
    DrainSet,
    /// A `WaitForJobChange` answer: the fields' values, newer log entries.
    Change {
        values: Value,
        log: Vec<LogEntry>,
    },
    /// The uuid of the rule added or replaced.
    FilterReplaced(String),
    FilterDeleted,
}

/// Why a request was refused; the shell words it on the wire.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    Drained,
    TooManyJobs(usize),
    QueueFull {
        jobs: usize,
        max: usize,
    },
    /// A job's opcodes were refused (`OpPrereqError`).
    Prereq(String),
    /// A job the wait was for is not in the queue (any more).
    JobLost(JobId),
    /// A request failed for a reason given in full (a write refused).
    Failed(String),
}

pub type Reply = Result<Answer, Refusal>;

/// What the shell tells the core.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Request {
        conn: Conn,
        command: Command,
    },
    /// A connection went away: its held wait is dropped.
    ConnectionGone {
        conn: Conn,
    },
    /// An [`Action`] was carried out (`Err`: why not).
    Done {
        ticket: Ticket,
        result: Result<(), String>,
    },
    /// A runner asked for with [`Effect::Spawn`] started (and is watched).
    Spawned {
        id: JobId,
        pid: u32,
    },
    SpawnFailed {
        id: JobId,
        error: String,
    },
    /// The turn's new jobs ([`Effect::Commit`]) are durable, or not; the
    /// runners started meanwhile, in order, with their pid or error.
    Committed {
        result: Result<(), String>,
        spawned: Vec<(JobId, Result<u32, String>)>,
    },
    /// A runner's process ended. `cause`: what its exit status says it
    /// died of; `livelock_held`: whether the job's livelock is held (by
    /// another runner) now.
    RunnerExited {
        id: JobId,
        cause: Option<&'static str>,
        livelock_held: bool,
    },
    /// A started job's file, re-read after it changed.
    JobFileChanged {
        job: Job,
    },
    /// A watched livelock was closed: probe it now.
    LivelockClosed {
        id: JobId,
    },
    /// The status in the job file [`Effect::ReadJobStatus`] asked for
    /// (`None`: no file, or one that cannot be read).
    JobStatusRead {
        ticket: Ticket,
        status: Option<Status>,
    },
    /// The answer to [`Effect::Probe`]; the shell re-read the job file
    /// ([`Input::JobFileChanged`]) first if it was released.
    Probed {
        id: JobId,
        released: bool,
    },
    /// wconfd gave a job its workers (as its programs see them).
    WorkersAssigned {
        id: JobId,
        workers: Vec<Value>,
    },
    /// wconfd says the job must end `error` (a worker it holds failed, or
    /// none it asks for can be any more).
    EndJob {
        id: JobId,
        reason: String,
    },
    /// The requests of a turn were handled: watchers of changed jobs are
    /// answered, new jobs committed, queued ones started.
    EndTurn,
    /// Time passed: probes and waits that are due.
    Tick,
}

/// A durable change or an acknowledged signal the core waits for.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Replace the file of a job luxid owns (not started, or its runner
    /// dead).
    WriteJob(Job),
    Archive(JobId),
    SetDrain(bool),
    /// The priority request file of a started job.
    WritePriorityRequest {
        id: JobId,
        priority: i64,
    },
    /// SIGKILL the process group of a job's runner (cancel with kill).
    KillGroup {
        id: JobId,
        pid: u32,
    },
    /// Replace the stored filter rules with these.
    WriteFilters(Vec<crate::scheduling::filters::FilterRule>),
}

/// What the core asks of the shell.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Append these to the event sequence, in order (each describes a
    /// change already durable).
    Events(Vec<NewEvent>),
    /// The answer to the request being handled.
    Reply {
        conn: Conn,
        reply: Reply,
    },
    /// The request being handled is held until `deadline`.
    Hold {
        conn: Conn,
        deadline: Instant,
    },
    /// The answer to a held request.
    Release {
        conn: Conn,
        reply: Reply,
    },
    Do {
        ticket: Ticket,
        action: Action,
    },
    /// Make the new jobs durable together; while that runs, start the
    /// runners of `start` in order (they wait for the commit), stopping
    /// once it returns; report with [`Input::Committed`].
    Commit {
        jobs: Vec<JobId>,
        start: Vec<JobId>,
    },
    /// Read the status in a job's file now; report with
    /// [`Input::JobStatusRead`].
    ReadJobStatus {
        ticket: Ticket,
        id: JobId,
    },
    /// Start a runner of a durable job; report with [`Input::Spawned`] or
    /// [`Input::SpawnFailed`].
    Spawn {
        id: JobId,
    },
    /// Watch a runner another luxid started (its pid recorded now); if it
    /// is gone already, report [`Input::RunnerExited`].
    WatchRunner {
        id: JobId,
        pid: u32,
    },
    Signal {
        id: JobId,
        pid: u32,
        signal: RunnerSignal,
    },
    /// SIGKILL the process group of a runner (nothing to answer).
    KillGroup {
        id: JobId,
        pid: u32,
    },
    /// Watch a livelock for its release (inotify), until unwatched.
    WatchLivelock {
        id: JobId,
        path: PathBuf,
    },
    UnwatchLivelock {
        id: JobId,
    },
    /// Probe whether the livelock is released; report with
    /// [`Input::Probed`].
    Probe {
        id: JobId,
        path: PathBuf,
    },
    /// Remove a livelock if it is released (a runner killed after it
    /// finished its job leaves it behind).
    RemoveLivelock {
        path: PathBuf,
    },
    RemovePriorityRequest {
        id: JobId,
    },
    /// Ask wconfd to free the locks of a dead job's owner.
    FreeLocks {
        id: JobId,
        livelock: String,
        pid: u32,
    },
    /// Ask wconfd for a durable job's workers (again, after a restart).
    RequestWorkers {
        id: JobId,
        priority: i64,
        request: crate::workers::Request,
    },
    /// Tell wconfd the job that asked for workers ended.
    ReleaseWorkers {
        id: JobId,
        status: Status,
    },
    /// Tell wconfd a worker's prepare job ended.
    PrepareEnded {
        of: opcode::PrepareOf,
        status: Status,
        reason: String,
    },
}

/// Signals for a runner whose pid is not known yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deferred {
    pub cancel: bool,
    pub priority: bool,
    pub kill: bool,
}

/// The runner of a started job.
#[derive(Clone, Debug, PartialEq)]
pub enum Runner {
    /// Asked for ([`Effect::Spawn`]), not reported yet.
    Starting { deferred: Deferred },
    /// A runner this luxid started, or adopted by its pid.
    Running { pid: u32 },
    /// A runner a previous luxid started: it holds the job's livelock but
    /// has not recorded its pid yet; followed by probes until it does, or
    /// lets go.
    Claimant {
        next_probe: Instant,
        deferred: Deferred,
    },
    /// The runner exited with its job unfinished: its process group was
    /// killed, its livelock is awaited, then the job's end is written
    /// (again after a refused write).
    Dying {
        cause: Option<&'static str>,
        livelock: PathBuf,
        next_probe: Instant,
        failed_writes: u32,
        /// The job's end as the runner wrote it before it died: taken once
        /// every process of the job is gone.
        ended: Option<Box<Job>>,
    },
}

#[derive(Clone, Debug)]
struct Started {
    runner: Runner,
    /// The job's livelock: removed when the runner is done, if left.
    livelock: PathBuf,
    /// A cancel or kill was asked of this runner: its death is never
    /// retried (`on_death`).
    cancel_asked: bool,
}

/// A held `WaitForJobChange`. What it holds is small whatever the request
/// was: known field names, and the values the client has as a digest.
#[derive(Clone, Debug)]
struct Watcher {
    id: JobId,
    fields: Vec<&'static str>,
    seen_digest: u64,
    log_serial: u64,
    deadline: Instant,
}

/// What an [`Action`] was for: applied once it is done.
#[derive(Clone, Debug)]
enum Pending {
    /// A cancel signalled to a running runner, answered from its file.
    CancelAnswer {
        conn: Conn,
        id: JobId,
    },
    Dequeue {
        conn: Conn,
        job: Job,
    },
    Reprioritize {
        conn: Conn,
        job: Job,
        priority: i64,
    },
    Kill {
        conn: Conn,
        id: JobId,
    },
    PriorityRequest {
        conn: Conn,
        id: JobId,
        priority: i64,
    },
    Archive {
        conn: Conn,
        id: JobId,
    },
    AutoArchive {
        conn: Conn,
        id: JobId,
        progress: AutoArchiving,
    },
    Drain {
        conn: Conn,
        drained: bool,
    },
    SpawnFailed {
        job: Job,
    },
    DeadEnd {
        job: Job,
    },
    /// A dead runner's job, queued again for its next attempt
    /// (`on_death`); `owner`: the dead runner's livelock and pid, whose
    /// locks are freed.
    DeadRetry {
        job: Job,
        owner: Option<(String, u32)>,
        not_before: Instant,
    },
    /// A job not started that wconfd said must end.
    Ended {
        job: Job,
    },
    /// A queued job the scheduler canceled: a `REJECT` rule applies, or
    /// its `start_by` passed.
    SchedulerCanceled {
        job: Job,
    },
    /// The filter rules of a `ReplaceFilter` or `DeleteFilter`.
    Filters {
        conn: Conn,
        rules: Vec<crate::scheduling::filters::FilterRule>,
        answer: Answer,
    },
}

#[derive(Clone, Debug)]
struct AutoArchiving {
    /// Candidates not tried yet, last first.
    rest: Vec<JobId>,
    total: usize,
    checked: usize,
    archived: usize,
    started: Instant,
    timeout: Option<Duration>,
}

/// What the SIGUSR2 dump says of one runner.
#[derive(Clone, Debug)]
pub struct RunnerDump {
    pub id: JobId,
    pub runner: Runner,
}

/// luxid's queue.
pub struct QueueCore {
    config: Config,
    serial: JobId,
    drained: bool,
    /// Every unfinished job.
    jobs: BTreeMap<JobId, Job>,
    /// The jobs each unfinished job depends on (parsed once).
    depends: BTreeMap<JobId, Vec<JobId>>,
    finished: BTreeMap<JobId, FinishedJob>,
    /// Jobs not started, in start order.
    queued: BTreeSet<(i64, JobId)>,
    runners: BTreeMap<JobId, Started>,
    /// How many runners start-up found: they may exceed the limit.
    restored_runners: usize,
    watchers: BTreeMap<Conn, Watcher>,
    digest_keys: RandomState,
    pending: BTreeMap<Ticket, Pending>,
    next_ticket: u64,
    /// New jobs of this turn, committed at its end.
    new_jobs: Vec<JobId>,
    /// Jobs changed since the last turn's end (their watchers are checked).
    changed: BTreeSet<JobId>,
    /// What the unfinished jobs asking for workers ask (WORKERS.md).
    worker_requests: BTreeMap<JobId, crate::workers::Request>,
    /// The workers wconfd gave them: only these jobs may start.
    assigned: BTreeMap<JobId, Vec<Value>>,
    /// Started jobs wconfd said must end, with the reason their `error`
    /// gives once their runner is gone.
    doomed: BTreeMap<JobId, String>,
    /// Prepare jobs of workers by the prepare they run, and back.
    prepare_jobs: BTreeMap<opcode::PrepareOf, JobId>,
    prepare_of: BTreeMap<JobId, opcode::PrepareOf>,
    /// Effects of jobs ending, added to the effects of the current input.
    ended: Vec<Effect>,
    /// What the event sequence has said of each job.
    events: JobEvents,
    /// The filter rules, and each job's applying rule and buckets.
    scheduling: scheduling::Scheduling,
    /// Queued jobs whose runner died and whose death is retried: not
    /// started before this time (the `retry` backoff).
    backoff: BTreeMap<JobId, Instant>,
}

/// Where a runner of `job` keeps its livelock: the recorded one, else the
/// one named for the job's submission (so a runner that has not recorded
/// it yet is found all the same).
pub fn runner_livelock(livelock_dir: &Path, job: &Job) -> PathBuf {
    match &job.livelock {
        Some(path) => PathBuf::from(path),
        None => named_livelock(livelock_dir, job),
    }
}

fn named_livelock(livelock_dir: &Path, job: &Job) -> PathBuf {
    livelock_dir.join(job_livelock_name(job.id, livelock_secs(job)))
}

/// The jobs `job` depends on, from its opcodes (absolute ids; an opcode
/// that does not parse depends on nothing).
fn dependencies(job: &Job) -> Vec<JobId> {
    let mut ids: Vec<JobId> = job
        .ops
        .iter()
        .filter_map(|op| opcode::parse(&op.input).ok())
        .flat_map(|op| op.common.depends)
        .filter_map(|dependency| JobId::try_from(dependency.job).ok())
        .filter(|&dep| dep != job.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl QueueCore {
    /// The core of a queue found on disk: runners that live are followed
    /// (by pid, or as claimants), jobs whose runner died are ended (by
    /// the effects returned, carried out before serving), the rest queued.
    pub fn new(
        config: Config,
        restored: Restored,
        digest_keys: RandomState,
        now: Instant,
    ) -> (QueueCore, Vec<Effect>) {
        let mut core = QueueCore {
            config,
            serial: restored.serial,
            drained: restored.drained,
            jobs: BTreeMap::new(),
            depends: BTreeMap::new(),
            finished: restored
                .finished
                .into_iter()
                .map(|job| (job.id, job))
                .collect(),
            queued: BTreeSet::new(),
            runners: BTreeMap::new(),
            restored_runners: 0,
            watchers: BTreeMap::new(),
            digest_keys,
            pending: BTreeMap::new(),
            next_ticket: 0,
            new_jobs: Vec::new(),
            changed: BTreeSet::new(),
            worker_requests: BTreeMap::new(),
            assigned: BTreeMap::new(),
            doomed: BTreeMap::new(),
            prepare_jobs: BTreeMap::new(),
            prepare_of: BTreeMap::new(),
            ended: Vec::new(),
            events: restored.events,
            scheduling: scheduling::Scheduling::default(),
            backoff: BTreeMap::new(),
        };
        let mut effects: Vec<Effect> = restored
            .finished_livelocks
            .into_iter()
            .map(|path| Effect::RemoveLivelock { path })
            .collect();
        core.reconcile_events(&restored.jobs, &restored.archived);
        for job in restored.jobs {
            let id = job.id;
            core.serial = core.serial.max(id);
            if job.is_final() {
                core.finished.insert(id, FinishedJob::new(&job));
                continue;
            }
            let livelock = runner_livelock(&core.config.livelock_dir, &job);
            let held = restored.held.contains(&id);
            let runner = match (&job.livelock, job.process_id) {
                (None, _) if held => Some(Runner::Claimant {
                    next_probe: now,
                    deferred: Deferred::default(),
                }),
                (None, _) => None,
                (Some(_), Some(pid)) if held && restored.watched.contains(&id) => {
                    Some(Runner::Running { pid })
                }
                (Some(_), _) => {
                    // A runner without a process to watch is followed by
                    // its livelock; one whose livelock is released died
                    // while luxid was down: its job ends at the first tick.
                    if held {
                        effects.push(Effect::WatchLivelock {
                            id,
                            path: livelock.clone(),
                        });
                    }
                    Some(Runner::Dying {
                        cause: None,
                        livelock: livelock.clone(),
                        next_probe: now,
                        failed_writes: 0,
                        ended: None,
                    })
                }
            };
            match runner {
                Some(runner) => {
                    core.runners.insert(
                        id,
                        Started {
                            runner,
                            livelock,
                            cancel_asked: false,
                        },
                    );
                }
                None => {
                    core.queued.insert((job.priority(), id));
                }
            }
            core.depends.insert(id, dependencies(&job));
            core.note_worker_parts(&job);
            if let Some(request) = core.worker_requests.get(&id)
                && !core.runners.contains_key(&id)
            {
                // Asked again: wconfd answers a request it has with
                // nothing new (it may never have had it).
                effects.push(Effect::RequestWorkers {
                    id,
                    priority: job.priority(),
                    request: request.clone(),
                });
            }
            core.jobs.insert(id, job);
        }
        for id in core.finished.keys() {
            core.serial = core.serial.max(*id);
        }
        core.scheduling
            .set_rules(restored.filter_rules, std::iter::empty());
        for job in core.jobs.values() {
            let started = core.runners.contains_key(&job.id);
            core.scheduling.admit(job, !started, &core.config.clock);
        }
        core.restored_runners = core.runners.len();
        let max_running = core.config.max_running_jobs;
        core.events.started(max_running, core.drained);
        core.push_events(&mut effects);
        core.debug_check();
        (core, effects)
    }

    /// What the sequence missed while luxid was down (or had not yet seen
    /// when it crashed): every job's missing steps, in id order, and the
    /// archiving of jobs no longer in the queue.
    fn reconcile_events(&mut self, jobs: &[Job], archived: &[Job]) {
        let mut present = BTreeSet::new();
        let mut in_order: Vec<&Job> = jobs.iter().collect();
        in_order.sort_by_key(|job| job.id);
        let mut finished = self.finished.values().peekable();
        for job in in_order {
            // The finished jobs in between, by id, so that submissions are
            // said in id order.
            while let Some(done) = finished.next_if(|done| done.id < job.id) {
                present.insert(done.id);
                if !self.events.said_finished(done.id) {
                    self.events.observe(&done.job());
                }
            }
            present.insert(job.id);
            self.events.observe(job);
        }
        for done in finished {
            present.insert(done.id);
            if !self.events.said_finished(done.id) {
                self.events.observe(&done.job());
            }
        }
        let gone: Vec<JobId> = self
            .events
            .known()
            .filter(|id| !present.contains(id))
            .collect();
        for id in gone {
            if let Some(job) = archived.iter().find(|job| job.id == id) {
                self.events.observe(job);
            }
            self.events.archived(id);
        }
    }

    /// The input's events go first: the shell carries out what later
    /// effects lead to (with their own events) before the effects after
    /// them, and the sequence must keep the order the changes were made.
    fn push_events(&mut self, effects: &mut Vec<Effect>) {
        let events = self.events.take();
        if !events.is_empty() {
            effects.insert(0, Effect::Events(events));
        }
    }

    /// Runs one input.
    pub fn handle(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let mut effects = Vec::new();
        match input {
            Input::Request { conn, command } => self.request(conn, command, now, &mut effects),
            Input::ConnectionGone { conn } => {
                self.watchers.remove(&conn);
            }
            Input::JobStatusRead { ticket, status } => {
                self.status_read(ticket, status, &mut effects)
            }
            Input::Done { ticket, result } => self.done(ticket, result, now, &mut effects),
            Input::Spawned { id, pid } => self.spawned(id, pid, &mut effects),
            Input::SpawnFailed { id, error } => self.spawn_failed(id, &error, &mut effects),
            Input::Committed { result, spawned } => {
                self.committed(result, spawned, now, &mut effects)
            }
            Input::RunnerExited {
                id,
                cause,
                livelock_held,
            } => self.runner_exited(id, cause, livelock_held, now, &mut effects),
            Input::JobFileChanged { job } => self.job_file_changed(job, now, &mut effects),
            Input::LivelockClosed { id } => {
                if let Some(Started {
                    runner: Runner::Dying { next_probe, .. },
                    ..
                }) = self.runners.get_mut(&id)
                {
                    *next_probe = now;
                }
            }
            Input::Probed { id, released } => self.probed(id, released, now, &mut effects),
            Input::WorkersAssigned { id, workers } => {
                self.workers_assigned(id, workers, now, &mut effects)
            }
            Input::EndJob { id, reason } => self.end_job(id, reason, &mut effects),
            Input::EndTurn => self.end_turn(now, &mut effects),
            Input::Tick => self.tick(now, &mut effects),
        }
        effects.append(&mut self.ended);
        self.push_events(&mut effects);
        self.debug_check();
        effects
    }

    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    // ----- read-only accessors -----

    /// What the event sequence has said of the jobs, in its saved form
    /// (luxid's checkpoint).
    pub fn saved_events(&self) -> Value {
        self.events.save()
    }

    /// A job of the queue (not archived), decoded if it is finished.
    pub fn job(&self, id: JobId) -> Option<Cow<'_, Job>> {
        match self.jobs.get(&id) {
            Some(job) => Some(Cow::Borrowed(job)),
            None => self.finished.get(&id).map(|job| Cow::Owned(job.job())),
        }
    }

    pub fn unfinished(&self) -> &BTreeMap<JobId, Job> {
        &self.jobs
    }

    pub fn finished(&self) -> &BTreeMap<JobId, FinishedJob> {
        &self.finished
    }

    pub fn job_count(&self) -> usize {
        self.jobs.len() + self.finished.len()
    }

    /// The last id handed out.
    pub fn serial(&self) -> JobId {
        self.serial
    }

    pub fn is_drained(&self) -> bool {
        self.drained
    }

    /// Whether the job has a runner (its file may change behind luxid).
    pub fn is_started(&self, id: JobId) -> bool {
        self.runners.contains_key(&id)
    }

    pub fn runner(&self, id: JobId) -> Option<&Runner> {
        self.runners.get(&id).map(|started| &started.runner)
    }

    /// The livelock a started job's runner holds (or held).
    pub fn livelock(&self, id: JobId) -> Option<&Path> {
        self.runners
            .get(&id)
            .map(|started| started.livelock.as_path())
    }

    /// Jobs not started, in start order.
    pub fn queued(&self) -> impl Iterator<Item = JobId> + '_ {
        self.queued.iter().map(|&(_, id)| id)
    }

    pub fn runners(&self) -> Vec<RunnerDump> {
        self.runners
            .iter()
            .map(|(&id, started)| RunnerDump {
                id,
                runner: started.runner.clone(),
            })
            .collect()
    }

    pub fn watcher_count(&self) -> usize {
        self.watchers.len()
    }

    /// When the core next has something to do without an event: a probe
    /// or a wait's deadline.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let probes = self
            .runners
            .values()
            .filter_map(|started| match &started.runner {
                Runner::Claimant { next_probe, .. } | Runner::Dying { next_probe, .. } => {
                    Some(*next_probe)
                }
                _ => None,
            });
        let deadlines = self.watchers.values().map(|watcher| watcher.deadline);
        probes
            .chain(deadlines)
            .chain(self.scheduling.next_deadline())
            .chain(self.backoff.values().copied())
            .min()
    }

    // ----- the queue's state -----

    /// Takes a job out of the queued set; whether it was in it.
    fn unqueue(&mut self, id: JobId) -> bool {
        match self.jobs.get(&id) {
            Some(job) => self.queued.remove(&(job.priority(), id)),
            None => false,
        }
    }

    /// Keeps `job` as the queue's copy: finished ones encoded.
    /// Every copy put here is durable (a commit, a write luxid made, a
    /// runner's file), so the event sequence hears of it here.
    fn put(&mut self, job: Job) {
        let id = job.id;
        self.events.observe(&job);
        if job.is_final() {
            if self.jobs.contains_key(&id) {
                self.job_ended(&job);
            }
            self.unqueue(id);
            self.backoff.remove(&id);
            // A new job canceled before its commit was written whole.
            self.new_jobs.retain(|&new| new != id);
            self.jobs.remove(&id);
            self.depends.remove(&id);
            self.scheduling.forget(&job);
            self.finished.insert(id, FinishedJob::new(&job));
        } else {
            self.jobs.insert(id, job);
        }
        self.changed.insert(id);
    }

    fn archived(&mut self, id: JobId) {
        self.finished.remove(&id);
        self.events.archived(id);
        if let Some(of) = self.prepare_of.remove(&id) {
            self.prepare_jobs.remove(&of);
        }
        self.changed.insert(id);
    }

    /// Sends `signal` to a job's runner now, or once its pid is known.
    fn signal(&mut self, id: JobId, signal: RunnerSignal, effects: &mut Vec<Effect>) {
        let Some(started) = self.runners.get_mut(&id) else {
            return;
        };
        match &mut started.runner {
            Runner::Running { pid } => effects.push(Effect::Signal {
                id,
                pid: *pid,
                signal,
            }),
            Runner::Starting { deferred } | Runner::Claimant { deferred, .. } => match signal {
                RunnerSignal::Cancel => deferred.cancel = true,
                RunnerSignal::Priority => deferred.priority = true,
            },
            Runner::Dying { .. } => {}
        }
    }

    /// A runner's pid became known: it runs, and gets what waited for it.
    fn now_running(&mut self, id: JobId, pid: u32, effects: &mut Vec<Effect>) {
        let Some(started) = self.runners.get_mut(&id) else {
            return;
        };
        let deferred = match &started.runner {
            Runner::Starting { deferred } | Runner::Claimant { deferred, .. } => *deferred,
            _ => Deferred::default(),
        };
        started.runner = Runner::Running { pid };
        for (wanted, signal) in [
            (deferred.cancel, RunnerSignal::Cancel),
            (deferred.priority, RunnerSignal::Priority),
        ] {
            if wanted {
                effects.push(Effect::Signal { id, pid, signal });
            }
        }
        if deferred.kill {
            effects.push(Effect::KillGroup { id, pid });
        }
    }

    /// The runner of a job is gone and nothing of it is left to follow.
    fn runner_done(&mut self, id: JobId, effects: &mut Vec<Effect>) {
        if let Some(started) = self.runners.remove(&id) {
            if matches!(started.runner, Runner::Dying { .. }) {
                effects.push(Effect::UnwatchLivelock { id });
            }
            effects.push(Effect::RemoveLivelock {
                path: started.livelock,
            });
        }
        effects.push(Effect::RemovePriorityRequest { id });
        self.changed.insert(id);
    }

    // ----- invariants -----

    /// Panics unless the queue's parts agree with each other.
    pub fn check_invariants(&self) {
        for (id, job) in &self.jobs {
            assert_eq!(*id, job.id, "job {id} is filed under its id");
            assert!(!job.is_final(), "unfinished job {id} is final");
            assert!(!self.finished.contains_key(id), "job {id} is both");
            assert!(*id <= self.serial, "job {id} is above the serial");
            assert!(
                self.depends.contains_key(id),
                "job {id} has no dependencies"
            );
        }
        for (id, job) in &self.finished {
            assert_eq!(*id, job.id, "finished job {id} is filed under its id");
            assert!(job.status.is_final(), "finished job {id} is not final");
            assert!(*id <= self.serial, "job {id} is above the serial");
        }
        assert_eq!(
            self.depends.len(),
            self.jobs.len(),
            "dependencies of jobs that are not unfinished"
        );
        for &(priority, id) in &self.queued {
            let job = self.jobs.get(&id).expect("a queued job is unfinished");
            assert_eq!(priority, job.priority(), "queued job {id} is out of order");
            assert!(
                !self.runners.contains_key(&id),
                "queued job {id} is started"
            );
        }
        for (id, started) in &self.runners {
            // A runner never writes a final job file again: its job may be
            // archived while it frees its locks and exits.
            if !matches!(started.runner, Runner::Running { .. }) {
                assert!(
                    self.jobs.contains_key(id),
                    "the {:?} runner of job {id} has no unfinished job",
                    started.runner
                );
            }
        }
        assert!(
            self.runners.len() <= self.config.max_running_jobs.max(self.restored_runners),
            "{} runners for at most {}",
            self.runners.len(),
            self.config.max_running_jobs
        );
        for (conn, watcher) in &self.watchers {
            let id = watcher.id;
            let known = self.jobs.contains_key(&id) || self.finished.contains_key(&id);
            assert!(
                self.changed.contains(&id) || (known && !self.finished.contains_key(&id)),
                "watcher {conn:?} of job {id} is neither answered nor due"
            );
        }
        for id in &self.new_jobs {
            assert!(self.jobs.contains_key(id), "new job {id} is not unfinished");
            assert!(!self.runners.contains_key(id), "new job {id} is started");
        }
        for id in self.worker_requests.keys() {
            assert!(
                self.jobs.contains_key(id),
                "job {id} asks for workers yet is not unfinished"
            );
        }
        for id in self.assigned.keys() {
            assert!(
                self.worker_requests.contains_key(id),
                "job {id} got workers it did not ask for"
            );
        }
        for id in self.backoff.keys() {
            let queued = self
                .jobs
                .get(id)
                .is_some_and(|job| self.queued.contains(&(job.priority(), *id)));
            assert!(queued, "job {id} backs off yet is not queued");
        }
        for id in self.doomed.keys() {
            assert!(
                self.jobs.contains_key(id),
                "doomed job {id} is not unfinished"
            );
        }
        // (A runner adopted after a restart may run before wconfd's
        // notice repeats its workers.)
        for (id, started) in &self.runners {
            if matches!(started.runner, Runner::Starting { .. }) {
                assert!(
                    !self.worker_requests.contains_key(id) || self.assigned.contains_key(id),
                    "job {id} started without its workers"
                );
            }
        }
        assert_eq!(
            self.prepare_of.len(),
            self.prepare_jobs.len(),
            "the prepare indexes agree"
        );
        self.scheduling.check_invariants(&self.jobs);
        for (id, of) in &self.prepare_of {
            assert_eq!(
                self.prepare_jobs.get(of),
                Some(id),
                "prepare {of:?} of job {id} is indexed"
            );
        }
    }
}
