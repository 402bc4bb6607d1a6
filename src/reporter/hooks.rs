//! Hooks: commands run on events (EVENTS.md, "Hooks").
//!
//! [`Hooks`] is the hook runner of the reporter. A *hook* is one entry of
//! `[hooks]` in `warden.toml` (`Settings.hooks`): an event type prefix,
//! which names it, and an argv. A *run* is one hook for one event; an
//! *attempt* is one process of a run. A run has at most
//! `1 + HOOK_RETRIES` attempts: it succeeds with the first that exits 0,
//! and is given up (logged with `tracing::warn`) after the last failure.
//!
//! An attempt is the hook's argv run without a shell, in its own process
//! group, in `/`, with the event's JSON line (newline included) on stdin
//! and stdin then closed, stdout and stderr captured (the last
//! [`HOOK_OUTPUT_TAIL_BYTES`] of each kept, for the log and the outcome),
//! and an environment of `PATH`, `HOME` and `LANG` (the reporter's, where
//! set) plus `WARDEN_EVENT_TYPE`, `WARDEN_EVENT_SEQ` and
//! `WARDEN_EVENT_SOURCE` (`luxid` or `wconfd`). It fails if it exits
//! non-zero, is killed by a signal, runs past the timeout (its whole
//! process group is then killed with SIGKILL) or cannot be started. The
//! pause before the next attempt doubles from the retry pause: with the
//! defaults, 0.5 s, 1 s, 2 s.
//!
//! # Driving it
//!
//! `Hooks` owns child processes but no thread, clock or loop; whoever
//! drives it (the reporter's thread) calls:
//! - [`Hooks::offer`] for each event read, in seq order per source;
//! - [`Hooks::poll`] with the time now, after offering and whenever
//!   [`Hooks::next_wakeup`] comes: it starts what may start (at most
//!   `HOOKS_RUNNING_MAX` attempts run at once over all hooks, due retries
//!   before new runs, new runs in offer order), feeds stdin and drains
//!   output, reaps what ended, kills what overran, schedules retries, and
//!   returns one [`HookOutcome`] per attempt that ended, to be counted
//!   (`warden_hook_runs_total` for each, `warden_hook_failures_total` for
//!   each failed one);
//! - [`Hooks::has_room`] before reading more events: past
//!   [`HOOK_RUNS_PENDING_MAX`] runs queued, waiting for a retry or running,
//!   the reader waits (it never drops an event);
//! - [`Hooks::done_through`] for the position to make durable: every run
//!   of every event at or below it has ended (succeeded or been given up),
//!   so a restart from there neither skips an event nor repeats one whose
//!   runs all ended (at least once: the runs unfinished then run again);
//! - [`Hooks::stop`] on loss of leadership or shutdown (also on drop).
//!
//! Runs of different events overlap and may end in any order; a hook that
//! cares about order reads `seq`.
//!
//! # Never blocking
//!
//! The processes are started with `Command::spawn` and watched with
//! `waitid(WNOHANG | WNOWAIT)` and `Child::try_wait`. The three pipes are
//! non-blocking (mio's pipe types; the flag is on our ends only, the hook
//! gets ordinary blocking pipes): stdin is written as far as the pipe
//! takes, and the rest at each later poll, then closed. An event's line
//! is far below a pipe's 64 KiB, so it is almost always written whole at
//! the start, whether or not the hook reads; a longer one (or a pipe
//! shrunk by the kernel's per-user pipe quota) waits, partly written,
//! for the hook to read. A hook that exits or closes stdin early ends the
//! write with `EPIPE` (Rust programs ignore SIGPIPE; the reporter must
//! not undo that). Against a writer thread: no thread per attempt, no
//! thread to outlive a killed hook, and the write ends with the attempt,
//! whatever the hook does. Output is read as
//! far as there is some at each poll (a bounded amount, so a hook that
//! writes without pause cannot hold the caller), so a chatty hook never
//! stalls on a full pipe for more than one poll interval.
//!
//! A process the hook leaves behind in its group is killed when the hook
//! exits (its exit is seen with `WNOWAIT`, before it is reaped, while the
//! group's id cannot be reused): otherwise hooks that start background
//! work would escape both the limit of runs at once and the timeout.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::unix::pipe::{Receiver, Sender};
use nix::sys::signal::Signal;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

