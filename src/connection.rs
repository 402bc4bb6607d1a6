//! The connection layer both daemons share: the listener, accepting and
//! admitting peers, reading requests into frames, answering them strictly
//! in request order, holding a request whose answer comes later (with its
//! deadline), staging the replies of a turn until the turn is durable,
//! writing them out without blocking, half-closed and broken peers, and
//! the limits on all of it. Written once, so wconfd and luxid cannot drift
//! apart.
//!
//! A daemon drives it from its mio loop: `accept` on the listener's event,
//! `read` (with a [`Handler`] that answers each frame) on a connection's
//! event, `flush` when a connection becomes writable, `read_ready` for the
//! connections that have more to do, and `reveal` at the end of each
//! turn, once what the turn's replies reveal is durable.
//!
//! Requests are read with `MSG_PEEK` and consumed from the socket only
//! once their reply is written (or queued, if the client is slow to read):
//! consuming wakes the client's wait queue, and doing it after the reply
//! makes that one wake-up instead of two (DECISIONS D30). Bytes with no
//! reply coming this turn (part of a frame, a held request, a connection
//! whose output is backed up) are consumed at once, so a client is never
//! kept from sending by bytes the daemon already holds.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Registry, Token};
use serde_json::Value;

use crate::daemon::{self, Accepted, Admission};
use crate::limits::{CONNECTION_OUTPUT_BYTES_MAX, READ_CHUNK_BYTES};
use crate::protocol::{
    FrameReader, WireError, encode_encoded_success, encode_failure, encode_success,
};
use crate::sys::{self, PeerCredentials};

/// The listener's token; connection tokens are handed out by the daemon
/// (which also watches other descriptors).
pub const LISTENER: Token = Token(0);

/// What a daemon answers to one request.
pub enum Reply {
    /// The answer, staged until the turn is durable.
    Now(Result<Value, WireError>),
    /// The same, its result already encoded as JSON (an answer spliced
    /// from stored lines rather than built as a value).
    Encoded(Result<Vec<u8>, WireError>),
    /// Answered later with [`Connections::release`]; the connection's later
    /// requests wait. At the deadline, if still held, the connection is
    /// listed by [`Connections::expired`].
    Held(Instant),
}

/// A staged reply's result, as a value or already encoded.
enum Outcome {
    Value(Result<Value, WireError>),
    Encoded(Result<Vec<u8>, WireError>),
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub credentials: PeerCredentials,
    /// Root or the daemon's own uid: may act as any owner.
    pub privileged: bool,
}

/// A daemon's answers to requests.
pub trait Handler {
    /// Answers one complete request frame of connection `token`.
    fn handle(&mut self, token: Token, peer: Peer, frame: &[u8]) -> Reply;
}

struct Connection {
    stream: UnixStream,
    peer: Peer,
    reader: FrameReader,
    /// Replies of this turn, written once the turn is durable.
    staged: Vec<u8>,
    /// Replies released but not yet written to the socket.
    output: Vec<u8>,
    /// The generation of the request whose reply is held, if one is.
    held: Option<u64>,
    /// Requests are read with `MSG_PEEK` (`SO_PEEK_OFF` could be set) and
    /// consumed later; otherwise read plainly.
    peeking: bool,
    /// Bytes peeked (they are in `reader` or were framed) but not yet
    /// consumed from the socket.
    unconsumed: usize,
    /// Close once the output is written (frame error or peer gone).
    closing: bool,
    /// An event said the peer shut down its end: read to the end whenever
    /// it is read, since no later event comes.
    peer_closed: bool,
    writable_registered: bool,
}

/// What a daemon's state dump says of one connection.
pub struct ConnectionDump {
    pub token: Token,
    pub peer: PeerCredentials,
    pub buffered_bytes: usize,
    pub output_bytes: usize,
    pub held: bool,
}

/// The limits of one daemon's connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub frame_bytes_max: usize,
    pub connections_max: usize,
}

/// Every connection of a daemon, and its listener.
pub struct Connections {
    registry: Registry,
    admission: Admission,
    limits: Limits,
    listener: Option<UnixListener>,
    socket_path: Option<PathBuf>,
    connections: HashMap<Token, Connection>,
    /// Deadlines of held requests: (deadline, connection, generation).
    deadlines: BinaryHeap<Reverse<(Instant, Token, u64)>>,
    next_hold: u64,
    /// Connections with work left (requests behind a released hold, or a
    /// full frame buffer): read again before the turn ends.
    ready: Vec<Token>,
    /// Connections with replies staged this turn.
    turn: Vec<Token>,
    /// Connections that went away while a request of theirs was held.
    dropped_holds: Vec<Token>,
    /// Where consumed request bytes go (they were peeked already).
    discard: Vec<u8>,
}

