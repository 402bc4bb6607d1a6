//! Scheduling end to end (SCHEDULING.md): job filter rules and ad-hoc
//! rate limits held by a real luxid with real runners, the rules' LUXI
//! methods and query resource, and `warden exec --rate-limit`.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::daemon::{DEADLINE, wait_until};
use crate::luxid::{Cluster, Luxid};

/// Adds a rule; answers its uuid.
fn add_rule(cluster: &Cluster, priority: u64, predicates: Value, action: Value) -> String {
    let uuid = cluster.client().ok(
        "ReplaceFilter",
        json!([
            null,
            priority,
            predicates,
            action,
            [["test:client", "a test", 1]]
        ]),
    );
    uuid.as_str()
        .unwrap_or_else(|| panic!("ReplaceFilter answered {uuid}"))
        .to_owned()
}

fn exec_op(argv: &[&str]) -> Value {
    json!([{"OP_ID": "OP_EXEC", "argv": argv}])
}

/// Waits until the job has left `queued`; panics if it did not within
/// the deadline.
fn wait_started(cluster: &Cluster, id: u64) {
    wait_until(&format!("job {id} starts"), DEADLINE, || {
        cluster.status(id) != "queued"
    });
}

/// Checks the job stays queued for `how_long`.
pub(crate) fn stays_queued(cluster: &Cluster, id: u64, how_long: Duration) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        assert_eq!(cluster.status(id), "queued", "job {id}\n{}", cluster.logs());
        thread::sleep(Duration::from_millis(20));
    }
}

/// A delay of `seconds` with one reason entry `text`.
fn delay_with_reason(seconds: f64, text: &str) -> Value {
    json!([{"OP_ID": "OP_TEST_DELAY", "duration": seconds, "on_master": true,
            "reason": [["test:client", text, 1_700_000_000_000_000_000u64]]}])
}

fn seconds(stamp: &Value) -> f64 {
    stamp[0].as_f64().expect("secs") + stamp[1].as_f64().expect("usecs") / 1e6
}

/// The most of `ids` that ran at the same time, from their timestamps.
pub(crate) fn most_at_once(cluster: &Cluster, ids: &[u64]) -> usize {
    let mut edges = Vec::new();
    for &id in ids {
        let row = cluster.query(id, &["start_ts", "end_ts"]);
        edges.push((seconds(&row[0]), 1i32));
        edges.push((seconds(&row[1]), -1i32));
    }
    // An end and a start at the same instant: the end first.
    edges.sort_by(|a, b| a.partial_cmp(b).expect("times are numbers"));
    let (mut running, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        running += step;
        most = most.max(running);
    }
    most as usize
}

#[test]
fn a_rate_limit_reason_holds_its_bucket_to_n_and_other_jobs_run_beside_it() {
    let cluster = Cluster::start();
    let burst: Vec<u64> = (0..6)
        .map(|_| cluster.submit(delay_with_reason(0.3, "rate-limit:2:burst")))
        .collect();
    // Another n is another bucket; a text that only looks like a rate
    // limit is a plain reason.
    let other: Vec<u64> = (0..2)
        .map(|_| cluster.submit(delay_with_reason(0.3, "rate-limit:3:burst")))
        .collect();
    let plain: Vec<u64> = (0..3)
        .map(|_| cluster.submit(delay_with_reason(0.3, "rate-limit:x:burst")))
        .collect();
    for &id in burst.iter().chain(&other).chain(&plain) {
        assert_eq!(cluster.wait_final(id), "success", "job {id}");
    }
    assert_eq!(
        most_at_once(&cluster, &burst),
        2,
        "the bucket's limit, reached"
    );
    assert_eq!(
        most_at_once(&cluster, &other),
        2,
        "its own bucket, not held by the first"
    );
    assert_eq!(
        most_at_once(&cluster, &plain),
        3,
        "a plain reason limits nothing"
    );
}