use crate::events::EventLine;
use crate::limits::{HOOK_RETRIES, HOOKS_RUNNING_MAX};
use crate::reporter::metrics::Source;
use crate::sys;

#[cfg(test)]
mod tests;

/// Runs queued, waiting for a retry or running, past which the reporter
/// reads no more events: bounds the memory of a backlog (each run shares
/// its event's line, a few KiB at most) while a slow hook catches up.
pub const HOOK_RUNS_PENDING_MAX: usize = 10_000;

/// The last bytes of a hook's stdout and of its stderr kept for the log.
pub const HOOK_OUTPUT_TAIL_BYTES: usize = 4096;

/// How often a running hook is looked at (exit, timeout, output): the
/// longest [`Hooks::next_wakeup`] asks for while one runs.
pub const HOOK_REAP_INTERVAL: Duration = Duration::from_millis(20);

/// Reads of one output pipe in one poll, at most (of [`READ_BUFFER_BYTES`]
/// each): a hook writing without pause cannot hold the caller.
const OUTPUT_READS_PER_POLL: usize = 16;
const READ_BUFFER_BYTES: usize = 8192;

/// The reporter's environment variables a hook gets.
const KEPT_ENVIRONMENT: [&str; 3] = ["PATH", "HOME", "LANG"];

/// Where a source's runs stand in `Hooks::positions`.
fn slot(source: Source) -> usize {
    match source {
        Source::Luxid => 0,
        Source::Wconfd => 1,
    }
}

/// One attempt that ended, as [`Hooks::poll`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookOutcome {
    /// The hook: its type prefix.
    pub hook: String,
    pub source: Source,
    pub seq: u64,
    /// 1 for the first attempt of the run, up to `1 + HOOK_RETRIES`.
    pub attempt: u32,
    pub result: HookResult,
    /// The last [`HOOK_OUTPUT_TAIL_BYTES`] of its stdout and stderr.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl HookOutcome {
    /// Whether the attempt failed (counted in `warden_hook_failures_total`).
    pub fn failed(&self) -> bool {
        !matches!(self.result, HookResult::Succeeded)
    }
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookResult {
    /// It exited 0: the run is over.
    Succeeded,
    /// It failed and the run will have another attempt at `retry_at`.
    Failed {
        failure: HookFailure,
        retry_at: Instant,
    },
    /// It failed and was the run's last attempt: the run is given up.
    GaveUp { failure: HookFailure },
}

/// Why an attempt failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookFailure {
    /// It exited with this non-zero status.
    Exited(i32),
    /// A signal (this number) killed it, not ours.
    Signaled(i32),
    /// It ran past the timeout, and its process group was killed.
    TimedOut(Duration),
    /// It could not be started (the OS's words).
    NotStarted(String),
    /// Its end could not be learnt (the OS's words); its group was killed.
    Lost(String),
}

impl fmt::Display for HookFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookFailure::Exited(code) => write!(f, "exited with status {code}"),
            HookFailure::Signaled(signal) => write!(f, "was killed by signal {signal}"),
            HookFailure::TimedOut(timeout) => {
                write!(f, "ran longer than {timeout:?} and was killed")
            }
            HookFailure::NotStarted(error) => write!(f, "could not be started: {error}"),
            HookFailure::Lost(error) => write!(f, "could not be waited for: {error}"),
        }
    }
}

