//! luxid with real job runners and a real wconfd, over LUXI (PROTOCOL.md "4. luxid methods", JOBS.md):
//! submission, queries, long polls, cancel, archive, priorities,
//! dependencies, lock contention, and the deaths of runners and of luxid.
//!
//! [`Cluster`] is a temp root with both daemons; jobs are real `job-runner`
//! processes running `OP_EXEC` programs and `OP_TEST_DELAY`s.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::daemon::{
    Client, DEADLINE, DaemonProcess, OwnerProcess, Root, Wconfd, timing_guard, try_update,
    wait_until,
};

/// LIVENESS.md "Targets": a runner killed with SIGKILL has its job marked `error` and
/// its locks free within this (the test also counts its own polling).
const DEATH_TO_FREE_MAX: Duration = Duration::from_millis(50);

/// A running (or stopped) luxid on a root; killed when dropped.
pub struct Luxid {
    process: DaemonProcess,
}

impl Luxid {
    pub fn socket(root: &Root) -> PathBuf {
        root.path().join("socket/luxid.sock")
    }

    pub fn start_on(root: &Root) -> Luxid {
        match Luxid::try_start_on(root) {
            Ok(luxid) => luxid,
            Err((status, log)) => panic!("luxid exited with {status} before serving:\n{log}"),
        }
    }

    /// Starts luxid on `root` and waits until it serves; if it exits first,
    /// answers its exit status and log.
    pub fn try_start_on(root: &Root) -> Result<Luxid, (ExitStatus, String)> {
        let process = DaemonProcess::start(
            "luxid",
            env!("CARGO_BIN_EXE_luxid"),
            root,
            &Luxid::socket(root),
        )?;
        Ok(Luxid { process })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// SIGSTOP until every thread stopped: what is sent now is read only
    /// after [`Luxid::resume`].
    pub fn pause(&self) {
        self.process.pause();
    }

    pub fn resume(&self) {
        self.process.resume();
    }

    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// wconfd and luxid on one temp root.
pub struct Cluster {
    pub wconfd: Wconfd,
    pub luxid: Luxid,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_with_settings("")
    }

    pub fn start_with_settings(toml: &str) -> Cluster {
        let root = Root::new();
        fs::write(root.path().join("warden.toml"), toml).expect("write warden.toml");
        let wconfd = Wconfd::restart_on(&root);
        let luxid = Luxid::start_on(&root);
        Cluster { wconfd, luxid }
    }

    pub fn root(&self) -> &Root {
        self.wconfd.root()
    }

    pub fn client(&self) -> Client {
        Client::connect(&Luxid::socket(self.root()))
    }

    pub fn wconfd_client(&self) -> Client {
        self.wconfd.client()
    }

    pub fn submit(&self, ops: Value) -> u64 {
        let id = self.client().ok("SubmitJob", json!([ops]));
        id.as_u64()
            .unwrap_or_else(|| panic!("SubmitJob answered {id}"))
    }

    /// QueryJobs of one job's fields.
    pub fn query(&self, id: u64, fields: &[&str]) -> Vec<Value> {
        let rows = self.client().ok("QueryJobs", json!([[id], fields]));
        rows[0].as_array().expect("a row").clone()
    }

    pub fn status(&self, id: u64) -> String {
        self.query(id, &["status"])[0]
            .as_str()
            .unwrap_or("(none)")
            .to_owned()
    }

    /// Waits until the job is final; answers its status.
    pub fn wait_final(&self, id: u64) -> String {
        let mut status = String::new();
        wait_until(&format!("job {id} finishes"), DEADLINE, || {
            status = self.status(id);
            matches!(status.as_str(), "success" | "error" | "canceled")
        });
        status
    }

    /// Dumps both logs (for a failing assertion's message).
    pub fn logs(&self) -> String {
        format!(
            "--- luxid:\n{}\n--- wconfd:\n{}",
            self.luxid.log(),
            self.wconfd.log()
        )
    }
}

fn exec(argv: &[&str]) -> Value {
    json!({"OP_ID": "OP_EXEC", "argv": argv})
}

fn delay(seconds: f64) -> Value {
    json!({"OP_ID": "OP_TEST_DELAY", "duration": seconds, "on_master": true})
}

fn log_messages(oplog: &Value) -> Vec<String> {
    oplog
        .as_array()
        .expect("a log")
        .iter()
        .map(|entry| entry[3].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_delay_job_runs_to_success_with_timestamps() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([delay(0.05)]));
    assert_eq!(id, 1);
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    let row = cluster.query(
        id,
        &[
            "id",
            "status",
            "opstatus",
            "opresult",
            "summary",
            "received_ts",
            "start_ts",
            "end_ts",
            "opstart",
            "opexec",
            "opend",
            "priority",
            "oppriority",
            "archived",
        ],
    );
    assert_eq!(row[0], json!(1));
    assert_eq!(row[2], json!(["success"]));
    assert_eq!(row[3], json!([null]));
    assert_eq!(row[4], json!(["TEST_DELAY(0.05)"]));
    let ts = |value: &Value| value[0].as_f64().unwrap() + value[1].as_f64().unwrap() / 1e6;
    let (received, started, ended) = (ts(&row[5]), ts(&row[6]), ts(&row[7]));
    let (op_start, op_exec, op_end) = (ts(&row[8][0]), ts(&row[9][0]), ts(&row[10][0]));
    assert!(received <= started && started <= op_start, "{row:?}");
    assert!(
        op_start <= op_exec && op_exec + 0.05 <= op_end + 1e-3,
        "{row:?}"
    );
    assert!(op_end <= ended, "{row:?}");
    assert_eq!(row[11], json!(0));
    assert_eq!(row[12], json!([0]));
    assert_eq!(row[13], json!(false));
}

#[test]
fn exec_output_becomes_the_log_and_exit_status_the_result() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([exec(&[
        "/bin/sh",
        "-c",
        "echo one; echo two >&2; exit 0"
    ])]));
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    let row = cluster.query(id, &["oplog", "opresult"]);
    let mut lines = log_messages(&row[0][0]);
    lines.sort();
    assert_eq!(lines, ["one", "two"]);
    assert_eq!(row[1][0]["exit_code"], json!(0));
    assert_eq!(row[1][0]["signal"], json!(null));
}

