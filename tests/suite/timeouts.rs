//! Timeouts and retries end to end (SCHEDULING.md "Timeouts", "Retries"):
//! a real luxid and wconfd, real runners and programs. `lock_timeout`
//! names its blockers and withdraws its request; `timeout` sends SIGTERM
//! to the program, then SIGKILL after `kill_grace`; `retry` runs a failed
//! program again, one log entry per attempt, and never a canceled job's;
//! with `on_death`, luxid runs a job whose runner died again; bad values
//! of each field are refused at submit.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::daemon::{DEADLINE, wait_until};
use crate::luxid::{Cluster, Luxid};

fn sh(script: &str) -> Value {
    json!({"OP_ID": "OP_EXEC", "argv": ["/bin/sh", "-c", script]})
}

fn with(mut op: Value, fields: Value) -> Value {
    for (name, value) in fields.as_object().expect("an object") {
        op[name] = value.clone();
    }
    op
}

/// The messages of opcode `op`'s log entries, in order.
fn log_messages(cluster: &Cluster, id: u64, op: usize) -> Vec<String> {
    let log = cluster.query(id, &["oplog"])[0][op].clone();
    log.as_array()
        .expect("a log")
        .iter()
        .map(|entry| match &entry[3] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// The messages of the first opcode's `"attempt"` entries, in order.
fn attempts(cluster: &Cluster, id: u64) -> Vec<String> {
    let log = cluster.query(id, &["oplog"])[0][0].clone();
    log.as_array()
        .expect("a log")
        .iter()
        .filter(|entry| entry[2] == "attempt")
        .map(|entry| entry[3].as_str().expect("a text").to_owned())
        .collect()
}

fn opresult(cluster: &Cluster, id: u64) -> Value {
    cluster.query(id, &["opresult"])[0].clone()
}

fn wait_for_file(path: &Path) {
    wait_until(&format!("{} exists", path.display()), DEADLINE, || {
        path.exists()
    });
}

#[test]
fn a_lock_wait_past_its_timeout_fails_naming_the_blocker_and_withdraws_its_request() {
    let cluster = Cluster::start();
    let root = cluster.root().path();
    let started = root.join("holder-started");
    let release = root.join("holder-release");
    let holder = cluster.submit(json!([with(
        sh(&format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
            started.display(),
            release.display()
        )),
        json!({"locks": [["node/n1", "exclusive"]]})
    )]));
    wait_for_file(&started);
    let waiter = cluster.submit(json!([
        with(
            sh("true"),
            json!({"locks": [["node/n1", "shared"]], "lock_timeout": 0.5})
        ),
        sh("true"),
    ]));
    assert_eq!(cluster.wait_final(waiter), "error", "{}", cluster.logs());
    let result = opresult(&cluster, waiter);
    assert_eq!(result[0][0], "OpExecError", "{result}");
    assert_eq!(
        result[0][1][0], "lock wait timed out after 0.5 s",
        "{result}"
    );
    let blockers = result[0][1][1]["blockers"]
        .as_array()
        .unwrap_or_else(|| panic!("no blockers: {result}"))
        .clone();
    assert_eq!(blockers.len(), 1, "{result}");
    let owner = &blockers[0]["owner"];
    assert_eq!(owner[0], json!(holder), "the holder's job: {result}");
    let row = cluster.query(holder, &["status"]);
    assert_eq!(row[0], "running");
    assert!(owner[1].as_str().is_some_and(|path| path.contains("job_")));
    assert!(owner[2].as_u64().is_some());
    assert_eq!(blockers[0]["locks"], json!([["node/n1", "exclusive"]]));
    assert_eq!(
        result[1],
        json!(["OpExecError", ["Preceding opcode failed"]])
    );
    // Withdrawn: wconfd has no request of the waiter's, and the holder
    // still holds its lock.
    let waiting = cluster
        .wconfd_client()
        .ok("listLocksWaitingStatus", json!([]));
    let pending = waiting[1].as_array().expect("the pending requests");
    assert!(
        pending.iter().all(|request| request[1][0] != json!(waiter)),
        "{waiting}"
    );
    assert!(
        waiting[0].to_string().contains("node/n1"),
        "the holder's lock: {waiting}"
    );
    fs::write(&release, "").expect("release the holder");
    assert_eq!(cluster.wait_final(holder), "success");
}

#[test]
fn a_lock_timeout_of_zero_fails_at_once_and_one_that_is_met_is_no_failure() {
    let cluster = Cluster::start();
    let root = cluster.root().path();
    let started = root.join("started");
    let release = root.join("release");
    let holder = cluster.submit(json!([with(
        sh(&format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
            started.display(),
            release.display()
        )),
        json!({"locks": [["node/n1", "exclusive"]]})
    )]));
    wait_for_file(&started);
    let delay = json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.01, "on_nodes": ["n1"],
                       "lock_timeout": 0});
    let at_once = cluster.submit(json!([delay]));
    assert_eq!(cluster.wait_final(at_once), "error");
    let result = opresult(&cluster, at_once);
    assert_eq!(result[0][1][0], "lock wait timed out after 0 s", "{result}");
    assert_eq!(result[0][1][1]["blockers"][0]["owner"][0], json!(holder));
    // Free locks come within any timeout.
    let free = cluster.submit(json!([with(
        sh("true"),
        json!({"locks": [["node/n2", "exclusive"]], "lock_timeout": 0})
    )]));
    assert_eq!(cluster.wait_final(free), "success");
    fs::write(&release, "").expect("release the holder");
    assert_eq!(cluster.wait_final(holder), "success");
}

