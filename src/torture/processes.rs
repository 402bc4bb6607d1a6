//! The processes of a run: the daemons (started, killed with SIGKILL,
//! started again), the lock owners of the lock clients (each a `sleep`
//! process holding its livelock), and the job runners luxid starts (found
//! in /proc, killed with SIGKILL).

use crate::limits::TORTURE_DAEMON_READY_TIMEOUT;
use crate::limits::TORTURE_OWNER_READY_TIMEOUT;
use crate::limits::TORTURE_READY_POLL_PAUSE;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::liveness::Livelock;
use crate::locks::Owner;
use crate::protocol::wconfd::encode_owner;

use super::history::now_us;

/// Taken around every spawn of the harness: an owner's livelock descriptor
/// is inheritable only while its own `sleep` is spawned, and no other
/// child (a daemon) may inherit it meanwhile, or the owner would never
/// die.
static SPAWN: Mutex<()> = Mutex::new(());

pub fn spawn_guard() -> std::sync::MutexGuard<'static, ()> {
    SPAWN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The binaries a run starts.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub wconfd: PathBuf,
    pub luxid: PathBuf,
    /// Started by luxid, not by the harness; recognised in /proc.
    pub runner: PathBuf,
    /// `warden`, for its reporters.
    pub warden: PathBuf,
}

impl Binaries {
    /// The `wconfd`, `luxid` and `job-runner` beside the running
    /// executable.
    pub fn beside_this_executable() -> Result<Binaries, String> {
        let exe = std::env::current_exe()
            .map_err(|error| format!("cannot find this executable: {error}"))?;
        let find = |name: &str| {
            let path = exe.with_file_name(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "no {name} next to this executable ({}): build every binary \
                     (cargo build --bins)",
                    path.display()
                ))
            }
        };
        Ok(Binaries {
            wconfd: find("wconfd")?,
            luxid: find("luxid")?,
            runner: find("job-runner")?,
            warden: find("warden")?,
        })
    }
}

/// A daemon of the run: started on the root with its stderr appended to
/// `<root>/<name>.log`, killed with SIGKILL.
pub struct DaemonProcess {
    pub name: &'static str,
    binary: PathBuf,
    root: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
}

impl DaemonProcess {
    pub fn new(name: &'static str, binary: &Path, root: &Path, socket: &str) -> DaemonProcess {
        DaemonProcess {
            name,
            binary: binary.to_owned(),
            root: root.to_owned(),
            socket: root.join(socket),
            child: None,
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.root.join(format!("{}.log", self.name))
    }

    /// The last lines of the daemon's log, for a report.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Starts the daemon and waits until a connection reaches this very
    /// process (connect means ready). Err: it exited first, or hung.
    pub fn start(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log: File = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|error| format!("cannot open {}: {error}", self.log_path().display()))?;
        let child = {
            let _spawn = spawn_guard();
            Command::new(&self.binary)
                .arg("--root")
                .arg(&self.root)
                .env("WARDEN_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                // Its own group: a terminal's Ctrl-C reaches only the
                // harness, which kills what it started.
                .process_group(0)
                .spawn()
                .map_err(|error| format!("cannot start {}: {error}", self.binary.display()))?
        };
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + TORTURE_DAEMON_READY_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                return Err(format!(
                    "{} exited with {status} before serving; its log ends:\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            if let Ok(stream) = UnixStream::connect(&self.socket)
                && crate::sys::peer_credentials(&stream).is_ok_and(|peer| peer.pid == pid)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not answer within {TORTURE_DAEMON_READY_TIMEOUT:?}; its log ends:\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            std::thread::sleep(TORTURE_READY_POLL_PAUSE);
        }
    }

    /// If the daemon exited (on its own), how; it is reaped.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(status.to_string())
            }
            Ok(None) => None,
            Err(error) => Some(format!("an unknown state ({error})")),
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and reap it (SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        terminate(self.child.take(), grace);
    }
}

/// SIGTERM to every child, then each reaped; those still running after
/// `grace` get SIGKILL.
pub fn terminate(children: impl IntoIterator<Item = Child>, grace: Duration) {
    let children: Vec<Child> = children.into_iter().collect();
    for child in &children {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    for mut child in children {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What became of a lock owner's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerFate {
    Alive,
    /// Killed by the chaos thread (SIGKILL) at this time (µs, taken before
    /// the signal was sent).
    Killed {
        at_us: u64,
    },
    /// Ended by its client after it freed its locks.
    Exited,
}

struct OwnerInner {
    child: Option<Child>,
    fate: OwnerFate,
}

/// A lock owner of a lock client: a `sleep` process (SIGHUP ignored) that
/// holds the
/// owner's livelock (created with [`Livelock`], its descriptor handed on
/// to the process alone). The owner is `[ident, livelock, pid]`. Its fate
/// changes under one mutex, so a kill and a clean exit never cross (and a
/// pid is never signalled once reaped).
pub struct OwnerProcess {
    pub ident: String,
    pub livelock: PathBuf,
    pub pid: u32,
    inner: Mutex<OwnerInner>,
}

impl OwnerProcess {
    pub fn spawn(livelock_dir: &Path, ident: &str) -> Result<OwnerProcess, String> {
        let child = {
            let _spawn = spawn_guard();
            let livelock = Livelock::create(livelock_dir, ident)
                .map_err(|error| format!("cannot create livelock {ident}: {error}"))?;
            livelock
                .hand_on_to_children()
                .map_err(|error| format!("cannot hand on livelock {ident}: {error}"))?;
            // wconfd tells a waiting owner of its grant with SIGHUP, which
            // would end a plain `sleep`: `nohup` ignores it, then becomes
            // `sleep` (same pid).
            let child = Command::new("nohup")
                .args(["sleep", "1000000"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|error| format!("cannot start sleep for owner {ident}: {error}"))?;
            // Dropping our descriptor leaves the flock with the process
            // alone.
            drop(livelock);
            child
        };
        // Used only once SIGHUP is ignored (`nohup` did its part).
        let pid = child.id();
        let deadline = Instant::now() + TORTURE_OWNER_READY_TIMEOUT;
        while !ignores_sighup(pid) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "owner {ident}: process {pid} does not ignore SIGHUP within \
                     {TORTURE_OWNER_READY_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(OwnerProcess {
            ident: ident.to_owned(),
            livelock: livelock_dir.join(ident),
            pid: child.id(),
            inner: Mutex::new(OwnerInner {
                child: Some(child),
                fate: OwnerFate::Alive,
            }),
        })
    }

    /// The owner, as wconfd knows it.
    pub fn owner(&self) -> Owner {
        Owner::named(
            self.ident.clone(),
            self.livelock.to_string_lossy().into_owned(),
            self.pid,
        )
    }

    /// The owner on the wire (for reports).
    pub fn wire(&self) -> Value {
        encode_owner(&self.owner())
    }

    pub fn fate(&self) -> OwnerFate {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fate
    }

    /// How the process is, for a report: running, or how it ended.
    pub fn describe(&self) -> String {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let fate = inner.fate;
        match inner.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => format!("{fate:?}, process {} running", self.pid),
            Some(Ok(Some(status))) => format!("{fate:?}, process {} ended: {status}", self.pid),
            Some(Err(error)) => format!("{fate:?}, process {}: {error}", self.pid),
            None => format!("{fate:?}, process {} reaped", self.pid),
        }
    }

    /// SIGKILL, if still alive: answers whether it was killed now.
    pub fn kill9(&self) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.fate != OwnerFate::Alive {
            return false;
        }
        inner.fate = OwnerFate::Killed { at_us: now_us() };
        if let Some(mut child) = inner.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        true
    }

