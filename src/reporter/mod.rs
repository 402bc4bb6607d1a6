//! The reporter (EVENTS.md): reads both daemons' event sequences from a
//! durable position and turns them into metrics (Prometheus and statsd)
//! and hook runs.
//!
//! Several reporters may run; one is elected through wconfd itself: each
//! asks for the exclusive lock `service/reporter` with a held
//! `awaitLocks`, and the holder reports. When it dies, wconfd's death
//! detection frees the lock, grants it to the next waiter, and its await
//! answers: it takes over from the position the last one saved.
//!
//! Threads: the election (the await, then a check every
//! [`HOLD_CHECK_INTERVAL`] that the lock is still held), one reader per
//! daemon (held `WatchEvents`), the Prometheus endpoint, and the main
//! loop, which owns the metrics, the hooks and the saved state, and is
//! the only one that sends.

pub mod hooks;
pub mod metrics;

mod http;
mod state;

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::{Client, ClientError, Daemon};
use crate::events::EventLine;
use crate::events::notify::{LockChange, QueueChange, notify_locks, notify_queue};
use crate::jobs::Timestamp;
use crate::limits::{HOOK_RETRY_PAUSE, HOOK_TIMEOUT, LUXID_FRAME_BYTES_MAX_DEFAULT};
use crate::liveness::Livelock;
use crate::locks::{Action, Entry, Ident, LockName, Mode, Owner};
use crate::paths::LIVELOCK_DIR;
use crate::protocol::events::WatchEvents;
use crate::settings::Settings;

use hooks::Hooks;
use metrics::{Metrics, Source, Statsd};
use state::SavedState;

/// The lock whose holder is the elected reporter.
pub const REPORTER_LOCK: &str = "service/reporter";

/// The owner name every reporter takes in wconfd.
pub const REPORTER_IDENT: &str = "reporter";

/// How often the elected reporter checks it still holds its lock.
const HOLD_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// One held `awaitLocks` of the election, at most.
const ELECTION_AWAIT_MS: u64 = 60_000;

/// One held `WatchEvents` of a reader, at most.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// After an answer of fewer than [`READ_GATHER_BELOW`] events a reader
/// waits this long before it asks again, so a busy daemon answers it with
/// many events a few times a second rather than a few events every turn
/// (each answer costs the daemon's loop a turn). The first event after a
/// quiet spell still comes at once: the held watch answers it.
const READ_GATHER: Duration = Duration::from_millis(10);
const READ_GATHER_BELOW: usize = 1_000;

/// A reader that lost its daemon connects again after this long.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// The longest the main loop sleeps (signals are seen within it).
const TICK: Duration = Duration::from_millis(100);

/// A Prometheus endpoint that could not be opened is tried again after
/// this long.
const ENDPOINT_RETRY_PAUSE: Duration = Duration::from_secs(10);

/// The saved state is written at most this often (and at the end).
const SAVE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ReporterError {
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("the reporter's saved state {}: {what}", path.display())]
    State { path: PathBuf, what: String },
    #[error("the lock {REPORTER_LOCK} was lost (wconfd took it as dead): this reporter stops")]
    Deposed,
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ReporterError {
    let what = what.into();
    move |source| ReporterError::Io { what, source }
}

/// What the threads tell the main loop.
enum Message {
    Elected,
    Deposed,
    Events {
        source: Source,
        events: Vec<EventLine>,
        next: u64,
    },
    /// A cursor outside what the daemon keeps: where to go on.
    Skipped {
        source: Source,
        from: u64,
        to: u64,
    },
}

fn now_secs() -> f64 {
    let Timestamp(secs, usecs) = Timestamp::now();
    secs as f64 + usecs as f64 / 1e6
}

/// What the SIGUSR2 dump and `/status.json` show of the reporter.
#[derive(Clone, Debug, Default)]
pub struct ReporterStatus {
    pub pid: u32,
    pub elected_at: Option<f64>,
    pub read: [u64; 2],
    pub hooks_done: [u64; 2],
    pub hooks_running: usize,
    pub hooks_pending: usize,
}