#[test]
fn a_timeout_sends_sigterm_to_the_program_first() {
    let cluster = Cluster::start();
    let root = cluster.root().path();
    let marker = root.join("got-sigterm");
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; while :; do sleep 0.05; done",
        marker.display()
    );
    let id = cluster.submit(json!([with(
        sh(&script),
        json!({"timeout": 0.3, "kill_grace": 5})
    )]));
    assert_eq!(cluster.wait_final(id), "error");
    let result = opresult(&cluster, id);
    assert_eq!(
        result[0][1][0], "/bin/sh timed out after 0.3 s and was killed",
        "{result}"
    );
    assert_eq!(fs::read_to_string(&marker).expect("the marker"), "term\n");
    let details = &result[0][1][1];
    assert_eq!(details["exit_code"], 0, "it exited on SIGTERM: {result}");
    let duration = details["duration"].as_f64().expect("a duration");
    assert!(
        (0.3..5.0).contains(&duration),
        "ended before the grace: {duration}"
    );
}

#[test]
fn a_program_that_ignores_sigterm_is_killed_after_the_grace() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([with(
        sh("trap '' TERM; exec sleep 30"),
        json!({"timeout": 0.3, "kill_grace": 0.5})
    )]));
    assert_eq!(cluster.wait_final(id), "error");
    let result = opresult(&cluster, id);
    assert_eq!(
        result[0][1][0], "/bin/sh timed out after 0.3 s and was killed",
        "{result}"
    );
    let details = &result[0][1][1];
    assert_eq!(details["signal"], 9, "{result}");
    let duration = details["duration"].as_f64().expect("a duration");
    assert!(
        (0.8..10.0).contains(&duration),
        "killed after the grace: {duration}"
    );
}

/// An attempt script for a `retry` of one: the first attempt starts
/// `leftover` in the background and waits (until its timeout); the second
/// says whether the first's leftover still lives, and succeeds.
fn leftover_then_check(root: &Path, leftover: &str) -> String {
    let (pid, verdict) = (root.join("leftover-pid"), root.join("verdict"));
    format!(
        "if [ -e {pid} ]; then \
           if kill -0 $(cat {pid}) 2>/dev/null; then echo alive > {verdict}; \
           else echo gone > {verdict}; fi; exit 0; fi; \
         {leftover} & echo $! > {pid}; wait",
        pid = pid.display(),
        verdict = verdict.display()
    )
}

#[test]
fn a_timeout_reaches_what_the_program_started_before_the_next_attempt() {
    let cluster = Cluster::start();
    let root = cluster.root().path();
    let id = cluster.submit(json!([with(
        sh(&leftover_then_check(&root, "sleep 300")),
        json!({"timeout": 0.5, "kill_grace": 5, "retry": {"max": 1}})
    )]));
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    assert_eq!(
        fs::read_to_string(root.join("verdict")).expect("the verdict"),
        "gone\n",
        "the first attempt's background sleep got its SIGTERM"
    );
    let first = &attempts(&cluster, id)[0];
    assert_eq!(
        first,
        "Attempt 1 of 2: /bin/sh timed out after 0.5 s and was killed"
    );
}

