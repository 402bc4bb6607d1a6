//! Ganeti 3.0's own Python WConfD client against the real wconfd binary.
//!
//! The client is Debian's `ganeti-3.0` package, unmodified: its Python tree
//! (`ganeti.wconfd.Client`, `ganeti.utils.livelock.LiveLock`, the error
//! classes of `ganeti.errors`), extracted by `tests/ganeti_client/setup.sh`
//! and run with `/usr/bin/python3`. Each test starts a wconfd in a fresh
//! temporary root ([`Wconfd`]) and runs one scenario script of
//! `tests/ganeti_client/` against it; a scenario prints what it does and
//! exits non-zero on its first failed check, and the test then fails with
//! the scenario's output and wconfd's log. The scenarios, one per test:
//! `locks.py` (echo and the lock calls), `waiting.py` (a waiting request
//! granted with SIGHUP), `config.py` (the config lock and config calls),
//! `config_verify.py` (a failed verification), `death.py` (an owner killed
//! with SIGKILL loses its locks); against wconfd and luxid, `luxi_jobs.py`
//! (`ganeti.luxi.Client` and `cli.PollJob`) and `gnt_job.py` (Ganeti's
//! `gnt-job` command, every subcommand, in a fake Ganeti root whose query
//! socket is luxid's) and `gnt_filter.py` (Ganeti's `gnt-filter`, every
//! subcommand, with rules holding real jobs).
//!
//! Where the client is: `WARDEN_GANETI_PYTHONPATH` (CI sets it from
//! setup.sh's output), else setup.sh's default cache directory
//! `target/ganeti-3.0`. If neither has it, the tests fail and say to run
//! setup.sh.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::daemon::Wconfd;
use crate::luxid::Cluster;

/// Ganeti's client runs with the system's Python, which the Debian
/// packages setup.sh installs belong to.
const PYTHON: &str = "/usr/bin/python3";

/// Where the scenario scripts and setup.sh live.
const SCENARIO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ganeti_client");

/// setup.sh's default cache directory, and the Python tree inside it.
const DEFAULT_PYTHONPATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/ganeti-3.0/usr/share/ganeti/3.0"
);

/// Longest a scenario may run (each of its own waits is 10 s at most).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn echo_and_locks() {
    run_scenario("locks.py", &[]);
}

#[test]
fn waiting_request_granted_with_sighup() {
    run_scenario("waiting.py", &[]);
}

#[test]
fn config_lock_read_write_verify_flush() {
    run_scenario("config.py", &[]);
}

#[test]
fn config_verify_failure_is_a_config_verify_error() {
    run_scenario("config_verify.py", &[]);
}

#[test]
fn killed_owner_loses_its_locks() {
    run_scenario("death.py", &[]);
}

#[test]
fn killed_owners_livelock_is_removed_by_cleanup() {
    run_scenario("death.py", &["livelock-removed"]);
}

#[test]
fn luxi_client_and_poll_job() {
    run_luxi_scenario("luxi_jobs.py");
}

/// Every subcommand of Ganeti's own `gnt-job` against luxid (before
/// `Query` existed, `gnt-job list` failed with "unknown method 'Query'").
#[test]
fn gnt_job_every_subcommand() {
    run_luxi_scenario("gnt_job.py");
}

/// Every subcommand of Ganeti's own `gnt-filter` against luxid, its rules
/// pausing, accepting and rate-limiting real jobs.
#[test]
fn gnt_filter_every_subcommand() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 8\n");
    run_scenario_on("gnt_filter.py", &[], &cluster.root().path(), &|| {
        cluster.logs()
    });
}

/// The PYTHONPATH holding Ganeti's `ganeti` package; fails the test with
/// what to do if there is none.
fn ganeti_pythonpath() -> PathBuf {
    let has_client = |path: &Path| path.join("ganeti/wconfd.py").is_file();
    if let Some(path) = std::env::var_os("WARDEN_GANETI_PYTHONPATH") {
        let path = PathBuf::from(path);
        assert!(
            has_client(&path),
            "WARDEN_GANETI_PYTHONPATH={} holds no ganeti/wconfd.py: \
             run `bash tests/ganeti_client/setup.sh` and set it to the path it prints",
            path.display()
        );
        return path;
    }
    let path = PathBuf::from(DEFAULT_PYTHONPATH);
    assert!(
        has_client(&path),
        "Ganeti 3.0's Python client was not found: WARDEN_GANETI_PYTHONPATH is unset and \
         {} holds no ganeti/wconfd.py. Run `bash tests/ganeti_client/setup.sh` (as root: it \
         installs Debian's python3-openssl, python3-pyparsing, python3-bitarray and \
         python3-simplejson, and extracts the ganeti-3.0 package there)",
        path.display()
    );
    path
}

/// Runs `tests/ganeti_client/<script> ROOT <args>` against a fresh wconfd;
/// panics with the scenario's output and wconfd's log unless it exits 0.
fn run_scenario(script: &str, args: &[&str]) {
    let wconfd = Wconfd::start();
    run_scenario_on(script, args, &wconfd.root().path(), &|| wconfd.log());
}

/// Runs a LUXI scenario against wconfd and luxid on a fresh root, luxid
/// running one job at a time.
fn run_luxi_scenario(script: &str) {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    run_scenario_on(script, &[], &cluster.root().path(), &|| cluster.logs());
}

fn run_scenario_on(script: &str, args: &[&str], root: &Path, logs: &dyn Fn() -> String) {
    let pythonpath = ganeti_pythonpath();
    let output_path = root.join(format!("ganeti-client.{script}.out"));
    let output = File::create(&output_path).expect("create the scenario's output file");
    let mut command = Command::new(PYTHON);
    command
        .arg(Path::new(SCENARIO_DIR).join(script))
        .arg(root)
        .args(args)
        .env("PYTHONPATH", &pythonpath)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("clone a file descriptor"))
        .stderr(output)
        // Its own process group: a timeout kills the scenario's helper
        // processes too.
        .process_group(0);
    let child = command
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {PYTHON}: {error}"));
    let outcome = wait_with_deadline(child, SCENARIO_TIMEOUT);
    let output = fs::read_to_string(&output_path).unwrap_or_default();
    let mut failure = match outcome {
        Ok(status) if status.success() => {
            // Shown with --nocapture.
            print!("{output}");
            return;
        }
        Ok(status) => format!("failed ({status})"),
        Err(()) => format!("did not finish within {SCENARIO_TIMEOUT:?} and was killed"),
    };
    if output.contains("ModuleNotFoundError") || output.contains("ImportError") {
        failure.push_str(
            " (Ganeti's client or a module it imports is missing: \
             run `bash tests/ganeti_client/setup.sh`)",
        );
    }
    panic!(
        "scenario {script} {args:?} {failure}\n\
         ---- its output ----\n{output}\n\
         ---- the daemons' logs ----\n{}",
        logs()
    );
}

/// Waits for a child that leads its own process group; after `timeout`,
/// answers `Err`. Either way, kills what is left of the group (helpers a
/// failed scenario left behind).
fn wait_with_deadline(mut child: Child, timeout: Duration) -> Result<ExitStatus, ()> {
    let group = Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"));
    let (sender, receiver) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let status = child.wait();
        let _ = sender.send(());
        status
    });
    let finished = receiver.recv_timeout(timeout).is_ok();
    // No member left is the usual case (ESRCH).
    let _ = killpg(group, Signal::SIGKILL);
    let status = waiter
        .join()
        .expect("the waiting thread does not panic")
        .expect("wait for the scenario");
    if finished { Ok(status) } else { Err(()) }
}
