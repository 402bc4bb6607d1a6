//! luxid's event loop: one thread, one mio poll. Connections speak LUXI
//! through the shared layer of [`crate::connection`]; each started job is
//! a `job-runner` process watched through a pidfd; the runners' job-file
//! updates arrive as inotify events on the queue directory. Nothing is
//! polled on a timer but `WaitForJobChange` timeouts and the release of a
//! dead job's livelock (as a safety net under its inotify event).
//!
//! A turn reads every ready connection and answers what it can; new jobs
//! are then made durable together (one group commit per turn) before any
//! reply of that turn is written, and only then are runners started, but
//! for those of new jobs that may start at once: they are started while
//! the commit is synced and wait for luxid's word before they act
//! (`State::commit_new_jobs`). A held `WaitForJobChange` answered in a
//! turn is staged with the turn's other replies, so every connection's
//! replies leave in request order.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR2};
use signal_hook_mio::v1_0::Signals;

use super::wconfd_link::WconfdLink;
use super::{DaemonError, io_error};
use crate::connection::{self, Connections, Handler, Peer, Reply};
use crate::daemon::{self, Admission};
use crate::jobs::opcode::{self, SUBMIT_PRIORITIES};
use crate::jobs::runner_contract::{Start, WAIT_FOR_COMMIT_FLAG};
use crate::jobs::{FIELDS, Job, JobId, QueuedOpcode, Status, Timestamp};
use crate::limits::WAIT_FOR_CHANGE_SECONDS_MAX;
use crate::liveness::{self, Livelock};
use crate::locks::Owner;
use crate::protocol::{Args, WireError, parse_request};
use crate::queue::{self, FinishedJob, Queue, parse_job_file_name};
use crate::settings::Settings;
use crate::sys;

const SIGNALS: Token = Token(1);
const INOTIFY: Token = Token(2);
const WCONFD: Token = Token(3);
const FIRST_DYNAMIC_TOKEN: usize = 4;

/// The signals luxid sends a runner that the runner handles (cancel,
/// priority request) or must survive (wconfd's SIGHUP); blocked while it
/// is spawned (see `sys::block_signals`).
const RUNNER_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGUSR1, Signal::SIGHUP];

/// How often the livelock of a dead runner's job is probed while its
/// processes are still being killed, should its inotify close event be
/// missed (for example a livelock luxid found by name only).
const RELEASE_PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// How often luxid tries again to write the end of a dead runner's job
/// when the disk refused it (full, read-only): the job ends promptly once
/// the disk takes writes again, and a full disk costs a write attempt, not
/// a busy loop.
const DEAD_JOB_WRITE_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// A held `WaitForJobChange`. What it holds is small whatever the
/// request was: the field names are the known ones (at most
/// [`crate::limits::QUERY_FIELDS_MAX`]), and the values the client has (equal to the
/// job's when the wait began, or it would have been answered) are kept as
/// a digest.
struct Watcher {
    job: JobId,
    fields: Vec<&'static str>,
    seen_digest: u64,
    log_serial: u64,
}

/// A started job whose end luxid has not seen yet.
struct Runner {
    /// The runner process when luxid started it (an adopted runner is
    /// watched by pidfd only).
    child: Option<Child>,
    pid: u32,
    pidfd: Option<OwnedFd>,
    token: Token,
    /// Set once the runner exited and the job was not final: the job's
    /// processes are being killed and its livelock awaited.
    dead: Option<DeadRunner>,
    /// Signals for a runner whose pid luxid does not know yet.
    deferred: Vec<Signal>,
    /// A cancel-with-kill held back until the runner's pid is known.
    kill_deferred: bool,
    /// Another runner holds the job's livelock but has not recorded its pid
    /// yet (it was started by a luxid that died): followed by probes until
    /// it does, or until it lets go of the livelock.
    claimant: Option<Instant>,
    /// The job's livelock (its name is fixed by the job's submission, see
    /// `runner::livelock_secs`): removed when the runner is done if it was
    /// left behind (a runner killed after it finished its job file).
    livelock: Option<PathBuf>,
}

struct DeadRunner {
    livelock: Option<PathBuf>,
    watch: Option<WatchDescriptor>,
    next_probe: Instant,
    /// What the runner's exit status says it died of, if it said.
    cause: Option<&'static str>,
    /// Attempts at writing the job's end that failed (a full or
    /// read-only disk): each is retried, the first is logged as an error.
    failed_writes: u32,
}

pub struct Server {
    poll: Poll,
    signals: Signals,
    connections: Connections,
    state: State,
    group_gid: Option<u32>,
    stopping: bool,
}

/// Everything of luxid but its connections: what answers requests.
struct State {
    /// Where the pidfds of runners are watched.
    registry: Registry,
    inotify: Inotify,
    root: PathBuf,
    settings: Settings,
    runner_path: PathBuf,
    queue: Queue,
    _livelock: Livelock,
    /// luxid's calls to wconfd, never waited for.
    wconfd: WconfdLink,
    /// Every unfinished job of the queue.
    jobs: BTreeMap<JobId, Job>,
    /// Every finished job of the queue, kept encoded (archived ones are
    /// read from disk).
    finished: BTreeMap<JobId, FinishedJob>,
    /// Jobs not started, in start order: (priority, id).
    queued: BTreeSet<(i64, JobId)>,
    runners: HashMap<JobId, Runner>,
    runner_tokens: HashMap<Token, JobId>,
    livelock_watches: HashMap<WatchDescriptor, JobId>,
    /// The held `WaitForJobChange` of each connection that has one.
    watchers: HashMap<Token, Watcher>,
    /// Keyed hashing of the values a watcher has seen.
    watched_values_hasher: RandomState,
    /// Held replies answered while requests were handled or jobs changed,
    /// released on their connections after.
    releases: Vec<(Token, Result<Value, WireError>)>,
    next_token: usize,
    /// New jobs of this turn, made durable at its end.
    new_jobs: Vec<JobId>,
    /// Jobs changed this turn (their watchers are checked at its end).
    changed: Vec<JobId>,
}

impl Server {
    pub(super) fn new(
        root: &Path,
        settings: Settings,
        queue: Queue,
        jobs: Vec<Job>,
        finished: Vec<FinishedJob>,
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
        Ok(Server {
            poll,
            signals,
            connections,
            group_gid,
            stopping: false,
            state: State {
                registry,
                inotify,
                root: root.to_owned(),
                settings,
                runner_path,
                queue,
                _livelock: livelock,
                wconfd,
                jobs: jobs.into_iter().map(|job| (job.id, job)).collect(),
                finished: finished.into_iter().map(|job| (job.id, job)).collect(),
                queued: BTreeSet::new(),
                runners: HashMap::new(),
                runner_tokens: HashMap::new(),
                livelock_watches: HashMap::new(),
                watchers: HashMap::new(),
                watched_values_hasher: RandomState::new(),
                releases: Vec::new(),
                next_token: FIRST_DYNAMIC_TOKEN,
                new_jobs: Vec::new(),
                changed: Vec::new(),
            },
        })
    }

