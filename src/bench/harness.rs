//! What the daemon benches share: a scratch directory for their roots, a
//! daemon process started on one of them, a reporter attached to them
//! (`--reporter`), a lean client of either daemon's socket (requests built
//! by the typed request enums and encoded once, replies checked without a
//! copy), a client of the reporter's `/status.json`, the reading of an
//! event sequence's position, a held watch timed against the change it
//! waits for, and the fsync probe that gives every figure its floor.

use std::cell::Cell;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read as _, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use serde_json::{Value, json};

use super::{Measure, Result, Target, Unit, WithContext as _, fail, log_tail, percentile};
use crate::paths::REPORTER_STATE_FILE;
use crate::protocol::events::WatchEvents;
use crate::protocol::wconfd::WconfdRequest;
use crate::protocol::{ETX, Request};
use crate::reporter::REPORTER_LOCK;

/// Longest wait for any one reply: a hung daemon fails the bench instead
/// of hanging it (and CI).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between attempts to connect to a starting daemon, and between
/// looks at a stopping one: small against the restart targets.
pub const POLL_PAUSE: Duration = Duration::from_micros(200);

/// Longest wait for a daemon to accept after its start, or to exit after
/// SIGTERM (recovery of a large root takes seconds).
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(60);

/// One daemon of a root: `<binary> <flag> <root>`, its stderr appended
/// to its log, ready once its socket accepts (both daemons bind only once
/// they are ready to serve). Killed, if it still runs, when dropped.
pub struct Daemon {
    name: &'static str,
    binary: PathBuf,
    flag: &'static str,
    root: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    pub fn new(
        name: &'static str,
        binary: &Path,
        flag: &'static str,
        root: &Path,
        socket: PathBuf,
        log: PathBuf,
    ) -> Daemon {
        Daemon {
            name,
            binary: binary.to_owned(),
            flag,
            root: root.to_owned(),
            socket,
            log,
            child: None,
        }
    }

    /// Starts the daemon and connects once it accepts.
    pub fn spawn(&mut self) -> Result<Client> {
        self.spawn_process()?;
        self.wait_ready()
    }

