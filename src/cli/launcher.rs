//! `warden up`, and the daemons of `warden demo`: start wconfd, then luxid
//! (its jobs take their locks from wconfd), each in its own process group
//! so that a Ctrl-C reaches only the launcher, which then stops them in
//! order: luxid first (its running jobs go on and are adopted by the next
//! luxid), then wconfd. If either daemon dies, the launcher says so and
//! stops the other.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::Signal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use super::output::Output;
use super::{CliError, CliResult, Exit};
use crate::client::{Client, Daemon};
use crate::limits::{DAEMON_READY_RETRY_PAUSE, DAEMON_READY_WAIT, DAEMON_STOP_GRACE};
use crate::sys;

/// The binaries the launcher starts; they live beside `warden`.
const DAEMON_BINARIES: [&str; 3] = ["wconfd", "luxid", "job-runner"];

/// Where a daemon's log (its stderr) goes.
#[derive(Clone, Debug)]
pub enum Logs {
    /// To the launcher's stderr, each line prefixed with the daemon's name.
    Prefixed,
    /// To `<dir>/<daemon>.log`.
    Files(PathBuf),
}

/// One started daemon.
pub struct Running {
    pub daemon: Daemon,
    child: Child,
    pidfd: OwnedFd,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Both daemons of a root, started and answering.
pub struct Daemons {
    pub root: PathBuf,
    /// wconfd, then luxid (the order of starting; stopping is reverse).
    running: Vec<Running>,
    logs: Logs,
}

impl Daemons {
    /// Starts wconfd and then luxid on `root`, each once the previous one
    /// answers; returns when both answer.
    pub fn start(root: &Path, logs: Logs) -> CliResult<Daemons> {
        let binaries = daemon_binaries()?;
        std::fs::create_dir_all(root).map_err(|error| {
            CliError::failure(format!(
                "cannot create the root {}: {error}",
                root.display()
            ))
        })?;
        let root = root.canonicalize().map_err(|error| {
            CliError::failure(format!(
                "cannot resolve the root {}: {error}",
                root.display()
            ))
        })?;
        if Client::connect(&root, Daemon::Wconfd, 4096).is_ok() {
            return Err(CliError::failure(format!(
                "warden is already running on {} (wconfd answers there); use it, or stop it first",
                root.display()
            )));
        }
        let mut daemons = Daemons {
            root,
            running: Vec::new(),
            logs,
        };
        for daemon in [Daemon::Wconfd, Daemon::Luxid] {
            if let Err(error) = daemons.start_one(&binaries, daemon) {
                daemons.stop();
                return Err(error);
            }
        }
        Ok(daemons)
    }

    fn start_one(&mut self, binaries: &Path, daemon: Daemon) -> CliResult {
        let name = daemon.name();
        let mut command = Command::new(binaries.join(name));
        command
            .arg("--root")
            .arg(&self.root)
            .env_remove("WARDEN_ROOT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0);
        match &self.logs {
            Logs::Prefixed => {
                command.stderr(Stdio::piped());
            }
            Logs::Files(dir) => {
                let path = dir.join(format!("{name}.log"));
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|error| {
                        CliError::failure(format!("cannot open {}: {error}", path.display()))
                    })?;
                command.stderr(file);
            }
        }
        let mut child = command.spawn().map_err(|error| {
            CliError::failure(format!(
                "cannot start {}: {error}",
                binaries.join(name).display()
            ))
        })?;
        if let Some(stderr) = child.stderr.take() {
            std::thread::Builder::new()
                .name(format!("{name}-log"))
                .spawn(move || forward_log(name, stderr))
                .map_err(|error| CliError::failure(format!("cannot start a thread: {error}")))?;
        }
        let pidfd = sys::pidfd_open(child.id()).map_err(|error| {
            CliError::failure(format!("cannot watch {name} (pid {}): {error}", child.id()))
        })?;
        self.running.push(Running {
            daemon,
            child,
            pidfd,
        });
        let deadline = Instant::now() + DAEMON_READY_WAIT;
        loop {
            if Client::connect(&self.root, daemon, 4096).is_ok() {
                return Ok(());
            }
            let running = self.running.last_mut().expect("pushed above");
            if let Ok(Some(status)) = running.child.try_wait() {
                return Err(CliError::failure(format!(
                    "{name} did not start ({}){}",
                    describe(status),
                    self.log_hint(daemon)
                )));
            }
            if Instant::now() > deadline {
                return Err(CliError::failure(format!(
                    "{name} did not answer on {} within {} s{}",
                    self.root.join(daemon.socket_path()).display(),
                    DAEMON_READY_WAIT.as_secs(),
                    self.log_hint(daemon)
                )));
            }
            std::thread::sleep(DAEMON_READY_RETRY_PAUSE);
        }
    }