#[test]
fn a_failing_opcode_fails_the_ones_after_it() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([
        exec(&["/bin/true"]),
        exec(&["/bin/sh", "-c", "exit 3"]),
        delay(0.01)
    ]));
    assert_eq!(cluster.wait_final(id), "error", "{}", cluster.logs());
    let row = cluster.query(id, &["opstatus", "opresult"]);
    assert_eq!(row[0], json!(["success", "error", "error"]));
    assert_eq!(row[1][1][0], json!("OpExecError"));
    assert_eq!(row[1][1][1][1]["exit_code"], json!(3));
    assert_eq!(
        row[1][2],
        json!(["OpExecError", ["Preceding opcode failed"]])
    );
}

#[test]
fn invalid_submissions_are_refused_and_nothing_is_written() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let cases = [
        json!([]),
        json!([{"OP_ID": "OP_NO_SUCH_THING"}]),
        json!([{"OP_ID": "OP_EXEC", "argv": []}]),
        json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "priority": 7}]),
        json!([{"OP_ID": "OP_EXEC"}]),
        json!("not a list"),
    ];
    for ops in cases {
        let (class, message) = client.fails("SubmitJob", json!([ops]));
        assert_eq!(class, "OpPrereqError", "{ops}: {message}");
    }
    let serial = cluster.root().path().join("queue/serial");
    assert!(!serial.exists(), "nothing was submitted, yet serial exists");
    // The next valid job gets id 1.
    assert_eq!(cluster.submit(json!([exec(&["/bin/true"])])), 1);
}

#[test]
fn queries_of_unknown_jobs_and_fields() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let rows = client.ok("QueryJobs", json!([[42], ["id", "status"]]));
    assert_eq!(rows, json!([[42, null]]));
    let (class, _) = client.fails("QueryJobs", json!([[1], ["no_such_field"]]));
    assert_eq!(class, "OpPrereqError");
    let (class, _) = client.fails("WaitForJobChange", json!([42, ["status"], null, null, 1]));
    assert_eq!(class, "JobLost");
    assert_eq!(
        client.ok("CancelJob", json!([42])),
        json!([false, "Job 42 not found in queue"])
    );
    assert_eq!(client.ok("ArchiveJob", json!([42])), json!(false));
    let (class, _) = client.fails("NoSuchMethod", json!([]));
    assert_eq!(class, "GenericError");
}

#[test]
fn drained_queue_refuses_plain_submissions() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    assert_eq!(client.ok("SetDrainFlag", json!([true])), json!(true));
    assert_eq!(
        client.ok("QueryConfigValues", json!([["drain_flag"]])),
        json!([true])
    );
    let (class, message) = client.fails("SubmitJob", json!([[exec(&["/bin/true"])]]));
    assert_eq!(
        (class.as_str(), message.as_str()),
        ("GenericError", "Queue drained")
    );
    let id = client.ok("SubmitJobToDrainedQueue", json!([[exec(&["/bin/true"])]]));
    assert_eq!(id, json!(1));
    client.ok("SetDrainFlag", json!([false]));
    assert_eq!(
        client.ok("QueryConfigValues", json!([["drain_flag", "nope"]])),
        json!([false, null])
    );
    assert_eq!(cluster.wait_final(1), "success");
}

#[test]
fn wait_for_job_change_wakes_on_change_and_times_out() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([delay(0.3)]));
    let mut client = cluster.client();
    // A finished or changed view answers at once.
    let reply = client.ok("WaitForJobChange", json!([id, ["status"], null, null, 5]));
    let mut previous = reply[0].clone();
    let mut serial = 0;
    let started = Instant::now();
    while previous != json!(["success"]) {
        let reply = client.ok(
            "WaitForJobChange",
            json!([id, ["status"], previous, serial, 5]),
        );
        assert_ne!(
            reply[0], previous,
            "an answer before the timeout means a change"
        );
        for entry in reply[1].as_array().unwrap() {
            let entry_serial = entry[0].as_u64().unwrap();
            assert!(entry_serial > serial, "log entry {entry} resent");
            serial = entry_serial;
        }
        previous = reply[0].clone();
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    // A finished job answers at once, unchanged.
    let reply = client.ok(
        "WaitForJobChange",
        json!([id, ["status"], previous, serial, 5]),
    );
    assert_eq!(reply, json!([["success"], []]));
}

#[test]
fn wait_for_job_change_times_out_with_the_unchanged_view() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    let blocker = cluster.submit(json!([delay(5.0)]));
    let id = cluster.submit(json!([delay(0.01)]));
    let mut client = cluster.client();
    let view = client.ok("WaitForJobChange", json!([id, ["status"], null, null, 1]))[0].clone();
    assert_eq!(view, json!(["queued"]));
    let started = Instant::now();
    let reply = client.ok("WaitForJobChange", json!([id, ["status"], view, 0, 0.3]));
    let waited = started.elapsed();
    assert_eq!(reply, json!([["queued"], []]));
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    client.ok("CancelJob", json!([blocker, true]));
}

#[test]
fn cancel_of_a_queued_job_dequeues_it() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    let blocker = cluster.submit(json!([delay(5.0)]));
    let id = cluster.submit(json!([exec(&["/bin/true"])]));
    let mut client = cluster.client();
    assert_eq!(
        client.ok("CancelJob", json!([id])),
        json!([true, format!("Dequeued job {id}")])
    );
    assert_eq!(cluster.status(id), "canceled");
    let row = cluster.query(id, &["opstatus", "end_ts"]);
    assert_eq!(row[0], json!(["canceled"]));
    assert!(row[1].is_array());
    let finished = client.ok("CancelJob", json!([id]));
    assert_eq!(finished[0], json!(false));
    client.ok("CancelJob", json!([blocker, true]));
    assert_eq!(cluster.wait_final(blocker), "error");
}

