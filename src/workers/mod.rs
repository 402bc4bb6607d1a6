//! The worker registry (WORKERS.md): the machines, devices and slots jobs
//! hold for themselves while they run, with Boruta's six states and its
//! best-match assignment. A pure core like the lock manager: no I/O, no
//! clock (every change is given `now`), no JSON; wconfd owns one, makes
//! every change durable in its journal, and carries out the [`Effect`]s.
//!
//! Invariants ([`Registry::check_invariants`], after every change in tests
//! and debug builds):
//! 1. A worker has a holder exactly when it is RUNNING or BUSY.
//! 2. A job's workers are all held by it, and no worker has two holders.
//! 3. Every worker's `caps` hold its uuid under `"UUID"`; groups are a set.
//! 4. A worker's history holds at most [`HISTORY_MAX`] entries.
//! 5. A worker taken from a job told to end (`setWorkerFail`) is not
//!    handed on before that job released: until then it is not IDLE,
//!    RUNNING or BUSY, and in PREPARE its prepare waits (D51).

mod list;
mod matcher;
#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use crate::jobs::JobId;
use crate::limits::{WORKER_GROUPS_MAX, WORKERS_PER_JOB_MAX};

pub use list::{Direction, Filter, Listing, Order, Page, Sort, SortItem};
pub use matcher::Waiter;

use matcher::Matcher;

/// The capability naming a worker.
pub const UUID_CAP: &str = "UUID";

/// How many past holders a worker remembers.
pub const HISTORY_MAX: usize = 20;

/// A worker's state, with Boruta's wire strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Maintenance,
    Idle,
    Running,
    Failed,
    /// On the way to IDLE: its `prepare` program runs.
    Prepare,
    /// On the way to MAINTENANCE: its holder still runs.
    Busy,
}

impl State {
    pub const ALL: [State; 6] = [
        State::Maintenance,
        State::Idle,
        State::Running,
        State::Failed,
        State::Prepare,
        State::Busy,
    ];

    pub fn wire(self) -> &'static str {
        match self {
            State::Maintenance => "MAINTENANCE",
            State::Idle => "IDLE",
            State::Running => "RUNNING",
            State::Failed => "FAILED",
            State::Prepare => "PREPARE",
            State::Busy => "BUSY",
        }
    }

    pub fn parse(text: &str) -> Option<State> {
        State::ALL.into_iter().find(|state| state.wire() == text)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wire())
    }
}

/// One past holding of a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Holding {
    pub job: JobId,
    pub from: f64,
    pub to: f64,
    /// The job's final status as its wire string (`success`, `error`,
    /// `canceled`).
    pub status: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Worker {
    pub uuid: String,
    pub caps: BTreeMap<String, String>,
    pub groups: BTreeSet<String>,
    pub state: State,
    pub address: Option<String>,
    pub prepare: Option<Vec<String>>,
    pub fail_reason: Option<String>,
    pub holder: Option<JobId>,
    /// When the holder took it (meaningful while held).
    pub held_since: f64,
    /// When the state began.
    pub since: f64,
    /// Numbers the worker's prepares: a prepare's end counts only for the
    /// one under way. Never reused for a uuid, even across a
    /// deregistration (see [`Registry::register`]).
    pub prepare_seq: u64,
    /// The argv of the prepare under way (`prepare_seq`), if one runs: a
    /// registration that changes or drops `prepare` does not change what
    /// runs, nor that it must be canceled if a newer state wins.
    pub preparing: Option<Vec<String>>,
    pub history: VecDeque<Holding>,
}

impl Worker {
    /// Boruta's score: the fewer caps and groups, the better a fit.
    pub fn score(&self) -> usize {
        self.caps.len() + self.groups.len()
    }

    /// Whether it fits `request`, whatever its state.
    pub fn could_fit(&self, request: &Request) -> bool {
        (request.groups.is_empty() || !request.groups.is_disjoint(&self.groups))
            && request
                .caps
                .iter()
                .all(|(key, value)| self.caps.get(key) == Some(value))
    }
}

/// What a job asks for, from the `"workers"` field of its first opcode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    /// Any of these (empty: any group).
    pub groups: BTreeSet<String>,
    /// All of these, with equal values (empty: any caps).
    pub caps: BTreeMap<String, String>,
    /// All or nothing.
    pub count: usize,
}

impl Request {
    /// A request as a job gives it: `count` 1 by default, at most
    /// [`WORKERS_PER_JOB_MAX`].
    pub fn new(
        groups: BTreeSet<String>,
        caps: BTreeMap<String, String>,
        count: Option<u64>,
    ) -> Result<Request, String> {
        let count = match count {
            None => 1,
            Some(0) => return Err("workers: count must be at least 1".to_owned()),
            Some(count) if count > WORKERS_PER_JOB_MAX as u64 => {
                return Err(format!(
                    "workers: count {count} is over the limit of {WORKERS_PER_JOB_MAX}"
                ));
            }
            Some(count) => count as usize,
        };
        if groups.len() > WORKER_GROUPS_MAX {
            return Err(format!(
                "workers: {} groups, over the limit of {WORKER_GROUPS_MAX}",
                groups.len()
            ));
        }
        Ok(Request {
            groups,
            caps,
            count,
        })
    }
}

