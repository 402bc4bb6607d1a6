//! A small blocking client of either daemon (PROTOCOL.md "1. Transport"):
//! one connection to `<root>/socket/wconfd.sock` or
//! `<root>/socket/luxid.sock`, one request at a time. The job runner uses
//! it for its lock requests, luxid to free the locks of dead jobs, and the
//! `warden` command for everything it asks. A caller sends a request and
//! reads its answer, or (for a held `awaitLocks` or `WaitForJobChange`)
//! sends, waits for the socket to become readable in its own event loop,
//! and then reads.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::jobs::JobId;
use crate::limits::{CLIENT_IO_TIMEOUT, READ_CHUNK_BYTES};
use crate::locks::{Entry, LockName, Mode, Owner, Priority};
use crate::protocol::luxi::{LuxiRequest, ReplaceFilterCall};
use crate::protocol::wconfd::WconfdRequest;
use crate::protocol::{FrameError, FrameReader, Request};

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
            Daemon::Wconfd => crate::paths::WCONFD_SOCKET_PATH,
            Daemon::Luxid => crate::paths::LUXID_SOCKET_PATH,
        }
    }
}

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
    /// The daemon sent something that is not an answer of PROTOCOL.md
    /// "Request and response envelopes".
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

/// The answer of an `awaitLocks` sent with `fence` *(extension)*.
#[derive(Clone, Debug, PartialEq)]
pub struct FencedAnswer {
    /// The owners in the way (empty: granted).
    pub blockers: Vec<Value>,
    /// The grant's fencing token, once granted.
    pub token: Option<u64>,
    /// The dead previous holders the grant was told of:
    /// `{"lock", "owner", "token"}` each.
    pub died: Vec<Value>,
}

impl FencedAnswer {
    /// The answer as wconfd sends it (PROTOCOL.md "Fencing, deaths,
    /// what-if"); None if it is not of that shape.
    pub fn decode(answer: &Value) -> Option<FencedAnswer> {
        let blockers = answer.get("blockers")?.as_array()?;
        let died = match answer.get("died") {
            Some(died) => died.as_array()?.clone(),
            None => Vec::new(),
        };
        Some(FencedAnswer {
            blockers: blockers.clone(),
            token: answer.get("token").and_then(Value::as_u64),
            died,
        })
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
            .set_read_timeout(Some(CLIENT_IO_TIMEOUT))
            .and_then(|()| client.stream.set_write_timeout(Some(CLIENT_IO_TIMEOUT)))
            .map_err(|source| client.io_error(source))?;
        Ok(client)
    }

    /// The daemon this client talks to.
    pub fn daemon(&self) -> Daemon {
        self.daemon
    }

    /// Sends an encoded request and waits for its answer.
    pub fn request(&mut self, request: &Request) -> Result<Value, ClientError> {
        self.send_request(request)?;
        self.receive()
    }

    /// Sends an encoded request without waiting for its answer;
    /// [`receive`] reads it.
    ///
    /// [`receive`]: Client::receive
    pub fn send_request(&mut self, request: &Request) -> Result<(), ClientError> {
        let mut frame = Vec::new();
        request.write_frame(&mut frame);
        self.stream
            .write_all(&frame)
            .map_err(|source| self.io_error(source))
    }

    /// Calls wconfd: its raw answer.
    pub fn wconfd(&mut self, request: &WconfdRequest) -> Result<Value, ClientError> {
        self.request(&request.encode())
    }

    /// The events of this client's daemon after `watch.since` (`luxid`'s
    /// `WatchEvents`, wconfd's `watchEvents`), held as the daemon holds
    /// it; the events and the position to ask from next.
    pub fn watch_events(
        &mut self,
        watch: &crate::protocol::events::WatchEvents,
    ) -> Result<(Vec<crate::events::EventLine>, u64), ClientError> {
        let request = match self.daemon {
            Daemon::Luxid => LuxiRequest::WatchEvents(watch.clone()).encode(),
            Daemon::Wconfd => WconfdRequest::WatchEvents(watch.clone()).encode(),
        };
        self.send_request(&request)?;
        let frame = self.read_frame()?;
        // The daemons' own form, taken apart into lines; any other
        // (a success written differently, an error) the general way.
        let result = frame
            .strip_prefix(crate::protocol::SUCCESS_PREFIX)
            .and_then(|rest| rest.strip_suffix(b"}"));
        if let Some(Ok(answer)) =
            result.map(serde_json::from_slice::<crate::protocol::events::WatchAnswer>)
        {
            return Ok((answer.events, answer.next));
        }
        let answer = decode_answer(self.daemon.name(), &frame)?;
        crate::protocol::events::decode_answer(answer)
            .map_err(|what| self.protocol_error(format!("the events: {what}")))
    }

