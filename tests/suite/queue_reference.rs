//! A naive model of luxid's queue ([`Model`]), and a simulated world
//! around the real core ([`World`]): a disk of job files that can be made
//! to refuse writes, runner processes that run, finish or die when told,
//! and a shell that carries out every effect the way luxid's does. Both
//! take the same [`Step`]s; [`compare`] checks the replies and what can be
//! seen of the queue.
//!
//! The model keeps, per job, what a reader of JOBS.md would: its status,
//! its priority, its dependencies, whether it waits to start, whether a
//! runner process lives and has written its pid, whether its runner is
//! dying (dead, its end not yet written). Its rules are written out in
//! full, one step at a time, without the core's indexes.

use std::collections::{BTreeMap, VecDeque};
use std::hash::RandomState;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warden::events::Event;
use warden::jobs::{Job, JobId, QueuedOpcode, Status, Timestamp};
use warden::luxid::core::{
    Action, Answer, Command, Config, Conn, Effect, Input, JobEvents, QueueCore, Refusal, Reply,
    Restored, Submission,
};
use warden::queue::FinishedJob;

pub const QUEUE_JOBS_MAX: usize = 8;
const CONN: Conn = Conn(1);
/// Time between steps: more than every probe and retry interval.
const STEP: Duration = Duration::from_millis(100);

/// One thing that happens to luxid.
#[derive(Clone, Debug)]
pub enum Step {
    /// A job of one opcode at `priority`, depending on earlier jobs.
    Submit {
        priority: i64,
        depends: Vec<JobId>,
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
    SetDrain(bool),
    /// The disk refuses writes from now on (or takes them again).
    DiskFull(bool),
    /// The job's runner records its pid and runs the job.
    Run {
        id: JobId,
    },
    /// The job's runner ends the job and exits.
    Finish {
        id: JobId,
        success: bool,
    },
    /// The job's runner dies with the job unfinished.
    Die {
        id: JobId,
    },
    /// luxid stops and starts again on the same disk.
    Restart,
    /// Two events in one turn of luxid's loop (a runner's end and a
    /// submission, say), then the turn's end.
    Together(Box<Step>, Box<Step>),
}

/// What a step answered, if it was a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen {
    Nothing,
    Reply(Reply),
    /// The submission's commit was refused: the client got an error.
    CommitRefused,
    /// What each of two events in one turn answered.
    Both(Box<Seen>, Box<Seen>),
}

fn op(id: JobId, priority: i64, depends: &[JobId]) -> Value {
    let _ = id;
    let depends: Vec<Value> = depends.iter().map(|dep| json!([dep, []])).collect();
    json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.1, "priority": priority, "depends": depends})
}

pub fn new_job(id: JobId, priority: i64, depends: &[JobId]) -> Job {
    Job {
        id,
        ops: vec![QueuedOpcode::new(op(id, priority, depends), priority)],
        received_timestamp: Some(Timestamp(1000, 0)),
        start_timestamp: None,
        end_timestamp: None,
        livelock: None,
        process_id: None,
        workers: Vec::new(),
    }
}

// ----- the model -----

#[derive(Clone, Debug)]
pub struct MJob {
    pub status: Status,
    pub priority: i64,
    pub depends: Vec<JobId>,
    /// Waits to be started.
    pub queued: bool,
    /// luxid follows a runner of it (also while it dies).
    pub started: bool,
    /// A runner process of it lives.
    pub alive: bool,
    /// Its runner wrote its pid into the job file.
    pub recorded: bool,
    /// Its runner died, its end is not written yet.
    pub dying: bool,
    /// Its runner was started by a previous luxid and has not written its
    /// pid: luxid follows it by its livelock.
    pub claimant: bool,
    /// A cancel with kill waits for the claimant's pid.
    pub kill_pending: bool,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub max_running_jobs: usize,
    pub serial: JobId,
    pub drained: bool,
    pub disk_full: bool,
    /// Jobs in the queue (not archived, not refused).
    pub jobs: BTreeMap<JobId, MJob>,
    /// Every start of a runner, in order.
    pub started: Vec<JobId>,
}

impl Model {
    pub fn new(max_running_jobs: usize) -> Model {
        Model {
            max_running_jobs,
            serial: 0,
            drained: false,
            disk_full: false,
            jobs: BTreeMap::new(),
            started: Vec::new(),
        }
    }

