//! luxid's calls to wconfd, as one more non-blocking connection in
//! luxid's loop: luxid never waits on wconfd, so a paused, overloaded or
//! restarting wconfd cannot stop luxid from answering its clients.
//!
//! The calls: `freeLocks` for the owner of a job whose runner died
//! (wconfd finds dead owners by itself too, but a job's livelock may
//! outlive its runner while its programs are killed, so luxid's word makes
//! the release immediate), and the worker registry's calls of jobs
//! (WORKERS.md). Requests wait in a bounded queue, in order; they are
//! written as the socket takes them and answered in order, each answer
//! (or refusal: retrying would be refused the same way) handed back with
//! the purpose it was made for. An answer that does not come within its
//! deadline, or a connection that breaks, drops the connection; after a
//! pause that doubles from [`WCONFD_RECONNECT_PAUSE_MIN`] to
//! [`WCONFD_RECONNECT_PAUSE_MAX`] every unanswered request is sent again
//! on a new one (every call made through a link is idempotent). A held
//! call (`watchWorkers`) holds the calls behind it, so it has a link of
//! its own.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mio::net::UnixStream;
use mio::{Interest, Registry, Token};

use crate::client::{ClientError, decode_answer};
use crate::limits::{
    READ_CHUNK_BYTES, WCONFD_ANSWER_DEADLINE, WCONFD_CALLS_QUEUED_MAX, WCONFD_RECONNECT_PAUSE_MAX,
    WCONFD_RECONNECT_PAUSE_MIN,
};
use crate::protocol::FrameReader;
use crate::protocol::wconfd::WconfdRequest;
use serde_json::Value;

/// One call and what it was made for.
struct Call<P> {
    request: WconfdRequest,
    purpose: P,
    /// How long wconfd may take to answer it once sent.
    answer_within: Duration,
}

/// An answered call: its purpose and wconfd's answer (`Err`: refused).
pub type Answered<P> = (P, Result<Value, ClientError>);

/// A connection to wconfd driven by luxid's poll.
pub struct WconfdLink<P> {
    socket: PathBuf,
    registry: Registry,
    token: Token,
    frame_bytes_max: usize,
    connection: Option<Connection>,
    /// Calls oldest first; the first `connection.sent` of them were
    /// written on the current connection.
    queue: VecDeque<Call<P>>,
    /// No connection before this (after a failure).
    retry_at: Option<Instant>,
    /// The pause before the next attempt after a failure.
    pause: Duration,
}

struct Connection {
    stream: UnixStream,
    reader: FrameReader,
    output: Vec<u8>,
    /// How many queued requests were written (or are in `output`).
    sent: usize,
    /// When the oldest unanswered request must have been answered.
    deadline: Option<Instant>,
    writable_registered: bool,
}

impl<P: std::fmt::Debug> WconfdLink<P> {
    pub fn new(
        socket: PathBuf,
        registry: &Registry,
        token: Token,
        frame_bytes_max: usize,
    ) -> io::Result<WconfdLink<P>> {
        Ok(WconfdLink {
            socket,
            registry: registry.try_clone()?,
            token,
            frame_bytes_max,
            connection: None,
            queue: VecDeque::new(),
            retry_at: None,
            pause: WCONFD_RECONNECT_PAUSE_MIN,
        })
    }

    /// Makes a call (idempotent: it may be sent again); its answer comes
    /// back from [`WconfdLink::event`] with `purpose`. Refused (and
    /// answered `false`) when too many calls wait.
    pub fn call(&mut self, request: WconfdRequest, purpose: P, now: Instant) -> bool {
        self.call_within(request, purpose, WCONFD_ANSWER_DEADLINE, now)
    }

    /// [`WconfdLink::call`] for a call wconfd may hold up to
    /// `answer_within`.
    pub fn call_within(
        &mut self,
        request: WconfdRequest,
        purpose: P,
        answer_within: Duration,
        now: Instant,
    ) -> bool {
        if self.queue.len() >= WCONFD_CALLS_QUEUED_MAX {
            tracing::warn!(
                method = request.method(),
                ?purpose,
                "too many calls wait for wconfd; this one is not made"
            );
            return false;
        }
        self.queue.push_back(Call {
            request,
            purpose,
            answer_within,
        });
        self.send(now);
        true
    }

    /// How many calls wait for their answer (or to be sent).
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// When luxid must look at the link again, if it must.
    pub fn next_wakeup(&self) -> Option<Instant> {
        match &self.connection {
            Some(connection) => connection.deadline,
            None if self.queue.is_empty() => None,
            None => self.retry_at,
        }
    }

