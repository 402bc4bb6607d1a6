//! The `warden` command end to end, against real daemons: every command,
//! its `--json` shape, its exit codes and its errors; `up` and `demo` as a
//! user runs them; and every job file of `jobs/`, submitted and followed
//! to its end.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::daemon::{DEADLINE, Root, wait_for_exit, wait_until};
use crate::luxid::Cluster;

/// Exit codes of `warden` (`warden --help`).
pub(crate) const SUCCESS: i32 = 0;
const UNSUCCESSFUL: i32 = 1;
pub(crate) const USAGE: i32 = 2;
const DAEMON_DOWN: i32 = 3;
pub(crate) const REFUSED: i32 = 4;
const FAILURE: i32 = 5;

fn warden_binary() -> &'static str {
    env!("CARGO_BIN_EXE_warden")
}

/// `warden --root ROOT ARGS...`, run to its end.
pub(crate) fn warden(root: &Path, args: &[&str]) -> Output {
    warden_with_input(root, args, None)
}

fn warden_with_input(root: &Path, args: &[&str], input: Option<&str>) -> Output {
    let mut child = Command::new(warden_binary())
        .arg("--root")
        .arg(root)
        .args(args)
        .env_remove("WARDEN_ROOT")
        .env("NO_COLOR", "1")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn warden");
    if let Some(input) = input {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(input.as_bytes())
            .expect("write warden's stdin");
    }
    child.wait_with_output().expect("run warden")
}

pub(crate) fn code(output: &Output) -> i32 {
    output.status.code().expect("warden exits, not killed")
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `warden ARGS` expecting `expected` as exit code; its output.
pub(crate) fn expect(root: &Path, args: &[&str], expected: i32) -> Output {
    let output = warden(root, args);
    assert_eq!(
        code(&output),
        expected,
        "warden {args:?}\n--- stdout:\n{}\n--- stderr:\n{}",
        stdout(&output),
        stderr(&output)
    );
    output
}

/// Runs `warden --json ARGS`, expecting success; its JSON document.
pub(crate) fn json_of(root: &Path, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = expect(root, &all, SUCCESS);
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "warden {args:?} printed no JSON ({error}): {}",
            stdout(&output)
        )
    })
}

