//! luxid's queue as a pure state machine, driven as
//! [`QueueCore::handle`]`(input, now) -> effects` (jobs.md, liveness.md).
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

#[cfg(test)]
mod tests;

/// How often the livelock of a dead runner's job, or of a runner another
/// luxid started, is probed should its inotify close event be missed (a
/// livelock found by name only).
pub const RELEASE_PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// How often the end of a dead runner's job is written again when the disk
/// refused it (full, read-only): the job ends promptly once the disk takes
/// writes again, and a full disk costs a write attempt, not a busy loop.
pub const DEAD_JOB_WRITE_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// A client connection, as the shell names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Conn(pub usize);

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
}

/// The queue as found on disk at start-up, with what the shell found out
/// about the runners of its unfinished jobs.
#[derive(Debug, Default)]
pub struct Restored {
    pub serial: JobId,
    pub drained: bool,
    pub jobs: Vec<Job>,
    pub finished: Vec<FinishedJob>,
    /// Unfinished jobs whose runner's livelock ([`runner_livelock`]) is
    /// held: a runner lives.
    pub held: BTreeSet<JobId>,
    /// Of those with a recorded pid, the ones whose process the shell
    /// watches (its pidfd opened).
    pub watched: BTreeSet<JobId>,
}

/// A signal luxid sends a runner, which the runner handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerSignal {
    /// SIGTERM: cancel the job.
    Cancel,
    /// SIGUSR1: apply the priority request file.
    Priority,
}

