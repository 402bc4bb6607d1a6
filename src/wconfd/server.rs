//! wconfd's event loop: one thread, one mio `Poll`, turns of
//! read → apply → commit → reveal.
//!
//! Each turn reads every ready connection and runs the complete requests
//! through the lock core; state changes go to the journal. At the end of
//! the turn the journal records of the turn are made durable in one write
//! (group commit), on the loop itself, and only then are replies written,
//! held `awaitLocks` replies released and SIGHUPs sent: nothing a client
//! sees is ahead of the disk. Requests that arrive meanwhile wait in their
//! sockets and share the next turn's write.
//!
//! Connections (reading, framing, replies in request order, held
//! `awaitLocks` with their deadlines, staging until the turn is durable)
//! are the shared layer of [`crate::connection`]; this file is what
//! wconfd does with each request.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR2};
use signal_hook_mio::v1_0::Signals;

use super::{DaemonError, io_error, unix_now};
use crate::connection::{self, Connections, Handler, Peer, Reply};
use crate::daemon::{self, Admission};
use crate::limits::CONFIG_VIOLATIONS_NAMED_MAX;
use crate::liveness::{self, Livelock};
use crate::locks::{
    Entry, Level, LockError, LockManager, LockName, LockOp, Mode, OpOutcome, Owner, PendingRequest,
    Priority,
};
use crate::protocol::wconfd::{
    DecodeLimits, WconfdRequest, encode_death, encode_entry, encode_fence, encode_lock_modes,
    encode_locks, encode_locks_owners, encode_owner, encode_owners, encode_pending,
    encode_violations, encode_waiter, encode_what_if, lock_error,
};
use crate::protocol::{WireError, parse_request};
use crate::settings::Settings;
use crate::store::config::{ConfigStore, ConfigWriteError, verify};
use crate::store::config_check::{self, ConfigLockCheck};
use crate::store::lock_state::LockStore;
use crate::sys;
use crate::workers::{Registry as WorkerRegistry, WorkerError, WorkerOp};

use super::events::{Via, WconfdEvents};
use super::workers::{Outbox, encode_listing, worker_object};

const SIGNALS: Token = Token(1);
const FIRST_DYNAMIC_TOKEN: usize = 2;

struct Await {
    token: Token,
    request: Vec<Entry>,
    /// Answer in the fenced form (an object with the grant's token).
    fence: bool,
}

/// A pidfd watching the process of some owners.
struct PidWatch {
    fd: OwnedFd,
    token: Token,
    owners: HashSet<Arc<Owner>>,
}

pub struct Server {
    poll: Poll,
    signals: Signals,
    connections: Connections,
    state: State,
    group_gid: Option<u32>,
    stopping: bool,
}

/// Everything of wconfd but its connections: what answers requests.
struct State {
    /// Where the pidfds of owners' processes are watched.
    registry: Registry,
    settings: Settings,
    limits: DecodeLimits,
    livelock_dir: PathBuf,
    livelock: Livelock,
    _instance_lock: File,
    store: LockStore,
    manager: LockManager,
    workers: WorkerRegistry,
    /// What luxid must act on, for its `watchWorkers`.
    outbox: Outbox,
    /// The event sequence and its held watches.
    events: WconfdEvents,
    /// Set while `awaitLocks` runs its request: its grant came by await.
    via_await: bool,
    config: ConfigStore,
    next_token: usize,
    awaits: HashMap<Arc<Owner>, Await>,
    /// The owner of each connection's held `awaitLocks`.
    held_owners: HashMap<Token, Arc<Owner>>,
    /// Held `awaitLocks` answered while a request was handled (a re-sent
    /// await replaces the old one), released on their connections after.
    releases: Vec<(Token, Result<Value, WireError>)>,
    pid_watches: HashMap<u32, PidWatch>,
    pid_tokens: HashMap<Token, u32>,
    waiting_since: HashMap<Arc<Owner>, Instant>,
    next_death_check: Instant,
    /// Owners to probe at once (their process was seen to exit).
    suspects: Vec<Arc<Owner>>,
    /// Turns whose journal records were written, for the dump.
    commits: u64,
    // What the current turn did, settled in `finish_turn`.
    turn_granted: Vec<Arc<Owner>>,
    turn_owners: Vec<Arc<Owner>>,
    /// The fence of each held fenced `awaitLocks` granted this turn, taken
    /// at its grant: a death later in the turn may free the locks before
    /// the answer is made.
    turn_fences: HashMap<Arc<Owner>, (u64, Vec<crate::locks::Death>)>,
}