/// A refused call, with Boruta's texts where Boruta has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerError {
    NotFound,
    MissingUuid,
    FailInMaintenance,
    InvalidTransition,
    OnlyIdleOrMaintenance,
    NotFailedOrMaintenance,
    UnknownSortItem,
    BadAddress(String),
    TooManyGroups(usize),
    EmptyPrepare,
    NeverFits,
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerError::NotFound => f.write_str("Worker not found"),
            WorkerError::MissingUuid => f.write_str("Capabilities are missing UUID entry"),
            WorkerError::FailInMaintenance => {
                f.write_str("It is forbidden to set FAIL state when Worker is in MAINTENANCE state")
            }
            WorkerError::InvalidTransition => f.write_str("Invalid state transition was requested"),
            WorkerError::OnlyIdleOrMaintenance => {
                f.write_str("Only state changes to IDLE and MAINTENANCE are allowed")
            }
            WorkerError::NotFailedOrMaintenance => {
                f.write_str("Worker is not in FAIL or MAINTENANCE state")
            }
            WorkerError::UnknownSortItem => f.write_str("Unknown sort item"),
            WorkerError::BadAddress(address) => write!(
                f,
                "address {address:?}: a host:port address needs a port in 1-65535"
            ),
            WorkerError::TooManyGroups(count) => {
                write!(f, "{count} groups, over the limit of {WORKER_GROUPS_MAX}")
            }
            WorkerError::EmptyPrepare => f.write_str("prepare must name a program"),
            WorkerError::NeverFits => f.write_str(NO_WORKER_MATCHES),
        }
    }
}

impl std::error::Error for WorkerError {}

/// What the registry's owner must do, or may want to know, after a change
/// (in order).
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Run the worker's `prepare` argv as a job of its own; report its end
    /// with [`Registry::prepared`] and the same `seq`.
    Prepare {
        uuid: String,
        seq: u64,
        argv: Vec<String>,
    },
    /// The prepare `seq` under way lost to a newer state: cancel its job.
    CancelPrepare { uuid: String, seq: u64 },
    /// The worker became IDLE (Boruta's `OnWorkerIdle`); the registry has
    /// already given it to the first waiting job it fits, if any.
    Idle { uuid: String },
    /// The worker became FAILED (Boruta's `OnWorkerFail`).
    Failed { uuid: String },
    /// The job got these workers: start it.
    Assigned { job: JobId, uuids: Vec<String> },
    /// The job must end `error` with this reason: it held a worker that
    /// failed or was taken into maintenance with `kill`, or it waits for
    /// workers that no registered worker can ever be.
    EndJob { job: JobId, reason: String },
}

/// Boruta's `WorkerChange` listener: what a change of the registry tells
/// those who react to it, called with each [`Effect`] once the change is
/// durable. Every method has a no-op default.
pub trait WorkerChange {
    fn worker_idle_notification(&mut self, _uuid: &str) {}
    fn worker_fail_notification(&mut self, _uuid: &str) {}
    fn workers_assigned_notification(&mut self, _job: JobId, _uuids: &[String]) {}
    fn job_end_notification(&mut self, _job: JobId, _reason: &str) {}
    fn prepare_notification(&mut self, _uuid: &str, _seq: u64, _argv: &[String]) {}
    fn cancel_prepare_notification(&mut self, _uuid: &str, _seq: u64) {}
}

impl Effect {
    /// Tells `listener` of this effect.
    pub fn notify(&self, listener: &mut dyn WorkerChange) {
        match self {
            Effect::Prepare { uuid, seq, argv } => listener.prepare_notification(uuid, *seq, argv),
            Effect::CancelPrepare { uuid, seq } => listener.cancel_prepare_notification(uuid, *seq),
            Effect::Idle { uuid } => listener.worker_idle_notification(uuid),
            Effect::Failed { uuid } => listener.worker_fail_notification(uuid),
            Effect::Assigned { job, uuids } => listener.workers_assigned_notification(*job, uuids),
            Effect::EndJob { job, reason } => listener.job_end_notification(*job, reason),
        }
    }
}

/// One call of the registry, as its journal records it: replaying the
/// calls in order, each with its `now`, rebuilds the registry.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerOp {
    Register {
        caps: BTreeMap<String, String>,
        groups: Option<BTreeSet<String>>,
        address: Option<String>,
        prepare: Option<Vec<String>>,
    },
    Deregister {
        uuid: String,
    },
    SetState {
        uuid: String,
        state: String,
        kill: bool,
    },
    SetFail {
        uuid: String,
        reason: String,
    },
    SetGroups {
        uuid: String,
        groups: BTreeSet<String>,
    },
    Request {
        job: JobId,
        priority: i64,
        request: Request,
    },
    Release {
        job: JobId,
        status: String,
    },
    Prepared {
        uuid: String,
        seq: u64,
        outcome: Result<(), String>,
    },
}

/// The registry as its snapshot keeps it (the indexes are rebuilt).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SavedRegistry {
    pub workers: Vec<Worker>,
    /// Waiting jobs: job, priority, request.
    pub waiters: Vec<(JobId, i64, Request)>,
    pub condemned: Vec<(JobId, String)>,
    /// Workers taken from a condemned job that has not released yet.
    pub draining: Vec<(String, JobId)>,
    /// The highest prepare number handed out.
    pub prepare_seq_high: u64,
}