    /// Before serving: adopts the runners still alive, marks the jobs whose
    /// runner died, queues the rest.
    pub(super) fn recover(&mut self) -> Result<(), DaemonError> {
        self.state.recover()
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
        self.state.schedule();
        while !self.stopping {
            let timeout = self.next_wakeup();
            if let Err(error) = self.poll.poll(&mut events, timeout) {
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io_error("cannot poll", Path::new("epoll"))(error));
            }
            for event in events.iter() {
                match event.token() {
                    connection::LISTENER => {
                        let state = &mut self.state;
                        self.connections.accept(|| state.new_token());
                    }
                    SIGNALS => self.handle_signals(),
                    INOTIFY => self.state.inotify_events(),
                    WCONFD => self.state.wconfd.event(Instant::now()),
                    token if self.state.runner_tokens.contains_key(&token) => {
                        self.state.runner_exited(token)
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
            self.state.wconfd.tick(Instant::now());
            self.state.probe_dead_runners();
            self.finish_turn();
        }
        self.connections.remove_socket();
        if let Err(error) = self.state.queue.save_serial() {
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
        let now = Instant::now();
        let mut wake = self.connections.next_deadline();
        if let Some(at) = self.state.wconfd.next_wakeup() {
            wake = Some(wake.map_or(at, |wake| wake.min(at)));
        }
        for runner in self.state.runners.values() {
            let probe = runner
                .dead
                .as_ref()
                .map(|dead| dead.next_probe)
                .or(runner.claimant);
            if let Some(probe) = probe {
                wake = Some(wake.map_or(probe, |at| at.min(probe)));
            }
        }
        wake.map(|at| at.saturating_duration_since(now))
    }

    /// Releases the held replies answered so far, and forgets the watchers
    /// whose connection went away.
    fn settle_watchers(&mut self) {
        for token in self.connections.take_dropped_holds() {
            self.state.watchers.remove(&token);
        }
        for (token, reply) in std::mem::take(&mut self.state.releases) {
            self.connections.release(token, reply);
        }
    }

    // ----- the turn -----

    /// Watchers of changed jobs are answered, new jobs become durable,
    /// then every staged reply is written (in request order on each
    /// connection) and runners are started.
    fn finish_turn(&mut self) {
        let changed = std::mem::take(&mut self.state.changed);
        if !changed.is_empty() {
            self.state.check_watchers(&changed);
        }
        self.settle_watchers();
        self.expire_watchers(Instant::now());
        let new_jobs = std::mem::take(&mut self.state.new_jobs);
        if !new_jobs.is_empty()
            && let Err(error) = self.state.commit_new_jobs(&new_jobs)
        {
            self.connections.fail_turn(&WireError::generic(format!(
                "cannot write the job queue: {error}"
            )));
        }
        self.connections.reveal();
        self.state.schedule();
    }

    fn expire_watchers(&mut self, now: Instant) {
        for token in self.connections.expired(now) {
            let reply = match self.state.watchers.remove(&token) {
                Some(watcher) => match self.state.job(watcher.job) {
                    Some(job) => {
                        Ok(
                            change_reply(&job, &watcher.fields, watcher.log_serial, false, |_| {
                                true
                            })
                            .expect("an unconditional reply"),
                        )
                    }
                    None => Err(job_lost(watcher.job)),
                },
                None => Err(WireError::generic("the wait was lost")),
            };
            self.connections.release(token, reply);
        }
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
        let state = &self.state;
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        let statuses = state
            .jobs
            .values()
            .map(Job::status)
            .chain(state.finished.values().map(|job| job.status));
        for status in statuses {
            *counts.entry(status.name()).or_default() += 1;
        }
        tracing::info!(
            serial = state.queue.serial(),
            jobs = state.job_count(),
            ?counts,
            queued_to_start = state.queued.len(),
            drained = state.queue.is_drained(),
            "dump: queue"
        );
        for (id, runner) in &state.runners {
            tracing::info!(
                job = id,
                pid = runner.pid,
                adopted = runner.child.is_none(),
                dead = runner.dead.is_some(),
                status = state.job(*id).map(|job| job.status().name()),
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
        tracing::info!(
            watchers = state.watchers.len(),
            wconfd_calls_waiting = state.wconfd.waiting(),
            threads =
                "one event loop thread (rayon's pool only during start-up scans and group commits)",
            "dump: watchers and threads"
        );
    }
}

impl Handler for State {
    fn handle(&mut self, token: Token, _peer: Peer, frame: &[u8]) -> Reply {
        match parse_request(frame) {
            Ok(request) => self.dispatch(token, &request.method, &request.args),
            Err(error) => Reply::Now(Err(error)),
        }
    }
}

impl State {
    /// Before serving: adopts the runners still alive, marks the jobs whose
    /// runner died, queues the rest.
    fn recover(&mut self) -> Result<(), DaemonError> {
        let unfinished: Vec<JobId> = self
            .jobs
            .values()
            .filter(|job| !job.is_final())
            .map(|job| job.id)
            .collect();
        for id in unfinished {
            let job = &self.jobs[&id];
            let livelock = job.livelock.as_ref().map(PathBuf::from);
            match livelock {
                None if self.runner_alive(id) => {
                    tracing::info!(job = id, "adopted a starting runner");
                    self.follow_claimant(id);
                }
                None => {
                    let priority = job.priority();
                    self.queued.insert((priority, id));
                }
                Some(livelock) if !liveness::is_dead(&livelock) => {
                    let pid = job.process_id;
                    tracing::info!(job = id, ?pid, "adopted a running job");
                    self.adopt(id, pid, livelock);
                }
                Some(_) => {
                    tracing::warn!(job = id, "the runner died while luxid was down");
                    self.mark_dead(id, None)?;
                }
            }
        }
        Ok(())
    }

    /// Where a runner of job `id` keeps its livelock: the name is fixed by
    /// the job's submission time (see `runner::livelock_secs`), so a runner
    /// that has not recorded it in the job file yet is found all the same.
    fn job_livelock(&self, id: JobId) -> Option<PathBuf> {
        let job = self.jobs.get(&id)?;
        let name = liveness::job_livelock_name(id, crate::runner::livelock_secs(job));
        Some(self.root.join(crate::wconfd::LIVELOCK_DIR).join(name))
    }

    /// Whether a runner of job `id` lives (its livelock is held), whoever
    /// started it.
    fn runner_alive(&self, id: JobId) -> bool {
        self.job_livelock(id)
            .is_some_and(|path| !liveness::is_dead(&path))
    }

    fn adopt(&mut self, id: JobId, pid: Option<u32>, livelock: PathBuf) {
        let token = self.new_token();
        let pidfd = pid.and_then(|pid| sys::pidfd_open(pid).ok());
        if let Some(fd) = &pidfd {
            let _ =
                self.registry
                    .register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE);
        }
        let mut runner = Runner {
            child: None,
            pid: pid.unwrap_or(0),
            pidfd,
            token,
            dead: None,
            deferred: Vec::new(),
            kill_deferred: false,
            claimant: None,
            livelock: Some(livelock.clone()),
        };
        if runner.pidfd.is_none() {
            // No process to watch: follow the livelock instead.
            runner.dead = Some(self.watch_release(id, Some(livelock)));
        }
        self.runner_tokens.insert(token, id);
        self.runners.insert(id, runner);
    }

    /// Follows a runner luxid did not start and whose pid is not recorded
    /// yet: it holds the job's livelock (see `runner::livelock_secs`).
    fn follow_claimant(&mut self, id: JobId) {
        let token = self.new_token();
        let livelock = self.job_livelock(id);
        self.runner_tokens.insert(token, id);
        self.runners.insert(
            id,
            Runner {
                child: None,
                pid: 0,
                pidfd: None,
                token,
                dead: None,
                deferred: Vec::new(),
                kill_deferred: false,
                claimant: Some(Instant::now()),
                livelock,
            },
        );
    }

    /// A claimant recorded its pid: watch it by pidfd. A claimant that let
    /// go of the livelock without recording one never started the job: it
    /// is queued again.
    fn resolve_claimant(&mut self, id: JobId) {
        let Some(runner) = self.runners.get(&id) else {
            return;
        };
        if runner.claimant.is_none() {
            return;
        }
        let (recorded, finished, priority) = match self.jobs.get(&id) {
            Some(job) => (job.process_id, false, job.priority()),
            None => (None, true, 0),
        };
        if finished {
            self.runner_done(id);
            return;
        }
        if let Some(pid) = recorded {
            let token = runner.token;
            let pidfd = sys::pidfd_open(pid).ok();
            if let Some(fd) = &pidfd {
                let _ = self.registry.register(
                    &mut SourceFd(&fd.as_raw_fd()),
                    token,
                    Interest::READABLE,
                );
            }
            let runner = self.runners.get_mut(&id).expect("looked up above");
            runner.pid = pid;
            runner.claimant = None;
            let gone = pidfd.is_none();
            runner.pidfd = pidfd;
            tracing::info!(
                job = id,
                pid,
                "following a runner started before luxid's restart"
            );
            self.send_deferred(id);
            if gone {
                self.runner_exited(token);
            }
            return;
        }
        if !self.runner_alive(id) {
            tracing::info!(
                job = id,
                "a runner let go of a job it never started; queued again"
            );
            if let Some(runner) = self.runners.remove(&id) {
                self.runner_tokens.remove(&runner.token);
            }
            self.queued.insert((priority, id));
            return;
        }
        let runner = self.runners.get_mut(&id).expect("looked up above");
        runner.claimant = Some(Instant::now() + RELEASE_PROBE_INTERVAL);
    }

    /// A job of the queue, decoded if it is finished.
    fn job(&self, id: JobId) -> Option<Cow<'_, Job>> {
        match self.jobs.get(&id) {
            Some(job) => Some(Cow::Borrowed(job)),
            None => self.finished.get(&id).map(|job| Cow::Owned(job.job())),
        }
    }

    /// Keeps `job` as the queue's copy: finished ones encoded.
    fn put(&mut self, job: Job) {
        let id = job.id;
        if job.is_final() {
            self.jobs.remove(&id);
            self.finished.insert(id, FinishedJob::new(&job));
        } else {
            self.jobs.insert(id, job);
        }
    }

    fn job_count(&self) -> usize {
        self.jobs.len() + self.finished.len()
    }

    fn new_token(&mut self) -> Token {
        let token = Token(self.next_token);
        self.next_token += 1;
        token
    }

    /// Makes a turn's new jobs durable (one group commit). If some of them
    /// may start at once, the commit runs on a helper thread and their
    /// runners are started meanwhile, as long as it lasts, so that a
    /// runner's process start overlaps the syncs; such a runner
    /// waits for luxid's word (a byte on its stdin, given once the commit
    /// returned) before it does anything. If the commit fails, the runners
    /// get no word (they leave the job alone and exit), and nothing of the
    /// jobs is revealed. The other runners start after the turn's replies.
    fn commit_new_jobs(&mut self, ids: &[JobId]) -> io::Result<()> {
        let jobs: Vec<Job> = ids.iter().map(|id| self.jobs[id].clone()).collect();
        let commit = self.queue.new_commit(&jobs);
        for job in &jobs {
            self.queued.insert((job.priority(), job.id));
        }
        let started = Instant::now();
        // The new jobs among those the scheduler would start now (the
        // others it starts at the end of the turn still fit).
        let startable: Vec<(i64, JobId)> = self
            .startable()
            .into_iter()
            .filter(|(_, id)| ids.contains(id))
            .collect();
        let (committed, words) = if startable.is_empty() {
            (commit.run(), Vec::new())
        } else {
            std::thread::scope(|scope| {
                let committing = scope.spawn(|| commit.run());
                let mut words = Vec::new();
                for entry in startable {
                    // Replies wait for the commit (and at most the one
                    // spawn under way when it returned), not for spawns.
                    if committing.is_finished() {
                        break;
                    }
                    self.queued.remove(&entry);
                    if let Some(word) = self.start_runner(entry.1, Start::AfterCommit) {
                        words.push((entry.1, word));
                    }
                }
                let committed = committing
                    .join()
                    .expect("writing the new jobs' files does not panic");
                (committed, words)
            })
        };
        tracing::debug!(
            jobs = jobs.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "committed new jobs"
        );
        match committed {
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
                // Nothing of these jobs may be revealed or run: their
                // runners read the end of their stdin and exit.
                drop(words);
                tracing::error!(%error, "cannot write new jobs; refusing them");
                for job in &jobs {
                    self.jobs.remove(&job.id);
                    self.queued.remove(&(job.priority(), job.id));
                }
                Err(error)
            }
        }
    }

    /// Answers a request now, or later (a held `WaitForJobChange`).
    fn dispatch(&mut self, token: Token, method: &str, args: &[Value]) -> Reply {
        Reply::Now(match method {
            "SubmitJob" => {
                Args::exactly(method, args, 1).and_then(|args| self.submit_job(args.get(0), false))
            }
            "SubmitJobToDrainedQueue" => {
                Args::exactly(method, args, 1).and_then(|args| self.submit_job(args.get(0), true))
            }
            "SubmitManyJobs" => {
                Args::exactly(method, args, 1).and_then(|args| self.submit_many(args.list(0)?))
            }
            "QueryJobs" => Args::exactly(method, args, 2).and_then(|args| self.query_jobs(&args)),
            "Query" => crate::query::jobs::luxi_query(
                args,
                &crate::query::jobs::QueueJobs {
                    unfinished: &self.jobs,
                    finished: &self.finished,
                    queue: &self.queue,
                },
                self.settings.luxid.frame_bytes_max,
            ),
            "QueryFields" => crate::query::jobs::luxi_query_fields(args),
            "WaitForJobChange" => {
                return match Args::exactly(method, args, 5)
                    .and_then(|args| self.wait_for_job_change(token, &args))
                {
                    Ok(Held::Now(reply)) => Reply::Now(Ok(reply)),
                    Ok(Held::Until(deadline)) => Reply::Held(deadline),
                    Err(error) => Reply::Now(Err(error)),
                };
            }
            "CancelJob" => self.cancel_job(method, args),
            "ArchiveJob" => Args::exactly(method, args, 1)
                .and_then(|args| job_id(&args, 0))
                .map(|id| json!(self.archive_job(id))),
            "AutoArchiveJobs" => {
                Args::exactly(method, args, 2).and_then(|args| self.auto_archive(&args))
            }
            "ChangeJobPriority" => {
                Args::exactly(method, args, 2).and_then(|args| self.change_priority(&args))
            }
            "SetDrainFlag" => Args::exactly(method, args, 1).and_then(|args| {
                let drained = args.bool(0)?;
                self.queue
                    .set_drained(drained)
                    .map_err(|error| {
                        WireError::generic(format!("cannot set the drain flag: {error}"))
                    })
                    .map(|()| json!(true))
            }),
            "QueryConfigValues" => Args::exactly(method, args, 1).and_then(|args| {
                let fields = args.list(0)?;
                Ok(Value::Array(
                    fields
                        .iter()
                        .map(|field| match field.as_str() {
                            Some("drain_flag") => json!(self.queue.is_drained()),
                            Some("cluster_name") => json!("warden"),
                            _ => Value::Null,
                        })
                        .collect(),
                ))
            }),
            other => Err(WireError::generic(format!(
                "unknown method '{}'",
                crate::protocol::shortened(other)
            ))),
        })
    }

    fn submit_job(&mut self, ops: &Value, ignore_drain: bool) -> Result<Value, WireError> {
        if !ignore_drain && self.queue.is_drained() {
            return Err(WireError::generic("Queue drained"));
        }
        self.check_room(1)?;
        let id = self.queue.serial() + 1;
        let job = build_job(ops, id)?;
        self.accept_job(job);
        Ok(json!(id))
    }

    fn submit_many(&mut self, jobs: &[Value]) -> Result<Value, WireError> {
        if self.queue.is_drained() {
            return Err(WireError::generic("Queue drained"));
        }
        if jobs.len() > crate::limits::SUBMIT_MANY_JOBS_MAX {
            return Err(WireError::generic(format!(
                "SubmitManyJobs: {} jobs are over the limit of {} per submission; submit them in parts",
                jobs.len(),
                crate::limits::SUBMIT_MANY_JOBS_MAX
            )));
        }
        self.check_room(jobs.len())?;
        let mut results = Vec::with_capacity(jobs.len());
        for ops in jobs {
            let id = self.queue.serial() + 1;
            match build_job(ops, id) {
                Ok(job) => {
                    self.accept_job(job);
                    results.push(json!([true, id]));
                }
                Err(error) => results.push(json!([false, error.message()])),
            }
        }
        Ok(Value::Array(results))
    }

    fn check_room(&self, count: usize) -> Result<(), WireError> {
        let max = self.settings.luxid.queue_jobs_max;
        if self.job_count() + count > max {
            return Err(WireError {
                class: "JobQueueFull",
                args: vec![json!(format!(
                    "the queue holds {} jobs, its limit is {max} (archive finished jobs)",
                    self.job_count()
                ))],
            });
        }
        Ok(())
    }

    fn accept_job(&mut self, job: Job) {
        let id = self.queue.next_id();
        debug_assert_eq!(id, job.id);
        self.jobs.insert(id, job);
        self.new_jobs.push(id);
    }

    fn query_jobs(&mut self, args: &Args) -> Result<Value, WireError> {
        let fields = field_names(args, 1)?;
        let ids: Vec<JobId> = match args.get(0) {
            Value::Null => {
                let mut ids: Vec<JobId> = self
                    .jobs
                    .keys()
                    .chain(self.finished.keys())
                    .copied()
                    .collect();
                ids.sort_unstable();
                if fields.contains(&"archived") {
                    ids.extend(self.queue.archived_ids());
                    ids.sort_unstable();
                    ids.dedup();
                }
                ids
            }
            Value::Array(ids) => ids
                .iter()
                .map(|id| {
                    parse_job_id(id).ok_or_else(|| args.bad(0, "holds something not a job id"))
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(args.bad(0, "is neither a list of job ids nor null")),
        };
        // Rows are counted as they are made: a short request (the same id
        // many times, every field) must not build an answer of gigabytes.
        let limit_bytes = self.settings.luxid.frame_bytes_max;
        let mut answer_bytes = 0;
        let mut rows = Vec::with_capacity(ids.len().min(1024));
        // The row of a finished job (decoded) or an archived one (read
        // from disk) is made once, however often it is asked for.
        let mut made: HashMap<JobId, Value> = HashMap::new();
        for id in ids {
            let row = match made.get(&id) {
                Some(row) => row.clone(),
                None if self.jobs.contains_key(&id) || id > self.queue.serial() => {
                    self.row(id, &fields)
                }
                None => {
                    let row = self.row(id, &fields);
                    made.insert(id, row.clone());
                    row
                }
            };
            answer_bytes += encoded_bytes(&row) + 1;
            if answer_bytes > limit_bytes {
                return Err(WireError::generic(format!(
                    "the answer would be longer than the frame limit of {limit_bytes} bytes; \
                     ask for fewer jobs or fields"
                )));
            }
            rows.push(row);
        }
        Ok(Value::Array(rows))
    }

    /// A QueryJobs row; an unknown job has its id and nulls.
    fn row(&self, id: JobId, fields: &[&str]) -> Value {
        let archived;
        let job = match self.job(id) {
            Some(job) => {
                archived = false;
                Some(job)
            }
            // Above the serial no job was ever submitted: nothing to read.
            None if id > self.queue.serial() => {
                archived = false;
                None
            }
            None => {
                archived = true;
                match self.queue.read_archived(id) {
                    Ok(job) => job.map(Cow::Owned),
                    Err(error) => {
                        // Answered as unknown, never as a guess.
                        tracing::error!(job = id, %error, "skipped an archived job file that cannot be read");
                        None
                    }
                }
            }
        };
        Value::Array(
            fields
                .iter()
                .map(|field| match &job {
                    Some(job) => job.field(field, archived).unwrap_or(Value::Null),
                    None if *field == "id" => json!(id),
                    None => Value::Null,
                })
                .collect(),
        )
    }

    fn wait_for_job_change(&mut self, token: Token, args: &Args) -> Result<Held, WireError> {
        let id = job_id(args, 0)?;
        let fields = field_names(args, 1)?;
        let previous = args.get(2).clone();
        let log_serial = match args.get(3) {
            Value::Null => 0,
            value => value
                .as_u64()
                .ok_or_else(|| args.bad(3, "is not a log serial"))?,
        };
        let timeout = args
            .get(4)
            .as_f64()
            .filter(|seconds| *seconds >= 0.0)
            .ok_or_else(|| args.bad(4, "is not a timeout in seconds"))?
            .min(WAIT_FOR_CHANGE_SECONDS_MAX);
        let Some(job) = self.job(id) else {
            return Err(job_lost(id));
        };
        let mut seen = None;
        let reply = change_reply(&job, &fields, log_serial, true, |values| {
            // Digested only when the wait may be held.
            let same = values == &previous;
            if same {
                seen = Some(digest(&self.watched_values_hasher, values));
            }
            same
        });
        if let Some(reply) = reply {
            return Ok(Held::Now(reply));
        }
        let seen_digest = seen.expect("no reply: the values were the same, so digested");
        self.watchers.insert(
            token,
            Watcher {
                job: id,
                fields,
                seen_digest,
                log_serial,
            },
        );
        Ok(Held::Until(
            Instant::now() + Duration::from_secs_f64(timeout),
        ))
    }

    /// Answers the watchers of changed jobs whose view changed (or whose
    /// job was archived: `JobLost`).
    fn check_watchers(&mut self, changed: &[JobId]) {
        let due: Vec<(Token, Result<Value, WireError>)> = self
            .watchers
            .iter()
            .filter(|(_, watcher)| changed.contains(&watcher.job))
            .filter_map(|(&token, watcher)| match self.job(watcher.job) {
                Some(job) => {
                    change_reply(&job, &watcher.fields, watcher.log_serial, true, |values| {
                        digest(&self.watched_values_hasher, values) == watcher.seen_digest
                    })
                    .map(|reply| (token, Ok(reply)))
                }
                None => Some((token, Err(job_lost(watcher.job)))),
            })
            .collect();
        for (token, reply) in due {
            self.watchers.remove(&token);
            self.releases.push((token, reply));
        }
    }

    fn cancel_job(&mut self, method: &str, args: &[Value]) -> Result<Value, WireError> {
        let (id, kill) = match args.len() {
            1 => (job_id(&Args::exactly(method, args, 1)?, 0)?, false),
            2 => {
                let args = Args::exactly(method, args, 2)?;
                (job_id(&args, 0)?, args.bool(1)?)
            }
            count => {
                return Err(WireError::generic(format!(
                    "{method} takes 1 or 2 arguments, got {count}"
                )));
            }
        };
        if self.finished.contains_key(&id) {
            return Ok(json!([false, format!("Job {id} has already finished")]));
        }
        let Some(job) = self.jobs.get(&id) else {
            return Ok(json!([false, format!("Job {id} not found in queue")]));
        };
        let Some(runner) = self.runners.get(&id) else {
            // Not started: luxid owns the file.
            let mut job = job.clone();
            job.finish_unfinished(Status::Canceled, &json!("Job canceled by request"));
            self.queued.retain(|&(_, queued)| queued != id);
            self.store_job(job)?;
            return Ok(json!([true, format!("Dequeued job {id}")]));
        };
        if runner.dead.is_some() {
            return Ok(json!([
                false,
                format!("Job {id} is being cleaned up after its death")
            ]));
        }
        let pid = runner.pid;
        if kill {
            if pid == 0 {
                // Its runner's pid is not known yet: killed once it is.
                self.runners
                    .get_mut(&id)
                    .expect("looked up above")
                    .kill_deferred = true;
            } else if let Err(error) = sys::send_signal_to_group(pid, Signal::SIGKILL) {
                return Err(WireError::generic(format!("cannot kill job {id}: {error}")));
            }
            return Ok(json!([true, format!("Job {id} will be killed")]));
        }
        let known_waiting = job.status() == Status::Waiting || job.status() == Status::Queued;
        self.signal_runner(id, Signal::SIGTERM);
        // The copy in memory lags the runner's writes (inotify): the
        // answer comes from the file as it is now that the signal is sent.
        // The runner checks for a SIGTERM once more after writing
        // `running`, so a file read here without a running opcode means
        // the signal stops it (a deferred signal, sent once the pid is
        // known, keeps the answer of the copy in memory).
        let waiting = if pid == 0 {
            known_waiting
        } else {
            matches!(
                self.queue.read_job(id),
                Ok(Some(on_disk)) if matches!(on_disk.status(), Status::Waiting | Status::Queued)
            )
        };
        if waiting {
            Ok(json!([true, format!("Job {id} will be canceled")]))
        } else {
            Ok(json!([
                false,
                "Job no longer waiting, can't cancel (informed it anyway)"
            ]))
        }
    }

    /// Replaces the file of a job luxid owns, then its copy in memory.
    fn store_job(&mut self, job: Job) -> Result<(), WireError> {
        self.queue
            .write_job(&job)
            .map_err(|error| WireError::generic(format!("cannot write job {}: {error}", job.id)))?;
        let id = job.id;
        self.put(job);
        self.changed.push(id);
        Ok(())
    }

    fn archive_job(&mut self, id: JobId) -> bool {
        // A runner never writes a final job file again: the job can move
        // while its runner frees its locks and exits.
        if !self.finished.contains_key(&id) {
            return false;
        }
        match self.queue.archive(id) {
            Ok(()) => {
                self.finished.remove(&id);
                self.changed.push(id);
                true
            }
            Err(error) => {
                tracing::error!(job = id, %error, "cannot archive");
                false
            }
        }
    }

    fn auto_archive(&mut self, args: &Args) -> Result<Value, WireError> {
        let age = args
            .get(0)
            .as_f64()
            .ok_or_else(|| args.bad(0, "is not an age in seconds"))?;
        let timeout = args
            .get(1)
            .as_f64()
            .ok_or_else(|| args.bad(1, "is not a timeout in seconds"))?;
        let started = Instant::now();
        let now = Timestamp::now().as_secs_f64();
        let candidates: Vec<JobId> = self
            .finished
            .values()
            .filter(|job| {
                age < 0.0
                    || job
                        .end_timestamp
                        .is_some_and(|end| now - end.as_secs_f64() >= age)
            })
            .map(|job| job.id)
            .collect();
        let mut archived = 0;
        let mut checked = 0;
        for id in &candidates {
            if timeout >= 0.0 && started.elapsed().as_secs_f64() > timeout {
                break;
            }
            checked += 1;
            if self.archive_job(*id) {
                archived += 1;
            }
        }
        Ok(json!([archived, candidates.len() - checked]))
    }

    fn change_priority(&mut self, args: &Args) -> Result<Value, WireError> {
        let id = job_id(args, 0)?;
        let priority = args.i64(1)?;
        if !SUBMIT_PRIORITIES.contains(&priority) {
            return Err(WireError {
                class: "OpPrereqError",
                args: vec![
                    json!(format!(
                        "priority {priority} is not one of {SUBMIT_PRIORITIES:?}"
                    )),
                    json!("wrong_input"),
                ],
            });
        }
        if self.finished.contains_key(&id) {
            return Ok(json!([false, format!("Job {id} is finished")]));
        }
        let Some(job) = self.jobs.get(&id) else {
            return Ok(json!([false, format!("Job {id} not found")]));
        };
        if let Some(runner) = self.runners.get(&id) {
            // The runner owns the job file: it applies the request to its
            // unfinished opcodes (and files a waiting lock request again).
            if runner.dead.is_some() {
                return Ok(json!([
                    false,
                    format!("Job {id} is being cleaned up after its death")
                ]));
            }
            let path = queue::priority_request_path(self.queue.dir(), id);
            if let Err(error) =
                crate::store::atomic_write(&path, format!("{priority}\n").as_bytes())
            {
                return Err(WireError::generic(format!(
                    "cannot pass the new priority to job {id}'s runner: {error}"
                )));
            }
            self.signal_runner(id, Signal::SIGUSR1);
            return Ok(json!([
                true,
                format!(
                    "Priorities of pending opcodes for job {id} have been changed to {priority}"
                )
            ]));
        }
        let mut job = job.clone();
        self.queued.remove(&(job.priority(), id));
        for op in job.ops.iter_mut().filter(|op| !op.status.is_final()) {
            op.priority = priority;
        }
        self.queued.insert((job.priority(), id));
        self.store_job(job)?;
        Ok(json!([
            true,
            format!("Priorities of pending opcodes for job {id} have been changed to {priority}")
        ]))
    }

    /// Starts queued jobs whose dependencies are final, in (priority, id)
    /// order, up to `max_running_jobs`.
    fn schedule(&mut self) {
        for entry in self.startable() {
            self.queued.remove(&entry);
            self.start_runner(entry.1, Start::Now);
        }
    }

    /// The queued jobs [`Server::schedule`] would start now, in order.
    fn startable(&self) -> Vec<(i64, JobId)> {
        let max = self.settings.luxid.max_running_jobs;
        let mut starting = Vec::new();
        if self.runners.len() >= max {
            return starting;
        }
        for &(priority, id) in &self.queued {
            if self.runners.len() + starting.len() >= max {
                break;
            }
            if self.dependencies_final(id) {
                starting.push((priority, id));
            }
        }
        starting
    }

    /// Whether every job the job depends on is final (archived and unknown
    /// ones count as final: the runner judges them).
    fn dependencies_final(&self, id: JobId) -> bool {
        let Some(job) = self.jobs.get(&id) else {
            return false;
        };
        job.ops
            .iter()
            .filter_map(|op| op.input.get("depends")?.as_array())
            .flatten()
            .filter_map(|dependency| dependency.get(0)?.as_u64())
            .all(|dep| dep == id || !self.jobs.contains_key(&dep))
    }

    /// Starts the runner of job `id`; one that must wait for its job's
    /// commit answers the stdin to write luxid's word to.
    fn start_runner(&mut self, id: JobId, start: Start) -> Option<ChildStdin> {
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
        // The runner inherits these blocked: sent before it handles them,
        // they wait instead of killing it.
        let mask = sys::block_signals(&RUNNER_SIGNALS);
        let spawned = command.spawn();
        if let Ok(old) = &mask {
            let _ = sys::restore_signal_mask(old);
        }
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) if start == Start::AfterCommit => {
                // The job file is not in place yet: tried again (and the
                // job ended if it fails again) once the commit is done.
                tracing::warn!(job = id, %error, "cannot start the job runner; trying again");
                self.queued.insert((self.jobs[&id].priority(), id));
                return None;
            }
            Err(error) => {
                tracing::error!(job = id, %error, "cannot start the job runner");
                let mut job = self.jobs[&id].clone();
                job.finish_unfinished(
                    Status::Error,
                    &json!([
                        "OpExecError",
                        [format!("cannot start the job runner: {error}")]
                    ]),
                );
                let _ = self.store_job(job);
                return None;
            }
        };
        let word = child.stdin.take();
        let pid = child.id();
        let token = self.new_token();
        let pidfd = match sys::pidfd_open(pid) {
            Ok(fd) => {
                let _ = self.registry.register(
                    &mut SourceFd(&fd.as_raw_fd()),
                    token,
                    Interest::READABLE,
                );
                Some(fd)
            }
            Err(error) => {
                tracing::error!(job = id, %error, "cannot watch the job runner");
                None
            }
        };
        tracing::debug!(job = id, pid, "started a job runner");
        let livelock = self.job_livelock(id);
        self.runner_tokens.insert(token, id);
        self.runners.insert(
            id,
            Runner {
                child: Some(child),
                pid,
                pidfd,
                token,
                dead: None,
                deferred: Vec::new(),
                kill_deferred: false,
                claimant: None,
                livelock,
            },
        );
        word
    }

    /// A runner's pidfd became readable: the process ended.
    fn runner_exited(&mut self, token: Token) {
        let Some(&id) = self.runner_tokens.get(&token) else {
            return;
        };
        let Some(runner) = self.runners.get_mut(&id) else {
            return;
        };
        if let Some(fd) = runner.pidfd.take() {
            let _ = self.registry.deregister(&mut SourceFd(&fd.as_raw_fd()));
        }
        let mut cause = None;
        if let Some(child) = runner.child.as_mut() {
            // Reaps it.
            cause = child
                .wait()
                .ok()
                .and_then(|status| status.code())
                .and_then(crate::runner::exit_cause);
        }
        self.reload(id);
        let finished = !self.jobs.contains_key(&id);
        if finished {
            self.runner_done(id);
            return;
        }
        let pid = self.runners[&id].pid;
        let recorded = self.jobs.get(&id).and_then(|job| job.process_id);
        if recorded != Some(pid) && self.runner_alive(id) {
            // Our runner found the job held by one a dead luxid started:
            // follow that one.
            tracing::info!(job = id, "another runner has the job; following it");
            let runner = self.runners.get_mut(&id).expect("looked up above");
            runner.child = None;
            runner.pid = 0;
            runner.claimant = Some(Instant::now());
            return;
        }
        // The runner died: kill what is left of the job, then wait for its
        // livelock to be released before marking it and freeing its locks.
        tracing::warn!(job = id, pid, "the job runner died");
        let _ = sys::send_signal_to_group(pid, Signal::SIGKILL);
        let livelock = self
            .jobs
            .get(&id)
            .and_then(|job| job.livelock.clone())
            .map(PathBuf::from)
            .or_else(|| self.job_livelock(id));
        let mut dead = self.watch_release(id, livelock);
        dead.cause = cause;
        if let Some(runner) = self.runners.get_mut(&id) {
            runner.dead = Some(dead);
        }
        self.probe_dead_runners();
    }

    fn watch_release(&mut self, id: JobId, livelock: Option<PathBuf>) -> DeadRunner {
        let watch = livelock.as_ref().and_then(|path| {
            self.inotify
                .add_watch(path, AddWatchFlags::IN_CLOSE_WRITE)
                .ok()
        });
        if let Some(watch) = watch {
            self.livelock_watches.insert(watch, id);
        }
        DeadRunner {
            livelock,
            watch,
            next_probe: Instant::now(),
            cause: None,
            failed_writes: 0,
        }
    }

    /// Probes the livelocks of dead runners' jobs that are due; a released
    /// one ends the job.
    fn probe_dead_runners(&mut self) {
        let now = Instant::now();
        let claimants: Vec<JobId> = self
            .runners
            .iter()
            .filter(|(_, runner)| runner.claimant.is_some_and(|at| at <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in claimants {
            self.resolve_claimant(id);
        }
        let due: Vec<JobId> = self
            .runners
            .iter()
            .filter(|(_, runner)| {
                runner
                    .dead
                    .as_ref()
                    .is_some_and(|dead| dead.next_probe <= now)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let runner = self.runners.get_mut(&id).expect("just listed");
            let dead = runner.dead.as_mut().expect("just listed");
            let released = dead.livelock.as_deref().is_none_or(liveness::is_dead);
            if !released {
                dead.next_probe = now + RELEASE_PROBE_INTERVAL;
                continue;
            }
            if let Some(watch) = dead.watch.take() {
                let _ = self.inotify.rm_watch(watch);
                self.livelock_watches.remove(&watch);
            }
            let cause = dead.cause;
            if let Err(error) = self.mark_dead(id, cause) {
                // The job must still end: left as it is, it would show
                // running (or queued) with no runner until luxid
                // restarts. Tried again until the disk takes it.
                let dead = self
                    .runners
                    .get_mut(&id)
                    .and_then(|runner| runner.dead.as_mut())
                    .expect("only runner_done forgets a dead runner");
                if dead.failed_writes == 0 {
                    tracing::error!(job = id, %error, "cannot record the death of a job; trying again until it can be written");
                }
                dead.failed_writes += 1;
                dead.next_probe = now + DEAD_JOB_WRITE_RETRY_INTERVAL;
                continue;
            }
            self.runner_done(id);
        }
    }

    /// The job's runner died and every process of it is gone: its
    /// unfinished opcodes become `error`, its livelock file is removed.
    fn mark_dead(&mut self, id: JobId, cause: Option<&str>) -> Result<(), DaemonError> {
        // The runner may have finished the file just before it died.
        self.reload(id);
        let Some(job) = self.job(id) else {
            return Ok(());
        };
        if let Some(livelock) = &job.livelock {
            let dir = self.root.join(crate::wconfd::LIVELOCK_DIR);
            let _ = liveness::remove_dead_livelock(&dir, Path::new(livelock));
        }
        if job.is_final() {
            return Ok(());
        }
        let mut job = job.into_owned();
        let message = match cause {
            Some(cause) => format!("detected death of job {id}: its runner {cause}"),
            None => format!("detected death of job {id}"),
        };
        job.finish_unfinished(Status::Error, &json!(["OpExecError", [message]]));
        self.queue.write_job(&job).map_err(io_error(
            "cannot write",
            &queue::job_path(self.queue.dir(), id),
        ))?;
        self.free_locks(&job);
        self.put(job);
        self.changed.push(id);
        Ok(())
    }

    /// Asks wconfd to free the locks and pending request of a dead job's
    /// owner. wconfd finds dead owners by itself too (their process exits,
    /// its periodic probe), but a job's livelock may outlive its runner
    /// (its programs hold it until killed), so this makes it immediate. A
    /// failure is logged: wconfd's periodic probe still frees them.
    fn free_locks(&mut self, job: &Job) {
        let (Some(livelock), Some(pid)) = (&job.livelock, job.process_id) else {
            return;
        };
        self.wconfd
            .free_locks(Owner::job(job.id, livelock.clone(), pid), Instant::now());
    }

    fn runner_done(&mut self, id: JobId) {
        if let Some(runner) = self.runners.remove(&id) {
            self.runner_tokens.remove(&runner.token);
            // A runner removes its livelock as it exits; one killed after
            // it finished the job file leaves it behind, and nobody else
            // would remove it before it ages (wconfd only knows owners
            // with locks). Removed only if released (dead by the probe).
            if let Some(livelock) = &runner.livelock {
                let dir = self.root.join(crate::wconfd::LIVELOCK_DIR);
                let _ = liveness::remove_dead_livelock(&dir, livelock);
            }
        }
        let _ = fs::remove_file(queue::priority_request_path(self.queue.dir(), id));
        self.changed.push(id);
    }

    /// Re-reads a job file after its runner changed it.
    fn reload(&mut self, id: JobId) {
        match self.queue.read_job(id) {
            Ok(Some(job)) => {
                // A finished job's file never changes again.
                let changed = match self.jobs.get(&id) {
                    Some(known) => *known != job,
                    None => !self.finished.contains_key(&id),
                };
                if changed {
                    self.put(job);
                    self.changed.push(id);
                    self.send_deferred(id);
                    if self
                        .runners
                        .get(&id)
                        .is_some_and(|runner| runner.claimant.is_some())
                    {
                        self.resolve_claimant(id);
                    }
                }
            }
            Ok(None) => {}
            Err(error) => tracing::error!(job = id, %error, "cannot read a job file"),
        }
    }

    /// Sends `signal` to a job's runner now, or once its pid is known.
    fn signal_runner(&mut self, id: JobId, signal: Signal) {
        let Some(runner) = self.runners.get_mut(&id) else {
            return;
        };
        if runner.pid != 0 {
            if let Err(error) = sys::send_signal(runner.pid, signal) {
                tracing::debug!(job = id, %error, "cannot signal the runner");
            }
        } else {
            runner.deferred.push(signal);
        }
    }

    fn send_deferred(&mut self, id: JobId) {
        let Some(runner) = self.runners.get_mut(&id) else {
            return;
        };
        if runner.pid != 0 {
            for signal in std::mem::take(&mut runner.deferred) {
                if let Err(error) = sys::send_signal(runner.pid, signal) {
                    tracing::debug!(job = id, %error, "cannot signal the runner");
                }
            }
            if std::mem::take(&mut runner.kill_deferred) {
                let _ = sys::send_signal_to_group(runner.pid, Signal::SIGKILL);
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
                    if let Some(dead) = self
                        .runners
                        .get_mut(&id)
                        .and_then(|runner| runner.dead.as_mut())
                    {
                        dead.next_probe = Instant::now();
                    }
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
                if self.runners.contains_key(&id) {
                    self.reload(id);
                }
            }
        }
    }
}

/// A `WaitForJobChange` answered now, or held until a deadline.
enum Held {
    Now(Value),
    Until(Instant),
}

/// A job from a submission: every opcode checked, ids made absolute and
/// the submit reason appended. Nothing is written here.
fn build_job(ops: &Value, id: JobId) -> Result<Job, WireError> {
    let Some(ops) = ops.as_array() else {
        return Err(prereq("a job is a list of opcodes"));
    };
    if ops.is_empty() {
        return Err(prereq("a job needs at least one opcode"));
    }
    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    let mut queued = Vec::with_capacity(ops.len());
    for (index, op) in ops.iter().enumerate() {
        let parsed =
            opcode::parse(op).map_err(|error| prereq(format!("opcode {index}: {error}")))?;
        let input = opcode::with_absolute_dependencies(op, id)
            .map_err(|error| prereq(format!("opcode {index}: {error}")))?;
        let input = opcode::with_submit_reason(&input, id, index, now_ns);
        queued.push(QueuedOpcode::new(input, parsed.common.priority));
    }
    Ok(Job {
        id,
        ops: queued,
        received_timestamp: Some(Timestamp::now()),
        start_timestamp: None,
        end_timestamp: None,
        livelock: None,
        process_id: None,
    })
}

/// The length of `value` as JSON, counted without keeping the text.
fn encoded_bytes(value: &Value) -> usize {
    struct Counter(usize);
    impl io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value).expect("counting JSON cannot fail");
    counter.0
}

fn prereq(message: impl Into<String>) -> WireError {
    WireError {
        class: "OpPrereqError",
        args: vec![json!(message.into()), json!("wrong_input")],
    }
}

fn job_lost(id: JobId) -> WireError {
    WireError {
        class: "JobLost",
        args: vec![json!(format!("Job {id} not found"))],
    }
}

/// A job id on the wire: a number, or a string of digits (older Ganeti
/// clients send those).
fn parse_job_id(value: &Value) -> Option<JobId> {
    match value {
        Value::Number(number) => number.as_u64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    }
    .filter(|&id| id > 0)
}

fn job_id(args: &Args, index: usize) -> Result<JobId, WireError> {
    parse_job_id(args.get(index)).ok_or_else(|| args.bad(index, "is not a job id"))
}

fn field_names(args: &Args, index: usize) -> Result<Vec<&'static str>, WireError> {
    let fields = args.list(index)?;
    if fields.len() > crate::limits::QUERY_FIELDS_MAX {
        return Err(WireError {
            class: "OpPrereqError",
            args: vec![
                json!(format!(
                    "{} fields are over the limit of {} per query",
                    fields.len(),
                    crate::limits::QUERY_FIELDS_MAX
                )),
                json!("wrong_input"),
            ],
        });
    }
    fields
        .iter()
        .map(|field| match field.as_str() {
            Some(name) => match FIELDS.iter().find(|known| **known == name) {
                Some(known) => Ok(*known),
                None => Err(unknown_field(name)),
            },
            None => Err(args.bad(index, "holds a field name that is not a string")),
        })
        .collect()
}

/// A keyed 64-bit digest of `values` as JSON: two different views of a
/// job share one with a chance of 2^-64, which would delay a watcher's
/// answer to its timeout, never lose a change.
fn digest(hasher: &RandomState, values: &Value) -> u64 {
    struct Feed<H: Hasher>(H);
    impl<H: Hasher> io::Write for Feed<H> {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut feed = Feed(hasher.build_hasher());
    serde_json::to_writer(&mut feed, values).expect("a Value always serializes");
    feed.0.finish()
}

fn unknown_field(name: &str) -> WireError {
    WireError {
        class: "OpPrereqError",
        args: vec![
            json!(format!("Unknown job field '{name}'")),
            json!("wrong_input"),
        ],
    }
}

/// The `WaitForJobChange` reply for a job, or `None` if nothing changed
/// (the values are what the client has, by `same_values`, and no log entry
/// is newer than `log_serial`) and `only_if_changed` (a final job always
/// answers).
fn change_reply(
    job: &Job,
    fields: &[&str],
    log_serial: u64,
    only_if_changed: bool,
    same_values: impl FnOnce(&Value) -> bool,
) -> Option<Value> {
    let values = Value::Array(
        fields
            .iter()
            .map(|field| job.field(field, false).unwrap_or(Value::Null))
            .collect(),
    );
    let log: Vec<Value> = job
        .log_after(log_serial)
        .into_iter()
        .map(|entry| json!(entry))
        .collect();
    let changed = !same_values(&values) || !log.is_empty() || job.is_final();
    (changed || !only_if_changed).then(|| json!([values, log]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_long_answer_is_counted_without_being_written() {
        let value = json!([1, "two", {"three": [null, 3.5]}]);
        assert_eq!(
            encoded_bytes(&value),
            serde_json::to_vec(&value).expect("JSON").len()
        );
    }

    proptest! {
        /// Whatever a submission holds, it becomes a job or an
        /// `OpPrereqError`, never a panic; a job keeps one opcode per
        /// submitted one.
        #[test]
        fn any_submission_is_a_job_or_refused(
            ops in crate::protocol::arbitrary::json(),
            id in 1u64..u64::MAX,
        ) {
            match build_job(&ops, id) {
                Ok(job) => {
                    prop_assert_eq!(job.id, id);
                    prop_assert_eq!(job.ops.len(), ops.as_array().map_or(0, Vec::len));
                    prop_assert!(!job.is_final());
                }
                Err(error) => prop_assert_eq!(error.class, "OpPrereqError"),
            }
        }

        /// Job ids, field lists and `WaitForJobChange` replies from any
        /// arguments: a value or an error naming the argument.
        #[test]
        fn any_job_id_or_field_list_is_checked(
            args in proptest::collection::vec(crate::protocol::arbitrary::json(), 2),
        ) {
            let args = Args::exactly("QueryJobs", &args, 2).expect("two arguments");
            if let Ok(id) = job_id(&args, 0) {
                prop_assert!(id > 0);
            }
            if let Ok(fields) = field_names(&args, 1) {
                let job = build_job(&json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"]}]), 1)
                    .expect("a valid job");
                let reply = change_reply(&job, &fields, 0, false, |values| values == args.get(0))
                    .expect("unconditional");
                prop_assert_eq!(reply[0].as_array().map(Vec::len), Some(fields.len()));
            }
        }
    }
}