impl Connections {
    pub fn new(registry: &Registry, admission: Admission, limits: Limits) -> io::Result<Self> {
        Ok(Connections {
            registry: registry.try_clone()?,
            admission,
            limits,
            listener: None,
            socket_path: None,
            connections: HashMap::new(),
            deadlines: BinaryHeap::new(),
            next_hold: 1,
            ready: Vec::new(),
            turn: Vec::new(),
            dropped_holds: Vec::new(),
            discard: vec![0; READ_CHUNK_BYTES],
        })
    }

    /// Binds the daemon's socket (mode 0660, given to `group` if set) and
    /// starts accepting on it.
    pub fn bind(&mut self, path: &Path, group: Option<u32>) -> io::Result<()> {
        let mut listener = daemon::bind_socket(path)?;
        if let Some(gid) = group {
            daemon::share_with_group(path, gid, 0o660)?;
        }
        self.registry
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        self.listener = Some(listener);
        self.socket_path = Some(path.to_owned());
        Ok(())
    }

    /// On stop: the socket file goes, so no client connects to a daemon
    /// that no longer answers.
    pub fn remove_socket(&self) {
        if let Some(path) = &self.socket_path {
            let _ = fs::remove_file(path);
        }
    }

    /// Accepts every connection waiting on the listener; `new_token`
    /// names each.
    pub fn accept(&mut self, mut new_token: impl FnMut() -> Token) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let (mut stream, credentials, privileged) = match daemon::accept(
                listener,
                &self.admission,
                self.connections.len(),
                self.limits.connections_max,
            ) {
                Accepted::Peer(stream, peer, privileged) => (stream, peer, privileged),
                Accepted::Refused => continue,
                Accepted::Done => return,
            };
            let token = new_token();
            if let Err(error) = self
                .registry
                .register(&mut stream, token, Interest::READABLE)
            {
                tracing::warn!(%error, "cannot register a connection");
                continue;
            }
            let peeking = match sys::enable_peek_offset(&stream) {
                Ok(()) => true,
                Err(error) => {
                    tracing::debug!(%error, "SO_PEEK_OFF refused: requests are read plainly");
                    false
                }
            };
            self.connections.insert(
                token,
                Connection {
                    stream,
                    peer: Peer {
                        credentials,
                        privileged,
                    },
                    reader: FrameReader::new(self.limits.frame_bytes_max),
                    staged: Vec::new(),
                    output: Vec::new(),
                    held: None,
                    peeking,
                    unconsumed: 0,
                    closing: false,
                    peer_closed: false,
                    writable_registered: false,
                },
            );
        }
    }

    pub fn contains(&self, token: Token) -> bool {
        self.connections.contains_key(&token)
    }

    pub fn len(&self) -> usize {
        self.connections.len()
    }

    pub fn is_empty(&self) -> bool {
        self.connections.is_empty()
    }

    /// Whether connection `token` has a held request.
    pub fn is_held(&self, token: Token) -> bool {
        self.connections
            .get(&token)
            .is_some_and(|connection| connection.held.is_some())
    }

    /// A connection's event: reads what it can and answers it (`closed`:
    /// the event said the peer shut down its end).
    pub fn event(
        &mut self,
        token: Token,
        readable: bool,
        writable: bool,
        closed: bool,
        handler: &mut impl Handler,
    ) {
        if readable || closed {
            self.read(token, closed, handler);
        }
        if writable {
            self.flush(token);
        }
    }

    /// Reads what a connection sent and answers it. Epoll is edge
    /// triggered, so the socket is read until it would block, unless the
    /// frame buffer is full and nothing in it can be answered yet (a held
    /// request, or output backed up): then the connection is read again
    /// once it moves (`ready`). A peer that shut down its end has the
    /// requests it completed answered, and is closed once they are
    /// written; a partial frame it left is dropped unanswered.
    fn read(&mut self, token: Token, closed: bool, handler: &mut impl Handler) {
        loop {
            let Some(connection) = self.connections.get_mut(&token) else {
                return;
            };
            connection.peer_closed |= closed;
            let closed = connection.peer_closed;
            let mut peer_gone = false;
            let mut full = true;
            while let Some(spare) = connection.reader.spare(READ_CHUNK_BYTES) {
                let spare_bytes = spare.len();
                let read = if connection.peeking {
                    sys::peek(&connection.stream, spare)
                } else {
                    connection.stream.read(spare)
                };
                match read {
                    Ok(0) => {
                        connection.reader.commit(spare_bytes, 0);
                        peer_gone = true;
                        full = false;
                        break;
                    }
                    Ok(read) => {
                        connection.reader.commit(spare_bytes, read);
                        if connection.peeking {
                            connection.unconsumed += read;
                        }
                        if read < spare_bytes && !closed {
                            // Drained: a short read took all there was, and
                            // epoll reports every later arrival, so the
                            // read that would only say EAGAIN is skipped.
                            // Not so once the peer shut down: no event
                            // follows its end, so it is read to the end.
                            full = false;
                            break;
                        }
                    }
                    Err(error) => {
                        connection.reader.commit(spare_bytes, 0);
                        match error.kind() {
                            io::ErrorKind::Interrupted => continue,
                            io::ErrorKind::WouldBlock => {}
                            _ => peer_gone = true,
                        }
                        full = false;
                        break;
                    }
                }
            }
            let buffered = connection.reader.buffered_bytes();
            self.process_frames(token, handler);
            if peer_gone {
                self.peer_gone(token);
                return;
            }
            let Some(connection) = self.connections.get_mut(&token) else {
                return;
            };
            // No reply of this turn to wait for: consume now.
            if connection.staged.is_empty() && consume(connection, &mut self.discard).is_err() {
                self.close(token);
                return;
            }
            if !full || connection.reader.buffered_bytes() >= buffered {
                return;
            }
        }
    }

    /// Reads again the connections that had work left; answers whether
    /// there were any.
    pub fn read_ready(&mut self, handler: &mut impl Handler) -> bool {
        let ready = std::mem::take(&mut self.ready);
        let any = !ready.is_empty();
        for token in ready {
            self.read(token, false, handler);
        }
        any
    }

    /// Whether some connection has work left for [`Connections::read_ready`].
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The client closed its end: its requests are answered, then it is
    /// closed. A held request is dropped at once.
    fn peer_gone(&mut self, token: Token) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        connection.closing = true;
        if connection.held.take().is_some() {
            self.dropped_holds.push(token);
        }
        // Closed by `flush` once every reply of its requests is written.
        self.turn.push(token);
    }

    /// Answers the complete frames of a connection, in order, until one is
    /// held or none is left.
    fn process_frames(&mut self, token: Token, handler: &mut impl Handler) {
        loop {
            let Some(connection) = self.connections.get_mut(&token) else {
                return;
            };
            // Backed-up replies pause the connection until its client
            // reads (`flush` reads it again then).
            if connection.held.is_some()
                || connection.closing
                || connection.output.len() + connection.staged.len() > CONNECTION_OUTPUT_BYTES_MAX
            {
                return;
            }
            let frame = match connection.reader.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(pid = connection.peer.credentials.pid, %error, "closing a connection");
                    connection.closing = true;
                    self.stage(
                        token,
                        Outcome::Value(Err(WireError::generic(error.to_string()))),
                    );
                    return;
                }
            };
            let peer = connection.peer;
            match handler.handle(token, peer, &frame) {
                Reply::Now(reply) => self.stage(token, Outcome::Value(reply)),
                Reply::Encoded(reply) => self.stage(token, Outcome::Encoded(reply)),
                Reply::Held(deadline) => self.hold(token, deadline),
            }
        }
    }

    fn hold(&mut self, token: Token, deadline: Instant) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        let generation = self.next_hold;
        self.next_hold += 1;
        connection.held = Some(generation);
        self.deadlines.push(Reverse((deadline, token, generation)));
    }

    /// Queues a reply of connection `token` until the turn is revealed.
    fn stage(&mut self, token: Token, reply: Outcome) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        match reply {
            Outcome::Value(Ok(value)) => encode_success(&value, &mut connection.staged),
            Outcome::Encoded(Ok(result)) => encode_encoded_success(&result, &mut connection.staged),
            Outcome::Value(Err(error)) | Outcome::Encoded(Err(error)) => {
                encode_failure(&error, &mut connection.staged)
            }
        }
        self.turn.push(token);
    }

    /// Answers the held request of connection `token` (staged like any
    /// reply of the turn, so replies leave in request order) and lets the
    /// connection's later requests go on. Nothing happens if the
    /// connection is gone or holds nothing.
    pub fn release(&mut self, token: Token, reply: Result<Value, WireError>) {
        self.release_outcome(token, Outcome::Value(reply));
    }

    /// The same, the result already encoded as JSON.
    pub fn release_encoded(&mut self, token: Token, reply: Result<Vec<u8>, WireError>) {
        self.release_outcome(token, Outcome::Encoded(reply));
    }

    fn release_outcome(&mut self, token: Token, reply: Outcome) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        if connection.held.take().is_none() {
            return;
        }
        self.stage(token, reply);
        self.ready.push(token);
    }

    /// Connections whose held request reached its deadline by `now`, each
    /// once; the caller answers them with [`Connections::release`].
    pub fn expired(&mut self, now: Instant) -> Vec<Token> {
        let mut expired = Vec::new();
        while let Some(Reverse((deadline, token, generation))) = self.deadlines.peek().copied() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            if self
                .connections
                .get(&token)
                .is_some_and(|connection| connection.held == Some(generation))
            {
                expired.push(token);
            }
        }
        expired
    }

    /// The earliest deadline of a request still held.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((deadline, token, generation))) = self.deadlines.peek() {
            let live = self
                .connections
                .get(token)
                .is_some_and(|connection| connection.held == Some(*generation));
            if live {
                return Some(*deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// Connections that went away while a request of theirs was held,
    /// since the last call.
    pub fn take_dropped_holds(&mut self) -> Vec<Token> {
        std::mem::take(&mut self.dropped_holds)
    }

    /// Writes the replies staged this turn: called once what they reveal
    /// is durable.
    pub fn reveal(&mut self) {
        let mut tokens = std::mem::take(&mut self.turn);
        tokens.sort_unstable();
        tokens.dedup();
        for token in tokens {
            if let Some(connection) = self.connections.get_mut(&token) {
                let staged = std::mem::take(&mut connection.staged);
                if connection.output.is_empty() {
                    connection.output = staged;
                } else {
                    connection.output.extend_from_slice(&staged);
                }
                self.flush(token);
            }
        }
    }

    /// The turn could not be made durable: every connection with replies
    /// staged this turn gets `error` instead, and is closed once it is
    /// written, since its replies can no longer be given in order.
    pub fn fail_turn(&mut self, error: &WireError) {
        for token in &self.turn {
            if let Some(connection) = self.connections.get_mut(token) {
                connection.staged.clear();
                connection.closing = true;
                encode_failure(error, &mut connection.staged);
            }
        }
    }

    /// Writes what a connection has to write; closes it once a closing one
    /// is done.
    pub fn flush(&mut self, token: Token) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        let before = connection.output.len();
        let written =
            daemon::write_out(&mut connection.stream, &mut connection.output).and_then(|()| {
                daemon::watch_writable(
                    &self.registry,
                    &mut connection.stream,
                    token,
                    &mut connection.writable_registered,
                    !connection.output.is_empty(),
                )
            });
        // The requests answered are consumed after their replies were
        // written, or queued for a client slow to read (holding them back
        // longer could block a client still sending into a full socket).
        let consumed = if written.is_ok() {
            consume(connection, &mut self.discard)
        } else {
            Ok(())
        };
        if written.is_err() || consumed.is_err() {
            self.close(token);
            return;
        }
        if connection.output.is_empty() {
            if connection.closing && connection.staged.is_empty() {
                self.close(token);
            } else if before > 0 && connection.reader.buffered_bytes() > 0 {
                // Answering paused while output was backed up; the socket
                // may hold more than the frame buffer took.
                self.ready.push(token);
            }
        }
    }

    fn close(&mut self, token: Token) {
        let Some(mut connection) = self.connections.remove(&token) else {
            return;
        };
        let _ = self.registry.deregister(&mut connection.stream);
        if connection.held.is_some() {
            self.dropped_holds.push(token);
        }
    }

    /// One line per connection, for a daemon's state dump: its token, its
    /// peer, what it has buffered and waiting to be written, whether a
    /// request of it is held.
    pub fn dump(&self) -> Vec<ConnectionDump> {
        self.connections
            .iter()
            .map(|(token, connection)| ConnectionDump {
                token: *token,
                peer: connection.peer.credentials,
                buffered_bytes: connection.reader.buffered_bytes(),
                output_bytes: connection.output.len(),
                held: connection.held.is_some(),
            })
            .collect()
    }
}

/// Consumes from a peeking connection's socket the bytes peeked so far
/// (the reader holds them): they are there, so the reads return at once.
fn consume(connection: &mut Connection, discard: &mut [u8]) -> io::Result<()> {
    while connection.unconsumed > 0 {
        let chunk = connection.unconsumed.min(discard.len());
        match connection.stream.read(&mut discard[..chunk]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(read) => connection.unconsumed -= read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