#[test]
fn cancel_with_kill_ends_a_running_job_as_dead() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([exec(&["/bin/sleep", "30"])]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    let mut client = cluster.client();
    let reply = client.ok("CancelJob", json!([id]));
    assert_eq!(
        reply,
        json!([
            false,
            "Job no longer waiting, can't cancel (informed it anyway)"
        ])
    );
    assert_eq!(cluster.status(id), "running");
    let reply = client.ok("CancelJob", json!([id, true]));
    assert_eq!(reply[0], json!(true));
    assert_eq!(cluster.wait_final(id), "error", "{}", cluster.logs());
    let result = &cluster.query(id, &["opresult"])[0][0];
    assert_eq!(
        *result,
        json!(["OpExecError", [format!("detected death of job {id}")]])
    );
}

#[test]
fn two_jobs_contending_for_a_node_run_one_after_the_other() {
    let cluster = Cluster::start();
    let locked = |argv: &[&str]| json!({"OP_ID": "OP_EXEC", "argv": argv, "locks": [["node/n1", "exclusive"]]});
    let first = cluster.submit(json!([locked(&["/bin/sleep", "0.5"])]));
    wait_until("the first job runs", DEADLINE, || {
        cluster.status(first) == "running"
    });
    let second = cluster.submit(json!([locked(&["/bin/true"])]));
    wait_until("the second job waits for node/n1", DEADLINE, || {
        cluster.status(second) == "waiting"
    });
    assert_eq!(cluster.wait_final(first), "success");
    assert_eq!(cluster.wait_final(second), "success");
    let first_end = &cluster.query(first, &["end_ts"])[0];
    let second_exec = &cluster.query(second, &["opexec"])[0][0];
    let ts = |value: &Value| value[0].as_f64().unwrap() + value[1].as_f64().unwrap() / 1e6;
    assert!(
        ts(second_exec) >= ts(first_end) - 0.01,
        "{}",
        cluster.logs()
    );
}

#[test]
fn dependencies_order_jobs_and_refused_statuses_fail_them() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let results = client.ok(
        "SubmitManyJobs",
        json!([[
            [exec(&["/bin/sh", "-c", "sleep 0.2; exit 1"])],
            [{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "depends": [[-1, ["success"]]]}],
            [{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "depends": [[-2, ["error"]]]}],
        ]]),
    );
    assert_eq!(results, json!([[true, 1], [true, 2], [true, 3]]));
    assert_eq!(cluster.status(2), "queued");
    assert_eq!(cluster.wait_final(1), "error");
    assert_eq!(cluster.wait_final(2), "error", "{}", cluster.logs());
    assert_eq!(cluster.wait_final(3), "success", "{}", cluster.logs());
    let ops = &cluster.query(2, &["ops"])[0];
    assert_eq!(ops[0]["depends"], json!([[1, ["success"]]]));
}

#[test]
fn priorities_order_the_starts() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    let blocker = cluster.submit(json!([delay(0.3)]));
    let low = cluster.submit(json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "priority": 10}]));
    let normal = cluster.submit(json!([exec(&["/bin/true"])]));
    let high =
        cluster.submit(json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "priority": -10}]));
    for id in [blocker, low, normal, high] {
        assert_eq!(cluster.wait_final(id), "success");
    }
    let start = |id| {
        let value = cluster.query(id, &["start_ts"])[0].clone();
        value[0].as_f64().unwrap() + value[1].as_f64().unwrap() / 1e6
    };
    assert!(start(high) <= start(normal) && start(normal) <= start(low));
}

#[test]
fn change_priority_of_a_queued_job() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    let blocker = cluster.submit(json!([delay(5.0)]));
    let id = cluster.submit(json!([exec(&["/bin/true"])]));
    let mut client = cluster.client();
    let reply = client.ok("ChangeJobPriority", json!([id, -10]));
    assert_eq!(reply[0], json!(true));
    assert_eq!(
        cluster.query(id, &["priority", "oppriority"]),
        [json!(-10), json!([-10])]
    );
    let (class, _) = client.fails("ChangeJobPriority", json!([id, 5]));
    assert_eq!(class, "OpPrereqError");
    client.ok("CancelJob", json!([blocker, true]));
    assert_eq!(cluster.wait_final(id), "success");
}

#[test]
fn archive_moves_finished_jobs_and_keeps_them_queryable() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([exec(&["/bin/true"])]));
    assert_eq!(cluster.wait_final(id), "success");
    let mut client = cluster.client();
    assert_eq!(client.ok("ArchiveJob", json!([id])), json!(true));
    assert!(
        cluster
            .root()
            .path()
            .join(format!("queue/archive/0/job-{id}"))
            .exists()
    );
    assert_eq!(
        cluster.query(id, &["status", "archived"]),
        [json!("success"), json!(true)]
    );
    let all = client.ok("QueryJobs", json!([null, ["id"]]));
    assert_eq!(all, json!([]));
    let all = client.ok("QueryJobs", json!([null, ["id", "archived"]]));
    assert_eq!(all, json!([[id, true]]));
    let second = cluster.submit(json!([exec(&["/bin/true"])]));
    assert_eq!(cluster.wait_final(second), "success");
    assert_eq!(client.ok("AutoArchiveJobs", json!([-1, 10])), json!([1, 0]));
}

#[test]
fn a_killed_runner_fails_its_job_and_frees_its_locks() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([{
        "OP_ID": "OP_EXEC", "argv": ["/bin/sleep", "30"], "locks": [["node/n1", "exclusive"]]
    }]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    let job: Value = serde_json::from_slice(
        &fs::read(cluster.root().path().join(format!("queue/job-{id}"))).unwrap(),
    )
    .unwrap();
    let runner = job["process_id"]
        .as_u64()
        .expect("the runner recorded its pid") as i32;
    let mut wconfd = cluster.wconfd_client();
    // LIVENESS.md "Targets" (50 ms); measured with nothing else of the suite running.
    let _timing = timing_guard();
    let killed = Instant::now();
    kill(Pid::from_raw(runner), Signal::SIGKILL).unwrap();
    wait_until("the job is error and node/n1 free", DEADLINE, || {
        cluster.status(id) == "error"
            && wconfd
                .ok("listAllLocks", json!([]))
                .as_array()
                .unwrap()
                .iter()
                .all(|lock| lock != "node/n1")
    });
    let elapsed = killed.elapsed();
    println!("kill -9 of the runner to error and node/n1 free: {elapsed:?}");
    assert!(
        elapsed < DEATH_TO_FREE_MAX,
        "took {elapsed:?}:\n{}",
        cluster.logs()
    );
    let result = &cluster.query(id, &["opresult"])[0][0];
    assert_eq!(
        *result,
        json!(["OpExecError", [format!("detected death of job {id}")]])
    );
    assert!(
        !PathBuf::from(job["livelock"].as_str().unwrap()).exists(),
        "the dead job's livelock is removed"
    );
}