/// A worker's change, for the event sequence (EVENTS.md `worker.*`):
/// `old` is `None` at registration, `new` at deregistration; equal for a
/// change of groups.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub uuid: String,
    pub old: Option<State>,
    pub new: Option<State>,
    pub holder: Option<JobId>,
    pub reason: Option<String>,
    pub groups: Vec<String>,
}

/// The registry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registry {
    workers: BTreeMap<String, Worker>,
    /// Each holder's workers.
    holdings: BTreeMap<JobId, BTreeSet<String>>,
    matcher: Matcher,
    /// Jobs told to end `error` ([`Effect::EndJob`]), until their release.
    condemned: BTreeMap<JobId, String>,
    /// Workers taken from a condemned job (`setWorkerFail` on a held
    /// worker) while its processes may still use them: each waits for
    /// that job's release before its prepare starts. Kept by uuid, so a
    /// worker deregistered and registered again waits too.
    draining: BTreeMap<String, JobId>,
    /// The highest prepare number handed out: a worker registered anew
    /// numbers its prepares after it, so (uuid, seq) never names two
    /// prepares (luxid keeps prepare jobs by it).
    prepare_seq_high: u64,
    /// Workers that became IDLE during the current call, to be matched.
    became_idle: Vec<String>,
    /// `[workers] quarantine_after` (0: off).
    quarantine_after: usize,
    /// Every change of a worker since the last take, when asked for.
    transitions: Option<Vec<Transition>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// From now on every change of a worker is kept for
    /// [`Registry::take_transitions`].
    pub fn record_transitions(&mut self) {
        self.transitions.get_or_insert_with(Vec::new);
    }

    /// The changes since the last call, in order.
    pub fn take_transitions(&mut self) -> Vec<Transition> {
        self.transitions
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn note(&mut self, worker: &Worker, old: Option<State>, new: Option<State>) {
        if let Some(transitions) = &mut self.transitions {
            transitions.push(Transition {
                uuid: worker.uuid.clone(),
                old,
                new,
                holder: worker.holder,
                reason: worker.fail_reason.clone(),
                groups: worker.groups.iter().cloned().collect(),
            });
        }
    }

    /// A registry that quarantines a worker after `after` holders in a
    /// row ended in `error` (0: never).
    pub fn with_quarantine_after(after: usize) -> Registry {
        Registry {
            quarantine_after: after,
            ..Registry::default()
        }
    }

    pub fn saved(&self) -> SavedRegistry {
        SavedRegistry {
            workers: self.workers.values().cloned().collect(),
            waiters: self
                .matcher
                .waiters()
                .map(|(job, waiter)| (job, waiter.priority, waiter.request.clone()))
                .collect(),
            condemned: self
                .condemned
                .iter()
                .map(|(job, reason)| (*job, reason.clone()))
                .collect(),
            draining: self
                .draining
                .iter()
                .map(|(uuid, job)| (uuid.clone(), *job))
                .collect(),
            prepare_seq_high: self.prepare_seq_high,
        }
    }

    /// The registry of a snapshot; an impossible one is refused, named.
    pub fn restore(saved: SavedRegistry, quarantine_after: usize) -> Result<Registry, String> {
        let mut registry = Registry::with_quarantine_after(quarantine_after);
        registry.prepare_seq_high = saved.prepare_seq_high;
        for worker in saved.workers {
            let uuid = worker.uuid.clone();
            registry.prepare_seq_high = registry.prepare_seq_high.max(worker.prepare_seq);
            if worker.preparing.is_some() && worker.state != State::Prepare {
                return Err(format!(
                    "worker {uuid}: a prepare under way in {}",
                    worker.state
                ));
            }
            if worker.caps.get(UUID_CAP) != Some(&uuid) {
                return Err(format!("worker {uuid}: its caps do not hold its UUID"));
            }
            if worker.holder.is_some() != matches!(worker.state, State::Running | State::Busy) {
                return Err(format!(
                    "worker {uuid}: in {} with holder {:?}",
                    worker.state, worker.holder
                ));
            }
            if let Some(job) = worker.holder {
                registry
                    .holdings
                    .entry(job)
                    .or_default()
                    .insert(uuid.clone());
            }
            if worker.state == State::Idle {
                registry.matcher.add_idle(&worker);
            }
            if registry.workers.insert(uuid.clone(), worker).is_some() {
                return Err(format!("worker {uuid} is listed twice"));
            }
        }
        for (job, priority, request) in saved.waiters {
            if registry.holdings.contains_key(&job) {
                return Err(format!("job {job} holds workers and waits"));
            }
            registry.matcher.add_waiter(job, priority, request);
        }
        for (job, reason) in saved.condemned {
            if registry.matcher.waiter(job).is_some() {
                return Err(format!("job {job} is told to end yet waits"));
            }
            registry.condemned.insert(job, reason);
        }
        for (uuid, job) in saved.draining {
            if !registry.condemned.contains_key(&job) {
                return Err(format!(
                    "worker {uuid} waits for job {job}, which is not told to end"
                ));
            }
            let state = registry.workers.get(&uuid).map(|worker| worker.state);
            if matches!(state, Some(State::Idle | State::Running | State::Busy)) {
                return Err(format!(
                    "worker {uuid} waits for job {job}, yet is held or IDLE"
                ));
            }
            if let Some(worker) = registry.workers.get_mut(&uuid) {
                // Its prepare has not started (older snapshots said so
                // only by the draining entry).
                worker.preparing = None;
            }
            registry.draining.insert(uuid, job);
        }
        if let Some((job, _)) = registry
            .matcher
            .waiters()
            .find(|(_, waiter)| registry.best_fit(&waiter.request).is_some())
        {
            return Err(format!("job {job} waits, yet IDLE workers fit it"));
        }
        Ok(registry)
    }

    pub fn get(&self, uuid: &str) -> Option<&Worker> {
        self.workers.get(uuid)
    }

    pub fn workers(&self) -> impl Iterator<Item = &Worker> {
        self.workers.values()
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The workers `job` holds.
    pub fn held_by(&self, job: JobId) -> impl Iterator<Item = &Worker> {
        self.holdings
            .get(&job)
            .into_iter()
            .flatten()
            .filter_map(|uuid| self.workers.get(uuid))
    }

    /// Every holder with its workers.
    pub fn holdings(&self) -> impl Iterator<Item = (JobId, &BTreeSet<String>)> {
        self.holdings.iter().map(|(job, uuids)| (*job, uuids))
    }

    /// The jobs waiting for workers, by job id.
    pub fn waiters(&self) -> impl Iterator<Item = (JobId, &Waiter)> {
        self.matcher.waiters()
    }

    pub fn waiter(&self, job: JobId) -> Option<&Waiter> {
        self.matcher.waiter(job)
    }

    /// The jobs told to end `error`, with the reason, until released.
    pub fn condemned(&self) -> impl Iterator<Item = (JobId, &str)> {
        self.condemned
            .iter()
            .map(|(job, reason)| (*job, reason.as_str()))
    }

    /// The job a worker waits for before its prepare may start (see
    /// [`Registry::set_fail`]).
    pub fn draining_for(&self, uuid: &str) -> Option<JobId> {
        self.draining.get(uuid).copied()
    }

    pub fn idle_count(&self) -> usize {
        self.matcher.idle_count()
    }

    /// Carries out one journaled call (the way wconfd's requests and its
    /// replay change the registry alike).
    pub fn apply(&mut self, op: &WorkerOp, now: f64) -> Result<Vec<Effect>, WorkerError> {
        match op {
            WorkerOp::Register {
                caps,
                groups,
                address,
                prepare,
            } => self.register(
                caps.clone(),
                groups.clone(),
                address.clone(),
                prepare.clone(),
                now,
            ),
            WorkerOp::Deregister { uuid } => self.deregister(uuid),
            WorkerOp::SetState { uuid, state, kill } => self.set_state(uuid, state, *kill, now),
            WorkerOp::SetFail { uuid, reason } => self.set_fail(uuid, reason, now),
            WorkerOp::SetGroups { uuid, groups } => self.set_groups(uuid, groups.clone(), now),
            WorkerOp::Request {
                job,
                priority,
                request,
            } => self.request(*job, *priority, request.clone(), now),
            WorkerOp::Release { job, status } => Ok(self.release(*job, status, now)),
            WorkerOp::Prepared { uuid, seq, outcome } => {
                Ok(self.prepared(uuid, *seq, outcome.clone(), now))
            }
        }
    }

    // ----- the calls -----

    /// `registerWorker`: a new worker enters MAINTENANCE; a FAILED one
    /// registered again unchanged is prepared; a changed one goes to
    /// MAINTENANCE (BUSY first if held) with the new caps and address.
    /// Jobs waiting for what it alone could fit before end. A new worker
    /// numbers its prepares after every number handed out before.
    pub fn register(
        &mut self,
        caps: BTreeMap<String, String>,
        groups: Option<BTreeSet<String>>,
        address: Option<String>,
        prepare: Option<Vec<String>>,
        now: f64,
    ) -> Result<Vec<Effect>, WorkerError> {
        let uuid = caps.get(UUID_CAP).ok_or(WorkerError::MissingUuid)?.clone();
        if let Some(address) = &address {
            check_address(address)?;
        }
        if let Some(groups) = groups
            .as_ref()
            .filter(|groups| groups.len() > WORKER_GROUPS_MAX)
        {
            return Err(WorkerError::TooManyGroups(groups.len()));
        }
        if prepare.as_ref().is_some_and(Vec::is_empty) {
            return Err(WorkerError::EmptyPrepare);
        }
        let mut effects = Vec::new();
        let Some(worker) = self.workers.get(&uuid) else {
            let key = uuid.clone();
            self.workers.insert(
                key.clone(),
                Worker {
                    uuid,
                    caps,
                    groups: groups.unwrap_or_default(),
                    state: State::Maintenance,
                    address,
                    prepare,
                    fail_reason: None,
                    holder: None,
                    held_since: now,
                    since: now,
                    prepare_seq: self.prepare_seq_high,
                    preparing: None,
                    history: VecDeque::new(),
                },
            );
            if self.transitions.is_some() {
                let worker = self.workers[&key].clone();
                self.note(&worker, None, Some(State::Maintenance));
            }
            return Ok(effects);
        };
        let changed = worker.caps != caps || worker.address != address;
        let was = worker.clone();
        let was_idle = worker.state == State::Idle;
        if changed {
            let state = if worker.holder.is_some() {
                State::Busy
            } else {
                State::Maintenance
            };
            // Leaves the IDLE index under the caps it was filed with.
            self.enter(&uuid, state, now, &mut effects);
        } else if was_idle {
            self.matcher.remove_idle(worker);
        }
        let worker = self.workers.get_mut(&uuid).expect("looked up above");
        if let Some(groups) = groups {
            worker.groups = groups;
        }
        worker.prepare = prepare;
        if changed {
            worker.caps = caps;
            worker.address = address;
        } else if was_idle {
            // Its groups may have changed: filed and matched again, as
            // `setWorkerGroups` does.
            self.matcher.add_idle(&self.workers[&uuid]);
            self.became_idle.push(uuid.clone());
            effects.push(Effect::Idle { uuid: uuid.clone() });
        } else if worker.state == State::Failed {
            self.enter(&uuid, State::Prepare, now, &mut effects);
        }
        self.end_impossible_waiters(&was, &mut effects);
        self.settle(now, &mut effects);
        Ok(effects)
    }

    /// `deregisterWorker`: only a MAINTENANCE or FAILED worker goes. Jobs
    /// waiting for workers that no registered worker can be any more end.
    pub fn deregister(&mut self, uuid: &str) -> Result<Vec<Effect>, WorkerError> {
        let worker = self.workers.get(uuid).ok_or(WorkerError::NotFound)?;
        if !matches!(worker.state, State::Maintenance | State::Failed) {
            return Err(WorkerError::NotFailedOrMaintenance);
        }
        let worker = self.workers.remove(uuid).expect("looked up above");
        self.note(&worker, Some(worker.state), None);
        let mut effects = Vec::new();
        self.end_impossible_waiters(&worker, &mut effects);
        Ok(effects)
    }

    /// The jobs waiting for what `was` (a worker as it was before it went
    /// or changed) could fit that no registered worker can fit any more
    /// end (`NO_WORKER_MATCHES`).
    fn end_impossible_waiters(&mut self, was: &Worker, effects: &mut Vec<Effect>) {
        for job in self.matcher.jobs_fitting(was) {
            let request = &self.matcher.waiter(job).expect("just listed").request;
            if !self.could_ever_fit(request) {
                self.matcher.remove_waiter(job);
                self.condemn(job, NO_WORKER_MATCHES.to_owned(), effects);
            }
        }
    }

    /// `setWorkerState`: to IDLE (through PREPARE) from MAINTENANCE, or to
    /// MAINTENANCE (through BUSY while held; `kill` ends the holder).
    pub fn set_state(
        &mut self,
        uuid: &str,
        state: &str,
        kill: bool,
        now: f64,
    ) -> Result<Vec<Effect>, WorkerError> {
        let target = match state {
            "IDLE" => State::Idle,
            "MAINTENANCE" => State::Maintenance,
            _ => return Err(WorkerError::OnlyIdleOrMaintenance),
        };
        let worker = self.workers.get(uuid).ok_or(WorkerError::NotFound)?;
        let mut effects = Vec::new();
        match (target, worker.state) {
            (State::Idle, State::Maintenance) => {
                self.enter(uuid, State::Prepare, now, &mut effects)
            }
            (State::Idle, State::Prepare) => {}
            (State::Idle, _) => return Err(WorkerError::InvalidTransition),
            (_, State::Busy) => {
                if kill {
                    self.end_holder(uuid, "was put in MAINTENANCE", &mut effects);
                }
            }
            (_, _) if worker.holder.is_some() => {
                self.enter(uuid, State::Busy, now, &mut effects);
                if kill {
                    self.end_holder(uuid, "was put in MAINTENANCE", &mut effects);
                }
            }
            (_, _) => self.enter(uuid, State::Maintenance, now, &mut effects),
        }
        self.settle(now, &mut effects);
        Ok(effects)
    }

    /// `setWorkerFail`: FAILED with `reason`; a holder is ended, and the
    /// worker taken from it at once, but not handed on before the holder
    /// released (its programs may still use the worker): until then a
    /// PREPARE waits.
    pub fn set_fail(
        &mut self,
        uuid: &str,
        reason: &str,
        now: f64,
    ) -> Result<Vec<Effect>, WorkerError> {
        let worker = self.workers.get_mut(uuid).ok_or(WorkerError::NotFound)?;
        if matches!(worker.state, State::Maintenance | State::Busy) {
            return Err(WorkerError::FailInMaintenance);
        }
        worker.fail_reason = Some(reason.to_owned());
        if let Some(job) = worker.holder {
            self.draining.insert(uuid.to_owned(), job);
        }
        let mut effects = Vec::new();
        self.end_holder(uuid, &format!("failed: {reason}"), &mut effects);
        self.release_holding(uuid, now, "error");
        self.enter(uuid, State::Failed, now, &mut effects);
        self.settle(now, &mut effects);
        Ok(effects)
    }

    /// `setWorkerGroups`: an IDLE worker is matched again at once; jobs
    /// waiting for what it alone could fit before end.
    pub fn set_groups(
        &mut self,
        uuid: &str,
        groups: BTreeSet<String>,
        now: f64,
    ) -> Result<Vec<Effect>, WorkerError> {
        if groups.len() > WORKER_GROUPS_MAX {
            return Err(WorkerError::TooManyGroups(groups.len()));
        }
        let worker = self.workers.get(uuid).ok_or(WorkerError::NotFound)?;
        let was = worker.clone();
        let idle = worker.state == State::Idle;
        if idle {
            self.matcher.remove_idle(worker);
        }
        let worker = self.workers.get_mut(uuid).expect("looked up above");
        worker.groups = groups;
        if self.transitions.is_some() {
            let worker = self.workers[uuid].clone();
            self.note(&worker, Some(worker.state), Some(worker.state));
        }
        let mut effects = Vec::new();
        self.end_impossible_waiters(&was, &mut effects);
        if idle {
            self.matcher.add_idle(&self.workers[uuid]);
            self.became_idle.push(uuid.to_owned());
            effects.push(Effect::Idle {
                uuid: uuid.to_owned(),
            });
        }
        self.settle(now, &mut effects);
        Ok(effects)
    }

    /// The prepare job `seq` of a worker ended: IDLE on success, FAILED
    /// with its reason. Ignored unless the worker still runs that prepare
    /// (a newer state won, or it is an old one).
    pub fn prepared(
        &mut self,
        uuid: &str,
        seq: u64,
        outcome: Result<(), String>,
        now: f64,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        match self.workers.get(uuid) {
            Some(worker)
                if worker.state == State::Prepare
                    && worker.prepare_seq == seq
                    && !self.draining.contains_key(uuid) => {}
            _ => return effects,
        }
        if let Some(worker) = self.workers.get_mut(uuid) {
            // It ended by itself: nothing to cancel.
            worker.preparing = None;
        }
        match outcome {
            Ok(()) => self.enter(uuid, State::Idle, now, &mut effects),
            Err(reason) => {
                if let Some(worker) = self.workers.get_mut(uuid) {
                    worker.fail_reason = Some(format!("prepare failed: {reason}"));
                }
                self.enter(uuid, State::Failed, now, &mut effects);
            }
        }
        self.settle(now, &mut effects);
        effects
    }

    /// A job asks for workers: given the best IDLE ones at once if they
    /// are there, else it waits in (priority, job) order. Asking again
    /// changes the priority of a waiting job and nothing else. Refused if
    /// no registered worker could ever fit.
    pub fn request(
        &mut self,
        job: JobId,
        priority: i64,
        request: Request,
        now: f64,
    ) -> Result<Vec<Effect>, WorkerError> {
        let mut effects = Vec::new();
        if self.holdings.contains_key(&job) || self.condemned.contains_key(&job) {
            return Ok(effects);
        }
        if let Some(waiter) = self.matcher.waiter(job) {
            let request = waiter.request.clone();
            self.matcher.add_waiter(job, priority, request);
            return Ok(effects);
        }
        if !self.could_ever_fit(&request) {
            return Err(WorkerError::NeverFits);
        }
        let shape_waits = self.matcher.first_of_shape(&request).is_some();
        self.matcher.add_waiter(job, priority, request.clone());
        // A shape with waiters already could not be served.
        if !shape_waits {
            self.serve_shape(&request, now, &mut effects);
        }
        Ok(effects)
    }

    /// The job ended (`status`: its final status), was canceled, or died:
    /// it stops waiting, and each of its workers goes to PREPARE (BUSY ones
    /// to MAINTENANCE, quarantined ones to FAILED). Releasing a job that
    /// holds and waits for nothing changes nothing.
    pub fn release(&mut self, job: JobId, status: &str, now: f64) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.matcher.remove_waiter(job);
        if self.condemned.remove(&job).is_some() {
            let drained: Vec<String> = self
                .draining
                .iter()
                .filter(|(_, holder)| **holder == job)
                .map(|(uuid, _)| uuid.clone())
                .collect();
            for uuid in drained {
                self.draining.remove(&uuid);
                // A PREPARE that waited for the job starts now.
                if self.workers.get(&uuid).map(|worker| worker.state) == Some(State::Prepare) {
                    self.enter_quietly(&uuid, State::Prepare, now, &mut effects);
                }
            }
        }
        let uuids = self.holdings.get(&job).cloned().unwrap_or_default();
        for uuid in uuids {
            let busy = self.workers.get(&uuid).map(|worker| worker.state) == Some(State::Busy);
            self.release_holding(&uuid, now, status);
            if busy {
                self.enter(&uuid, State::Maintenance, now, &mut effects);
            } else if let Some(reason) = self.quarantine_reason(&uuid) {
                if let Some(worker) = self.workers.get_mut(&uuid) {
                    worker.fail_reason = Some(reason);
                }
                self.enter(&uuid, State::Failed, now, &mut effects);
            } else {
                self.enter(&uuid, State::Prepare, now, &mut effects);
            }
        }
        self.settle(now, &mut effects);
        effects
    }

    // ----- matching -----

    /// Whether some registered worker could fit `request`, whatever its
    /// state (a request none ever could is refused at submit).
    pub fn could_ever_fit(&self, request: &Request) -> bool {
        self.workers
            .values()
            .filter(|worker| worker.could_fit(request))
            .take(request.count)
            .count()
            == request.count
    }

    /// The best IDLE workers for `request`: the `count` smallest by
    /// (score, uuid), or `None` if fewer fit (all or nothing).
    pub fn best_fit(&self, request: &Request) -> Option<Vec<String>> {
        self.matcher.best_fit(request, &self.workers)
    }

    /// Gives IDLE `uuids` to `job` (RUNNING). Refused whole if any is not
    /// IDLE.
    fn assign(&mut self, job: JobId, uuids: &[String], now: f64) -> Result<(), WorkerError> {
        for uuid in uuids {
            match self.workers.get(uuid) {
                None => return Err(WorkerError::NotFound),
                Some(worker) if worker.state != State::Idle => {
                    return Err(WorkerError::InvalidTransition);
                }
                Some(_) => {}
            }
        }
        let mut effects = Vec::new();
        for uuid in uuids {
            // The holder first, so the change names it.
            if let Some(worker) = self.workers.get_mut(uuid) {
                worker.holder = Some(job);
                worker.held_since = now;
            }
            self.enter(uuid, State::Running, now, &mut effects);
            self.holdings.entry(job).or_default().insert(uuid.clone());
        }
        debug_assert!(effects.is_empty());
        Ok(())
    }

    /// Serves the waiting jobs of `request`'s shape, first first, while
    /// the IDLE workers last.
    fn serve_shape(&mut self, request: &Request, now: f64, effects: &mut Vec<Effect>) {
        while let Some((_, job)) = self.matcher.first_of_shape(request) {
            let Some(uuids) = self.best_fit(request) else {
                return;
            };
            self.matcher.remove_waiter(job);
            self.assign(job, &uuids, now)
                .expect("the best fit is of IDLE workers");
            effects.push(Effect::Assigned { job, uuids });
        }
    }

    /// Matches the workers that became IDLE during this call: the waiting
    /// jobs they could serve, by priority then id, each given its best
    /// fit whole if the IDLE workers have it (Boruta's reaction to
    /// `OnWorkerIdle`).
    fn settle(&mut self, now: f64, effects: &mut Vec<Effect>) {
        // Only shapes some new IDLE worker fits can be served (nothing
        // waited that the IDLE workers could serve before), and serving
        // only takes workers: so the candidate shapes, by their first
        // waiter, are served in (priority, job) order over them all, each
        // first waiter its best fit at that moment, until none can be.
        // Once none of the new IDLE workers is left, the IDLE workers are
        // some of those before: nothing more can be served.
        let mut candidates: BTreeMap<(i64, JobId), Request> = BTreeMap::new();
        let fresh = std::mem::take(&mut self.became_idle);
        for uuid in &fresh {
            if let Some(worker) = self
                .workers
                .get(uuid)
                .filter(|worker| worker.state == State::Idle)
            {
                candidates.extend(self.matcher.shapes_fitting(worker));
            }
        }
        let any_fresh_idle = |registry: &Registry| {
            fresh.iter().any(|uuid| {
                registry
                    .workers
                    .get(uuid)
                    .is_some_and(|worker| worker.state == State::Idle)
            })
        };
        while any_fresh_idle(self)
            && let Some(((_, job), request)) = candidates.pop_first()
        {
            let Some(uuids) = self.best_fit(&request) else {
                continue;
            };
            self.matcher.remove_waiter(job);
            self.assign(job, &uuids, now)
                .expect("the best fit is of IDLE workers");
            effects.push(Effect::Assigned { job, uuids });
            if let Some(next) = self.matcher.first_of_shape(&request) {
                candidates.insert(next, request);
            }
        }
    }

    // ----- inside -----

    /// Ends the worker's holding (if any), into its history.
    fn release_holding(&mut self, uuid: &str, now: f64, status: &str) {
        let Some(worker) = self.workers.get_mut(uuid) else {
            return;
        };
        let Some(job) = worker.holder.take() else {
            return;
        };
        if worker.history.len() == HISTORY_MAX {
            worker.history.pop_front();
        }
        worker.history.push_back(Holding {
            job,
            from: worker.held_since,
            to: now,
            status: status.to_owned(),
        });
        if let Some(held) = self.holdings.get_mut(&job) {
            held.remove(uuid);
            if held.is_empty() {
                self.holdings.remove(&job);
            }
        }
    }

    /// The reason to quarantine a worker whose last `quarantine_after`
    /// holders, all different jobs, ended in `error`.
    fn quarantine_reason(&self, uuid: &str) -> Option<String> {
        let after = self.quarantine_after;
        let worker = self.workers.get(uuid)?;
        if after == 0 || worker.history.len() < after {
            return None;
        }
        let last: Vec<&Holding> = worker.history.iter().rev().take(after).collect();
        let jobs: BTreeSet<JobId> = last.iter().map(|holding| holding.job).collect();
        if jobs.len() < after || last.iter().any(|holding| holding.status != "error") {
            return None;
        }
        let named: Vec<String> = last.iter().rev().map(|h| h.job.to_string()).collect();
        Some(format!(
            "quarantined: {after} holders in a row ended in error (jobs {})",
            named.join(", ")
        ))
    }

    fn end_holder(&mut self, uuid: &str, why: &str, effects: &mut Vec<Effect>) {
        if let Some(job) = self.workers.get(uuid).and_then(|worker| worker.holder) {
            self.condemn(job, format!("worker {uuid} {why}"), effects);
        }
    }

    fn condemn(&mut self, job: JobId, reason: String, effects: &mut Vec<Effect>) {
        if self.condemned.contains_key(&job) {
            return; // told once: the first reason stands
        }
        self.condemned.insert(job, reason.clone());
        effects.push(Effect::EndJob { job, reason });
    }

    /// Moves a worker into `state`, with what entering it asks for; a
    /// running prepare it leaves is canceled.
    fn enter(&mut self, uuid: &str, state: State, now: f64, effects: &mut Vec<Effect>) {
        if let Some(worker) = self.workers.get_mut(uuid)
            && state != State::Prepare
            && worker.preparing.take().is_some()
        {
            effects.push(Effect::CancelPrepare {
                uuid: uuid.to_owned(),
                seq: worker.prepare_seq,
            });
        }
        self.enter_quietly(uuid, state, now, effects);
    }

    /// [`Registry::enter`] without canceling a prepare.
    fn enter_quietly(&mut self, uuid: &str, state: State, now: f64, effects: &mut Vec<Effect>) {
        let Some(worker) = self.workers.get_mut(uuid) else {
            return;
        };
        if worker.state == State::Idle && state != State::Idle {
            self.matcher.remove_idle(worker);
        }
        let worker = self.workers.get_mut(uuid).expect("looked up above");
        let was_idle = worker.state == State::Idle;
        let old = worker.state;
        worker.state = state;
        worker.since = now;
        if self.transitions.is_some() {
            let worker = self.workers[uuid].clone();
            self.note(&worker, Some(old), Some(state));
        }
        let worker = self.workers.get_mut(uuid).expect("looked up above");
        match state {
            // It waits for the job it was taken from (see `set_fail`).
            State::Prepare if self.draining.contains_key(uuid) => {}
            State::Prepare => match worker.prepare.clone() {
                Some(argv) => {
                    self.prepare_seq_high += 1;
                    worker.prepare_seq = self.prepare_seq_high;
                    worker.preparing = Some(argv.clone());
                    effects.push(Effect::Prepare {
                        uuid: uuid.to_owned(),
                        seq: worker.prepare_seq,
                        argv,
                    });
                }
                None => self.enter_quietly(uuid, State::Idle, now, effects),
            },
            State::Idle if !was_idle => {
                self.matcher.add_idle(&self.workers[uuid]);
                self.became_idle.push(uuid.to_owned());
                effects.push(Effect::Idle {
                    uuid: uuid.to_owned(),
                });
            }
            State::Failed => effects.push(Effect::Failed {
                uuid: uuid.to_owned(),
            }),
            _ => {}
        }
    }

    /// Panics if an invariant of the module doc does not hold.
    pub fn check_invariants(&self) {
        for (uuid, worker) in &self.workers {
            assert_eq!(&worker.uuid, uuid, "a worker is filed under its uuid");
            assert_eq!(
                worker.caps.get(UUID_CAP),
                Some(uuid),
                "worker {uuid}: caps hold its UUID"
            );
            assert_eq!(
                worker.holder.is_some(),
                matches!(worker.state, State::Running | State::Busy),
                "worker {uuid} in {}: held exactly when RUNNING or BUSY",
                worker.state
            );
            if let Some(job) = worker.holder {
                assert!(
                    self.holdings
                        .get(&job)
                        .is_some_and(|held| held.contains(uuid)),
                    "worker {uuid}: its holder {job} lists it"
                );
            }
            assert!(worker.history.len() <= HISTORY_MAX);
        }
        for (job, held) in &self.holdings {
            assert!(!held.is_empty(), "job {job} holds no workers yet is listed");
            assert!(
                self.matcher.waiter(*job).is_none(),
                "job {job} holds workers and waits"
            );
            for uuid in held {
                assert_eq!(
                    self.workers.get(uuid).and_then(|worker| worker.holder),
                    Some(*job),
                    "job {job} lists worker {uuid}, which it does not hold"
                );
            }
        }
        for (job, _) in self.matcher.waiters() {
            assert!(
                !self.condemned.contains_key(&job),
                "job {job} is told to end yet waits"
            );
        }
        for (uuid, job) in &self.draining {
            assert!(
                self.condemned.contains_key(job),
                "worker {uuid} waits for job {job}, which is not told to end"
            );
            let state = self.workers.get(uuid).map(|worker| worker.state);
            assert!(
                !matches!(state, Some(State::Idle | State::Running | State::Busy)),
                "worker {uuid} waits for job {job}, yet is {state:?}"
            );
        }
        assert!(self.became_idle.is_empty(), "every IDLE worker was matched");
        self.matcher.check_invariants(&self.workers);
        // Nothing waits that the IDLE workers could serve now.
        for (job, waiter) in self.matcher.waiters() {
            assert!(
                self.best_fit(&waiter.request).is_none(),
                "job {job} waits, yet IDLE workers fit it"
            );
        }
    }
}

/// Why a waiting job ends when the last worker that could fit it goes.
pub const NO_WORKER_MATCHES: &str = "no registered worker matches its workers request";

/// A `host:port` address needs a port in 1-65535; any other form (a URL,
/// a device path) is the operator's.
fn check_address(address: &str) -> Result<(), WorkerError> {
    if address.contains('/') {
        return Ok(());
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Ok(());
    };
    if host.is_empty() || port.is_empty() || !port.bytes().all(|byte| byte.is_ascii_digit()) {
        return Ok(());
    }
    match port.parse::<u32>() {
        Ok(1..=65535) => Ok(()),
        _ => Err(WorkerError::BadAddress(address.to_owned())),
    }
}