    /// Where to look for a daemon's reasons: the tail of its log file, or
    /// (prefixed logs) the lines just printed.
    pub fn log_hint(&self, daemon: Daemon) -> String {
        match &self.logs {
            Logs::Prefixed => " (its log is above)".to_owned(),
            Logs::Files(dir) => {
                let path = dir.join(format!("{}.log", daemon.name()));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("; the end of {}:\n{}", path.display(), tail.join("\n"))
            }
        }
    }

    pub fn pids(&self) -> Vec<(Daemon, u32)> {
        self.running
            .iter()
            .map(|running| (running.daemon, running.pid()))
            .collect()
    }

    /// Stops the daemons, luxid first, each by SIGTERM and, if it does not
    /// stop within [`DAEMON_STOP_GRACE`], SIGKILL. Returns what each one's exit was.
    pub fn stop(&mut self) -> Vec<(Daemon, ExitStatus)> {
        let mut stopped = Vec::new();
        while let Some(mut running) = self.running.pop() {
            let status = stop_child(&mut running);
            stopped.push((running.daemon, status));
        }
        stopped
    }

    /// Blocks until SIGINT, SIGTERM or SIGHUP arrives (`Ok(None)`) or a
    /// daemon exits (`Ok(Some(..))`, that daemon and its exit).
    pub fn wait(&mut self) -> CliResult<Option<(Daemon, ExitStatus)>> {
        let failure = |error: std::io::Error| CliError::failure(format!("cannot wait: {error}"));
        let mut poll = Poll::new().map_err(failure)?;
        let mut signals =
            signal_hook_mio::v1_0::Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(failure)?;
        const SIGNALS: Token = Token(usize::MAX);
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(failure)?;
        for (index, running) in self.running.iter().enumerate() {
            poll.registry()
                .register(
                    &mut SourceFd(&running.pidfd.as_raw_fd()),
                    Token(index),
                    Interest::READABLE,
                )
                .map_err(failure)?;
        }
        let mut events = Events::with_capacity(8);
        loop {
            if let Err(error) = poll.poll(&mut events, None) {
                if error.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(failure(error));
            }
            for event in &events {
                if event.token() == SIGNALS {
                    if signals.pending().next().is_some() {
                        return Ok(None);
                    }
                } else if let Some(running) = self.running.get_mut(event.token().0)
                    && let Ok(Some(status)) = running.child.try_wait()
                {
                    let daemon = running.daemon;
                    self.running.remove(event.token().0);
                    return Ok(Some((daemon, status)));
                }
            }
        }
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SIGTERM, then SIGKILL after the grace; the exit status.
fn stop_child(running: &mut Running) -> ExitStatus {
    if let Ok(Some(status)) = running.child.try_wait() {
        return status;
    }
    let _ = sys::send_signal(running.pid(), Signal::SIGTERM);
    if !wait_readable(&running.pidfd, DAEMON_STOP_GRACE) {
        eprintln!(
            "warden: {} did not stop within {} s of SIGTERM; killing it",
            running.daemon.name(),
            DAEMON_STOP_GRACE.as_secs()
        );
        let _ = running.child.kill();
    }
    running
        .child
        .wait()
        .unwrap_or_else(|_| ExitStatus::from_raw(0))
}

/// Waits until `fd` is readable (a pidfd: its process exited) or `timeout`.
fn wait_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let Ok(mut poll) = Poll::new() else {
        return false;
    };
    if poll
        .registry()
        .register(&mut SourceFd(&fd.as_raw_fd()), Token(0), Interest::READABLE)
        .is_err()
    {
        return false;
    }
    let deadline = Instant::now() + timeout;
    let mut events = Events::with_capacity(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match poll.poll(&mut events, Some(left)) {
            Ok(()) if !events.is_empty() => return true,
            Ok(()) if left.is_zero() => return false,
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Copies a daemon's log lines to stderr as `wconfd | ...`.
fn forward_log(name: &'static str, stderr: std::process::ChildStderr) {
    let reader = BufReader::new(stderr);
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let mut out = std::io::stderr().lock();
        let _ = writeln!(out, "{name:>6} | {line}");
    }
}

/// A daemon's exit in words.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(0), _) => "exited cleanly".to_owned(),
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!(
            "killed by {}",
            Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.to_string())
        ),
        _ => format!("ended ({status})"),
    }
}

/// The directory holding the daemons' binaries: `warden`'s own. Under
/// `cargo run`, which builds only `warden`, missing ones are built first
/// (`cargo build --bins`, same profile), so that `cargo run --bin warden --
/// demo` works on a fresh checkout.
pub fn daemon_binaries() -> CliResult<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|error| CliError::failure(format!("cannot find warden's executable: {error}")))?;
    let dir = exe
        .parent()
        .ok_or_else(|| CliError::failure("warden's executable has no directory"))?
        .to_owned();
    let missing = || {
        DAEMON_BINARIES
            .iter()
            .filter(|name| !dir.join(name).is_file())
            .copied()
            .collect::<Vec<_>>()
    };
    if !missing().is_empty() {
        build_under_cargo(&dir);
    }
    let missing = missing();
    if missing.is_empty() {
        Ok(dir)
    } else {
        Err(CliError::failure(format!(
            "{} not found beside warden in {}: build all binaries (cargo build --release --bins)",
            missing.join(", "),
            dir.display()
        )))
    }
}