/// What the endpoint serves: the metrics and the reporter's status.
pub struct Shared {
    pub metrics: Mutex<Metrics>,
    pub status: Mutex<ReporterStatus>,
}

/// Runs a reporter on `root` until SIGTERM or SIGINT (or until it loses
/// its lock).
pub fn run(root: &Path) -> Result<(), ReporterError> {
    let settings = Settings::load(root)?;
    let stop = Arc::new(AtomicBool::new(false));
    let dump = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(io_error("cannot handle signals"))?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGUSR2, Arc::clone(&dump))
        .map_err(io_error("cannot handle SIGUSR2"))?;
    let livelock_dir = root.join(LIVELOCK_DIR);
    std::fs::create_dir_all(&livelock_dir).map_err(io_error(format!(
        "cannot create {}",
        livelock_dir.display()
    )))?;
    let livelock = Livelock::create(
        &livelock_dir,
        &format!("reporter_{}_{}", std::process::id(), Timestamp::now().0),
    )
    .map_err(io_error("cannot create the reporter's livelock"))?;
    let owner = Owner {
        ident: Ident::Name(REPORTER_IDENT.to_owned()),
        livelock: livelock.path().display().to_string(),
        pid: std::process::id(),
    };
    let (sender, receiver) = mpsc::sync_channel(8);
    {
        let root = root.to_owned();
        let sender = sender.clone();
        let owner = owner.clone();
        std::thread::Builder::new()
            .name("election".to_owned())
            .spawn(move || elect(&root, &owner, &sender))
            .map_err(io_error("cannot start the election thread"))?;
    }
    tracing::info!(pid = owner.pid, "reporter waiting to be elected");
    let mut reporter = Reporter::new(root, settings, receiver, sender, stop, dump, owner)?;
    let result = reporter.serve();
    reporter.finish();
    drop(livelock);
    result
}

/// The election: the lock awaited (again after a timeout or a lost
/// connection), then held and checked until the process ends.
fn elect(root: &Path, owner: &Owner, sender: &SyncSender<Message>) {
    let lock = LockName::parse(REPORTER_LOCK).expect("a valid lock name");
    let request = [Entry::new(lock.clone(), Action::Acquire(Mode::Exclusive))];
    loop {
        match await_lock(root, owner, &request) {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                tracing::debug!(%error, "cannot reach wconfd for the election; trying again");
                std::thread::sleep(RECONNECT_PAUSE);
            }
        }
    }
    if sender.send(Message::Elected).is_err() {
        return;
    }
    loop {
        std::thread::sleep(HOLD_CHECK_INTERVAL);
        match still_held(root, owner, &lock) {
            Ok(true) => {}
            Ok(false) => {
                let _ = sender.send(Message::Deposed);
                return;
            }
            // wconfd down: the lock state is durable, the holding with it.
            Err(_) => {}
        }
    }
}

/// One held `awaitLocks`: whether it granted the lock.
fn await_lock(root: &Path, owner: &Owner, request: &[Entry]) -> Result<bool, ClientError> {
    let mut client = Client::connect(root, Daemon::Wconfd, LUXID_FRAME_BYTES_MAX_DEFAULT)?;
    client.send_await_locks(owner, 0, request, ELECTION_AWAIT_MS, false)?;
    Ok(client.receive_blockers()?.is_empty())
}

fn still_held(root: &Path, owner: &Owner, lock: &LockName) -> Result<bool, ClientError> {
    let mut client = Client::connect(root, Daemon::Wconfd, LUXID_FRAME_BYTES_MAX_DEFAULT)?;
    let held = client.list_locks(owner)?;
    Ok(held.iter().any(|(name, _)| name == lock))
}

