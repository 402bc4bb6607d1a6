//! `OP_EXEC` *(extension)*: runs a program while the job holds its locks
//! (PROTOCOL.md "OP_EXEC").
//!
//! The program is started with a plain spawn (no shell, and no `pre_exec`
//! hook, which would force std to fork instead of `posix_spawn`), in the
//! runner's process group (luxid makes the runner a group leader, so its
//! kill of a job, cancel-with-kill or a dead runner's, reaches the
//! program and all it started, D59.3), with the runner's livelock
//! descriptor inherited (the job counts as alive
//! while the program runs), a cleared environment plus a minimal one and
//! the opcode's, `cwd` (default `/`), and `stdin` written to it (else
//! `/dev/null`). Every line it writes on stdout or stderr becomes a log
//! entry. Its exit is watched through a pidfd in the runner's event loop;
//! output is read until the program has exited and its pipes hold nothing
//! more (what processes it left behind write later is not collected).
//!
//! Timeout: SIGTERM to the program and every process it started (found
//! through `/proc`, the runner being their subreaper, D64), then SIGKILL
//! `kill_grace` seconds later to those still alive; the opcode ends when
//! all are gone. Not to a group: the program's group is the runner's
//! (D59.3).
//!
//! Retry (SCHEDULING.md "Retries"): a failed attempt the opcode's `retry`
//! covers is run again after `backoff` seconds, at most `max` times; each
//! attempt writes one log entry with its number and how it ended; the
//! opcode's result is the last attempt's. A cancel request noticed after
//! a failed attempt or during the backoff ends the opcode canceled at
//! once: a canceled job is never retried.

use crate::paths::WORKERS_ENV;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::unix::pipe::{Receiver, Sender};
use mio::{Interest, Token};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::descendants::{self, Descendants};
use super::log::LineSplitter;
use super::{Context, OpResult, RunnerError};
use crate::jobs::LOG_ATTEMPT;
use crate::jobs::opcode::Exec;
use crate::limits::{
    DESCENDANTS_POLL, DRAIN_AFTER_EXIT_BUDGETS, KILLED_WAIT_MAX, READ_BUDGET_BYTES,
    READ_CHUNK_BYTES,
};
use crate::sys;

const CHILD: Token = Token(20);
const STDOUT: Token = Token(21);
const STDERR: Token = Token(22);
const STDIN: Token = Token(23);

/// `PATH` of a program's minimal environment.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How an `OP_EXEC` ended, for the runner.
pub(super) enum Executed {
    /// The last attempt's result.
    Done(OpResult),
    /// A cancel request came between two attempts: no more are made.
    Canceled,
}

/// How a program ended, as the opcode's result records it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ending {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration: Duration,
    /// Killed because its timeout (seconds) passed.
    pub timed_out: Option<f64>,
}

impl Ending {
    fn of(status: ExitStatus, duration: Duration, timed_out: Option<f64>) -> Ending {
        Ending {
            exit_code: status.code(),
            signal: status.signal(),
            duration,
            timed_out,
        }
    }

    fn details(&self) -> Value {
        json!({
            "exit_code": self.exit_code,
            "signal": self.signal,
            "duration": self.duration.as_secs_f64(),
        })
    }

    /// The opcode's result: `Ok` only for exit code 0 within the timeout.
    pub fn result(&self, program: &str) -> OpResult {
        match self.exit_code {
            Some(0) if self.timed_out.is_none() => Ok(self.details()),
            _ => Err(json!([
                "OpExecError",
                [self.reason(program), self.details()]
            ])),
        }
    }

    /// How the program ended, in one line for people.
    pub fn reason(&self, program: &str) -> String {
        if let Some(timeout) = self.timed_out {
            format!("{program} timed out after {timeout} s and was killed")
        } else if let Some(signal) = self.signal {
            let name = Signal::try_from(signal)
                .map(|signal| format!(" ({})", signal.as_str()))
                .unwrap_or_default();
            format!("{program} was killed by signal {signal}{name}")
        } else {
            match self.exit_code {
                Some(code) => format!("{program} exited with code {code}"),
                None => format!("{program} ended without an exit code"),
            }
        }
    }