#[test]
fn warden_exec_rate_limit_adds_the_reason_and_refuses_a_bad_one() {
    let cluster = Cluster::start();
    let warden = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_warden"))
            .arg("--root")
            .arg(cluster.root().path())
            .args(args)
            .output()
            .expect("run warden")
    };
    let ids: Vec<u64> = (0..3)
        .map(|_| {
            let output = warden(&["exec", "--rate-limit", "1:solo", "--", "/bin/sleep", "0.2"]);
            assert!(output.status.success(), "{output:?}");
            let text = String::from_utf8_lossy(&output.stdout);
            text.split_whitespace()
                .find_map(|word| word.parse().ok())
                .unwrap_or_else(|| panic!("a job id in {text:?}"))
        })
        .collect();
    for &id in &ids {
        assert_eq!(cluster.wait_final(id), "success", "job {id}");
    }
    assert_eq!(most_at_once(&cluster, &ids), 1);
    let reason = &cluster.query(ids[0], &["ops"])[0][0]["reason"][0];
    assert_eq!(reason[1], "rate-limit:1:solo", "{reason}");
    for bad in ["0:x", "x:y", "3", "-1:x"] {
        let output = warden(&["exec", "--rate-limit", bad, "--", "/bin/true"]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "--rate-limit {bad}: {output:?}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--rate-limit"), "{stderr}");
    }
}

#[test]
fn a_pause_rule_holds_matching_jobs_and_its_deletion_starts_them_at_once() {
    let cluster = Cluster::start();
    let uuid = add_rule(
        &cluster,
        0,
        json!([["opcode", ["=", "OP_ID", "OP_EXEC"]]]),
        json!("PAUSE"),
    );
    let paused = cluster.submit(exec_op(&["/bin/true"]));
    let free = cluster.submit(delay_with_reason(0.01, "not paused"));
    assert_eq!(
        cluster.wait_final(free),
        "success",
        "a job no rule holds runs"
    );
    stays_queued(&cluster, paused, Duration::from_millis(500));
    let deleted = cluster.client().ok("DeleteFilter", json!([uuid]));
    assert_eq!(deleted, Value::Null);
    let asked = Instant::now();
    wait_started(&cluster, paused);
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "started {took:?} after the deletion"
    );
    assert_eq!(cluster.wait_final(paused), "success");
}

#[test]
fn replacing_a_pause_with_accept_starts_the_job_and_keeps_the_uuid() {
    let cluster = Cluster::start();
    let predicates = json!([["reason", ["=", "reason", "hold me"]]]);
    let uuid = add_rule(&cluster, 3, predicates.clone(), json!("PAUSE"));
    let held = cluster.submit(delay_with_reason(0.01, "hold me"));
    stays_queued(&cluster, held, Duration::from_millis(300));
    let answer = cluster
        .client()
        .ok("ReplaceFilter", json!([uuid, 3, predicates, "ACCEPT", []]));
    assert_eq!(answer, json!(uuid));
    assert_eq!(cluster.wait_final(held), "success");
    let rows = cluster.client().ok(
        "QueryFilters",
        json!([null, ["uuid", "action", "watermark", "reason_trail"]]),
    );
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 1, "replaced, not added: {rows:?}");
    assert_eq!(rows[0][0], json!(uuid));
    assert_eq!(rows[0][1], json!("ACCEPT"));
    assert_eq!(
        rows[0][2],
        json!(held),
        "the watermark is the last job id at the replacement"
    );
    let trail = rows[0][3].as_array().expect("a trail");
    assert_eq!(
        trail.last().expect("luxid's entry")[0],
        "luxid",
        "{trail:?}"
    );
}

#[test]
fn a_reject_rule_cancels_queued_jobs_naming_the_rule() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    // A long job holds the one slot: the second is queued when the rule comes.
    let first = cluster.submit(delay_with_reason(0.6, "first"));
    wait_started(&cluster, first);
    let queued = cluster.submit(delay_with_reason(0.01, "second"));
    let uuid = add_rule(
        &cluster,
        0,
        json!([["jobid", [">", "id", 1]]]),
        json!("REJECT"),
    );
    assert_eq!(cluster.wait_final(queued), "canceled");
    let result = &cluster.query(queued, &["opresult"])[0][0];
    assert!(
        result.as_str().is_some_and(|text| text.contains(&uuid)),
        "{result}"
    );
    // A job submitted while the rule applies is canceled too; one the
    // rule does not match (it started before) is not disturbed.
    let later = cluster.submit(delay_with_reason(0.01, "third"));
    assert_eq!(cluster.wait_final(later), "canceled");
    assert_eq!(cluster.wait_final(first), "success");
}

