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

mod list;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use crate::jobs::JobId;
use crate::limits::{WORKER_GROUPS_MAX, WORKERS_PER_JOB_MAX};

pub use list::{Direction, Filter, Order, Page, Sort, SortItem};

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
        }
    }
}

impl std::error::Error for WorkerError {}

/// What the registry's owner must do after a change (in order).
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Run the worker's `prepare` argv as a job of its own; report its end
    /// with [`Registry::prepared`].
    Prepare { uuid: String, argv: Vec<String> },
    /// A prepare under way lost to a newer state: cancel its job.
    CancelPrepare { uuid: String },
    /// The worker became IDLE: a waiting job may now fit.
    Idle { uuid: String },
    /// The holder must die: it ends `error` with this reason.
    KillHolder { job: JobId, reason: String },
}

/// The registry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registry {
    workers: BTreeMap<String, Worker>,
    /// Each holder's workers.
    holdings: BTreeMap<JobId, BTreeSet<String>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
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

    // ----- the calls -----

    /// `registerWorker`: a new worker enters MAINTENANCE; a FAILED one
    /// registered again unchanged is prepared; a changed one goes to
    /// MAINTENANCE (BUSY first if held) with the new caps and address.
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
        let Some(worker) = self.workers.get_mut(&uuid) else {
            self.workers.insert(
                uuid.clone(),
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
                    history: VecDeque::new(),
                },
            );
            return Ok(effects);
        };
        if let Some(groups) = groups {
            worker.groups = groups;
        }
        worker.prepare = prepare;
        let changed = worker.caps != caps || worker.address != address;
        if changed {
            worker.caps = caps;
            worker.address = address;
            let state = if worker.holder.is_some() {
                State::Busy
            } else {
                State::Maintenance
            };
            self.enter(&uuid, state, now, &mut effects);
        } else if worker.state == State::Failed {
            self.enter(&uuid, State::Prepare, now, &mut effects);
        }
        Ok(effects)
    }

    /// `deregisterWorker`: only a MAINTENANCE or FAILED worker goes.
    pub fn deregister(&mut self, uuid: &str) -> Result<(), WorkerError> {
        let worker = self.workers.get(uuid).ok_or(WorkerError::NotFound)?;
        if !matches!(worker.state, State::Maintenance | State::Failed) {
            return Err(WorkerError::NotFailedOrMaintenance);
        }
        self.workers.remove(uuid);
        Ok(())
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
                    self.kill_holder(uuid, "put in MAINTENANCE", &mut effects);
                }
            }
            (_, _) if worker.holder.is_some() => {
                self.enter(uuid, State::Busy, now, &mut effects);
                if kill {
                    self.kill_holder(uuid, "put in MAINTENANCE", &mut effects);
                }
            }
            (_, _) => self.enter(uuid, State::Maintenance, now, &mut effects),
        }
        Ok(effects)
    }

    /// `setWorkerFail`: FAILED with `reason`; a holder is killed.
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
        let mut effects = Vec::new();
        self.kill_holder(uuid, &format!("failed: {reason}"), &mut effects);
        self.release_holding(uuid, now, "error");
        self.enter(uuid, State::Failed, now, &mut effects);
        Ok(effects)
    }

    /// `setWorkerGroups`: an IDLE worker is matched again at once.
    pub fn set_groups(
        &mut self,
        uuid: &str,
        groups: BTreeSet<String>,
    ) -> Result<Vec<Effect>, WorkerError> {
        if groups.len() > WORKER_GROUPS_MAX {
            return Err(WorkerError::TooManyGroups(groups.len()));
        }
        let worker = self.workers.get_mut(uuid).ok_or(WorkerError::NotFound)?;
        worker.groups = groups;
        Ok(if worker.state == State::Idle {
            vec![Effect::Idle {
                uuid: uuid.to_owned(),
            }]
        } else {
            Vec::new()
        })
    }

    /// A prepare job ended: IDLE on success, FAILED with its reason.
    /// Ignored unless the worker still prepares (a newer state won).
    pub fn prepared(&mut self, uuid: &str, outcome: Result<(), String>, now: f64) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.workers.get(uuid).map(|worker| worker.state) != Some(State::Prepare) {
            return effects;
        }
        match outcome {
            Ok(()) => self.enter(uuid, State::Idle, now, &mut effects),
            Err(reason) => {
                // Not `enter`: the prepare ended by itself, nothing to cancel.
                if let Some(worker) = self.workers.get_mut(uuid) {
                    worker.fail_reason = Some(format!("prepare failed: {reason}"));
                    worker.state = State::Failed;
                    worker.since = now;
                }
            }
        }
        effects
    }

    // ----- matching and holding -----

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
        let mut fitting: Vec<&Worker> = self
            .workers
            .values()
            .filter(|worker| worker.state == State::Idle && worker.could_fit(request))
            .collect();
        if fitting.len() < request.count {
            return None;
        }
        fitting.sort_by(|a, b| a.score().cmp(&b.score()).then_with(|| a.uuid.cmp(&b.uuid)));
        Some(
            fitting
                .into_iter()
                .take(request.count)
                .map(|worker| worker.uuid.clone())
                .collect(),
        )
    }

    /// Gives IDLE `uuids` to `job` (RUNNING). Refused whole if any is not
    /// IDLE.
    pub fn assign(&mut self, job: JobId, uuids: &[String], now: f64) -> Result<(), WorkerError> {
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

    /// The holder `job` ended (`status`: its final status), was canceled,
    /// or died: each of its workers goes to PREPARE (BUSY ones to
    /// MAINTENANCE).
    pub fn release(&mut self, job: JobId, status: &str, now: f64) -> Vec<Effect> {
        let mut effects = Vec::new();
        let uuids = self.holdings.get(&job).cloned().unwrap_or_default();
        for uuid in uuids {
            let busy = self.workers.get(&uuid).map(|worker| worker.state) == Some(State::Busy);
            self.release_holding(&uuid, now, status);
            let next = if busy {
                State::Maintenance
            } else {
                State::Prepare
            };
            self.enter(&uuid, next, now, &mut effects);
        }
        effects
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

    fn kill_holder(&self, uuid: &str, why: &str, effects: &mut Vec<Effect>) {
        if let Some(job) = self.workers.get(uuid).and_then(|worker| worker.holder) {
            effects.push(Effect::KillHolder {
                job,
                reason: format!("worker {uuid} {why}"),
            });
        }
    }

    /// Moves a worker into `state`, with what entering it asks for.
    fn enter(&mut self, uuid: &str, state: State, now: f64, effects: &mut Vec<Effect>) {
        let Some(worker) = self.workers.get_mut(uuid) else {
            return;
        };
        let left = worker.state;
        worker.state = state;
        worker.since = now;
        if left == State::Prepare && state != State::Idle && state != State::Prepare {
            effects.push(Effect::CancelPrepare {
                uuid: uuid.to_owned(),
            });
        }
        match state {
            State::Prepare => match worker.prepare.clone() {
                Some(argv) => effects.push(Effect::Prepare {
                    uuid: uuid.to_owned(),
                    argv,
                }),
                None => {
                    worker.state = State::Idle;
                    effects.push(Effect::Idle {
                        uuid: uuid.to_owned(),
                    });
                }
            },
            State::Idle => effects.push(Effect::Idle {
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
            for uuid in held {
                assert_eq!(
                    self.workers.get(uuid).and_then(|worker| worker.holder),
                    Some(*job),
                    "job {job} lists worker {uuid}, which it does not hold"
                );
            }
        }
    }
}

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