    fn unfinished(&self, id: JobId) -> bool {
        self.jobs.get(&id).is_some_and(|job| !job.status.is_final())
    }

    /// Runs a step; what it answered.
    pub fn step(&mut self, step: &Step) -> Seen {
        let mut new = Vec::new();
        let seen = match step {
            Step::Together(first, second) => {
                let first = self.event(first, &mut new);
                let second = self.event(second, &mut new);
                Seen::Both(Box::new(first), Box::new(second))
            }
            other => self.event(other, &mut new),
        };
        self.settle();
        self.schedule(&new);
        seen
    }

    /// One event of a step.
    fn event(&mut self, step: &Step, new: &mut Vec<JobId>) -> Seen {
        match step {
            Step::Together(..) => unreachable!("steps do not nest"),
            Step::Submit { priority, depends } => {
                if self.drained {
                    Seen::Reply(Err(Refusal::Drained))
                } else if self.jobs.len() + 1 > QUEUE_JOBS_MAX {
                    Seen::Reply(Err(Refusal::QueueFull {
                        jobs: self.jobs.len(),
                        max: QUEUE_JOBS_MAX,
                    }))
                } else {
                    self.serial += 1;
                    if self.disk_full {
                        Seen::CommitRefused
                    } else {
                        let id = self.serial;
                        new.push(id);
                        self.jobs.insert(
                            id,
                            MJob {
                                status: Status::Queued,
                                priority: *priority,
                                depends: depends.clone(),
                                queued: true,
                                started: false,
                                alive: false,
                                recorded: false,
                                dying: false,
                                claimant: false,
                                kill_pending: false,
                            },
                        );
                        Seen::Reply(Ok(Answer::Submitted(id)))
                    }
                }
            }
            Step::Cancel { id, kill } => Seen::Reply(self.cancel(*id, *kill)),
            Step::ChangePriority { id, priority } => {
                Seen::Reply(self.change_priority(*id, *priority))
            }
            Step::Archive { id } => {
                let finished = self.jobs.get(id).is_some_and(|job| job.status.is_final());
                let archived = finished && !self.disk_full;
                if archived {
                    self.jobs.remove(id);
                }
                Seen::Reply(Ok(Answer::Archived(archived)))
            }
            Step::SetDrain(drained) => {
                if self.disk_full {
                    Seen::Reply(Err(Refusal::Failed(
                        "cannot set the drain flag: disk full".to_owned(),
                    )))
                } else {
                    self.drained = *drained;
                    Seen::Reply(Ok(Answer::DrainSet))
                }
            }
            Step::DiskFull(full) => {
                self.disk_full = *full;
                Seen::Nothing
            }
            Step::Run { id } => {
                if let Some(job) = self.jobs.get_mut(id).filter(|job| job.alive) {
                    job.status = Status::Running;
                    job.recorded = true;
                    job.claimant = false;
                    if std::mem::take(&mut job.kill_pending) {
                        // Killed as soon as its pid is known.
                        self.die(*id);
                    }
                }
                Seen::Nothing
            }
            Step::Finish { id, success } => {
                if let Some(job) = self.jobs.get_mut(id).filter(|job| job.alive) {
                    job.status = if *success {
                        Status::Success
                    } else {
                        Status::Error
                    };
                    job.recorded = true;
                    job.alive = false;
                    job.started = false;
                    job.claimant = false;
                    job.kill_pending = false;
                }
                Seen::Nothing
            }
            Step::Die { id } => {
                if self.jobs.get(id).is_some_and(|job| job.alive) {
                    self.die(*id);
                }
                Seen::Nothing
            }
            Step::Restart => {
                for job in self.jobs.values_mut() {
                    // Signals held back for a pid are lost with luxid.
                    job.kill_pending = false;
                    if job.status.is_final() {
                        continue;
                    }
                    if job.alive && !job.recorded {
                        job.claimant = true;
                    }
                    if job.dying && !job.recorded {
                        // Nothing on disk says a runner had it.
                        job.dying = false;
                        job.started = false;
                        job.queued = true;
                    }
                }
                Seen::Nothing
            }
        }
    }