    /// A clean end, after its locks were freed: the livelock file is
    /// removed (as a runner releases its own), then the process ends.
    /// Answers the fate it had if it was not alive.
    pub fn exit(&self) -> OwnerFate {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.fate != OwnerFate::Alive {
            return inner.fate;
        }
        let _ = fs::remove_file(&self.livelock);
        inner.fate = OwnerFate::Exited;
        if let Some(mut child) = inner.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        OwnerFate::Alive
    }
}

impl Drop for OwnerProcess {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut child) = inner.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether process `pid` ignores SIGHUP (bit 0 of `SigIgn` in its status).
fn ignores_sighup(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("SigIgn:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & 1 != 0)
}

/// A job runner of the root found in /proc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RunnerProcess {
    pub job: u64,
    pub pid: u32,
}

/// The runners of `root` now running (`<runner> --root <root> <id>`),
/// ordered by job id.
pub fn runners(runner: &Path, root: &Path) -> Vec<RunnerProcess> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    let runner_name = runner.file_name().map(|name| name.as_encoded_bytes());
    let root = root.as_os_str().as_encoded_bytes();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
        if args.len() >= 4
            && Path::new(std::ffi::OsStr::from_bytes(args[0]))
                .file_name()
                .map(|name| name.as_encoded_bytes())
                == runner_name
            && args[1] == b"--root"
            && args[2] == root
            && let Some(job) = std::str::from_utf8(args[3])
                .ok()
                .and_then(|id| id.parse().ok())
            && !is_zombie(pid)
        {
            found.push(RunnerProcess { job, pid });
        }
    }
    // A runner's child between its fork and its exec still shows the
    // runner's command line: only the runner itself counts.
    let pids: Vec<u32> = found.iter().map(|runner| runner.pid).collect();
    found.retain(|runner| parent(runner.pid).is_none_or(|parent| !pids.contains(&parent)));
    found.sort();
    found
}

/// The parent of process `pid` (from /proc).
fn parent(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split(' ').nth(1)?.parse().ok()
}

/// Whether a process has exited and waits to be reaped (a runner whose
/// luxid was killed is reaped by init, a moment later).
fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
        })
        .unwrap_or(true)
}

/// SIGKILL to one runner process (not its group: the programs it started
/// keep the job's livelock, and luxid must deal with them).
pub fn kill_runner(binary: &Path, root: &Path, runner: RunnerProcess) -> bool {
    // Still that runner (not a pid reused since the scan)?
    if !runners(binary, root).contains(&runner) {
        return false;
    }
    kill(Pid::from_raw(runner.pid as i32), Signal::SIGKILL).is_ok()
}

/// SIGKILL to a runner's process group (the runner and its programs).
pub fn kill_runner_group(runner: RunnerProcess) {
    let _ = crate::sys::send_signal_to_group(runner.pid, Signal::SIGKILL);
}