#[test]
fn what_a_timed_out_program_started_is_killed_after_the_grace_even_if_it_exited() {
    let cluster = Cluster::start();
    let root = cluster.root().path();
    // The shell dies of its SIGTERM at once; the leftover ignores it.
    let leftover = "(trap '' TERM; exec sleep 300)";
    let id = cluster.submit(json!([with(
        sh(&leftover_then_check(&root, leftover)),
        json!({"timeout": 0.3, "kill_grace": 0.7, "retry": {"max": 1}})
    )]));
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    assert_eq!(
        fs::read_to_string(root.join("verdict")).expect("the verdict"),
        "gone\n",
        "the leftover was killed, and reaped, before the second attempt"
    );
    let log = cluster.query(id, &["oplog"])[0][0].clone();
    let times: Vec<f64> = log
        .as_array()
        .expect("a log")
        .iter()
        .filter(|entry| entry[2] == "attempt")
        .map(|entry| entry[1][0].as_f64().unwrap() + entry[1][1].as_f64().unwrap() / 1e6)
        .collect();
    let start = cluster.query(id, &["start_ts"])[0].clone();
    let start = start[0].as_f64().unwrap() + start[1].as_f64().unwrap() / 1e6;
    assert!(
        times[0] - start >= 0.9,
        "the first attempt lasted its timeout and grace: {:.3} s",
        times[0] - start
    );
}

#[test]
fn a_program_failing_twice_then_succeeding_is_retried_with_an_entry_per_attempt() {
    let cluster = Cluster::start();
    let counter = cluster.root().path().join("count");
    let script = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {c}; [ $n -ge 3 ]",
        c = counter.display()
    );
    let id = cluster.submit(json!([with(
        sh(&script),
        json!({"retry": {"max": 3, "backoff": 0.05}})
    )]));
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    assert_eq!(
        attempts(&cluster, id),
        [
            "Attempt 1 of 4: /bin/sh exited with code 1",
            "Attempt 2 of 4: /bin/sh exited with code 1",
            "Attempt 3 of 4: /bin/sh exited with code 0",
        ]
    );
    assert_eq!(opresult(&cluster, id)[0]["exit_code"], 0);
    assert_eq!(fs::read_to_string(&counter).expect("the counter"), "3\n");
}

#[test]
fn an_exit_code_retry_on_does_not_name_is_not_retried_and_a_timeout_is_when_on_is_null() {
    let cluster = Cluster::start();
    let id = cluster.submit(json!([with(
        sh("exit 3"),
        json!({"retry": {"max": 3, "on": [2, 4]}})
    )]));
    assert_eq!(cluster.wait_final(id), "error");
    assert_eq!(
        attempts(&cluster, id),
        ["Attempt 1 of 4: /bin/sh exited with code 3"]
    );
    assert_eq!(
        opresult(&cluster, id)[0][1][0],
        "/bin/sh exited with code 3"
    );

    let named = cluster.submit(json!([with(
        sh("exit 2"),
        json!({"retry": {"max": 1, "on": [2]}})
    )]));
    assert_eq!(cluster.wait_final(named), "error");
    assert_eq!(attempts(&cluster, named).len(), 2);

    let slow = cluster.submit(json!([with(
        sh("exec sleep 30"),
        json!({"timeout": 0.2, "kill_grace": 0, "retry": {"max": 1}})
    )]));
    assert_eq!(cluster.wait_final(slow), "error");
    assert_eq!(
        attempts(&cluster, slow),
        [
            "Attempt 1 of 2: /bin/sh timed out after 0.2 s and was killed",
            "Attempt 2 of 2: /bin/sh timed out after 0.2 s and was killed",
        ]
    );
}

