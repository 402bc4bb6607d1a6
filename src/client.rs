//! A small blocking client of either daemon (protocol.md): one connection
//! to `<root>/socket/wconfd.sock` or `<root>/socket/luxid.sock`, one request
//! at a time. The job runner uses it for its lock requests, luxid to free
//! the locks of dead jobs, and the `warden` command for everything it asks.
//! A caller sends a request and reads its answer, or (for a held
//! `awaitLocks` or `WaitForJobChange`) sends, waits for the socket to
//! become readable in its own event loop, and then reads.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::protocol::{ETX, FrameError, FrameReader};

/// How long one read or write on the connection may block before the
/// daemon counts as hung. Both daemons answer every request within
/// milliseconds but a held one (`awaitLocks`, `WaitForJobChange`, at most
/// [`crate::limits::WAIT_FOR_CHANGE_SECONDS_MAX`]); a held `awaitLocks` is
/// waited for by the caller's event loop, not by a blocking read.
pub const IO_TIMEOUT: Duration = Duration::from_secs(120);

/// The daemon a client talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Daemon {
    Wconfd,
    Luxid,
}

impl Daemon {
    pub fn name(self) -> &'static str {
        match self {
            Daemon::Wconfd => "wconfd",
            Daemon::Luxid => "luxid",
        }
    }

    /// The daemon's socket, relative to the root.
    pub fn socket_path(self) -> &'static str {
        match self {
            Daemon::Wconfd => crate::wconfd::SOCKET_PATH,
            Daemon::Luxid => crate::luxid::SOCKET_PATH,
        }
    }
}

/// Bytes asked of the socket per read.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be connected (the daemon is not running, or
    /// not ready yet).
    #[error("cannot connect to {daemon} at {path}: {source}")]
    Connect {
        daemon: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The connection failed after it was made (the daemon stopped or hung).
    #[error("connection to {daemon} failed: {source}")]
    Io {
        daemon: &'static str,
        source: io::Error,
    },
    /// The daemon sent something that is not an answer of protocol.md.
    #[error("{daemon} sent a malformed answer: {message}")]
    Protocol {
        daemon: &'static str,
        message: String,
    },
    /// The daemon refused the request: its error class and arguments.
    #[error("{daemon} answered {class}: {}", failure_message(.args))]
    Failed {
        daemon: &'static str,
        class: String,
        args: Vec<Value>,
    },
}