    /// The job's runner process is gone with the job unfinished.
    fn die(&mut self, id: JobId) {
        let job = self.jobs.get_mut(&id).expect("a job that runs");
        job.alive = false;
        job.kill_pending = false;
        if std::mem::take(&mut job.claimant) {
            // It let go of a job it never started: queued again.
            job.started = false;
            job.queued = true;
        } else {
            job.dying = true;
        }
    }

    /// Dead runners' jobs end once the disk takes their end.
    fn settle(&mut self) {
        if self.disk_full {
            return;
        }
        for job in self.jobs.values_mut() {
            if job.dying {
                job.dying = false;
                job.started = false;
                job.status = Status::Error;
            }
        }
    }

    /// Starts what may start: the first queued jobs in (priority, id)
    /// order whose dependencies are final, up to the limit; a job
    /// submitted in this step starts first (during its commit).
    fn schedule(&mut self, new: &[JobId]) {
        let running = self.jobs.values().filter(|job| job.started).count();
        let room = self.max_running_jobs.saturating_sub(running);
        let mut candidates: Vec<(i64, JobId)> = self
            .jobs
            .iter()
            .filter(|(_, job)| job.queued)
            .filter(|(_, job)| job.depends.iter().all(|dep| !self.unfinished(*dep)))
            .map(|(&id, job)| (job.priority, id))
            .collect();
        candidates.sort();
        candidates.truncate(room);
        // New jobs first: they start while they are committed.
        candidates.sort_by_key(|(_, id)| !new.contains(id));
        for (_, id) in candidates {
            let job = self.jobs.get_mut(&id).expect("a candidate");
            job.queued = false;
            job.started = true;
            job.alive = true;
            job.recorded = false;
            self.started.push(id);
        }
    }

    fn cancel(&mut self, id: JobId, kill: bool) -> Reply {
        let outcome = |done: bool, message: String| Ok(Answer::Outcome(done, message));
        let Some(job) = self.jobs.get_mut(&id) else {
            return outcome(false, format!("Job {id} not found in queue"));
        };
        if job.status.is_final() {
            return outcome(false, format!("Job {id} has already finished"));
        }
        if !job.started {
            if self.disk_full {
                return Err(Refusal::Failed(format!("cannot write job {id}: disk full")));
            }
            job.status = Status::Canceled;
            job.queued = false;
            return outcome(true, format!("Dequeued job {id}"));
        }
        if job.dying {
            return outcome(
                false,
                format!("Job {id} is being cleaned up after its death"),
            );
        }
        if kill {
            if job.claimant {
                job.kill_pending = true;
            } else {
                self.die(id);
            }
            return outcome(true, format!("Job {id} will be killed"));
        }
        if matches!(job.status, Status::Queued | Status::Waiting) {
            outcome(true, format!("Job {id} will be canceled"))
        } else {
            outcome(
                false,
                "Job no longer waiting, can't cancel (informed it anyway)".to_owned(),
            )
        }
    }

    fn change_priority(&mut self, id: JobId, priority: i64) -> Reply {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Ok(Answer::Outcome(false, format!("Job {id} not found")));
        };
        if job.status.is_final() {
            return Ok(Answer::Outcome(false, format!("Job {id} is finished")));
        }
        if job.dying {
            return Ok(Answer::Outcome(
                false,
                format!("Job {id} is being cleaned up after its death"),
            ));
        }
        if self.disk_full {
            return Err(Refusal::Failed(if job.started {
                format!("cannot pass the new priority to job {id}'s runner: disk full")
            } else {
                format!("cannot write job {id}: disk full")
            }));
        }
        if !job.started {
            job.priority = priority;
        }
        Ok(Answer::Outcome(
            true,
            format!("Priorities of pending opcodes for job {id} have been changed to {priority}"),
        ))
    }
}

// ----- the real core in a simulated world -----