impl Server {
    pub(super) fn new(
        settings: Settings,
        (store, mut manager, mut workers): (LockStore, LockManager, WorkerRegistry),
        events: WconfdEvents,
        config: ConfigStore,
        livelock: Livelock,
        livelock_dir: PathBuf,
        instance_lock: File,
    ) -> Result<Server, DaemonError> {
        manager.record_lock_changes();
        workers.record_transitions();
        let poll = Poll::new().map_err(io_error("cannot create", Path::new("epoll")))?;
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR2, SIGHUP])
            .map_err(io_error("cannot handle signals", Path::new("-")))?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(io_error("cannot register", Path::new("signals")))?;
        let group_gid = match &settings.wconfd.socket_group {
            Some(group) => Some(group.gid()?),
            None => None,
        };
        let limits = DecodeLimits {
            request_entries_max: settings.wconfd.request_entries_max,
            await_timeout_ms_max: crate::limits::AWAIT_TIMEOUT_MS_MAX,
        };
        let next_death_check = Instant::now() + settings.wconfd.death_check_interval();
        let connections = Connections::new(
            poll.registry(),
            Admission::new(group_gid),
            connection::Limits {
                frame_bytes_max: settings.wconfd.frame_bytes_max,
                connections_max: settings.wconfd.connections_max,
            },
        )
        .map_err(io_error("cannot register", Path::new("connections")))?;
        let registry = poll
            .registry()
            .try_clone()
            .map_err(io_error("cannot register", Path::new("pidfds")))?;
        Ok(Server {
            poll,
            signals,
            connections,
            group_gid,
            stopping: false,
            state: State {
                registry,
                settings,
                limits,
                livelock_dir,
                livelock,
                _instance_lock: instance_lock,
                store,
                manager,
                workers,
                // A run's notices are numbered apart from every other's.
                outbox: Outbox::new((unix_now() * 1e6) as u64),
                events,
                via_await: false,
                config,
                next_token: FIRST_DYNAMIC_TOKEN,
                awaits: HashMap::new(),
                held_owners: HashMap::new(),
                releases: Vec::new(),
                pid_watches: HashMap::new(),
                pid_tokens: HashMap::new(),
                waiting_since: HashMap::new(),
                next_death_check,
                suspects: Vec::new(),
                commits: 0,
                turn_granted: Vec::new(),
                turn_owners: Vec::new(),
                turn_fences: HashMap::new(),
            },
        })
    }

    /// Start-up cleaning: frees every owner whose livelock is dead, makes
    /// that durable, tells the waiters it granted, removes stale livelock
    /// files, and starts watching the processes of the owners left.
    pub(super) fn recover(&mut self) -> Result<(), DaemonError> {
        let policy = self.state.settings.wconfd.lock_policy();
        if self.state.manager.policy() != policy {
            // Journaled, so that a replay judges what came before under
            // the policy of its time and what comes after under this one.
            let granted = self.state.run(LockOp::SetPolicy { policy });
            tracing::info!(
                fairness = policy.fairness.as_str(),
                deadlock_check = policy.deadlocks.as_str(),
                granted = granted.granted().len(),
                "lock policy changed; waiting requests judged again"
            );
        }
        let check = self.state.settings.wconfd.config_lock_check;
        if check != ConfigLockCheck::Off {
            tracing::info!(
                config_lock_check = check.as_str(),
                "config writes are checked against the writers' locks"
            );
        }
        let owners = self.state.manager.owners();
        let freed = self.state.free_dead(&owners);
        if freed > 0 {
            tracing::info!(freed, "freed owners that died while wconfd was down");
        }
        self.state.remove_stale_livelocks();
        self.finish_turn()?;
        self.state.commit()?;
        for owner in self.state.manager.owners() {
            self.state.watch(&owner);
        }
        let now = Instant::now();
        for waiter in self.state.manager.list_pending() {
            self.state.waiting_since.insert(waiter.owner, now);
        }
        Ok(())
    }

    pub(super) fn bind(&mut self, path: &Path) -> Result<(), DaemonError> {
        self.connections
            .bind(path, self.group_gid)
            .map_err(io_error("cannot bind", path))
    }

    /// Serves until SIGTERM or SIGINT.
    pub fn serve(mut self) -> Result<(), DaemonError> {
        let mut events = Events::with_capacity(1024);
        while !self.stopping {
            let timeout = self.next_wakeup();
            daemon::wait_for_events(&mut self.poll, &mut events, timeout)?;
            for event in events.iter() {
                match event.token() {
                    connection::LISTENER => {
                        let state = &mut self.state;
                        self.connections.accept(|| state.new_token());
                    }
                    SIGNALS => self.handle_signals(),
                    token if self.state.pid_tokens.contains_key(&token) => {
                        self.state.process_exited(token)
                    }
                    token => self.connections.event(
                        token,
                        event.is_readable(),
                        event.is_writable(),
                        event.is_read_closed(),
                        &mut self.state,
                    ),
                }
            }
            self.connections.read_ready(&mut self.state);
            self.settle_awaits();
            let now = Instant::now();
            self.expire_awaits(now);
            let suspects = std::mem::take(&mut self.state.suspects);
            if !suspects.is_empty() {
                self.state.free_dead(&suspects);
            }
            if now >= self.state.next_death_check {
                self.state.check_all_owners();
                self.state.next_death_check =
                    now + self.state.settings.wconfd.death_check_interval();
            }
            self.finish_turn()?;
        }
        // Every turn commits, so normally nothing is left.
        self.state.commit()?;
        self.state.events.stop();
        self.connections.remove_socket();
        tracing::info!("wconfd stopped");
        Ok(())
    }

    fn next_wakeup(&mut self) -> Option<Duration> {
        if self.connections.has_ready() || !self.state.suspects.is_empty() {
            return Some(Duration::ZERO);
        }
        let now = Instant::now();
        let mut wake = self.state.next_death_check;
        if let Some(deadline) = self.connections.next_deadline() {
            wake = wake.min(deadline);
        }
        Some(wake.saturating_duration_since(now))
    }

    /// Releases the awaits answered while requests were handled, and
    /// forgets those whose connection went away (the request stays
    /// pending; its owner is told by SIGHUP).
    fn settle_awaits(&mut self) {
        for token in self.connections.take_dropped_holds() {
            self.state.end_await_of_token(token);
            self.state.outbox.end_watch(token);
            self.state.events.drop_watch(token);
        }
        for (token, reply) in std::mem::take(&mut self.state.releases) {
            self.connections.release(token, reply);
        }
    }

    fn expire_awaits(&mut self, now: Instant) {
        for token in self.connections.expired(now) {
            if let Some(batch) = self.state.outbox.end_watch(token) {
                self.connections.release(token, Ok(batch));
                continue;
            }
            if let Some(reply) = self.state.events.expire(token) {
                self.connections.release_encoded(token, reply);
                continue;
            }
            let reply = match self.state.end_await_of_token(token) {
                Some((owner, waiting)) => self.state.timed_out_answer(&owner, &waiting),
                None => Err(WireError::generic("the await was lost")),
            };
            self.connections.release(token, reply);
        }
    }

    // ----- end of turn -----

    /// Ends a turn: settles its grants and watches, makes its journal
    /// records durable in one write, then reveals what it answered
    /// (replies, released awaits, SIGHUPs). The write happens on the loop:
    /// requests arriving meanwhile wait in their sockets and are all read
    /// by the next turn, which shares one write among them (DECISIONS D29).
    fn finish_turn(&mut self) -> Result<(), DaemonError> {
        self.settle_awaits();
        let now = Instant::now();
        let mut sighups = Vec::new();
        for owner in std::mem::take(&mut self.state.turn_granted) {
            self.state.waiting_since.remove(&owner);
            match self.state.end_await_of_owner(&owner) {
                Some(waiting) => {
                    let answer = self.state.granted_answer(&owner, &waiting);
                    self.connections.release(waiting.token, Ok(answer))
                }
                None => sighups.push(owner),
            }
        }
        self.state.turn_fences.clear();
        for owner in std::mem::take(&mut self.state.turn_owners) {
            let pending = self.state.manager.has_pending_request(&owner);
            if pending {
                self.state
                    .waiting_since
                    .entry(Arc::clone(&owner))
                    .or_insert(now);
            } else {
                self.state.waiting_since.remove(&owner);
                if let Some(waiting) = self.state.end_await_of_owner(&owner) {
                    self.connections
                        .release(waiting.token, Err(dropped_request()));
                }
            }
            // Watches of owners that went away are dropped lazily (when
            // the process exits or at the periodic check): an owner that
            // comes and goes per request costs no pidfd churn.
            if self.state.manager.has_owner(&owner) {
                self.state.watch(&owner);
            }
        }
        if let Some((token, batch)) = self.state.outbox.ready() {
            self.connections.release(token, Ok(batch));
        }
        self.state.commit()?;
        for (token, reply) in self.state.events.ready() {
            self.connections.release_encoded(token, reply);
        }
        self.connections.reveal();
        for owner in sighups {
            if let Err(error) = sys::send_signal(owner.pid, Signal::SIGHUP) {
                tracing::debug!(%owner, %error, "cannot notify the owner");
            }
        }
        let state = &mut self.state;
        if state.store.journal_bytes() > state.settings.wconfd.snapshot_journal_bytes_max {
            let started = Instant::now();
            // The journal's copy of the events goes with it.
            state.events.sync_before_snapshot()?;
            state
                .store
                .write_snapshot(&state.manager, &state.workers)
                .map_err(durability_lost(state.store.snapshot_path()))?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                holdings = state.manager.holding_count(),
                "wrote a lock state snapshot"
            );
        }
        Ok(())
    }

    // ----- signals -----

    fn handle_signals(&mut self) {
        for asked in daemon::asked(&mut self.signals) {
            match asked {
                daemon::Asked::Stop => self.stopping = true,
                daemon::Asked::Dump => self.dump(),
            }
        }
    }

    /// SIGUSR2: the lock table, the waiters and the connections, to the log.
    fn dump(&self) {
        let state = &self.state;
        let now = Instant::now();
        let table = state.manager.list_all_locks_owners();
        tracing::info!(
            locks = table.len(),
            holdings = state.manager.holding_count(),
            pending = state.manager.pending_count(),
            connections = self.connections.len(),
            watched_pids = state.pid_watches.len(),
            journal_bytes = state.store.journal_bytes(),
            workers = state.workers.len(),
            worker_holders = state.workers.holdings().count(),
            worker_waiters = state.workers.waiters().count(),
            worker_notices = state.outbox.kept(),
            "state dump"
        );
        let (first_retained, last, held_watches) = state.events.dump();
        tracing::info!(first_retained, last, held_watches, "dump: event sequence");
        tracing::info!(
            "journal: {}, {} B in this round, {} turns written",
            state.store.journal_io(),
            state.store.journal_bytes(),
            state.commits
        );
        for (lock, holders) in &table {
            let holders: Vec<String> = holders
                .iter()
                .map(|(owner, mode)| format!("{owner} {mode}"))
                .collect();
            tracing::info!("lock {lock}: {}", holders.join(", "));
        }
        for waiter in state.manager.list_pending() {
            let waited = state
                .waiting_since
                .get(&waiter.owner)
                .map(|since| now.duration_since(*since).as_secs_f64())
                .unwrap_or(0.0);
            let request: Vec<String> = waiter.request.iter().map(ToString::to_string).collect();
            tracing::info!(
                "waiter {} priority {} for {:.3} s{}: {}",
                waiter.owner,
                waiter.priority,
                waited,
                if state.awaits.contains_key(&waiter.owner) {
                    " (awaitLocks)"
                } else {
                    ""
                },
                request.join(" ")
            );
        }
        for connection in self.connections.dump() {
            tracing::info!(
                "connection {}: pid {} uid {} buffered {} B, output {} B{}",
                connection.token.0,
                connection.peer.pid,
                connection.peer.uid,
                connection.buffered_bytes,
                connection.output_bytes,
                match state.held_owners.get(&connection.token) {
                    Some(owner) => format!(", awaiting locks for {owner}"),
                    None => String::new(),
                }
            );
        }
    }
}