    /// The link's socket is ready: reads answers, writes requests;
    /// answers the calls answered.
    pub fn event(&mut self, now: Instant) -> Vec<Answered<P>> {
        let mut answered = Vec::new();
        self.receive(now, &mut answered);
        self.send(now);
        answered
    }

    /// Time passed: an answer overdue drops the connection; a pause over
    /// sends the queue again.
    pub fn tick(&mut self, now: Instant) {
        let overdue = self
            .connection
            .as_ref()
            .and_then(|connection| connection.deadline)
            .is_some_and(|deadline| now >= deadline);
        if overdue {
            self.fail(
                now,
                &io::Error::new(io::ErrorKind::TimedOut, "no answer in time"),
            );
        }
        self.send(now);
    }

    /// Connects if needed and writes what the socket takes.
    fn send(&mut self, now: Instant) {
        if self.queue.is_empty() {
            return;
        }
        if self.connection.is_none() {
            if self.retry_at.is_some_and(|at| now < at) {
                return;
            }
            match self.connect() {
                Ok(connection) => self.connection = Some(connection),
                Err(error) => {
                    self.fail(now, &error);
                    return;
                }
            }
        }
        let connection = self.connection.as_mut().expect("connected above");
        for call in self.queue.iter().skip(connection.sent) {
            call.request.encode().write_frame(&mut connection.output);
            connection.sent += 1;
        }
        if connection.deadline.is_none() && connection.sent > 0 {
            connection.deadline = Some(now + self.queue[0].answer_within);
        }
        let written = crate::daemon::write_out(&mut connection.stream, &mut connection.output)
            .and_then(|()| {
                crate::daemon::watch_writable(
                    &self.registry,
                    &mut connection.stream,
                    self.token,
                    &mut connection.writable_registered,
                    !connection.output.is_empty(),
                )
            });
        if let Err(error) = written {
            self.fail(now, &error);
        }
    }

    fn connect(&self) -> io::Result<Connection> {
        let mut stream = UnixStream::connect(&self.socket)?;
        self.registry
            .register(&mut stream, self.token, Interest::READABLE)?;
        Ok(Connection {
            stream,
            reader: FrameReader::new(self.frame_bytes_max),
            output: Vec::new(),
            sent: 0,
            deadline: None,
            writable_registered: false,
        })
    }

