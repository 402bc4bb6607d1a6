//! What the daemon benches share: a scratch directory for their roots, a
//! daemon process started on one of them, a lean client of either
//! daemon's socket (requests built by the typed request enums and encoded
//! once, replies checked without a copy), and the fsync probe that gives
//! every figure its floor.

use std::cell::Cell;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use serde_json::{Value, json};

use super::{Result, WithContext as _, fail, log_tail, percentile};
use crate::protocol::{ETX, Request};

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
        crate::sys::send_signal(child.id(), Signal::SIGTERM)
            .context(|| format!("cannot send SIGTERM to {}", self.name))?;
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .context(|| format!("cannot watch {}", self.name))?
            {
                break status;
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "{} did not stop within {} s of SIGTERM",
                    self.name,
                    PROCESS_TIMEOUT.as_secs()
                ));
            }
            thread::sleep(POLL_PAUSE);
        };
        self.child = None;
        if !status.success() {
            return fail(format!(
                "{} stopped with {status}:\n{}",
                self.name,
                log_tail(&self.log)
            ));
        }
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