#[test]
fn a_job_canceled_during_the_backoff_ends_canceled_at_once_without_a_retry() {
    let cluster = Cluster::start();
    let runs = cluster.root().path().join("runs");
    let id = cluster.submit(json!([
        with(
            sh(&format!("echo run >> {}; exit 1", runs.display())),
            json!({"retry": {"max": 3, "backoff": 60}})
        ),
        sh("true"),
    ]));
    wait_until("the first attempt is logged", DEADLINE, || {
        !attempts(&cluster, id).is_empty()
    });
    cluster.client().ok("CancelJob", json!([id]));
    // Well before the backoff would have ended.
    assert_eq!(cluster.wait_final(id), "canceled", "{}", cluster.logs());
    assert_eq!(
        cluster.query(id, &["opstatus"])[0],
        json!(["canceled", "canceled"])
    );
    assert_eq!(
        attempts(&cluster, id),
        ["Attempt 1 of 4: /bin/sh exited with code 1"]
    );
    assert_eq!(fs::read_to_string(&runs).expect("the runs"), "run\n");
}

/// A program that kills its runner (the shell's parent) the first
/// `deaths` times it runs, noting each run in `runs`, then succeeds.
fn killing_its_runner(runs: &Path, deaths: u32) -> String {
    format!(
        "echo run >> {r}; n=$(wc -l < {r}); if [ $n -le {deaths} ]; then kill -9 $PPID; sleep 30; fi",
        r = runs.display()
    )
}

#[test]
fn a_runner_death_is_retried_with_on_death_continuing_the_attempts_and_the_next_opcodes() {
    let cluster = Cluster::start();
    let runs = cluster.root().path().join("runs");
    let after = cluster.root().path().join("after");
    let id = cluster.submit(json!([
        sh("true"),
        with(
            sh(&killing_its_runner(&runs, 2)),
            json!({"retry": {"max": 3, "backoff": 0.1, "on_death": true}})
        ),
        sh(&format!("touch {}", after.display())),
    ]));
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    assert_eq!(
        log_messages(&cluster, id, 1)
            .into_iter()
            .filter(|message| message.starts_with("Attempt "))
            .collect::<Vec<_>>(),
        [
            "Attempt 1 of 4: its runner died",
            "Attempt 2 of 4: its runner died",
            "Attempt 3 of 4: /bin/sh exited with code 0",
        ]
    );
    let types: Vec<Value> = cluster.query(id, &["oplog"])[0][1]
        .as_array()
        .expect("a log")
        .iter()
        .map(|entry| entry[2].clone())
        .collect();
    // Its dead runner held the locks: the next grant is told, once (D66).
    assert_eq!(
        types,
        [
            json!("attempt"),
            json!("why"),
            json!("attempt"),
            json!("attempt")
        ]
    );
    assert_eq!(
        fs::read_to_string(&runs).expect("the runs"),
        "run\nrun\nrun\n"
    );
    assert!(after.exists(), "the opcode after the retried one ran");
    assert_eq!(
        cluster.query(id, &["opstatus"])[0],
        json!(["success", "success", "success"])
    );
}

#[test]
fn a_runner_death_ends_the_job_when_attempts_run_out_or_on_death_is_not_set() {
    let cluster = Cluster::start();
    let root = cluster.root().path();
    let out_of_attempts = cluster.submit(json!([with(
        sh(&killing_its_runner(&root.join("a"), 5)),
        json!({"retry": {"max": 1, "on_death": true}})
    )]));
    let without = cluster.submit(json!([with(
        sh(&killing_its_runner(&root.join("b"), 5)),
        json!({"retry": {"max": 3}})
    )]));
    assert_eq!(cluster.wait_final(out_of_attempts), "error");
    assert_eq!(
        attempts(&cluster, out_of_attempts),
        [
            "Attempt 1 of 2: its runner died",
            "Attempt 2 of 2: its runner died",
        ]
    );
    let result = opresult(&cluster, out_of_attempts)[0].clone();
    assert!(
        result.to_string().contains("detected death of job"),
        "{result}"
    );
    assert_eq!(cluster.wait_final(without), "error");
    assert!(attempts(&cluster, without).is_empty());
    assert_eq!(fs::read_to_string(root.join("b")).expect("runs"), "run\n");
}

