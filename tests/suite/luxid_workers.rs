//! Jobs holding workers, end to end with real daemons and runners
//! (WORKERS.md): a job waits `queued` for a worker and starts when one
//! goes IDLE, its programs see the worker; its end, or its runner's kill
//! -9, sends the worker through PREPARE (a real prepare job); a failing
//! prepare fails the worker; maintenance of a held worker waits for the
//! job; a failed held worker ends its job; a restart of both daemons
//! keeps the registry and the assignments.

use std::fs;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::daemon::{Client, DEADLINE, Wconfd, wait_until};
use crate::luxid::{Cluster, Luxid};

fn register(wconfd: &mut Client, uuid: &str, caps: Value, prepare: Value) {
    let mut caps = caps;
    caps["UUID"] = json!(uuid);
    wconfd.ok(
        "registerWorker",
        json!([caps, ["farm"], format!("{uuid}.lab:5555"), prepare]),
    );
}

fn state_of(wconfd: &mut Client, uuid: &str) -> String {
    wconfd.ok("getWorkerInfo", json!([uuid]))["state"]
        .as_str()
        .expect("a state")
        .to_owned()
}

/// An `OP_EXEC` that writes what it sees of its workers to `out`, then
/// sleeps `seconds`.
fn board_job(out: &std::path::Path, seconds: u32, workers: Value) -> Value {
    json!([{
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/sh", "-c", format!(
            "printf '%s\\n%s\\n%s\\n' \"$WARDEN_WORKER_UUID\" \"$WARDEN_WORKER_ADDRESS\" \"$WARDEN_WORKERS\" > {}; sleep {seconds}",
            out.display()
        )],
        "workers": workers,
    }])
}

#[test]
fn a_waiting_job_starts_when_its_worker_goes_idle_and_its_end_prepares_it() {
    let cluster = Cluster::start();
    let mut wconfd = cluster.wconfd_client();
    let prepared = cluster.root().path().join("prepared");
    register(
        &mut wconfd,
        "b1",
        json!({"arch": "arm64"}),
        json!([
            "/bin/sh",
            "-c",
            format!("echo $WARDEN_WORKER_UUID >> {}", prepared.display())
        ]),
    );
    let out = cluster.root().path().join("seen");
    let id = cluster.submit(board_job(&out, 0, json!({"caps": {"arch": "arm64"}})));
    // No worker is IDLE: the job waits queued, with no runner.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(cluster.status(id), "queued");
    assert!(!out.exists());
    // In: through its prepare job (a job of the queue), then IDLE; the
    // job gets it at once.
    let let_in = Instant::now();
    wconfd.ok("setWorkerState", json!(["b1", "IDLE", null]));
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    println!(
        "worker let in to its waiting job done: {:?}",
        let_in.elapsed()
    );
    let seen = fs::read_to_string(&out).expect("the job ran");
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines[0], "b1");
    assert_eq!(lines[1], "b1.lab:5555");
    let listed: Value = serde_json::from_str(lines[2]).expect("a JSON list");
    assert_eq!(listed[0]["caps"]["arch"], "arm64");
    // Released: through PREPARE again, and IDLE.
    wait_until("b1 is IDLE again", DEADLINE, || {
        state_of(&mut wconfd, "b1") == "IDLE"
    });
    let runs = fs::read_to_string(&prepared).expect("prepares ran");
    assert_eq!(runs.lines().collect::<Vec<_>>(), ["b1", "b1"]);
    let history = &wconfd.ok("getWorkerInfo", json!(["b1"]))["history"];
    assert_eq!(history[0]["job"], id);
    assert_eq!(history[0]["status"], "success");
}

