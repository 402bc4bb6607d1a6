//! `warden up`, and the daemons of `warden demo`: start wconfd, then luxid
//! (its jobs take their locks from wconfd), then, for `up`, a reporter
//! (`warden reporter` on the same root), each in its own process group so
//! that a Ctrl-C reaches only the launcher, which then stops them in
//! order: the reporter first (it saves its positions), luxid (its running
//! jobs go on and are adopted by the next luxid), then wconfd. If either
//! daemon dies, the launcher says so and stops the others. A reporter that
//! dies is only reported and started again after a pause, at most
//! [`REPORTER_RESTARTS_MAX`] times within [`REPORTER_RESTART_WINDOW`]: the
//! daemons never depend on it.

use std::collections::VecDeque;
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
use signal_hook_mio::v1_0::Signals;

use super::output::Output;
use super::{CliError, CliResult, Exit};
use crate::client::{Client, Daemon};
use crate::limits::{DAEMON_READY_RETRY_PAUSE, DAEMON_READY_WAIT, DAEMON_STOP_GRACE};
use crate::settings::Settings;
use crate::sys;

/// The binaries the launcher starts; they live beside `warden`.
const DAEMON_BINARIES: [&str; 3] = ["wconfd", "luxid", "job-runner"];

/// The reporter's name in the launcher's messages and logs.
const REPORTER: &str = "reporter";

/// A reporter that died is started again after this pause: long enough
/// that a reporter failing at once does not spin, short enough that the
/// metrics endpoint is back before a scrape notices.
const REPORTER_RESTART_PAUSE: Duration = Duration::from_secs(1);

/// At most this many restarts of the reporter within
/// [`REPORTER_RESTART_WINDOW`]; one more death and the launcher gives up
/// on it (a reporter that cannot run, say its endpoint's port taken, would
/// otherwise fill the log forever).
const REPORTER_RESTARTS_MAX: usize = 5;
const REPORTER_RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Where a daemon's log (its stderr) goes.
#[derive(Clone, Debug)]
pub enum Logs {
    /// To the launcher's stderr, each line prefixed with the daemon's name.
    Prefixed,
    /// To `<dir>/<daemon>.log`.
    Files(PathBuf),
}

