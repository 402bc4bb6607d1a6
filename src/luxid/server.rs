//! luxid's event loop, the shell around [`QueueCore`]: one thread, one
//! mio poll. Connections speak LUXI through the shared layer of
//! [`crate::connection`]; each started job is a `job-runner` process
//! watched through a pidfd; the runners' job-file updates arrive as
//! inotify events on the queue directory. Nothing is polled on a timer but
//! `WaitForJobChange` timeouts and the release of a dead job's livelock (as
//! a safety net under its inotify event).
//!
//! The shell turns those events into the core's inputs and carries out its
//! effects: the files of the queue through [`crate::queue`], runners
//! spawned and signalled, livelocks watched and probed. It keeps no state
//! of the queue.
//!
//! A turn reads every ready connection and answers what it can; new jobs
//! are then made durable together (one group commit per turn) before any
//! reply of that turn is written, and only then are runners started, but
//! for those of new jobs that may start at once: they are started while
//! the commit is synced and wait for luxid's word before they act
//! ([`Shell::commit`], D40). A held `WaitForJobChange` answered in a turn
//! is staged with the turn's other replies, so every connection's replies
//! leave in request order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::hash::RandomState;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::signal::Signal;
use serde_json::Value;
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR2};
use signal_hook_mio::v1_0::Signals;

use super::core::{
    self as queue_core, Action, Config, Conn, Effect, Input, QueueCore, Restored, Runner,
    RunnerSignal,
};
mod events;
mod why;
mod wire;
mod workers;

use super::wconfd_link::WconfdLink;
use super::{DaemonError, io_error};
use crate::connection::{self, Connections, Handler, Peer, Reply};
use crate::daemon::{self, Admission};
use crate::jobs::runner_contract::{Start, WAIT_FOR_COMMIT_FLAG, exit_cause};
use crate::jobs::{Job, JobId};
use crate::liveness::{self, Livelock};
use crate::locks::Owner;
use crate::paths::LIVELOCK_DIR;
use crate::protocol::luxi::LuxiRequest;
use crate::protocol::{WireError, parse_request};
use crate::queue::{self, Loaded, Queue, parse_job_file_name};
use crate::settings::Settings;
use crate::sys;

const SIGNALS: Token = Token(1);
const INOTIFY: Token = Token(2);
const WCONFD: Token = Token(3);
const WORKER_WATCH: Token = Token(4);
const EVENTS_SYNCED: Token = Token(5);
const FIRST_DYNAMIC_TOKEN: usize = 6;

/// The signals luxid sends a runner that the runner handles (cancel,
/// priority request) or must survive (wconfd's SIGHUP); blocked while it
/// is spawned (see `sys::block_signals`).
const RUNNER_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGUSR1, Signal::SIGHUP];

/// A runner process luxid watches.
struct Process {
    /// The process when luxid started it (an adopted runner is watched by
    /// pidfd only).
    child: Option<Child>,
    pidfd: OwnedFd,
    token: Token,
}

pub struct Server {
    poll: Poll,
    signals: Signals,
    connections: Connections,
    shell: Shell,
    group_gid: Option<u32>,
    stopping: bool,
}

/// The core and what carries out its effects.
struct Shell {
    core: QueueCore,
    /// Where the pidfds of runners are watched.
    registry: Registry,
    inotify: Inotify,
    root: PathBuf,
    livelock_dir: PathBuf,
    settings: Settings,
    runner_path: PathBuf,
    queue: Queue,
    _livelock: Livelock,
    /// luxid's calls to wconfd, never waited for.
    wconfd: WconfdLink<workers::WconfdCall>,
    /// The held `watchWorkers` of the worker registry's notices.
    worker_watch: WconfdLink<()>,
    /// Where luxid is in wconfd's notices.
    notice_cursor: Option<crate::protocol::workers::NoticeCursor>,
    /// Submissions held for wconfd's check of their workers requests.
    held_submissions: HashMap<u64, workers::HeldSubmission>,
    submission_of: HashMap<Conn, u64>,
    next_submission: u64,
    /// `WhyJob`s held for wconfd's `explainWait`.
    held_whys: HashMap<u64, why::HeldWhy>,
    why_of: HashMap<Conn, u64>,
    next_why: u64,
    /// Runner processes by pidfd token, with their job.
    processes: HashMap<Token, (JobId, Process)>,
    livelock_watches: HashMap<WatchDescriptor, JobId>,
    watch_of: HashMap<JobId, WatchDescriptor>,
    /// Held replies answered while requests were handled or jobs changed,
    /// released on their connections after.
    releases: Vec<(Token, Result<Value, WireError>)>,
    /// Runners to start once the turn's replies are written.
    spawns: Vec<JobId>,
    /// The event sequence and its held watches.
    events: events::LuxidEvents,
    /// Set during start-up: a job's end that cannot be written stops it.
    recovery_error: Option<DaemonError>,
    recovering: bool,
    next_token: usize,
}