    /// Every event after `since` there is now whose type starts with one
    /// of `types` (none: all), read answer by answer without waiting; the
    /// events and the position to ask from next.
    pub fn events_after(
        &mut self,
        mut since: u64,
        types: Option<&[String]>,
    ) -> Result<(Vec<crate::events::EventLine>, u64), ClientError> {
        let mut all = Vec::new();
        loop {
            let watch = crate::protocol::events::WatchEvents {
                since: Some(since),
                types: types.map(<[String]>::to_vec),
                timeout: std::time::Duration::ZERO,
            };
            let (events, next) = self.watch_events(&watch)?;
            all.extend(events);
            if next == since {
                return Ok((all, since));
            }
            since = next;
        }
    }

    /// Calls luxid: its raw answer.
    pub fn luxi(&mut self, request: &LuxiRequest) -> Result<Value, ClientError> {
        self.request(&request.encode())
    }

    // ----- wconfd -----

    /// `echo`: the text back.
    pub fn echo(&mut self, text: &str) -> Result<String, ClientError> {
        match self.wconfd(&WconfdRequest::Echo(text.to_owned()))? {
            Value::String(text) => Ok(text),
            other => Err(self.malformed("echo", &other)),
        }
    }

    /// `freeLocks`: every lock of `owner` freed, its pending request
    /// dropped.
    pub fn free_locks(&mut self, owner: &Owner) -> Result<(), ClientError> {
        self.wconfd(&WconfdRequest::FreeLocks {
            owner: owner.clone(),
        })
        .map(drop)
    }

    /// `listAllLocksOwners`: `[[lock, [[owner, mode], ...]], ...]`.
    pub fn list_all_locks_owners(&mut self) -> Result<Value, ClientError> {
        self.wconfd(&WconfdRequest::ListAllLocksOwners { tokens: false })
    }

    /// `listAllLocksOwners [{"tokens": true}]` *(extension)*: each holder
    /// as `[owner, mode, {"token", "died"?}]`.
    pub fn list_all_locks_owners_with_tokens(&mut self) -> Result<Value, ClientError> {
        self.wconfd(&WconfdRequest::ListAllLocksOwners { tokens: true })
    }

    /// `listWaiters` *(extension)*: every pending request with how long
    /// it has waited and who blocks it.
    pub fn list_waiters(&mut self) -> Result<Value, ClientError> {
        self.wconfd(&WconfdRequest::ListWaiters)
    }

    /// `listLocks`: the locks `owner` holds, with their modes.
    pub fn list_locks(&mut self, owner: &Owner) -> Result<Vec<(LockName, Mode)>, ClientError> {
        let answer = self.wconfd(&WconfdRequest::ListLocks {
            owner: owner.clone(),
        })?;
        let held = answer.as_array().map(|held| {
            held.iter()
                .map(crate::protocol::wconfd::decode_lock_mode)
                .collect::<Result<Vec<_>, _>>()
        });
        match held {
            Some(Ok(held)) => Ok(held),
            _ => Err(self.malformed("listLocks", &answer)),
        }
    }

    /// `readConfig`: the configuration.
    pub fn read_config(&mut self) -> Result<Value, ClientError> {
        self.wconfd(&WconfdRequest::ReadConfig)
    }

    /// Sends an `awaitLocks` without waiting for its answer (it is held
    /// until granted or `timeout_ms` passes): [`Client::receive_blockers`]
    /// reads it once the socket is readable.
    pub fn send_await_locks(
        &mut self,
        owner: &Owner,
        priority: Priority,
        request: &[Entry],
        timeout_ms: u64,
        fence: bool,
    ) -> Result<(), ClientError> {
        self.send_request(
            &WconfdRequest::AwaitLocks {
                owner: owner.clone(),
                priority,
                request: request.to_vec(),
                timeout_ms,
                fence,
            }
            .encode(),
        )
    }