/// One started process: a daemon or the reporter.
struct Running {
    name: &'static str,
    child: Child,
    pidfd: OwnedFd,
    /// Registered in the launcher's poll (its token: [`token_of`]).
    watched: bool,
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// What [`Daemons::wait`] woke up for.
#[derive(Debug)]
pub enum Wakeup {
    /// SIGINT, SIGTERM or SIGHUP arrived.
    Signal,
    /// A daemon exited.
    Daemon(Daemon, ExitStatus),
    /// The reporter (this pid) exited.
    Reporter(u32, ExitStatus),
    /// The time given to `wait` came.
    Timeout,
}

/// The poll of [`Daemons::wait`]: signals and a pidfd per process, made at
/// the first wait and kept, so that no signal is lost between waits.
struct Watch {
    poll: Poll,
    signals: Signals,
    events: Events,
}

const SIGNALS: Token = Token(usize::MAX);
const REPORTER_TOKEN: Token = Token(2);

fn token_of(daemon: Daemon) -> Token {
    match daemon {
        Daemon::Wconfd => Token(0),
        Daemon::Luxid => Token(1),
    }
}

/// Both daemons of a root, started and answering, and for `up` a reporter.
pub struct Daemons {
    pub root: PathBuf,
    /// wconfd, then luxid (the order of starting; stopping is reverse).
    running: Vec<(Daemon, Running)>,
    reporter: Option<Running>,
    logs: Logs,
    watch: Option<Watch>,
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
            reporter: None,
            logs,
            watch: None,
        };
        for daemon in [Daemon::Wconfd, Daemon::Luxid] {
            if let Err(error) = daemons.start_one(&binaries, daemon) {
                daemons.stop();
                return Err(error);
            }
        }
        Ok(daemons)
    }

    /// Spawns `program ARGS --root ROOT` in its own process group, its
    /// stderr to the logs, and opens its pidfd.
    fn spawn(&self, name: &'static str, program: &Path, args: &[&str]) -> CliResult<Running> {
        let mut command = Command::new(program);
        command
            .args(args)
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
            CliError::failure(format!("cannot start {}: {error}", program.display()))
        })?;
        if let Some(stderr) = child.stderr.take() {
            let forwarded = std::thread::Builder::new()
                .name(format!("{name}-log"))
                .spawn(move || forward_log(name, stderr));
            if let Err(error) = forwarded {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CliError::failure(format!("cannot start a thread: {error}")));
            }
        }
        match sys::pidfd_open(child.id()) {
            Ok(pidfd) => Ok(Running {
                name,
                child,
                pidfd,
                watched: false,
            }),
            Err(error) => {
                let pid = child.id();
                let _ = child.kill();
                let _ = child.wait();
                Err(CliError::failure(format!(
                    "cannot watch {name} (pid {pid}): {error}"
                )))
            }
        }
    }

    fn start_one(&mut self, binaries: &Path, daemon: Daemon) -> CliResult {
        let name = daemon.name();
        let running = self.spawn(name, &binaries.join(name), &[])?;
        self.running.push((daemon, running));
        let deadline = Instant::now() + DAEMON_READY_WAIT;
        loop {
            if Client::connect(&self.root, daemon, 4096).is_ok() {
                return Ok(());
            }
            let (_, running) = self.running.last_mut().expect("pushed above");
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

    /// Starts a reporter on the root: `warden reporter`, this very
    /// executable; its pid. It is not waited for: it has no socket, and
    /// whether it is elected is wconfd's to say (`warden status`).
    pub fn start_reporter(&mut self) -> CliResult<u32> {
        assert!(self.reporter.is_none(), "one reporter per launcher");
        let exe = std::env::current_exe().map_err(|error| {
            CliError::failure(format!("cannot find warden's executable: {error}"))
        })?;
        let mut running = self.spawn(REPORTER, &exe, &["reporter"])?;
        if let Some(watch) = &self.watch {
            register(watch, &mut running, REPORTER_TOKEN)?;
        }
        let pid = running.pid();
        self.reporter = Some(running);
        Ok(pid)
    }

    /// The reporter's pid, if one runs.
    pub fn reporter_pid(&self) -> Option<u32> {
        self.reporter.as_ref().map(Running::pid)
    }

    /// Where to look for a daemon's reasons: the tail of its log file, or
    /// (prefixed logs) the lines just printed.
    pub fn log_hint(&self, daemon: Daemon) -> String {
        self.log_hint_of(daemon.name())
    }

    fn log_hint_of(&self, name: &str) -> String {
        match &self.logs {
            Logs::Prefixed => " (its log is above)".to_owned(),
            Logs::Files(dir) => {
                let path = dir.join(format!("{name}.log"));
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
            .map(|(daemon, running)| (*daemon, running.pid()))
            .collect()
    }

    /// Stops the reporter, if one runs, by SIGTERM and, if it does not
    /// stop within [`DAEMON_STOP_GRACE`], SIGKILL; its exit.
    pub fn stop_reporter(&mut self) -> Option<ExitStatus> {
        let mut reporter = self.reporter.take()?;
        unwatch(self.watch.as_ref(), &reporter);
        Some(stop_child(&mut reporter))
    }

    /// Stops everything: the reporter, then the daemons, luxid first, each
    /// by SIGTERM and, if it does not stop within [`DAEMON_STOP_GRACE`],
    /// SIGKILL. Returns what each daemon's exit was.
    pub fn stop(&mut self) -> Vec<(Daemon, ExitStatus)> {
        self.stop_reporter();
        let mut stopped = Vec::new();
        while let Some((daemon, mut running)) = self.running.pop() {
            unwatch(self.watch.as_ref(), &running);
            let status = stop_child(&mut running);
            stopped.push((daemon, status));
        }
        stopped
    }

    /// Blocks until SIGINT, SIGTERM or SIGHUP arrives, a daemon or the
    /// reporter exits (it is then no longer among those running), or
    /// `until` comes.
    pub fn wait(&mut self, until: Option<Instant>) -> CliResult<Wakeup> {
        let failure = |error: std::io::Error| CliError::failure(format!("cannot wait: {error}"));
        if self.watch.is_none() {
            let poll = Poll::new().map_err(failure)?;
            let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(failure)?;
            poll.registry()
                .register(&mut signals, SIGNALS, Interest::READABLE)
                .map_err(failure)?;
            self.watch = Some(Watch {
                poll,
                signals,
                events: Events::with_capacity(8),
            });
        }
        let Daemons {
            running,
            reporter,
            watch,
            ..
        } = self;
        let watch = watch.as_mut().expect("made above");
        for (daemon, running) in running.iter_mut() {
            if !running.watched {
                register(watch, running, token_of(*daemon))?;
            }
        }
        if let Some(reporter) = reporter.as_mut()
            && !reporter.watched
        {
            register(watch, reporter, REPORTER_TOKEN)?;
        }
        loop {
            let timeout = until.map(|until| until.saturating_duration_since(Instant::now()));
            if let Err(error) = watch.poll.poll(&mut watch.events, timeout) {
                if error.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(failure(error));
            }
            let mut exited = false;
            for event in &watch.events {
                if event.token() == SIGNALS {
                    if watch.signals.pending().next().is_some() {
                        return Ok(Wakeup::Signal);
                    }
                } else {
                    exited = true;
                }
            }
            // Three processes at most: look at each rather than trust
            // which pidfd spoke.
            if exited {
                let dead = running
                    .iter_mut()
                    .position(|(_, running)| matches!(running.child.try_wait(), Ok(Some(_))));
                if let Some(index) = dead {
                    let (daemon, mut gone) = running.remove(index);
                    unwatch(Some(watch), &gone);
                    let status = gone.child.wait().map_err(failure)?;
                    return Ok(Wakeup::Daemon(daemon, status));
                }
                if let Some(mut gone) =
                    reporter.take_if(|reporter| matches!(reporter.child.try_wait(), Ok(Some(_))))
                {
                    unwatch(Some(watch), &gone);
                    let status = gone.child.wait().map_err(failure)?;
                    return Ok(Wakeup::Reporter(gone.pid(), status));
                }
            }
            if until.is_some_and(|until| Instant::now() >= until) {
                return Ok(Wakeup::Timeout);
            }
        }
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        self.stop();
    }
}

fn register(watch: &Watch, running: &mut Running, token: Token) -> CliResult {
    watch
        .poll
        .registry()
        .register(
            &mut SourceFd(&running.pidfd.as_raw_fd()),
            token,
            Interest::READABLE,
        )
        .map_err(|error| {
            CliError::failure(format!(
                "cannot watch {} (pid {}): {error}",
                running.name,
                running.pid()
            ))
        })?;
    running.watched = true;
    Ok(())
}

/// Takes a process out of the poll (before its pidfd closes).
fn unwatch(watch: Option<&Watch>, running: &Running) {
    if let Some(watch) = watch
        && running.watched
    {
        let _ = watch
            .poll
            .registry()
            .deregister(&mut SourceFd(&running.pidfd.as_raw_fd()));
    }
}

/// The reporter's restarts within the last [`REPORTER_RESTART_WINDOW`].
#[derive(Debug, Default)]
struct Restarts {
    at: VecDeque<Instant>,
}

impl Restarts {
    /// Whether one more restart is allowed at `now` (and if so, counts it).
    fn allow(&mut self, now: Instant) -> bool {
        while self
            .at
            .front()
            .is_some_and(|first| now.duration_since(*first) >= REPORTER_RESTART_WINDOW)
        {
            self.at.pop_front();
        }
        if self.at.len() >= REPORTER_RESTARTS_MAX {
            return false;
        }
        self.at.push_back(now);
        debug_assert!(self.at.len() <= REPORTER_RESTARTS_MAX);
        true
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
            running.name,
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

/// Copies a process's log lines to stderr as `  wconfd | ...`.
fn forward_log(name: &'static str, stderr: std::process::ChildStderr) {
    let reader = BufReader::new(stderr);
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let mut out = std::io::stderr().lock();
        let _ = writeln!(out, "{name:>8} | {line}");
    }
}

/// A daemon's (or the reporter's) exit in words.
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

/// `warden up`: both daemons and, with `reporter`, a reporter, until a
/// signal or a daemon's death.
pub fn up(root: &Path, output: &Output, reporter: bool) -> CliResult<Exit> {
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
    let mut restarts = Restarts::default();
    let mut restart_at = None;
    let mut reporter_line = String::new();
    if reporter {
        match daemons.start_reporter() {
            Ok(pid) => {
                reporter_line = format!("  reporter  {}  (pid {pid})\n", endpoint(&root));
            }
            Err(error) => restart_at = reporter_gone(output, &mut restarts, &error.message),
        }
    }
    output.note(&format!(
        "warden is up on {root}\n  wconfd    {}  (pid {})\n  luxid     {}  (pid {})\n{reporter_line}\
         Submit a job from another terminal:\n  warden {root_option}exec --watch -- echo hello\n  warden {root_option}list\n\
         Ctrl-C stops {}.",
        root.join(Daemon::Wconfd.socket_path()).display(),
        pid_of(Daemon::Wconfd),
        root.join(Daemon::Luxid.socket_path()).display(),
        pid_of(Daemon::Luxid),
        if reporter {
            "the reporter and both daemons"
        } else {
            "both daemons"
        },
        root = root.display(),
    ));
    loop {
        match daemons.wait(restart_at)? {
            Wakeup::Signal => {
                output.note(if daemons.reporter_pid().is_some() {
                    "warden: stopping the reporter, luxid, then wconfd"
                } else {
                    "warden: stopping luxid, then wconfd"
                });
                if let Some(status) = daemons.stop_reporter()
                    && !status.success()
                {
                    output.note(&format!("warden: {REPORTER} {}", describe(status)));
                }
                for (daemon, status) in daemons.stop() {
                    if !status.success() {
                        output.note(&format!("warden: {} {}", daemon.name(), describe(status)));
                    }
                }
                output
                    .note("warden: stopped; `warden up` on this root carries on where it left off");
                return Ok(Exit::Success);
            }
            Wakeup::Daemon(daemon, status) => {
                let mut others: Vec<&str> = daemons
                    .pids()
                    .iter()
                    .rev()
                    .map(|(other, _)| other.name())
                    .collect();
                if daemons.reporter_pid().is_some() {
                    others.insert(0, REPORTER);
                }
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
                return Ok(Exit::Unsuccessful);
            }
            Wakeup::Reporter(pid, status) => {
                let what = format!("{REPORTER} (pid {pid}) {}", describe(status));
                restart_at = reporter_gone(output, &mut restarts, &what);
            }
            Wakeup::Timeout => {
                restart_at = None;
                match daemons.start_reporter() {
                    Ok(pid) => {
                        output.note(&format!("warden: {REPORTER} started again (pid {pid})"))
                    }
                    Err(error) => {
                        restart_at = reporter_gone(output, &mut restarts, &error.message);
                    }
                }
            }
        }
    }
}

/// The reporter died or could not start (`what` says which): says so;
/// when to start another, or `None` if the restarts of the last minute
/// are used up.
fn reporter_gone(output: &Output, restarts: &mut Restarts, what: &str) -> Option<Instant> {
    let now = Instant::now();
    if restarts.allow(now) {
        output.note(&format!(
            "warden: {what}; starting another in {} s (the daemons go on)",
            REPORTER_RESTART_PAUSE.as_secs()
        ));
        Some(now + REPORTER_RESTART_PAUSE)
    } else {
        output.error(&format!(
            "{what}; restarted {REPORTER_RESTARTS_MAX} times within {} s already: giving up on the reporter (the daemons go on; `warden reporter` runs one by hand)",
            REPORTER_RESTART_WINDOW.as_secs()
        ));
        None
    }
}

/// Where the reporter serves its metrics, for `up`'s greeting.
fn endpoint(root: &Path) -> String {
    match Settings::load(root) {
        Ok(settings) if settings.metrics.listen.is_empty() => {
            "no metrics endpoint ([metrics] listen = \"\")".to_owned()
        }
        Ok(settings) => format!("http://{}/metrics", settings.metrics.listen),
        Err(error) => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reporter_is_restarted_at_most_five_times_a_minute() {
        let start = Instant::now();
        let mut restarts = Restarts::default();
        for second in 0..REPORTER_RESTARTS_MAX as u64 {
            assert!(restarts.allow(start + Duration::from_secs(second)));
        }
        let full = start + Duration::from_secs(REPORTER_RESTARTS_MAX as u64);
        assert!(!restarts.allow(full));
        assert!(!restarts.allow(start + REPORTER_RESTART_WINDOW - Duration::from_millis(1)));
        // A minute after the first, one more is allowed, then none again.
        assert!(restarts.allow(start + REPORTER_RESTART_WINDOW));
        assert!(!restarts.allow(start + REPORTER_RESTART_WINDOW));
        // After a quiet minute, the whole budget is back.
        let later = start + 3 * REPORTER_RESTART_WINDOW;
        for second in 0..REPORTER_RESTARTS_MAX as u64 {
            assert!(restarts.allow(later + Duration::from_secs(second)));
        }
        assert!(!restarts.allow(later + Duration::from_secs(30)));
    }
}