/// The real core, with the disk and the runner processes around it.
pub struct World {
    pub core: QueueCore,
    config: Config,
    now: Instant,
    /// Job files (not archived).
    disk: BTreeMap<JobId, Job>,
    /// The archive's job files.
    archive: BTreeMap<JobId, Job>,
    drained: bool,
    /// The stored filter rules.
    filter_rules: Vec<warden::scheduling::filters::FilterRule>,
    disk_full: bool,
    /// Live runner processes, by job: their pid.
    processes: BTreeMap<JobId, u32>,
    next_pid: u32,
    /// Processes that ended, their end not yet told.
    exited: Vec<JobId>,
    /// Every start of a runner, in order.
    pub started: Vec<JobId>,
    /// The event sequence, as luxid's shell would keep it.
    events: Vec<Event>,
    restarts: usize,
}

impl World {
    pub fn new(max_running_jobs: usize) -> World {
        let config = Config {
            max_running_jobs,
            queue_jobs_max: QUEUE_JOBS_MAX,
            livelock_dir: PathBuf::from("/ll"),
            clock: warden::luxid::core::ClockOrigin::now(),
        };
        let now = Instant::now();
        let (core, effects) =
            QueueCore::new(config.clone(), Restored::default(), RandomState::new(), now);
        // An empty queue asks for nothing but its first event.
        assert!(
            matches!(effects.as_slice(), [Effect::Events(_)]),
            "{effects:?}"
        );
        let mut world = World {
            core,
            config,
            now,
            disk: BTreeMap::new(),
            archive: BTreeMap::new(),
            drained: false,
            filter_rules: Vec::new(),
            disk_full: false,
            processes: BTreeMap::new(),
            next_pid: 1000,
            exited: Vec::new(),
            started: Vec::new(),
            events: Vec::new(),
            restarts: 0,
        };
        world.carry_out(effects);
        world
    }

    /// Runs a step as luxid's loop would: the event, then the end of the
    /// turn (probes and retries due, new jobs committed, jobs started).
    pub fn step(&mut self, step: &Step) -> Seen {
        self.now += STEP;
        let seen = match step {
            Step::Together(first, second) => {
                let first = self.event(first);
                let second = self.event(second);
                Seen::Both(Box::new(first), Box::new(second))
            }
            other => self.event(other),
        };
        let tick = self.core.handle(Input::Tick, self.now);
        self.check();
        self.carry_out(tick);
        let end = self.core.handle(Input::EndTurn, self.now);
        self.check();
        let refused = matches!(self.carry_out(end).committed, Some(Err(_)));
        refused_commit(seen, refused)
    }

    /// One event of a step.
    fn event(&mut self, step: &Step) -> Seen {
        let mut seen = Seen::Nothing;
        match step {
            Step::Together(..) => unreachable!("steps do not nest"),
            Step::Submit { priority, depends } => {
                let job = new_job(self.core.serial() + 1, *priority, depends);
                seen = self.request(Command::Submit {
                    jobs: vec![Submission::New(job)],
                    ignore_drain: false,
                    many: false,
                });
            }
            Step::Cancel { id, kill } => {
                seen = self.request(Command::Cancel {
                    id: *id,
                    kill: *kill,
                })
            }
            Step::ChangePriority { id, priority } => {
                seen = self.request(Command::ChangePriority {
                    id: *id,
                    priority: *priority,
                })
            }
            Step::Archive { id } => seen = self.request(Command::Archive { id: *id }),
            Step::SetDrain(drained) => seen = self.request(Command::SetDrain { drained: *drained }),
            Step::DiskFull(full) => self.disk_full = *full,
            Step::Run { id } => {
                if let (Some(&pid), Some(job)) = (self.processes.get(id), self.disk.get(id)) {
                    let mut job = job.clone();
                    job.ops[0].status = Status::Running;
                    job.livelock = Some(livelock(*id));
                    job.process_id = Some(pid);
                    self.runner_writes(job);
                }
            }
            Step::Finish { id, success } => {
                if let (Some(&pid), Some(job)) = (self.processes.get(id), self.disk.get(id)) {
                    let mut job = job.clone();
                    job.ops[0].status = if *success {
                        Status::Success
                    } else {
                        Status::Error
                    };
                    job.end_timestamp = Some(Timestamp(2000, 0));
                    job.livelock = Some(livelock(*id));
                    job.process_id = Some(pid);
                    self.runner_writes(job);
                    self.kill(*id);
                    self.tell_exits();
                }
            }
            Step::Die { id } => {
                self.kill(*id);
                self.tell_exits();
            }
            Step::Restart => self.restart(),
        }
        self.check_events();
        seen
    }

