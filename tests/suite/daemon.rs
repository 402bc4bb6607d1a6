//! What the wconfd integration tests share: the real `wconfd` binary in a
//! temp root ([`Wconfd`]), a client speaking the wire framing ([`Client`]),
//! and lock owners that are real processes holding their livelock
//! ([`OwnerProcess`]).
//!
//! Nothing here sleeps to wait for something: readiness is a successful
//! connect to the new daemon, other conditions are polled with a deadline
//! ([`wait_until`]), and every blocking read has a timeout.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long a daemon may take to start or stop, a process to get ready, a
/// reply to arrive.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// The frame terminator of PROTOCOL.md "Framing".
pub const ETX: u8 = 0x03;

/// Polls `condition` until it holds; fails the test after `within`.
pub fn wait_until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Taken by the tests that assert latencies, and by the heaviest test, so
/// that they never run at the same time: a latency is measured on a
/// machine no busier than the rest of the suite makes it.
pub fn timing_guard() -> std::sync::MutexGuard<'static, ()> {
    static TIMING: Mutex<()> = Mutex::new(());
    TIMING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long after `since` (a `SystemTime::now()` of the test) `then`
/// happened; zero if the clock says before.
pub fn elapsed_between(since: SystemTime, then: SystemTime) -> Duration {
    then.duration_since(since).unwrap_or(Duration::ZERO)
}

/// A memory figure of a process from `/proc/PID/status`, in KiB
/// (`VmRSS`: resident now; `VmHWM`: the peak).
pub fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The names of the entries of a directory.
pub fn file_names(dir: &Path) -> std::collections::BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("list {}: {error}", dir.display()))
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .into_string()
                .expect("UTF-8")
        })
        .collect()
}

/// A unique number for this test process (livelock names, log names).
fn next_serial() -> u64 {
    static SERIAL: AtomicU64 = AtomicU64::new(1);
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// A temp root directory, shared by the daemons started on it; removed when
/// the last handle goes.
#[derive(Clone)]
pub struct Root(Arc<TempDir>);

impl Root {
    pub fn new() -> Root {
        Root(Arc::new(tempfile::tempdir().expect("a temp root")))
    }

    /// A temp root inside `dir` (for a file system of its own).
    pub fn new_in(dir: &Path) -> Root {
        Root(Arc::new(tempfile::tempdir_in(dir).expect("a temp root")))
    }

    /// The root's canonical path (the daemon compares livelock paths with
    /// its canonical root).
    pub fn path(&self) -> PathBuf {
        self.0.path().canonicalize().expect("the root exists")
    }

    pub fn socket(&self) -> PathBuf {
        self.path().join("socket/wconfd.sock")
    }

    pub fn livelock_dir(&self) -> PathBuf {
        self.path().join("livelocks")
    }
}

/// A daemon binary (wconfd or luxid) running on a root, its stderr in a
/// log file under the root; killed when dropped.
pub struct DaemonProcess {
    name: &'static str,
    child: Option<Child>,
    log_path: PathBuf,
}

impl DaemonProcess {
    /// Starts `binary` (named `name` in messages) on `root` and waits until
    /// a connection to `socket` reaches *this* process; if it exits first,
    /// answers its exit status and log.
    pub fn start(
        name: &'static str,
        binary: &str,
        root: &Root,
        socket: &Path,
    ) -> Result<DaemonProcess, (ExitStatus, String)> {
        let log_path = root.path().join(format!("{name}.{}.log", next_serial()));
        let log = File::create(&log_path).expect("create the log file");
        let child = Command::new(binary)
            .arg("--root")
            .arg(root.path())
            .env("WARDEN_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {name}: {error}"));
        let mut daemon = DaemonProcess {
            name,
            child: Some(child),
            log_path,
        };
        let pid = daemon.pid();
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = daemon.child_mut().try_wait().expect("try_wait") {
                daemon.child = None;
                return Err((status, daemon.log()));
            }
            // A connect may reach an older daemon still running on the
            // root; only one answered by this process counts.
            if let Ok(stream) = UnixStream::connect(socket)
                && warden::sys::peer_credentials(&stream).is_ok_and(|peer| peer.pid == pid)
            {
                return Ok(daemon);
            }
            assert!(
                Instant::now() < deadline,
                "{name} not ready within {DEADLINE:?}:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn child_mut(&mut self) -> &mut Child {
        let name = self.name;
        self.child
            .as_mut()
            .unwrap_or_else(|| panic!("{name} is running"))
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("{} is running", self.name))
            .id()
    }

    /// What this run of the daemon wrote to stderr so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log_path).unwrap_or_default()).into_owned()
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL the daemon");
            child.wait().expect("reap the daemon");
        }
    }

    /// SIGTERM; it must exit with status 0 within the deadline.
    pub fn stop(&mut self) {
        let pid = self.pid();
        kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM the daemon");
        let status = wait_for_exit(self.child_mut(), DEADLINE);
        self.child = None;
        assert!(
            status.success(),
            "{} stopped with {status}:\n{}",
            self.name,
            self.log()
        );
    }

    /// Waits for the daemon to exit by itself; answers how it exited.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let status = wait_for_exit(self.child_mut(), DEADLINE);
        self.child = None;
        status
    }

    /// SIGSTOP, and wait until every thread of the daemon is stopped, so
    /// that whatever is sent now is read only after [`DaemonProcess::resume`].
    pub fn pause(&self) {
        let pid = self.pid();
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).expect("SIGSTOP the daemon");
        wait_until("every thread of the daemon is stopped", DEADLINE, || {
            fs::read_dir(format!("/proc/{pid}/task"))
                .expect("the daemon's threads")
                .all(|task| {
                    let stat = fs::read_to_string(task.expect("a task").path().join("stat"))
                        .unwrap_or_default();
                    // The state follows the parenthesised command name.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
        });
    }

    /// SIGCONT after [`DaemonProcess::pause`].
    pub fn resume(&self) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGCONT).expect("SIGCONT the daemon");
    }

    /// Whether the process is still running (not exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A running (or stopped) wconfd on a root; killed when dropped.