/// The hook runner: see the module's documentation.
pub struct Hooks {
    /// In the settings' order (by prefix).
    hooks: Vec<Hook>,
    timeout: Duration,
    retry_pause: Duration,
    /// Runs not yet attempted, in offer order.
    queued: VecDeque<Run>,
    /// Failed runs waiting for their next attempt, by when it is due (and
    /// a serial number keeping the keys unique).
    retrying: BTreeMap<(Instant, u64), Run>,
    retry_serial: u64,
    /// At most `HOOKS_RUNNING_MAX`.
    running: Vec<Attempt>,
    /// Processes killed by [`Hooks::stop`], reaped by later polls.
    stopped: Vec<Child>,
    /// By [`slot`].
    positions: [Position; 2],
    /// The `now` of the last poll (construction time before the first).
    last_poll: Instant,
}

struct Hook {
    prefix: String,
    argv: Vec<String>,
}

/// An event as its runs need it, shared by them.
struct Offered {
    source: Source,
    seq: u64,
    kind: String,
    line: Vec<u8>,
}

/// One hook for one event.
struct Run {
    /// Index into `Hooks::hooks`.
    hook: usize,
    event: Arc<Offered>,
    /// Attempts started so far.
    attempts: u32,
}

/// A running attempt.
struct Attempt {
    run: Run,
    child: Child,
    /// Until the line is all written (`written` bytes of it so far) or the
    /// hook stops reading.
    stdin: Option<Sender>,
    written: usize,
    stdout: Option<Receiver>,
    stderr: Option<Receiver>,
    stdout_tail: Tail,
    stderr_tail: Tail,
    deadline: Instant,
    /// Past its deadline: its group was sent SIGKILL.
    timed_out: bool,
}

/// Where the runs of one source's events stand.
#[derive(Default)]
struct Position {
    /// The seq of the last event offered (or, after a stop, the position
    /// reached then).
    last_offered: u64,
    /// Nothing offered since construction or the last stop: the next
    /// event may have any seq.
    fresh: bool,
    /// Events with runs not yet ended: seq to the number of such runs.
    unfinished: BTreeMap<u64, usize>,
}