    fn check(&self) {
        self.core.check_invariants();
    }

    fn events_of(&self, id: JobId) -> String {
        let lines: Vec<String> = self
            .events
            .iter()
            .filter(|event| {
                event
                    .fields
                    .get("id")
                    .and_then(Value::as_u64)
                    .is_none_or(|of| of == id)
            })
            .map(|event| format!("{} {} {:?}", event.seq, event.kind, event.fields))
            .collect();
        lines.join("\n")
    }

    /// The event sequence tells every job's life once and in order, and
    /// agrees with the core's copy of each job.
    fn check_events(&self) {
        #[derive(Default)]
        struct Told {
            submitted: bool,
            status: Option<String>,
            last_key: Option<(u64, u8)>,
            finished: bool,
            archived: bool,
        }
        let rank = |status: &str| match status {
            "waiting" => 1,
            "running" => 2,
            "canceling" => 3,
            _ => 4,
        };
        let mut told: BTreeMap<JobId, Told> = BTreeMap::new();
        for (index, event) in self.events.iter().enumerate() {
            assert_eq!(
                event.seq,
                index as u64 + 1,
                "events are numbered without a gap"
            );
            let Some(id) = event.fields.get("id").and_then(Value::as_u64) else {
                continue;
            };
            let job = told.entry(id).or_default();
            let text = |name: &str| event.fields[name].as_str().unwrap().to_owned();
            assert!(
                !job.archived,
                "event {} of job {id} after its archiving",
                event.seq
            );
            match event.kind.as_str() {
                "job.submitted" => {
                    assert!(
                        !job.submitted,
                        "job {id} submitted twice (event {})",
                        event.seq
                    );
                    job.submitted = true;
                }
                "job.status" => {
                    assert!(
                        job.submitted && !job.finished,
                        "job {id}: event {}",
                        event.seq
                    );
                    let old = job.status.clone().unwrap_or_else(|| "queued".to_owned());
                    assert_eq!(
                        text("old"),
                        old,
                        "job {id}: event {} follows the last: {}",
                        event.seq,
                        self.events_of(id)
                    );
                    let key = (event.fields["opcode"].as_u64().unwrap(), rank(&text("new")));
                    assert!(
                        job.last_key < Some(key),
                        "job {id}: event {} goes back",
                        event.seq
                    );
                    job.last_key = Some(key);
                    job.status = Some(text("new"));
                }
                "job.finished" => {
                    assert!(
                        job.submitted && !job.finished,
                        "job {id}: event {}",
                        event.seq
                    );
                    assert_eq!(Some(text("status")), job.status, "job {id}: its end");
                    job.finished = true;
                }
                "job.archived" => {
                    assert!(job.finished, "job {id} archived unfinished");
                    job.archived = true;
                }
                _ => {}
            }
        }
        for id in self.disk.keys() {
            let Some(job) = self.core.job(*id) else {
                continue;
            };
            let status = job.status();
            let said = told.get(id);
            assert!(
                said.is_some_and(|said| said.submitted && !said.archived),
                "job {id} untold"
            );
            let said = said.unwrap();
            let said_status = said.status.clone().unwrap_or_else(|| "queued".to_owned());
            assert_eq!(said_status, status.name(), "job {id}: the events' status");
            assert_eq!(said.finished, status.is_final(), "job {id}: finished told");
        }
    }

    fn request(&mut self, command: Command) -> Seen {
        let effects = self.core.handle(
            Input::Request {
                conn: CONN,
                command,
            },
            self.now,
        );
        self.check();
        match self.carry_out(effects).reply {
            Some(reply) => Seen::Reply(reply),
            None => panic!("a request without a reply"),
        }
    }

    fn runner_writes(&mut self, job: Job) {
        self.disk.insert(job.id, job.clone());
        if self.core.is_started(job.id) {
            let effects = self.core.handle(Input::JobFileChanged { job }, self.now);
            self.check();
            self.carry_out(effects);
        }
    }

    fn kill(&mut self, id: JobId) {
        if self.processes.remove(&id).is_some() {
            self.exited.push(id);
        }
    }