#[test]
fn a_job_backing_off_after_its_runners_death_is_queued_and_survives_a_luxid_kill() {
    let mut cluster = Cluster::start();
    let runs = cluster.root().path().join("runs");
    let id = cluster.submit(json!([with(
        sh(&killing_its_runner(&runs, 1)),
        json!({"retry": {"max": 2, "backoff": 3600, "on_death": true}})
    )]));
    wait_until("the death is logged", DEADLINE, || {
        !attempts(&cluster, id).is_empty()
    });
    assert_eq!(cluster.status(id), "queued");
    assert_eq!(cluster.query(id, &["opstatus"])[0], json!(["queued"]));
    let why = cluster.client().ok("WhyJob", json!([id]));
    let backoff = why["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .find(|reason| reason["kind"] == "backoff")
        .unwrap_or_else(|| panic!("a backoff reason in {why}"))
        .clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let until = backoff["unix_secs"].as_f64().expect("a time");
    assert!(
        (now + 3500.0..now + 3601.0).contains(&until),
        "backs off for an hour: {backoff}"
    );
    // Queued and backing off: a restarted luxid starts it without the
    // rest of the backoff (D62), and its attempts go on from 2.
    cluster.luxid.kill9();
    cluster.luxid = Luxid::start_on(cluster.root());
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    assert_eq!(
        attempts(&cluster, id),
        [
            "Attempt 1 of 3: its runner died",
            "Attempt 2 of 3: /bin/sh exited with code 0",
        ]
    );
}

#[test]
fn a_killed_job_is_never_retried_on_death() {
    let cluster = Cluster::start();
    let runs = cluster.root().path().join("runs");
    let id = cluster.submit(json!([with(
        sh(&format!("echo run >> {}; sleep 30", runs.display())),
        json!({"retry": {"max": 3, "on_death": true}})
    )]));
    // The shell creates the file before it writes the line: wait for the
    // line, or a kill in between leaves the file empty.
    wait_until("the program ran", DEADLINE, || {
        fs::read_to_string(&runs).is_ok_and(|runs| runs == "run\n")
    });
    cluster.client().ok("CancelJob", json!([id, true]));
    assert_eq!(cluster.wait_final(id), "error", "{}", cluster.logs());
    assert!(attempts(&cluster, id).is_empty());
    assert_eq!(fs::read_to_string(&runs).expect("the runs"), "run\n");
}

#[test]
fn bad_timeout_and_retry_fields_are_refused_at_submit_naming_them() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let exec = sh("true");
    let delay = json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.01});
    let cases = [
        (
            json!([with(exec.clone(), json!({"lock_timeout": -1}))]),
            "'OP_EXEC.lock_timeout' fails validation",
        ),
        (
            json!([with(delay.clone(), json!({"lock_timeout": "soon"}))]),
            "'OP_TEST_DELAY.lock_timeout' fails validation",
        ),
        (
            json!([with(exec.clone(), json!({"kill_grace": -0.5}))]),
            "'OP_EXEC.kill_grace' fails validation",
        ),
        (
            json!([with(exec.clone(), json!({"retry": {"max": 0}}))]),
            "'OP_EXEC.retry' fails validation: max",
        ),
        (
            json!([with(exec.clone(), json!({"retry": {"max": 1, "on": [0]}}))]),
            "'OP_EXEC.retry' fails validation: on",
        ),
        (
            json!([with(
                exec.clone(),
                json!({"retry": {"max": 1, "backoff": -1}})
            )]),
            "'OP_EXEC.retry' fails validation: backoff",
        ),
        (
            json!([with(exec.clone(), json!({"retry": [3]}))]),
            "'OP_EXEC.retry' fails validation",
        ),
        (
            json!([with(exec.clone(), json!({"start_by": "noon"}))]),
            "'OP_EXEC.start_by' fails validation",
        ),
        (
            json!([with(exec.clone(), json!({"unique_key": ""}))]),
            "'OP_EXEC.unique_key' fails validation",
        ),
        (
            json!([exec.clone(), with(exec.clone(), json!({"start_by": 1e9}))]),
            "opcode 1: start_by: only a job's first opcode",
        ),
        (
            json!([
                exec.clone(),
                with(delay.clone(), json!({"unique_key": "k"}))
            ]),
            "opcode 1: unique_key: only a job's first opcode",
        ),
    ];
    for (ops, expected) in cases {
        let (class, message) = client.fails("SubmitJob", json!([ops]));
        assert_eq!(class, "OpPrereqError", "{ops}: {message}");
        assert!(message.contains(expected), "{ops}: {message}");
    }
    // Nothing was stored: the next valid job is the first.
    let first = with(
        exec,
        json!({"start_by": 4e9, "unique_key": "nightly", "lock_timeout": 5,
               "kill_grace": 1, "retry": {"max": 2, "on": null, "on_death": true}}),
    );
    assert_eq!(cluster.submit(json!([first, delay])), 1);
    assert_eq!(cluster.wait_final(1), "success");
}

