//! `WhyJob` end to end (SCHEDULING.md "Why"): a real luxid asks a real
//! wconfd, for each job it explains that waits for locks, who is in the
//! way; luxid's own reasons (dependencies, slots, filter rules, buckets,
//! finished jobs) come from its queue.

use std::thread;
use std::time::Duration;

use serde_json::{Value, json};

use crate::daemon::{DEADLINE, OwnerProcess, try_update, update_waiting, wait_until};
use crate::luxid::Cluster;

fn why(cluster: &Cluster, id: u64) -> Value {
    cluster.client().ok("WhyJob", json!([id]))
}

/// The reasons' kinds of an answer.
fn kinds(answer: &Value) -> Vec<String> {
    answer["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .map(|reason| reason["kind"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn delay(seconds: f64) -> Value {
    json!([{"OP_ID": "OP_TEST_DELAY", "duration": seconds, "on_master": true}])
}

/// A three-deep lock chain: the job waits for `instance/a`, held by
/// owner 901, which waits for `instance/b` (the lock order allows no
/// other way round), held by owner 900.
#[test]
fn a_job_waiting_for_locks_is_explained_down_to_the_root_holder() {
    let cluster = Cluster::start();
    let livelocks = cluster.root().livelock_dir();
    let mut wconfd = cluster.wconfd_client();
    let root = OwnerProcess::spawn(&livelocks, 900);
    let middle = OwnerProcess::spawn(&livelocks, 901);
    assert_eq!(
        try_update(&mut wconfd, &root, &[("instance/b", "exclusive")]),
        json!([])
    );
    assert_eq!(
        try_update(&mut wconfd, &middle, &[("instance/a", "exclusive")]),
        json!([])
    );
    let blockers = update_waiting(&mut wconfd, &middle, 0, &[("instance/b", "exclusive")]);
    assert_ne!(blockers, json!([]), "the middle owner waits");
    let job = cluster.submit(json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"],
                                     "locks": [["instance/a", "exclusive"]]}]));
    wait_until("the job waits for its lock", DEADLINE, || {
        cluster.status(job) == "waiting"
    });
    thread::sleep(Duration::from_millis(50));
    let answer = why(&cluster, job);
    assert_eq!(answer["status"], "waiting", "{answer}");
    assert_eq!(kinds(&answer), ["locks"], "{answer}");
    let waits = &answer["reasons"][0]["waits"][0];
    assert_eq!(waits["job"], json!(job), "{answer}");
    assert!(
        waits["waiting_seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{answer}"
    );
    let first = &waits["blockers"][0];
    assert_eq!(first["job"], 901, "{answer}");
    assert_eq!(
        first["holds"],
        json!([["instance/a", "exclusive"]]),
        "{answer}"
    );
    let second = &first["waits"]["blockers"][0];
    assert_eq!(second["job"], 900, "{answer}");
    assert_eq!(
        second["holds"],
        json!([["instance/b", "exclusive"]]),
        "{answer}"
    );
    assert_eq!(
        second["waits"],
        Value::Null,
        "the root waits for no one: {answer}"
    );
    // `warden why` tells the same chain, and `warden locks --tree` has
    // the same owners in the same order: the root owner above the one it
    // blocks, above the job.
    let warden = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
            .arg("--root")
            .arg(cluster.root().path())
            .args(args)
            .output()
            .expect("run warden");
        assert!(output.status.success(), "warden {args:?}: {output:?}");
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let told = warden(&["why", &job.to_string()]);
    let (by_middle, by_root) = (
        told.find("blocked by job 901, holding instance/a exclusive"),
        told.find("blocked by job 900, holding instance/b exclusive"),
    );
    assert!(by_middle.is_some() && by_root > by_middle, "{told}");
    let tree = warden(&["locks", "--tree"]);
    let at = |what: &str| {
        tree.find(what)
            .unwrap_or_else(|| panic!("{what} in {tree}"))
    };
    assert!(
        at("job 900") < at("job 901") && at("job 901") < at(&format!("job {job}")),
        "{tree}"
    );
    // Once both owners are gone, the job gets its lock.
    drop(root);
    drop(middle);
    assert_eq!(cluster.wait_final(job), "success", "{}", cluster.logs());
}