    /// The exit code a retry's `on` is matched with: none for a program
    /// that timed out or was killed by a signal.
    fn retry_code(&self) -> Option<i32> {
        if self.timed_out.is_some() {
            None
        } else {
            self.exit_code
        }
    }
}

/// The result of a program that could not be started.
fn not_started(program: &str, why: impl std::fmt::Display) -> OpResult {
    let details = json!({"exit_code": null, "signal": null, "duration": 0.0});
    Err(json!([
        "OpExecError",
        [format!("cannot start {program}: {why}"), details]
    ]))
}

/// What a program learns of the workers its job holds (WORKERS.md): the
/// list luxid gave the runner, and the first one's uuid and address.
pub fn worker_env() -> Vec<(String, String)> {
    let Some(list) = std::env::var_os(WORKERS_ENV) else {
        return Vec::new();
    };
    let list = list.to_string_lossy().into_owned();
    crate::protocol::workers::worker_env_of(&list)
}

/// The uuids of the workers luxid gave the runner, for the job file.
pub fn worker_uuids() -> Vec<String> {
    std::env::var_os(WORKERS_ENV)
        .map(|list| crate::protocol::workers::worker_uuids_of(&list.to_string_lossy()))
        .unwrap_or_default()
}

/// The command for `exec`, not yet started.
pub fn command(exec: &Exec, job: u64, root: &Path, fence_env: &[(String, String)]) -> Command {
    let mut command = Command::new(&exec.argv[0]);
    command
        .args(&exec.argv[1..])
        .env_clear()
        .env("PATH", PATH)
        .env("WARDEN_JOB_ID", job.to_string())
        .env("WARDEN_ROOT", root)
        .envs(worker_env())
        .envs(fence_env.iter().map(|(name, value)| (name, value)))
        .envs(exec.env.iter().map(|(name, value)| (name, value)))
        .current_dir(exec.cwd.as_deref().unwrap_or("/"))
        .stdin(if exec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// One output pipe of the program.
struct Output {
    token: Token,
    pipe: Option<Receiver>,
    lines: LineSplitter,
    /// The last read stopped at its budget: more may be waiting without a
    /// new readiness event.
    more: bool,
}

impl Output {
    fn new(token: Token, pipe: Option<Receiver>) -> Output {
        Output {
            token,
            pipe,
            lines: LineSplitter::new(),
            more: false,
        }
    }

    /// Reads what the pipe holds now (up to the budget), logging each
    /// line; at end of file the last partial line too, and the pipe is
    /// closed.
    fn drain(&mut self, context: &mut Context, index: usize) {
        let Some(pipe) = &mut self.pipe else {
            return;
        };
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        let mut budget = READ_BUDGET_BYTES;
        let mut ended = false;
        self.more = false;
        loop {
            if budget == 0 {
                self.more = true;
                break;
            }
            match pipe.read(&mut chunk) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(read) => {
                    budget = budget.saturating_sub(read);
                    self.lines
                        .push(&chunk[..read], &mut |line| context.log(index, line));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    tracing::warn!(%error, "cannot read the program's output");
                    ended = true;
                    break;
                }
            }
        }
        if ended {
            self.lines.finish(&mut |line| context.log(index, line));
            if let Some(mut pipe) = self.pipe.take() {
                let _ = context.registry().deregister(&mut pipe);
            }
        }
    }

    /// After the program exited: everything its pipe still holds, the last
    /// partial line included.
    ///
    /// Bounded: a process the program left behind may go on writing to the
    /// pipe for ever.
    fn drain_all(&mut self, context: &mut Context, index: usize) {
        for _ in 0..DRAIN_AFTER_EXIT_BUDGETS {
            self.drain(context, index);
            if !self.more {
                break;
            }
        }
        self.lines.finish(&mut |line| context.log(index, line));
        if let Some(mut pipe) = self.pipe.take() {
            let _ = context.registry().deregister(&mut pipe);
        }
    }
}

/// The program's stdin while there is something left to write.
struct Input {
    pipe: Option<Sender>,
    bytes: Vec<u8>,
    written: usize,
}

impl Input {
    /// Writes what the pipe takes now; closes it when all is written or
    /// the program closed its end.
    fn feed(&mut self, context: &Context) {
        let Some(pipe) = &mut self.pipe else {
            return;
        };
        let done = loop {
            if self.written == self.bytes.len() {
                break true;
            }
            match pipe.write(&self.bytes[self.written..]) {
                Ok(written) => self.written += written,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break false,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                // Most often: the program closed its stdin (EPIPE).
                Err(_) => break true,
            }
        };
        if done && let Some(mut pipe) = self.pipe.take() {
            let _ = context.registry().deregister(&mut pipe);
        }
    }
}

/// Runs the program of opcode `index` to its end, and again as its
/// `retry` says.
pub(super) fn run(
    context: &mut Context,
    index: usize,
    exec: &Exec,
    root: &Path,
) -> Result<Executed, RunnerError> {
    let Some(retry) = &exec.retry else {
        return Ok(Executed::Done(attempt(context, index, exec, root)?.0));
    };
    let program = exec.argv[0].as_str();
    let attempts = retry.max + 1;
    // A runner started again after its predecessor died (`on_death`)
    // continues the count; luxid starts one only while attempts remain.
    let made = context.job.ops[index].attempts_logged();
    let mut number = (made + 1).min(attempts);
    loop {
        let (result, ending) = attempt(context, index, exec, root)?;
        let reason = match &ending {
            Some(ending) => ending.reason(program),
            None => result
                .as_ref()
                .err()
                .and_then(|error| error[1][0].as_str())
                .unwrap_or("the program did not start")
                .to_owned(),
        };
        context.log_now(
            index,
            LOG_ATTEMPT,
            Value::String(format!("Attempt {number} of {attempts}: {reason}")),
        )?;
        let code = ending.as_ref().and_then(Ending::retry_code);
        if result.is_ok() || number == attempts || !retry.covers(code) {
            return Ok(Executed::Done(result));
        }
        context.check_signals();
        if context.cancel_requested || backoff(context, retry.backoff)? {
            return Ok(Executed::Canceled);
        }
        number += 1;
    }
}

/// Waits `seconds` between two attempts; answers whether a cancel request
/// came meanwhile (the wait then ends at once).
fn backoff(context: &mut Context, seconds: f64) -> Result<bool, RunnerError> {
    let pause = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::ZERO);
    let until = Instant::now() + pause;
    while Instant::now() < until {
        context.wait(Some(until))?;
        if context.cancel_requested {
            return Ok(true);
        }
    }
    Ok(context.cancel_requested)
}

