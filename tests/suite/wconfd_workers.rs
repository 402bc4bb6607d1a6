//! The worker registry over wconfd's socket (WORKERS.md): every method
//! with Boruta's texts, listing, the luxid-facing calls and their notices,
//! and durability across a clean restart and a kill -9.

use serde_json::{Value, json};

use crate::daemon::{Client, Wconfd};

fn register(client: &mut Client, uuid: &str, caps: Value, groups: Value, prepare: Value) {
    let mut caps = caps;
    caps["UUID"] = json!(uuid);
    assert_eq!(
        client.ok("registerWorker", json!([caps, groups, null, prepare])),
        Value::Null
    );
}

fn state_of(client: &mut Client, uuid: &str) -> String {
    client.ok("getWorkerInfo", json!([uuid]))["state"]
        .as_str()
        .expect("a state")
        .to_owned()
}

/// Watches from `cursor` until a batch arrives; answers it.
fn watch(client: &mut Client, cursor: &Value) -> Value {
    client.ok("watchWorkers", json!([cursor, 5000]))
}

#[test]
fn the_state_table_over_the_wire_with_boruta_texts() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let (_, text) = client.fails("registerWorker", json!([{"arch": "x"}, null, null, null]));
    assert_eq!(text, "Capabilities are missing UUID entry");
    register(
        &mut client,
        "b1",
        json!({"arch": "arm64"}),
        json!(["lab"]),
        Value::Null,
    );
    assert_eq!(state_of(&mut client, "b1"), "MAINTENANCE");
    let (class, text) = client.fails("setWorkerFail", json!(["b1", "smoke"]));
    assert_eq!(
        (class.as_str(), text.as_str()),
        (
            "GenericError",
            "It is forbidden to set FAIL state when Worker is in MAINTENANCE state"
        )
    );
    let (_, text) = client.fails("setWorkerState", json!(["b1", "RUNNING", null]));
    assert_eq!(
        text,
        "Only state changes to IDLE and MAINTENANCE are allowed"
    );
    let (_, text) = client.fails("setWorkerState", json!(["nobody", "RUNNING", null]));
    assert_eq!(
        text, "Only state changes to IDLE and MAINTENANCE are allowed",
        "checked before the lookup"
    );
    let (_, text) = client.fails("setWorkerState", json!(["nobody", "IDLE", null]));
    assert_eq!(text, "Worker not found");
    client.ok("setWorkerState", json!(["b1", "IDLE", null]));
    assert_eq!(state_of(&mut client, "b1"), "IDLE");
    let (_, text) = client.fails("setWorkerState", json!(["b1", "IDLE", null]));
    assert_eq!(text, "Invalid state transition was requested");
    let (_, text) = client.fails("deregisterWorker", json!(["b1"]));
    assert_eq!(text, "Worker is not in FAIL or MAINTENANCE state");
    client.ok("setWorkerFail", json!(["b1", "no power"]));
    let info = client.ok("getWorkerInfo", json!(["b1"]));
    assert_eq!(info["state"], "FAILED");
    assert_eq!(info["fail_reason"], "no power");
    assert_eq!(info["caps"], json!({"UUID": "b1", "arch": "arm64"}));
    assert_eq!(info["groups"], json!(["lab"]));
    client.ok("deregisterWorker", json!(["b1"]));
    let (_, text) = client.fails("getWorkerInfo", json!(["b1"]));
    assert_eq!(text, "Worker not found");
    // Malformed arguments are refused, naming the argument.
    let (_, text) = client.fails("registerWorker", json!([{"UUID": 1}, null, null, null]));
    assert!(text.contains("argument 1"), "{text}");
    let (_, text) = client.fails("setWorkerState", json!(["b1", "IDLE", {"kil": true}]));
    assert!(text.contains("unknown option 'kil'"), "{text}");
    let (_, text) = client.fails("listWorkers", json!([null, {"item": "colour"}, null]));
    assert_eq!(text, "Unknown sort item");
    let (_, text) = client.fails("requestWorkers", json!([1, 0, {"count": 65}]));
    assert!(text.contains("over the limit of 64"), "{text}");
}