#[test]
fn a_submission_no_worker_could_fit_is_refused_and_a_later_opcode_may_not_ask() {
    let cluster = Cluster::start();
    let mut wconfd = cluster.wconfd_client();
    register(&mut wconfd, "b1", json!({"arch": "arm64"}), Value::Null);
    let mut client = cluster.client();
    let (class, text) = client.fails(
        "SubmitJob",
        json!([[{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "workers": {"count": 65}}]]),
    );
    assert_eq!(class, "OpPrereqError");
    assert!(text.contains("over the limit of 64"), "{text}");
    let (_, text) = client.fails(
        "SubmitJob",
        json!([[{"OP_ID": "OP_EXEC", "argv": ["/bin/true"]},
                {"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "workers": {}}]]),
    );
    assert!(text.contains("only the first opcode"), "{text}");
    let (_, text) = client.fails(
        "SubmitJob",
        json!([[{"OP_ID": "OP_EXEC", "argv": ["/bin/true"],
                 "prepare_worker": {"uuid": "b1", "seq": 1}}]]),
    );
    assert!(text.contains("set by luxid alone"), "{text}");
    // No registered worker could ever fit: refused, whatever the states.
    let (class, text) = client.fails(
        "SubmitJob",
        json!([[{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "workers": {"caps": {"arch": "sparc"}}}]]),
    );
    assert_eq!(class, "OpPrereqError");
    assert!(text.contains("no registered worker matches"), "{text}");
    let many = client.ok(
        "SubmitManyJobs",
        json!([[
            [{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "workers": {"groups": ["nowhere"]}}],
            [{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "workers": {"caps": {"arch": "arm64"}}}],
            [{"OP_ID": "OP_EXEC", "argv": ["/bin/true"]}]
        ]]),
    );
    assert_eq!(many[0][0], false, "{many}");
    assert!(
        many[0][1]
            .as_str()
            .unwrap_or_default()
            .contains("no registered worker"),
        "{many}"
    );
    assert_eq!(many[1][0], true, "{many}");
    assert_eq!(many[2][0], true, "{many}");
    let waiting = many[1][1].as_u64().expect("an id");
    assert_eq!(cluster.status(waiting), "queued");
    assert_eq!(
        cluster.wait_final(many[2][1].as_u64().expect("an id")),
        "success"
    );
    client.ok("CancelJob", json!([waiting]));
    assert_eq!(cluster.wait_final(waiting), "canceled");
    // Nothing of the refused ones was written: two job files.
    let queued = fs::read_dir(cluster.root().path().join("queue"))
        .expect("the queue")
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("job-"))
        .count();
    assert_eq!(queued, 2, "nothing of the refused jobs was written");
}

#[test]
fn kill_9_of_a_holders_runner_sends_its_worker_through_prepare_and_a_failing_prepare_fails_it() {
    let cluster = Cluster::start();
    let mut wconfd = cluster.wconfd_client();
    let marker = cluster.root().path().join("fail-prepare");
    register(
        &mut wconfd,
        "b1",
        json!({}),
        json!([
            "/bin/sh",
            "-c",
            format!(
                "test ! -e {} || {{ echo board is dead >&2; exit 3; }}",
                marker.display()
            )
        ]),
    );
    wconfd.ok("setWorkerState", json!(["b1", "IDLE", null]));
    wait_until("b1 is IDLE", DEADLINE, || {
        state_of(&mut wconfd, "b1") == "IDLE"
    });
    let out = cluster.root().path().join("seen");
    let id = cluster.submit(board_job(&out, 30, json!({})));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    assert_eq!(state_of(&mut wconfd, "b1"), "RUNNING");
    let job: Value = serde_json::from_slice(
        &fs::read(cluster.root().path().join(format!("queue/job-{id}"))).expect("its file"),
    )
    .expect("JSON");
    let runner = job["process_id"].as_u64().expect("a pid") as i32;
    fs::write(&marker, "").expect("the marker");
    let killed = Instant::now();
    kill(Pid::from_raw(runner), Signal::SIGKILL).expect("kill");
    wait_until("the job is error and b1 left RUNNING", DEADLINE, || {
        cluster.status(id) == "error" && state_of(&mut wconfd, "b1") != "RUNNING"
    });
    println!(
        "kill -9 of the holder's runner to its worker released: {:?}",
        killed.elapsed()
    );
    wait_until("b1's prepare fails it", DEADLINE, || {
        state_of(&mut wconfd, "b1") == "FAILED"
    });
    let info = wconfd.ok("getWorkerInfo", json!(["b1"]));
    let reason = info["fail_reason"].as_str().expect("a reason");
    assert!(reason.starts_with("prepare failed"), "{reason}");
}

#[test]
fn failing_a_held_worker_ends_its_job_and_maintenance_waits_for_the_job() {
    let cluster = Cluster::start();
    let mut wconfd = cluster.wconfd_client();
    for uuid in ["b1", "b2"] {
        register(&mut wconfd, uuid, json!({}), Value::Null);
        wconfd.ok("setWorkerState", json!([uuid, "IDLE", null]));
    }
    let out = cluster.root().path().join("seen");
    let failing = cluster.submit(board_job(&out, 30, json!({"caps": {"UUID": "b1"}})));
    let maintained = cluster.submit(board_job(&out, 1, json!({"caps": {"UUID": "b2"}})));
    wait_until("both run", DEADLINE, || {
        cluster.status(failing) == "running" && cluster.status(maintained) == "running"
    });
    wconfd.ok("setWorkerFail", json!(["b1", "no power"]));
    assert_eq!(cluster.wait_final(failing), "error");
    let result = &cluster.query(failing, &["opresult"])[0][0];
    assert_eq!(
        *result,
        json!(["OpExecError", ["worker b1 failed: no power"]])
    );
    wconfd.ok("setWorkerState", json!(["b2", "MAINTENANCE", null]));
    assert_eq!(state_of(&mut wconfd, "b2"), "BUSY");
    assert_eq!(cluster.wait_final(maintained), "success");
    wait_until("b2 in MAINTENANCE", DEADLINE, || {
        state_of(&mut wconfd, "b2") == "MAINTENANCE"
    });
}

#[test]
fn a_restart_of_both_daemons_keeps_the_registry_and_the_assignments() {
    let mut cluster = Cluster::start();
    let mut wconfd = cluster.wconfd_client();
    register(&mut wconfd, "b1", json!({}), Value::Null);
    wconfd.ok("setWorkerState", json!(["b1", "IDLE", null]));
    let out = cluster.root().path().join("seen");
    let holder = cluster.submit(board_job(&out, 3, json!({})));
    let waiter = cluster.submit(board_job(&out, 0, json!({})));
    wait_until("the holder runs", DEADLINE, || {
        cluster.status(holder) == "running"
    });
    assert_eq!(cluster.status(waiter), "queued");
    cluster.luxid.kill9();
    cluster.wconfd.kill9();
    let root = cluster.root().clone();
    cluster.wconfd = Wconfd::restart_on(&root);
    cluster.luxid = Luxid::start_on(&root);
    let mut wconfd = cluster.wconfd_client();
    assert_eq!(wconfd.ok("getWorkerInfo", json!(["b1"]))["holder"], holder);
    assert_eq!(cluster.wait_final(holder), "success", "{}", cluster.logs());
    assert_eq!(cluster.wait_final(waiter), "success", "{}", cluster.logs());
    let history = &wconfd.ok("getWorkerInfo", json!(["b1"]))["history"];
    let jobs: Vec<Value> = history
        .as_array()
        .expect("history")
        .iter()
        .map(|h| h["job"].clone())
        .collect();
    assert_eq!(jobs, [json!(holder), json!(waiter)]);
}

#[test]
fn a_submission_held_for_a_paused_wconfd_goes_on_when_it_resumes_and_luxid_answers_meanwhile() {
    let cluster = Cluster::start();
    let mut wconfd = cluster.wconfd_client();
    register(&mut wconfd, "b1", json!({"arch": "arm64"}), Value::Null);
    wconfd.ok("setWorkerState", json!(["b1", "IDLE", null]));
    cluster.wconfd.pause();
    // The submission waits for wconfd's checkWorkers answer...
    let mut submitter = cluster.client();
    submitter
        .send(
            "SubmitJob",
            json!([[{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "workers": {"caps": {"arch": "arm64"}}}]]),
        )
        .expect("sent");
    // ... and luxid's loop does not: other clients are answered at once.
    let mut other = cluster.client();
    for _ in 0..5 {
        let asked = Instant::now();
        let plain = other.ok(
            "SubmitJob",
            json!([[{"OP_ID": "OP_TEST_DELAY", "duration": 0}]]),
        );
        assert!(plain.is_u64(), "{plain}");
        other.ok("QueryJobs", json!([[plain], ["status"]]));
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "luxid took {:?} with a workers submission held",
            asked.elapsed()
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    cluster.wconfd.resume();
    let id = submitter
        .read_response()
        .expect("an answer")
        .expect("accepted once wconfd answers");
    let id = id.as_u64().expect("a job id");
    assert_eq!(cluster.wait_final(id), "success");
    let info = cluster.client().ok("QueryJobs", json!([[id], ["workers"]]));
    assert_eq!(info[0][0], json!(["b1"]), "{info}");
}