/// One run of the program: its result and how it ended (`None`: it did
/// not start).
fn attempt(
    context: &mut Context,
    index: usize,
    exec: &Exec,
    root: &Path,
) -> Result<(OpResult, Option<Ending>), RunnerError> {
    let program = exec.argv[0].as_str();
    let started = Instant::now();
    let mut child = match command(exec, context.job.id, root, &context.fence_env).spawn() {
        Ok(child) => child,
        Err(error) => return Ok((not_started(program, error), None)),
    };
    let pidfd = match sys::pidfd_open(child.id()) {
        Ok(pidfd) => pidfd,
        Err(error) => {
            let _ = child.kill();
            let _ = child.wait();
            return Ok((
                not_started(program, format!("cannot watch it: {error}")),
                None,
            ));
        }
    };
    let pidfd_raw = pidfd.as_raw_fd();
    let registry = context.registry();
    let watched = registry
        .register(&mut SourceFd(&pidfd_raw), CHILD, Interest::READABLE)
        .and_then(|()| {
            let mut outputs = Vec::new();
            for (token, pipe) in [
                (STDOUT, child.stdout.take().map(Receiver::from)),
                (STDERR, child.stderr.take().map(Receiver::from)),
            ] {
                let mut pipe = pipe;
                if let Some(pipe) = &mut pipe {
                    pipe.set_nonblocking(true)?;
                    registry.register(pipe, token, Interest::READABLE)?;
                }
                outputs.push(Output::new(token, pipe));
            }
            let mut input = Input {
                pipe: child.stdin.take().map(Sender::from),
                bytes: exec.stdin.clone().unwrap_or_default().into_bytes(),
                written: 0,
            };
            if let Some(pipe) = &mut input.pipe {
                pipe.set_nonblocking(true)?;
                registry.register(pipe, STDIN, Interest::WRITABLE)?;
            }
            Ok((outputs, input))
        });
    let (mut outputs, mut input) = match watched {
        Ok(watched) => watched,
        Err(error) => {
            let _ = registry.deregister(&mut SourceFd(&pidfd_raw));
            let _ = child.kill();
            let _ = child.wait();
            return Ok((
                not_started(program, format!("cannot watch it: {error}")),
                None,
            ));
        }
    };
    input.feed(context);
    let status = supervise(
        context,
        index,
        exec,
        &mut child,
        &mut outputs,
        &mut input,
        started,
    );
    let _ = context.registry().deregister(&mut SourceFd(&pidfd_raw));
    drop(pidfd);
    let (status, timed_out) = status?;
    descendants::reap_adopted();
    let ending = Ending::of(status, started.elapsed(), timed_out);
    for output in &mut outputs {
        output.drain_all(context, index);
    }
    if let Some(mut pipe) = input.pipe.take() {
        let _ = context.registry().deregister(&mut pipe);
    }
    Ok((ending.result(program), Some(ending)))
}