    /// Starts the process only ([`Daemon::wait_ready`] waits for it).
    pub fn spawn_process(&mut self) -> Result<()> {
        assert!(self.child.is_none(), "one {} per root", self.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .context(|| format!("cannot open {}", self.log.display()))?;
        let child = Command::new(&self.binary)
            .arg(self.flag)
            .arg(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context(|| format!("cannot start {}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Connects as soon as the started daemon accepts; fails if it exits
    /// first or takes longer than [`PROCESS_TIMEOUT`].
    pub fn wait_ready(&mut self) -> Result<Client> {
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        let child = self.child.as_mut().expect("the daemon was spawned");
        loop {
            match UnixStream::connect(&self.socket) {
                Ok(stream) => return Client::new(stream, self.name),
                Err(error) if Instant::now() > deadline => {
                    return fail(format!(
                        "{} did not accept within {} s ({error}); log: {}",
                        self.name,
                        PROCESS_TIMEOUT.as_secs(),
                        self.log.display()
                    ));
                }
                Err(_) => {}
            }
            if let Some(status) = child
                .try_wait()
                .context(|| format!("cannot watch {}", self.name))?
            {
                self.child = None;
                return fail(format!(
                    "{} exited at start ({status}):\n{}",
                    self.name,
                    log_tail(&self.log)
                ));
            }
            thread::sleep(POLL_PAUSE);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the daemon is running").id()
    }

    pub fn connect(&self) -> Result<Client> {
        let stream = UnixStream::connect(&self.socket)
            .context(|| format!("cannot connect to {}", self.socket.display()))?;
        Client::new(stream, self.name)
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        let child = self.child.as_mut().expect("the daemon is running");
        terminate(child, self.name, &self.log)?;
        self.child = None;
        Ok(())
    }

    /// kill -9 and reaps it, as a crash (nothing if it does not run).
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .and_then(|()| child.wait())
                .context(|| format!("cannot kill {}", self.name))?;
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// SIGTERM to `child`, then waits (at most [`PROCESS_TIMEOUT`]) for it to
/// exit, which must be a clean exit; `log` is where its error would be.
fn terminate(child: &mut Child, name: &str, log: &Path) -> Result<()> {
    crate::sys::send_signal(child.id(), Signal::SIGTERM)
        .context(|| format!("cannot send SIGTERM to {name}"))?;
    let status = wait_exit(child, name)?;
    if !status.success() {
        return fail(format!("{name} stopped with {status}:\n{}", log_tail(log)));
    }
    Ok(())
}

/// Waits for `child` to exit and reaps it, for at most
/// [`PROCESS_TIMEOUT`].
fn wait_exit(child: &mut Child, name: &str) -> Result<ExitStatus> {
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    loop {
        if let Some(status) = child
            .try_wait()
            .context(|| format!("cannot watch {name}"))?
        {
            return Ok(status);
        }
        if Instant::now() > deadline {
            return fail(format!(
                "{name} did not stop within {} s of SIGTERM",
                PROCESS_TIMEOUT.as_secs()
            ));
        }
        thread::sleep(POLL_PAUSE);
    }
}

// ---------------------------------------------------------------------------
// The reporter

/// The settings a root needs for a reporter beside the bench's daemons:
/// its endpoint on `listen` (`""`: none, so that runs never collide on a
/// port), for the root's `warden.toml`.
pub fn reporter_settings(listen: &str) -> String {
    let listen = serde_json::to_string(listen).expect("a string always serialises");
    format!("[metrics]\nlisten = {listen}\n")
}

/// An address on the loopback no one listens on now, for a reporter's
/// endpoint (free when asked; a run that loses it to another process
/// fails to start its reporter, an error).
pub fn free_loopback_address() -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .context(|| "cannot find a free port on 127.0.0.1".to_owned())?;
    let address = listener
        .local_addr()
        .context(|| "cannot read a bound address".to_owned())?;
    Ok(address.to_string())
}

/// `warden reporter --root <root>` (the `warden` binary beside the
/// bench), its stderr appended to its log. Killed, if it still runs, when
/// dropped.
pub struct Reporter {
    binary: PathBuf,
    root: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Reporter {
    pub fn new(binary: &Path, root: &Path, log: PathBuf) -> Reporter {
        Reporter {
            binary: binary.to_owned(),
            root: root.to_owned(),
            log,
            child: None,
        }
    }

    /// Starts the process only; it is elected on its own
    /// ([`wait_elected`]).
    pub fn spawn(&mut self) -> Result<()> {
        assert!(self.child.is_none(), "one reporter per bench root");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .context(|| format!("cannot open {}", self.log.display()))?;
        let child = Command::new(&self.binary)
            .arg("reporter")
            .arg("--root")
            .arg(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context(|| format!("cannot start {} reporter", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Fails if the reporter has exited (it must run until stopped).
    pub fn check_running(&mut self) -> Result<()> {
        let child = self.child.as_mut().expect("the reporter was spawned");
        if let Some(status) = child
            .try_wait()
            .context(|| "cannot watch the reporter".to_owned())?
        {
            self.child = None;
            return fail(format!(
                "the reporter exited ({status}):\n{}",
                log_tail(&self.log)
            ));
        }
        Ok(())
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        let child = self.child.as_mut().expect("the reporter is running");
        terminate(child, "the reporter", &self.log)?;
        self.child = None;
        Ok(())
    }

    /// kill -9 and reaps it, as a crash (nothing if it does not run).
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .and_then(|()| child.wait())
                .context(|| "cannot kill the reporter".to_owned())?;
        }
        Ok(())
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Waits until `wconfd` lists the reporter's lock as held: a reporter is
/// elected (and its readers started, which it does at once).
pub fn wait_elected(wconfd: &mut Client, reporter: &mut Reporter) -> Result<()> {
    let list = frame(&WconfdRequest::ListAllLocks.encode());
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    loop {
        let locks = result_of("wconfd", wconfd.call(&list)?)?;
        let held = locks
            .as_array()
            .is_some_and(|locks| locks.iter().any(|lock| lock == REPORTER_LOCK));
        if held {
            return Ok(());
        }
        reporter.check_running()?;
        if Instant::now() > deadline {
            return fail(format!(
                "no reporter was elected within {} s ({REPORTER_LOCK} not held)",
                PROCESS_TIMEOUT.as_secs()
            ));
        }
        thread::sleep(POLL_PAUSE);
    }
}

/// The reporter's `/status.json` at `address`, or `None` while it does not
/// accept (not elected yet: the endpoint opens with the election).
pub fn reporter_status(address: &str) -> Result<Option<Value>> {
    let Ok(mut stream) = TcpStream::connect(address) else {
        return Ok(None);
    };
    stream
        .set_read_timeout(Some(REPLY_TIMEOUT))
        .context(|| "cannot set a reply timeout".to_owned())?;
    let request = format!("GET /status.json HTTP/1.1\r\nHost: {address}\r\n\r\n");
    let mut response = Vec::new();
    stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.read_to_end(&mut response))
        .context(|| format!("GET /status.json of {address}"))?;
    let text = String::from_utf8_lossy(&response);
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => serde_json::from_str(body)
            .map(Some)
            .context(|| format!("/status.json of {address} is not JSON")),
        _ => fail(format!("/status.json of {address} answered {text}")),
    }
}

/// How far the reporter's `/status.json` says it has read `daemon`'s
/// sequence (`reporter.read.<daemon>`).
pub fn reporter_read(status: &Value, daemon: &str) -> Result<u64> {
    status["reporter"]["read"][daemon]
        .as_u64()
        .ok_or_else(|| super::Error(format!("no reporter.read.{daemon} in {status}")))
}

/// How far the reporter's saved state (`reporter/state.json` in `root`)
/// has read `daemon`'s sequence; 0 before its first save.
pub fn saved_read(root: &Path, daemon: &str) -> Result<u64> {
    let path = root.join(REPORTER_STATE_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return fail(format!("cannot read {}: {error}", path.display())),
    };
    let state: Value =
        serde_json::from_slice(&bytes).context(|| format!("{} is not JSON", path.display()))?;
    state["read"][daemon]
        .as_u64()
        .ok_or_else(|| super::Error(format!("no read.{daemon} in {}", path.display())))
}

/// The last readable event of a daemon's sequence: an answer of
/// `WatchEvents [null, null, 0]`, built as a request by `encode` (luxid's
/// or wconfd's spelling).
pub fn events_position(client: &mut Client, encode: fn(WatchEvents) -> Request) -> Result<u64> {
    let now = WatchEvents {
        since: None,
        types: None,
        timeout: Duration::ZERO,
    };
    let peer = client.peer;
    let answer = result_of(peer, client.call(&frame(&encode(now)))?)?;
    answer["next"]
        .as_u64()
        .ok_or_else(|| super::Error(format!("{peer}'s watch answered {answer}, no next")))
}

/// The scratch directory of one bench process, holding a root per run;
/// removed when dropped.
pub struct Workspace {
    pub dir: PathBuf,
    /// Numbers the run directories.
    next_run: Cell<u64>,
}

impl Workspace {
    /// `<parent>/<program>-<pid>`, spelled canonically (as the daemons
    /// spell their root, and so the livelock paths of owners and jobs).
    pub fn create(parent: &Path, program: &str) -> Result<Workspace> {
        let dir = parent.join(format!("{program}-{}", std::process::id()));
        fs::create_dir_all(&dir).context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .context(|| format!("cannot resolve {}", dir.display()))?;
        if dir.to_str().is_none() {
            return fail(format!(
                "{} is not UTF-8, which owners on the wire need",
                dir.display()
            ));
        }
        Ok(Workspace {
            dir,
            next_run: Cell::new(1),
        })
    }

    /// The directory of the next run (`run-1`, `run-2`, ...), not yet
    /// created.
    pub fn next_run_dir(&self) -> PathBuf {
        let run = self.next_run.replace(self.next_run.get() + 1);
        self.dir.join(format!("run-{run}"))
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A request frame as Ganeti's client sends it: JSON, a newline, ETX.
/// Benches encode their requests once and send the bytes many times.
pub fn frame(request: &Request) -> Vec<u8> {
    let mut frame = serde_json::to_vec(&json!({"method": request.method, "args": request.args}))
        .expect("a JSON value always serializes");
    frame.push(b'\n');
    frame.push(ETX);
    frame
}

/// One connection to a daemon; requests are answered in order.
pub struct Client {
    stream: BufReader<UnixStream>,
    reply: Vec<u8>,
    /// The daemon, for error messages.
    peer: &'static str,
}

impl Client {
    pub fn new(stream: UnixStream, peer: &'static str) -> Result<Client> {
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .context(|| "cannot set a reply timeout".to_owned())?;
        Ok(Client {
            stream: BufReader::new(stream),
            reply: Vec::new(),
            peer,
        })
    }

    /// Sends an encoded request ([`frame`]).
    pub fn send(&mut self, frame: &[u8]) -> Result<()> {
        self.stream
            .get_mut()
            .write_all(frame)
            .context(|| format!("cannot send to {}", self.peer))
    }

    /// The next reply, without its ETX.
    pub fn receive(&mut self) -> Result<&[u8]> {
        self.reply.clear();
        self.stream
            .read_until(ETX, &mut self.reply)
            .context(|| format!("no reply from {}", self.peer))?;
        if self.reply.pop() != Some(ETX) {
            return fail(format!("{} closed the connection", self.peer));
        }
        Ok(&self.reply)
    }

    /// Sends an encoded request and reads its reply.
    pub fn call(&mut self, frame: &[u8]) -> Result<&[u8]> {
        self.send(frame)?;
        self.receive()
    }

    /// Sends a request and answers its result (an error reply is an
    /// error).
    pub fn result(&mut self, request: &Request) -> Result<Value> {
        let peer = self.peer;
        let reply = self.call(&frame(request))?;
        result_of(peer, reply)
    }
}

/// The result of a successful reply of `peer`; an error reply is an
/// error.
pub fn result_of(peer: &str, reply: &[u8]) -> Result<Value> {
    let text = || String::from_utf8_lossy(reply).into_owned();
    let mut response: Value = serde_json::from_slice(reply)
        .context(|| format!("{peer}'s reply is not JSON: {}", text()))?;
    let success = response.get("success").and_then(Value::as_bool);
    match (success, response.get_mut("result")) {
        (Some(true), Some(result)) => Ok(result.take()),
        (Some(false), Some(error)) => fail(format!("{peer} answered {error}")),
        _ => fail(format!("{peer}'s reply is not a response: {}", text())),
    }
}

/// Median seconds to append a record of `record_bytes` to a file in `dir`
/// and `sync_data` it, over at most `count_max` appends or (after the
/// first) `time_max`: the floor under every reply that reveals a change.
pub fn fsync_cost(
    dir: &Path,
    record_bytes: usize,
    count_max: usize,
    time_max: Duration,
) -> Result<f64> {
    let path = dir.join("fsync-probe");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .context(|| format!("cannot open {}", path.display()))?;
    let record = vec![b'x'; record_bytes];
    let mut samples = Vec::with_capacity(count_max);
    let started = Instant::now();
    while samples.len() < count_max && (samples.is_empty() || started.elapsed() < time_max) {
        let written = Instant::now();
        file.write_all(&record)
            .and_then(|()| file.sync_data())
            .context(|| format!("cannot append to and sync {}", path.display()))?;
        samples.push(written.elapsed().as_secs_f64());
    }
    drop(file);
    fs::remove_file(&path).context(|| format!("cannot remove {}", path.display()))?;
    samples.sort_by(f64::total_cmp);
    Ok(percentile(&samples, 0.50))
}

/// What [`watch_change`] saw: the watch's result and the change's reply,
/// when the change was sent and when each answer arrived.
pub struct Watched {
    pub answer: Value,
    /// The change's reply, without its ETX, for the caller to check.
    pub reply: Vec<u8>,
    pub sent: Instant,
    pub replied: Instant,
    pub answered: Instant,
}

/// One held watch and the change it waits for, on one thread: `watch` (an
/// encoded request that is held until an event comes) is sent on
/// `watcher`, `change` on `changer` `hold_pause` later; then both
/// connections are waited on together (epoll), so each answer is noted
/// the moment it can be read, whichever comes first, with no second
/// thread to wake.
pub fn watch_change(
    watcher: &mut Client,
    watch: &[u8],
    changer: &mut Client,
    change: &[u8],
    hold_pause: Duration,
) -> Result<Watched> {
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token};
    use std::os::fd::AsRawFd as _;

    const WATCHER: Token = Token(0);
    const CHANGER: Token = Token(1);
    assert!(
        watcher.stream.buffer().is_empty() && changer.stream.buffer().is_empty(),
        "no reply is left unread before a watched change"
    );
    let mut poll = Poll::new().context(|| "cannot create a poll".to_owned())?;
    for (client, token) in [(&*watcher, WATCHER), (&*changer, CHANGER)] {
        let fd = client.stream.get_ref().as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), token, Interest::READABLE)
            .context(|| "cannot watch a connection".to_owned())?;
    }
    watcher.send(watch)?;
    thread::sleep(hold_pause);
    let sent = Instant::now();
    changer.send(change)?;
    let (mut answer, mut reply) = (None, None);
    let mut events = Events::with_capacity(2);
    let deadline = sent + REPLY_TIMEOUT;
    while answer.is_none() || reply.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return fail(format!(
                "no watch answer or no reply within {} s",
                REPLY_TIMEOUT.as_secs()
            ));
        }
        match poll.poll(&mut events, Some(left)) {
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            other => other.context(|| "cannot poll".to_owned())?,
        }
        let now = Instant::now();
        for event in &events {
            // Edge-triggered: a frame is read whole once it begins (the
            // answers are small, written at once).
            if event.token() == WATCHER && answer.is_none() {
                let peer = watcher.peer;
                answer = Some((result_of(peer, watcher.receive()?)?, now));
            } else if event.token() == CHANGER && reply.is_none() {
                reply = Some((changer.receive()?.to_vec(), now));
            }
        }
    }
    let ((answer, answered), (reply, replied)) = (
        answer.expect("the loop ends with both"),
        reply.expect("the loop ends with both"),
    );
    Ok(Watched {
        answer,
        reply,
        sent,
        replied,
        answered,
    })
}

/// The events of a watch's answer (`{"events": [...], "next": n}`) and
/// its `next`.
pub fn watch_answer(answer: &Value) -> Result<(&[Value], u64)> {
    match (answer["events"].as_array(), answer["next"].as_u64()) {
        (Some(events), Some(next)) => Ok((events, next)),
        _ => fail(format!("a watch answered {answer}, not {{events, next}}")),
    }
}

/// `later - earlier` in seconds, negative if `later` came first.
pub fn signed_seconds(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(after) => after.as_secs_f64(),
        None => -earlier.duration_since(later).as_secs_f64(),
    }
}

/// The samples of watched changes ([`watch_change`]), in seconds: from
/// sending the change to the watch's answer, the change's own round trip,
/// and the answer's arrival after the change's reply.
#[derive(Default)]
pub struct WatchSamples {
    pub to_answer: Vec<f64>,
    pub round_trips: Vec<f64>,
    pub after_reply: Vec<f64>,
}

impl WatchSamples {
    /// One change sent at `sent`, answered at `replied`, seen by the watch
    /// at `answered`.
    pub fn add(&mut self, sent: Instant, replied: Instant, answered: Instant) {
        self.to_answer.push(signed_seconds(answered, sent));
        self.round_trips.push(signed_seconds(replied, sent));
        self.after_reply.push(signed_seconds(answered, replied));
    }

    /// The figures, `change` naming the request: p50 (judged against
    /// `p50_max`) and p99 of sent to answered, the p50s of the others.
    pub fn figures(mut self, change: &str, p50_max: f64) -> Vec<Measure> {
        for samples in [
            &mut self.to_answer,
            &mut self.round_trips,
            &mut self.after_reply,
        ] {
            samples.sort_by(f64::total_cmp);
        }
        vec![
            Measure::new(
                format!("p50 {change} sent to watch answered"),
                Unit::Seconds,
                percentile(&self.to_answer, 0.50),
            )
            .with_target(Target::Below(p50_max)),
            Measure::new(
                format!("p99 {change} sent to watch answered"),
                Unit::Seconds,
                percentile(&self.to_answer, 0.99),
            ),
            Measure::new(
                format!("p50 {change} round trip (its reply)"),
                Unit::Seconds,
                percentile(&self.round_trips, 0.50),
            ),
            Measure::new(
                "p50 watch answered after the reply",
                Unit::Seconds,
                percentile(&self.after_reply, 0.50),
            ),
        ]
    }
}
