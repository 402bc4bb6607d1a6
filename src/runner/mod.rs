//! The job runner (JOBS.md "Runner lifecycle", LIVENESS.md): one process
//! per job, started by luxid with the job's id. It proves it is alive with
//! its livelock, takes each opcode's locks from wconfd, runs the opcodes in
//! order, and records every step in the job's file, which it alone writes
//! while it lives.
//!
//! Life of a runner:
//! 0. A runner luxid started while it was still making the job's
//!    submission durable ([`Start::AfterCommit`]) first waits for luxid's
//!    word, one byte on its stdin; without it (the commit failed, or luxid
//!    died first) it leaves the job alone and exits.
//! 1. SIGTERM is caught (a cancel request), then the livelock
//!    `<root>/livelocks/job_<id:06>_<secs>` is created and locked, before
//!    anything else (LIVENESS.md "Livelock files"); its descriptor is
//!    handed on to the programs the runner starts.
//! 2. The job file is read. A final job is left alone. Otherwise its
//!    `livelock`, `process_id`, `start_timestamp` and its `workers` (from
//!    `WARDEN_WORKERS`) are recorded (with the
//!    first opcode's `waiting`, in one write).
//! 3. Each opcode in order: `waiting` (its dependencies and preconditions
//!    are checked, then `cluster/BGL` shared plus its own locks are awaited
//!    from wconfd at the opcode's priority; an unreachable wconfd is waited
//!    for; past the opcode's `lock_timeout` the request is withdrawn and
//!    the opcode fails naming its blockers), `running`, then `success` or
//!    `error`; its locks are freed. A failure makes every later opcode
//!    `error` ("Preceding opcode failed").
//! 4. The job ends: `end_timestamp`, the final file, locks freed, the
//!    livelock removed, exit 0.
//!
//! Invariants:
//! - Every status change is durable (written, fsynced, renamed) before the
//!   runner goes on; log entries alone are batched, written at most every
//!   [`LOG_FLUSH_INTERVAL`].
//! - A runner that returns `Ok` has left its job file final. Errors that
//!   stop it early (no job file, a job file that cannot be written) return
//!   `Err`; luxid then treats the job as a dead runner's.
//! - Cancel (SIGTERM): while an opcode waits for its locks, its pending
//!   request is dropped and it and every later opcode become `canceling`,
//!   then `canceled`. A running opcode is never interrupted: the cancel
//!   takes effect when the next opcode would start (Ganeti's rule, and the
//!   one luxid's `CancelJob` answer promises), or, for an `OP_EXEC` with a
//!   `retry`, when its next attempt would start (the opcode then ends
//!   `canceled`: a canceled job is never retried). The last moment a cancel
//!   still stops an opcode is just after its `running` is on disk, before
//!   its work starts: luxid promises a cancel only if the job file it reads
//!   after sending SIGTERM shows no opcode running.
//!
//! One thread, one mio [`Poll`]: the SIGTERM pipe, the wconfd socket, a
//! program's pipes and exit (pidfd), a delay's socket. No async runtime.

mod delay;
pub mod dependency;
mod descendants;
mod exec;
pub mod log;

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use signal_hook::consts::{SIGHUP, SIGTERM, SIGUSR1};
use signal_hook_mio::v1_0::Signals;

use crate::client::{Client, ClientError, Daemon};
use crate::jobs::opcode::{self, OpKind, Opcode};
use crate::jobs::runner_contract::{EXIT_JOB_FILE_UNWRITABLE, EXIT_NO_LIVELOCK, Start};
use crate::jobs::{Job, JobId, LOG_MESSAGE, Status, Timestamp};
use crate::limits::{
    AWAIT_ANSWER_GRACE, AWAIT_TIMEOUT_MS, LOCK_TIMEOUT_BLOCKERS_MAX, LOG_FLUSH_INTERVAL,
    WAITING_SHOWN_AFTER, WCONFD_RECONNECT_PAUSE_MAX, WCONFD_RECONNECT_PAUSE_MIN,
};
use crate::liveness::{Livelock, job_livelock_name};
use crate::locks::allocation::conflicting_holdings;
use crate::locks::{Entry, LockName, Mode, Owner};
use crate::paths::{LIVELOCK_DIR, QUEUE_DIR, SOCKET_DIR};
use crate::queue;
use crate::settings::Settings;
use crate::store::StoreError;

use crate::jobs::runner_contract::livelock_secs;

use self::dependency::Verdict;
use self::log::JobLog;

/// The result of canceled opcodes, as Ganeti writes it.
const CANCELED_RESULT: &str = "Job canceled by request";

/// The result of opcodes after a failed one.
fn preceding_failed() -> Value {
    json!(["OpExecError", ["Preceding opcode failed"]])
}

/// An opcode's error result: `[class, [message, ...]]`.
fn op_error(class: &str, args: Value) -> Value {
    json!([class, args])
}

fn exec_error(message: impl Into<String>) -> Value {
    op_error("OpExecError", json!([message.into()]))
}

fn prereq_error(message: impl Into<String>) -> Value {
    op_error("OpPrereqError", json!([message.into(), "wrong_input"]))
}