/// `warden --root ROOT ARGS...`.
fn warden(cluster: &Cluster, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_warden"))
        .arg("--root")
        .arg(cluster.root().path())
        .args(args)
        .output()
        .expect("run warden")
}

fn submitted_id(output: &Output) -> u64 {
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    text.split_whitespace()
        .find_map(|word| word.trim_end_matches(';').parse().ok())
        .unwrap_or_else(|| panic!("a job id in {text:?}"))
}

#[test]
fn warden_exec_flags_set_the_timeout_retry_and_unique_fields() {
    let cluster = Cluster::start();
    let release = cluster.root().path().join("release");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit 3",
        release.display()
    );
    let args = [
        "exec",
        "--lock",
        "node/n1",
        "--lock-timeout",
        "30",
        "--start-by",
        "+1h",
        "--timeout",
        "60",
        "--kill-grace",
        "2",
        "--retry",
        "2:0.1",
        "--retry-on",
        "3,4",
        "--retry-on-death",
        "--unique",
        "nightly",
        "--",
        "/bin/sh",
        "-c",
        &script,
    ];
    let first = submitted_id(&warden(&cluster, &args));
    let op = &cluster.query(first, &["ops"])[0][0];
    assert_eq!(op["lock_timeout"], 30.0, "{op}");
    assert_eq!(op["kill_grace"], 2.0, "{op}");
    assert_eq!(op["timeout"], 60.0, "{op}");
    assert_eq!(op["unique_key"], "nightly", "{op}");
    assert_eq!(
        op["retry"],
        json!({"max": 2, "backoff": 0.1, "on": [3, 4], "on_death": true}),
        "{op}"
    );
    let start_by = op["start_by"].as_f64().expect("a start_by");
    let in_an_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
        + 3600.0;
    assert!(
        (in_an_hour - 60.0..=in_an_hour).contains(&start_by),
        "{start_by} is an hour from now"
    );
    // The live job's key answers its id.
    assert_eq!(submitted_id(&warden(&cluster, &args)), first);
    fs::write(&release, "").expect("release");
    assert_eq!(cluster.wait_final(first), "error");
    assert_eq!(
        attempts(&cluster, first),
        [
            "Attempt 1 of 3: /bin/sh exited with code 3",
            "Attempt 2 of 3: /bin/sh exited with code 3",
            "Attempt 3 of 3: /bin/sh exited with code 3",
        ]
    );
    // A finished job's key is free again.
    let second = submitted_id(&warden(&cluster, &args));
    assert_ne!(second, first);
    assert_eq!(cluster.wait_final(second), "error");

    // Bad values: the CLI's own are usage errors, luxid's are refusals
    // naming the field; neither submits anything.
    for (flag, value) in [
        ("--start-by", "tomorrow"),
        ("--start-by", "+5y"),
        ("--retry", "x"),
        ("--retry", "2:"),
    ] {
        let output = warden(&cluster, &["exec", flag, value, "--", "/bin/true"]);
        assert_eq!(output.status.code(), Some(2), "{flag} {value}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{stderr}");
    }
    for (flag, value, field) in [
        ("--retry", "0", "retry"),
        ("--lock-timeout", "-1", "lock_timeout"),
        ("--start-by", "-5", "start_by"),
    ] {
        let output = warden(&cluster, &["exec", flag, value, "--", "/bin/true"]);
        assert!(!output.status.success(), "{flag} {value}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(field), "{flag} {value}: {stderr}");
    }
    let output = warden(&cluster, &["exec", "--retry-on", "3", "--", "/bin/true"]);
    assert_eq!(output.status.code(), Some(2), "--retry-on needs --retry");
    let next = cluster.submit(json!([sh("true")]));
    assert_eq!(next, second + 1, "nothing else was submitted");
}