impl Handler for State {
    fn handle(&mut self, token: Token, peer: Peer, frame: &[u8]) -> Reply {
        let request = match parse_request(frame) {
            Ok(request) => request,
            Err(error) => return Reply::Now(Err(error)),
        };
        let request = match WconfdRequest::decode(&request, &self.limits) {
            Ok(request) => request,
            Err(error) => return Reply::Now(Err(error)),
        };
        if let Some(owner) = request.owner()
            && let Err(error) = check_owner(&self.livelock_dir, peer, owner)
        {
            return Reply::Now(Err(error));
        }
        if let Some(owner) = request.subject()
            && let Err(error) = check_livelock_path(&self.livelock_dir, owner)
        {
            return Reply::Now(Err(error));
        }
        self.dispatch(token, request)
    }
}

impl State {
    fn dispatch(&mut self, token: Token, request: WconfdRequest) -> Reply {
        use WconfdRequest as R;
        let reply = match request {
            R::Echo(text) => Ok(Value::String(text)),
            R::CleanupLocks => {
                self.check_all_owners();
                Ok(json!([]))
            }
            R::ReadConfig => Ok(self.config.config().clone()),
            R::VerifyConfig => {
                let problems = verify(self.config.config());
                if problems.is_empty() {
                    Ok(json!([]))
                } else {
                    Err(config_verify_error(problems))
                }
            }
            R::FlushConfig => Ok(json!([])), // config.data is durable at every write
            R::LockConfig { owner, shared } => self.lock_config(owner, shared),
            R::UnlockConfig { owner } => {
                self.run(LockOp::FreeLocksLevel {
                    owner,
                    level: Level::Config,
                });
                Ok(json!([]))
            }
            R::WriteConfig { owner, config } => {
                if !self.holds_config_exclusively(&owner) {
                    Err(WireError::generic(
                        "Requested lock exclusive on the configuration missing",
                    ))
                } else {
                    self.write_config(&owner, config).map(|()| json!([]))
                }
            }
            R::WriteConfigAndUnlock { owner, config } => {
                if !self.holds_config_exclusively(&owner) {
                    tracing::warn!(%owner, "writeConfigAndUnlock without holding the config lock");
                    Ok(json!(false))
                } else {
                    self.write_config(&owner, config).map(|()| {
                        self.run(LockOp::FreeLocksLevel {
                            owner,
                            level: Level::Config,
                        });
                        json!(true)
                    })
                }
            }
            R::ListLocks { owner } => Ok(encode_lock_modes(&self.manager.list_locks(&owner))),
            R::ListAllLocks => Ok(encode_locks(&self.manager.list_all_locks())),
            R::ListAllLocksOwners { tokens: false } => {
                Ok(encode_locks_owners(&self.manager.list_all_locks_owners()))
            }
            R::ListAllLocksOwners { tokens: true } => Ok(self.locks_owners_with_grants()),
            R::CheckFence { owner, lock, token } => {
                let last = self.manager.last_token();
                if token > last {
                    Err(WireError::generic(format!(
                        "checkFence: token {token} was never issued (the last issued is {last})"
                    )))
                } else {
                    Ok(json!(self.manager.check_fence(&owner, &lock, token)))
                }
            }
            R::WhatIfLocks {
                owner,
                request,
                priority,
            } => Ok(encode_what_if(
                &self.manager.what_if(&owner, priority, &request),
            )),
            R::ListLocksWaitingStatus => Ok(json!([
                encode_locks_owners(&self.manager.list_all_locks_owners()),
                encode_pending(&self.manager.list_pending())
            ])),
            R::ListWaiters => Ok(self.list_waiters()),
            R::ExplainWait { job } => Ok(self.explain_wait(job)),
            R::HasPendingRequest { owner } => Ok(json!(self.manager.has_pending_request(&owner))),
            R::TryUpdateLocks { owner, request } => {
                update_reply(self.run(LockOp::TryUpdate { owner, request }))
            }
            R::UpdateLocksWaiting {
                owner,
                priority,
                request,
            } => update_reply(self.run(LockOp::UpdateWaiting {
                owner,
                priority,
                request,
            })),
            R::AwaitLocks {
                owner,
                priority,
                request,
                timeout_ms,
                fence,
            } => return self.await_locks(token, owner, priority, request, timeout_ms, fence),
            R::FreeLocks { owner } => {
                // A free asked for an owner whose livelock is dead (luxid,
                // for a runner that died) is a death: its next grantees
                // are told.
                let dead =
                    self.manager.has_owner(&owner) && liveness::is_dead(Path::new(&owner.livelock));
                self.run(if dead {
                    LockOp::FreeDead { owner }
                } else {
                    LockOp::FreeLocks { owner }
                });
                Ok(json!([]))
            }
            R::FreeLocksLevel { owner, level } => {
                self.run(LockOp::FreeLocksLevel { owner, level });
                Ok(json!([]))
            }
            R::DownGradeLocksLevel { owner, level } => {
                self.run(LockOp::DowngradeLocksLevel { owner, level });
                Ok(json!([]))
            }
            R::IntersectLocks { owner, locks } => {
                self.run(LockOp::IntersectLocks { owner, keep: locks });
                Ok(json!([]))
            }
            R::OpportunisticLockUnion { owner, wanted } => {
                acquired_reply(self.run(LockOp::OpportunisticUnion { owner, wanted }))
            }
            R::GuardedOpportunisticLockUnion {
                count,
                owner,
                wanted,
            } => acquired_reply(self.run(LockOp::GuardedOpportunisticUnion {
                count,
                owner,
                wanted,
            })),
            R::RegisterWorker {
                caps,
                groups,
                address,
                prepare,
            } => self.run_worker(WorkerOp::Register {
                caps,
                groups,
                address,
                prepare,
            }),
            R::DeregisterWorker { uuid } => self.run_worker(WorkerOp::Deregister { uuid }),
            R::SetWorkerState { uuid, state, kill } => {
                self.run_worker(WorkerOp::SetState { uuid, state, kill })
            }
            R::SetWorkerFail { uuid, reason } => {
                self.run_worker(WorkerOp::SetFail { uuid, reason })
            }
            R::SetWorkerGroups { uuid, groups } => {
                self.run_worker(WorkerOp::SetGroups { uuid, groups })
            }
            R::GetWorkerInfo { uuid } => match self.workers.get(&uuid) {
                Some(worker) => Ok(worker_object(&self.workers, worker)),
                None => Err(worker_error(&WorkerError::NotFound)),
            },
            R::ListWorkers { filter, sort, page } => Ok(encode_listing(
                &self.workers,
                &self.workers.list(&filter, sort, &page),
            )),
            R::CheckWorkers { request } => {
                if self.workers.could_ever_fit(&request) {
                    Ok(json!(true))
                } else {
                    Err(worker_error(&WorkerError::NeverFits))
                }
            }
            R::RequestWorkers {
                job,
                priority,
                request,
            } => self.run_worker(WorkerOp::Request {
                job,
                priority,
                request,
            }),
            R::ReleaseWorkers { job, status } => self.run_worker(WorkerOp::Release { job, status }),
            R::WorkerPrepared {
                uuid,
                seq,
                status,
                reason,
            } => self.run_worker(WorkerOp::Prepared {
                uuid,
                seq,
                outcome: if status == "success" {
                    Ok(())
                } else {
                    Err(reason)
                },
            }),
            R::WatchEvents(watch) => {
                return match self.events.watch(token, &watch) {
                    Some(reply) => Reply::Encoded(reply),
                    None => Reply::Held(Instant::now() + watch.timeout),
                };
            }
            R::WatchWorkers { cursor, timeout_ms } => {
                match self
                    .outbox
                    .watch(token, cursor, &self.workers, &mut self.releases)
                {
                    Some(batch) => Ok(batch),
                    None => {
                        return Reply::Held(Instant::now() + Duration::from_millis(timeout_ms));
                    }
                }
            }
        };
        Reply::Now(reply)
    }