#[test]
fn a_second_luxid_on_the_same_root_refuses_to_start() {
    let cluster = Cluster::start();
    let (status, log) = match Luxid::try_start_on(cluster.root()) {
        Ok(_) => panic!("a second luxid started"),
        Err(failure) => failure,
    };
    assert!(!status.success());
    assert!(log.contains("another luxid"), "{log}");
}

#[test]
fn luxid_killed_while_jobs_run_follows_them_after_restart() {
    let mut cluster = Cluster::start();
    let id = cluster.submit(json!([exec(&["/bin/sleep", "0.5"])]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    cluster.luxid.kill9();
    cluster.luxid = Luxid::start_on(cluster.root());
    assert_eq!(cluster.status(id), "running");
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    // And new jobs still run.
    let next = cluster.submit(json!([exec(&["/bin/true"])]));
    assert_eq!(next, id + 1);
    assert_eq!(cluster.wait_final(next), "success");
}

#[test]
fn a_runner_that_died_while_luxid_was_down_is_error_before_luxid_serves() {
    let mut cluster = Cluster::start();
    let id = cluster.submit(json!([exec(&["/bin/sleep", "30"])]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    let job: Value = serde_json::from_slice(
        &fs::read(cluster.root().path().join(format!("queue/job-{id}"))).unwrap(),
    )
    .unwrap();
    cluster.luxid.kill9();
    // The whole job (runner and its sleep) dies while luxid is down.
    let runner = job["process_id"].as_u64().unwrap() as i32;
    nix::sys::signal::killpg(Pid::from_raw(runner), Signal::SIGKILL).unwrap();
    let livelock = PathBuf::from(job["livelock"].as_str().unwrap());
    wait_until("the job's livelock is released", DEADLINE, || {
        warden::liveness::is_dead(&livelock)
    });
    cluster.luxid = Luxid::start_on(cluster.root());
    assert_eq!(cluster.status(id), "error", "{}", cluster.logs());
}

/// luxid never waits on wconfd: with wconfd paused (a stopped or
/// overloaded daemon), the death of a runner holding a lock is noticed and
/// its job marked, and every client is answered at once meanwhile; once
/// wconfd is back, luxid's call frees the job's locks.
#[test]
fn a_paused_wconfd_does_not_hold_up_luxid() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([{
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/sleep", "300"],
        "locks": [["node/paused", "exclusive"]],
    }]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    let job: Value = serde_json::from_slice(
        &fs::read(cluster.root().path().join(format!("queue/job-{id}"))).unwrap(),
    )
    .unwrap();
    let runner = job["process_id"].as_u64().unwrap() as i32;
    cluster.wconfd.pause();
    kill(Pid::from_raw(runner), Signal::SIGKILL).expect("kill the runner");
    let answered_within = Duration::from_secs(1);
    let answered = |what: &str| {
        let asked = Instant::now();
        let status = cluster.status(id);
        assert!(
            asked.elapsed() < answered_within,
            "{what}: luxid took {:?} to answer\n{}",
            asked.elapsed(),
            cluster.logs()
        );
        status
    };
    wait_until("luxid marks the job dead", DEADLINE, || {
        answered("while the job dies") == "error"
    });
    // Past the moment luxid asked wconfd to free the locks.
    for _ in 0..20 {
        answered("after the job died");
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.wconfd.resume();
    wait_until("luxid's call frees the locks", DEADLINE, || {
        cluster
            .luxid
            .log()
            .contains("wconfd freed a dead job's locks")
    });
    let locks = cluster.wconfd_client().ok("listAllLocksOwners", json!([]));
    assert!(
        !locks.to_string().contains("node/paused"),
        "{locks}\n{}",
        cluster.logs()
    );
}

#[test]
fn submitted_jobs_survive_a_luxid_kill_and_a_stop() {
    let mut cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    let blocker = cluster.submit(json!([delay(5.0)]));
    let ids: Vec<u64> = (0..5)
        .map(|_| cluster.submit(json!([exec(&["/bin/true"])])))
        .collect();
    cluster.luxid.kill9();
    cluster.luxid = Luxid::start_on(cluster.root());
    cluster.luxid.stop();
    cluster.luxid = Luxid::start_on(cluster.root());
    for id in &ids {
        assert_eq!(cluster.status(*id), "queued");
    }
    cluster.client().ok("CancelJob", json!([blocker, true]));
    for id in ids {
        assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    }
}

#[test]
fn bad_requests_get_clear_errors_and_change_nothing() {
    let cluster = Cluster::start_with_settings("[luxid]\nframe_bytes_max = 65536\n");
    let mut client = cluster.client();
    // Not JSON, not UTF-8, not a request: an error each, the connection
    // stays usable.
    for bytes in [
        &b"{not json\n\x03"[..],
        b"\xff\xfe\x03",
        b"[1, 2]\x03",
        b"{\"method\": \"QueryJobs\"}\x03",
    ] {
        client.send_raw(bytes).unwrap();
        let (class, _) = client.read_response().unwrap().expect_err("an error");
        assert_eq!(class, "GenericError");
    }
    let wrong_shapes = [
        ("SubmitJob", json!([])),
        (
            "SubmitJob",
            json!([[{"OP_ID": "OP_EXEC", "argv": "true"}], 1]),
        ),
        ("SubmitManyJobs", json!(["x"])),
        ("QueryJobs", json!(["x", ["id"]])),
        ("QueryJobs", json!([[1], "id"])),
        ("WaitForJobChange", json!([1, ["status"], null, null])),
        ("WaitForJobChange", json!(["x", ["status"], null, null, 1])),
        ("WaitForJobChange", json!([1, ["status"], null, "x", 1])),
        ("CancelJob", json!([])),
        ("CancelJob", json!([1, "yes"])),
        ("ArchiveJob", json!([-3])),
        ("AutoArchiveJobs", json!(["old", 1])),
        ("ChangeJobPriority", json!([1, "high"])),
        ("SetDrainFlag", json!(["yes"])),
        ("QueryConfigValues", json!(["drain_flag"])),
    ];
    for (method, args) in wrong_shapes {
        let (class, message) = client.fails(method, args.clone());
        assert!(
            class == "GenericError" || class == "OpPrereqError",
            "{method} {args}: {class} {message}"
        );
    }
    assert_eq!(client.ok("QueryJobs", json!([null, ["id"]])), json!([]));
    assert!(!cluster.root().path().join("queue/serial").exists());
    // A frame over the limit: an error, then the connection is closed.
    let mut big = b"{\"method\": \"SubmitJob\", \"args\": [\"".to_vec();
    big.extend(std::iter::repeat_n(b'x', 70_000));
    client.send_raw(&big).unwrap();
    let (class, _) = client.read_response().unwrap().expect_err("an error");
    assert_eq!(class, "GenericError");
    assert!(client.closed_by_daemon());
    // Everyone else is still served.
    assert_eq!(
        cluster.client().ok("QueryJobs", json!([null, ["id"]])),
        json!([])
    );
}

#[test]
fn the_queue_limit_refuses_submissions_with_job_queue_full() {
    let cluster =
        Cluster::start_with_settings("[luxid]\nqueue_jobs_max = 2\nmax_running_jobs = 1\n");
    let mut client = cluster.client();
    client.ok("SubmitJob", json!([[delay(5.0)]]));
    client.ok("SubmitJob", json!([[exec(&["/bin/true"])]]));
    let (class, message) = client.fails("SubmitJob", json!([[exec(&["/bin/true"])]]));
    assert_eq!(class, "JobQueueFull", "{message}");
    let (class, _) = client.fails("SubmitManyJobs", json!([[[exec(&["/bin/true"])]]]));
    assert_eq!(class, "JobQueueFull");
    client.ok("CancelJob", json!([1, true]));
}

#[test]
fn a_submission_of_more_jobs_than_the_limit_is_refused_whole() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let over = warden::limits::SUBMIT_MANY_JOBS_MAX + 1;
    let jobs: Vec<Value> = (0..over).map(|_| json!([exec(&["/bin/true"])])).collect();
    let (class, message) = client.fails("SubmitManyJobs", json!([jobs]));
    assert_eq!(class, "GenericError", "{message}");
    assert!(message.to_string().contains("over the limit"), "{message}");
    // Nothing was written: the next job is job 1.
    assert_eq!(
        client.ok("SubmitJob", json!([[exec(&["/bin/true"])]])),
        json!(1)
    );
    assert_eq!(client.ok("QueryJobs", json!([null, ["id"]])), json!([[1]]));
}

#[test]
fn raising_a_waiting_jobs_priority_lets_it_pass_another_waiter() {
    let cluster = Cluster::start();
    let locked = |argv: &[&str]| json!({"OP_ID": "OP_EXEC", "argv": argv, "locks": [["node/n1", "exclusive"]]});
    let holder = cluster.submit(json!([locked(&["/bin/sleep", "0.6"])]));
    wait_until("the holder runs", DEADLINE, || {
        cluster.status(holder) == "running"
    });
    let first = cluster.submit(json!([locked(&["/bin/true"])]));
    wait_until("the first waiter waits", DEADLINE, || {
        cluster.status(first) == "waiting"
    });
    let second = cluster.submit(json!([locked(&["/bin/true"])]));
    wait_until("the second waiter waits", DEADLINE, || {
        cluster.status(second) == "waiting"
    });
    let reply = cluster
        .client()
        .ok("ChangeJobPriority", json!([second, -10]));
    assert_eq!(reply[0], json!(true), "{reply}");
    wait_until("the runner applies the new priority", DEADLINE, || {
        cluster.query(second, &["priority"])[0] == json!(-10)
    });
    for id in [holder, first, second] {
        assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    }
    let exec_at = |id| {
        let value = cluster.query(id, &["opexec"])[0][0].clone();
        value[0].as_f64().unwrap() + value[1].as_f64().unwrap() / 1e6
    };
    assert!(
        exec_at(second) <= exec_at(first),
        "the raised waiter ran first:\n{}",
        cluster.logs()
    );
}

/// LUXI replies carry no ids: on one connection they must leave in the
/// order of the requests, whether a request is answered at once, after the
/// turn's commit (a submission), or held (a `WaitForJobChange`). Sent in
/// one write, so that luxid reads them in one turn.
#[test]
fn pipelined_replies_leave_in_request_order() {
    let cluster = Cluster::start();
    let sleeper = cluster.submit(json!([exec(&["/bin/sleep", "300"])]));
    wait_until("the sleeper runs", DEADLINE, || {
        cluster.status(sleeper) == "running"
    });
    let mut client = cluster.client();
    let unchanged = json!(["running"]);
    let mut frames = Vec::new();
    for (method, args) in [
        ("SubmitJob", json!([[exec(&["/bin/true"])]])),
        (
            "WaitForJobChange",
            json!([sleeper, ["status"], unchanged, null, 0]),
        ),
        ("QueryConfigValues", json!([["cluster_name"]])),
        (
            "WaitForJobChange",
            json!([sleeper, ["status"], unchanged, null, 0.05]),
        ),
        ("SubmitJob", json!([[exec(&["/bin/true"])]])),
        (
            "WaitForJobChange",
            json!([sleeper, ["status"], unchanged, null, 0]),
        ),
    ] {
        frames.extend(serde_json::to_vec(&json!({"method": method, "args": args})).unwrap());
        frames.push(0x03);
    }
    client.send_raw(&frames).expect("send");
    let first = client
        .read_response()
        .expect("an answer")
        .expect("a job id");
    let no_change = json!([["running"], []]);
    assert_eq!(
        client.read_response().expect("an answer"),
        Ok(no_change.clone())
    );
    assert_eq!(
        client.read_response().expect("an answer"),
        Ok(json!(["warden"]))
    );
    assert_eq!(
        client.read_response().expect("an answer"),
        Ok(no_change.clone())
    );
    let second = client
        .read_response()
        .expect("an answer")
        .expect("a job id");
    assert_eq!(client.read_response().expect("an answer"), Ok(no_change));
    assert!(first.is_u64() && second.is_u64(), "{first} {second}");
    assert_eq!(second.as_u64(), first.as_u64().map(|id| id + 1));
    assert_eq!(cluster.wait_final(second.as_u64().unwrap()), "success");
}

#[test]
fn cancel_right_after_submit_cancels_and_never_kills() {
    // A cancel answered "will be canceled" must cancel. It once did not:
    // luxid answered from its copy of the job, which lags the runner's
    // writes, so a runner that had just written `running` ran its opcode
    // to `success` (one run in four under load). The pauses between the
    // submit and the cancel sweep the runner's way from its start to its
    // opcode's work.
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let mut answered = Vec::new();
    for step in 0..17u64 {
        for _ in 0..8 {
            let id = client
                .ok("SubmitJob", json!([[delay(0.3)]]))
                .as_u64()
                .unwrap();
            std::thread::sleep(Duration::from_micros(250 * step));
            answered.push((id, client.ok("CancelJob", json!([id]))));
        }
    }
    for (id, reply) in answered {
        let status = cluster.wait_final(id);
        if reply[0] == json!(true) {
            // "Job N will be canceled", or "Dequeued job N" if it had
            // not started.
            assert_eq!(status, "canceled", "job {id}, answered {reply}");
        } else {
            // The runner reached its opcode's work before the cancel:
            // PROTOCOL.md "CancelJob" leaves a running opcode alone (the runner, informed,
            // cancels at the next opcode boundary), so the job ends
            // `success` or `canceled`, never killed (`error`).
            assert_eq!(
                reply,
                json!([
                    false,
                    "Job no longer waiting, can't cancel (informed it anyway)"
                ]),
                "job {id}"
            );
            assert!(
                status == "success" || status == "canceled",
                "job {id} {status}: {}",
                cluster.logs()
            );
        }
    }
}

#[test]
fn luxid_killed_during_a_burst_of_submissions_keeps_every_acknowledged_job() {
    let mut cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 4\n");
    let socket = Luxid::socket(cluster.root());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Clients submit as fast as they can and keep every id acknowledged to
    // them; a failed call (luxid gone) makes them reconnect.
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let socket = socket.clone();
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(stream) = UnixStream::connect(&socket) else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    let mut client = Client::over(stream);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match client.try_call("SubmitJob", json!([[exec(&["/bin/true"])]])) {
                            Ok(Ok(id)) => acknowledged.push(id.as_u64().expect("an id")),
                            Ok(Err(failure)) => panic!("SubmitJob failed: {failure:?}"),
                            Err(_) => break,
                        }
                    }
                }
                acknowledged
            })
        })
        .collect();
    // After each kill, the first id handed out is past every job file
    // on disk (so past every id ever acknowledged).
    let highest_job_file = |cluster: &Cluster| {
        fs::read_dir(cluster.root().path().join("queue"))
            .expect("the queue")
            .flatten()
            .filter_map(|entry| {
                entry
                    .file_name()
                    .to_str()?
                    .strip_prefix("job-")?
                    .parse()
                    .ok()
            })
            .max()
            .unwrap_or(0u64)
    };
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(150));
        cluster.luxid.kill9();
        let highest = highest_job_file(&cluster);
        cluster.luxid = Luxid::start_on(cluster.root());
        let first = cluster.submit(json!([exec(&["/bin/true"])]));
        assert!(
            first > highest,
            "id {first} handed out again (job files up to {highest})"
        );
    }
    std::thread::sleep(Duration::from_millis(150));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acknowledged: Vec<u64> = clients
        .into_iter()
        .flat_map(|client| client.join().expect("a client thread"))
        .collect();
    let count = acknowledged.len();
    acknowledged.sort_unstable();
    acknowledged.dedup();
    assert_eq!(acknowledged.len(), count, "an id was handed out twice");
    assert!(count > 10, "only {count} submissions in the burst");
    let rows = cluster
        .client()
        .ok("QueryJobs", json!([acknowledged, ["id", "status"]]));
    for (id, row) in acknowledged.iter().zip(rows.as_array().unwrap()) {
        assert!(
            row[1].is_string(),
            "acknowledged job {id} is missing after the restarts: {row}"
        );
    }
    let next = cluster.submit(json!([exec(&["/bin/true"])]));
    assert!(next > *acknowledged.last().unwrap());
    for id in acknowledged {
        let status = cluster.wait_final(id);
        if status != "success" {
            let mut logs = String::new();
            for entry in fs::read_dir(cluster.root().path()).unwrap().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("luxid.") {
                    logs += &format!("--- {name}\n{}", fs::read_to_string(entry.path()).unwrap());
                }
            }
            panic!(
                "job {id} ended {status}: {:?}\n{logs}",
                cluster.query(id, &["opresult", "oplog", "start_ts"])
            );
        }
    }
}