#[test]
fn listing_filters_sorts_and_pages_with_totals() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    for (uuid, arch) in [("d", "arm64"), ("b", "x86"), ("a", "arm64"), ("c", "arm64")] {
        register(
            &mut client,
            uuid,
            json!({"arch": arch}),
            json!(["lab"]),
            Value::Null,
        );
    }
    client.ok("setWorkerState", json!(["c", "IDLE", null]));
    let uuids = |listing: &Value| -> Vec<String> {
        listing["workers"]
            .as_array()
            .expect("workers")
            .iter()
            .map(|worker| worker["uuid"].as_str().expect("uuid").to_owned())
            .collect()
    };
    let all = client.ok("listWorkers", json!([null, null, null]));
    assert_eq!(uuids(&all), ["a", "b", "c", "d"]);
    assert_eq!(
        (all["total"].clone(), all["remaining"].clone()),
        (json!(4), json!(0))
    );
    let arm = client.ok(
        "listWorkers",
        json!([{"caps": {"arch": "arm64"}}, {"item": "uuid", "order": "DESCENDING"}, {"limit": 2}]),
    );
    assert_eq!(uuids(&arm), ["d", "c"]);
    assert_eq!(
        (arm["total"].clone(), arm["remaining"].clone()),
        (json!(3), json!(1))
    );
    let next = client.ok(
        "listWorkers",
        json!([{"caps": {"arch": "arm64"}}, {"item": "uuid", "order": "descending"},
               {"after": "c", "limit": 2}]),
    );
    assert_eq!(uuids(&next), ["a"]);
    let back = client.ok(
        "listWorkers",
        json!([null, null, {"after": "c", "direction": "backward", "limit": 1}]),
    );
    assert_eq!(uuids(&back), ["b"]);
    assert_eq!(back["remaining"], 1);
    let idle = client.ok("listWorkers", json!([{"states": ["IDLE"]}, null, null]));
    assert_eq!(uuids(&idle), ["c"]);
}