#[test]
fn a_rate_limit_rule_holds_its_jobs_to_n() {
    let cluster = Cluster::start();
    add_rule(
        &cluster,
        0,
        json!([["reason", ["=", "reason", "limited"]]]),
        json!(["RATE_LIMIT", 2]),
    );
    let limited: Vec<u64> = (0..6)
        .map(|_| cluster.submit(delay_with_reason(0.3, "limited")))
        .collect();
    let free: Vec<u64> = (0..3)
        .map(|_| cluster.submit(delay_with_reason(0.3, "free")))
        .collect();
    for &id in limited.iter().chain(&free) {
        assert_eq!(cluster.wait_final(id), "success", "job {id}");
    }
    assert_eq!(
        most_at_once(&cluster, &limited),
        2,
        "the rule's limit, reached"
    );
    assert_eq!(
        most_at_once(&cluster, &free),
        3,
        "jobs the rule does not apply to"
    );
}

#[test]
fn rules_survive_kill_9_and_still_hold_jobs() {
    let mut cluster = Cluster::start();
    let uuid = add_rule(&cluster, 1, json!([]), json!("PAUSE"));
    let held = cluster.submit(delay_with_reason(0.01, "any"));
    cluster.luxid.kill9();
    cluster.luxid = Luxid::start_on(cluster.root());
    let rows = cluster.client().ok(
        "QueryFilters",
        json!([[uuid], ["uuid", "priority", "action", "predicates"]]),
    );
    assert_eq!(rows, json!([[uuid, 1, "PAUSE", []]]));
    stays_queued(&cluster, held, Duration::from_millis(300));
    cluster.client().ok("DeleteFilter", json!([uuid]));
    assert_eq!(cluster.wait_final(held), "success");
}

#[test]
fn bad_rules_are_refused_and_change_nothing() {
    let cluster = Cluster::start();
    let kept = add_rule(&cluster, 0, json!([]), json!("CONTINUE"));
    let bad = [
        (json!([null, -1, [], "ACCEPT", []]), "priority"),
        (
            json!([null, 0, [["nodeid", null]], "ACCEPT", []]),
            "unknown kind",
        ),
        (
            json!([null, 0, [["opcode", ["~~", "OP_ID", "x"]]], "ACCEPT", []]),
            "predicate 0",
        ),
        (
            json!([null, 0, [["opcode", ["=~", "OP_ID", "("]]], "ACCEPT", []]),
            "predicate 0",
        ),
        (json!([null, 0, [], "DROP", []]), "unknown action"),
        (json!([null, 0, [], ["RATE_LIMIT", 0], []]), "RATE_LIMIT"),
        (json!([kept, 0, [], "SHOUT", []]), "unknown action"),
    ];
    for (args, text) in bad {
        let (class, message) = cluster.client().fails("ReplaceFilter", args.clone());
        assert!(
            matches!(class.as_str(), "OpPrereqError" | "GenericError"),
            "{args}: {class}"
        );
        assert!(message.contains(text), "{args}: {message}");
    }
    let (class, message) = cluster.client().fails(
        "DeleteFilter",
        json!(["0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6"]),
    );
    assert_eq!(class, "GenericError");
    assert!(message.contains("does not exist"), "{message}");
    let rows = cluster
        .client()
        .ok("QueryFilters", json!([null, ["uuid", "action"]]));
    assert_eq!(rows, json!([[kept, "CONTINUE"]]), "nothing changed");
    let (class, message) = cluster
        .client()
        .fails("QueryFilters", json!([null, ["uuid", "bogus"]]));
    assert_eq!(class, "OpPrereqError");
    assert!(message.contains("bogus"), "{message}");
}

#[test]
fn the_filter_query_resource_answers_in_ganetis_shape() {
    let cluster = Cluster::start();
    let low = add_rule(&cluster, 0, json!([]), json!("CONTINUE"));
    let high = add_rule(&cluster, 9, json!([]), json!(["RATE_LIMIT", 4]));
    let answer = cluster.client().ok(
        "Query",
        json!([
            "filter",
            ["uuid", "priority", "action", "nope"],
            [">", "priority", 5]
        ]),
    );
    assert_eq!(
        answer["data"],
        json!([[[0, high], [0, 9], [0, ["RATE_LIMIT", 4]], [1, null]]])
    );
    assert_eq!(answer["fields"][0]["title"], "UUID");
    assert_eq!(answer["fields"][3]["kind"], "unknown");
    let answer = cluster
        .client()
        .ok("Query", json!(["filter", ["uuid"], null]));
    let mut uuids = [low.clone(), high.clone()];
    uuids.sort();
    let listed: Vec<Value> = uuids.iter().map(|uuid| json!([[0, uuid]])).collect();
    assert_eq!(answer["data"], json!(listed), "every rule, in uuid order");
    let fields = cluster.client().ok("QueryFields", json!(["filter", null]));
    let names: Vec<&str> = fields["fields"]
        .as_array()
        .expect("fields")
        .iter()
        .filter_map(|field| field["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "action",
            "predicates",
            "priority",
            "reason_trail",
            "uuid",
            "watermark"
        ]
    );
    let (class, _) = cluster
        .client()
        .fails("Query", json!(["filter", ["uuid"], ["=", "bogus", 1]]));
    assert_eq!(class, "ParameterError");
}

fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

#[test]
fn a_unique_key_answers_the_live_jobs_id_until_it_finishes() {
    let cluster = Cluster::start();
    let keyed = |key: &str, seconds: f64| {
        json!([{"OP_ID": "OP_TEST_DELAY", "duration": seconds, "on_master": true,
                "unique_key": key}])
    };
    let first = cluster.submit(keyed("nightly", 0.5));
    assert_eq!(
        cluster.submit(keyed("nightly", 0.5)),
        first,
        "the live job's id"
    );
    let many = cluster.client().ok(
        "SubmitManyJobs",
        json!([[
            keyed("nightly", 0.1),
            keyed("hourly", 0.1),
            keyed("hourly", 0.1)
        ]]),
    );
    let other = many[1][1].as_u64().expect("a new job");
    assert_eq!(
        many,
        json!([[true, first], [true, other], [true, other]]),
        "{many}"
    );
    assert_eq!(cluster.wait_final(first), "success");
    let again = cluster.submit(keyed("nightly", 0.01));
    assert!(again > other, "a finished job frees its key: {again}");
    assert_eq!(cluster.wait_final(again), "success");
}

#[test]
fn a_job_not_started_by_its_start_by_is_canceled() {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    let long = cluster.submit(delay_with_reason(1.5, "long"));
    wait_started(&cluster, long);
    let late = cluster.submit(json!([{"OP_ID": "OP_TEST_DELAY", "duration": 0.01,
                                      "on_master": true, "start_by": wall_now() + 0.3}]));
    let patient = cluster.submit(json!([{"OP_ID": "OP_TEST_DELAY", "duration": 0.01,
                                         "on_master": true, "start_by": wall_now() + 3600.0}]));
    assert_eq!(cluster.wait_final(late), "canceled");
    let result = &cluster.query(late, &["opresult"])[0][0];
    assert!(
        result
            .as_str()
            .is_some_and(|text| text.contains("not started by")),
        "{result}"
    );
    assert_eq!(cluster.wait_final(patient), "success", "in time");
    assert_eq!(cluster.wait_final(long), "success");
}

#[test]
fn bad_unique_keys_and_start_bys_are_refused_naming_the_field() {
    let cluster = Cluster::start();
    let delay_op = |extra: Value| {
        let mut op = json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.01, "on_master": true});
        for (key, value) in extra.as_object().expect("fields") {
            op[key] = value.clone();
        }
        op
    };
    let cases = [
        (json!([delay_op(json!({"unique_key": ""}))]), "unique_key"),
        (json!([delay_op(json!({"unique_key": 7}))]), "unique_key"),
        (
            json!([delay_op(json!({"unique_key": "x".repeat(300)}))]),
            "unique_key",
        ),
        (json!([delay_op(json!({"start_by": "soon"}))]), "start_by"),
        (json!([delay_op(json!({"start_by": -5}))]), "start_by"),
        (
            json!([delay_op(json!({})), delay_op(json!({"start_by": 1}))]),
            "start_by",
        ),
        (
            json!([delay_op(json!({})), delay_op(json!({"unique_key": "k"}))]),
            "unique_key",
        ),
    ];
    for (ops, field) in cases {
        let (class, message) = cluster.client().fails("SubmitJob", json!([ops]));
        assert_eq!(class, "OpPrereqError", "{ops}");
        assert!(message.contains(field), "{ops}: {message}");
    }
    let rows = cluster.client().ok("QueryJobs", json!([null, ["id"]]));
    assert_eq!(rows, json!([]), "nothing was stored");
}