/// A reader: held `WatchEvents` from `since` on, each answer handed to
/// the main loop (which blocks it while it is behind).
fn read(root: &Path, source: Source, mut since: u64, sender: &SyncSender<Message>) {
    let daemon = match source {
        Source::Luxid => Daemon::Luxid,
        Source::Wconfd => Daemon::Wconfd,
    };
    let mut client: Option<Client> = None;
    loop {
        let connected = match client.as_mut() {
            Some(client) => client,
            None => match Client::connect(root, daemon, LUXID_FRAME_BYTES_MAX_DEFAULT) {
                Ok(new) => client.insert(new),
                Err(_) => {
                    std::thread::sleep(RECONNECT_PAUSE);
                    continue;
                }
            },
        };
        let watch = WatchEvents {
            since: Some(since),
            types: None,
            timeout: READ_TIMEOUT,
        };
        match connected.watch_events(&watch) {
            Ok((events, next)) => {
                since = next;
                if events.is_empty() {
                    continue;
                }
                let gather = events.len() < READ_GATHER_BELOW;
                let message = Message::Events {
                    source,
                    events,
                    next,
                };
                if sender.send(message).is_err() {
                    return;
                }
                if gather {
                    std::thread::sleep(READ_GATHER);
                }
            }
            Err(ClientError::Failed { class, args, .. })
                if class == "EventsExpired" || class == "EventsFuture" =>
            {
                // Expired: the first kept; future: the daemon's last (its
                // sequence is not the one this position was of).
                let number = args
                    .first()
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
                let to = if class == "EventsExpired" {
                    number.saturating_sub(1)
                } else {
                    number
                };
                if sender
                    .send(Message::Skipped {
                        source,
                        from: since,
                        to,
                    })
                    .is_err()
                {
                    return;
                }
                since = to;
            }
            Err(error) => {
                tracing::debug!(daemon = daemon.name(), %error, "lost a daemon; connecting again");
                client = None;
                std::thread::sleep(RECONNECT_PAUSE);
            }
        }
    }
}

/// The hooks as a listener of both sequences: every event is offered
/// (they choose by type prefix).
struct HookFeed<'a> {
    hooks: &'a mut Hooks,
    source: Source,
}

impl QueueChange for HookFeed<'_> {
    fn event_notification(&mut self, event: &EventLine) {
        self.hooks.offer(self.source, event);
    }
}

impl LockChange for HookFeed<'_> {
    fn event_notification(&mut self, event: &EventLine) {
        self.hooks.offer(self.source, event);
    }
}

struct Reporter {
    root: PathBuf,
    settings: Settings,
    receiver: Receiver<Message>,
    sender: SyncSender<Message>,
    stop: Arc<AtomicBool>,
    dump: Arc<AtomicBool>,
    shared: Arc<Shared>,
    hooks: Hooks,
    statsd: Option<(UdpSocket, Statsd)>,
    saved: SavedState,
    state_path: PathBuf,
    elected: bool,
    endpoint_open: bool,
    endpoint_retry_at: Instant,
    dirty: bool,
    last_save: Instant,
    owner: Owner,
}

impl Reporter {
    fn new(
        root: &Path,
        settings: Settings,
        receiver: Receiver<Message>,
        sender: SyncSender<Message>,
        stop: Arc<AtomicBool>,
        dump: Arc<AtomicBool>,
        owner: Owner,
    ) -> Result<Reporter, ReporterError> {
        let hooks = Hooks::new(&settings.hooks, HOOK_TIMEOUT, HOOK_RETRY_PAUSE);
        let state_path = root.join(crate::paths::REPORTER_STATE_FILE);
        Ok(Reporter {
            root: root.to_owned(),
            settings,
            receiver,
            sender,
            stop,
            dump,
            shared: Arc::new(Shared {
                metrics: Mutex::new(Metrics::new()),
                status: Mutex::new(ReporterStatus {
                    pid: std::process::id(),
                    ..ReporterStatus::default()
                }),
            }),
            hooks,
            statsd: None,
            saved: SavedState::default(),
            state_path,
            elected: false,
            endpoint_open: false,
            endpoint_retry_at: Instant::now(),
            dirty: false,
            last_save: Instant::now(),
            owner,
        })
    }