    /// The answer of a lock request: the owners blocking it (as wconfd
    /// lists them), none if it was granted.
    pub fn receive_blockers(&mut self) -> Result<Vec<Value>, ClientError> {
        match self.receive()? {
            Value::Array(blockers) => Ok(blockers),
            other => Err(self.malformed("a lock request", &other)),
        }
    }

    /// The answer of an `awaitLocks` sent with `fence`: the blockers, or
    /// the grant's token and the dead previous holders it was told of.
    pub fn receive_fenced(&mut self) -> Result<FencedAnswer, ClientError> {
        let answer = self.receive()?;
        FencedAnswer::decode(&answer)
            .ok_or_else(|| self.malformed("a fenced lock request", &answer))
    }

    // ----- luxid -----

    /// `SubmitJob`: the new job's id.
    pub fn submit_job(&mut self, ops: &Value) -> Result<JobId, ClientError> {
        let answer = self.luxi(&LuxiRequest::SubmitJob { ops: ops.clone() })?;
        answer_job_id(&answer).ok_or_else(|| self.malformed("SubmitJob", &answer))
    }

    /// `SubmitManyJobs`: per job its id, or the message it was refused
    /// with.
    pub fn submit_many_jobs(
        &mut self,
        jobs: &[Value],
    ) -> Result<Vec<Result<JobId, String>>, ClientError> {
        let answer = self.luxi(&LuxiRequest::SubmitManyJobs {
            jobs: jobs.to_vec(),
        })?;
        let decoded = answer.as_array().and_then(|entries| {
            entries
                .iter()
                .map(|entry| match entry.as_array().map(Vec::as_slice) {
                    Some([Value::Bool(true), id]) => answer_job_id(id).map(Ok),
                    Some([Value::Bool(false), message]) => Some(Err(message
                        .as_str()
                        .map_or_else(|| message.to_string(), str::to_owned))),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
        });
        decoded.ok_or_else(|| self.malformed("SubmitManyJobs", &answer))
    }

    /// `QueryJobs`: one row per id (`None`: every job), each a list of
    /// the `fields`' values.
    pub fn query_jobs(
        &mut self,
        ids: Option<&[JobId]>,
        fields: &[&'static str],
    ) -> Result<Vec<Value>, ClientError> {
        let answer = self.luxi(&LuxiRequest::QueryJobs {
            ids: ids.map(<[JobId]>::to_vec),
            fields: fields.to_vec(),
        })?;
        match answer {
            Value::Array(rows) if rows.iter().all(Value::is_array) => Ok(rows),
            other => Err(self.malformed("QueryJobs", &other)),
        }
    }

    /// Sends a `WaitForJobChange` without waiting for its answer (held
    /// for up to `timeout`); [`Client::receive_job_change`] reads it.
    pub fn send_wait_for_job_change(
        &mut self,
        id: JobId,
        fields: &[&'static str],
        previous: &Value,
        log_serial: u64,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        self.send_request(
            &LuxiRequest::WaitForJobChange {
                id,
                fields: fields.to_vec(),
                previous: previous.clone(),
                log_serial,
                timeout,
            }
            .encode(),
        )
    }

    /// The answer of a `WaitForJobChange`: the values and the newer log
    /// entries, or `None` for Ganeti's `"nochange"`.
    pub fn receive_job_change(&mut self) -> Result<Option<JobChange>, ClientError> {
        match self.receive()? {
            Value::Array(answer) => match <[Value; 2]>::try_from(answer) {
                Ok([values, Value::Array(log)]) => Ok(Some(JobChange { values, log })),
                Ok([values, log]) => {
                    Err(self.malformed("WaitForJobChange", &Value::Array(vec![values, log])))
                }
                Err(answer) => Err(self.malformed("WaitForJobChange", &Value::Array(answer))),
            },
            _ => Ok(None),
        }
    }

    /// `WaitForJobChange`: waits (at most `timeout`) until `fields` of
    /// job `id` differ from `previous` or a log entry newer than
    /// `log_serial` exists.
    pub fn wait_for_job_change(
        &mut self,
        id: JobId,
        fields: &[&'static str],
        previous: &Value,
        log_serial: u64,
        timeout: Duration,
    ) -> Result<Option<JobChange>, ClientError> {
        self.send_wait_for_job_change(id, fields, previous, log_serial, timeout)?;
        self.receive_job_change()
    }

    /// `CancelJob`: whether it was done, and luxid's message.
    pub fn cancel_job(&mut self, id: JobId, kill: bool) -> Result<(bool, String), ClientError> {
        let answer = self.luxi(&LuxiRequest::CancelJob { id, kill })?;
        self.done_and_message("CancelJob", answer)
    }

    /// `ArchiveJob`: whether the job was archived (only a finished one
    /// is).
    pub fn archive_job(&mut self, id: JobId) -> Result<bool, ClientError> {
        let answer = self.luxi(&LuxiRequest::ArchiveJob { id })?;
        Ok(answer == Value::Bool(true))
    }

    /// `AutoArchiveJobs`: the jobs archived, and those left for lack of
    /// time.
    pub fn auto_archive_jobs(
        &mut self,
        age: Option<Duration>,
        timeout: Option<Duration>,
    ) -> Result<(u64, u64), ClientError> {
        let answer = self.luxi(&LuxiRequest::AutoArchiveJobs { age, timeout })?;
        match answer.as_array().map(Vec::as_slice) {
            Some([archived, left]) => match (archived.as_u64(), left.as_u64()) {
                (Some(archived), Some(left)) => Ok((archived, left)),
                _ => Err(self.malformed("AutoArchiveJobs", &answer)),
            },
            _ => Err(self.malformed("AutoArchiveJobs", &answer)),
        }
    }

    /// `ChangeJobPriority`: whether it was done, and luxid's message.
    pub fn change_job_priority(
        &mut self,
        id: JobId,
        priority: i64,
    ) -> Result<(bool, String), ClientError> {
        let answer = self.luxi(&LuxiRequest::ChangeJobPriority { id, priority })?;
        self.done_and_message("ChangeJobPriority", answer)
    }

    /// `SetDrainFlag`.
    pub fn set_drain_flag(&mut self, drained: bool) -> Result<(), ClientError> {
        self.luxi(&LuxiRequest::SetDrainFlag { drained }).map(drop)
    }

    /// `QueryConfigValues`: one value per field (`null` for an unknown
    /// one).
    pub fn query_config_values(&mut self, fields: &[&str]) -> Result<Vec<Value>, ClientError> {
        let answer = self.luxi(&LuxiRequest::QueryConfigValues {
            fields: fields
                .iter()
                .map(|field| Some((*field).to_owned()))
                .collect(),
        })?;
        match answer {
            Value::Array(values) if values.len() == fields.len() => Ok(values),
            other => Err(self.malformed("QueryConfigValues", &other)),
        }
    }

    /// `ReplaceFilter`: the rule's uuid (a new one if `call.uuid` is
    /// `None`). A rule luxid refuses is a [`ClientError::Failed`] naming
    /// the bad part.
    pub fn replace_filter(&mut self, call: &ReplaceFilterCall) -> Result<String, ClientError> {
        match self.request(&call.encode())? {
            Value::String(uuid) => Ok(uuid),
            other => Err(self.malformed("ReplaceFilter", &other)),
        }
    }

    /// `DeleteFilter`: the rule of `uuid` removed.
    pub fn delete_filter(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.luxi(&LuxiRequest::DeleteFilter {
            uuid: uuid.to_owned(),
        })
        .map(drop)
    }

    /// `QueryFilters`: one row per rule of `uuids` (`None`: every rule),
    /// in uuid order, each a list of the `fields`' values; a uuid of no
    /// rule gives no row.
    pub fn query_filters(
        &mut self,
        uuids: Option<&[String]>,
        fields: &[&str],
    ) -> Result<Vec<Value>, ClientError> {
        let answer = self.luxi(&LuxiRequest::QueryFilters {
            uuids: uuids.map(<[String]>::to_vec),
            fields: fields.iter().map(|field| (*field).to_owned()).collect(),
        })?;
        match answer {
            Value::Array(rows)
                if rows
                    .iter()
                    .all(|row| row.as_array().is_some_and(|row| row.len() == fields.len())) =>
            {
                Ok(rows)
            }
            other => Err(self.malformed("QueryFilters", &other)),
        }
    }

    fn done_and_message(&self, method: &str, answer: Value) -> Result<(bool, String), ClientError> {
        match answer.as_array().map(Vec::as_slice) {
            Some([Value::Bool(done), Value::String(message)]) => Ok((*done, message.clone())),
            _ => Err(self.malformed(method, &answer)),
        }
    }

    fn malformed(&self, what: &str, answer: &Value) -> ClientError {
        self.protocol_error(format!(
            "{what} answered {}",
            crate::text::shortened(&answer.to_string())
        ))
    }

    /// Reads the next answer: `Ok(result)`, or the error the daemon
    /// answered. Blocks until the whole answer arrived (at most
    /// [`CLIENT_IO_TIMEOUT`] between two pieces).
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

/// The answer of a `WaitForJobChange` that saw a change (or timed out).
#[derive(Clone, Debug, PartialEq)]
pub struct JobChange {
    /// The values of the fields asked for, in their order.
    pub values: Value,
    /// The log entries newer than the serial the client had.
    pub log: Vec<Value>,
}

/// A job id in an answer.
fn answer_job_id(value: &Value) -> Option<JobId> {
    crate::protocol::luxi::parse_job_id(value)
}

/// An answer frame of `daemon` as `Ok(result)` or the error it carries.
pub fn decode_answer(daemon: &'static str, frame: &[u8]) -> Result<Value, ClientError> {
    let protocol = |message: String| ClientError::Protocol { daemon, message };
    let answer: Value =
        serde_json::from_slice(frame).map_err(|error| protocol(format!("not JSON: {error}")))?;
    // Taken apart, not cloned: an answer can be megabytes of events.
    let (success, result) = match answer {
        Value::Object(mut answer) => (
            answer.get("success").cloned(),
            answer.shift_remove("result"),
        ),
        _ => (None, None),
    };
    match (success, result) {
        (Some(Value::Bool(true)), Some(result)) => Ok(result),
        (Some(Value::Bool(false)), Some(Value::Array(error))) => {
            match <[Value; 2]>::try_from(error) {
                Ok([Value::String(class), Value::Array(args)]) => Err(ClientError::Failed {
                    daemon,
                    class,
                    args,
                }),
                Ok(error) => Err(protocol(format!(
                    "an error that is not [class, args]: {}",
                    Value::from(error.to_vec())
                ))),
                Err(error) => Err(protocol(format!(
                    "an error that is not [class, args]: {}",
                    Value::Array(error)
                ))),
            }
        }
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
    use crate::protocol::ETX;
    use serde_json::json;

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
        assert_eq!(client.echo("hi").unwrap(), "hi");
        assert_eq!(
            server.join().unwrap(),
            json!({"method": "echo", "args": ["hi"]})
        );
    }

    /// A daemon on the other end of a socket pair: reads `answers.len()`
    /// requests, answers each with the next of `answers`, and returns the
    /// requests it read.
    fn fake_daemon(
        theirs: UnixStream,
        answers: Vec<&'static str>,
    ) -> std::thread::JoinHandle<Vec<Value>> {
        std::thread::spawn(move || {
            let mut theirs = theirs;
            let mut requests = Vec::new();
            for answer in answers {
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while theirs.read(&mut byte).unwrap() == 1 && byte[0] != ETX {
                    request.push(byte[0]);
                }
                requests.push(serde_json::from_slice::<Value>(&request).unwrap());
                theirs.write_all(answer.as_bytes()).unwrap();
                theirs.write_all(&[ETX]).unwrap();
            }
            requests
        })
    }

    #[test]
    fn typed_calls_send_the_enums_encoding_and_decode_the_answers() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut client = Client {
            daemon: Daemon::Luxid,
            stream: ours,
            reader: FrameReader::new(4096),
        };
        let daemon = fake_daemon(
            theirs,
            vec![
                r#"{"success": true, "result": 7}"#,
                r#"{"success": true, "result": [[true, 8], [false, "no"]]}"#,
                r#"{"success": true, "result": [false, "Job 3 has already finished"]}"#,
                r#"{"success": true, "result": [[["running"], []]]}"#,
                r#"{"success": true, "result": "nochange"}"#,
                r#"{"success": true, "result": [2, 0]}"#,
                r#"{"success": true, "result": {"not": "a list"}}"#,
            ],
        );
        let ops = json!([{"OP_ID": "OP_TEST_DELAY", "duration": 1}]);
        assert_eq!(client.submit_job(&ops).unwrap(), 7);
        assert_eq!(
            client.submit_many_jobs(&[ops.clone(), json!([])]).unwrap(),
            vec![Ok(8), Err("no".to_owned())]
        );
        assert_eq!(
            client.cancel_job(3, true).unwrap(),
            (false, "Job 3 has already finished".to_owned())
        );
        assert_eq!(
            client.query_jobs(Some(&[3]), &["status"]).unwrap(),
            vec![json!([["running"], []])]
        );
        assert_eq!(
            client
                .wait_for_job_change(3, &["status"], &Value::Null, 0, Duration::from_secs(2))
                .unwrap(),
            None
        );
        assert_eq!(
            client
                .auto_archive_jobs(None, Some(Duration::from_millis(500)))
                .unwrap(),
            (2, 0)
        );
        assert!(matches!(
            client.query_jobs(None, &["id"]),
            Err(ClientError::Protocol { .. })
        ));
        let requests = daemon.join().unwrap();
        assert_eq!(
            requests,
            vec![
                json!({"method": "SubmitJob", "args": [ops.clone()]}),
                json!({"method": "SubmitManyJobs", "args": [[ops, []]]}),
                json!({"method": "CancelJob", "args": [3, true]}),
                json!({"method": "QueryJobs", "args": [[3], ["status"]]}),
                json!({"method": "WaitForJobChange", "args": [3, ["status"], null, 0, 2.0]}),
                json!({"method": "AutoArchiveJobs", "args": [-1, 0.5]}),
                json!({"method": "QueryJobs", "args": [null, ["id"]]}),
            ]
        );
    }

    #[test]
    fn filter_calls_send_the_rule_as_given_and_decode_the_answers() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut client = Client {
            daemon: Daemon::Luxid,
            stream: ours,
            reader: FrameReader::new(4096),
        };
        let uuid = "0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
        let daemon = fake_daemon(
            theirs,
            vec![
                r#"{"success": true, "result": "0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6"}"#,
                r#"{"success": true, "result": [["0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6", 3]]}"#,
                r#"{"success": true, "result": null}"#,
                r#"{"success": true, "result": [["too", "many", "values"]]}"#,
            ],
        );
        // Predicates luxid would refuse go as they are: luxid judges them.
        let call = ReplaceFilterCall {
            uuid: None,
            priority: 3,
            predicates: json!([["nodeid", null]]),
            action: crate::scheduling::filters::Action::RateLimit(2),
            reason: vec![json!(["warden:client:filter", "why", 1])],
        };
        assert_eq!(client.replace_filter(&call).unwrap(), uuid);
        assert_eq!(
            client.query_filters(None, &["uuid", "priority"]).unwrap(),
            vec![json!([uuid, 3])]
        );
        client.delete_filter(uuid).unwrap();
        assert!(matches!(
            client.query_filters(Some(&[uuid.to_owned()]), &["uuid"]),
            Err(ClientError::Protocol { .. })
        ));
        assert_eq!(
            daemon.join().unwrap(),
            vec![
                json!({"method": "ReplaceFilter", "args": [null, 3, [["nodeid", null]], ["RATE_LIMIT", 2], [["warden:client:filter", "why", 1]]]}),
                json!({"method": "QueryFilters", "args": [null, ["uuid", "priority"]]}),
                json!({"method": "DeleteFilter", "args": [uuid]}),
                json!({"method": "QueryFilters", "args": [[uuid], ["uuid"]]}),
            ]
        );
    }

    #[test]
    fn lock_calls_name_the_owner_as_wconfd_reads_it() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut client = Client {
            daemon: Daemon::Wconfd,
            stream: ours,
            reader: FrameReader::new(4096),
        };
        let daemon = fake_daemon(
            theirs,
            vec![
                r#"{"success": true, "result": [[1, "/l/job_000001_1", 5]]}"#,
                r#"{"success": true, "result": []}"#,
                r#"{"success": true, "result": true}"#,
            ],
        );
        let owner = Owner::job(2, "/l/job_000002_1", 6);
        let request = [Entry::shared(crate::locks::LockName::Bgl)];
        client
            .send_await_locks(&owner, -1, &request, 1000, false)
            .unwrap();
        assert_eq!(client.receive_blockers().unwrap().len(), 1);
        client.free_locks(&owner).unwrap();
        assert!(matches!(
            client.echo("x"),
            Err(ClientError::Protocol { .. })
        ));
        let requests = daemon.join().unwrap();
        assert_eq!(
            requests,
            vec![
                json!({"method": "awaitLocks", "args": [[2, "/l/job_000002_1", 6], -1, [["cluster/BGL", "shared"]], 1000]}),
                json!({"method": "freeLocks", "args": [[2, "/l/job_000002_1", 6]]}),
                json!({"method": "echo", "args": ["x"]}),
            ]
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