/// The last [`HOOK_OUTPUT_TAIL_BYTES`] of an output.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Hooks {
    /// A runner of `hooks` (`Settings.hooks`: a type prefix to an argv),
    /// each attempt killed after `timeout` (`HOOK_TIMEOUT`), the pauses
    /// between attempts doubling from `retry_pause` (`HOOK_RETRY_PAUSE`).
    pub fn new(
        hooks: &BTreeMap<String, Vec<String>>,
        timeout: Duration,
        retry_pause: Duration,
    ) -> Hooks {
        Hooks {
            hooks: hooks
                .iter()
                .map(|(prefix, argv)| Hook {
                    prefix: prefix.clone(),
                    argv: argv.clone(),
                })
                .collect(),
            timeout,
            retry_pause,
            queued: VecDeque::new(),
            retrying: BTreeMap::new(),
            retry_serial: 0,
            running: Vec::with_capacity(HOOKS_RUNNING_MAX),
            stopped: Vec::new(),
            positions: [Position::fresh(), Position::fresh()],
            last_poll: Instant::now(),
        }
    }

    /// Queues a run of every hook whose prefix `event`'s type starts with
    /// (none: the event is done at once). Events of a source are offered
    /// in seq order; one at or below the last offered (a repeat) is
    /// ignored with a warning, except as the first after construction or
    /// [`Hooks::stop`]. Never refuses: the caller keeps to
    /// [`Hooks::has_room`].
    pub fn offer(&mut self, source: Source, event: &EventLine) {
        let position = &mut self.positions[slot(source)];
        if !position.fresh && event.seq() <= position.last_offered {
            tracing::warn!(
                source = source.as_str(),
                seq = event.seq(),
                last = position.last_offered,
                "an event offered to the hooks again or out of order: ignored"
            );
            return;
        }
        position.fresh = false;
        position.last_offered = event.seq();
        let matching: Vec<usize> = (0..self.hooks.len())
            .filter(|&hook| event.is_of(Some(std::slice::from_ref(&self.hooks[hook].prefix))))
            .collect();
        if matching.is_empty() {
            return;
        }
        position.unfinished.insert(event.seq(), matching.len());
        let offered = Arc::new(Offered {
            source,
            seq: event.seq(),
            kind: event.kind_str().to_owned(),
            line: [event.bytes(), b"\n"].concat(),
        });
        for hook in matching {
            self.queued.push_back(Run {
                hook,
                event: Arc::clone(&offered),
                attempts: 0,
            });
        }
    }

    /// Does what is due at `now`: see the module's documentation. Returns
    /// the attempts that ended, in the order they were seen to end.
    pub fn poll(&mut self, now: Instant) -> Vec<HookOutcome> {
        self.last_poll = now;
        let mut outcomes = Vec::new();
        self.stopped
            .retain_mut(|child| matches!(child.try_wait(), Ok(None)));
        let mut index = 0;
        while index < self.running.len() {
            let attempt = &mut self.running[index];
            attempt.write_stdin();
            attempt.read_output();
            match attempt.exited() {
                Ok(false) => {
                    if !attempt.timed_out && now >= attempt.deadline {
                        attempt.kill();
                        attempt.timed_out = true;
                    }
                    index += 1;
                }
                Ok(true) => {
                    // Whatever it left in its group goes with it; its
                    // group id is still its own until it is reaped.
                    attempt.kill();
                    attempt.read_output();
                    let mut attempt = self.running.swap_remove(index);
                    let result = match attempt.child.try_wait() {
                        Ok(Some(status)) => attempt.result(status, self.timeout),
                        Ok(None) => {
                            self.stopped.push(attempt.child);
                            Err(HookFailure::Lost("exited, yet not reapable".to_owned()))
                        }
                        Err(error) => Err(HookFailure::Lost(error.to_string())),
                    };
                    self.settle(
                        attempt.run,
                        result,
                        attempt.stdout_tail,
                        attempt.stderr_tail,
                        now,
                        &mut outcomes,
                    );
                }
                Err(error) => {
                    // Not ours to wait for any more (someone reaped it, or
                    // SIGCHLD is ignored): make sure it is gone and move on.
                    attempt.kill();
                    let attempt = self.running.swap_remove(index);
                    self.settle(
                        attempt.run,
                        Err(HookFailure::Lost(error.to_string())),
                        attempt.stdout_tail,
                        attempt.stderr_tail,
                        now,
                        &mut outcomes,
                    );
                }
            }
        }
        while self.running.len() < HOOKS_RUNNING_MAX {
            let run = match self.retrying.first_entry() {
                Some(entry) if entry.key().0 <= now => entry.remove(),
                _ => match self.queued.pop_front() {
                    Some(run) => run,
                    None => break,
                },
            };
            self.start(run, now, &mut outcomes);
        }
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
        outcomes
    }

    /// When [`Hooks::poll`] should next be called: at once (a time not
    /// after the last poll) when a run may start, else the next retry,
    /// timeout or look at a running hook; `None` when nothing is pending.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let mut wakeup: Option<Instant> = None;
        let mut at = |instant: Instant| {
            wakeup = Some(wakeup.map_or(instant, |earliest| earliest.min(instant)));
        };
        if self.running.len() < HOOKS_RUNNING_MAX && !self.queued.is_empty() {
            at(self.last_poll);
        }
        if let Some((&(due, _), _)) = self.retrying.first_key_value() {
            at(due);
        }
        if !self.running.is_empty() || !self.stopped.is_empty() {
            at(self.last_poll + HOOK_REAP_INTERVAL);
        }
        for attempt in &self.running {
            if !attempt.timed_out {
                at(attempt.deadline);
            }
        }
        wakeup
    }

    /// Runs queued, waiting for a retry or running.
    pub fn pending(&self) -> usize {
        self.queued.len() + self.retrying.len() + self.running.len()
    }

    /// Whether the caller may read more events: fewer than
    /// [`HOOK_RUNS_PENDING_MAX`] runs are pending. (One batch read while
    /// there was room may take it past the bound.)
    pub fn has_room(&self) -> bool {
        self.pending() < HOOK_RUNS_PENDING_MAX
    }

    /// Attempts running now, at most `HOOKS_RUNNING_MAX`.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The highest seq N of `source` such that every run of every event
    /// offered at or below N has ended (succeeded or been given up): the
    /// position to make durable. Events never offered below the first
    /// unfinished one count as done. 0 before anything is offered.
    pub fn done_through(&self, source: Source) -> u64 {
        let position = &self.positions[slot(source)];
        match position.unfinished.first_key_value() {
            Some((&seq, _)) => seq.saturating_sub(1),
            None => position.last_offered,
        }
    }

    /// Kills every running hook (SIGKILL to its group; reaped by later
    /// polls) and forgets every queued run and retry. `done_through` stays
    /// where it was; the next event offered of each source may have any
    /// seq (the caller reads again from its durable position).
    pub fn stop(&mut self) {
        let dropped = self.pending();
        for mut attempt in std::mem::take(&mut self.running) {
            attempt.kill();
            self.stopped.push(attempt.child);
        }
        self.queued.clear();
        self.retrying.clear();
        for source in Source::ALL {
            let done = self.done_through(source);
            let position = &mut self.positions[slot(source)];
            position.last_offered = done;
            position.fresh = true;
            position.unfinished.clear();
        }
        self.stopped
            .retain_mut(|child| matches!(child.try_wait(), Ok(None)));
        if dropped > 0 {
            tracing::info!(dropped, "hooks stopped; their runs were dropped");
        }
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
    }

    /// Panics unless the runner's state is consistent: the limit of
    /// running attempts holds, each unfinished count is the number of that
    /// event's runs pending, and each run is in the place its attempts
    /// say.
    pub fn check_invariants(&self) {
        assert!(self.running.len() <= HOOKS_RUNNING_MAX);
        let mut counts: [BTreeMap<u64, usize>; 2] = Default::default();
        let mut count = |run: &Run| {
            assert!(run.hook < self.hooks.len());
            *counts[slot(run.event.source)]
                .entry(run.event.seq)
                .or_default() += 1;
        };
        for run in &self.queued {
            assert_eq!(run.attempts, 0);
            count(run);
        }
        for run in self.retrying.values() {
            assert!((1..=HOOK_RETRIES).contains(&run.attempts));
            count(run);
        }
        for attempt in &self.running {
            assert!((1..=HOOK_RETRIES + 1).contains(&attempt.run.attempts));
            count(&attempt.run);
        }
        for source in Source::ALL {
            let position = &self.positions[slot(source)];
            assert_eq!(counts[slot(source)], position.unfinished);
            if let Some((&last, _)) = position.unfinished.last_key_value() {
                assert!(last <= position.last_offered);
                assert!(!position.fresh);
            }
        }
    }

    /// Starts the next attempt of `run`, or settles it if it cannot start.
    fn start(&mut self, mut run: Run, now: Instant, outcomes: &mut Vec<HookOutcome>) {
        run.attempts += 1;
        match self.spawn(&run) {
            Ok((child, stdin, stdout, stderr)) => {
                let mut attempt = Attempt {
                    run,
                    child,
                    stdin: Some(stdin),
                    written: 0,
                    stdout: Some(stdout),
                    stderr: Some(stderr),
                    stdout_tail: Tail::default(),
                    stderr_tail: Tail::default(),
                    deadline: now + self.timeout,
                    timed_out: false,
                };
                attempt.write_stdin();
                self.running.push(attempt);
            }
            Err(error) => self.settle(
                run,
                Err(HookFailure::NotStarted(error.to_string())),
                Tail::default(),
                Tail::default(),
                now,
                outcomes,
            ),
        }
    }

    /// Starts a process of `run`'s hook, its pipes non-blocking.
    fn spawn(&mut self, run: &Run) -> io::Result<(Child, Sender, Receiver, Receiver)> {
        let event = &run.event;
        let Some((program, args)) = self.hooks[run.hook].argv.split_first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
        };
        let mut command = Command::new(program);
        command.args(args).env_clear();
        for name in KEPT_ENVIRONMENT {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command
            .env("WARDEN_EVENT_TYPE", &event.kind)
            .env("WARDEN_EVENT_SEQ", event.seq.to_string())
            .env("WARDEN_EVENT_SOURCE", event.source.as_str())
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a timeout kills every process of it,
            // and none of the reporter's.
            .process_group(0);
        let mut child = command.spawn()?;
        let pipes = (
            child.stdin.take().map(Sender::from),
            child.stdout.take().map(Receiver::from),
            child.stderr.take().map(Receiver::from),
        );
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            unreachable!("all three were asked for as pipes");
        };
        let nonblocking = stdin
            .set_nonblocking(true)
            .and_then(|()| stdout.set_nonblocking(true))
            .and_then(|()| stderr.set_nonblocking(true));
        if let Err(error) = nonblocking {
            kill_group(&mut child);
            self.stopped.push(child);
            return Err(error);
        }
        Ok((child, stdin, stdout, stderr))
    }

    /// The end of an attempt of `run`: the run is over, or waits for its
    /// next attempt; the outcome is logged and reported.
    fn settle(
        &mut self,
        run: Run,
        result: Result<(), HookFailure>,
        stdout: Tail,
        stderr: Tail,
        now: Instant,
        outcomes: &mut Vec<HookOutcome>,
    ) {
        let hook = self.hooks[run.hook].prefix.clone();
        let (source, seq, attempt) = (run.event.source, run.event.seq, run.attempts);
        let result = match result {
            Ok(()) => {
                tracing::debug!(
                    hook,
                    source = source.as_str(),
                    seq,
                    attempt,
                    stdout = %String::from_utf8_lossy(&stdout.0),
                    stderr = %String::from_utf8_lossy(&stderr.0),
                    "a hook ran"
                );
                self.run_ended(&run);
                HookResult::Succeeded
            }
            Err(failure) if attempt <= HOOK_RETRIES => {
                let pause = self.retry_pause.saturating_mul(1 << (attempt - 1));
                let retry_at = now + pause;
                tracing::info!(
                    hook,
                    source = source.as_str(),
                    seq,
                    attempt,
                    why = %failure,
                    stderr = %String::from_utf8_lossy(&stderr.0),
                    "a hook failed; it runs again in {pause:?}"
                );
                self.retry_serial += 1;
                self.retrying.insert((retry_at, self.retry_serial), run);
                HookResult::Failed { failure, retry_at }
            }
            Err(failure) => {
                tracing::warn!(
                    hook,
                    source = source.as_str(),
                    seq,
                    attempts = attempt,
                    why = %failure,
                    stdout = %String::from_utf8_lossy(&stdout.0),
                    stderr = %String::from_utf8_lossy(&stderr.0),
                    "a hook failed for the last time: given up"
                );
                self.run_ended(&run);
                HookResult::GaveUp { failure }
            }
        };
        outcomes.push(HookOutcome {
            hook,
            source,
            seq,
            attempt,
            result,
            stdout: stdout.0,
            stderr: stderr.0,
        });
    }

    /// `run` is over: one fewer run of its event is unfinished.
    fn run_ended(&mut self, run: &Run) {
        let unfinished = &mut self.positions[slot(run.event.source)].unfinished;
        let count = unfinished
            .get_mut(&run.event.seq)
            .expect("a pending run's event is unfinished");
        *count -= 1;
        if *count == 0 {
            unfinished.remove(&run.event.seq);
        }
    }
}