pub struct Wconfd {
    root: Root,
    process: DaemonProcess,
}

impl Wconfd {
    /// wconfd on a fresh temp root.
    pub fn start() -> Wconfd {
        Wconfd::restart_on(&Root::new())
    }

    /// wconfd on a fresh temp root with `toml` as its `warden.toml`.
    pub fn start_with_settings(toml: &str) -> Wconfd {
        let root = Root::new();
        fs::write(root.path().join("warden.toml"), toml).expect("write warden.toml");
        Wconfd::restart_on(&root)
    }

    /// wconfd on an existing root (after a stop or a kill).
    pub fn restart_on(root: &Root) -> Wconfd {
        match Wconfd::try_start_on(root) {
            Ok(wconfd) => wconfd,
            Err((status, log)) => panic!("wconfd exited with {status} before serving:\n{log}"),
        }
    }

    /// Starts wconfd on `root` and waits until it serves; if it exits
    /// first, answers its exit status and log.
    pub fn try_start_on(root: &Root) -> Result<Wconfd, (ExitStatus, String)> {
        let process =
            DaemonProcess::start("wconfd", env!("CARGO_BIN_EXE_wconfd"), root, &root.socket())?;
        Ok(Wconfd {
            root: root.clone(),
            process,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn root(&self) -> &Root {
        &self.root
    }

    pub fn livelock_dir(&self) -> PathBuf {
        self.root.livelock_dir()
    }

    /// What this run of wconfd wrote to stderr so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.root.socket())
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// SIGTERM; it must exit with status 0 within the deadline.
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Waits for wconfd to exit by itself; answers how it exited.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.process.wait_exit()
    }

    /// How many descriptors the daemon has open (connections among them).
    pub fn descriptors(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("the daemon's /proc/PID/fd")
            .count()
    }

    /// SIGSTOP, and wait until every thread of the daemon is stopped, so
    /// that whatever is sent now is read only after [`Wconfd::resume`].
    pub fn pause(&self) {
        self.process.pause();
    }

    /// SIGCONT after [`Wconfd::pause`].
    pub fn resume(&self) {
        self.process.resume();
    }

    /// Whether the process is still running (not exited).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}

/// Waits for `child` to exit, polling; fails the test after `within`.
pub fn wait_for_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let mut status = None;
    wait_until("the process exits", within, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status.expect("just checked")
}

/// A failed call: the error class and its arguments.
pub type Failure = (String, Value);

/// One connection to wconfd, speaking the framing of PROTOCOL.md "Framing".
pub struct Client {
    stream: UnixStream,
    /// Bytes received after the last frame returned.
    buffer: Vec<u8>,
}

impl Client {
    pub fn connect(socket: &Path) -> Client {
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(stream) => break stream,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => panic!("connect to wconfd: {error}"),
            }
        };
        Client::over(stream)
    }

    pub fn over(stream: UnixStream) -> Client {
        stream
            .set_read_timeout(Some(DEADLINE))
            .expect("set a read timeout");
        stream
            .set_write_timeout(Some(DEADLINE))
            .expect("set a write timeout");
        Client {
            stream,
            buffer: Vec::new(),
        }
    }

    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// A request and its answer; panics if the connection fails.
    pub fn call(&mut self, method: &str, args: Value) -> Result<Value, Failure> {
        self.try_call(method, args)
            .unwrap_or_else(|error| panic!("{method}: connection failed: {error}"))
    }

    /// A call that must succeed.
    pub fn ok(&mut self, method: &str, args: Value) -> Value {
        self.call(method, args.clone())
            .unwrap_or_else(|failure| panic!("{method} {args} failed: {failure:?}"))
    }

    /// A call that must fail: its class and its message.
    pub fn fails(&mut self, method: &str, args: Value) -> (String, String) {
        match self.call(method, args.clone()) {
            Ok(value) => panic!("{method} {args} answered {value} instead of failing"),
            Err((class, args)) => (class, message(&args)),
        }
    }

    /// A request and its answer, with connection errors as values.
    pub fn try_call(&mut self, method: &str, args: Value) -> io::Result<Result<Value, Failure>> {
        self.send(method, args)?;
        self.read_response()
    }

    /// Sends a request without waiting for its answer (Ganeti's client
    /// form: JSON, a newline, ETX).
    pub fn send(&mut self, method: &str, args: Value) -> io::Result<()> {
        let mut frame = serde_json::to_vec(&json!({"method": method, "args": args}))
            .expect("JSON to a Vec cannot fail");
        frame.extend_from_slice(b"\n\x03");
        self.stream.write_all(&frame)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next frame (without its ETX); `UnexpectedEof` if the daemon
    /// closed the connection, `WouldBlock`/`TimedOut` after the read
    /// timeout.
    pub fn read_frame(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|byte| *byte == ETX) {
                let mut frame: Vec<u8> = self.buffer.drain(..=end).collect();
                frame.pop();
                return Ok(frame);
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                // A socket with a timeout is interrupted by any signal.
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// The next response, checked to be exactly `{"success", "result"}`.
    pub fn read_response(&mut self) -> io::Result<Result<Value, Failure>> {
        let frame = self.read_frame()?;
        let response: Value = serde_json::from_slice(&frame).unwrap_or_else(|error| {
            panic!(
                "a response that is not JSON ({error}): {}",
                String::from_utf8_lossy(&frame)
            )
        });
        Ok(decode_response(response))
    }

    /// Waits until the daemon closes the connection: true if it did
    /// (end of file or reset), false if a frame arrived instead.
    pub fn closed_by_daemon(&mut self) -> bool {
        match self.read_frame() {
            Ok(_) => false,
            Err(error) => match error.kind() {
                io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe => true,
                _ => panic!("the connection neither closed nor answered: {error}"),
            },
        }
    }
}

/// A response as `Ok(result)` or `Err((class, args))`, checking its shape.
pub fn decode_response(response: Value) -> Result<Value, Failure> {
    let fields = response.as_object().expect("a response is an object");
    assert_eq!(
        fields.len(),
        2,
        "a response has exactly success and result: {response}"
    );
    match (&response["success"], &response["result"]) {
        (Value::Bool(true), result) => Ok(result.clone()),
        (Value::Bool(false), Value::Array(error)) if error.len() == 2 => {
            let class = error[0].as_str().expect("an error class").to_owned();
            assert!(error[1].is_array(), "error args are a list: {response}");
            Err((class, error[1].clone()))
        }
        _ => panic!("malformed response: {response}"),
    }
}

/// The message of a failure's arguments (its first, as Ganeti's errors).
pub fn message(args: &Value) -> String {
    match &args[0] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// How an [`OwnerProcess`] holds its livelock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// An exclusive flock, as warden's runners.
    Flock,
    /// A POSIX write lock (`fcntl.lockf`), as Ganeti's own processes.
    Posix,
}

/// The owner process: creates and locks its livelock, then reports each
/// SIGHUP ("hup N T", T the wall-clock time it was handled, in ns), answers "ping" with "pong N" (N: SIGHUPs so far), and
/// exits at the end of its stdin.
const OWNER_SCRIPT: &str = r#"
import fcntl, os, signal, sys, time
path, kind = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
if kind == "flock":
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
else:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
hups = 0
def on_hup(signum, frame):
    global hups
    hups += 1
    os.write(1, b"hup %d %d\n" % (hups, time.time_ns()))
signal.signal(signal.SIGHUP, on_hup)
os.write(1, b"ready\n")
pending = b""
while True:
    data = os.read(0, 4096)
    if not data:
        break
    pending += data
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        if line == b"ping":
            os.write(1, b"pong %d\n" % hups)
"#;

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

#[derive(Default)]
struct Hups {
    ready: bool,
    ended: bool,
    /// When each SIGHUP was handled, by the owner process's clock (the
    /// system's wall clock: shared with the test, unlike `Instant`).
    seen: Vec<SystemTime>,
}

/// A lock owner that is a real process holding its livelock
/// `<livelock_dir>/job_<id:06>_<n>` and counting the SIGHUPs it gets.
pub struct OwnerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    id: u64,
    path: PathBuf,
    hups: Arc<(Mutex<Hups>, Condvar)>,
    pongs: Receiver<usize>,
}

impl OwnerProcess {
    /// Job `id`, holding its livelock with an exclusive flock.
    pub fn spawn(livelock_dir: &Path, id: u64) -> OwnerProcess {
        OwnerProcess::spawn_holding(livelock_dir, id, LockKind::Flock)
    }

    /// Job `id`, holding its livelock with a POSIX write lock.
    pub fn spawn_posix(livelock_dir: &Path, id: u64) -> OwnerProcess {
        OwnerProcess::spawn_holding(livelock_dir, id, LockKind::Posix)
    }

    pub fn spawn_holding(livelock_dir: &Path, id: u64, kind: LockKind) -> OwnerProcess {
        let path = livelock_dir.join(format!("job_{id:06}_{}", next_serial()));
        let mut child = Command::new(python())
            .args(["-S", "-c", OWNER_SCRIPT])
            .arg(&path)
            .arg(match kind {
                LockKind::Flock => "flock",
                LockKind::Posix => "posix",
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        let stdout = child.stdout.take().expect("piped");
        let hups = Arc::new((Mutex::new(Hups::default()), Condvar::new()));
        let (pong_sender, pongs) = mpsc::channel();
        let shared = Arc::clone(&hups);
        std::thread::spawn(move || {
            let (state, changed) = &*shared;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                if line == "ready" {
                    state.ready = true;
                } else if let Some(hup) = line.strip_prefix("hup ") {
                    let nanos = hup
                        .split(' ')
                        .nth(1)
                        .and_then(|nanos| nanos.parse().ok())
                        .expect("hup N T");
                    state.seen.push(UNIX_EPOCH + Duration::from_nanos(nanos));
                } else if let Some(count) = line.strip_prefix("pong ") {
                    let _ = pong_sender.send(count.parse().expect("a count"));
                }
                changed.notify_all();
            }
            state.lock().unwrap_or_else(PoisonError::into_inner).ended = true;
            changed.notify_all();
        });
        let stdin = child.stdin.take();
        let owner = OwnerProcess {
            child,
            stdin,
            id,
            path,
            hups,
            pongs,
        };
        owner.wait_for("ready", |state| state.ready);
        owner
    }

    fn wait_for(&self, what: &str, condition: impl Fn(&Hups) -> bool) {
        let (state, changed) = &*self.hups;
        let deadline = Instant::now() + DEADLINE;
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        while !condition(&state) {
            assert!(
                !state.ended,
                "owner process {} ended while waiting for {what}",
                self.id
            );
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "owner process {}: not within {DEADLINE:?}: {what}",
                self.id
            );
            state = changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// `[id, livelock, pid]`, the owner on the wire.
    pub fn owner(&self) -> Value {
        json!([self.id, self.path, self.pid()])
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until at least `count` SIGHUPs arrived; answers when each was
    /// handled (compare with `SystemTime::now()` taken by the test).
    pub fn wait_for_hups(&self, count: usize, within: Duration) -> Vec<SystemTime> {
        let (state, changed) = &*self.hups;
        let deadline = Instant::now() + within;
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.seen.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "owner process {}: {} SIGHUPs, not {count} within {within:?}",
                self.id,
                state.seen.len()
            );
            state = changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.seen.clone()
    }

    /// The SIGHUPs handled so far, counting every signal sent to the
    /// process before this call (a round trip through the process: a
    /// signal already pending is handled before it answers).
    pub fn hups(&mut self) -> usize {
        let stdin = self
            .stdin
            .as_mut()
            .expect("the process was not told to exit");
        stdin
            .write_all(b"ping\n")
            .expect("write to the owner process");
        let count = self
            .pongs
            .recv_timeout(DEADLINE)
            .expect("the owner process answers a ping");
        let reported = self
            .hups
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .seen
            .len();
        assert_eq!(count, reported, "every SIGHUP handled was reported");
        count
    }

    /// Tells the process to exit (end of its stdin) and reaps it.
    pub fn exit(mut self) {
        self.stdin = None;
        let status = wait_for_exit(&mut self.child, DEADLINE);
        assert!(status.success(), "owner process exited with {status}");
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the owner process");
        self.child.wait().expect("reap the owner process");
    }
}

impl Drop for OwnerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ----- request helpers shared by the wconfd tests -----

/// A request `[[lock, action], ...]`.
pub fn request(entries: &[(&str, &str)]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|(lock, action)| json!([lock, action]))
            .collect(),
    )
}

/// `tryUpdateLocks`, which must not fail: its blockers (`[]`: applied).
pub fn try_update(client: &mut Client, owner: &OwnerProcess, entries: &[(&str, &str)]) -> Value {
    client.ok("tryUpdateLocks", json!([owner.owner(), request(entries)]))
}

/// `updateLocksWaiting`, which must not fail: its blockers.
pub fn update_waiting(
    client: &mut Client,
    owner: &OwnerProcess,
    priority: i64,
    entries: &[(&str, &str)],
) -> Value {
    client.ok(
        "updateLocksWaiting",
        json!([owner.owner(), priority, request(entries)]),
    )
}

pub fn list_locks(client: &mut Client, owner: &OwnerProcess) -> Value {
    client.ok("listLocks", json!([owner.owner()]))
}

pub fn pending(client: &mut Client, owner: &OwnerProcess) -> bool {
    client
        .ok("hasPendingRequest", json!([owner.owner()]))
        .as_bool()
        .expect("hasPendingRequest answers a bool")
}

/// `listLocksWaitingStatus`.
pub fn status(client: &mut Client) -> Value {
    client.ok("listLocksWaitingStatus", json!([]))
}