    /// Reads the answers that arrived, in request order.
    fn receive(&mut self, now: Instant, answered: &mut Vec<Answered<P>>) {
        loop {
            let framed = match self.connection.as_mut() {
                Some(connection) => connection.reader.next_frame(),
                None => return,
            };
            match framed {
                Ok(Some(frame)) => {
                    if !self.answered(now, &frame, answered) {
                        return;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(error) => {
                    self.fail(now, &io::Error::other(error.to_string()));
                    return;
                }
            }
            let connection = self.connection.as_mut().expect("looked up above");
            let Some(spare) = connection.reader.spare(READ_CHUNK_BYTES) else {
                let error = io::Error::other("an answer longer than the frame limit");
                self.fail(now, &error);
                return;
            };
            let spare_bytes = spare.len();
            let read = connection.stream.read(spare);
            connection
                .reader
                .commit(spare_bytes, *read.as_ref().unwrap_or(&0));
            match read {
                Ok(0) => {
                    self.fail(now, &io::Error::from(io::ErrorKind::UnexpectedEof));
                    return;
                }
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.fail(now, &error);
                    return;
                }
            }
        }
    }

    /// The answer to the oldest request sent; false if the connection was
    /// dropped.
    fn answered(&mut self, now: Instant, frame: &[u8], answered: &mut Vec<Answered<P>>) -> bool {
        let Some(call) = self.queue.pop_front() else {
            self.fail(now, &io::Error::other("an answer to no request"));
            return false;
        };
        match decode_answer("wconfd", frame) {
            Ok(value) => answered.push((call.purpose, Ok(value))),
            Err(error @ ClientError::Failed { .. }) => answered.push((call.purpose, Err(error))),
            Err(error) => {
                // Not an answer: the request goes again.
                self.queue.push_front(call);
                self.fail(now, &io::Error::other(error.to_string()));
                return false;
            }
        }
        self.pause = WCONFD_RECONNECT_PAUSE_MIN;
        let connection = self
            .connection
            .as_mut()
            .expect("answers come on a connection");
        connection.sent = connection.sent.saturating_sub(1);
        connection.deadline = (connection.sent > 0).then(|| now + self.queue[0].answer_within);
        true
    }

    /// Drops the connection; everything unanswered goes again after the
    /// pause.
    fn fail(&mut self, now: Instant, error: &io::Error) {
        if let Some(mut connection) = self.connection.take() {
            let _ = self.registry.deregister(&mut connection.stream);
        }
        if !self.queue.is_empty() {
            tracing::warn!(
                %error,
                waiting = self.queue.len(),
                pause_ms = self.pause.as_millis() as u64,
                "cannot reach wconfd; its calls wait and go again"
            );
        }
        self.retry_at = Some(now + self.pause);
        self.pause = (self.pause * 2).min(WCONFD_RECONNECT_PAUSE_MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::{UnixListener, UnixStream as StdStream};

    use super::*;
    use crate::locks::Owner;
    use crate::protocol::{ETX, parse_request};

    /// The next request a fake wconfd reads on `stream`.
    fn read_request(stream: &mut StdStream) -> crate::protocol::Request {
        let mut frame = Vec::new();
        let mut byte = [0u8; 1];
        while stream.read(&mut byte).expect("a request") == 1 && byte[0] != ETX {
            frame.push(byte[0]);
        }
        parse_request(&frame).expect("a request")
    }

    #[test]
    fn an_unanswered_call_is_sent_again_on_a_new_connection_until_answered() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let socket = dir.path().join("wconfd.sock");
        let listener = UnixListener::bind(&socket).expect("bind");
        let poll = mio::Poll::new().expect("a poll");
        let mut link: WconfdLink<u32> =
            WconfdLink::new(socket, poll.registry(), Token(7), 1 << 20).expect("a link");
        let owner = Owner::job(3, "/l/job_000003_1", 42);
        let start = Instant::now();
        link.call(
            WconfdRequest::FreeLocks {
                owner: owner.clone(),
            },
            1,
            start,
        );
        let (mut hung, _) = listener.accept().expect("the first connection");
        let request = read_request(&mut hung);
        assert_eq!(request.method, "freeLocks");
        assert_eq!(
            request.args,
            WconfdRequest::FreeLocks {
                owner: owner.clone()
            }
            .encode()
            .args
        );
        // No answer: nothing happens before the deadline, then the link
        // drops the connection and, after its pause, asks again.
        link.tick(start + WCONFD_ANSWER_DEADLINE / 2);
        assert_eq!(link.waiting(), 1);
        let overdue = start + WCONFD_ANSWER_DEADLINE;
        link.tick(overdue);
        let mut end = [0u8; 1];
        assert_eq!(hung.read(&mut end).expect("the end"), 0, "dropped");
        assert_eq!(
            link.next_wakeup(),
            Some(overdue + WCONFD_RECONNECT_PAUSE_MIN)
        );
        link.tick(overdue + WCONFD_RECONNECT_PAUSE_MIN);
        let (mut answering, _) = listener.accept().expect("the second connection");
        assert_eq!(read_request(&mut answering).method, "freeLocks");
        answering
            .write_all(b"{\"success\": true, \"result\": []}\x03")
            .expect("answer");
        let answers = link.event(overdue + WCONFD_RECONNECT_PAUSE_MIN);
        assert!(matches!(answers.as_slice(), [(1, Ok(_))]), "{answers:?}");
        assert_eq!(link.waiting(), 0);
        assert_eq!(link.next_wakeup(), None);
    }

    #[test]
    fn a_refused_call_is_dropped_and_an_absent_wconfd_is_retried() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let socket = dir.path().join("wconfd.sock");
        let poll = mio::Poll::new().expect("a poll");
        let mut link: WconfdLink<u32> =
            WconfdLink::new(socket.clone(), poll.registry(), Token(7), 1 << 20).expect("a link");
        let now = Instant::now();
        // Nobody listens: the call waits, with a doubling pause.
        let owner = Owner::job(1, "/l/a", 1);
        link.call(WconfdRequest::FreeLocks { owner }, 2, now);
        assert_eq!(link.waiting(), 1);
        assert_eq!(link.next_wakeup(), Some(now + WCONFD_RECONNECT_PAUSE_MIN));
        link.tick(now + WCONFD_RECONNECT_PAUSE_MIN);
        assert_eq!(
            link.next_wakeup(),
            Some(now + WCONFD_RECONNECT_PAUSE_MIN + WCONFD_RECONNECT_PAUSE_MIN * 2)
        );
        let listener = UnixListener::bind(&socket).expect("bind");
        let later = now + Duration::from_secs(1);
        link.tick(later);
        let (mut wconfd, _) = listener.accept().expect("a connection");
        assert_eq!(read_request(&mut wconfd).method, "freeLocks");
        wconfd
            .write_all(b"{\"success\": false, \"result\": [\"GenericError\", [\"no\"]]}\x03")
            .expect("answer");
        let answers = link.event(later);
        assert!(
            matches!(answers.as_slice(), [(2, Err(ClientError::Failed { .. }))]),
            "{answers:?}"
        );
        assert_eq!(link.waiting(), 0, "a refusal is not retried");
    }
}