impl Drop for Hooks {
    /// No hook outlives its runner.
    fn drop(&mut self) {
        self.stop();
    }
}

impl Position {
    fn fresh() -> Position {
        Position {
            fresh: true,
            ..Position::default()
        }
    }
}

impl Attempt {
    /// Writes as much of the rest of the line as the pipe takes; closes
    /// stdin once it is all written or the hook no longer reads.
    fn write_stdin(&mut self) {
        let Some(stdin) = &mut self.stdin else {
            return;
        };
        let line = &self.run.event.line;
        while self.written < line.len() {
            match stdin.write(&line[self.written..]) {
                Ok(0) => break,
                Ok(bytes) => self.written += bytes,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                // EPIPE: it closed stdin or exited; it had what it read.
                Err(_) => break,
            }
        }
        self.stdin = None;
    }

    /// Reads what the hook wrote since the last poll (a bounded amount).
    fn read_output(&mut self) {
        read_pipe(&mut self.stdout, &mut self.stdout_tail);
        read_pipe(&mut self.stderr, &mut self.stderr_tail);
    }

    /// Whether the hook's process has exited, without reaping it.
    fn exited(&self) -> io::Result<bool> {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pids fit in i32"));
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        loop {
            match waitid(Id::Pid(pid), flags) {
                Ok(WaitStatus::StillAlive) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(nix::errno::Errno::EINTR) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
    }

    fn kill(&mut self) {
        kill_group(&mut self.child);
    }

    /// How the attempt ended, from its exit status; `timeout` is the
    /// runner's.
    fn result(&self, status: ExitStatus, timeout: Duration) -> Result<(), HookFailure> {
        if self.timed_out {
            Err(HookFailure::TimedOut(timeout))
        } else if status.success() {
            Ok(())
        } else if let Some(code) = status.code() {
            Err(HookFailure::Exited(code))
        } else {
            Err(HookFailure::Signaled(status.signal().unwrap_or(0)))
        }
    }
}

/// Sends SIGKILL to `child`'s process group (its own: it was started with
/// `process_group(0)`), or to `child` alone if that fails. Call it only
/// before `child` is reaped: until then its pid cannot name another group.
fn kill_group(child: &mut Child) {
    match sys::send_signal_to_group(child.id(), Signal::SIGKILL) {
        Ok(()) => {}
        Err(error) if error.raw_os_error() == Some(nix::libc::ESRCH) => {}
        Err(error) => {
            tracing::error!(pid = child.id(), %error, "cannot kill a hook's process group");
            let _ = child.kill();
        }
    }
}

/// Reads `pipe` into `tail` until it has nothing more now (at most
/// [`OUTPUT_READS_PER_POLL`] reads); drops it at its end or on an error.
fn read_pipe(pipe: &mut Option<Receiver>, tail: &mut Tail) {
    let Some(receiver) = pipe else {
        return;
    };
    let mut buffer = [0; READ_BUFFER_BYTES];
    for _ in 0..OUTPUT_READS_PER_POLL {
        match receiver.read(&mut buffer) {
            Ok(0) => {
                *pipe = None;
                return;
            }
            Ok(bytes) => tail.push(&buffer[..bytes]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(_) => {
                *pipe = None;
                return;
            }
        }
    }
}

impl Tail {
    /// Appends `bytes`, keeping the last [`HOOK_OUTPUT_TAIL_BYTES`].
    fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= HOOK_OUTPUT_TAIL_BYTES {
            self.0.clear();
            self.0
                .extend_from_slice(&bytes[bytes.len() - HOOK_OUTPUT_TAIL_BYTES..]);
        } else {
            self.0.extend_from_slice(bytes);
            let excess = self.0.len().saturating_sub(HOOK_OUTPUT_TAIL_BYTES);
            self.0.drain(..excess);
        }
    }
}