    /// Runs one call of the worker registry: journaled if accepted, its
    /// notices for luxid kept.
    fn run_worker(&mut self, op: WorkerOp) -> Result<Value, WireError> {
        let now = unix_now();
        let effects = self
            .workers
            .apply(&op, now)
            .map_err(|error| worker_error(&error))?;
        self.events
            .worker_transitions(self.workers.take_transitions());
        self.store.record_worker(&op, now, self.events.unrecorded());
        self.outbox.add(&effects, &self.workers);
        if cfg!(debug_assertions) {
            self.workers.check_invariants();
        }
        Ok(Value::Null)
    }

    /// Runs one lock operation: the one way the state changes.
    fn run(&mut self, op: LockOp) -> OpOutcome {
        let had_pending = op
            .owner()
            .is_some_and(|owner| self.manager.has_pending_request(owner));
        let before = self.manager.changes();
        let outcome = self.manager.apply(&op);
        self.note_events(&op, &outcome, had_pending);
        if self.manager.changes() != before {
            self.store.record_with_events(&op, self.events.unrecorded());
        }
        self.turn_granted.extend(outcome.granted().iter().cloned());
        for owner in outcome.granted() {
            if let Some(waiting) = self.awaits.get(owner)
                && waiting.fence
                && !self.turn_fences.contains_key(owner)
                && let Some(fence) = self.manager.fence_of(owner, &waiting.request)
            {
                self.turn_fences.insert(Arc::clone(owner), fence);
            }
        }
        if let Some(owner) = op.owner() {
            self.turn_owners.push(Arc::new(owner.clone()));
        }
        outcome
    }

