//! `WhyJob` end to end (SCHEDULING.md "Why"): a real luxid asks a real
//! wconfd, for each job it explains that waits for locks, who is in the
//! way, and for each workers request, which workers fit and who holds
//! them; luxid's own reasons (dependencies, slots, filter rules, buckets,
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
    let told = warden(&cluster, &["why", &job.to_string()]);
    let (by_middle, by_root) = (
        told.find("blocked by job 901, holding instance/a exclusive"),
        told.find("blocked by job 900, holding instance/b exclusive"),
    );
    assert!(by_middle.is_some() && by_root > by_middle, "{told}");
    let tree = warden(&cluster, &["locks", "--tree"]);
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

fn warden(cluster: &Cluster, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .arg("--root")
        .arg(cluster.root().path())
        .args(args)
        .output()
        .expect("run warden");
    assert!(output.status.success(), "warden {args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// Job 2 waits for the one worker that fits, held by job 1, which waits
/// for a lock job 0 holds: the answer goes from the worker to its holder
/// and down the holder's lock chain.
#[test]
fn a_job_waiting_for_a_worker_is_explained_through_its_holder_s_lock_wait() {
    let cluster = Cluster::start();
    let mut wconfd = cluster.wconfd_client();
    wconfd.ok(
        "registerWorker",
        json!([{"UUID": "b1", "arch": "arm64"}, ["farm"], "b1.lab:5555", null]),
    );
    wconfd.ok("setWorkerState", json!(["b1", "IDLE", null]));
    // Fits too, but is kept out.
    wconfd.ok(
        "registerWorker",
        json!([{"UUID": "b3", "arch": "arm64"}, ["farm"], "b3.lab:5555", null]),
    );
    let release = cluster.root().path().join("release");
    let j0 = cluster.submit(json!([{"OP_ID": "OP_EXEC",
        "argv": ["/bin/sh", "-c",
                 format!("while [ ! -e {} ]; do sleep 0.05; done", release.display())],
        "locks": [["instance/a", "exclusive"]]}]));
    wait_until("job 0 runs with its lock", DEADLINE, || {
        cluster.status(j0) == "running"
    });
    let on_board = |locks: Value| {
        json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"],
                "workers": {"caps": {"arch": "arm64"}}, "locks": locks}])
    };
    let j1 = cluster.submit(on_board(json!([["instance/a", "exclusive"]])));
    wait_until("job 1 holds b1 and waits for its lock", DEADLINE, || {
        cluster.status(j1) == "waiting"
    });
    let j2 = cluster.submit(on_board(json!([])));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(cluster.status(j2), "queued");
    let told = warden(&cluster, &["why", &j2.to_string(), "--json"]);
    let answer: Value = serde_json::from_str(&told).expect("JSON");
    assert_eq!(answer["status"], "queued", "{answer}");
    assert_eq!(kinds(&answer), ["workers"], "{answer}");
    let reason = &answer["reasons"][0];
    assert_eq!(
        reason["request"]["caps"],
        json!({"arch": "arm64"}),
        "{answer}"
    );
    assert_eq!(reason["total"], 2, "{answer}");
    let worker = &reason["workers"][0];
    assert_eq!(worker["uuid"], "b1", "{answer}");
    assert_eq!(worker["state"], "RUNNING", "{answer}");
    assert_eq!(
        reason["workers"][1],
        json!({"uuid": "b3", "state": "MAINTENANCE", "holder": null}),
        "{answer}"
    );
    let holder = &worker["holder"];
    assert_eq!(holder["job"], json!(j1), "{answer}");
    assert_eq!(holder["status"], "waiting", "{answer}");
    assert_eq!(holder["why"]["id"], json!(j1), "{answer}");
    assert_eq!(kinds(&holder["why"]), ["locks"], "{answer}");
    let wait = &holder["why"]["reasons"][0]["waits"][0];
    assert_eq!(wait["job"], json!(j1), "{answer}");
    assert_eq!(wait["blockers"][0]["job"], json!(j0), "{answer}");
    let holds = wait["blockers"][0]["holds"].as_array().expect("holds");
    assert!(
        holds.contains(&json!(["instance/a", "exclusive"])),
        "{answer}"
    );
    // The text names them in the same order.
    let told = warden(&cluster, &["why", &j2.to_string()]);
    let at = |what: &str| {
        told.find(what)
            .unwrap_or_else(|| panic!("{what:?} in {told}"))
    };
    let worker_line = at(&format!("worker b1 (RUNNING), held by job {j1} (waiting)"));
    let blocker_line = at(&format!("blocked by job {j0}, holding "));
    assert!(
        at("waits for 1 worker with arch=arm64") < worker_line
            && worker_line < blocker_line
            && blocker_line < at("worker b3 (MAINTENANCE)"),
        "{told}"
    );
    // Job 0 lets go: job 1 gets its lock and ends, then job 2 gets b1.
    std::fs::write(&release, "").expect("the release file");
    assert_eq!(cluster.wait_final(j0), "success", "{}", cluster.logs());
    assert_eq!(cluster.wait_final(j1), "success", "{}", cluster.logs());
    assert_eq!(cluster.wait_final(j2), "success", "{}", cluster.logs());
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

/// A deadlock wconfd let wait (`deadlock_check = "off"`): two owners
/// share `instance/a` and both ask for it exclusively; a job asking for
/// it waits behind the knot, and `warden why` names the cycle.
#[test]
fn a_job_behind_a_deadlock_is_told_the_cycle() {
    let cluster = Cluster::start_with_settings("[wconfd]\ndeadlock_check = \"off\"\n");
    let livelocks = cluster.root().livelock_dir();
    let mut wconfd = cluster.wconfd_client();
    let first = OwnerProcess::spawn(&livelocks, 901);
    let second = OwnerProcess::spawn(&livelocks, 902);
    for owner in [&first, &second] {
        assert_eq!(
            try_update(&mut wconfd, owner, &[("instance/a", "shared")]),
            json!([])
        );
    }
    for owner in [&first, &second] {
        let blockers = update_waiting(&mut wconfd, owner, 0, &[("instance/a", "exclusive")]);
        assert_ne!(blockers, json!([]), "each waits for the other");
    }
    let job = cluster.submit(json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"],
                                     "locks": [["instance/a", "exclusive"]]}]));
    wait_until("the job waits for its lock", DEADLINE, || {
        cluster.status(job) == "waiting"
    });
    let told = warden(&cluster, &["why", &job.to_string()]);
    let cycle =
        |a: u64, b: u64| format!("(deadlock: job {a} waits for job {b}, which waits for job {a})");
    assert!(
        told.contains(&cycle(901, 902)) || told.contains(&cycle(902, 901)),
        "{told}"
    );
    let answer = why(&cluster, job);
    let blockers = answer["reasons"][0]["waits"][0]["blockers"]
        .as_array()
        .unwrap_or_else(|| panic!("blockers: {answer}"));
    assert_eq!(blockers.len(), 2, "{answer}");
    let tree = warden(&cluster, &["locks", "--tree"]);
    assert!(tree.contains("deadlock: job 901"), "{tree}");
    // Once one of the two dies, the other gets its lock, then the job.
    drop(first);
    wait_until("the survivor is granted", DEADLINE, || {
        wconfd.ok("listLocks", json!([second.owner()])) == json!([["instance/a", "exclusive"]])
    });
    drop(second);
    assert_eq!(cluster.wait_final(job), "success", "{}", cluster.logs());
}