#[test]
fn requests_are_matched_and_notified_and_survive_restarts() {
    let mut wconfd = Wconfd::start();
    let mut client = wconfd.client();
    register(
        &mut client,
        "b1",
        json!({"arch": "arm64"}),
        json!(["lab"]),
        json!(["/bin/true"]),
    );
    register(
        &mut client,
        "b2",
        json!({"arch": "x86"}),
        json!(["lab"]),
        Value::Null,
    );
    // Refused when nothing registered could ever fit.
    let (_, text) = client.fails("checkWorkers", json!([{"caps": {"arch": "sparc"}}]));
    assert_eq!(text, "no registered worker matches its workers request");
    assert_eq!(
        client.ok("checkWorkers", json!([{"groups": ["lab"]}])),
        json!(true)
    );
    let (_, text) = client.fails("requestWorkers", json!([7, 0, {"caps": {"arch": "sparc"}}]));
    assert_eq!(text, "no registered worker matches its workers request");
    // A reader's first watch gets everything to do: nothing yet.
    let first = watch(&mut client, &Value::Null);
    assert_eq!(first["full"], true);
    assert_eq!(first["notices"], json!([]));
    let cursor = first["cursor"].clone();

    client.ok("requestWorkers", json!([5, 0, {"caps": {"arch": "x86"}}]));
    client.ok(
        "requestWorkers",
        json!([6, 0, {"groups": ["lab"], "count": 2}]),
    );
    client.ok("setWorkerState", json!(["b2", "IDLE", null]));
    let batch = watch(&mut client, &cursor);
    assert_eq!(batch["full"], false);
    assert_eq!(batch["notices"].as_array().expect("notices").len(), 1);
    let notice = &batch["notices"][0];
    assert_eq!(
        (notice["kind"].clone(), notice["job"].clone()),
        (json!("assigned"), json!(5))
    );
    assert_eq!(notice["workers"][0]["uuid"], "b2");
    let cursor = batch["cursor"].clone();
    assert_eq!(state_of(&mut client, "b2"), "RUNNING");

    // b1 goes through its prepare, a notice luxid runs as a job.
    client.ok("setWorkerState", json!(["b1", "IDLE", null]));
    let batch = watch(&mut client, &cursor);
    let notice = &batch["notices"][0];
    assert_eq!(notice["kind"], "prepare");
    assert_eq!(
        (notice["uuid"].clone(), notice["seq"].clone()),
        (json!("b1"), json!(1))
    );
    assert_eq!(notice["argv"], json!(["/bin/true"]));
    let cursor = batch["cursor"].clone();

    // Killed: the registry, the holding, the waiter and the prepare
    // under way are all there again.
    wconfd.kill9();
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    assert_eq!(state_of(&mut client, "b2"), "RUNNING");
    assert_eq!(client.ok("getWorkerInfo", json!(["b2"]))["holder"], 5);
    assert_eq!(state_of(&mut client, "b1"), "PREPARE");
    // An old run's cursor gets the whole state.
    let full = watch(&mut client, &cursor);
    assert_eq!(full["full"], true);
    let kinds: Vec<(Value, Value)> = full["notices"]
        .as_array()
        .expect("notices")
        .iter()
        .map(|n| {
            (
                n["kind"].clone(),
                n.get("job").or(n.get("uuid")).cloned().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (json!("assigned"), json!(5)),
            (json!("prepare"), json!("b1"))
        ]
    );
    let cursor = full["cursor"].clone();

    // The prepare succeeds (a stale number changes nothing); job 5 ends:
    // job 6 gets both.
    client.ok("workerPrepared", json!(["b1", 9, "success", ""]));
    assert_eq!(state_of(&mut client, "b1"), "PREPARE");
    client.ok("workerPrepared", json!(["b1", 1, "success", ""]));
    assert_eq!(state_of(&mut client, "b1"), "IDLE");
    client.ok("releaseWorkers", json!([5, "success"]));
    let batch = watch(&mut client, &cursor);
    let notice = &batch["notices"][0];
    assert_eq!(
        (notice["kind"].clone(), notice["job"].clone()),
        (json!("assigned"), json!(6))
    );
    assert_eq!(notice["workers"].as_array().map(Vec::len), Some(2));
    let history = &client.ok("getWorkerInfo", json!(["b2"]))["history"];
    assert_eq!(history[0]["job"], 5);
    assert_eq!(history[0]["status"], "success");

    // Failing a held worker tells luxid to end its holder.
    client.ok("setWorkerFail", json!(["b1", "smoke"]));
    let cursor = batch["cursor"].clone();
    let batch = watch(&mut client, &cursor);
    let notice = &batch["notices"][0];
    assert_eq!(notice["kind"], "end");
    assert_eq!(notice["job"], 6);
    assert_eq!(notice["reason"], "worker b1 failed: smoke");

    // A clean stop and start keeps it all too.
    let mut wconfd = wconfd;
    wconfd.stop();
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    assert_eq!(state_of(&mut client, "b1"), "FAILED");
    assert_eq!(client.ok("getWorkerInfo", json!(["b2"]))["holder"], 6);
    let full = watch(&mut client, &Value::Null);
    let end = full["notices"]
        .as_array()
        .expect("notices")
        .iter()
        .find(|n| n["kind"] == "end")
        .cloned();
    assert_eq!(end.map(|n| n["job"].clone()), Some(json!(6)));
}

#[test]
fn a_held_watch_is_answered_when_a_notice_arrives_and_at_its_deadline() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut other = wconfd.client();
    register(&mut client, "b1", json!({}), Value::Null, Value::Null);
    let cursor = watch(&mut client, &Value::Null)["cursor"].clone();
    let started = std::time::Instant::now();
    let empty = client.ok("watchWorkers", json!([cursor, 200]));
    assert!(started.elapsed() >= std::time::Duration::from_millis(190));
    assert_eq!(empty["notices"], json!([]));
    let waiter = std::thread::spawn(move || {
        let batch = client.ok("watchWorkers", json!([cursor, 10_000]));
        (batch, std::time::Instant::now())
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    other.ok("requestWorkers", json!([3, 0, {}]));
    let asked = std::time::Instant::now();
    other.ok("setWorkerState", json!(["b1", "IDLE", null]));
    let (batch, answered) = waiter.join().expect("the watcher");
    assert_eq!(batch["notices"][0]["job"], 3);
    assert!(answered.duration_since(asked) < std::time::Duration::from_secs(1));
}