    /// The events of one lock operation: the holdings it changed, a
    /// request left waiting, or one that ended without a grant.
    fn note_events(&mut self, op: &LockOp, outcome: &OpOutcome, had_pending: bool) {
        let Some(owner) = op.owner() else {
            let changes = self.manager.take_lock_changes();
            self.events.lock_changes(changes, |_| Via::Waiting);
            return;
        };
        let changes = self.manager.take_lock_changes();
        let granted_self = changes
            .iter()
            .any(|change| *change.owner == *owner && change.after.is_some());
        if !changes.is_empty() {
            let own = match op {
                LockOp::UpdateWaiting { .. } if self.via_await => Via::Await,
                LockOp::UpdateWaiting { .. } => Via::Waiting,
                _ => Via::Direct,
            };
            let awaits = &self.awaits;
            self.events.lock_changes(changes, |who| {
                if **who == *owner {
                    own
                } else if awaits.contains_key(who) {
                    Via::Await
                } else {
                    Via::Waiting
                }
            });
        }
        if let (
            LockOp::UpdateWaiting {
                priority, request, ..
            },
            OpOutcome::Update(Err(LockError::Deadlock(cycle))),
        ) = (op, outcome)
        {
            tracing::warn!(%owner, members = cycle.len(), "refused a wait that would close a cycle");
            self.events
                .deadlock_refused(owner, *priority, request, cycle);
        } else if let (
            LockOp::UpdateWaiting {
                priority, request, ..
            },
            OpOutcome::Update(Ok(update)),
        ) = (op, outcome)
            && !update.blockers.is_empty()
        {
            self.events
                .waiting(owner, *priority, request, &update.blockers);
        } else if had_pending && !granted_self && !self.manager.has_pending_request(owner) {
            self.events.withdrawn(owner);
        }
    }

    /// Whether `owner` may write the configuration.
    fn holds_config_exclusively(&self, owner: &Owner) -> bool {
        self.manager.mode_held(owner, &LockName::Config) == Some(Mode::Exclusive)
    }

    fn lock_config(&mut self, owner: Owner, shared: bool) -> Result<Value, WireError> {
        let mode = if shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        if self.manager.mode_held(&owner, &LockName::Config) >= Some(mode) {
            tracing::warn!(%owner, "asked to lock the config while owning the lock");
            return Ok(self.config.config().clone());
        }
        let entry = Entry::new(LockName::Config, crate::locks::Action::Acquire(mode));
        match self.run(LockOp::TryUpdate {
            owner,
            request: vec![entry],
        }) {
            OpOutcome::Update(Ok(update)) if update.blockers.is_empty() => {
                Ok(self.config.config().clone())
            }
            OpOutcome::Update(Ok(_)) => Ok(Value::Null),
            OpOutcome::Update(Err(error)) => Err(lock_error(&error)),
            OpOutcome::Freed(_) | OpOutcome::Acquired(_) => {
                unreachable!("a TryUpdate answers an Update")
            }
        }
    }

    /// A configuration write of `owner`, which holds the config lock:
    /// prepared (validated, nothing changed yet), checked against the
    /// owner's locks as `[wconfd] config_lock_check` asks (D70), then
    /// installed. A refused or invalid write changes nothing; a write let
    /// through with violations tells them once it is installed.
    fn write_config(&mut self, owner: &Owner, config: Value) -> Result<(), WireError> {
        let prepared = match self.config.prepare(config, unix_now()) {
            Ok(Some(prepared)) => prepared,
            Ok(None) => return Ok(()),
            Err(error) => return Err(self.config_write_error(error)),
        };
        let check = self.settings.wconfd.config_lock_check;
        let found = if check == ConfigLockCheck::Off {
            Vec::new()
        } else {
            let manager = &self.manager;
            config_check::violations(self.config.config(), prepared.config(), |lock| {
                manager.mode_held(owner, lock)
            })
        };
        let refused = check == ConfigLockCheck::Refuse && !found.is_empty();
        if !refused && let Err(error) = self.config.install(prepared) {
            return Err(self.config_write_error(ConfigWriteError::Io(error)));
        }
        if !found.is_empty() {
            tracing::warn!(
                %owner,
                refused,
                entities = found.len(),
                "config write changes what the writer does not hold exclusively: {}",
                config_check::describe(&found)
            );
            self.events.config_lock_violation(owner, refused, &found);
        }
        if refused {
            return Err(config_lock_error(&found));
        }
        tracing::info!(serial_no = self.config.serial_no(), "config.data written");
        self.events.config_written(self.config.serial_no());
        Ok(())
    }

