//! wconfd's event loop: one thread, one mio `Poll`, turns of
//! read → apply → commit → reveal.
//!
//! Each turn reads every ready connection and runs the complete requests
//! through the lock core; state changes go to the journal. At the end of
//! the turn the journal records of the turn are made durable in one write
//! (group commit), on the loop itself, and only then are replies written,
//! held `awaitLocks` replies released and SIGHUPs sent: nothing a client
//! sees is ahead of the disk. Requests that arrive meanwhile wait in their
//! sockets and share the next turn's write.
//!
//! Requests are read with `MSG_PEEK` and consumed from the socket only
//! once their reply is written (or queued, if the client is slow to read):
//! consuming wakes the client's wait queue, and doing it after the reply
//! makes that one wake-up instead of two. Bytes with no reply coming this
//! turn (part of a frame, a held `awaitLocks`, a connection whose output
//! is backed up) are consumed at once, so a client is never kept from
//! sending by bytes the daemon already holds.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{UnixListener, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR2};
use signal_hook_mio::v1_0::Signals;

use super::{DaemonError, io_error, unix_now};
use crate::daemon::{self, Admission};
use crate::liveness::{self, Livelock};
use crate::locks::{Entry, Level, LockManager, LockName, LockOp, Mode, OpOutcome, Owner, Priority};
use crate::protocol::wconfd::{
    DecodeLimits, WconfdRequest, encode_lock_modes, encode_locks, encode_locks_owners,
    encode_owners, encode_pending, encode_waiter, lock_error,
};
use crate::protocol::{FrameReader, WireError, encode_failure, encode_success, parse_request};
use crate::settings::Settings;
use crate::store::config::{ConfigStore, ConfigWriteError, verify};
use crate::store::lock_state::LockStore;
use crate::sys::{self, PeerCredentials};

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const FIRST_DYNAMIC_TOKEN: usize = 2;

/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Longest `awaitLocks` timeout: an hour; a runner that waits longer asks
/// again.
pub const AWAIT_TIMEOUT_MS_MAX: u64 = 3_600_000;

struct Connection {
    stream: UnixStream,
    peer: PeerCredentials,
    /// Root or the daemon's own uid: may act as any owner.
    privileged: bool,
    reader: FrameReader,
    /// Replies of this turn, released once the turn is durable.
    staged: Vec<u8>,
    /// Replies released but not yet written to the socket.
    output: Vec<u8>,
    /// The owner whose `awaitLocks` reply is held; later requests wait.
    held: Option<Arc<Owner>>,
    /// Requests are read with `MSG_PEEK` (`SO_PEEK_OFF` could be set) and
    /// consumed later; otherwise read plainly.
    peeking: bool,
    /// Bytes peeked (they are in `reader` or were framed) but not yet
    /// consumed from the socket.
    unconsumed: usize,
    /// Close once the output is written (frame error or peer gone).
    closing: bool,
    writable_registered: bool,
}

struct Await {
    token: Token,
    request: Vec<Entry>,
}

/// A pidfd watching the process of some owners.
struct PidWatch {
    fd: OwnedFd,
    token: Token,
    owners: HashSet<Arc<Owner>>,
}

/// What one turn revealed, sent once its journal records are durable.
struct Reveal {
    replies: Vec<(Token, Vec<u8>)>,
    sighups: Vec<Arc<Owner>>,
}

/// What a request answers now, or later (a held `awaitLocks`).
enum Reply {
    Now(Result<Value, WireError>),
    Held,
}

pub struct Server {
    poll: Poll,
    listener: Option<UnixListener>,
    socket_path: Option<PathBuf>,
    signals: Signals,
    settings: Settings,
    limits: DecodeLimits,
    admission: Admission,
    group_gid: Option<u32>,
    livelock_dir: PathBuf,
    livelock: Livelock,
    _instance_lock: File,
    store: LockStore,
    manager: LockManager,
    config: ConfigStore,
    connections: HashMap<Token, Connection>,
    next_token: usize,
    awaits: HashMap<Arc<Owner>, Await>,
    await_deadlines: BinaryHeap<Reverse<(Instant, Arc<Owner>, Token)>>,
    pid_watches: HashMap<u32, PidWatch>,
    pid_tokens: HashMap<Token, u32>,
    waiting_since: HashMap<Arc<Owner>, Instant>,
    next_death_check: Instant,
    /// Connections with complete frames left to process (after an await
    /// was released).
    ready: Vec<Token>,
    /// Owners to probe at once (their process was seen to exit).
    suspects: Vec<Arc<Owner>>,
    /// Where consumed request bytes go (they were peeked already).
    discard: Vec<u8>,
    /// Turns whose journal records were written, for the dump.
    commits: u64,
    // What the current turn did, settled in `finish_turn`.
    turn_granted: Vec<Arc<Owner>>,
    turn_owners: Vec<Arc<Owner>>,
    turn_connections: Vec<Token>,
    stopping: bool,
}