/// A request, decoded and checked as far as it can be without the queue.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// New jobs: each built by the shell with the id the core will give it
    /// (`serial + 1`, `+ 2`, ... over the accepted ones), or the reason its
    /// opcodes were refused. `many`: answered as `SubmitManyJobs`.
    Submit {
        jobs: Vec<Result<Job, String>>,
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
    /// The answer to [`Effect::Probe`]; the shell re-read the job file
    /// ([`Input::JobFileChanged`]) first if it was released.
    Probed {
        id: JobId,
        released: bool,
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
}

/// What the core asks of the shell.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
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
        };
        let mut effects = Vec::new();
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
                    core.runners.insert(id, Started { runner, livelock });
                }
                None => {
                    core.queued.insert((job.priority(), id));
                }
            }
            core.depends.insert(id, dependencies(&job));
            core.jobs.insert(id, job);
        }
        for id in core.finished.keys() {
            core.serial = core.serial.max(*id);
        }
        core.restored_runners = core.runners.len();
        core.debug_check();
        (core, effects)
    }

    /// Runs one input.
    pub fn handle(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let mut effects = Vec::new();
        match input {
            Input::Request { conn, command } => self.request(conn, command, now, &mut effects),
            Input::ConnectionGone { conn } => {
                self.watchers.remove(&conn);
            }
            Input::Done { ticket, result } => self.done(ticket, result, now, &mut effects),
            Input::Spawned { id, pid } => self.spawned(id, pid, &mut effects),
            Input::SpawnFailed { id, error } => self.spawn_failed(id, &error, &mut effects),
            Input::Committed { result, spawned } => self.committed(result, spawned, &mut effects),
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
            Input::EndTurn => self.end_turn(&mut effects),
            Input::Tick => self.tick(now, &mut effects),
        }
        self.debug_check();
        effects
    }

    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    // ----- read-only accessors -----

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
        probes.chain(deadlines).min()
    }

    // ----- requests -----

    fn ticket(&mut self, pending: Pending) -> Ticket {
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.pending.insert(ticket, pending);
        ticket
    }

    fn ask(&mut self, pending: Pending, action: Action, effects: &mut Vec<Effect>) {
        let ticket = self.ticket(pending);
        effects.push(Effect::Do { ticket, action });
    }

    fn request(&mut self, conn: Conn, command: Command, now: Instant, effects: &mut Vec<Effect>) {
        let reply = |reply: Reply, effects: &mut Vec<Effect>| {
            effects.push(Effect::Reply { conn, reply });
        };
        match command {
            Command::Submit {
                jobs,
                ignore_drain,
                many,
            } => reply(self.submit(jobs, ignore_drain, many), effects),
            Command::Cancel { id, kill } => self.cancel(conn, id, kill, effects),
            Command::ChangePriority { id, priority } => {
                self.change_priority(conn, id, priority, effects)
            }
            Command::Archive { id } => {
                if self.finished.contains_key(&id) {
                    self.ask(Pending::Archive { conn, id }, Action::Archive(id), effects);
                } else {
                    reply(Ok(Answer::Archived(false)), effects);
                }
            }
            Command::AutoArchive {
                age,
                timeout,
                now_secs,
            } => {
                let mut rest: Vec<JobId> = self
                    .finished
                    .values()
                    .filter(|job| match age {
                        None => true,
                        Some(age) => job
                            .end_timestamp
                            .is_some_and(|end| now_secs - end.as_secs_f64() >= age.as_secs_f64()),
                    })
                    .map(|job| job.id)
                    .collect();
                rest.reverse();
                let progress = AutoArchiving {
                    total: rest.len(),
                    rest,
                    checked: 0,
                    archived: 0,
                    started: now,
                    timeout,
                };
                self.auto_archive(conn, progress, now, effects);
            }
            Command::SetDrain { drained } => {
                self.ask(
                    Pending::Drain { conn, drained },
                    Action::SetDrain(drained),
                    effects,
                );
            }
            Command::WaitForChange {
                id,
                fields,
                previous,
                log_serial,
                timeout,
            } => {
                let Some(job) = self.job(id) else {
                    return reply(Err(Refusal::JobLost(id)), effects);
                };
                let values = job.field_values(&fields);
                let log: Vec<LogEntry> = job.log_after(log_serial).into_iter().cloned().collect();
                if values != previous || !log.is_empty() || job.is_final() {
                    return reply(Ok(Answer::Change { values, log }), effects);
                }
                let deadline = now + timeout;
                let seen_digest = digest_values(&self.digest_keys, &values);
                self.watchers.insert(
                    conn,
                    Watcher {
                        id,
                        fields,
                        seen_digest,
                        log_serial,
                        deadline,
                    },
                );
                effects.push(Effect::Hold { conn, deadline });
            }
        }
    }

    fn submit(&mut self, jobs: Vec<Result<Job, String>>, ignore_drain: bool, many: bool) -> Reply {
        if !ignore_drain && self.drained {
            return Err(Refusal::Drained);
        }
        if many && jobs.len() > SUBMIT_MANY_JOBS_MAX {
            return Err(Refusal::TooManyJobs(jobs.len()));
        }
        let max = self.config.queue_jobs_max;
        if self.job_count() + jobs.len() > max {
            return Err(Refusal::QueueFull {
                jobs: self.job_count(),
                max,
            });
        }
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            match job {
                Ok(job) => {
                    assert_eq!(job.id, self.serial + 1, "a new job has the next id");
                    assert!(!job.is_final(), "a new job is unfinished");
                    self.serial = job.id;
                    results.push(Ok(job.id));
                    self.depends.insert(job.id, dependencies(&job));
                    self.new_jobs.push(job.id);
                    self.jobs.insert(job.id, job);
                }
                Err(message) => results.push(Err(message)),
            }
        }
        if many {
            return Ok(Answer::SubmittedMany(results));
        }
        match results.pop() {
            Some(Ok(id)) => Ok(Answer::Submitted(id)),
            Some(Err(message)) => Err(Refusal::Prereq(message)),
            None => Err(Refusal::Prereq(
                "a job needs at least one opcode".to_owned(),
            )),
        }
    }

    fn cancel(&mut self, conn: Conn, id: JobId, kill: bool, effects: &mut Vec<Effect>) {
        let reply = |reply: Reply, effects: &mut Vec<Effect>| {
            effects.push(Effect::Reply { conn, reply });
        };
        let outcome = |done: bool, message: String| Ok(Answer::Outcome(done, message));
        if self.finished.contains_key(&id) {
            return reply(
                outcome(false, format!("Job {id} has already finished")),
                effects,
            );
        }
        let Some(job) = self.jobs.get(&id) else {
            return reply(
                outcome(false, format!("Job {id} not found in queue")),
                effects,
            );
        };
        let waiting = matches!(job.status(), Status::Waiting | Status::Queued);
        let Some(started) = self.runners.get_mut(&id) else {
            // Not started: luxid owns the file.
            let mut job = job.clone();
            job.finish_unfinished(Status::Canceled, &canceled_by_request());
            let action = Action::WriteJob(job.clone());
            return self.ask(Pending::Dequeue { conn, job }, action, effects);
        };
        let deferred = match &mut started.runner {
            Runner::Dying { .. } => {
                return reply(
                    outcome(
                        false,
                        format!("Job {id} is being cleaned up after its death"),
                    ),
                    effects,
                );
            }
            Runner::Running { pid } => {
                let pid = *pid;
                if kill {
                    return self.ask(
                        Pending::Kill { conn, id },
                        Action::KillGroup { id, pid },
                        effects,
                    );
                }
                effects.push(Effect::Signal {
                    id,
                    pid,
                    signal: RunnerSignal::Cancel,
                });
                None
            }
            Runner::Starting { deferred } | Runner::Claimant { deferred, .. } => Some(deferred),
        };
        if let Some(deferred) = deferred {
            // Its pid is not known yet: signalled once it is.
            if kill {
                deferred.kill = true;
            } else {
                deferred.cancel = true;
            }
        }
        if kill {
            reply(outcome(true, format!("Job {id} will be killed")), effects);
        } else if waiting {
            reply(outcome(true, format!("Job {id} will be canceled")), effects);
        } else {
            reply(
                outcome(
                    false,
                    "Job no longer waiting, can't cancel (informed it anyway)".to_owned(),
                ),
                effects,
            );
        }
    }

    fn change_priority(&mut self, conn: Conn, id: JobId, priority: i64, effects: &mut Vec<Effect>) {
        let reply = |reply: Reply, effects: &mut Vec<Effect>| {
            effects.push(Effect::Reply { conn, reply });
        };
        if self.finished.contains_key(&id) {
            return reply(
                Ok(Answer::Outcome(false, format!("Job {id} is finished"))),
                effects,
            );
        }
        let Some(job) = self.jobs.get(&id) else {
            return reply(
                Ok(Answer::Outcome(false, format!("Job {id} not found"))),
                effects,
            );
        };
        match self.runners.get(&id).map(|started| &started.runner) {
            Some(Runner::Dying { .. }) => reply(
                Ok(Answer::Outcome(
                    false,
                    format!("Job {id} is being cleaned up after its death"),
                )),
                effects,
            ),
            // The runner owns the job file: it applies the request to its
            // unfinished opcodes (and files a waiting lock request again).
            Some(_) => self.ask(
                Pending::PriorityRequest { conn, id, priority },
                Action::WritePriorityRequest { id, priority },
                effects,
            ),
            None => {
                let mut job = job.clone();
                for op in job.ops.iter_mut().filter(|op| !op.status.is_final()) {
                    op.priority = priority;
                }
                let action = Action::WriteJob(job.clone());
                self.ask(
                    Pending::Reprioritize {
                        conn,
                        job,
                        priority,
                    },
                    action,
                    effects,
                );
            }
        }
    }

    fn auto_archive(
        &mut self,
        conn: Conn,
        mut progress: AutoArchiving,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let out_of_time = progress
            .timeout
            .is_some_and(|timeout| now.saturating_duration_since(progress.started) > timeout);
        match progress.rest.pop() {
            Some(id) if !out_of_time => {
                progress.checked += 1;
                self.ask(
                    Pending::AutoArchive { conn, id, progress },
                    Action::Archive(id),
                    effects,
                );
            }
            _ => effects.push(Effect::Reply {
                conn,
                reply: Ok(Answer::AutoArchived {
                    archived: progress.archived,
                    left: progress.total - progress.checked,
                }),
            }),
        }
    }

    // ----- actions done -----

    fn done(
        &mut self,
        ticket: Ticket,
        result: Result<(), String>,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(pending) = self.pending.remove(&ticket) else {
            return;
        };
        let ok = result.is_ok();
        let failed = |what: String| Err(Refusal::Failed(what));
        match pending {
            Pending::Dequeue { conn, job } => {
                let id = job.id;
                let reply = match result {
                    Err(error) => failed(format!("cannot write job {id}: {error}")),
                    Ok(()) => {
                        self.unqueue(id);
                        self.put(job);
                        Ok(Answer::Outcome(true, format!("Dequeued job {id}")))
                    }
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::Reprioritize {
                conn,
                job,
                priority,
            } => {
                let id = job.id;
                let reply = match result {
                    Err(error) => failed(format!("cannot write job {id}: {error}")),
                    Ok(()) => {
                        if self.unqueue(id) {
                            self.queued.insert((job.priority(), id));
                        }
                        self.put(job);
                        Ok(Answer::Outcome(
                            true,
                            format!(
                                "Priorities of pending opcodes for job {id} have been changed to {priority}"
                            ),
                        ))
                    }
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::Kill { conn, id } => {
                let reply = match result {
                    Ok(()) => Ok(Answer::Outcome(true, format!("Job {id} will be killed"))),
                    Err(error) => failed(format!("cannot kill job {id}: {error}")),
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::PriorityRequest { conn, id, priority } => {
                let reply = match result {
                    Ok(()) => {
                        self.signal(id, RunnerSignal::Priority, effects);
                        Ok(Answer::Outcome(
                            true,
                            format!(
                                "Priorities of pending opcodes for job {id} have been changed to {priority}"
                            ),
                        ))
                    }
                    Err(error) => failed(format!(
                        "cannot pass the new priority to job {id}'s runner: {error}"
                    )),
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::Archive { conn, id } => {
                if ok {
                    self.archived(id);
                }
                effects.push(Effect::Reply {
                    conn,
                    reply: Ok(Answer::Archived(ok)),
                });
            }
            Pending::AutoArchive {
                conn,
                id,
                mut progress,
            } => {
                if ok {
                    self.archived(id);
                    progress.archived += 1;
                }
                self.auto_archive(conn, progress, now, effects);
            }
            Pending::Drain { conn, drained } => {
                let reply = match result {
                    Ok(()) => {
                        self.drained = drained;
                        Ok(Answer::DrainSet)
                    }
                    Err(error) => failed(format!("cannot set the drain flag: {error}")),
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::SpawnFailed { job } => {
                // Not written: the job stays as it was, with no runner,
                // until luxid restarts.
                if ok {
                    self.put(job);
                }
            }
            Pending::DeadEnd { job } => {
                let id = job.id;
                if ok {
                    if let (Some(livelock), Some(pid)) = (&job.livelock, job.process_id) {
                        effects.push(Effect::FreeLocks {
                            id,
                            livelock: livelock.clone(),
                            pid,
                        });
                    }
                    self.put(job);
                    self.runner_done(id, effects);
                } else if let Some(Started {
                    runner:
                        Runner::Dying {
                            next_probe,
                            failed_writes,
                            ..
                        },
                    ..
                }) = self.runners.get_mut(&id)
                {
                    *failed_writes += 1;
                    *next_probe = now + DEAD_JOB_WRITE_RETRY_INTERVAL;
                }
            }
        }
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
    fn put(&mut self, job: Job) {
        let id = job.id;
        if job.is_final() {
            self.unqueue(id);
            // A new job canceled before its commit was written whole.
            self.new_jobs.retain(|&new| new != id);
            self.jobs.remove(&id);
            self.depends.remove(&id);
            self.finished.insert(id, FinishedJob::new(&job));
        } else {
            self.jobs.insert(id, job);
        }
        self.changed.insert(id);
    }

    fn archived(&mut self, id: JobId) {
        self.finished.remove(&id);
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

    // ----- runners -----

    fn spawned(&mut self, id: JobId, pid: u32, effects: &mut Vec<Effect>) {
        if let Some(Started {
            runner: Runner::Starting { .. },
            ..
        }) = self.runners.get(&id)
        {
            self.now_running(id, pid, effects);
        }
    }

    fn spawn_failed(&mut self, id: JobId, error: &str, effects: &mut Vec<Effect>) {
        if !matches!(
            self.runners.get(&id).map(|started| &started.runner),
            Some(Runner::Starting { .. })
        ) {
            return;
        }
        self.runners.remove(&id);
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let mut job = job.clone();
        job.finish_unfinished(
            Status::Error,
            &exec_error(format!("cannot start the job runner: {error}")),
        );
        self.ask(
            Pending::SpawnFailed { job: job.clone() },
            Action::WriteJob(job),
            effects,
        );
    }

    fn committed(
        &mut self,
        result: Result<(), String>,
        spawned: Vec<(JobId, Result<u32, String>)>,
        effects: &mut Vec<Effect>,
    ) {
        let new_jobs = std::mem::take(&mut self.new_jobs);
        if result.is_err() {
            // Nothing of these jobs may be revealed or run: their runners
            // get no word and leave the job alone.
            for id in new_jobs {
                self.unqueue(id);
                self.jobs.remove(&id);
                self.depends.remove(&id);
                self.changed.insert(id);
            }
            self.check_watchers(effects);
            self.schedule(effects);
            return;
        }
        for (id, outcome) in spawned {
            // One that failed stays queued: started again below.
            if let Ok(pid) = outcome
                && self.unqueue(id)
            {
                self.runners.insert(
                    id,
                    Started {
                        runner: Runner::Running { pid },
                        livelock: self.livelock_of(id),
                    },
                );
            }
        }
        self.schedule(effects);
    }

    fn livelock_of(&self, id: JobId) -> PathBuf {
        match self.jobs.get(&id) {
            Some(job) => named_livelock(&self.config.livelock_dir, job),
            None => self.config.livelock_dir.join(job_livelock_name(id, 0)),
        }
    }

    fn runner_exited(
        &mut self,
        id: JobId,
        cause: Option<&'static str>,
        livelock_held: bool,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(started) = self.runners.get(&id) else {
            return;
        };
        let Runner::Running { pid } = started.runner else {
            return;
        };
        let Some(job) = self.jobs.get(&id) else {
            self.runner_done(id, effects);
            return;
        };
        if job.process_id != Some(pid) && livelock_held {
            // Our runner found the job held by one a dead luxid started:
            // follow that one.
            let started = self.runners.get_mut(&id).expect("looked up above");
            started.runner = Runner::Claimant {
                next_probe: now,
                deferred: Deferred::default(),
            };
            return;
        }
        // The runner died: kill what is left of the job, then wait for its
        // livelock to be released before ending it and freeing its locks.
        let livelock = runner_livelock(&self.config.livelock_dir, job);
        effects.push(Effect::KillGroup { id, pid });
        effects.push(Effect::WatchLivelock {
            id,
            path: livelock.clone(),
        });
        let started = self.runners.get_mut(&id).expect("looked up above");
        started.runner = Runner::Dying {
            cause,
            livelock: livelock.clone(),
            next_probe: now + RELEASE_PROBE_INTERVAL,
            failed_writes: 0,
            ended: None,
        };
        effects.push(Effect::Probe { id, path: livelock });
    }

    fn job_file_changed(&mut self, job: Job, now: Instant, effects: &mut Vec<Effect>) {
        let id = job.id;
        let Some(started) = self.runners.get(&id) else {
            // Only files of started jobs change behind luxid's back.
            return;
        };
        // A finished job's file never changes again.
        let changed = match self.jobs.get(&id) {
            Some(known) => *known != job,
            None => false,
        };
        if !changed {
            return;
        }
        let finished = job.is_final();
        let recorded = job.process_id;
        let claimant = matches!(started.runner, Runner::Claimant { .. });
        if finished
            && let Some(Started {
                runner: Runner::Dying { ended, .. },
                ..
            }) = self.runners.get_mut(&id)
        {
            // The runner finished the job just before it died: the job's
            // processes may still hold its livelock.
            *ended = Some(Box::new(job));
            return;
        }
        self.put(job);
        if finished && claimant {
            // Its pid is of no use any more: the claimant exits by itself.
            self.runner_done(id, effects);
        } else if claimant {
            match recorded {
                Some(pid) => {
                    self.now_running(id, pid, effects);
                    effects.push(Effect::WatchRunner { id, pid });
                }
                None => {
                    let path = self.livelock_of(id);
                    if let Some(Started {
                        runner: Runner::Claimant { next_probe, .. },
                        ..
                    }) = self.runners.get_mut(&id)
                    {
                        *next_probe = now + RELEASE_PROBE_INTERVAL;
                    }
                    effects.push(Effect::Probe { id, path });
                }
            }
        }
    }

    fn probed(&mut self, id: JobId, released: bool, now: Instant, effects: &mut Vec<Effect>) {
        let Some(started) = self.runners.get_mut(&id) else {
            return;
        };
        match &mut started.runner {
            Runner::Claimant { next_probe, .. } => {
                if !released {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    return;
                }
                // It let go of the job without recording a pid: it never
                // started it.
                self.runners.remove(&id);
                if let Some(job) = self.jobs.get(&id) {
                    self.queued.insert((job.priority(), id));
                }
            }
            Runner::Dying {
                next_probe,
                cause,
                ended,
                ..
            } => {
                if !released {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    return;
                }
                if let Some(job) = ended.take() {
                    if let Some(livelock) = &job.livelock {
                        effects.push(Effect::RemoveLivelock {
                            path: PathBuf::from(livelock),
                        });
                    }
                    self.put(*job);
                    self.runner_done(id, effects);
                    return;
                }
                // Probed again after the write, should it be refused.
                *next_probe = now + DEAD_JOB_WRITE_RETRY_INTERVAL;
                let cause = *cause;
                self.end_dead_job(id, cause, effects);
            }
            Runner::Starting { .. } | Runner::Running { .. } => {}
        }
    }

    /// Every process of a dead runner's job is gone: its unfinished
    /// opcodes become `error` (once written), its livelock is removed.
    fn end_dead_job(&mut self, id: JobId, cause: Option<&'static str>, effects: &mut Vec<Effect>) {
        let Some(job) = self.jobs.get(&id) else {
            self.runner_done(id, effects);
            return;
        };
        if let Some(livelock) = &job.livelock {
            effects.push(Effect::RemoveLivelock {
                path: PathBuf::from(livelock),
            });
        }
        let mut job = job.clone();
        let message = match cause {
            Some(cause) => format!("detected death of job {id}: its runner {cause}"),
            None => format!("detected death of job {id}"),
        };
        job.finish_unfinished(Status::Error, &exec_error(message));
        self.ask(
            Pending::DeadEnd { job: job.clone() },
            Action::WriteJob(job),
            effects,
        );
    }

    // ----- turns and time -----

    fn end_turn(&mut self, effects: &mut Vec<Effect>) {
        self.check_watchers(effects);
        if self.new_jobs.is_empty() {
            self.schedule(effects);
            return;
        }
        for id in &self.new_jobs {
            let job = &self.jobs[id];
            self.queued.insert((job.priority(), *id));
        }
        // The new jobs among those the scheduler would start now (the
        // others it starts after the commit still fit): their runners
        // start while the commit is synced (D40).
        let start = self
            .startable()
            .into_iter()
            .filter(|id| self.new_jobs.contains(id))
            .collect();
        effects.push(Effect::Commit {
            jobs: self.new_jobs.clone(),
            start,
        });
    }

    fn tick(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        let due: Vec<JobId> = self
            .runners
            .iter()
            .filter(|(_, started)| match &started.runner {
                Runner::Claimant { next_probe, .. } | Runner::Dying { next_probe, .. } => {
                    *next_probe <= now
                }
                _ => false,
            })
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(started) = self.runners.get_mut(&id) else {
                continue;
            };
            let path = match &mut started.runner {
                Runner::Claimant { next_probe, .. } => {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    started.livelock.clone()
                }
                Runner::Dying {
                    next_probe,
                    livelock,
                    ..
                } => {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    livelock.clone()
                }
                _ => continue,
            };
            effects.push(Effect::Probe { id, path });
        }
        let expired: Vec<Conn> = self
            .watchers
            .iter()
            .filter(|(_, watcher)| watcher.deadline <= now)
            .map(|(&conn, _)| conn)
            .collect();
        for conn in expired {
            let watcher = self.watchers.remove(&conn).expect("just listed");
            let reply = match self.job(watcher.id) {
                Some(job) => Ok(Answer::Change {
                    values: job.field_values(&watcher.fields),
                    log: job
                        .log_after(watcher.log_serial)
                        .into_iter()
                        .cloned()
                        .collect(),
                }),
                None => Err(Refusal::JobLost(watcher.id)),
            };
            effects.push(Effect::Release { conn, reply });
        }
    }

    /// Answers the watchers of changed jobs whose view changed (or whose
    /// job is gone: `JobLost`).
    fn check_watchers(&mut self, effects: &mut Vec<Effect>) {
        let changed = std::mem::take(&mut self.changed);
        if changed.is_empty() {
            return;
        }
        let mut due = Vec::new();
        for (&conn, watcher) in &self.watchers {
            if !changed.contains(&watcher.id) {
                continue;
            }
            let reply = match self.job(watcher.id) {
                Some(job) => {
                    let values = job.field_values(&watcher.fields);
                    let log: Vec<LogEntry> = job
                        .log_after(watcher.log_serial)
                        .into_iter()
                        .cloned()
                        .collect();
                    let same = digest_values(&self.digest_keys, &values) == watcher.seen_digest;
                    if same && log.is_empty() && !job.is_final() {
                        continue;
                    }
                    Ok(Answer::Change { values, log })
                }
                None => Err(Refusal::JobLost(watcher.id)),
            };
            due.push((conn, reply));
        }
        for (conn, reply) in due {
            self.watchers.remove(&conn);
            effects.push(Effect::Release { conn, reply });
        }
    }

    /// Starts queued jobs whose dependencies are final, in (priority, id)
    /// order, up to `max_running_jobs`.
    fn schedule(&mut self, effects: &mut Vec<Effect>) {
        for id in self.startable() {
            self.unqueue(id);
            let livelock = self.livelock_of(id);
            self.runners.insert(
                id,
                Started {
                    runner: Runner::Starting {
                        deferred: Deferred::default(),
                    },
                    livelock,
                },
            );
            effects.push(Effect::Spawn { id });
        }
    }

    /// The queued jobs [`QueueCore::schedule`] would start now, in order.
    fn startable(&self) -> Vec<JobId> {
        let room = self
            .config
            .max_running_jobs
            .saturating_sub(self.runners.len());
        self.queued
            .iter()
            .map(|&(_, id)| id)
            .filter(|id| self.dependencies_final(*id))
            .take(room)
            .collect()
    }

    /// Whether every job the job depends on is final (archived and unknown
    /// ones count as final: the runner judges them).
    fn dependencies_final(&self, id: JobId) -> bool {
        self.depends
            .get(&id)
            .is_some_and(|deps| deps.iter().all(|dep| !self.jobs.contains_key(dep)))
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
    }
}