/// The event loop while the program runs: its output logged, its stdin
/// fed, its timeout enforced (SIGTERM to the program and its descendants,
/// SIGKILL `kill_grace` later to those still alive, D64). Answers its exit
/// status and, if it timed out, the timeout.
fn supervise(
    context: &mut Context,
    index: usize,
    exec: &Exec,
    child: &mut Child,
    outputs: &mut [Output],
    input: &mut Input,
    started: Instant,
) -> Result<(ExitStatus, Option<f64>), RunnerError> {
    let timeout_at = exec
        .timeout
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
        .map(|timeout| started + timeout);
    let grace = Duration::try_from_secs_f64(exec.kill_grace).unwrap_or(Duration::ZERO);
    let descendants = Descendants::of(child.id());
    let mut timed_out = None;
    // Once SIGTERM was sent: when SIGKILL is due, until it is sent.
    let mut kill_at: Option<Instant> = None;
    // Once SIGKILL was sent: how long its dying descendants are waited for.
    let mut killed_until: Option<Instant> = None;
    let mut status = None;
    loop {
        // Reaped only here: until then its pid cannot name another process.
        if status.is_none() {
            status = exited(child)?;
        }
        if let Some(status) = status {
            // A timed-out program's descendants get the rest of its grace,
            // then SIGKILL: the opcode ends when they are gone (and can be
            // reaped), or when they outlast even that.
            let waited_out = killed_until.is_some_and(|until| Instant::now() >= until);
            if timed_out.is_none() || waited_out || descendants.live().is_empty() {
                return Ok((status, timed_out));
            }
        }
        let now = Instant::now();
        if timed_out.is_none() && timeout_at.is_some_and(|at| now >= at) {
            signal_program(child, Signal::SIGTERM);
            signal_all(&descendants.live(), Signal::SIGTERM);
            timed_out = exec.timeout;
            kill_at = Some(now + grace);
        }
        if kill_at.is_some_and(|at| now >= at) {
            if status.is_none() {
                signal_program(child, Signal::SIGKILL);
            }
            signal_all(&descendants.live(), Signal::SIGKILL);
            kill_at = None;
            killed_until = Some(now + KILLED_WAIT_MAX);
        }
        let more = outputs.iter().any(|output| output.more);
        let deadline = if more {
            Some(Instant::now())
        } else if timed_out.is_none() {
            timeout_at
        } else if status.is_some() {
            // Nothing tells of a descendant's exit: look again soon.
            let poll = Instant::now() + DESCENDANTS_POLL;
            Some(kill_at.map_or(poll, |at| at.min(poll)))
        } else {
            kill_at
        };
        let ready = context.wait(deadline)?;
        for output in outputs.iter_mut() {
            if output.more
                || ready
                    .iter()
                    .any(|event| event.token == output.token && event.readable)
            {
                output.drain(context, index);
            }
        }
        if ready
            .iter()
            .any(|event| event.token == STDIN && event.writable)
        {
            input.feed(context);
        }
    }
}