impl Server {
    pub(super) fn new(
        settings: Settings,
        store: LockStore,
        manager: LockManager,
        config: ConfigStore,
        livelock: Livelock,
        livelock_dir: PathBuf,
        instance_lock: File,
    ) -> Result<Server, DaemonError> {
        let poll = Poll::new().map_err(io_error("cannot create", Path::new("epoll")))?;
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR2, SIGHUP])
            .map_err(io_error("cannot handle signals", Path::new("-")))?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(io_error("cannot register", Path::new("signals")))?;
        let group_gid = match &settings.wconfd.socket_group {
            Some(group) => Some(group.gid()?),
            None => None,
        };
        let limits = DecodeLimits {
            request_entries_max: settings.wconfd.request_entries_max,
            await_timeout_ms_max: AWAIT_TIMEOUT_MS_MAX,
        };
        let next_death_check = Instant::now() + settings.wconfd.death_check_interval();
        Ok(Server {
            poll,
            listener: None,
            socket_path: None,
            signals,
            settings,
            limits,
            admission: Admission::new(group_gid),
            group_gid,
            livelock_dir,
            livelock,
            _instance_lock: instance_lock,
            store,
            manager,
            config,
            connections: HashMap::new(),
            next_token: FIRST_DYNAMIC_TOKEN,
            awaits: HashMap::new(),
            await_deadlines: BinaryHeap::new(),
            pid_watches: HashMap::new(),
            pid_tokens: HashMap::new(),
            waiting_since: HashMap::new(),
            next_death_check,
            ready: Vec::new(),
            suspects: Vec::new(),
            discard: vec![0; READ_CHUNK_BYTES],
            commits: 0,
            turn_granted: Vec::new(),
            turn_owners: Vec::new(),
            turn_connections: Vec::new(),
            stopping: false,
        })
    }

    /// Start-up cleaning: frees every owner whose livelock is dead, makes
    /// that durable, tells the waiters it granted, removes stale livelock
    /// files, and starts watching the processes of the owners left.
    pub(super) fn recover(&mut self) -> Result<(), DaemonError> {
        let owners = self.manager.owners();
        let freed = self.free_dead(&owners);
        if freed > 0 {
            tracing::info!(freed, "freed owners that died while wconfd was down");
        }
        self.remove_stale_livelocks();
        self.finish_turn()?;
        self.drain()?;
        for owner in self.manager.owners() {
            self.watch(&owner);
        }
        let now = Instant::now();
        for waiter in self.manager.list_pending() {
            self.waiting_since.insert(waiter.owner, now);
        }
        Ok(())
    }

    pub(super) fn bind(&mut self, path: &Path) -> Result<(), DaemonError> {
        let mut listener = daemon::bind_socket(path).map_err(io_error("cannot bind", path))?;
        if let Some(gid) = self.group_gid {
            super::share_with_group(path, gid, 0o660)?;
        }
        self.poll
            .registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(io_error("cannot register", path))?;
        self.listener = Some(listener);
        self.socket_path = Some(path.to_owned());
        Ok(())
    }

    /// Serves until SIGTERM or SIGINT.
    pub fn serve(mut self) -> Result<(), DaemonError> {
        let mut events = Events::with_capacity(1024);
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
                    LISTENER => self.accept(),
                    SIGNALS => self.handle_signals(),
                    token if self.pid_tokens.contains_key(&token) => self.process_exited(token),
                    token => {
                        if event.is_readable() || event.is_read_closed() {
                            self.read(token);
                        }
                        if event.is_writable() {
                            self.flush(token);
                        }
                    }
                }
            }
            for token in std::mem::take(&mut self.ready) {
                self.read(token);
            }
            let now = Instant::now();
            self.expire_awaits(now);
            let suspects = std::mem::take(&mut self.suspects);
            if !suspects.is_empty() {
                self.free_dead(&suspects);
            }
            if now >= self.next_death_check {
                self.check_all_owners();
                self.next_death_check = now + self.settings.wconfd.death_check_interval();
            }
            self.finish_turn()?;
        }
        self.drain()?;
        if let Some(path) = &self.socket_path {
            let _ = fs::remove_file(path);
        }
        tracing::info!("wconfd stopped");
        Ok(())
    }

    fn next_wakeup(&mut self) -> Option<Duration> {
        if !self.ready.is_empty() || !self.suspects.is_empty() {
            return Some(Duration::ZERO);
        }
        let now = Instant::now();
        let mut wake = self.next_death_check;
        while let Some(Reverse((deadline, owner, token))) = self.await_deadlines.peek() {
            let live = self
                .awaits
                .get(owner)
                .is_some_and(|waiting| waiting.token == *token);
            if live {
                wake = wake.min(*deadline);
                break;
            }
            self.await_deadlines.pop();
        }
        Some(wake.saturating_duration_since(now))
    }

    // ----- connections -----

    fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let (mut stream, peer, privileged) = match daemon::accept(
                listener,
                &self.admission,
                self.connections.len(),
                self.settings.wconfd.connections_max,
            ) {
                daemon::Accepted::Peer(stream, peer, privileged) => (stream, peer, privileged),
                daemon::Accepted::Refused => continue,
                daemon::Accepted::Done => return,
            };
            let token = Token(self.next_token);
            self.next_token += 1;
            if let Err(error) =
                self.poll
                    .registry()
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
                    peer,
                    privileged,
                    reader: FrameReader::new(self.settings.wconfd.frame_bytes_max),
                    staged: Vec::new(),
                    output: Vec::new(),
                    held: None,
                    peeking,
                    unconsumed: 0,
                    closing: false,
                    writable_registered: false,
                },
            );
        }
    }

    /// Reads what a connection sent and answers it. Epoll is edge
    /// triggered, so the socket is read until it would block, unless the
    /// frame buffer is full and nothing in it can be answered yet (a held
    /// `awaitLocks`, or output backed up): then the connection is read
    /// again once it moves (`ready`).
    fn read(&mut self, token: Token) {
        loop {
            let Some(connection) = self.connections.get_mut(&token) else {
                return;
            };
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
                        if read < spare_bytes {
                            // Drained: a short read took all there was, and
                            // epoll reports every later arrival, so the
                            // read that would only say EAGAIN is skipped.
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
            self.process_frames(token);
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

    /// The client closed its end: answer what it sent, then close. A held
    /// `awaitLocks` is dropped at once (its owner is told by SIGHUP).
    fn peer_gone(&mut self, token: Token) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        connection.closing = true;
        if let Some(owner) = connection.held.take()
            && self
                .awaits
                .get(&owner)
                .is_some_and(|waiting| waiting.token == token)
        {
            self.awaits.remove(&owner);
        }
        // Closed by `flush` once every reply of its requests is written.
        self.turn_connections.push(token);
    }

    /// Answers the complete frames of a connection, in order, until one is
    /// held or none is left.
    fn process_frames(&mut self, token: Token) {
        loop {
            let Some(connection) = self.connections.get_mut(&token) else {
                return;
            };
            if connection.held.is_some()
                || connection.closing
                || connection.output.len() + connection.staged.len()
                    > crate::limits::CONNECTION_OUTPUT_BYTES_MAX
            {
                return;
            }
            let frame = match connection.reader.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(pid = connection.peer.pid, %error, "closing a connection");
                    connection.closing = true;
                    self.stage(token, Err(WireError::generic(error.to_string())));
                    return;
                }
            };
            match self.handle_frame(token, &frame) {
                Reply::Now(reply) => self.stage(token, reply),
                Reply::Held => {}
            }
        }
    }

    /// Queues a reply until the turn is durable.
    fn stage(&mut self, token: Token, reply: Result<Value, WireError>) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        match &reply {
            Ok(value) => encode_success(value, &mut connection.staged),
            Err(error) => encode_failure(error, &mut connection.staged),
        }
        self.turn_connections.push(token);
    }

    fn flush(&mut self, token: Token) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        let before = connection.output.len();
        let written =
            daemon::write_out(&mut connection.stream, &mut connection.output).and_then(|()| {
                daemon::watch_writable(
                    self.poll.registry(),
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
                // Answering paused while output was backed up.
                self.ready.push(token);
            }
        }
    }

    fn close(&mut self, token: Token) {
        let Some(mut connection) = self.connections.remove(&token) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut connection.stream);
        if let Some(owner) = connection.held.take()
            && self
                .awaits
                .get(&owner)
                .is_some_and(|waiting| waiting.token == token)
        {
            // The request stays pending; its owner is told by SIGHUP.
            self.awaits.remove(&owner);
        }
    }

    // ----- requests -----

    fn handle_frame(&mut self, token: Token, frame: &[u8]) -> Reply {
        let request = match parse_request(frame) {
            Ok(request) => request,
            Err(error) => return Reply::Now(Err(error)),
        };
        let request = match WconfdRequest::decode(&request, &self.limits) {
            Ok(request) => request,
            Err(error) => return Reply::Now(Err(error)),
        };
        if let Some(owner) = request.owner()
            && let Err(error) = self.check_owner(token, owner)
        {
            return Reply::Now(Err(error));
        }
        self.dispatch(token, request)
    }

    /// An owner must have its livelock in the livelock directory, and an
    /// unprivileged peer may act only as owners of its own pid.
    fn check_owner(&self, token: Token, owner: &Owner) -> Result<(), WireError> {
        if !liveness::livelock_path_allowed(&self.livelock_dir, &owner.livelock) {
            return Err(WireError::generic(format!(
                "livelock path {:?} is not a file directly in {}",
                owner.livelock,
                self.livelock_dir.display()
            )));
        }
        let connection = &self.connections[&token];
        if !connection.privileged && owner.pid != connection.peer.pid {
            return Err(WireError::generic(format!(
                "permission denied: process {} may act only as owners with its own pid, not {}",
                connection.peer.pid, owner.pid
            )));
        }
        Ok(())
    }

    fn dispatch(&mut self, token: Token, request: WconfdRequest) -> Reply {
        use WconfdRequest as R;
        let reply = match request {
            R::Echo(text) => Ok(Value::String(text)),
            R::CleanupLocks => {
                self.check_all_owners();
                Ok(json!([]))
            }
            R::ReadConfig => Ok(self.config.config().clone()),
            R::VerifyConfig => {
                let problems = verify(self.config.config());
                if problems.is_empty() {
                    Ok(json!([]))
                } else {
                    Err(config_verify_error(problems))
                }
            }
            R::FlushConfig => Ok(json!([])), // config.data is durable at every write
            R::LockConfig { owner, shared } => self.lock_config(owner, shared),
            R::UnlockConfig { owner } => {
                self.run(LockOp::FreeLocksLevel {
                    owner,
                    level: Level::Config,
                });
                Ok(json!([]))
            }
            R::WriteConfig { owner, config } => {
                if !self.holds_config_exclusively(&owner) {
                    Err(WireError::generic(
                        "Requested lock exclusive on the configuration missing",
                    ))
                } else {
                    self.write_config(config).map(|()| json!([]))
                }
            }
            R::WriteConfigAndUnlock { owner, config } => {
                if !self.holds_config_exclusively(&owner) {
                    tracing::warn!(%owner, "writeConfigAndUnlock without holding the config lock");
                    Ok(json!(false))
                } else {
                    self.write_config(config).map(|()| {
                        self.run(LockOp::FreeLocksLevel {
                            owner,
                            level: Level::Config,
                        });
                        json!(true)
                    })
                }
            }
            R::ListLocks { owner } => Ok(encode_lock_modes(&self.manager.list_locks(&owner))),
            R::ListAllLocks => Ok(encode_locks(&self.manager.list_all_locks())),
            R::ListAllLocksOwners => Ok(encode_locks_owners(&self.manager.list_all_locks_owners())),
            R::ListLocksWaitingStatus => Ok(json!([
                encode_locks_owners(&self.manager.list_all_locks_owners()),
                encode_pending(&self.manager.list_pending())
            ])),
            R::ListWaiters => Ok(self.list_waiters()),
            R::HasPendingRequest { owner } => Ok(json!(self.manager.has_pending_request(&owner))),
            R::TryUpdateLocks { owner, request } => {
                update_reply(self.run(LockOp::TryUpdate { owner, request }))
            }
            R::UpdateLocksWaiting {
                owner,
                priority,
                request,
            } => update_reply(self.run(LockOp::UpdateWaiting {
                owner,
                priority,
                request,
            })),
            R::AwaitLocks {
                owner,
                priority,
                request,
                timeout_ms,
            } => return self.await_locks(token, owner, priority, request, timeout_ms),
            R::FreeLocks { owner } => {
                self.run(LockOp::FreeLocks { owner });
                Ok(json!([]))
            }
            R::FreeLocksLevel { owner, level } => {
                self.run(LockOp::FreeLocksLevel { owner, level });
                Ok(json!([]))
            }
            R::DownGradeLocksLevel { owner, level } => {
                self.run(LockOp::DowngradeLocksLevel { owner, level });
                Ok(json!([]))
            }
            R::IntersectLocks { owner, locks } => {
                self.run(LockOp::IntersectLocks { owner, keep: locks });
                Ok(json!([]))
            }
            R::OpportunisticLockUnion { owner, wanted } => {
                acquired_reply(self.run(LockOp::OpportunisticUnion { owner, wanted }))
            }
            R::GuardedOpportunisticLockUnion {
                count,
                owner,
                wanted,
            } => acquired_reply(self.run(LockOp::GuardedOpportunisticUnion {
                count,
                owner,
                wanted,
            })),
        };
        Reply::Now(reply)
    }

    /// Runs one lock operation: the one way the state changes.
    fn run(&mut self, op: LockOp) -> OpOutcome {
        let before = self.manager.changes();
        let outcome = self.manager.apply(&op);
        if self.manager.changes() != before {
            self.store.record(&op);
        }
        self.turn_granted.extend(outcome.granted().iter().cloned());
        self.turn_owners.push(Arc::new(op.owner().clone()));
        outcome
    }

    /// Whether `owner` may write the configuration.
    fn holds_config_exclusively(&self, owner: &Owner) -> bool {
        self.manager.mode_held(owner, &LockName::Config) == Some(Mode::Exclusive)
    }

    fn lock_config(&mut self, owner: Owner, shared: bool) -> Result<Value, WireError> {
        let mode = if shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        if self.manager.mode_held(&owner, &LockName::Config) >= Some(mode) {
            tracing::warn!(%owner, "asked to lock the config while owning the lock");
            return Ok(self.config.config().clone());
        }
        let entry = Entry::new(LockName::Config, crate::locks::Action::Acquire(mode));
        match self.run(LockOp::TryUpdate {
            owner,
            request: vec![entry],
        }) {
            OpOutcome::Update(Ok(update)) if update.blockers.is_empty() => {
                Ok(self.config.config().clone())
            }
            OpOutcome::Update(Ok(_)) => Ok(Value::Null),
            OpOutcome::Update(Err(error)) => Err(lock_error(&error)),
            OpOutcome::Freed(_) | OpOutcome::Acquired(_) => {
                unreachable!("a TryUpdate answers an Update")
            }
        }
    }

    fn write_config(&mut self, config: Value) -> Result<(), WireError> {
        match self.config.write(config, unix_now()) {
            Ok(changed) => {
                if changed {
                    tracing::info!(serial_no = self.config.serial_no(), "config.data written");
                }
                Ok(())
            }
            Err(ConfigWriteError::Invalid(problems)) => Err(config_verify_error(problems)),
            Err(ConfigWriteError::Io(error)) => {
                tracing::error!(%error, "cannot write config.data");
                Err(WireError::generic(format!(
                    "cannot write {}: {error}",
                    self.config.path().display()
                )))
            }
        }
    }

    fn await_locks(
        &mut self,
        token: Token,
        owner: Owner,
        priority: Priority,
        request: Vec<Entry>,
        timeout_ms: u64,
    ) -> Reply {
        let outcome = self.run(LockOp::UpdateWaiting {
            owner: owner.clone(),
            priority,
            request: request.clone(),
        });
        let blockers = match outcome {
            OpOutcome::Update(Ok(update)) => update.blockers,
            OpOutcome::Update(Err(error)) => return Reply::Now(Err(lock_error(&error))),
            OpOutcome::Freed(_) | OpOutcome::Acquired(_) => {
                unreachable!("an UpdateWaiting answers an Update")
            }
        };
        if blockers.is_empty() || timeout_ms == 0 {
            return Reply::Now(Ok(encode_owners(&blockers)));
        }
        let owner = Arc::new(owner);
        // A re-sent await (a client that reconnected) replaces the old one,
        // which is answered as if it had timed out.
        if let Some(previous) = self.awaits.remove(&owner) {
            self.release_await(previous.token, &owner, Ok(encode_owners(&blockers)));
        }
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        self.await_deadlines
            .push(Reverse((deadline, Arc::clone(&owner), token)));
        if let Some(connection) = self.connections.get_mut(&token) {
            connection.held = Some(Arc::clone(&owner));
        }
        self.awaits.insert(owner, Await { token, request });
        Reply::Held
    }

    /// Answers a held `awaitLocks` and lets its connection go on.
    fn release_await(&mut self, token: Token, owner: &Owner, reply: Result<Value, WireError>) {
        let Some(connection) = self.connections.get_mut(&token) else {
            return;
        };
        if connection.held.as_deref() != Some(owner) {
            return;
        }
        connection.held = None;
        self.stage(token, reply);
        self.ready.push(token);
    }

    fn expire_awaits(&mut self, now: Instant) {
        while let Some(Reverse((deadline, owner, token))) = self.await_deadlines.peek() {
            if *deadline > now {
                break;
            }
            let (owner, token) = (Arc::clone(owner), *token);
            self.await_deadlines.pop();
            if self
                .awaits
                .get(&owner)
                .is_none_or(|waiting| waiting.token != token)
            {
                continue;
            }
            let waiting = self.awaits.remove(&owner).expect("just looked up");
            let blockers = self.manager.blockers(&owner, &waiting.request);
            self.release_await(token, &owner, Ok(encode_owners(&blockers)));
        }
    }

    // ----- liveness -----

    /// Frees every owner of `owners` whose livelock is dead, and removes
    /// the dead livelock files no remaining owner names; answers how many
    /// owners were freed.
    fn free_dead(&mut self, owners: &[Arc<Owner>]) -> usize {
        let mut dead_livelocks: HashSet<&str> = HashSet::new();
        let mut freed = 0;
        for owner in owners {
            if !self.manager.has_owner(owner) {
                continue;
            }
            if liveness::is_dead(Path::new(&owner.livelock)) {
                let held = self.manager.list_locks(owner).len();
                let waited = self.manager.has_pending_request(owner);
                tracing::info!(%owner, held, waited, "owner is dead: freeing its locks");
                self.run(LockOp::FreeLocks {
                    owner: Owner::clone(owner),
                });
                dead_livelocks.insert(&owner.livelock);
                freed += 1;
            }
        }
        if !dead_livelocks.is_empty() {
            let still_named: HashSet<String> = self
                .manager
                .owners()
                .iter()
                .map(|owner| owner.livelock.clone())
                .collect();
            for livelock in &dead_livelocks {
                if still_named.contains(*livelock) {
                    continue;
                }
                let path = Path::new(livelock);
                match liveness::remove_dead_livelock(&self.livelock_dir, path) {
                    Ok(true) => tracing::debug!(path = %path.display(), "removed a dead livelock"),
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(path = %path.display(), %error, "cannot remove a dead livelock")
                    }
                }
            }
        }
        freed
    }

    fn check_all_owners(&mut self) {
        let owners = self.manager.owners();
        self.free_dead(&owners);
        self.remove_stale_livelocks();
        self.prune_watches();
    }

    fn remove_stale_livelocks(&mut self) {
        let mut referenced: HashSet<PathBuf> = self
            .manager
            .owners()
            .iter()
            .map(|owner| PathBuf::from(&owner.livelock))
            .collect();
        referenced.insert(self.livelock.path().to_owned());
        match liveness::remove_stale_livelocks(&self.livelock_dir, &referenced) {
            Ok(removed) => {
                for path in removed {
                    tracing::info!(path = %path.display(), "removed a stale livelock");
                }
            }
            Err(error) => tracing::warn!(%error, "cannot clean the livelock directory"),
        }
    }

    /// Watches the process of an owner, so its exit is noticed at once.
    fn watch(&mut self, owner: &Arc<Owner>) {
        if let Some(watch) = self.pid_watches.get_mut(&owner.pid) {
            watch.owners.insert(Arc::clone(owner));
            return;
        }
        let fd = match sys::pidfd_open(owner.pid) {
            Ok(fd) => fd,
            Err(error) if error.raw_os_error() == Some(nix::libc::ESRCH) => {
                self.suspects.push(Arc::clone(owner));
                return;
            }
            Err(error) => {
                tracing::warn!(%owner, %error, "cannot watch the owner's process; the periodic check covers it");
                return;
            }
        };
        let token = Token(self.next_token);
        self.next_token += 1;
        if let Err(error) =
            self.poll
                .registry()
                .register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)
        {
            tracing::warn!(%owner, %error, "cannot watch the owner's process");
            return;
        }
        self.pid_tokens.insert(token, owner.pid);
        self.pid_watches.insert(
            owner.pid,
            PidWatch {
                fd,
                token,
                owners: HashSet::from([Arc::clone(owner)]),
            },
        );
    }

    /// Forgets watched owners that went away, and the watches left empty.
    fn prune_watches(&mut self) {
        let manager = &self.manager;
        let mut empty = Vec::new();
        for (pid, watch) in &mut self.pid_watches {
            watch.owners.retain(|owner| manager.has_owner(owner));
            if watch.owners.is_empty() {
                empty.push(*pid);
            }
        }
        for pid in empty {
            let watch = self.pid_watches.remove(&pid).expect("just listed");
            self.drop_watch(watch);
        }
    }

    fn drop_watch(&mut self, watch: PidWatch) {
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&watch.fd.as_raw_fd()));
        self.pid_tokens.remove(&watch.token);
    }

    /// A watched process exited: probe its owners now.
    fn process_exited(&mut self, token: Token) {
        let Some(pid) = self.pid_tokens.get(&token).copied() else {
            return;
        };
        let watch = self
            .pid_watches
            .remove(&pid)
            .expect("tokens and watches agree");
        let owners: Vec<Arc<Owner>> = watch.owners.iter().cloned().collect();
        self.drop_watch(watch);
        self.free_dead(&owners);
    }

    // ----- end of turn -----

    /// Ends a turn: settles its grants and watches, makes its journal
    /// records durable in one write, then reveals what it answered
    /// (replies, released awaits, SIGHUPs). The write happens on the loop:
    /// requests arriving meanwhile wait in their sockets and are all read
    /// by the next turn, which shares one write among them (DECISIONS D29).
    fn finish_turn(&mut self) -> Result<(), DaemonError> {
        let now = Instant::now();
        let mut sighups = Vec::new();
        for owner in std::mem::take(&mut self.turn_granted) {
            self.waiting_since.remove(&owner);
            match self.awaits.remove(&owner) {
                Some(waiting) => self.release_await(waiting.token, &owner, Ok(json!([]))),
                None => sighups.push(owner),
            }
        }
        for owner in std::mem::take(&mut self.turn_owners) {
            let pending = self.manager.has_pending_request(&owner);
            if pending {
                self.waiting_since.entry(Arc::clone(&owner)).or_insert(now);
            } else {
                self.waiting_since.remove(&owner);
                if let Some(waiting) = self.awaits.remove(&owner) {
                    self.release_await(
                        waiting.token,
                        &owner,
                        Err(WireError::generic(
                            "the pending request was dropped (its locks were freed)",
                        )),
                    );
                }
            }
            // Watches of owners that went away are dropped lazily (when
            // the process exits or at the periodic check): an owner that
            // comes and goes per request costs no pidfd churn.
            if self.manager.has_owner(&owner) {
                self.watch(&owner);
            }
        }
        let mut tokens = std::mem::take(&mut self.turn_connections);
        tokens.sort_unstable();
        tokens.dedup();
        let replies: Vec<(Token, Vec<u8>)> = tokens
            .into_iter()
            .filter_map(|token| {
                let connection = self.connections.get_mut(&token)?;
                Some((token, std::mem::take(&mut connection.staged)))
            })
            .collect();
        self.commit()?;
        self.reveal(Reveal { replies, sighups });
        if self.store.journal_bytes() > self.settings.wconfd.snapshot_journal_bytes_max {
            let started = Instant::now();
            self.store
                .write_snapshot(&self.manager)
                .map_err(durability_lost(self.store.snapshot_path()))?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                holdings = self.manager.holding_count(),
                "wrote a lock state snapshot"
            );
        }
        Ok(())
    }

    /// Makes the journal records of the turn durable. A failure cannot be
    /// retried as if it had worked: wconfd stops (DECISIONS D8).
    fn commit(&mut self) -> Result<(), DaemonError> {
        if self.store.has_unwritten() {
            self.store
                .commit()
                .map_err(durability_lost(self.store.journal_path()))?;
            self.commits += 1;
        }
        Ok(())
    }

    /// Sends what a durable turn answered: replies, then SIGHUPs.
    fn reveal(&mut self, reveal: Reveal) {
        for (token, bytes) in reveal.replies {
            if let Some(connection) = self.connections.get_mut(&token) {
                connection.output.extend_from_slice(&bytes);
                self.flush(token);
            }
        }
        for owner in reveal.sighups {
            if let Err(error) = sys::send_signal(owner.pid, Signal::SIGHUP) {
                tracing::debug!(%owner, %error, "cannot notify the owner");
            }
        }
    }

    /// On stop: whatever is recorded is made durable (every turn commits,
    /// so normally nothing is left).
    fn drain(&mut self) -> Result<(), DaemonError> {
        self.commit()
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

    /// `listWaiters` *(extension)*: each pending request with its wait so
    /// far and its blockers.
    fn list_waiters(&self) -> Value {
        let now = Instant::now();
        Value::Array(
            self.manager
                .list_pending()
                .iter()
                .map(|waiter| {
                    let waited = self
                        .waiting_since
                        .get(&waiter.owner)
                        .map_or(0.0, |since| now.duration_since(*since).as_secs_f64());
                    let blockers = self.manager.blockers(&waiter.owner, &waiter.request);
                    encode_waiter(waiter, waited, &blockers)
                })
                .collect(),
        )
    }

    /// SIGUSR2: the lock table, the waiters and the connections, to the log.
    fn dump(&self) {
        let now = Instant::now();
        let table = self.manager.list_all_locks_owners();
        tracing::info!(
            locks = table.len(),
            holdings = self.manager.holding_count(),
            pending = self.manager.pending_count(),
            connections = self.connections.len(),
            watched_pids = self.pid_watches.len(),
            journal_bytes = self.store.journal_bytes(),
            "state dump"
        );
        tracing::info!(
            "journal: {}, {} B in this round, {} turns written",
            self.store.journal_io(),
            self.store.journal_bytes(),
            self.commits
        );
        for (lock, holders) in &table {
            let holders: Vec<String> = holders
                .iter()
                .map(|(owner, mode)| format!("{owner} {mode}"))
                .collect();
            tracing::info!("lock {lock}: {}", holders.join(", "));
        }
        for waiter in self.manager.list_pending() {
            let waited = self
                .waiting_since
                .get(&waiter.owner)
                .map(|since| now.duration_since(*since).as_secs_f64())
                .unwrap_or(0.0);
            let request: Vec<String> = waiter.request.iter().map(ToString::to_string).collect();
            tracing::info!(
                "waiter {} priority {} for {:.3} s{}: {}",
                waiter.owner,
                waiter.priority,
                waited,
                if self.awaits.contains_key(&waiter.owner) {
                    " (awaitLocks)"
                } else {
                    ""
                },
                request.join(" ")
            );
        }
        for (token, connection) in &self.connections {
            tracing::info!(
                "connection {}: pid {} uid {} buffered {} B, output {} B{}",
                token.0,
                connection.peer.pid,
                connection.peer.uid,
                connection.reader.buffered_bytes(),
                connection.output.len(),
                match &connection.held {
                    Some(owner) => format!(", awaiting locks for {owner}"),
                    None => String::new(),
                }
            );
        }
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

/// A write or sync of the lock state failed: see [`DaemonError::Journal`].
fn durability_lost(path: &Path) -> impl FnOnce(io::Error) -> DaemonError + '_ {
    move |source| DaemonError::Journal {
        path: path.to_owned(),
        source,
    }
}

/// Ganeti's shape of a failed verification: its ConfigWriter reads
/// `args[1]` as the list of problems.
fn config_verify_error(problems: Vec<String>) -> WireError {
    WireError {
        class: "ConfigVerifyError",
        args: vec![json!("Validation failed"), json!(problems)],
    }
}

fn update_reply(outcome: OpOutcome) -> Result<Value, WireError> {
    match outcome {
        OpOutcome::Update(Ok(update)) => Ok(encode_owners(&update.blockers)),
        OpOutcome::Update(Err(error)) => Err(lock_error(&error)),
        OpOutcome::Freed(_) | OpOutcome::Acquired(_) => unreachable!("updates answer an Update"),
    }
}

fn acquired_reply(outcome: OpOutcome) -> Result<Value, WireError> {
    match outcome {
        OpOutcome::Acquired(locks) => Ok(encode_locks(&locks)),
        OpOutcome::Update(_) | OpOutcome::Freed(_) => unreachable!("unions answer Acquired"),
    }
}