#[test]
fn a_multi_opcode_job_goes_through_each_opcode_in_order() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([delay(0.1), exec(&["/bin/echo", "two"]), delay(0.1)]));
    let mut client = cluster.client();
    let fields = json!(["status", "opstatus"]);
    let mut views = Vec::new();
    let mut previous = Value::Null;
    let mut serial = Value::Null;
    loop {
        let reply = client.ok("WaitForJobChange", json!([id, fields, previous, serial, 5]));
        if let Some(last) = reply[1].as_array().and_then(|log| log.last()) {
            serial = last[0].clone();
        }
        previous = reply[0].clone();
        if views.last() != Some(&previous) {
            views.push(previous.clone());
        }
        if previous[0] == json!("success") {
            break;
        }
    }
    // Every view an opcode further than the one before; never backwards.
    let rank = |status: &Value| match status.as_str().unwrap() {
        "queued" => 0,
        "waiting" => 1,
        "running" => 2,
        "success" => 3,
        other => panic!("unexpected opcode status {other}"),
    };
    for pair in views.windows(2) {
        let before: Vec<i32> = pair[0][1].as_array().unwrap().iter().map(rank).collect();
        let after: Vec<i32> = pair[1][1].as_array().unwrap().iter().map(rank).collect();
        assert!(
            before.iter().zip(&after).all(|(b, a)| b <= a),
            "went backwards: {views:?}"
        );
    }
    assert!(views.len() >= 4, "too few views seen: {views:?}");
    let row = cluster.query(id, &["opstart", "opexec", "opend", "oplog"]);
    let ts = |value: &Value| value[0].as_f64().unwrap() + value[1].as_f64().unwrap() / 1e6;
    for op in 0..3 {
        assert!(ts(&row[0][op]) <= ts(&row[1][op]) && ts(&row[1][op]) <= ts(&row[2][op]));
        if op > 0 {
            assert!(ts(&row[2][op - 1]) <= ts(&row[0][op]), "{row:?}");
        }
    }
    assert_eq!(log_messages(&row[3][1]), ["two"]);
}