/// Sends `signal` to each of `pids`, the live descendants of a timed-out
/// program just found in `/proc` (one that exited since is no error).
fn signal_all(pids: &[u32], signal: Signal) {
    for &pid in pids {
        match sys::send_signal(pid, signal) {
            Ok(()) => {}
            Err(error) if error.raw_os_error() == Some(nix::libc::ESRCH) => {}
            Err(error) => tracing::warn!(pid, %error, ?signal, "cannot signal a descendant"),
        }
    }
}

/// Sends `signal` to the program. Only before the program is reaped:
/// until then its pid cannot name another process. The program stays in
/// the runner's process group, which luxid kills whole when the runner
/// dies (D59.3); its timeout reaches what it started through
/// [`Descendants`] instead.
fn signal_program(child: &Child, signal: Signal) {
    match sys::send_signal(child.id(), signal) {
        Ok(()) => {}
        Err(error) if error.raw_os_error() == Some(nix::libc::ESRCH) => {}
        Err(error) => {
            tracing::warn!(pid = child.id(), %error, ?signal, "cannot signal the program");
        }
    }
}

/// The program's exit status, if it has exited (reaping it).
fn exited(child: &mut Child) -> Result<Option<ExitStatus>, RunnerError> {
    loop {
        match child.try_wait() {
            Ok(status) => return Ok(status),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(RunnerError::Poll(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(exit_code: Option<i32>, signal: Option<i32>, timed_out: Option<f64>) -> Ending {
        Ending {
            exit_code,
            signal,
            duration: Duration::from_millis(1500),
            timed_out,
        }
    }

    #[test]
    fn exit_zero_succeeds_with_the_details() {
        assert_eq!(
            ending(Some(0), None, None).result("/bin/true"),
            Ok(json!({"exit_code": 0, "signal": null, "duration": 1.5}))
        );
    }

    #[test]
    fn failures_have_a_one_line_reason_and_the_details() {
        let cases = [
            (ending(Some(3), None, None), "/bin/x exited with code 3"),
            (
                ending(None, Some(15), None),
                "/bin/x was killed by signal 15 (SIGTERM)",
            ),
            (
                ending(None, Some(9), Some(0.5)),
                "/bin/x timed out after 0.5 s and was killed",
            ),
        ];
        for (ending, reason) in cases {
            let result = ending.result("/bin/x").expect_err("a failure");
            assert_eq!(result[0], "OpExecError");
            assert_eq!(result[1][0], reason);
            assert_eq!(result[1][1], ending.details());
            assert!(!reason.contains('\n'));
        }
    }

    #[test]
    fn the_environment_is_minimal_plus_the_opcodes() {
        let exec = Exec {
            argv: vec!["/bin/env".into(), "-0".into()],
            env: vec![("A".into(), "1".into()), ("PATH".into(), "/opt".into())],
            cwd: None,
            timeout: None,
            locks: vec![],
            stdin: None,
            lock_timeout: None,
            kill_grace: 10.0,
            retry: None,
        };
        let command = command(&exec, 42, Path::new("/r"), &[]);
        let env: Vec<(String, Option<String>)> = command
            .get_envs()
            .map(|(name, value)| {
                (
                    name.to_string_lossy().into_owned(),
                    value.map(|value| value.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert!(env.contains(&("PATH".into(), Some("/opt".into()))));
        assert!(env.contains(&("A".into(), Some("1".into()))));
        assert!(env.contains(&("WARDEN_JOB_ID".into(), Some("42".into()))));
        assert!(env.contains(&("WARDEN_ROOT".into(), Some("/r".into()))));
        assert_eq!(command.get_current_dir(), Some(Path::new("/")));
        let args: Vec<_> = command.get_args().collect();
        assert_eq!(args, ["-0"]);
    }
}