/// What stops a runner before it could finish its job file.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("job id 0 does not exist (ids start at 1)")]
    NoSuchId,
    #[error("cannot resolve the root {path}: {source}")]
    Root { path: PathBuf, source: io::Error },
    #[error("the root {0} is not valid UTF-8, so no owner can name its livelock")]
    RootNotUtf8(PathBuf),
    #[error("cannot watch for signals: {0}")]
    Signals(io::Error),
    #[error("cannot create the livelock {name} in {dir}: {source}")]
    Livelock {
        dir: PathBuf,
        name: String,
        source: io::Error,
    },
    #[error("cannot hand the livelock on to the job's programs: {0}")]
    HandOn(io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("job {0} has no job file in the queue")]
    NoJobFile(JobId),
    #[error("cannot write the job file {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("the event loop failed: {0}")]
    Poll(io::Error),
}

impl RunnerError {
    /// The runner's exit status for this error: the causes luxid can name
    /// in the job have their own, the rest are 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunnerError::Write { .. } => EXIT_JOB_FILE_UNWRITABLE,
            RunnerError::Livelock { .. } => EXIT_NO_LIVELOCK,
            _ => 1,
        }
    }
}

/// Runs job `id` of `root` to its end (see the module documentation).
pub fn run(root: &Path, id: JobId, start: Start) -> Result<(), RunnerError> {
    if id == 0 {
        return Err(RunnerError::NoSuchId);
    }
    // Before anything else, even the livelock: nothing of a job is
    // touched before it is durable.
    if start == Start::AfterCommit && !committed() {
        tracing::info!(job = id, "luxid did not confirm the job; leaving it alone");
        return Ok(());
    }
    // Caught first: a cancel request must never kill the runner.
    // SIGUSR1: luxid left a new priority for the job (see
    // `Context::apply_priority_request`). SIGHUP: wconfd's grant notice,
    // which can arrive for a request whose awaitLocks connection was
    // closed (a cancel or a priority change); the runner learns of grants
    // through awaitLocks, so it only must not die of it.
    let signals = Signals::new([SIGTERM, SIGUSR1, SIGHUP]).map_err(RunnerError::Signals)?;
    // luxid spawns runners with these blocked, so that none sent before
    // now killed this one: handled from here on.
    crate::sys::unblock_signals(&[Signal::SIGTERM, Signal::SIGUSR1, Signal::SIGHUP])
        .map_err(RunnerError::Signals)?;
    // What a program leaves is re-parented here, so that its timeout can
    // find it (D64); without it, a timeout reaches the program only.
    if let Err(error) = crate::sys::become_subreaper() {
        tracing::warn!(job = id, %error, "cannot become the subreaper of programs");
    }
    // wconfd compares livelock paths with its canonical root.
    let root = root.canonicalize().map_err(|source| RunnerError::Root {
        path: root.to_owned(),
        source,
    })?;
    let livelock_dir = root.join(LIVELOCK_DIR);
    let queue_dir = root.join(QUEUE_DIR);
    // The livelock is named for the job's submission, not for this
    // process's start: two runners of one job (a luxid killed right after
    // starting one, and its successor starting another) want the same
    // name, and its flock lets only one of them run the job.
    let job = queue::read_job_file(&queue::job_path(&queue_dir, id))?
        .ok_or(RunnerError::NoJobFile(id))?;
    if job.is_final() {
        tracing::info!(job = id, "the job is already final; nothing to run");
        return Ok(());
    }
    let name = job_livelock_name(id, livelock_secs(&job));
    let livelock = match Livelock::create(&livelock_dir, &name) {
        Ok(livelock) => livelock,
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
            tracing::info!(job = id, "another runner has this job; leaving it alone");
            return Ok(());
        }
        Err(source) => {
            return Err(RunnerError::Livelock {
                dir: livelock_dir.clone(),
                name,
                source,
            });
        }
    };
    let result = run_holding(&root, id, &livelock, signals);
    if let Err(error) = livelock.release() {
        tracing::warn!(job = id, %error, "cannot remove the livelock");
    }
    result
}