    fn tell_exits(&mut self) {
        while let Some(id) = self.exited.pop() {
            let effects = self.core.handle(
                Input::RunnerExited {
                    id,
                    cause: None,
                    livelock_held: self.processes.contains_key(&id),
                },
                self.now,
            );
            self.check();
            self.carry_out(effects);
        }
    }

    /// A new core from the disk; the runners live on.
    fn restart(&mut self) {
        // A crash of the machine may take the last events that were not
        // yet synced (never seen by a reader): the restart says them again.
        self.restarts += 1;
        let lost = self.restarts % 4;
        self.events.truncate(self.events.len().saturating_sub(lost));
        let mut said = JobEvents::default();
        for event in &self.events {
            said.replay(event);
        }
        // luxid reads the archived files of jobs the sequence has not
        // said finished.
        let archived = said
            .unfinished()
            .filter_map(|id| self.archive.get(&id).cloned())
            .collect();
        let mut restored = Restored {
            serial: self.core.serial(),
            drained: self.drained,
            events: said,
            archived,
            filter_rules: self.filter_rules.clone(),
            ..Restored::default()
        };
        for job in self.disk.values() {
            if job.status().is_final() {
                restored.finished.push(FinishedJob::new(job));
                continue;
            }
            if self.processes.contains_key(&job.id) {
                restored.held.insert(job.id);
                if job.process_id == self.processes.get(&job.id).copied() {
                    restored.watched.insert(job.id);
                }
            }
            restored.jobs.push(job.clone());
        }
        let (core, effects) =
            QueueCore::new(self.config.clone(), restored, RandomState::new(), self.now);
        self.core = core;
        self.check();
        self.carry_out(effects);
    }

    fn spawn(&mut self, id: JobId) -> u32 {
        self.next_pid += 1;
        self.processes.insert(id, self.next_pid);
        self.started.push(id);
        self.next_pid
    }

    fn act(&mut self, action: Action) -> Result<(), String> {
        let refused = Err("disk full".to_owned());
        match action {
            Action::KillGroup { id, pid } => {
                if self.processes.get(&id) == Some(&pid) {
                    self.kill(id);
                    Ok(())
                } else {
                    Err("no such process".to_owned())
                }
            }
            _ if self.disk_full => refused,
            Action::WriteJob(job) => {
                self.disk.insert(job.id, job);
                Ok(())
            }
            Action::Archive(id) => {
                if let Some(job) = self.disk.remove(&id) {
                    self.archive.insert(id, job);
                }
                Ok(())
            }
            Action::SetDrain(drained) => {
                self.drained = drained;
                Ok(())
            }
            Action::WriteFilters(rules) => {
                self.filter_rules = rules;
                Ok(())
            }
            Action::WritePriorityRequest { .. } => Ok(()),
        }
    }