    fn config_write_error(&self, error: ConfigWriteError) -> WireError {
        match error {
            ConfigWriteError::Invalid(problems) => config_verify_error(problems),
            ConfigWriteError::Io(error) => {
                tracing::error!(%error, "cannot write config.data");
                WireError::generic(format!(
                    "cannot write {}: {error}",
                    self.config.path().display()
                ))
            }
        }
    }

    fn await_locks(
        &mut self,
        token: Token,
        owner: Owner,
        priority: Priority,
        request: Vec<Entry>,
        timeout_ms: u64,
        fence: bool,
    ) -> Reply {
        self.via_await = true;
        let outcome = self.run(LockOp::UpdateWaiting {
            owner: owner.clone(),
            priority,
            request: request.clone(),
        });
        self.via_await = false;
        let blockers = match outcome {
            OpOutcome::Update(Ok(update)) => update.blockers,
            OpOutcome::Update(Err(error)) => return Reply::Now(Err(lock_error(&error))),
            OpOutcome::Freed(_) | OpOutcome::Acquired(_) => {
                unreachable!("an UpdateWaiting answers an Update")
            }
        };
        if blockers.is_empty() || timeout_ms == 0 {
            return Reply::Now(Ok(self.await_answer(&owner, &request, fence, &blockers)));
        }
        let owner = Arc::new(owner);
        // A re-sent await (a client that reconnected) replaces the old one,
        // which is answered as if it had timed out.
        if let Some(previous) = self.end_await_of_owner(&owner) {
            let answer = self.await_answer(&owner, &request, previous.fence, &blockers);
            self.releases.push((previous.token, Ok(answer)));
        }
        self.held_owners.insert(token, Arc::clone(&owner));
        self.awaits.insert(
            owner,
            Await {
                token,
                request,
                fence,
            },
        );
        Reply::Held(Instant::now() + Duration::from_millis(timeout_ms))
    }

    /// Ends the held `awaitLocks` of `owner`, if any: answers the
    /// connection to release it on, and whether it asked for the fence.
    fn end_await_of_owner(&mut self, owner: &Owner) -> Option<Await> {
        let waiting = self.awaits.remove(owner)?;
        self.held_owners.remove(&waiting.token);
        Some(waiting)
    }

    /// The answer of a held await granted this turn: with its fence as
    /// taken at the grant (a death later in the turn may have freed it).
    fn granted_answer(&mut self, owner: &Owner, waiting: &Await) -> Value {
        match self.turn_fences.remove(owner) {
            Some((token, died)) => encode_fence(token, &died),
            None => self.await_answer(owner, &waiting.request, waiting.fence, &[]),
        }
    }

    /// The answer of a held await whose timeout passed. Still pending: its
    /// blockers as a fifo queue names them (waiters ahead too), never empty
    /// while it waits. Granted this turn, before the turn's end answered
    /// it: the grant. Neither: its request was dropped, its owner freed as
    /// a death earlier in the turn (never an empty list, which a client
    /// reads as a grant).
    fn timed_out_answer(&mut self, owner: &Owner, waiting: &Await) -> Result<Value, WireError> {
        if let Some(blockers) = self.manager.pending_blockers(owner) {
            return Ok(self.await_answer(owner, &waiting.request, waiting.fence, &blockers));
        }
        if self.turn_granted.iter().any(|granted| **granted == *owner) {
            return Ok(self.granted_answer(owner, waiting));
        }
        Err(dropped_request())
    }

    /// An `awaitLocks` answer: the blockers, or with `fence` an object
    /// with them and, once granted, the grant's token and dead previous
    /// holders.
    fn await_answer(
        &self,
        owner: &Owner,
        request: &[Entry],
        fence: bool,
        blockers: &[Arc<Owner>],
    ) -> Value {
        if !fence {
            return encode_owners(blockers);
        }
        match (blockers.is_empty(), self.manager.fence_of(owner, request)) {
            (true, Some((token, died))) => encode_fence(token, &died),
            _ => json!({"blockers": encode_owners(blockers)}),
        }
    }

    /// `listAllLocksOwners [{"tokens": true}]`: each holder as `[owner,
    /// mode, {"token", "died"}]`.
    fn locks_owners_with_grants(&self) -> Value {
        Value::Array(
            self.manager
                .list_all_locks_owners()
                .iter()
                .map(|(lock, holders)| {
                    let holders: Vec<Value> = holders
                        .iter()
                        .map(|(owner, mode)| {
                            let grant = self.manager.grant(owner, lock).unwrap_or_default();
                            let mut about = json!({"token": grant.token});
                            if !grant.died.is_empty() {
                                about["died"] =
                                    Value::Array(grant.died.iter().map(encode_death).collect());
                            }
                            json!([encode_owner(owner), mode.as_str(), about])
                        })
                        .collect();
                    json!([lock.to_string(), holders])
                })
                .collect(),
        )
    }

    /// Ends the held `awaitLocks` of connection `token`, if any.
    fn end_await_of_token(&mut self, token: Token) -> Option<(Arc<Owner>, Await)> {
        let owner = self.held_owners.remove(&token)?;
        let waiting = self.awaits.remove(&owner)?;
        debug_assert_eq!(
            waiting.token, token,
            "an await is indexed by its connection"
        );
        Some((owner, waiting))
    }

    fn new_token(&mut self) -> Token {
        let token = Token(self.next_token);
        self.next_token += 1;
        token
    }