/// Waits for luxid's word that the job is durable: a byte on stdin. The
/// end of stdin (or an error reading it) means no.
fn committed() -> bool {
    use std::io::Read;
    let mut byte = [0u8; 1];
    loop {
        match io::stdin().lock().read(&mut byte) {
            Ok(read) => return read == 1,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// The runner's life while it holds its livelock (the job file is read
/// again: another runner may have finished it meanwhile).
fn run_holding(
    root: &Path,
    id: JobId,
    livelock: &Livelock,
    signals: Signals,
) -> Result<(), RunnerError> {
    let livelock_path = livelock
        .path()
        .to_str()
        .ok_or_else(|| RunnerError::RootNotUtf8(root.to_owned()))?
        .to_owned();
    let queue_dir = root.join(QUEUE_DIR);
    let path = queue::job_path(&queue_dir, id);
    let job = queue::read_job_file(&path)?.ok_or(RunnerError::NoJobFile(id))?;
    if job.is_final() {
        tracing::info!(job = id, "the job is already final; nothing to run");
        return Ok(());
    }
    livelock
        .hand_on_to_children()
        .map_err(RunnerError::HandOn)?;
    let settings = Settings::load(root);
    let log_bytes_max = match &settings {
        Ok(settings) => settings.luxid.job_log_bytes_max,
        Err(_) => Settings::default().luxid.job_log_bytes_max,
    };
    let mut context = Context::new(queue_dir, path, job, log_bytes_max, signals)?;
    context.job.livelock = Some(livelock_path.clone());
    context.job.process_id = Some(std::process::id());
    context.job.workers = exec::worker_uuids();
    context
        .job
        .start_timestamp
        .get_or_insert_with(Timestamp::now);
    // Written with the first opcode's `waiting` (or the cancel, or the
    // settings error): one durable write less on every job's way to its
    // first lock request.
    let mut runner = Runner {
        root: root.to_owned(),
        id,
        owner: Owner::job(id, livelock_path.clone(), std::process::id()),
        frame_bytes_max: Settings::default().wconfd.frame_bytes_max,
        wconfd: None,
        used_wconfd: false,
        slow_wait: None,
        context,
    };
    match settings {
        Ok(settings) => {
            runner.frame_bytes_max = settings.wconfd.frame_bytes_max;
            runner.slow_wait = (settings.wconfd.slow_wait_s > 0)
                .then(|| Duration::from_secs(settings.wconfd.slow_wait_s));
            runner.run_opcodes()?;
        }
        Err(error) => {
            let result = exec_error(format!("cannot load the settings: {error}"));
            runner.context.job.finish_unfinished(Status::Error, &result);
            runner.context.write()?;
        }
    }
    runner.finish()
}

/// Token of the SIGTERM pipe; the others belong to the step that
/// registers them.
const SIGNAL: Token = Token(0);
const WCONFD: Token = Token(1);

/// One event of [`Context::wait`].
#[derive(Clone, Copy, Debug)]
struct Ready {
    token: Token,
    readable: bool,
    writable: bool,
}

/// What every step of the runner shares: the event loop, the cancel
/// request, and the job file with its log.
struct Context {
    poll: Poll,
    events: Events,
    signals: Signals,
    cancel_requested: bool,
    /// SIGUSR1 arrived: a priority request waits in the queue directory.
    priority_requested: bool,
    /// An opcode went `waiting` in memory and the file does not say so yet.
    unpublished_waiting: bool,
    queue_dir: PathBuf,
    path: PathBuf,
    job: Job,
    log: JobLog,
    /// Log entries appended since the last write.
    unwritten: bool,
    last_write: Instant,
    /// What the current opcode's programs learn of its lock grant
    /// (`WARDEN_FENCE`, `WARDEN_PREVIOUS_HOLDER_DIED`).
    fence_env: Vec<(String, String)>,
}

/// What wconfd said of an opcode's lock grant: its fencing token (the
/// highest of its locks') and the dead previous holders it was told of.
#[derive(Clone, Debug, Default, PartialEq)]
struct Fence {
    token: Option<u64>,
    died: Vec<Value>,
}

impl Fence {
    /// The environment of the opcode's programs: `WARDEN_FENCE=<token>`,
    /// and `WARDEN_PREVIOUS_HOLDER_DIED=<lock>=<owner>,...` when its grant
    /// followed a holder's death (the owner as its job id or client name;
    /// `%`, `,` and `=` in either written `%25`, `%2C`, `%3D`).
    fn env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(token) = self.token {
            env.push(("WARDEN_FENCE".to_owned(), token.to_string()));
        }
        let died: Vec<String> = self
            .died
            .iter()
            .filter_map(|death| {
                let lock = death.get("lock")?.as_str()?;
                let owner = match death.get("owner")?.get(0)? {
                    Value::String(name) => name.clone(),
                    other => other.to_string(),
                };
                Some(format!("{}={}", env_escape(lock), env_escape(&owner)))
            })
            .collect();
        if !died.is_empty() {
            env.push(("WARDEN_PREVIOUS_HOLDER_DIED".to_owned(), died.join(",")));
        }
        env
    }
}

fn env_escape(text: &str) -> String {
    text.replace('%', "%25")
        .replace(',', "%2C")
        .replace('=', "%3D")
}

impl Context {
    fn new(
        queue_dir: PathBuf,
        path: PathBuf,
        job: Job,
        log_bytes_max: usize,
        mut signals: Signals,
    ) -> Result<Context, RunnerError> {
        let poll = Poll::new().map_err(RunnerError::Poll)?;
        poll.registry()
            .register(&mut signals, SIGNAL, Interest::READABLE)
            .map_err(RunnerError::Poll)?;
        let log = JobLog::new(&job, log_bytes_max);
        Ok(Context {
            poll,
            events: Events::with_capacity(16),
            signals,
            cancel_requested: false,
            // A request left before the runner could catch SIGUSR1.
            priority_requested: true,
            unpublished_waiting: false,
            queue_dir,
            path,
            job,
            log,
            unwritten: false,
            last_write: Instant::now(),
            fence_env: Vec::new(),
        })
    }

    /// Writes the job file now, durably. A job written final has its end
    /// timestamp: a reader that sees it final sees it complete.
    fn write(&mut self) -> Result<(), RunnerError> {
        self.replace(queue::Durability::Synced)
    }

    /// Writes the job file now for luxid and its watchers to see, without
    /// waiting for the disk: for states a crash of the machine makes moot
    /// (the runner dies with it, and the job ends `error`). Opcode results
    /// and the final state are written with [`Context::write`].
    fn publish(&mut self) -> Result<(), RunnerError> {
        self.replace(queue::Durability::Visible)
    }

    fn replace(&mut self, how: queue::Durability) -> Result<(), RunnerError> {
        self.unpublished_waiting = false;
        if self.job.is_final() {
            self.job.end_timestamp.get_or_insert_with(Timestamp::now);
        }
        queue::replace_job_file(&self.queue_dir, &self.job, how).map_err(|source| {
            RunnerError::Write {
                path: self.path.clone(),
                source,
            }
        })?;
        self.unwritten = false;
        self.last_write = Instant::now();
        Ok(())
    }

    /// Appends an ordinary log entry to opcode `index` (written with the
    /// next batch).
    fn log(&mut self, index: usize, message: impl Into<String>) {
        let message = Value::String(message.into());
        if self.log.append(
            &mut self.job.ops[index],
            LOG_MESSAGE,
            message,
            Timestamp::now(),
        ) {
            self.unwritten = true;
        }
    }

    /// Appends an entry a client needs to go on, and writes it now.
    fn log_now(&mut self, index: usize, kind: &str, message: Value) -> Result<(), RunnerError> {
        self.log
            .append_always(&mut self.job.ops[index], kind, message, Timestamp::now());
        self.publish()
    }

    /// Writes the batched log entries if they waited long enough.
    fn flush_if_due(&mut self, now: Instant) -> Result<(), RunnerError> {
        if self.unwritten && now >= self.last_write + LOG_FLUSH_INTERVAL {
            self.publish()?;
        }
        Ok(())
    }

    /// Takes note of a SIGTERM or SIGUSR1 that arrived.
    fn check_signals(&mut self) {
        for signal in self.signals.pending() {
            match signal {
                SIGTERM => {
                    if !self.cancel_requested {
                        tracing::info!(job = self.job.id, "cancel requested (SIGTERM)");
                    }
                    self.cancel_requested = true;
                }
                SIGUSR1 => self.priority_requested = true,
                _ => {}
            }
        }
    }

    /// Applies a priority luxid left for this job (`ChangeJobPriority` of
    /// a started job) to every unfinished opcode, durably, and removes the
    /// request. A missing or unreadable request changes nothing.
    fn apply_priority_request(&mut self) -> Result<(), RunnerError> {
        if !self.priority_requested {
            return Ok(());
        }
        self.priority_requested = false;
        let path = queue::priority_request_path(&self.queue_dir, self.job.id);
        let Ok(text) = fs::read_to_string(&path) else {
            return Ok(());
        };
        let _ = fs::remove_file(&path);
        let Ok(priority) = text.trim().parse::<i64>() else {
            tracing::warn!(job = self.job.id, request = %text.trim(), "ignored a malformed priority request");
            return Ok(());
        };
        let mut changed = false;
        for op in self.job.ops.iter_mut().filter(|op| !op.status.is_final()) {
            changed |= op.priority != priority;
            op.priority = priority;
        }
        if changed {
            tracing::info!(job = self.job.id, priority, "priority changed");
            self.publish()?;
        }
        Ok(())
    }

    /// Waits for events of the registered sources until `deadline` (none:
    /// until an event), meanwhile noting SIGTERM and writing batched log
    /// entries when due. Answers the events (possibly none: the deadline
    /// passed or only a signal or a flush happened).
    fn wait(&mut self, deadline: Option<Instant>) -> Result<Vec<Ready>, RunnerError> {
        let now = Instant::now();
        let flush_at = self.unwritten.then(|| self.last_write + LOG_FLUSH_INTERVAL);
        let wake = match (deadline, flush_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = wake.map(|wake| wake.saturating_duration_since(now));
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(RunnerError::Poll(error)),
        }
        let mut ready = Vec::new();
        let mut signalled = false;
        for event in self.events.iter() {
            if event.token() == SIGNAL {
                signalled = true;
            } else {
                ready.push(Ready {
                    token: event.token(),
                    readable: event.is_readable() || event.is_read_closed() || event.is_error(),
                    writable: event.is_writable() || event.is_write_closed() || event.is_error(),
                });
            }
        }
        if signalled {
            self.check_signals();
        }
        self.apply_priority_request()?;
        self.flush_if_due(Instant::now())?;
        Ok(ready)
    }

    fn registry(&self) -> &mio::Registry {
        self.poll.registry()
    }
}

/// Why a lock request got no answer.
enum AwaitError {
    /// wconfd cannot be reached (not running, or the connection broke):
    /// worth asking again once it is back.
    Unreachable(String),
    /// Anything else (a refusal, a malformed answer, a hung wconfd, the
    /// job file): the opcode fails with this message.
    Failed(String),
}

impl AwaitError {
    fn from_client(error: ClientError) -> AwaitError {
        let message = format!("cannot get the locks from wconfd: {error}");
        match error {
            ClientError::Connect { .. } | ClientError::Io { .. } => {
                AwaitError::Unreachable(message)
            }
            ClientError::Protocol { .. } | ClientError::Failed { .. } => {
                AwaitError::Failed(message)
            }
        }
    }
}

/// How an opcode's lock request ended.
enum Acquired {
    Granted(Fence),
    /// SIGTERM while waiting: the request is still pending in wconfd.
    Canceled,
    /// The opcode's `lock_timeout` passed: the request (`request`) is
    /// still pending in wconfd, blocked by `blockers` (owners as wconfd
    /// names them).
    TimedOut {
        blockers: Vec<Value>,
        request: Vec<Entry>,
    },
}

/// How one connection's wait for a lock request ended.
enum Waited {
    Granted(Fence),
    Canceled,
    TimedOut(Vec<Value>),
}

/// The result of running an opcode: `Ok(result)` for `success`,
/// `Err(result)` for `error`.
type OpResult = Result<Value, Value>;

/// The runner of one job.
struct Runner {
    root: PathBuf,
    id: JobId,
    /// The runner as a lock owner: its job, livelock and pid.
    owner: Owner,
    frame_bytes_max: usize,
    wconfd: Option<Client>,
    /// Whether a lock request was ever sent (the final `freeLocks` is only
    /// needed then).
    used_wconfd: bool,
    /// `[wconfd] slow_wait_s` (`None`: 0, off): a lock wait this long
    /// writes its blocking chain into the log once.
    slow_wait: Option<Duration>,
    context: Context,
}

impl Runner {
    fn run_opcodes(&mut self) -> Result<(), RunnerError> {
        for index in 0..self.context.job.ops.len() {
            if self.context.job.ops[index].status.is_final() {
                continue;
            }
            self.context.check_signals();
            self.context.apply_priority_request()?;
            if self.context.cancel_requested {
                return self.cancel_from(index, CANCELED_RESULT, false);
            }
            if !self.run_opcode(index)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Runs opcode `index`; answers whether the job goes on.
    fn run_opcode(&mut self, index: usize) -> Result<bool, RunnerError> {
        {
            // An opcode run again after a runner's death (`on_death`)
            // keeps the times of its first start.
            let op = &mut self.context.job.ops[index];
            op.status = Status::Waiting;
            op.start_timestamp.get_or_insert_with(Timestamp::now);
        }
        // Shown only if the locks do not come at once (see `await_locks`):
        // an uncontended opcode goes from `queued` to `running` in one write.
        self.context.unpublished_waiting = true;
        let parsed = match opcode::parse(&self.context.job.ops[index].input) {
            Ok(parsed) => parsed,
            Err(error) => return self.fail(index, prereq_error(error.0), false),
        };
        for dependency in &parsed.common.depends {
            match self.judge(dependency) {
                Verdict::Met => {}
                Verdict::Error(message) => return self.fail(index, exec_error(message), false),
                Verdict::Cancel(message) => {
                    self.cancel_from(index, &message, false)?;
                    return Ok(false);
                }
            }
        }
        if let OpKind::TestDelay(delay) = &parsed.kind
            && let Err(result) = delay::check(delay)
        {
            return self.fail(index, result, false);
        }
        let lock_timeout = parsed.lock_timeout();
        match self.acquire(index, &parsed.locks(), lock_timeout) {
            Ok(Acquired::Granted(fence)) => self.note_fence(index, fence)?,
            Ok(Acquired::Canceled) => {
                self.cancel_from(index, CANCELED_RESULT, true)?;
                return Ok(false);
            }
            Ok(Acquired::TimedOut { blockers, request }) => {
                let blockers = self.describe_blockers(&blockers, &request);
                let seconds = lock_timeout.expect("only a lock timeout times out");
                let result = op_error(
                    "OpExecError",
                    json!([
                        format!("lock wait timed out after {seconds} s"),
                        {"blockers": blockers}
                    ]),
                );
                // `fail` frees the job's locks, which withdraws the
                // pending request from wconfd.
                return self.fail(index, result, true);
            }
            Err(message) => return self.fail(index, exec_error(message), true),
        }
        // A cancel that arrived with the grant still counts as one while
        // waiting: the opcode has not started.
        self.context.check_signals();
        if self.context.cancel_requested {
            self.cancel_from(index, CANCELED_RESULT, true)?;
            return Ok(false);
        }
        let ran_before = self.context.job.ops[index].exec_timestamp.is_some();
        {
            let op = &mut self.context.job.ops[index];
            op.status = Status::Running;
            op.exec_timestamp.get_or_insert_with(Timestamp::now);
        }
        self.context.publish()?;
        // luxid answers a cancel from the job file as it reads it after
        // its SIGTERM was sent: a SIGTERM that came before `running` was
        // on disk got "will be canceled", and the opcode has not started
        // its work yet, so it still counts (one that comes later was told
        // "no longer waiting"; its opcode runs).
        self.context.check_signals();
        if self.context.cancel_requested {
            if !ran_before {
                self.context.job.ops[index].exec_timestamp = None;
            }
            self.cancel_from(index, CANCELED_RESULT, true)?;
            return Ok(false);
        }
        let result = match self.execute(index, &parsed)? {
            exec::Executed::Done(result) => result,
            exec::Executed::Canceled => {
                let now = Timestamp::now();
                self.context
                    .log
                    .finish_opcode(&mut self.context.job.ops[index], now);
                self.cancel_from(index, CANCELED_RESULT, true)?;
                return Ok(false);
            }
        };
        let succeeded = result.is_ok();
        {
            let now = Timestamp::now();
            let op = &mut self.context.job.ops[index];
            self.context.log.finish_opcode(op, now);
            op.end_timestamp = Some(now);
            (op.status, op.result) = match result {
                Ok(value) => (Status::Success, value),
                Err(value) => (Status::Error, value),
            };
            if !succeeded {
                self.context
                    .job
                    .finish_unfinished(Status::Error, &preceding_failed());
            }
        }
        self.context.write()?;
        if succeeded && index + 1 < self.context.job.ops.len() {
            self.free_locks_before_next()?;
        } else {
            self.free_locks();
        }
        Ok(succeeded)
    }

    /// Keeps what the grant of opcode `index` said for its programs, and
    /// logs the dead previous holders it was told of (once per grant: a
    /// retried opcode keeps its grant).
    fn note_fence(&mut self, index: usize, fence: Fence) -> Result<(), RunnerError> {
        self.context.fence_env = fence.env();
        if fence.died.is_empty() {
            return Ok(());
        }
        let already = self.context.job.ops[index]
            .log
            .iter()
            .any(|entry| entry.2 == "why" && entry.3.get("previous_holder_died").is_some());
        if already {
            return Ok(());
        }
        self.context.log_now(
            index,
            "why",
            json!({"previous_holder_died": fence.died, "fence": fence.token}),
        )
    }

    fn execute(&mut self, index: usize, parsed: &Opcode) -> Result<exec::Executed, RunnerError> {
        match &parsed.kind {
            OpKind::TestDelay(delay) => {
                delay::run(&mut self.context, index, delay, &self.root.join(SOCKET_DIR))
                    .map(exec::Executed::Done)
            }
            OpKind::Exec(program) => exec::run(&mut self.context, index, program, &self.root),
        }
    }

    /// Opcode `index` fails before it ran with `result`; every later one
    /// fails with "Preceding opcode failed". `drop_request`: a lock request
    /// may be pending or granted. Answers that the job does not go on.
    fn fail(
        &mut self,
        index: usize,
        result: Value,
        drop_request: bool,
    ) -> Result<bool, RunnerError> {
        let now = Timestamp::now();
        let op = &mut self.context.job.ops[index];
        self.context.log.finish_opcode(op, now);
        op.status = Status::Error;
        op.result = result;
        op.end_timestamp = Some(now);
        self.context
            .job
            .finish_unfinished(Status::Error, &preceding_failed());
        self.context.write()?;
        if drop_request {
            self.free_locks();
        }
        Ok(false)
    }

    /// Cancels opcode `index` and every later one: `canceling` (durable),
    /// the pending lock request dropped if `drop_request`, then `canceled`
    /// with `result` (durable).
    fn cancel_from(
        &mut self,
        index: usize,
        result: &str,
        drop_request: bool,
    ) -> Result<(), RunnerError> {
        for op in &mut self.context.job.ops[index..] {
            if !op.status.is_final() {
                op.status = Status::Canceling;
            }
        }
        self.context.publish()?;
        if drop_request {
            // The connection may hold an unanswered `awaitLocks`: a fresh
            // one frees at once.
            self.wconfd = None;
            self.free_locks();
        }
        self.context
            .job
            .finish_unfinished(Status::Canceled, &json!(result));
        self.context.write()
    }

    /// The verdict on one dependency, reading the dependency's job file.
    fn judge(&self, dependency: &opcode::Dependency) -> Verdict {
        let Some(id) = dependency::absolute_id(self.id, dependency) else {
            return Verdict::Error(format!(
                "Dependency error: job {} not found",
                dependency.job
            ));
        };
        let queue_dir = &self.context.queue_dir;
        let read =
            queue::read_job_file(&queue::job_path(queue_dir, id)).and_then(|job| match job {
                Some(job) => Ok(Some(job)),
                None => queue::read_job_file(&queue::archived_job_path(queue_dir, id)),
            });
        let status = match read {
            Ok(job) => job.map(|job| job.status()),
            Err(error) => return Verdict::Error(format!("Dependency error: {error}")),
        };
        dependency::judge(self.id, id, status, &dependency.statuses)
    }

    /// The connection to wconfd, made when first needed.
    fn wconfd(&mut self) -> Result<&mut Client, ClientError> {
        if self.wconfd.is_none() {
            self.wconfd = Some(Client::connect(
                &self.root,
                Daemon::Wconfd,
                self.frame_bytes_max,
            )?);
        }
        Ok(self.wconfd.as_mut().expect("just connected"))
    }

    /// Waits until wconfd grants opcode `index` `cluster/BGL` shared plus
    /// `locks`, at the opcode's priority (a priority changed meanwhile
    /// files the request again at the new one), or a cancel request
    /// arrives. `Err`: why the locks cannot be had (for people).
    ///
    /// wconfd being down (not running, or killed mid-request) is waited
    /// out: the runner connects again with a growing pause and sends the
    /// identical request, which wconfd answers from its durable state (the
    /// current blockers if still pending, `[]` if granted meanwhile). The
    /// opcode stays `waiting` and can be canceled meanwhile.
    ///
    /// `lock_timeout` (seconds): once it has passed since the first
    /// request, the wait ends with [`Acquired::TimedOut`] and the request
    /// still pending (the caller withdraws it). A timeout that passes
    /// while wconfd is unreachable ends the wait too, with no blockers
    /// named (none could be asked for).
    fn acquire(
        &mut self,
        index: usize,
        locks: &[(LockName, Mode)],
        lock_timeout: Option<f64>,
    ) -> Result<Acquired, String> {
        let lock_deadline = lock_timeout
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
            .map(|timeout| Instant::now() + timeout);
        let mut request = vec![Entry::shared(LockName::Bgl)];
        request.extend(
            locks
                .iter()
                .map(|(lock, mode)| Entry::new(lock.clone(), crate::locks::Action::Acquire(*mode))),
        );
        self.used_wconfd = true;
        let mut pause = WCONFD_RECONNECT_PAUSE_MIN;
        loop {
            let result = self.await_locks(index, &request, lock_deadline);
            self.unwatch_wconfd();
            match result {
                Ok(Waited::Granted(fence)) => return Ok(Acquired::Granted(fence)),
                Ok(Waited::Canceled) => return Ok(Acquired::Canceled),
                Ok(Waited::TimedOut(blockers)) => {
                    return Ok(Acquired::TimedOut { blockers, request });
                }
                Err(AwaitError::Unreachable(_))
                    if lock_deadline.is_some_and(|at| Instant::now() >= at) =>
                {
                    self.wconfd = None;
                    return Ok(Acquired::TimedOut {
                        blockers: Vec::new(),
                        request,
                    });
                }
                Err(AwaitError::Unreachable(message)) => {
                    self.wconfd = None;
                    if pause == WCONFD_RECONNECT_PAUSE_MIN {
                        tracing::warn!(job = self.id, %message, "wconfd is unreachable; waiting for it");
                    }
                    let pause_now = match lock_deadline {
                        Some(at) => pause.min(at.saturating_duration_since(Instant::now())),
                        None => pause,
                    };
                    if self
                        .pause_for_wconfd(pause_now)
                        .map_err(|error| error.to_string())?
                    {
                        return Ok(Acquired::Canceled);
                    }
                    pause = (pause * 2).min(WCONFD_RECONNECT_PAUSE_MAX);
                }
                Err(AwaitError::Failed(message)) => {
                    // The connection cannot be trusted to be in step any more.
                    self.wconfd = None;
                    return Err(message);
                }
            }
        }
    }

    /// Waits `pause` before connecting to wconfd again, noting signals;
    /// answers whether a cancel was requested.
    fn pause_for_wconfd(&mut self, pause: Duration) -> Result<bool, RunnerError> {
        if self.context.unpublished_waiting {
            self.context.publish()?;
        }
        let until = Instant::now() + pause;
        while Instant::now() < until {
            self.context.wait(Some(until))?;
            if self.context.cancel_requested {
                return Ok(true);
            }
        }
        Ok(self.context.cancel_requested)
    }

    fn await_locks(
        &mut self,
        index: usize,
        request: &[Entry],
        lock_deadline: Option<Instant>,
    ) -> Result<Waited, AwaitError> {
        let unreachable = AwaitError::from_client;
        self.watch_wconfd().map_err(unreachable)?;
        let waiting_since = Instant::now();
        let mut slow_at = self.slow_wait.map(|slow| waiting_since + slow);
        loop {
            self.context.check_signals();
            if self.context.cancel_requested {
                return Ok(Waited::Canceled);
            }
            let priority = self.context.job.ops[index].priority;
            // Held no longer than the lock timeout leaves (rounded up, so
            // that the answer comes at or after it).
            let timeout_ms = match lock_deadline {
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    let left_ms =
                        u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
                    left_ms.min(AWAIT_TIMEOUT_MS)
                }
                None => AWAIT_TIMEOUT_MS,
            };
            let client = self.wconfd.as_mut().expect("connected above");
            client
                .send_await_locks(&self.owner, priority, request, timeout_ms, true)
                .map_err(unreachable)?;
            let deadline = Instant::now() + Duration::from_millis(timeout_ms) + AWAIT_ANSWER_GRACE;
            let show_waiting_at = Instant::now() + WAITING_SHOWN_AFTER;
            loop {
                let mut wake = if self.context.unpublished_waiting {
                    show_waiting_at.min(deadline)
                } else {
                    deadline
                };
                if let Some(at) = slow_at {
                    wake = wake.min(at);
                }
                let ready = self
                    .context
                    .wait(Some(wake))
                    .map_err(|error| AwaitError::Failed(error.to_string()))?;
                if self.context.unpublished_waiting && Instant::now() >= show_waiting_at {
                    self.context
                        .publish()
                        .map_err(|error| AwaitError::Failed(error.to_string()))?;
                }
                if slow_at.is_some_and(|at| Instant::now() >= at) {
                    slow_at = None;
                    self.record_slow_wait(index, waiting_since.elapsed())
                        .map_err(|error| AwaitError::Failed(error.to_string()))?;
                }
                if self.context.cancel_requested {
                    return Ok(Waited::Canceled);
                }
                if self.context.job.ops[index].priority != priority {
                    // wconfd keeps a pending request's priority when it is
                    // asked again: drop it (this connection's answer is
                    // abandoned with the connection) and file it anew.
                    self.unwatch_wconfd();
                    self.wconfd = None;
                    self.free_locks();
                    self.watch_wconfd().map_err(unreachable)?;
                    break;
                }
                if ready
                    .iter()
                    .any(|event| event.token == WCONFD && event.readable)
                {
                    let client = self.wconfd.as_mut().expect("connected above");
                    match client.receive_fenced() {
                        Ok(answer) if answer.blockers.is_empty() => {
                            return Ok(Waited::Granted(Fence {
                                token: answer.token,
                                died: answer.died,
                            }));
                        }
                        // Held until the lock timeout: the request stays
                        // pending, for the caller to withdraw.
                        Ok(answer) if lock_deadline.is_some_and(|at| Instant::now() >= at) => {
                            return Ok(Waited::TimedOut(answer.blockers));
                        }
                        // Timed out with blockers: the request stays
                        // pending; ask again.
                        Ok(_) => break,
                        Err(error) => return Err(unreachable(error)),
                    }
                }
                if Instant::now() >= deadline {
                    let waited = Duration::from_millis(timeout_ms) + AWAIT_ANSWER_GRACE;
                    return Err(AwaitError::Failed(format!(
                        "wconfd did not answer a lock request within {} s",
                        waited.as_secs()
                    )));
                }
            }
        }
    }

    /// The flight recorder: the wait of opcode `index` passed
    /// `slow_wait_s`, so its blocking chain, as wconfd's `explainWait`
    /// tells it, goes into the log once (on a connection of its own: the
    /// lock request's stays held).
    fn record_slow_wait(&mut self, index: usize, waited: Duration) -> Result<(), RunnerError> {
        let chain = Client::connect(&self.root, Daemon::Wconfd, self.frame_bytes_max).and_then(
            |mut client| {
                client.request(
                    &crate::protocol::wconfd::WconfdRequest::ExplainWait { job: self.id }.encode(),
                )
            },
        );
        let message = match chain {
            Ok(waits) => json!({"waited_seconds": waited.as_secs_f64(), "waits": waits}),
            Err(error) => json!({
                "waited_seconds": waited.as_secs_f64(),
                "error": format!("cannot ask wconfd who is in the way: {error}"),
            }),
        };
        self.context.log_now(index, "why", message)
    }

    /// The blockers of a lock wait that timed out, for its result: each
    /// owner as wconfd names it (`[ident, livelock, pid]`) with the locks
    /// it holds that stand in the way of `request`, asked of wconfd now
    /// (`listLocks`); at most [`LOCK_TIMEOUT_BLOCKERS_MAX`] of them. An
    /// owner wconfd cannot list (it went away meanwhile) is named with no
    /// locks.
    fn describe_blockers(&mut self, blockers: &[Value], request: &[Entry]) -> Vec<Value> {
        let mut described = Vec::with_capacity(blockers.len().min(LOCK_TIMEOUT_BLOCKERS_MAX));
        for blocker in blockers.iter().take(LOCK_TIMEOUT_BLOCKERS_MAX) {
            let held = crate::protocol::wconfd::decode_owner(blocker)
                .ok()
                .and_then(|owner| match self.wconfd() {
                    Ok(client) => client.list_locks(&owner).ok(),
                    Err(_) => None,
                })
                .unwrap_or_default();
            let locks: Vec<Value> = conflicting_holdings(&held, request)
                .iter()
                .map(|(lock, mode)| json!([lock.to_string(), mode.as_str()]))
                .collect();
            described.push(json!({"owner": blocker, "locks": locks}));
        }
        described
    }

    /// Connects to wconfd if needed and watches the connection in the
    /// runner's poll.
    fn watch_wconfd(&mut self) -> Result<(), ClientError> {
        let fd = self.wconfd()?.as_raw_fd();
        self.context
            .registry()
            .register(&mut SourceFd(&fd), WCONFD, Interest::READABLE)
            .map_err(|source| ClientError::Io {
                daemon: Daemon::Wconfd.name(),
                source,
            })
    }

    fn unwatch_wconfd(&mut self) {
        if let Some(client) = &self.wconfd {
            let _ = self
                .context
                .registry()
                .deregister(&mut SourceFd(&client.as_raw_fd()));
        }
    }

    /// Frees every lock of the runner and drops its pending request; a
    /// failure is logged (wconfd frees them anyway once the livelock is
    /// gone).
    fn free_locks(&mut self) {
        if !self.used_wconfd {
            return;
        }
        let owner = self.owner.clone();
        let result = self.wconfd().and_then(|client| client.free_locks(&owner));
        if let Err(error) = result {
            tracing::warn!(job = self.id, %error, "cannot free the job's locks");
            self.wconfd = None;
        }
    }

    /// Frees every lock of the runner before its next opcode: an opcode
    /// must not start still holding the last one's locks (its request
    /// could then break the lock order). An unreachable wconfd is waited
    /// for, as in [`Runner::acquire`], unless a cancel arrives (the job
    /// then ends, and wconfd frees the locks of its exited runner).
    fn free_locks_before_next(&mut self) -> Result<(), RunnerError> {
        let owner = self.owner.clone();
        let mut pause = WCONFD_RECONNECT_PAUSE_MIN;
        loop {
            let result = self.wconfd().and_then(|client| client.free_locks(&owner));
            match result {
                Ok(_) => return Ok(()),
                Err(error @ (ClientError::Connect { .. } | ClientError::Io { .. })) => {
                    self.wconfd = None;
                    if pause == WCONFD_RECONNECT_PAUSE_MIN {
                        tracing::warn!(job = self.id, %error, "wconfd is unreachable; waiting for it to free the job's locks");
                    }
                    if self.pause_for_wconfd(pause)? {
                        return Ok(());
                    }
                    pause = (pause * 2).min(WCONFD_RECONNECT_PAUSE_MAX);
                }
                Err(error) => {
                    tracing::warn!(job = self.id, %error, "cannot free the job's locks");
                    self.wconfd = None;
                    return Ok(());
                }
            }
        }
    }

    /// The job's end: its final file (written again only if log entries
    /// wait), then its locks freed.
    fn finish(mut self) -> Result<(), RunnerError> {
        assert!(self.context.job.is_final(), "a runner leaves a final job");
        if self.context.unwritten || self.context.job.end_timestamp.is_none() {
            self.context.write()?;
        }
        self.free_locks();
        Ok(())
    }
}

/// Removes a file that may not exist.
fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}
