//! `OP_TEST_DELAY` (Ganeti's `LUTestDelay`; PROTOCOL.md "OP_TEST_DELAY"):
//! sleeps in the runner (there is no node daemon), `repeat` times with a
//! log line each, and, if `interruptible`, ends early when a byte is
//! written to a Unix socket whose path it logs as a `delay-test` entry.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Token};
use serde_json::{Value, json};

use super::{Context, OpResult, RunnerError, exec_error, prereq_error, remove_if_present};
use crate::jobs::opcode::TestDelay;
use crate::limits::SOCKET_PATH_BYTES_MAX;

const LISTENER: Token = Token(10);
const CONNECTION: Token = Token(11);

/// The log entry type of the socket path (Ganeti's `ELOG_DELAY_TEST`).
pub const LOG_DELAY_TEST: &str = "delay-test";

/// The precondition Ganeti checks before taking locks: a duration greater
/// than zero (and, here, one a clock can count). `Err`: the opcode's error
/// result.
pub(super) fn check(delay: &TestDelay) -> Result<Duration, Value> {
    if delay.duration.is_nan() || delay.duration <= 0.0 {
        return Err(prereq_error("Duration must be greater than zero"));
    }
    Duration::try_from_secs_f64(delay.duration)
        .map_err(|_| prereq_error(format!("Duration {} is too large", delay.duration)))
}

/// The socket of an interruptible delay: short, under the root's socket
/// directory (`sun_path` is small), one per job and opcode.
pub fn socket_path(socket_dir: &Path, job: u64, index: usize) -> PathBuf {
    socket_dir.join(format!("delay-{job}-{index}.sock"))
}

/// Runs the delay of opcode `index`. Result `null`.
pub(super) fn run(
    context: &mut Context,
    index: usize,
    delay: &TestDelay,
    socket_dir: &Path,
) -> Result<OpResult, RunnerError> {
    let duration = match check(delay) {
        Ok(duration) => duration,
        Err(result) => return Ok(Err(result)),
    };
    let path = socket_path(socket_dir, context.job.id, index);
    let once = |context: &mut Context| -> Result<Result<bool, Value>, RunnerError> {
        if delay.interruptible {
            interruptible(context, index, duration, &path)
        } else {
            sleep(context, duration)?;
            Ok(Ok(false))
        }
    };
    if delay.repeat == 0 {
        return Ok(once(context)?.map(|_| Value::Null));
    }
    for iteration in 0..delay.repeat {
        context.log(
            index,
            format!(
                " - INFO: Test delay iteration {iteration}/{}",
                delay.repeat - 1
            ),
        );
        match once(context)? {
            Ok(false) => {}
            Ok(true) => break,
            Err(result) => return Ok(Err(result)),
        }
    }
    Ok(Ok(Value::Null))
}

/// Sleeps, noting signals and writing the log meanwhile.
fn sleep(context: &mut Context, duration: Duration) -> Result<(), RunnerError> {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        context.wait(Some(deadline))?;
    }
    Ok(())
}

/// One interruptible delay: answers whether it was interrupted. The socket
/// is removed afterwards, whatever happened.
fn interruptible(
    context: &mut Context,
    index: usize,
    duration: Duration,
    path: &Path,
) -> Result<Result<bool, Value>, RunnerError> {
    let shown = path.display();
    if path.as_os_str().len() > SOCKET_PATH_BYTES_MAX {
        return Ok(Err(exec_error(format!(
            "the delay socket path {shown} is longer than {SOCKET_PATH_BYTES_MAX} bytes"
        ))));
    }
    // A socket left by a runner that was killed.
    if let Err(error) = remove_if_present(path) {
        return Ok(Err(exec_error(format!(
            "cannot remove the old delay socket {shown}: {error}"
        ))));
    }
    let mut listener = match UnixListener::bind(path) {
        Ok(listener) => listener,
        Err(error) => {
            return Ok(Err(exec_error(format!(
                "cannot create the delay socket {shown}: {error}"
            ))));
        }
    };
    let result = wait_on_socket(context, index, duration, path, &mut listener);
    let _ = context.registry().deregister(&mut listener);
    drop(listener);
    if let Err(error) = remove_if_present(path) {
        tracing::warn!(path = %shown, %error, "cannot remove the delay socket");
    }
    result
}

fn wait_on_socket(
    context: &mut Context,
    index: usize,
    duration: Duration,
    path: &Path,
    listener: &mut UnixListener,
) -> Result<Result<bool, Value>, RunnerError> {
    if let Err(error) = context
        .registry()
        .register(listener, LISTENER, Interest::READABLE)
    {
        return Ok(Err(exec_error(format!(
            "cannot watch the delay socket: {error}"
        ))));
    }
    context.log_now(index, LOG_DELAY_TEST, json!([path.to_string_lossy()]))?;
    let start = Instant::now();
    let deadline = start + duration;
    let mut connection: Option<UnixStream> = None;
    let interrupted = loop {
        if connection.is_none() {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    context.log(
                        index,
                        format!("Received connection, time to go is {}", left.as_secs()),
                    );
                    if let Err(error) =
                        context
                            .registry()
                            .register(&mut stream, CONNECTION, Interest::READABLE)
                    {
                        tracing::warn!(%error, "cannot watch a delay connection");
                    }
                    connection = Some(stream);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => tracing::warn!(%error, "cannot accept on the delay socket"),
            }
        }
        if let Some(stream) = &mut connection {
            let mut byte = [0u8; 1];
            match stream.read(&mut byte) {
                // A byte, or the peer closed: as Ganeti's `recv(1)`.
                Ok(_) => break true,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break true,
            }
        }
        if Instant::now() >= deadline {
            break false;
        }
        context.wait(Some(deadline))?;
    };
    if let Some(mut stream) = connection {
        let _ = context.registry().deregister(&mut stream);
    }
    if interrupted {
        context.log(
            index,
            format!(
                "Interrupted, time spent waiting: {}",
                start.elapsed().as_secs()
            ),
        );
    }
    Ok(Ok(interrupted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delay(duration: f64) -> TestDelay {
        TestDelay {
            duration,
            on_master: true,
            on_nodes: vec![],
            repeat: 0,
            interruptible: false,
            no_locks: true,
            lock_timeout: None,
        }
    }

    #[test]
    fn only_positive_durations_pass() {
        assert_eq!(check(&delay(0.25)), Ok(Duration::from_millis(250)));
        for bad in [0.0, -1.0, f64::NAN] {
            assert_eq!(
                check(&delay(bad)),
                Err(json!([
                    "OpPrereqError",
                    ["Duration must be greater than zero", "wrong_input"]
                ])),
                "{bad}"
            );
        }
        assert!(check(&delay(1e300)).is_err());
    }

    #[test]
    fn socket_paths_are_short() {
        let path = socket_path(Path::new("/r/socket"), 123_456, 7);
        assert_eq!(path, Path::new("/r/socket/delay-123456-7.sock"));
    }
}