    /// Carries out effects as luxid's shell does, and what they lead to.
    fn carry_out(&mut self, effects: Vec<Effect>) -> Carried {
        let mut carried = Carried::default();
        let mut todo: VecDeque<Effect> = effects.into();
        while let Some(effect) = todo.pop_front() {
            let mut inputs = Vec::new();
            match effect {
                Effect::Events(events) => {
                    for event in events {
                        self.events.push(Event {
                            seq: self.events.len() as u64 + 1,
                            ts: Timestamp(0, 0),
                            kind: event.kind.to_owned(),
                            fields: event.fields,
                        });
                    }
                }
                Effect::Reply { reply, .. } => carried.reply = Some(reply),
                Effect::Hold { .. } | Effect::Release { .. } => {}
                Effect::Do { ticket, action } => {
                    let result = self.act(action);
                    inputs.push(Input::Done { ticket, result });
                }
                Effect::Commit { jobs, start } => {
                    let result = if self.disk_full {
                        Err("disk full".to_owned())
                    } else {
                        for id in &jobs {
                            let job = self.core.unfinished()[id].clone();
                            self.disk.insert(*id, job);
                        }
                        Ok(())
                    };
                    let mut spawned = Vec::new();
                    for id in start {
                        if result.is_ok() {
                            spawned.push((id, Ok(self.spawn(id))));
                        } else {
                            // It gets no word and exits at once.
                            spawned.push((id, Ok(0)));
                        }
                    }
                    carried.committed = Some(result.clone());
                    inputs.push(Input::Committed { result, spawned });
                }
                Effect::ReadJobStatus { ticket, id } => {
                    let status = self.disk.get(&id).map(Job::status);
                    inputs.push(Input::JobStatusRead { ticket, status });
                }
                Effect::Spawn { id } => {
                    let pid = self.spawn(id);
                    inputs.push(Input::Spawned { id, pid });
                }
                Effect::WatchRunner { id, pid } => {
                    if self.processes.get(&id) != Some(&pid) {
                        inputs.push(Input::RunnerExited {
                            id,
                            cause: None,
                            livelock_held: self.processes.contains_key(&id),
                        });
                    }
                }
                Effect::KillGroup { id, pid } => {
                    if self.processes.get(&id) == Some(&pid) {
                        self.kill(id);
                    }
                }
                Effect::Probe { id, path } => {
                    assert_eq!(path, PathBuf::from(livelock(id)));
                    let released = !self.processes.contains_key(&id);
                    if released && let Some(job) = self.disk.get(&id) {
                        inputs.push(Input::JobFileChanged { job: job.clone() });
                    }
                    inputs.push(Input::Probed { id, released });
                }
                Effect::Signal { .. }
                | Effect::WatchLivelock { .. }
                | Effect::UnwatchLivelock { .. }
                | Effect::RemoveLivelock { .. }
                | Effect::RemovePriorityRequest { .. }
                | Effect::FreeLocks { .. }
                | Effect::RequestWorkers { .. }
                | Effect::ReleaseWorkers { .. }
                | Effect::PrepareEnded { .. } => {}
            }
            let mut more = Vec::new();
            for input in inputs {
                more.extend(self.core.handle(input, self.now));
                self.check();
            }
            for effect in more.into_iter().rev() {
                todo.push_front(effect);
            }
            if todo.is_empty() && !self.exited.is_empty() {
                let id = self.exited.pop().expect("not empty");
                todo.extend(self.core.handle(
                    Input::RunnerExited {
                        id,
                        cause: None,
                        livelock_held: self.processes.contains_key(&id),
                    },
                    self.now,
                ));
                self.check();
            }
        }
        carried
    }
}

/// A submission of a turn whose commit was refused got an error instead.
fn refused_commit(seen: Seen, refused: bool) -> Seen {
    match seen {
        Seen::Reply(Ok(Answer::Submitted(_))) if refused => Seen::CommitRefused,
        Seen::Both(first, second) => Seen::Both(
            Box::new(refused_commit(*first, refused)),
            Box::new(refused_commit(*second, refused)),
        ),
        other => other,
    }
}

#[derive(Default)]
struct Carried {
    reply: Option<Reply>,
    committed: Option<Result<(), String>>,
}

fn livelock(id: JobId) -> String {
    format!("/ll/job_{id:06}_1000")
}

/// Compares what both saw of a step, and what can be seen of the queue
/// after it.
pub fn compare(model: &Model, world: &World, seen: (&Seen, &Seen), step: &Step) {
    assert_eq!(seen.0, seen.1, "the answers to {step:?} (model, core)");
    let core = &world.core;
    assert_eq!(core.serial(), model.serial, "serial after {step:?}");
    assert_eq!(
        core.is_drained(),
        model.drained,
        "drain flag after {step:?}"
    );
    for id in 1..=model.serial + 1 {
        let real = core.job(id).map(|job| job.status());
        let expected = model.jobs.get(&id).map(|job| job.status);
        assert_eq!(real, expected, "status of job {id} after {step:?}");
        let started = model.jobs.get(&id).is_some_and(|job| job.started);
        assert_eq!(
            core.is_started(id),
            started,
            "job {id} started after {step:?}: {:?}",
            core.runner(id)
        );
    }
    let mut queued: Vec<(i64, JobId)> = model
        .jobs
        .iter()
        .filter(|(_, job)| job.queued && !job.status.is_final())
        .map(|(&id, job)| (job.priority, id))
        .collect();
    queued.sort();
    let queued: Vec<JobId> = queued.into_iter().map(|(_, id)| id).collect();
    assert_eq!(
        core.queued().collect::<Vec<_>>(),
        queued,
        "queue after {step:?}"
    );
    assert_eq!(world.started, model.started, "starts after {step:?}");
}