/// The message of a failure's arguments (its first, as Ganeti's errors).
fn failure_message(args: &[Value]) -> String {
    match args.first() {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// One connection to a daemon.
#[derive(Debug)]
pub struct Client {
    daemon: Daemon,
    stream: UnixStream,
    reader: FrameReader,
}

impl Client {
    /// Connects to `daemon` of `root`; answers longer than
    /// `frame_bytes_max` are refused as malformed.
    pub fn connect(
        root: &Path,
        daemon: Daemon,
        frame_bytes_max: usize,
    ) -> Result<Client, ClientError> {
        let path = root.join(daemon.socket_path());
        let stream = UnixStream::connect(&path).map_err(|source| ClientError::Connect {
            daemon: daemon.name(),
            path: path.clone(),
            source,
        })?;
        let client = Client {
            daemon,
            stream,
            reader: FrameReader::new(frame_bytes_max),
        };
        client
            .stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| client.stream.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(|source| client.io_error(source))?;
        Ok(client)
    }

    /// The daemon this client talks to.
    pub fn daemon(&self) -> Daemon {
        self.daemon
    }

    /// Sends a request and waits for its answer.
    pub fn call(&mut self, method: &str, args: Value) -> Result<Value, ClientError> {
        self.send(method, args)?;
        self.receive()
    }

    /// Sends a request without waiting for its answer; [`receive`] reads
    /// it.
    ///
    /// [`receive`]: Client::receive
    pub fn send(&mut self, method: &str, args: Value) -> Result<(), ClientError> {
        let mut frame = serde_json::to_vec(&json!({"method": method, "args": args}))
            .expect("JSON to a Vec cannot fail");
        frame.push(ETX);
        self.stream
            .write_all(&frame)
            .map_err(|source| self.io_error(source))
    }

    /// Reads the next answer: `Ok(result)`, or the error the daemon
    /// answered. Blocks until the whole answer arrived (at most
    /// [`IO_TIMEOUT`] between two pieces).
    pub fn receive(&mut self) -> Result<Value, ClientError> {
        let frame = self.read_frame()?;
        decode_answer(self.daemon.name(), &frame)
    }

    fn io_error(&self, source: io::Error) -> ClientError {
        ClientError::Io {
            daemon: self.daemon.name(),
            source,
        }
    }

    fn protocol_error(&self, message: String) -> ClientError {
        ClientError::Protocol {
            daemon: self.daemon.name(),
            message,
        }
    }

    fn read_frame(&mut self) -> Result<Vec<u8>, ClientError> {
        loop {
            match self.reader.next_frame() {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => {}
                Err(error @ FrameError::TooLong { .. }) => {
                    return Err(self.protocol_error(error.to_string()));
                }
            }
            let Some(spare) = self.reader.spare(READ_CHUNK_BYTES) else {
                return Err(self.protocol_error("an answer longer than the frame limit".to_owned()));
            };
            let spare_bytes = spare.len();
            match self.stream.read(spare) {
                Ok(0) => {
                    return Err(self.io_error(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("{} closed the connection", self.daemon.name()),
                    )));
                }
                Ok(read) => self.reader.commit(spare_bytes, read),
                // A read with a timeout is not restarted after a signal.
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(self.io_error(error)),
            }
        }
    }
}

/// An answer frame of `daemon` as `Ok(result)` or the error it carries.
fn decode_answer(daemon: &'static str, frame: &[u8]) -> Result<Value, ClientError> {
    let protocol = |message: String| ClientError::Protocol { daemon, message };
    let answer: Value =
        serde_json::from_slice(frame).map_err(|error| protocol(format!("not JSON: {error}")))?;
    match (answer.get("success"), answer.get("result")) {
        (Some(Value::Bool(true)), Some(result)) => Ok(result.clone()),
        (Some(Value::Bool(false)), Some(Value::Array(error))) => match error.as_slice() {
            [Value::String(class), Value::Array(args)] => Err(ClientError::Failed {
                daemon,
                class: class.clone(),
                args: args.clone(),
            }),
            _ => Err(protocol(format!(
                "an error that is not [class, args]: {}",
                Value::Array(error.clone())
            ))),
        },
        _ => Err(protocol(
            "not an object with 'success' and 'result'".to_owned(),
        )),
    }
}

impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl AsRawFd for Client {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_decode_to_results_and_failures() {
        assert_eq!(
            decode_answer("wconfd", br#"{"success": true, "result": [1]}"#).unwrap(),
            json!([1])
        );
        match decode_answer(
            "wconfd",
            br#"{"success": false, "result": ["GenericError", ["no"]]}"#,
        ) {
            Err(error @ ClientError::Failed { .. }) => {
                assert_eq!(error.to_string(), "wconfd answered GenericError: no");
            }
            other => panic!("not a failure: {other:?}"),
        }
        for bad in [
            &b"nonsense"[..],
            br#"{"success": true}"#,
            br#"{"success": false, "result": "x"}"#,
            br#"{"success": false, "result": ["GenericError"]}"#,
        ] {
            assert!(
                matches!(
                    decode_answer("wconfd", bad),
                    Err(ClientError::Protocol { .. })
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_call_reads_one_framed_answer() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut client = Client {
            daemon: Daemon::Wconfd,
            stream: ours,
            reader: FrameReader::new(4096),
        };
        let server = std::thread::spawn(move || {
            let mut theirs = theirs;
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while theirs.read(&mut byte).unwrap() == 1 && byte[0] != ETX {
                request.push(byte[0]);
            }
            theirs
                .write_all(b"{\"success\": true, \"result\": \"hi\"}\n\x03")
                .unwrap();
            serde_json::from_slice::<Value>(&request).unwrap()
        });
        assert_eq!(client.call("echo", json!(["hi"])).unwrap(), json!("hi"));
        assert_eq!(
            server.join().unwrap(),
            json!({"method": "echo", "args": ["hi"]})
        );
    }

    #[test]
    fn a_closed_connection_is_an_io_error() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        drop(theirs);
        let mut client = Client {
            daemon: Daemon::Wconfd,
            stream: ours,
            reader: FrameReader::new(4096),
        };
        assert!(matches!(client.receive(), Err(ClientError::Io { .. })));
    }

    #[test]
    fn connecting_to_a_root_without_wconfd_names_the_socket() {
        let root = tempfile::tempdir().unwrap();
        let error = Client::connect(root.path(), Daemon::Wconfd, 4096).unwrap_err();
        assert!(error.to_string().contains("socket/wconfd.sock"), "{error}");
    }
}