/// Builds the binaries if warden runs under `cargo run` (which tells its
/// programs where cargo and the manifest are).
fn build_under_cargo(dir: &Path) {
    let (Some(cargo), Some(manifest_dir)) = (
        std::env::var_os("CARGO"),
        std::env::var_os("CARGO_MANIFEST_DIR"),
    ) else {
        return;
    };
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--bins")
        .arg("--manifest-path")
        .arg(Path::new(&manifest_dir).join("Cargo.toml"));
    let release = dir.file_name().is_some_and(|name| name == "release");
    if release {
        command.arg("--release");
    }
    eprintln!(
        "warden: building wconfd, luxid and job-runner first (cargo build --bins{})",
        if release { " --release" } else { "" }
    );
    if let Err(error) = command.status() {
        eprintln!("warden: cannot run cargo: {error}");
    }
}

/// `warden up`.
pub fn up(root: &Path, output: &Output) -> CliResult<Exit> {
    let mut daemons = Daemons::start(root, Logs::Prefixed)?;
    let root = daemons.root.clone();
    let pids = daemons.pids();
    let pid_of = |daemon: Daemon| {
        pids.iter()
            .find(|(running, _)| *running == daemon)
            .map_or(0, |(_, pid)| *pid)
    };
    let root_option = if std::env::var_os("WARDEN_ROOT").is_some_and(|set| Path::new(&set) == root)
    {
        String::new()
    } else {
        format!("--root {} ", root.display())
    };
    output.note(&format!(
        "warden is up on {root}\n  wconfd  {}  (pid {})\n  luxid   {}  (pid {})\n\
         Submit a job from another terminal:\n  warden {root_option}exec --watch -- echo hello\n  warden {root_option}list\n\
         Ctrl-C stops both daemons.",
        root.join(Daemon::Wconfd.socket_path()).display(),
        pid_of(Daemon::Wconfd),
        root.join(Daemon::Luxid.socket_path()).display(),
        pid_of(Daemon::Luxid),
        root = root.display(),
    ));
    match daemons.wait()? {
        None => {
            output.note("warden: stopping luxid, then wconfd");
            for (daemon, status) in daemons.stop() {
                if !status.success() {
                    output.note(&format!("warden: {} {}", daemon.name(), describe(status)));
                }
            }
            output.note("warden: stopped; `warden up` on this root carries on where it left off");
            Ok(Exit::Success)
        }
        Some((daemon, status)) => {
            let others: Vec<&str> = daemons
                .pids()
                .iter()
                .map(|(other, _)| other.name())
                .collect();
            output.error(&format!(
                "{} {}; stopping {}",
                daemon.name(),
                describe(status),
                if others.is_empty() {
                    "nothing else".to_owned()
                } else {
                    others.join(" and ")
                }
            ));
            daemons.stop();
            Ok(Exit::Unsuccessful)
        }
    }
}