/// The one error line on stderr.
pub(crate) fn error_line(output: &Output) -> String {
    let text = stderr(output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one error line, got: {text}");
    assert!(lines[0].starts_with("warden: error: "), "{text}");
    lines[0].to_owned()
}

pub(crate) fn cluster_root(cluster: &Cluster) -> PathBuf {
    cluster.root().path()
}

/// Submits `argv` with `warden exec --json` plus `options`; its job id.
pub(crate) fn exec(root: &Path, options: &[&str], argv: &[&str]) -> u64 {
    let mut args = vec!["exec"];
    args.extend_from_slice(options);
    args.push("--");
    args.extend_from_slice(argv);
    let document = json_of(root, &args);
    document["jobs"][0]
        .as_u64()
        .unwrap_or_else(|| panic!("exec printed {document}"))
}

#[test]
fn every_job_file_in_jobs_is_run_by_the_demo_and_ends_as_expected() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("jobs");
    let mut files: Vec<String> = fs::read_dir(&dir)
        .expect("read jobs/")
        .map(|entry| {
            entry
                .expect("a jobs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".json"))
        .collect();
    files.sort();
    // Every file is either a job file the demo submits or the board farm
    // it registers, never both.
    let farm = &warden::cli::FARM;
    let job_files: Vec<&str> = warden::cli::EXAMPLES
        .iter()
        .map(|(file, _, _)| *file)
        .collect();
    assert!(!job_files.contains(&farm.file), "{}", farm.file);
    let mut in_demo: Vec<String> = job_files.iter().map(|file| (*file).to_owned()).collect();
    in_demo.push(farm.file.to_owned());
    in_demo.sort();
    assert_eq!(files, in_demo, "the demo runs every file of jobs/");
    assert!(job_files.len() >= 5, "{files:?}");
    for file in &files {
        let text = fs::read_to_string(dir.join(file)).expect("read a jobs/ file");
        let document: Value = serde_json::from_str(&text).expect("a jobs/ file is JSON");
        let first = &document[0];
        // A job file is a list of opcodes or a list of such lists; the
        // registrations file a list of workers (objects with caps).
        let is_registrations = first.get("caps").is_some();
        assert_eq!(is_registrations, *file == farm.file, "{file}");
        assert!(
            is_registrations || first.get("OP_ID").is_some() || first[0].get("OP_ID").is_some(),
            "{file} is neither a job file nor a registrations file"
        );
    }

    // The board farm, registered and let in as a user would.
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let farm_path = dir.join(farm.file);
    let registered = json_of(
        &root,
        &[
            "workers",
            "register",
            "--file",
            farm_path.to_str().expect("a UTF-8 path"),
        ],
    );
    let uuids: Vec<&str> = farm.expected.iter().map(|(uuid, _)| *uuid).collect();
    assert_eq!(registered["registered"], json!(uuids), "{registered}");
    for uuid in &uuids {
        expect(&root, &["workers", "state", uuid, "idle"], SUCCESS);
    }
    for (file, _, expected) in warden::cli::EXAMPLES {
        let path = dir.join(file);
        let submitted = json_of(&root, &["submit", path.to_str().expect("a UTF-8 path")]);
        let ids: Vec<u64> = submitted["jobs"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: {submitted}"))
            .iter()
            .map(|id| id.as_u64().expect("a job id"))
            .collect();
        assert_eq!(ids.len(), expected.len(), "{file}: {submitted}");
        for (id, expected) in ids.iter().zip(expected) {
            let output = warden(&root, &["watch", &id.to_string()]);
            let wanted = if *expected == "success" {
                SUCCESS
            } else {
                UNSUCCESSFUL
            };
            assert_eq!(
                code(&output),
                wanted,
                "{file} job {id}: {}",
                stdout(&output)
            );
            assert_eq!(cluster.status(*id), *expected, "{file} job {id}");
        }
    }
    // Once no prepare runs any more, every worker is in its expected state.
    let settled = || {
        let listing = json_of(&root, &["workers", "list"]);
        let workers = listing["workers"].as_array().expect("workers").clone();
        let busy = workers
            .iter()
            .any(|worker| worker["state"] == "PREPARE" || worker["state"] == "RUNNING");
        (!busy).then_some(workers)
    };
    let mut workers = None;
    wait_until("the farm's workers settle", DEADLINE, || {
        workers = settled();
        workers.is_some()
    });
    let workers = workers.expect("settled");
    for (uuid, state) in farm.expected {
        let worker = workers
            .iter()
            .find(|worker| worker["uuid"] == *uuid)
            .unwrap_or_else(|| panic!("{uuid} in {workers:?}"));
        assert_eq!(worker["state"], *state, "{worker}");
        if *state == "FAILED" {
            let reason = worker["fail_reason"].as_str().unwrap_or_default();
            assert!(reason.starts_with("prepare failed"), "{worker}");
        }
    }
}

#[test]
fn the_demo_runs_every_example_and_exits_zero() {
    let output = Command::new(warden_binary())
        .args(["demo", "--json"])
        .env("NO_COLOR", "1")
        .output()
        .expect("run warden demo");
    let text = stdout(&output);
    assert_eq!(code(&output), SUCCESS, "{text}\n{}", stderr(&output));
    let summary: Value = serde_json::from_str(&text).expect("the demo's JSON summary");
    assert_eq!(summary["as_expected"], json!(true), "{summary}");
    let jobs = summary["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 9, "{summary}");
    for job in jobs {
        assert_eq!(job["status"], job["expected"], "{summary}");
    }
    // The board farm ends as the demo says it must: the two alpha boards
    // back IDLE after holding the board-farm jobs, the beta board FAILED
    // by its prepare, never handed out.
    let farm_jobs: Vec<&Value> = jobs
        .iter()
        .filter(|job| job["file"] == "board-farm.json")
        .map(|job| &job["id"])
        .collect();
    assert_eq!(farm_jobs.len(), 3, "{summary}");
    let workers = summary["workers"].as_array().expect("workers");
    let states: Vec<(&str, &str)> = workers
        .iter()
        .map(|worker| {
            (
                worker["uuid"].as_str().expect("a uuid"),
                worker["state"].as_str().expect("a state"),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("board-a1", "IDLE"),
            ("board-a2", "IDLE"),
            ("board-b1", "FAILED")
        ],
        "{summary}"
    );
    let reason = workers[2]["fail_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("prepare failed: "), "{summary}");
    assert_eq!(workers[2]["jobs"], json!([]), "{summary}");
    let held: Vec<&Value> = workers[..2]
        .iter()
        .flat_map(|worker| worker["jobs"].as_array().expect("jobs"))
        .collect();
    let mut held_ids: Vec<u64> = held.iter().filter_map(|id| id.as_u64()).collect();
    held_ids.sort_unstable();
    let mut farm_ids: Vec<u64> = farm_jobs.iter().filter_map(|id| id.as_u64()).collect();
    farm_ids.sort_unstable();
    assert_eq!(
        held_ids, farm_ids,
        "each board-farm job held an alpha board"
    );
    // The tour itself goes to stderr beside --json: progress, the lock
    // table (when a waiter was caught), a job caught waiting for the
    // camera board another job holds, workers through PREPARE, the summary
    // and the workers at the end.
    let tour = stderr(&output);
    for part in [
        "registered the board farm of jobs/board-farm-workers.json",
        "submitting the example jobs",
        "progress",
        "waits (queued) for a worker another job holds: board-a2 is held by job",
        "worker board-a2 PREPARE  (job",
        "gave it back: its prepare runs",
        "worker board-b1 FAILED  (prepare failed: ",
        "summary:",
        "the workers at the end",
        "stopped luxid and wconfd",
    ] {
        assert!(tour.contains(part), "{part}: {tour}");
    }
}

/// `warden up` on a root, running until stopped.
struct Up {
    child: Child,
    /// The pids `up` printed for wconfd, luxid and the reporter.
    pids: Vec<(String, u32)>,
}

impl Up {
    fn start(root: &Path) -> Up {
        Up::start_with(root, &[])
    }

    /// `warden up OPTIONS --root ROOT`.
    fn start_with(root: &Path, options: &[&str]) -> Up {
        let mut child = Command::new(warden_binary())
            .arg("up")
            .args(options)
            .arg("--root")
            .arg(root)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn warden up");
        // `up` says where the daemons are once both answer, its last line
        // saying what Ctrl-C stops; read until then.
        let stderr = child.stderr.take().expect("piped");
        let (lines_in, lines_out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if lines_in.send(line).is_err() {
                    break;
                }
            }
        });
        let mut pids = Vec::new();
        let mut seen = Vec::new();
        loop {
            let line = lines_out
                .recv_timeout(DEADLINE)
                .unwrap_or_else(|_| panic!("warden up did not report its processes: {seen:?}"));
            if line.starts_with("Ctrl-C stops") {
                break;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [name @ ("wconfd" | "luxid" | "reporter"), .., "(pid", pid] = words.as_slice() {
                let pid = pid.trim_end_matches(')').parse().expect("a pid");
                pids.push(((*name).to_owned(), pid));
            }
            seen.push(line);
        }
        assert!(
            pids.len() >= 2,
            "warden up did not report both daemons: {seen:?}"
        );
        // Keep draining so that the daemons' logs never block on a full pipe.
        std::thread::spawn(move || while lines_out.recv().is_ok() {});
        Up { child, pids }
    }

    fn pid_of(&self, name: &str) -> u32 {
        self.pid_if(name).expect("up reported the process")
    }

    fn pid_if(&self, name: &str) -> Option<u32> {
        self.pids
            .iter()
            .find(|(named, _)| named == name)
            .map(|(_, pid)| *pid)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn process_exists(pid: u32) -> bool {
    // A zombie has exited too: check its state, not only its existence.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn up_serves_until_ctrl_c_and_a_second_up_carries_on_with_the_state() {
    let root = Root::new();
    let root = root.path();
    metrics_settings(&root, "");
    let mut up = Up::start(&root);
    let status = json_of(&root, &["status"]);
    assert_eq!(status["daemons"]["wconfd"]["up"], json!(true), "{status}");
    assert_eq!(status["daemons"]["luxid"]["up"], json!(true), "{status}");
    let id = exec(&root, &[], &["true"]);
    expect(&root, &["watch", &id.to_string()], SUCCESS);

    // A second `up` on a served root is refused, and changes nothing.
    let output = expect(&root, &["up"], FAILURE);
    assert!(
        error_line(&output).contains("already running"),
        "{}",
        stderr(&output)
    );

    let daemons = [
        up.pid_of("wconfd"),
        up.pid_of("luxid"),
        up.pid_of("reporter"),
    ];
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).expect("SIGINT warden up");
    let exit = wait_for_exit(&mut up.child, DEADLINE);
    assert!(exit.success(), "up after Ctrl-C: {exit}");
    for pid in daemons {
        assert!(
            !process_exists(pid),
            "daemon {pid} still runs after up stopped"
        );
    }
    let status = expect(&root, &["status", "--json"], DAEMON_DOWN);
    let status: Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(status["daemons"]["luxid"]["up"], json!(false), "{status}");

    let _up = Up::start(&root);
    let listed = json_of(&root, &["list"]);
    assert_eq!(listed[0]["id"], json!(id), "{listed}");
    assert_eq!(listed[0]["status"], json!("success"), "{listed}");
}

#[test]
fn up_stops_wconfd_and_fails_when_luxid_dies() {
    let root = Root::new();
    let root = root.path();
    metrics_settings(&root, "");
    let mut up = Up::start(&root);
    let wconfd = up.pid_of("wconfd");
    let reporter = up.pid_of("reporter");
    kill(Pid::from_raw(up.pid_of("luxid") as i32), Signal::SIGKILL).expect("SIGKILL luxid");
    let exit = wait_for_exit(&mut up.child, DEADLINE);
    assert_eq!(
        exit.code(),
        Some(UNSUCCESSFUL),
        "up after its luxid died: {exit}"
    );
    wait_until("wconfd is stopped", DEADLINE, || !process_exists(wconfd));
    assert!(!process_exists(reporter), "the reporter outlived up");
}

/// A TCP port nobody listens on now (bound and let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a free port")
        .port()
}

/// Writes `warden.toml` into `root` with `[metrics] listen` on a free
/// port (so that reporters of tests running together never meet on the
/// default one) and `more`; the address.
fn metrics_settings(root: &Path, more: &str) -> String {
    let listen = format!("127.0.0.1:{}", free_port());
    fs::write(
        root.join("warden.toml"),
        format!("[metrics]\nlisten = \"{listen}\"\n{more}"),
    )
    .expect("write warden.toml");
    listen
}

/// The pid `warden status --json` names as the elected reporter.
fn elected_reporter(root: &Path) -> Option<u64> {
    json_of(root, &["status"])["reporter"]["pid"].as_u64()
}

/// The parent of a process, from `/proc/<pid>/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[test]
fn up_starts_a_reporter_that_is_elected_and_no_reporter_starts_none() {
    let root = Root::new();
    let root = root.path();
    let listen = metrics_settings(&root, "");
    let mut up = Up::start(&root);
    let reporter = up.pid_of("reporter");
    assert_eq!(parent_of(reporter), Some(up.child.id()), "up's own child");
    wait_until("up's reporter is elected", DEADLINE, || {
        elected_reporter(&root) == Some(u64::from(reporter))
    });
    let status = json_of(&root, &["status"]);
    assert_eq!(status["reporter"]["standing_by"], json!(0), "{status}");
    assert_eq!(status["reporter"]["listen"], json!(listen), "{status}");
    let text = stdout(&expect(&root, &["status"], SUCCESS));
    let line = text
        .lines()
        .find(|line| line.starts_with("reporter"))
        .unwrap_or_else(|| panic!("no reporter line: {text}"));
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        ["reporter", "pid", &format!("{reporter},"), "elected"],
        "{text}"
    );
    // Ctrl-C stops the reporter too.
    kill(Pid::from_raw(up.child.id() as i32), Signal::SIGINT).expect("SIGINT warden up");
    let exit = wait_for_exit(&mut up.child, DEADLINE);
    assert!(exit.success(), "up after Ctrl-C: {exit}");
    assert!(!process_exists(reporter), "the reporter outlived up");

    let other = Root::new();
    let other = other.path();
    metrics_settings(&other, "");
    let up = Up::start_with(&other, &["--no-reporter"]);
    assert_eq!(up.pid_if("reporter"), None, "{:?}", up.pids);
    let status = json_of(&other, &["status"]);
    assert_eq!(
        status["reporter"]["pid"],
        Value::Null,
        "no reporter with --no-reporter: {status}"
    );
    assert_eq!(status["reporter"]["standing_by"], json!(0), "{status}");
    assert_eq!(status["metrics"], Value::Null, "{status}");
    assert!(status["reporter"]["metrics_error"].is_string(), "{status}");
    let text = stdout(&expect(&other, &["status"], SUCCESS));
    assert!(
        text.lines()
            .any(|line| line.split_whitespace().collect::<Vec<_>>()
                == ["reporter", "none", "elected"]),
        "{text}"
    );
    let locks = json_of(&other, &["locks"]);
    assert_eq!(
        locks["locks"],
        json!([]),
        "nothing holds service/reporter: {locks}"
    );
}

#[test]
fn up_starts_another_reporter_when_its_reporter_is_killed() {
    let root = Root::new();
    let root = root.path();
    metrics_settings(&root, "");
    let up = Up::start(&root);
    let first = up.pid_of("reporter");
    wait_until("up's reporter is elected", DEADLINE, || {
        elected_reporter(&root) == Some(u64::from(first))
    });
    kill(Pid::from_raw(first as i32), Signal::SIGKILL).expect("SIGKILL the reporter");
    let mut second = None;
    wait_until("another reporter is elected", DEADLINE, || {
        second = elected_reporter(&root).filter(|pid| *pid != u64::from(first));
        second.is_some()
    });
    let second = u32::try_from(second.expect("just found")).expect("a pid");
    assert_eq!(parent_of(second), Some(up.child.id()), "started by up");
    // The daemons went on all along.
    let status = json_of(&root, &["status"]);
    assert_eq!(status["daemons"]["wconfd"]["up"], json!(true), "{status}");
    assert_eq!(status["daemons"]["luxid"]["up"], json!(true), "{status}");
    for daemon in ["wconfd", "luxid"] {
        assert!(process_exists(up.pid_of(daemon)), "{daemon} still runs");
    }
    // A reporter standing by is counted, and named beside the elected one.
    let mut standby = Command::new(warden_binary())
        .args(["reporter", "--root"])
        .arg(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn warden reporter");
    wait_until("the second reporter stands by", DEADLINE, || {
        json_of(&root, &["status"])["reporter"]["standing_by"] == json!(1)
    });
    let text = stdout(&expect(&root, &["status"], SUCCESS));
    assert!(
        text.contains(&format!("pid {second}, elected (1 standing by)")),
        "{text}"
    );
    kill(Pid::from_raw(standby.id() as i32), Signal::SIGTERM).expect("SIGTERM the standby");
    let exit = wait_for_exit(&mut standby, DEADLINE);
    assert!(exit.success(), "a standby reporter stops cleanly: {exit}");
}

#[test]
fn status_json_carries_the_elected_reporters_figures() {
    let root = Root::new();
    let root = root.path();
    let listen = metrics_settings(&root, "");
    let up = Up::start(&root);
    let reporter = up.pid_of("reporter");
    let id = exec(&root, &[], &["/bin/true"]);
    expect(&root, &["watch", &id.to_string()], SUCCESS);
    let mut status = Value::Null;
    wait_until("the reporter counts the job", DEADLINE, || {
        status = json_of(&root, &["status"]);
        status["metrics"]["gauges"]["jobs"]["success"] == json!(1)
    });
    let metrics = &status["metrics"];
    for status_name in [
        "queued",
        "waiting",
        "canceling",
        "running",
        "canceled",
        "error",
    ] {
        assert_eq!(metrics["gauges"]["jobs"][status_name], json!(0), "{status}");
    }
    assert_eq!(
        metrics["counters"]["jobs_finished_total"]["success"],
        json!(1),
        "{status}"
    );
    assert_eq!(
        metrics["histograms"]["job_run_seconds"]["count"],
        json!(1),
        "{status}"
    );
    // The reporter's own positions beside the election.
    let ours = &status["reporter"];
    assert_eq!(ours["pid"], json!(reporter), "{status}");
    assert_eq!(ours["listen"], json!(listen), "{status}");
    assert_eq!(ours["metrics_error"], Value::Null, "{status}");
    assert!(ours["elected_at"].is_number(), "{status}");
    assert!(ours["read"]["luxid"].as_u64() > Some(0), "{status}");
    assert!(ours["hooks_done"]["wconfd"].is_u64(), "{status}");
    // The existing fields are all still there.
    for field in ["root", "daemons", "jobs", "locks", "workers"] {
        assert!(status.get(field).is_some(), "{field}: {status}");
    }
    assert_eq!(status["jobs"]["success"], json!(1), "{status}");

    // A reporter that does not answer: no figures, and status still
    // succeeds, within its short wait.
    let stopped = Pid::from_raw(reporter as i32);
    kill(stopped, Signal::SIGSTOP).expect("SIGSTOP the reporter");
    let started = std::time::Instant::now();
    let output = warden(&root, &["status", "--json"]);
    let took = started.elapsed();
    kill(stopped, Signal::SIGCONT).expect("SIGCONT the reporter");
    assert_eq!(code(&output), SUCCESS, "{}", stderr(&output));
    let status: Value = serde_json::from_slice(&output.stdout).expect("status JSON");
    assert_eq!(status["metrics"], Value::Null, "{status}");
    assert_eq!(status["reporter"]["pid"], json!(reporter), "{status}");
    assert!(
        status["reporter"]["metrics_error"]
            .as_str()
            .is_some_and(|why| why.contains("did not answer")),
        "{status}"
    );
    assert!(took < DEADLINE, "status waited {took:?} for the reporter");
}

#[test]
fn events_prints_a_jobs_events_filtered_by_since_and_type() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let id = exec(&root, &[], &["/bin/true"]);
    expect(&root, &["watch", &id.to_string()], SUCCESS);
    let id_field = format!("id={id}");

    // Text: one line an event; the job's from submitted to finished.
    let text = stdout(&expect(&root, &["events"], SUCCESS));
    let kinds: Vec<&str> = text
        .lines()
        .filter(|line| line.split_whitespace().any(|word| word == id_field))
        // date, time, daemon, seq, type, fields...
        .filter_map(|line| line.split_whitespace().nth(4))
        .collect();
    assert_eq!(kinds.first(), Some(&"job.submitted"), "{text}");
    assert_eq!(kinds.last(), Some(&"job.finished"), "{text}");
    assert!(kinds.contains(&"job.status"), "{text}");

    // JSON: one object a line, each saying which daemon gave it.
    let json = stdout(&expect(&root, &["events", "--json"], SUCCESS));
    let events: Vec<Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("{line}")))
        .collect();
    assert!(!events.is_empty(), "{json}");
    for event in &events {
        assert!(
            matches!(event["daemon"].as_str(), Some("luxid" | "wconfd")),
            "{event}"
        );
        assert!(
            event["seq"].is_u64() && event["type"].is_string(),
            "{event}"
        );
    }
    let job: Vec<&Value> = events
        .iter()
        .filter(|event| event["id"] == json!(id))
        .collect();
    assert_eq!(
        job.first().map(|event| &event["type"]),
        Some(&json!("job.submitted")),
        "{json}"
    );
    assert_eq!(
        job.last().map(|event| &event["type"]),
        Some(&json!("job.finished")),
        "{json}"
    );
    assert!(job.iter().all(|event| event["daemon"] == "luxid"), "{json}");

    // From luxid's start, only job.finished: just this job's end.
    let filtered = stdout(&expect(
        &root,
        &[
            "--json",
            "events",
            "--since",
            "luxid:0",
            "--type",
            "job.finished",
        ],
        SUCCESS,
    ));
    let finished: Vec<Value> = filtered
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(finished.len(), 1, "{filtered}");
    assert_eq!(finished[0]["type"], "job.finished", "{filtered}");
    assert_eq!(finished[0]["id"], json!(id), "{filtered}");
    assert_eq!(finished[0]["status"], "success", "{filtered}");
    assert_eq!(finished[0]["daemon"], "luxid", "{filtered}");

    // A position that is not one is a usage error.
    for bad in ["x", "luxid:x", "nobody:3"] {
        let output = expect(&root, &["events", "--since", bad], USAGE);
        assert!(
            error_line(&output).contains("--since"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn job_commands_print_stable_json() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);

    let ok = exec(
        &root,
        &["--env", "GREETING=hi"],
        &["sh", "-c", "echo $GREETING"],
    );
    let watched = expect(&root, &["watch", &ok.to_string()], SUCCESS);
    assert!(stdout(&watched).contains("hi"), "{}", stdout(&watched));
    assert!(
        stdout(&watched).contains(&format!("job {ok} success")),
        "{}",
        stdout(&watched)
    );

    let failing = exec(&root, &[], &["sh", "-c", "echo oops; exit 3"]);
    let watched = expect(
        &root,
        &["--json", "watch", &failing.to_string()],
        UNSUCCESSFUL,
    );
    let events: Vec<Value> = stdout(&watched)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON event per line"))
        .collect();
    assert!(
        events
            .iter()
            .any(|event| event["event"] == "log" && event["message"] == "oops"),
        "{events:?}"
    );
    let end = events.last().expect("an end event");
    assert_eq!(end["event"], "end", "{end}");
    assert_eq!(end["status"], "error", "{end}");
    assert!(end["elapsed_seconds"].as_f64().is_some(), "{end}");

    // exec --watch: the job's outcome is the exit code.
    expect(&root, &["exec", "--watch", "--", "true"], SUCCESS);
    expect(
        &root,
        &["exec", "--watch", "--timeout", "0.2", "--", "sleep", "5"],
        UNSUCCESSFUL,
    );

    let listed = json_of(&root, &["list"]);
    let first = &listed[0];
    for field in [
        "id",
        "status",
        "priority",
        "summary",
        "received_ts",
        "start_ts",
        "end_ts",
        "archived",
    ] {
        assert!(first.get(field).is_some(), "list lacks {field}: {first}");
    }
    let errors = json_of(&root, &["list", "--status", "error"]);
    assert_eq!(errors.as_array().map(Vec::len), Some(2), "{errors}");

    let info = json_of(&root, &["info", &failing.to_string()]);
    for field in warden::jobs::FIELDS {
        assert!(info.get(field).is_some(), "info lacks {field}: {info}");
    }
    assert_eq!(info["opresult"][0][0], "OpExecError", "{info}");
    let human = expect(&root, &["info", &failing.to_string()], SUCCESS);
    assert!(stdout(&human).contains("oops"), "{}", stdout(&human));

    // A job held back by a dependency can be reprioritised and canceled.
    // Its program's first line shows its opcode's work has begun: a
    // cancel now leaves it running (one that came just as `running` was
    // written would still stop it before its work).
    let blocker = exec(&root, &[], &["sh", "-c", "echo started; exec sleep 30"]);
    wait_until("the blocker's program runs", DEADLINE, || {
        cluster.query(blocker, &["oplog"])[0]
            .to_string()
            .contains("started")
    });
    let output = expect(&root, &["cancel", &blocker.to_string()], REFUSED);
    assert!(
        error_line(&output).contains("--kill"),
        "{}",
        stderr(&output)
    );
    let held = exec(
        &root,
        &["--depends", &format!("{blocker}:success")],
        &["true"],
    );
    let changed = json_of(&root, &["priority", &held.to_string(), "-10"]);
    assert_eq!(changed["priority"], json!(-10), "{changed}");
    let canceled = json_of(&root, &["cancel", &held.to_string()]);
    assert_eq!(canceled["canceled"], json!(true), "{canceled}");
    assert_eq!(cluster.wait_final(held), "canceled");
    let killed = json_of(&root, &["cancel", "--kill", &blocker.to_string()]);
    assert_eq!(killed["canceled"], json!(true), "{killed}");
    // LIVENESS.md "Who probes, when": a killed job ends `error` ("detected death of job N").
    assert_eq!(cluster.wait_final(blocker), "error");

    let archived = json_of(&root, &["archive", &ok.to_string()]);
    assert_eq!(archived, json!({"id": ok, "archived": true}));
    // A finished job, archived or not, is watched from its file: its whole
    // log, then its end.
    let watched = expect(&root, &["watch", &ok.to_string()], SUCCESS);
    assert!(stdout(&watched).contains("hi"), "{}", stdout(&watched));
    expect(&root, &["watch", &failing.to_string()], UNSUCCESSFUL);
    let listed = json_of(&root, &["list", "--archived", "--status", "success"]);
    assert!(
        listed
            .as_array()
            .expect("a list")
            .iter()
            .any(|job| job["id"] == json!(ok) && job["archived"] == json!(true)),
        "{listed}"
    );
    let auto = json_of(&root, &["autoarchive", "all"]);
    assert!(
        auto["archived"].as_u64().is_some_and(|count| count >= 3),
        "{auto}"
    );
    assert_eq!(json_of(&root, &["list"]), json!([]));

    assert_eq!(json_of(&root, &["drain", "on"]), json!({"drained": true}));
    let refused = expect(&root, &["exec", "--", "true"], REFUSED);
    assert!(
        error_line(&refused).contains("drained"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(json_of(&root, &["drain", "off"]), json!({"drained": false}));
    exec(&root, &[], &["true"]);
}

#[test]
fn submit_takes_one_job_or_several_from_a_file_or_stdin() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let one = warden_with_input(
        &root,
        &["--json", "submit", "-"],
        Some(r#"[{"OP_ID": "OP_EXEC", "argv": ["true"]}]"#),
    );
    assert_eq!(code(&one), SUCCESS, "{}", stderr(&one));
    let one: Value = serde_json::from_slice(&one.stdout).expect("JSON");
    assert_eq!(one["jobs"].as_array().map(Vec::len), Some(1), "{one}");

    let file = root.join("two.json");
    fs::write(
        &file,
        r#"[[{"OP_ID": "OP_EXEC", "argv": ["true"]}],
            [{"OP_ID": "OP_EXEC", "argv": ["true"], "depends": [[-1, ["success"]]]}]]"#,
    )
    .expect("write a job file");
    let two = json_of(&root, &["submit", file.to_str().expect("UTF-8")]);
    let ids: Vec<u64> = two["jobs"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|id| id.as_u64().expect("an id"))
        .collect();
    assert_eq!(ids.len(), 2, "{two}");
    for id in &ids {
        assert_eq!(cluster.wait_final(*id), "success");
    }
    // The relative dependency was made absolute against the first job.
    let info = json_of(&root, &["info", &ids[1].to_string()]);
    assert_eq!(
        info["ops"][0]["depends"],
        json!([[ids[0], ["success"]]]),
        "{info}"
    );
}

#[test]
fn locks_show_holders_waiters_and_who_blocks_whom() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let holder = exec(&root, &["--lock", "node/n1"], &["sleep", "30"]);
    wait_until("the holder runs", DEADLINE, || {
        cluster.status(holder) == "running"
    });
    let waiter = exec(
        &root,
        &["--lock", "node/n1:shared", "--priority", "-10"],
        &["true"],
    );
    wait_until("the waiter waits", DEADLINE, || {
        cluster.status(waiter) == "waiting"
    });

    let table = json_of(&root, &["locks"]);
    let node = table["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .find(|lock| lock["lock"] == "node/n1")
        .unwrap_or_else(|| panic!("node/n1 is held: {table}"));
    assert_eq!(
        node["owners"][0]["owner"]["ident"],
        json!(holder),
        "{table}"
    );
    assert_eq!(node["owners"][0]["mode"], "exclusive", "{table}");
    let waiters = table["waiters"].as_array().expect("waiters");
    assert_eq!(waiters.len(), 1, "{table}");
    assert_eq!(waiters[0]["owner"]["ident"], json!(waiter), "{table}");
    assert_eq!(waiters[0]["priority"], json!(-10), "{table}");
    assert_eq!(waiters[0]["blockers"][0]["ident"], json!(holder), "{table}");
    assert!(
        waiters[0]["waiting_seconds"]
            .as_f64()
            .is_some_and(|waited| waited >= 0.0),
        "{table}"
    );
    assert!(
        waiters[0]["request"]
            .as_array()
            .expect("request")
            .contains(&json!({"lock": "node/n1", "mode": "shared"})),
        "{table}"
    );

    let tree = json_of(&root, &["locks", "--tree"]);
    assert_eq!(tree["tree"][0]["owner"]["ident"], json!(holder), "{tree}");
    assert_eq!(
        tree["tree"][0]["blocks"][0]["owner"]["ident"],
        json!(waiter),
        "{tree}"
    );
    let human = stdout(&expect(&root, &["locks", "--tree"], SUCCESS));
    assert!(
        human.contains(&format!("job {holder}")) && human.contains(&format!("└─ job {waiter}")),
        "{human}"
    );
    let human = stdout(&expect(&root, &["locks"], SUCCESS));
    assert!(
        human.contains("LOCK") && human.contains("WAITER") && human.contains("node/n1"),
        "{human}"
    );

    let status = json_of(&root, &["status"]);
    assert_eq!(status["jobs"]["running"], json!(1), "{status}");
    assert_eq!(status["jobs"]["waiting"], json!(1), "{status}");
    assert_eq!(status["locks"]["waiters"], json!(1), "{status}");
    assert_eq!(
        status["daemons"]["luxid"]["drained"],
        json!(false),
        "{status}"
    );

    expect(&root, &["cancel", "--kill", &holder.to_string()], SUCCESS);
    assert_eq!(cluster.wait_final(waiter), "success");
    assert_eq!(json_of(&root, &["locks"])["waiters"], json!([]));
}

#[test]
fn errors_are_one_line_with_a_documented_exit_code() {
    // No daemon on the root: every client command says so, exit 3.
    let empty = Root::new();
    for args in [
        &["list"][..],
        &["info", "1"],
        &["watch", "1"],
        &["cancel", "1"],
        &["archive", "1"],
        &["autoarchive", "1d"],
        &["priority", "1", "0"],
        &["drain", "on"],
        &["locks"],
        &["exec", "--", "true"],
    ] {
        let output = expect(&empty.path(), args, DAEMON_DOWN);
        assert!(
            error_line(&output).contains("not running"),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    expect(&empty.path(), &["status"], DAEMON_DOWN);

    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    // Unknown jobs: refused, exit 4.
    for args in [
        &["info", "999"][..],
        &["watch", "999"],
        &["cancel", "999"],
        &["archive", "999"],
        &["priority", "999", "10"],
    ] {
        let output = expect(&root, args, REFUSED);
        assert!(
            error_line(&output).contains("999"),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    // Bad lock names and bad opcodes: refused by luxid, exit 4.
    let output = expect(
        &root,
        &["exec", "--lock", "nodes/n1", "--", "true"],
        REFUSED,
    );
    assert!(
        error_line(&output).contains("nodes/n1"),
        "{}",
        stderr(&output)
    );
    let output = warden_with_input(&root, &["submit", "-"], Some(r#"[{"OP_ID": "OP_NOPE"}]"#));
    assert_eq!(code(&output), REFUSED);
    assert!(
        error_line(&output).contains("OP_NOPE"),
        "{}",
        stderr(&output)
    );

    // Bad files and bad usage: exit 2, nothing submitted.
    let missing = root.join("missing.json");
    let output = expect(&root, &["submit", missing.to_str().expect("UTF-8")], USAGE);
    assert!(
        error_line(&output).contains("missing.json"),
        "{}",
        stderr(&output)
    );
    for bad in ["not json", "{}", "[]", "[1, 2]"] {
        let output = warden_with_input(&root, &["submit", "-"], Some(bad));
        assert_eq!(code(&output), USAGE, "{bad}: {}", stderr(&output));
        error_line(&output);
    }
    expect(&root, &["list", "--status", "bogus"], USAGE);
    expect(&root, &["exec", "--depends", "x", "--", "true"], USAGE);
    expect(&root, &["autoarchive", "soon"], USAGE);
    expect(&root, &["frobnicate"], USAGE);
    expect(&root, &["exec"], USAGE);
    assert_eq!(
        json_of(&root, &["list"]),
        json!([]),
        "nothing was submitted"
    );
}

#[test]
fn completions_are_printed_for_the_common_shells() {
    for shell in ["bash", "zsh", "fish"] {
        let output = expect(Path::new("/nonexistent"), &["completions", shell], SUCCESS);
        assert!(stdout(&output).contains("warden"), "{shell}");
    }
}

#[test]
fn a_watch_that_ends_in_error_prints_the_reason_last() {
    // Found from outside: `exec --watch` of a missing program printed
    // `status error` and the time, and the reason only `info` showed.
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let reason = "cannot start /no/such/program: No such file or directory";
    let watched = expect(
        &root,
        &["exec", "--watch", "--", "/no/such/program"],
        UNSUCCESSFUL,
    );
    let text = stdout(&watched);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines
            .iter()
            .rev()
            .nth(1)
            .is_some_and(|line| line.contains(" error after ")),
        "{text}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|line| line.starts_with(&format!("opcode 1 failed: {reason}"))),
        "{text}"
    );

    // A later opcode fails: its number and its reason, not the "Preceding
    // opcode failed" of the ones after it.
    let file = root.join("two-steps.json");
    fs::write(
        &file,
        r#"[{"OP_ID": "OP_EXEC", "argv": ["/bin/true"]},
            {"OP_ID": "OP_EXEC", "argv": ["/bin/sh", "-c", "exit 3"]},
            {"OP_ID": "OP_EXEC", "argv": ["/bin/true"]}]"#,
    )
    .expect("write the job file");
    let submitted = json_of(&root, &["submit", file.to_str().expect("a UTF-8 path")]);
    let id = submitted["jobs"][0].as_u64().expect("a job id");
    let watched = expect(&root, &["--json", "watch", &id.to_string()], UNSUCCESSFUL);
    let events: Vec<Value> = stdout(&watched)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON event per line"))
        .collect();
    let end = events.last().expect("an end event");
    assert_eq!(end["event"], "end", "{end}");
    assert_eq!(end["status"], "error", "{end}");
    assert_eq!(end["failed_opcode"], 2, "{end}");
    assert_eq!(end["reason"], "/bin/sh exited with code 3", "{end}");

    let watched = expect(
        &root,
        &["--json", "exec", "--watch", "--", "/no/such/program"],
        UNSUCCESSFUL,
    );
    let text = stdout(&watched);
    let end: Value = serde_json::from_str(text.lines().last().expect("an end event"))
        .expect("one JSON event per line");
    assert_eq!(end["failed_opcode"], 1, "{end}");
    assert!(
        end["reason"]
            .as_str()
            .is_some_and(|text| text.starts_with(reason)),
        "{end}"
    );

    // A job that succeeds has neither.
    let watched = expect(&root, &["--json", "exec", "--watch", "--", "true"], SUCCESS);
    let end: Value =
        serde_json::from_str(stdout(&watched).lines().last().expect("an end")).expect("JSON");
    assert_eq!(end["status"], "success", "{end}");
    assert!(
        end.get("reason").is_none() && end.get("failed_opcode").is_none(),
        "{end}"
    );
}

#[test]
fn workers_commands_register_list_let_in_and_hand_out_workers() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    for (uuid, arch) in [("b1", "arm64"), ("b2", "x86")] {
        let cap = format!("UUID={uuid}");
        let arch = format!("arch={arch}");
        expect(
            &root,
            &[
                "workers",
                "register",
                "--cap",
                &cap,
                "--cap",
                &arch,
                "--group",
                "lab",
                "--address",
                "10.0.0.1:5555",
            ],
            SUCCESS,
        );
    }
    let listing = json_of(&root, &["workers", "list", "--cap", "arch=arm64"]);
    assert_eq!(listing["total"], 1);
    assert_eq!(listing["workers"][0]["uuid"], "b1");
    assert_eq!(listing["workers"][0]["state"], "MAINTENANCE");
    let sorted = json_of(
        &root,
        &[
            "workers", "list", "--sort", "uuid", "--desc", "--limit", "1",
        ],
    );
    assert_eq!(sorted["workers"][0]["uuid"], "b2");
    assert_eq!(sorted["remaining"], 1);
    let table = stdout(&expect(&root, &["workers", "list"], SUCCESS));
    assert!(
        table.contains("MAINTENANCE") && table.contains("arch=arm64"),
        "{table}"
    );
    // A job asking for an arm64 board waits for it, then runs on it.
    let out = root.join("seen");
    let script = format!("echo $WARDEN_WORKER_UUID > {}", out.display());
    let id = exec(
        &root,
        &["--worker-cap", "arch=arm64"],
        &["/bin/sh", "-c", &script],
    );
    let info = json_of(&root, &["info", &id.to_string()]);
    assert_eq!(info["status"], "queued", "{info}");
    let waiting = stdout(&expect(&root, &["info", &id.to_string()], SUCCESS));
    assert!(
        waiting.contains("waiting for") && waiting.contains("arm64"),
        "{waiting}"
    );
    expect(&root, &["workers", "state", "b1", "idle"], SUCCESS);
    assert_eq!(cluster.wait_final(id), "success");
    assert_eq!(fs::read_to_string(&out).expect("ran").trim(), "b1");
    // status counts the workers by state and lists them.
    let status = json_of(&root, &["status"]);
    assert_eq!(status["workers"]["states"]["IDLE"], 1, "{status}");
    assert_eq!(status["workers"]["states"]["MAINTENANCE"], 1, "{status}");
    assert_eq!(status["workers"]["states"]["FAILED"], 0, "{status}");
    assert_eq!(status["workers"]["list"][0]["uuid"], "b1", "{status}");
    let shown = stdout(&expect(&root, &["status"], SUCCESS));
    assert!(
        shown.contains("1 MAINTENANCE, 1 IDLE") && shown.contains("arch=x86"),
        "{shown}"
    );
    // list and info name the worker the job ran on.
    let info = json_of(&root, &["info", &id.to_string()]);
    assert_eq!(info["workers"], json!(["b1"]), "{info}");
    let shown = stdout(&expect(&root, &["info", &id.to_string()], SUCCESS));
    assert!(shown.contains("workers   b1"), "{shown}");
    let listed = json_of(&root, &["list"]);
    assert_eq!(listed[0]["workers"], json!(["b1"]), "{listed}");
    let table = stdout(&expect(&root, &["list"], SUCCESS));
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|header| header.contains("WORKERS"))
            && table.contains(" b1 "),
        "{table}"
    );
    let worker = json_of(&root, &["workers", "info", "b1"]);
    assert_eq!(worker["history"][0]["job"], id);
    // Refusals are one line with the refused exit code.
    let failed = expect(&root, &["workers", "fail", "b2", "smoke"], REFUSED);
    assert!(
        error_line(&failed).contains("forbidden to set FAIL state"),
        "{}",
        stderr(&failed)
    );
    let never = warden(
        &root,
        &["exec", "--worker-cap", "arch=sparc", "--", "/bin/true"],
    );
    assert_eq!(code(&never), REFUSED);
    assert!(error_line(&never).contains("no registered worker matches"));
    expect(&root, &["workers", "deregister", "b2"], SUCCESS);
    let text = stderr(&expect(&root, &["workers", "info", "b2"], REFUSED));
    assert!(text.contains("Worker not found"), "{text}");
    // A registrations file: checked whole before anything is registered,
    // then registered in order; a refusal names the worker and those
    // registered before it.
    let file = root.join("farm.json");
    let path = file.to_str().expect("a UTF-8 path");
    fs::write(&file, r#"[{"caps": {"UUID": "b3"}, "group": ["lab"]}]"#).expect("write");
    let bad = expect(&root, &["workers", "register", "--file", path], USAGE);
    assert!(
        error_line(&bad).contains("worker 1 of the file: unknown field 'group'"),
        "{}",
        stderr(&bad)
    );
    fs::write(
        &file,
        r#"[{"caps": {"UUID": "b3"}, "groups": ["lab"], "prepare": ["true"]},
            {"caps": {"arch": "x86"}}]"#,
    )
    .expect("write");
    let refused = expect(&root, &["workers", "register", "--file", path], REFUSED);
    let line = error_line(&refused);
    assert!(
        line.contains("worker 2 of the file") && line.contains("(registered: b3)"),
        "{line}"
    );
    assert_eq!(
        json_of(&root, &["workers", "info", "b3"])["prepare"],
        json!(["true"])
    );
    let both = warden(
        &root,
        &["workers", "register", "--file", path, "--cap", "UUID=b4"],
    );
    assert_eq!(code(&both), USAGE, "{}", stderr(&both));
}