#[test]
fn luxid_refuses_to_start_without_wconfd() {
    let root = Root::new();
    let (status, log) = match Luxid::try_start_on(&root) {
        Ok(_) => panic!("luxid started without wconfd"),
        Err(failure) => failure,
    };
    assert!(!status.success());
    assert!(
        log.contains("wconfd must run on the same root first"),
        "{log}"
    );
    assert!(!root.path().join("queue").exists(), "it changed nothing");
}

#[test]
fn sigusr2_dumps_the_queue_and_the_runners() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([exec(&["/bin/sleep", "30"])]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    // A connection open during the dump.
    let mut client = cluster.client();
    client.ok("QueryJobs", json!([[id], ["status"]]));
    kill(Pid::from_raw(cluster.luxid.pid() as i32), Signal::SIGUSR2).unwrap();
    wait_until("the dump is in the log", DEADLINE, || {
        let log = cluster.luxid.log();
        log.contains("dump: queue")
            && log.contains("dump: runner")
            && log.contains("dump: connection")
    });
    client.ok("CancelJob", json!([id, true]));
}

#[test]
fn connections_over_the_limit_are_closed() {
    let cluster = Cluster::start_with_settings("[luxid]\nconnections_max = 2\n");
    // A served connection (earlier ones, the harness's readiness probe
    // among them, may still count until luxid has seen them close).
    let served = || loop {
        let stream = UnixStream::connect(Luxid::socket(cluster.root())).expect("connect");
        let mut client = Client::over(stream);
        if matches!(
            client.try_call("QueryJobs", json!([null, ["id"]])),
            Ok(Ok(_))
        ) {
            return client;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let first = served();
    let _second = served();
    let mut third = cluster.client();
    let _ = third.send("QueryJobs", json!([null, ["id"]]));
    let (class, args) = third
        .read_response()
        .expect("the refusal")
        .expect_err("an error, not an answer");
    assert_eq!(class, "GenericError");
    assert!(
        args[0]
            .as_str()
            .unwrap_or_default()
            .contains("too many connections"),
        "{args}"
    );
    assert!(third.closed_by_daemon(), "a third connection was served");
    drop(first);
    wait_until("a freed slot serves again", DEADLINE, || {
        let Ok(stream) = UnixStream::connect(Luxid::socket(cluster.root())) else {
            return false;
        };
        let mut client = Client::over(stream);
        matches!(
            client.try_call("QueryJobs", json!([null, ["id"]])),
            Ok(Ok(_))
        )
    });
}

#[test]
fn a_job_waits_for_wconfd_to_come_back_instead_of_failing() {
    // Found by the crash harness (bin/torture.rs): a runner that could not
    // reach wconfd failed its opcode ("cannot get the locks from wconfd").
    let mut cluster = Cluster::start();
    let root = cluster.root().clone();
    cluster.wconfd.kill9();
    let id = cluster.submit(json!([exec(&["/bin/true"])]));
    wait_until("the job waits for its locks", DEADLINE, || {
        cluster.status(id) == "waiting"
    });
    cluster.wconfd = Wconfd::restart_on(&root);
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
}

#[test]
fn a_job_waiting_for_a_lock_survives_a_wconfd_kill() {
    let mut cluster = Cluster::start();
    let root = cluster.root().clone();
    let holder = OwnerProcess::spawn(&root.livelock_dir(), 900);
    let mut wconfd = cluster.wconfd_client();
    assert_eq!(
        try_update(&mut wconfd, &holder, &[("node/n1", "exclusive")]),
        json!([])
    );
    let id = cluster.submit(json!([
        {"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "locks": [["node/n1", "exclusive"]]},
        {"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "locks": [["node/n0", "exclusive"]]}
    ]));
    wait_until("the job waits for node/n1", DEADLINE, || {
        cluster.status(id) == "waiting"
    });
    cluster.wconfd.kill9();
    cluster.wconfd = Wconfd::restart_on(&root);
    let mut wconfd = cluster.wconfd_client();
    assert_eq!(
        try_update(&mut wconfd, &holder, &[("node/n1", "release")]),
        json!([])
    );
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
}

#[test]
fn the_livelock_of_a_runner_killed_after_finishing_its_job_is_removed() {
    // Found by the crash harness: luxid removed a dead runner's livelock
    // only when it marked the job dead; a runner killed between its final
    // job file and its exit left the file for the stale sweep (a minute).
    let cluster = Cluster::start();
    let id = cluster.submit(json!([exec(&["/bin/sleep", "0.3"])]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    // The runner's `freeLocks` after the opcode now blocks: the job is
    // final, the runner has not exited.
    cluster.wconfd.pause();
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    let job: Value = serde_json::from_slice(
        &fs::read(cluster.root().path().join(format!("queue/job-{id}"))).unwrap(),
    )
    .unwrap();
    let livelock = PathBuf::from(job["livelock"].as_str().unwrap());
    assert!(livelock.exists());
    let runner = job["process_id"].as_u64().unwrap() as i32;
    kill(Pid::from_raw(runner), Signal::SIGKILL).unwrap();
    wait_until("luxid removes the livelock", DEADLINE, || {
        !livelock.exists()
    });
    cluster.wconfd.resume();
    assert_eq!(cluster.status(id), "success");
}

/// The socket an interruptible delay of `id` logged (its `delay-test`
/// entry), once it has.
fn delay_socket(cluster: &Cluster, id: u64) -> PathBuf {
    let mut socket = None;
    wait_until(&format!("job {id} logs its delay socket"), DEADLINE, || {
        let oplog = cluster.query(id, &["oplog"]).remove(0);
        socket = oplog[0].as_array().and_then(|log| {
            log.iter()
                .find(|entry| entry[2] == "delay-test")
                .and_then(|entry| entry[3][0].as_str().map(PathBuf::from))
        });
        socket.is_some()
    });
    socket.expect("just found")
}

#[test]
fn test_delays_on_a_node_lock_it_whatever_no_locks_says() {
    // Found from outside with Ganeti's luxi.Client: delays on `on_nodes`
    // without `no_locks` (Ganeti's default, true) ran at once, holding only
    // cluster/BGL. Ganeti 3.0's LUTestDelay locks the nodes either way.
    let cluster = Cluster::start();
    let on_n1 = |seconds: f64, interruptible: bool| {
        json!({"OP_ID": "OP_TEST_DELAY", "duration": seconds, "on_master": false,
               "on_nodes": ["n1"], "interruptible": interruptible})
    };
    let first = cluster.submit(json!([on_n1(30.0, true)]));
    let socket = delay_socket(&cluster, first);
    let holders = |cluster: &Cluster| -> Vec<u64> {
        let locks = cluster.wconfd_client().ok("listAllLocksOwners", json!([]));
        locks
            .as_array()
            .expect("a lock list")
            .iter()
            .filter(|entry| entry[0] == "node/n1")
            .flat_map(|entry| entry[1].as_array().cloned().unwrap_or_default())
            .map(|holder| {
                assert_eq!(holder[1], "exclusive", "{holder}");
                holder[0][0].as_u64().expect("a job id")
            })
            .collect()
    };
    assert_eq!(holders(&cluster), vec![first], "{}", cluster.logs());
    let second = cluster.submit(json!([on_n1(0.3, false)]));
    let third = cluster.submit(json!([on_n1(0.3, false)]));
    for id in [second, third] {
        wait_until(&format!("job {id} waits for node/n1"), DEADLINE, || {
            cluster.status(id) == "waiting"
        });
    }
    assert_eq!(holders(&cluster), vec![first], "{}", cluster.logs());
    assert_eq!(cluster.status(first), "running");
    let mut stream = UnixStream::connect(&socket).expect("connect to the delay socket");
    std::io::Write::write_all(&mut stream, b"x").expect("write a byte");
    for id in [first, second, third] {
        assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    }
    // One after the other: each opcode ran while no other held node/n1.
    let ts = |value: &Value| value[0].as_f64().unwrap() + value[1].as_f64().unwrap() / 1e6;
    let mut spans: Vec<(f64, f64)> = [first, second, third]
        .iter()
        .map(|&id| {
            let row = cluster.query(id, &["opexec", "opend"]);
            (ts(&row[0][0]), ts(&row[1][0]))
        })
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in spans.windows(2) {
        assert!(pair[1].0 >= pair[0].1 - 0.01, "{spans:?}");
    }
}

#[test]
fn the_serial_names_the_last_acknowledged_id_while_luxid_runs_and_after_a_kill() {
    // Ganeti's layout keeps queue/serial current and tools outside warden
    // read it: it must name an id by the time its submission is answered,
    // not only after a clean stop.
    let mut cluster = Cluster::start();
    let serial_path = cluster.root().path().join("queue/serial");
    let serial = || -> u64 {
        let text = fs::read_to_string(&serial_path).expect("queue/serial exists");
        text.trim_end()
            .parse()
            .unwrap_or_else(|_| panic!("queue/serial is not an id: {text:?}"))
    };
    let mut client = cluster.client();
    for _ in 0..3 {
        let id = client.ok("SubmitJob", json!([[exec(&["/bin/true"])]]));
        assert_eq!(serial(), id.as_u64().expect("an id"));
    }
    let ids = client.ok(
        "SubmitManyJobs",
        json!([[[exec(&["/bin/true"])], [exec(&["/bin/true"])]]]),
    );
    assert_eq!(ids, json!([[true, 4], [true, 5]]));
    assert_eq!(serial(), 5);
    for id in 1..=5 {
        assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    }
    cluster.luxid.kill9();
    assert_eq!(serial(), 5, "after kill -9");
    // Ids go on from it even with every job file gone (archived and the
    // archive cleaned, as Ganeti's cleaner does).
    for id in 1..=5 {
        let _ = fs::remove_file(cluster.root().path().join(format!("queue/job-{id}")));
    }
    cluster.luxid = Luxid::start_on(cluster.root());
    assert_eq!(cluster.submit(json!([exec(&["/bin/true"])])), 6);
    assert_eq!(serial(), 6);
}

#[test]
fn a_finished_jobs_livelock_left_while_luxid_was_down_is_removed_at_start() {
    // Found by the crash harness: a runner killed between its final job
    // file and its exit, with luxid killed before it saw the death, left
    // its livelock; the next luxid found the job final and did not look.
    let mut cluster = Cluster::start();
    let livelock_of = |cluster: &Cluster, id: u64| {
        assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
        let job: Value = serde_json::from_slice(
            &fs::read(cluster.root().path().join(format!("queue/job-{id}"))).unwrap(),
        )
        .unwrap();
        let livelock = PathBuf::from(job["livelock"].as_str().unwrap());
        wait_until("the runner removes its livelock", DEADLINE, || {
            !livelock.exists()
        });
        livelock
    };
    let dead = livelock_of(&cluster, cluster.submit(json!([exec(&["/bin/true"])])));
    let alive = livelock_of(&cluster, cluster.submit(json!([exec(&["/bin/true"])])));
    cluster.luxid.kill9();
    // What a killed runner leaves: its file, held by no process.
    fs::write(&dead, "").unwrap();
    // A runner still exiting holds its file: it is left to the runner.
    let held = fs::File::create(&alive).unwrap();
    held.lock().unwrap();
    cluster.luxid = Luxid::start_on(cluster.root());
    assert!(!dead.exists(), "{}", cluster.logs());
    assert!(alive.exists());
    drop(held);
}