impl Server {
    pub(super) fn new(
        root: &Path,
        settings: Settings,
        queue: Queue,
        loaded: Loaded,
        runner_path: PathBuf,
        livelock: Livelock,
    ) -> Result<Server, DaemonError> {
        let poll = Poll::new().map_err(io_error("cannot create", Path::new("epoll")))?;
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR2])
            .map_err(io_error("cannot handle signals", Path::new("-")))?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(io_error("cannot register", Path::new("signals")))?;
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|error| io_error("cannot create", Path::new("inotify"))(error.into()))?;
        // Runners replace job files by rename.
        inotify
            .add_watch(queue.dir(), AddWatchFlags::IN_MOVED_TO)
            .map_err(|error| io_error("cannot watch", queue.dir())(error.into()))?;
        poll.registry()
            .register(
                &mut SourceFd(&inotify.as_fd().as_raw_fd()),
                INOTIFY,
                Interest::READABLE,
            )
            .map_err(io_error("cannot register", Path::new("inotify")))?;
        let group_gid = match &settings.wconfd.socket_group {
            Some(group) => Some(group.gid()?),
            None => None,
        };
        let connections = Connections::new(
            poll.registry(),
            Admission::new(group_gid),
            connection::Limits {
                frame_bytes_max: settings.luxid.frame_bytes_max,
                connections_max: settings.luxid.connections_max,
            },
        )
        .map_err(io_error("cannot register", Path::new("connections")))?;
        let registry = poll
            .registry()
            .try_clone()
            .map_err(io_error("cannot register", Path::new("pidfds")))?;
        let wconfd_socket = root.join(crate::paths::WCONFD_SOCKET_PATH);
        let wconfd = WconfdLink::new(
            wconfd_socket.clone(),
            poll.registry(),
            WCONFD,
            settings.luxid.frame_bytes_max,
        )
        .map_err(io_error("cannot register", &wconfd_socket))?;
        let worker_watch = WconfdLink::new(
            wconfd_socket.clone(),
            poll.registry(),
            WORKER_WATCH,
            settings.luxid.frame_bytes_max,
        )
        .map_err(io_error("cannot register", &wconfd_socket))?;
        let livelock_dir = root.join(LIVELOCK_DIR);
        let config = Config {
            max_running_jobs: settings.luxid.max_running_jobs,
            queue_jobs_max: settings.luxid.queue_jobs_max,
            livelock_dir: livelock_dir.clone(),
            clock: queue_core::ClockOrigin::now(),
        };
        let (events, said) =
            events::LuxidEvents::open(root, &settings, poll.registry(), EVENTS_SYNCED)?;
        let (mut restored, watched) = restored(&queue, &livelock_dir, loaded);
        restored.filter_rules = queue.read_filters()?;
        restored.archived = archived_unfinished(&queue, &said, &restored);
        restored.events = said;
        let (core, effects) = QueueCore::new(config, restored, RandomState::new(), Instant::now());
        let mut shell = Shell {
            core,
            registry,
            inotify,
            root: root.to_owned(),
            livelock_dir,
            settings,
            runner_path,
            queue,
            _livelock: livelock,
            wconfd,
            worker_watch,
            notice_cursor: None,
            held_submissions: HashMap::new(),
            submission_of: HashMap::new(),
            held_whys: HashMap::new(),
            why_of: HashMap::new(),
            next_why: 0,
            next_submission: 0,
            processes: HashMap::new(),
            livelock_watches: HashMap::new(),
            watch_of: HashMap::new(),
            releases: Vec::new(),
            spawns: Vec::new(),
            events,
            recovery_error: None,
            recovering: false,
            next_token: FIRST_DYNAMIC_TOKEN,
        };
        for (id, pidfd) in watched {
            shell.watch_process(id, None, pidfd);
        }
        shell.remove_stale_priority_requests();
        shell.carry_out(effects);
        shell.watch_workers();
        Ok(Server {
            poll,
            signals,
            connections,
            shell,
            group_gid,
            stopping: false,
        })
    }

    /// Before serving: ends the jobs whose runner died while luxid was
    /// down (the runners still alive were adopted when the core was made).
    pub(super) fn recover(&mut self) -> Result<(), DaemonError> {
        self.shell.recovering = true;
        self.shell.run(Input::Tick);
        self.shell.recovering = false;
        match self.shell.recovery_error.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    pub(super) fn bind(&mut self, path: &Path) -> Result<(), DaemonError> {
        self.connections
            .bind(path, self.group_gid)
            .map_err(io_error("cannot bind", path))
    }

    /// Serves until SIGTERM or SIGINT. Runners go on without luxid; a new
    /// luxid adopts them.
    pub fn serve(mut self) -> Result<(), DaemonError> {
        let mut events = Events::with_capacity(1024);
        self.finish_turn();
        while !self.stopping {
            let timeout = self.next_wakeup();
            daemon::wait_for_events(&mut self.poll, &mut events, timeout)?;
            for event in events.iter() {
                match event.token() {
                    connection::LISTENER => {
                        let shell = &mut self.shell;
                        self.connections.accept(|| shell.new_token());
                    }
                    SIGNALS => self.handle_signals(),
                    INOTIFY => self.shell.inotify_events(),
                    WCONFD => self.shell.wconfd_event(),
                    WORKER_WATCH => self.shell.worker_watch_event(),
                    EVENTS_SYNCED => self.shell.events.synced(Instant::now()),
                    token if self.shell.processes.contains_key(&token) => {
                        self.shell.runner_exited(token)
                    }
                    token => self.connections.event(
                        token,
                        event.is_readable(),
                        event.is_writable(),
                        event.is_read_closed(),
                        &mut self.shell,
                    ),
                }
            }
            self.connections.read_ready(&mut self.shell);
            self.shell.wconfd.tick(Instant::now());
            self.shell.worker_watch.tick(Instant::now());
            self.finish_turn();
        }
        self.connections.remove_socket();
        if let Err(error) = self.shell.queue.save_serial() {
            // Only ids of job files removed by hand could come back.
            tracing::warn!(%error, "cannot save the queue's serial");
        }
        tracing::info!("luxid stopped");
        Ok(())
    }

    fn next_wakeup(&mut self) -> Option<Duration> {
        if self.connections.has_ready() {
            return Some(Duration::ZERO);
        }
        let wake = [
            self.connections.next_deadline(),
            self.shell.core.next_wakeup(),
            self.shell.wconfd.next_wakeup(),
            self.shell.worker_watch.next_wakeup(),
            self.shell.events.next_wakeup(),
        ]
        .into_iter()
        .flatten()
        .min();
        wake.map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// Releases the held replies answered so far.
    fn settle_watchers(&mut self) {
        for token in self.connections.take_dropped_holds() {
            self.shell.events.drop_watch(Conn(token.0));
            self.shell.run(Input::ConnectionGone {
                conn: Conn(token.0),
            });
        }
        for (token, reply) in std::mem::take(&mut self.shell.releases) {
            self.connections.release(token, reply);
        }
    }

    // ----- the turn -----

    /// Probes and waits that are due, watchers of changed jobs answered,
    /// new jobs made durable, then every staged reply written (in request
    /// order on each connection) and runners started.
    fn finish_turn(&mut self) {
        self.shell.run(Input::Tick);
        self.settle_watchers();
        let committed = self.shell.run(Input::EndTurn);
        self.settle_watchers();
        for token in self.connections.expired(Instant::now()) {
            if self.shell.expire_submission(Conn(token.0)) || self.shell.expire_why(Conn(token.0)) {
                continue;
            }
            if let Some(reply) = self.shell.events.expire(Conn(token.0)) {
                self.connections.release_encoded(token, reply);
                continue;
            }
            // The core answers every wait at its deadline; a hold it does
            // not know is one it never had.
            self.connections
                .release(token, Err(WireError::generic("the wait was lost")));
        }
        self.settle_watchers();
        if let Some(Err(error)) = committed {
            self.connections.fail_turn(&WireError::generic(format!(
                "cannot write the job queue: {error}"
            )));
        }
        self.shell
            .events
            .finish_turn(&self.shell.core, Instant::now());
        for (token, reply) in self.shell.events.ready() {
            self.connections.release_encoded(token, reply);
        }
        self.connections.reveal();
        for id in std::mem::take(&mut self.shell.spawns) {
            self.shell.spawn(id);
        }
        self.settle_watchers();
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

    /// SIGUSR2: the queue, the running jobs and their runners, the
    /// connections and watchers, to the log.
    fn dump(&self) {
        let core = &self.shell.core;
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        let statuses = core
            .unfinished()
            .values()
            .map(Job::status)
            .chain(core.finished().values().map(|job| job.status));
        for status in statuses {
            *counts.entry(status.name()).or_default() += 1;
        }
        tracing::info!(
            serial = core.serial(),
            jobs = core.job_count(),
            ?counts,
            queued_to_start = core.queued().count(),
            drained = core.is_drained(),
            "dump: queue"
        );
        for runner in core.runners() {
            let adopted = !self
                .shell
                .processes
                .values()
                .any(|(id, process)| *id == runner.id && process.child.is_some());
            tracing::info!(
                job = runner.id,
                runner = ?runner.runner,
                adopted,
                status = core.job(runner.id).map(|job| job.status().name()),
                "dump: runner"
            );
        }
        for connection in self.connections.dump() {
            tracing::info!(
                pid = connection.peer.pid,
                uid = connection.peer.uid,
                buffered = connection.buffered_bytes,
                output = connection.output_bytes,
                held = connection.held,
                "dump: connection"
            );
        }
        let (first, readable, last, event_watches) = self.shell.events.dump();
        tracing::info!(
            first_retained = first,
            readable,
            last,
            held_watches = event_watches,
            "dump: event sequence"
        );
        tracing::info!(
            watchers = core.watcher_count(),
            wconfd_calls_waiting = self.shell.wconfd.waiting(),
            threads =
                "one event loop thread (rayon's pool only during start-up scans and group commits)",
            "dump: watchers and threads"
        );
    }
}

impl Handler for Shell {
    fn handle(&mut self, token: Token, _peer: Peer, frame: &[u8]) -> Reply {
        let request = match parse_request(frame) {
            Ok(request) => request,
            Err(error) => return Reply::Now(Err(error)),
        };
        // The generic query's wire form belongs to the query module, which
        // decodes it (Ganeti sends `null` for "every field").
        match request.method.as_str() {
            "Query" => {
                return Reply::Now(crate::query::luxi_query(
                    &request.args,
                    &crate::query::jobs::QueueJobs {
                        unfinished: self.core.unfinished(),
                        finished: self.core.finished(),
                        queue: &self.queue,
                    },
                    self.core.filter_rules(),
                    self.settings.luxid.frame_bytes_max,
                ));
            }
            "QueryFields" => {
                return Reply::Now(crate::query::luxi_query_fields(&request.args));
            }
            _ => {}
        }
        match LuxiRequest::decode(&request) {
            Ok(request) => self.request(Conn(token.0), request),
            Err(error) => Reply::Now(Err(error)),
        }
    }
}

impl Shell {
    /// A priority request file of a job with no runner any more (its job
    /// ended while luxid was down, before the runner read it) has no one
    /// to read or remove it: it goes at start.
    fn remove_stale_priority_requests(&self) {
        let Ok(entries) = fs::read_dir(self.queue.dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|name| name.strip_prefix("job-"))
                .and_then(|rest| rest.strip_suffix(".priority"))
                .and_then(|id| id.parse::<JobId>().ok())
            else {
                continue;
            };
            if !self.core.is_started(id) {
                tracing::info!(job = id, "removed a priority request no runner will read");
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Runs one input and every effect it leads to; answers what the core
    /// answered to the request of `Input::Request`, and the result of a
    /// commit.
    fn run(&mut self, input: Input) -> Option<Result<(), String>> {
        let effects = self.core.handle(input, Instant::now());
        self.carry_out(effects).committed
    }

    fn carry_out(&mut self, effects: Vec<Effect>) -> Outcome {
        let mut outcome = Outcome::default();
        let mut todo: VecDeque<Effect> = effects.into();
        while let Some(effect) = todo.pop_front() {
            let mut more = |inputs: Vec<Effect>| {
                for effect in inputs.into_iter().rev() {
                    todo.push_front(effect);
                }
            };
            match effect {
                Effect::Events(events) => self.events.append(events),
                Effect::Reply { conn: _, reply } => {
                    outcome.reply = Some(Reply::Now(wire::wire_reply(reply)))
                }
                Effect::Hold { conn: _, deadline } => outcome.reply = Some(Reply::Held(deadline)),
                Effect::Release { conn, reply } => {
                    self.releases.push((Token(conn.0), wire::wire_reply(reply)))
                }
                Effect::Do { ticket, action } => {
                    let result = self.act(action);
                    more(
                        self.core
                            .handle(Input::Done { ticket, result }, Instant::now()),
                    );
                }
                Effect::Commit { jobs, start } => {
                    let input = self.commit(&jobs, &start);
                    if let Input::Committed { result, .. } = &input {
                        outcome.committed = Some(result.clone());
                    }
                    more(self.core.handle(input, Instant::now()));
                }
                Effect::ReadJobStatus { ticket, id } => {
                    let status = match self.queue.read_job(id) {
                        Ok(job) => job.map(|job| job.status()),
                        Err(error) => {
                            tracing::error!(job = id, %error, "cannot read a job file");
                            None
                        }
                    };
                    let input = Input::JobStatusRead { ticket, status };
                    more(self.core.handle(input, Instant::now()));
                }
                Effect::Spawn { id } => self.spawns.push(id),
                Effect::WatchRunner { id, pid } => match sys::pidfd_open(pid) {
                    Ok(pidfd) => {
                        tracing::info!(
                            job = id,
                            pid,
                            "following a runner started before luxid's restart"
                        );
                        self.watch_process(id, None, pidfd);
                    }
                    Err(_) => {
                        let livelock_held = self.livelock_held(id);
                        more(self.core.handle(
                            Input::RunnerExited {
                                id,
                                cause: None,
                                livelock_held,
                            },
                            Instant::now(),
                        ));
                    }
                },
                Effect::Signal { id, pid, signal } => {
                    let signal = match signal {
                        RunnerSignal::Cancel => Signal::SIGTERM,
                        RunnerSignal::Priority => Signal::SIGUSR1,
                    };
                    if let Err(error) = sys::send_signal(pid, signal) {
                        tracing::debug!(job = id, %error, "cannot signal the runner");
                    }
                }
                Effect::KillGroup { id: _, pid } => {
                    let _ = sys::send_signal_to_group(pid, Signal::SIGKILL);
                }
                Effect::WatchLivelock { id, path } => {
                    if let Ok(watch) = self.inotify.add_watch(&path, AddWatchFlags::IN_CLOSE_WRITE)
                    {
                        self.livelock_watches.insert(watch, id);
                        if let Some(old) = self.watch_of.insert(id, watch)
                            && old != watch
                        {
                            self.livelock_watches.remove(&old);
                        }
                    }
                }
                Effect::UnwatchLivelock { id } => {
                    if let Some(watch) = self.watch_of.remove(&id) {
                        let _ = self.inotify.rm_watch(watch);
                        self.livelock_watches.remove(&watch);
                    }
                }
                Effect::Probe { id, path } => {
                    let released = liveness::is_dead(&path);
                    let mut effects = Vec::new();
                    if released {
                        // The runner may have finished the file just
                        // before it died.
                        if let Some(input) = self.reread(id) {
                            effects = self.core.handle(input, Instant::now());
                        }
                    }
                    let input = Input::Probed { id, released };
                    effects.extend(self.core.handle(input, Instant::now()));
                    more(effects);
                }
                Effect::RemoveLivelock { path } => {
                    let _ = liveness::remove_dead_livelock(&self.livelock_dir, &path);
                }
                Effect::RemovePriorityRequest { id } => {
                    let _ = fs::remove_file(queue::priority_request_path(self.queue.dir(), id));
                }
                Effect::FreeLocks { id, livelock, pid } => {
                    self.free_locks(&DeadOwner { id, livelock, pid })
                }
                Effect::RequestWorkers { .. }
                | Effect::ReleaseWorkers { .. }
                | Effect::PrepareEnded { .. } => self.worker_call(effect),
            }
        }
        outcome
    }

    /// Carries out a change the core asked for.
    fn act(&mut self, action: Action) -> Result<(), String> {
        match action {
            Action::WriteJob(job) => {
                let id = job.id;
                let written = self.queue.write_job(&job);
                if let Err(error) = &written
                    && let Some(Runner::Dying { failed_writes, .. }) = self.core.runner(id)
                {
                    if *failed_writes == 0 {
                        tracing::error!(job = id, %error, "cannot record the death of a job; trying again until it can be written");
                    }
                    if self.recovering && self.recovery_error.is_none() {
                        self.recovery_error = Some(io_error(
                            "cannot write",
                            &queue::job_path(self.queue.dir(), id),
                        )(io::Error::new(
                            error.kind(),
                            error.to_string(),
                        )));
                    }
                }
                written.map_err(|error| error.to_string())
            }
            Action::Archive(id) => self.queue.archive(id).map_err(|error| {
                tracing::error!(job = id, %error, "cannot archive");
                error.to_string()
            }),
            Action::SetDrain(drained) => self
                .queue
                .set_drained(drained)
                .map_err(|error| error.to_string()),
            Action::WritePriorityRequest { id, priority } => {
                let path = queue::priority_request_path(self.queue.dir(), id);
                crate::store::atomic_write(&path, format!("{priority}\n").as_bytes())
                    .map_err(|error| error.to_string())
            }
            Action::KillGroup { id: _, pid } => {
                sys::send_signal_to_group(pid, Signal::SIGKILL).map_err(|error| error.to_string())
            }
            Action::WriteFilters(rules) => self.queue.write_filters(&rules).map_err(|error| {
                tracing::error!(%error, "cannot write the filter rules");
                error.to_string()
            }),
        }
    }

    /// Makes a turn's new jobs durable (one group commit). If some of them
    /// may start at once (`start`), the commit runs on a helper thread and
    /// their runners are started meanwhile, as long as it lasts, so that a
    /// runner's process start overlaps the syncs; such a runner waits for
    /// luxid's word (a byte on its stdin, given once the commit returned)
    /// before it does anything. If the commit fails, the runners get no
    /// word (they leave the job alone and exit), and nothing of the jobs
    /// is revealed. The other runners start after the turn's replies.
    fn commit(&mut self, ids: &[JobId], start: &[JobId]) -> Input {
        while self.queue.serial() < self.core.serial() {
            self.queue.next_id();
        }
        let jobs: Vec<Job> = ids
            .iter()
            .filter_map(|id| self.core.unfinished().get(id).cloned())
            .collect();
        let commit = self.queue.new_commit(&jobs);
        let started = Instant::now();
        let (committed, spawned, words) = if start.is_empty() {
            (commit.run(), Vec::new(), Vec::new())
        } else {
            std::thread::scope(|scope| {
                let committing = scope.spawn(|| commit.run());
                let mut spawned = Vec::new();
                let mut words = Vec::new();
                for &id in start {
                    // Replies wait for the commit (and at most the one
                    // spawn under way when it returned), not for spawns.
                    if committing.is_finished() {
                        break;
                    }
                    match self.start_runner(id, Start::AfterCommit) {
                        Ok((pid, word)) => {
                            spawned.push((id, Ok(pid)));
                            words.extend(word.map(|word| (id, word)));
                        }
                        Err(error) => {
                            // The job file is not in place yet: tried
                            // again (and the job ended if it fails again)
                            // once the commit is done.
                            tracing::warn!(job = id, %error, "cannot start the job runner; trying again");
                            spawned.push((id, Err(error.to_string())));
                        }
                    }
                }
                let committed = committing
                    .join()
                    .expect("writing the new jobs' files does not panic");
                (committed, spawned, words)
            })
        };
        tracing::debug!(
            jobs = jobs.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "committed new jobs"
        );
        let result = match committed {
            Ok(()) => {
                for (id, mut word) in words {
                    if let Err(error) = word.write_all(b"g") {
                        // It died meanwhile: its pidfd tells.
                        tracing::warn!(job = id, %error, "cannot tell the runner its job is durable");
                    }
                }
                Ok(())
            }
            Err(error) => {
                // Their runners read the end of their stdin and exit.
                drop(words);
                tracing::error!(%error, "cannot write new jobs; refusing them");
                Err(error.to_string())
            }
        };
        Input::Committed { result, spawned }
    }

    /// Starts the runner of a durable job.
    fn spawn(&mut self, id: JobId) {
        let input = match self.start_runner(id, Start::Now) {
            Ok((pid, _)) => Input::Spawned { id, pid },
            Err(error) => {
                tracing::error!(job = id, %error, "cannot start the job runner");
                Input::SpawnFailed {
                    id,
                    error: error.to_string(),
                }
            }
        };
        let effects = self.core.handle(input, Instant::now());
        self.carry_out(effects);
        // Nothing it leads to waits for the turn's replies.
        for id in std::mem::take(&mut self.spawns) {
            self.spawn(id);
        }
    }

    /// Starts the runner of job `id`, watched by its pidfd; one that must
    /// wait for its job's commit answers the stdin to write luxid's word
    /// to.
    fn start_runner(&mut self, id: JobId, start: Start) -> io::Result<(u32, Option<ChildStdin>)> {
        let mut command = Command::new(&self.runner_path);
        command.arg("--root").arg(&self.root);
        match start {
            Start::Now => command.stdin(Stdio::null()),
            Start::AfterCommit => command.arg(WAIT_FOR_COMMIT_FLAG).stdin(Stdio::piped()),
        };
        command
            .arg(id.to_string())
            .stdout(Stdio::null())
            // Its own process group: cancel-with-kill reaches every
            // process of the job, and none of luxid's.
            .process_group(0);
        if let Some(workers) = self.core.assigned_workers(id) {
            command.env(
                crate::paths::WORKERS_ENV,
                Value::Array(workers.to_vec()).to_string(),
            );
        }
        // The runner inherits these blocked: sent before it handles them,
        // they wait instead of killing it.
        let mask = sys::block_signals(&RUNNER_SIGNALS);
        let spawned = command.spawn();
        if let Ok(old) = &mask {
            let _ = sys::restore_signal_mask(old);
        }
        let mut child = spawned?;
        let word = child.stdin.take();
        let pid = child.id();
        match sys::pidfd_open(pid) {
            Ok(pidfd) => self.watch_process(id, Some(child), pidfd),
            Err(error) => tracing::error!(job = id, %error, "cannot watch the job runner"),
        }
        tracing::debug!(job = id, pid, "started a job runner");
        Ok((pid, word))
    }

    fn watch_process(&mut self, id: JobId, child: Option<Child>, pidfd: OwnedFd) {
        let token = self.new_token();
        let _ =
            self.registry
                .register(&mut SourceFd(&pidfd.as_raw_fd()), token, Interest::READABLE);
        self.processes.insert(
            token,
            (
                id,
                Process {
                    child,
                    pidfd,
                    token,
                },
            ),
        );
    }

    /// A runner's pidfd became readable: the process ended.
    fn runner_exited(&mut self, token: Token) {
        let Some((id, mut process)) = self.processes.remove(&token) else {
            return;
        };
        let _ = self
            .registry
            .deregister(&mut SourceFd(&process.pidfd.as_raw_fd()));
        debug_assert_eq!(process.token, token);
        let cause = process.child.as_mut().and_then(|child| {
            // Reaps it.
            child
                .wait()
                .ok()
                .and_then(|status| status.code())
                .and_then(exit_cause)
        });
        if let Some(input) = self.reread(id) {
            self.run(input);
        }
        if let Some(&Runner::Running { pid }) = self.core.runner(id) {
            let livelock_held = self.livelock_held(id);
            if let Some(job) = self.core.unfinished().get(&id) {
                if job.process_id != Some(pid) && livelock_held {
                    tracing::info!(job = id, "another runner has the job; following it");
                } else {
                    tracing::warn!(job = id, pid, "the job runner died");
                }
            }
            self.run(Input::RunnerExited {
                id,
                cause,
                livelock_held,
            });
        }
    }

    /// Whether a runner of job `id` lives (its livelock is held), whoever
    /// started it.
    fn livelock_held(&self, id: JobId) -> bool {
        self.core
            .livelock(id)
            .is_some_and(|path| !liveness::is_dead(path))
    }

    /// The job file of a started job, re-read: the input that says so.
    fn reread(&self, id: JobId) -> Option<Input> {
        match self.queue.read_job(id) {
            Ok(Some(job)) => Some(Input::JobFileChanged { job }),
            Ok(None) => None,
            Err(error) => {
                tracing::error!(job = id, %error, "cannot read a job file");
                None
            }
        }
    }

    fn inotify_events(&mut self) {
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(error) => {
                    tracing::error!(%error, "cannot read inotify events");
                    return;
                }
            };
            for event in events {
                if let Some(&id) = self.livelock_watches.get(&event.wd) {
                    self.run(Input::LivelockClosed { id });
                    continue;
                }
                let Some(id) = event
                    .name
                    .as_deref()
                    .and_then(|name| name.to_str())
                    .and_then(parse_job_file_name)
                else {
                    continue;
                };
                // Only files of started jobs change behind luxid's back.
                if self.core.is_started(id)
                    && let Some(input) = self.reread(id)
                {
                    self.run(input);
                }
            }
        }
    }

    /// Asks wconfd to free the locks and pending request of a dead job's
    /// owner. wconfd finds dead owners by itself too (their process exits,
    /// its periodic probe), but a job's livelock may outlive its runner
    /// (its programs hold it until killed), so this makes it immediate. A
    /// failure is logged: wconfd's periodic probe still frees them.
    fn free_locks(&mut self, dead: &DeadOwner) {
        let owner = Owner::job(dead.id, dead.livelock.clone(), dead.pid);
        self.wconfd.call(
            crate::protocol::wconfd::WconfdRequest::FreeLocks { owner },
            workers::WconfdCall::FreeLocks { id: dead.id },
            Instant::now(),
        );
    }

    fn new_token(&mut self) -> Token {
        let token = Token(self.next_token);
        self.next_token += 1;
        token
    }
}

/// The queue on disk, with what the runners' livelocks and processes say,
/// for the core; and the pidfds of the runners to watch.
fn restored(
    queue: &Queue,
    livelock_dir: &Path,
    loaded: Loaded,
) -> (Restored, Vec<(JobId, OwnedFd)>) {
    let Loaded {
        jobs,
        finished,
        finished_livelocks,
        skipped: _,
    } = loaded;
    let mut restored = Restored {
        serial: queue.serial(),
        drained: queue.is_drained(),
        finished_livelocks,
        ..Restored::default()
    };
    let mut watched = Vec::new();
    for job in jobs.iter().filter(|job| !job.is_final()) {
        let livelock = queue_core::runner_livelock(livelock_dir, job);
        if liveness::is_dead(&livelock) {
            if job.livelock.is_some() {
                tracing::warn!(job = job.id, "the runner died while luxid was down");
            }
            continue;
        }
        restored.held.insert(job.id);
        match (&job.livelock, job.process_id) {
            (None, _) => tracing::info!(job = job.id, "adopted a starting runner"),
            (Some(_), pid) => {
                tracing::info!(job = job.id, ?pid, "adopted a running job");
                if let Some(pidfd) = pid.and_then(|pid| sys::pidfd_open(pid).ok()) {
                    restored.watched.insert(job.id);
                    watched.push((job.id, pidfd));
                }
            }
        }
    }
    restored.jobs = jobs;
    restored.finished = finished;
    (restored, watched)
}

/// The archived files of the jobs the event sequence has not said
/// finished that the queue has no more (see [`Restored::archived`]).
fn archived_unfinished(
    queue: &Queue,
    said: &queue_core::JobEvents,
    restored: &Restored,
) -> Vec<Job> {
    let present: std::collections::BTreeSet<JobId> = restored
        .jobs
        .iter()
        .map(|job| job.id)
        .chain(restored.finished.iter().map(|job| job.id))
        .collect();
    said.unfinished()
        .filter(|id| !present.contains(id))
        .filter_map(|id| match queue.read_archived(id) {
            Ok(job) => job,
            Err(error) => {
                tracing::warn!(job = id, %error, "cannot read an archived job to tell its end");
                None
            }
        })
        .collect()
}

/// What carrying out effects answered.
#[derive(Default)]
struct Outcome {
    reply: Option<Reply>,
    committed: Option<Result<(), String>>,
}

/// The owner of a dead job's locks in wconfd.
struct DeadOwner {
    id: JobId,
    livelock: String,
    pid: u32,
}