    /// Makes the journal records of the turn durable. A failure cannot be
    /// retried as if it had worked: wconfd stops (DECISIONS D8).
    fn commit(&mut self) -> Result<(), DaemonError> {
        self.events.record_rest(&mut self.store);
        if self.store.has_unwritten() {
            self.store
                .commit()
                .map_err(durability_lost(self.store.journal_path()))?;
            self.commits += 1;
        }
        self.events.written();
        Ok(())
    }

    // ----- liveness -----

    /// Frees every owner of `owners` whose livelock is dead, and removes
    /// the dead livelock files no remaining owner names; answers how many
    /// owners were freed.
    fn free_dead(&mut self, owners: &[Arc<Owner>]) -> usize {
        let mut dead_livelocks: HashSet<&str> = HashSet::new();
        let mut freed = 0;
        for owner in owners {
            if !self.manager.has_owner(owner) {
                continue;
            }
            if liveness::is_dead(Path::new(&owner.livelock)) {
                let held = self.manager.list_locks(owner);
                let waited = self
                    .manager
                    .list_pending()
                    .into_iter()
                    .find(|pending| *pending.owner == **owner)
                    .map(|pending| {
                        Value::Array(pending.request.iter().map(encode_entry).collect())
                    });
                tracing::info!(%owner, held = held.len(), waited = waited.is_some(), "owner is dead: freeing its locks");
                let held: Vec<(String, Mode)> = held
                    .into_iter()
                    .map(|(lock, mode)| (lock.to_string(), mode))
                    .collect();
                self.events.owner_dead(owner, &held, waited);
                self.run(LockOp::FreeDead {
                    owner: Owner::clone(owner),
                });
                dead_livelocks.insert(&owner.livelock);
                freed += 1;
            }
        }
        if !dead_livelocks.is_empty() {
            let still_named: HashSet<String> = self
                .manager
                .owners()
                .iter()
                .map(|owner| owner.livelock.clone())
                .collect();
            for livelock in &dead_livelocks {
                if still_named.contains(*livelock) {
                    continue;
                }
                let path = Path::new(livelock);
                match liveness::remove_dead_livelock(&self.livelock_dir, path) {
                    Ok(true) => tracing::debug!(path = %path.display(), "removed a dead livelock"),
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(path = %path.display(), %error, "cannot remove a dead livelock")
                    }
                }
            }
        }
        freed
    }

    fn check_all_owners(&mut self) {
        let owners = self.manager.owners();
        self.free_dead(&owners);
        self.remove_stale_livelocks();
        self.prune_watches();
    }

    fn remove_stale_livelocks(&mut self) {
        let mut referenced: HashSet<PathBuf> = self
            .manager
            .owners()
            .iter()
            .map(|owner| PathBuf::from(&owner.livelock))
            .collect();
        referenced.insert(self.livelock.path().to_owned());
        match liveness::remove_stale_livelocks(&self.livelock_dir, &referenced) {
            Ok(removed) => {
                for path in removed {
                    tracing::info!(path = %path.display(), "removed a stale livelock");
                }
            }
            Err(error) => tracing::warn!(%error, "cannot clean the livelock directory"),
        }
    }

    /// Watches the process of an owner, so its exit is noticed at once.
    fn watch(&mut self, owner: &Arc<Owner>) {
        if let Some(watch) = self.pid_watches.get_mut(&owner.pid) {
            watch.owners.insert(Arc::clone(owner));
            return;
        }
        let fd = match sys::pidfd_open(owner.pid) {
            Ok(fd) => fd,
            Err(error) if error.raw_os_error() == Some(nix::libc::ESRCH) => {
                self.suspects.push(Arc::clone(owner));
                return;
            }
            Err(error) => {
                tracing::warn!(%owner, %error, "cannot watch the owner's process; the periodic check covers it");
                return;
            }
        };
        let token = self.new_token();
        if let Err(error) =
            self.registry
                .register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)
        {
            tracing::warn!(%owner, %error, "cannot watch the owner's process");
            return;
        }
        self.pid_tokens.insert(token, owner.pid);
        self.pid_watches.insert(
            owner.pid,
            PidWatch {
                fd,
                token,
                owners: HashSet::from([Arc::clone(owner)]),
            },
        );
    }

    /// Forgets watched owners that went away, and the watches left empty.
    fn prune_watches(&mut self) {
        let manager = &self.manager;
        let mut empty = Vec::new();
        for (pid, watch) in &mut self.pid_watches {
            watch.owners.retain(|owner| manager.has_owner(owner));
            if watch.owners.is_empty() {
                empty.push(*pid);
            }
        }
        for pid in empty {
            let watch = self.pid_watches.remove(&pid).expect("just listed");
            self.drop_watch(watch);
        }
    }

    fn drop_watch(&mut self, watch: PidWatch) {
        let _ = self
            .registry
            .deregister(&mut SourceFd(&watch.fd.as_raw_fd()));
        self.pid_tokens.remove(&watch.token);
    }

    /// A watched process exited: probe its owners now.
    fn process_exited(&mut self, token: Token) {
        let Some(pid) = self.pid_tokens.get(&token).copied() else {
            return;
        };
        let watch = self
            .pid_watches
            .remove(&pid)
            .expect("tokens and watches agree");
        let owners: Vec<Arc<Owner>> = watch.owners.iter().cloned().collect();
        self.drop_watch(watch);
        self.free_dead(&owners);
    }

    /// `listWaiters` *(extension)*: each pending request with its wait so
    /// far and its blockers.
    fn list_waiters(&self) -> Value {
        let now = Instant::now();
        Value::Array(
            self.manager
                .list_pending()
                .iter()
                .map(|waiter| {
                    let waited = self
                        .waiting_since
                        .get(&waiter.owner)
                        .map_or(0.0, |since| now.duration_since(*since).as_secs_f64());
                    let blockers = self.manager.blockers(&waiter.owner, &waiter.request);
                    let holds = self
                        .manager
                        .holdings_with_tokens(&waiter.owner, EXPLAIN_MEMBERS_MAX);
                    let holds_count = self.manager.held_count(&waiter.owner);
                    encode_waiter(waiter, waited, &blockers, &holds, holds_count)
                })
                .collect(),
        )
    }
}