    fn serve(&mut self) -> Result<(), ReporterError> {
        while !self.stop.load(Ordering::Relaxed) {
            if self.dump.swap(false, Ordering::Relaxed) {
                self.dump();
            }
            let wait = self
                .hooks
                .next_wakeup()
                .map_or(TICK, |at| at.saturating_duration_since(Instant::now()))
                .min(TICK);
            // Behind on hooks: no more events until they have room.
            let message = if self.hooks.has_room() {
                match self.receiver.recv_timeout(wait) {
                    Ok(message) => Some(message),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            } else {
                std::thread::sleep(wait);
                None
            };
            match message {
                Some(Message::Elected) => self.take_over()?,
                Some(Message::Deposed) => return Err(ReporterError::Deposed),
                Some(Message::Events {
                    source,
                    events,
                    next,
                }) => self.take_events(source, &events, next),
                Some(Message::Skipped { source, from, to }) => {
                    tracing::warn!(
                        daemon = source.as_str(),
                        from,
                        to,
                        "events missed (no longer kept, or a new sequence): going on after them"
                    );
                    let index = source as usize;
                    self.saved.read[index] = to;
                    self.saved.hooks_done[index] = to;
                    self.dirty = true;
                }
                None => {}
            }
            if self.elected {
                self.service();
            }
        }
        Ok(())
    }

    /// Elected: the saved state read, the readers started from it, the
    /// endpoint opened.
    fn take_over(&mut self) -> Result<(), ReporterError> {
        let started = Instant::now();
        self.saved = state::load(&self.state_path).map_err(|what| ReporterError::State {
            path: self.state_path.clone(),
            what,
        })?;
        *self.shared.metrics.lock().expect("no panic holding it") = self.saved.metrics.clone();
        for source in Source::ALL {
            let index = source as usize;
            // Hooks may lag the metrics: read from the older of both.
            let since = self.saved.read[index].min(self.saved.hooks_done[index]);
            let root = self.root.clone();
            let sender = self.sender.clone();
            std::thread::Builder::new()
                .name(format!("read-{}", source.as_str()))
                .spawn(move || read(&root, source, since, &sender))
                .map_err(io_error("cannot start a reader thread"))?;
        }
        if let Some(address) = &self.settings.metrics.statsd {
            let socket = UdpSocket::bind("0.0.0.0:0")
                .and_then(|socket| socket.connect(address).map(|()| socket))
                .map_err(io_error(format!("cannot reach statsd at {address}")))?;
            let metrics = self.shared.metrics.lock().expect("no panic holding it");
            let interval = self.settings.metrics.interval_ms as f64 / 1000.0;
            let mut statsd = Statsd::resume(&self.settings.metrics.prefix, interval, &metrics);
            // The last reporter may have sent after its last save, but
            // not after its death, which came before this election: one
            // interval from now keeps every two sends an interval apart.
            statsd.not_before((self.saved.statsd_sent_at + interval).max(now_secs() + interval));
            self.statsd = Some((socket, statsd));
        }
        self.elected = true;
        self.open_endpoint();
        let elected_at = now_secs();
        self.shared
            .status
            .lock()
            .expect("no panic holding it")
            .elected_at = Some(elected_at);
        tracing::info!(
            luxid = self.saved.read[0],
            wconfd = self.saved.read[1],
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "elected: reporting from the saved positions"
        );
        Ok(())
    }

    fn take_events(&mut self, source: Source, events: &[EventLine], next: u64) {
        let index = source as usize;
        {
            let mut metrics = self.shared.metrics.lock().expect("no panic holding it");
            for event in events {
                if event.seq() > self.saved.read[index] {
                    metrics.apply(source, event);
                }
            }
        }
        let mut feed = HookFeed {
            hooks: &mut self.hooks,
            source,
        };
        for event in events {
            if event.seq() > self.saved.hooks_done[index] {
                match source {
                    Source::Luxid => notify_queue(event, &mut feed),
                    Source::Wconfd => notify_locks(event, &mut feed),
                }
            }
        }
        self.saved.read[index] = self.saved.read[index].max(next);
        self.dirty = true;
    }

    /// The Prometheus endpoint, if one is asked for and not yet open: a
    /// port another process holds is tried again later, and the reporter
    /// reports meanwhile (statsd, hooks).
    fn open_endpoint(&mut self) {
        let listen = &self.settings.metrics.listen;
        if listen.is_empty() || self.endpoint_open || Instant::now() < self.endpoint_retry_at {
            return;
        }
        match http::serve(listen, Arc::clone(&self.shared)) {
            Ok(()) => self.endpoint_open = true,
            Err(error) => {
                tracing::error!(%listen, %error, "cannot serve metrics; trying again in 10 s");
                self.endpoint_retry_at = Instant::now() + ENDPOINT_RETRY_PAUSE;
            }
        }
    }

    /// Hooks run and reaped, statsd sent, the state saved when due.
    fn service(&mut self) {
        self.open_endpoint();
        for outcome in self.hooks.poll(Instant::now()) {
            let mut metrics = self.shared.metrics.lock().expect("no panic holding it");
            metrics.hook_ran(!outcome.failed());
            self.dirty = true;
        }
        let mut hooks_moved = false;
        for source in Source::ALL {
            let index = source as usize;
            let done = self.hooks.done_through(source).min(self.saved.read[index]);
            if done > self.saved.hooks_done[index] {
                self.saved.hooks_done[index] = done;
                self.dirty = true;
                hooks_moved = true;
            }
        }
        // Hook runs that ended are saved at once: a restart repeats only
        // those under way.
        if hooks_moved && !self.settings.hooks.is_empty() {
            self.save();
        }
        let now = now_secs();
        if let Some((socket, statsd)) = &mut self.statsd {
            let metrics = self.shared.metrics.lock().expect("no panic holding it");
            let packets = statsd.due(&metrics, now);
            if !packets.is_empty() {
                self.saved.statsd_sent_at = now;
                self.dirty = true;
            }
            for packet in packets {
                if let Err(error) = socket.send(&packet) {
                    tracing::debug!(%error, "statsd did not take a packet");
                }
            }
        }
        {
            let mut status = self.shared.status.lock().expect("no panic holding it");
            status.read = self.saved.read;
            status.hooks_done = self.saved.hooks_done;
            status.hooks_running = self.hooks.running();
            status.hooks_pending = self.hooks.pending();
        }
        if self.dirty && self.last_save.elapsed() >= SAVE_INTERVAL {
            self.save();
        }
    }

    fn save(&mut self) {
        self.saved.metrics = self
            .shared
            .metrics
            .lock()
            .expect("no panic holding it")
            .clone();
        if let Err(error) = state::save(&self.state_path, &self.saved) {
            tracing::warn!(%error, "cannot save the reporter's state");
            return;
        }
        self.dirty = false;
        self.last_save = Instant::now();
    }

    /// The end: hooks stopped (the ones running run again after the next
    /// election, from the saved position), the state saved.
    fn finish(&mut self) {
        if self.elected {
            self.hooks.stop();
            self.save();
        }
        // The lock (or the wait for it) goes now, not at wconfd's next
        // death check: the next reporter takes over at once.
        let freed = Client::connect(&self.root, Daemon::Wconfd, LUXID_FRAME_BYTES_MAX_DEFAULT)
            .and_then(|mut client| client.free_locks(&self.owner));
        if let Err(error) = freed {
            tracing::debug!(%error, "cannot free the reporter's lock; wconfd frees it once this process is gone");
        }
        tracing::info!("reporter stopped");
    }

    /// SIGUSR2: positions, election state, gauges.
    fn dump(&self) {
        let status = self
            .shared
            .status
            .lock()
            .expect("no panic holding it")
            .clone();
        tracing::info!(
            pid = status.pid,
            elected = self.elected,
            elected_at = status.elected_at,
            luxid_read = self.saved.read[0],
            wconfd_read = self.saved.read[1],
            luxid_hooks_done = self.saved.hooks_done[0],
            wconfd_hooks_done = self.saved.hooks_done[1],
            hooks_running = self.hooks.running(),
            hooks_pending = self.hooks.pending(),
            "dump: reporter"
        );
        let figures = self
            .shared
            .metrics
            .lock()
            .expect("no panic holding it")
            .to_json(now_secs());
        tracing::info!(gauges = %figures["gauges"], "dump: gauges");
    }
}