#[test]
fn queued_jobs_name_their_dependency_rule_bucket_and_slots() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    let long = cluster.submit(delay(2.0));
    wait_until("the long job runs", DEADLINE, || {
        cluster.status(long) == "running"
    });
    // Behind the one slot, depending on the long job.
    let dependent = cluster.submit(json!([{"OP_ID": "OP_TEST_DELAY", "duration": 0.01,
                                           "on_master": true, "depends": [[long, []]]}]));
    let answer = why(&cluster, dependent);
    assert_eq!(kinds(&answer), ["dependency", "slots"], "{answer}");
    assert_eq!(answer["reasons"][0]["job"], json!(long));
    assert_eq!(answer["reasons"][0]["status"], "running");
    assert_eq!(answer["reasons"][1]["running"], json!([long]));
    // A PAUSE rule.
    let uuid = cluster.client().ok(
        "ReplaceFilter",
        json!([null, 0, [["jobid", [">", "id", "watermark"]]], "PAUSE", []]),
    );
    let paused = cluster.submit(delay(0.01));
    let answer = why(&cluster, paused);
    assert_eq!(kinds(&answer), ["filter", "slots"], "{answer}");
    assert_eq!(answer["reasons"][0]["rule"], uuid);
    assert_eq!(answer["reasons"][0]["action"], "PAUSE");
    cluster.client().ok("DeleteFilter", json!([uuid]));
    // A running job: nothing in its way.
    let answer = why(&cluster, long);
    assert_eq!(answer["status"], "running");
    assert_eq!(kinds(&answer), Vec::<String>::new(), "{answer}");
    // A finished job says how it ended.
    cluster.client().ok("CancelJob", json!([dependent]));
    let answer = why(&cluster, dependent);
    assert_eq!(answer["status"], "canceled");
    assert_eq!(kinds(&answer), ["finished"]);
    assert_eq!(answer["reasons"][0]["result"], "Job canceled by request");
    // Unknown jobs and bad arguments.
    let (class, message) = cluster.client().fails("WhyJob", json!([999]));
    assert_eq!(class, "GenericError");
    assert!(message.contains("999"), "{message}");
    let (class, _) = cluster.client().fails("WhyJob", json!(["x"]));
    assert_eq!(class, "GenericError");
}

#[test]
fn a_full_bucket_names_its_running_jobs() {
    let cluster = Cluster::start();
    let reason = |text: &str| {
        json!([{"OP_ID": "OP_TEST_DELAY", "duration": 1.0, "on_master": true,
                "reason": [["test", text, 1]]}])
    };
    let first = cluster.submit(reason("rate-limit:1:solo"));
    wait_until("the first runs", DEADLINE, || {
        cluster.status(first) == "running"
    });
    let second = cluster.submit(reason("rate-limit:1:solo"));
    let answer = why(&cluster, second);
    assert_eq!(kinds(&answer), ["rate_limit"], "{answer}");
    assert_eq!(answer["reasons"][0]["bucket"], "1:solo");
    assert_eq!(answer["reasons"][0]["running"], json!([first]));
}

/// The flight recorder: a lock wait longer than `slow_wait_s` writes its
/// blocking chain into the job's log, once.
#[test]
fn a_slow_lock_wait_writes_its_blocking_chain_into_the_log_once() {
    let cluster = Cluster::start_with_settings("[wconfd]\nslow_wait_s = 1\n");
    let livelocks = cluster.root().livelock_dir();
    let mut wconfd = cluster.wconfd_client();
    let holder = OwnerProcess::spawn(&livelocks, 900);
    assert_eq!(
        try_update(&mut wconfd, &holder, &[("instance/a", "exclusive")]),
        json!([])
    );
    let job = cluster.submit(json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"],
                                     "locks": [["instance/a", "exclusive"]]}]));
    let why_entries = || -> Vec<Value> {
        cluster.query(job, &["oplog"])[0][0]
            .as_array()
            .expect("a log")
            .iter()
            .filter(|entry| entry[2] == "why")
            .cloned()
            .collect()
    };
    wait_until("the wait is recorded", DEADLINE, || {
        !why_entries().is_empty()
    });
    thread::sleep(Duration::from_millis(1500));
    let entries = why_entries();
    assert_eq!(entries.len(), 1, "once: {entries:?}");
    let message = &entries[0][3];
    assert!(
        message["waited_seconds"].as_f64().is_some_and(|s| s >= 1.0),
        "{message}"
    );
    assert_eq!(
        message["waits"][0]["blockers"][0]["owner"][0], 900,
        "{message}"
    );
    drop(holder);
    assert_eq!(cluster.wait_final(job), "success", "{}", cluster.logs());
}