impl State {
    /// `explainWait` *(extension)*: each pending request of the job's
    /// owners as a chain of whom it waits for (see [`State::explain`]).
    fn explain_wait(&self, job: u64) -> Value {
        let now = Instant::now();
        let mut budget = EXPLAIN_NODES_MAX;
        Value::Array(
            self.manager
                .pending_of_job(job)
                .iter()
                .map(|pending| {
                    let mut path = vec![Arc::clone(&pending.owner)];
                    self.explain(pending, now, &mut path, &mut budget)
                })
                .collect(),
        )
    }

    /// A pending request, its wait so far, and each owner blocking it now:
    /// what it holds of the request, how many locks it holds, and, if it
    /// waits too, why (recursively; an owner already on `path` is a
    /// deadlock and is marked, not followed). At most `budget` blockers are
    /// described in all; the rest are named only.
    fn explain(
        &self,
        pending: &PendingRequest,
        now: Instant,
        path: &mut Vec<Arc<Owner>>,
        budget: &mut usize,
    ) -> Value {
        let waited = self
            .waiting_since
            .get(&pending.owner)
            .map_or(0.0, |since| now.duration_since(*since).as_secs_f64());
        let blockers: Vec<Value> = self
            .manager
            .blockers(&pending.owner, &pending.request)
            .iter()
            .map(|blocker| {
                let owner = encode_owner(blocker);
                if *budget == 0 {
                    return json!({"owner": owner, "truncated": true});
                }
                *budget -= 1;
                let holds: Vec<Value> = self
                    .manager
                    .held_of(blocker, &pending.request, EXPLAIN_MEMBERS_MAX)
                    .iter()
                    .map(|(lock, mode)| json!([lock.to_string(), mode.as_str()]))
                    .collect();
                let waits = match self.manager.pending_of(blocker) {
                    None => Value::Null,
                    Some(_) if path.iter().any(|seen| **seen == **blocker) => {
                        json!({"deadlock": true})
                    }
                    Some(next) => {
                        path.push(Arc::clone(&next.owner));
                        let why = self.explain(&next, now, path, budget);
                        path.pop();
                        why
                    }
                };
                json!({
                    "owner": owner,
                    "holds": holds,
                    "holds_count": self.manager.held_count(blocker),
                    "waits": waits,
                })
            })
            .collect();
        json!({
            "owner": encode_owner(&pending.owner),
            "priority": pending.priority,
            "request": pending.request.iter().map(encode_entry).collect::<Vec<_>>(),
            "waiting_seconds": waited,
            "blockers": blockers,
        })
    }
}

/// The most blockers one `explainWait` describes (a chain through a
/// thousand owners is already more than anyone reads).
const EXPLAIN_NODES_MAX: usize = 1_000;
/// The most members of a group lock shown as held by one blocker.
const EXPLAIN_MEMBERS_MAX: usize = 10;

/// An owner must have its livelock in the livelock directory, and an
/// unprivileged peer may act only as owners of its own pid.
fn check_owner(livelock_dir: &Path, peer: Peer, owner: &Owner) -> Result<(), WireError> {
    check_livelock_path(livelock_dir, owner)?;
    if !peer.privileged && owner.pid != peer.credentials.pid {
        return Err(WireError::generic(format!(
            "permission denied: process {} may act only as owners with its own pid, not {}",
            peer.credentials.pid, owner.pid
        )));
    }
    Ok(())
}

/// The answer of a held await whose request is gone without a grant.
fn dropped_request() -> WireError {
    WireError::generic("the pending request was dropped (its locks were freed)")
}

fn check_livelock_path(livelock_dir: &Path, owner: &Owner) -> Result<(), WireError> {
    if liveness::livelock_path_allowed(livelock_dir, &owner.livelock) {
        Ok(())
    } else {
        Err(WireError::generic(format!(
            "livelock path {:?} is not a file directly in {}",
            owner.livelock,
            livelock_dir.display()
        )))
    }
}

/// A write or sync of the lock state failed: see [`DaemonError::Journal`].
fn durability_lost(path: &Path) -> impl FnOnce(io::Error) -> DaemonError + '_ {
    move |source| DaemonError::Journal {
        path: path.to_owned(),
        source,
    }
}

/// Ganeti's shape of a failed verification: its ConfigWriter reads
/// `args[1]` as the list of problems.
fn config_verify_error(problems: Vec<String>) -> WireError {
    WireError {
        class: "ConfigVerifyError",
        args: vec![json!("Validation failed"), json!(problems)],
    }
}

/// A write refused by the configuration lock check: `GenericError` naming
/// the entities and the locks, and as data `{"violations": [...], "count":
/// n}` (the first [`CONFIG_VIOLATIONS_NAMED_MAX`] of them).
fn config_lock_error(found: &[config_check::Violation]) -> WireError {
    WireError {
        class: "GenericError",
        args: vec![
            json!(format!(
                "config write refused: the writer does not hold exclusively the locks of what it changes: {}",
                config_check::describe(found)
            )),
            json!({
                "violations": encode_violations(found, CONFIG_VIOLATIONS_NAMED_MAX),
                "count": found.len(),
            }),
        ],
    }
}

/// A refused registry call: `GenericError` with Boruta's text.
fn worker_error(error: &WorkerError) -> WireError {
    WireError::generic(error.to_string())
}

fn update_reply(outcome: OpOutcome) -> Result<Value, WireError> {
    match outcome {
        OpOutcome::Update(Ok(update)) => Ok(encode_owners(&update.blockers)),
        OpOutcome::Update(Err(error)) => Err(lock_error(&error)),
        OpOutcome::Freed(_) | OpOutcome::Acquired(_) => unreachable!("updates answer an Update"),
    }
}

fn acquired_reply(outcome: OpOutcome) -> Result<Value, WireError> {
    match outcome {
        OpOutcome::Acquired(locks) => Ok(encode_locks(&locks)),
        OpOutcome::Update(_) | OpOutcome::Freed(_) => unreachable!("unions answer Acquired"),
    }
}
