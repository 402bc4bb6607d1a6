//! Job clients: threads that submit jobs to luxid over LUXI, record the
//! ids luxid acknowledged, look some of them up again and cancel some of
//! them (some with `kill`), queued, waiting or running. Jobs are short:
//! `OP_EXEC` of `true` or `sleep 0.0x`, `OP_TEST_DELAY`s, some taking the
//! same `node/<n>` locks as the lock clients, some depending on earlier
//! jobs, some of two opcodes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{Client, ClientError, Daemon};

use super::lock_clients::NODES;
use super::rng::Rng;
use super::{Backoff, Shared, SubmittedJob};

/// The client's thread: submit until told to stop.
pub fn run(shared: &Shared, index: usize) {
    let mut rng = Rng::stream(shared.seed, 2000 + index as u64);
    let mut connection: Option<Client> = None;
    let mut backoff = Backoff::new();
    while !shared.stopping() {
        let client = match &mut connection {
            Some(client) => client,
            None => match Client::connect(&shared.root, Daemon::Luxid, 1 << 24) {
                Ok(client) => {
                    backoff.reset();
                    connection.insert(client)
                }
                Err(_) => {
                    backoff.wait(&shared.stop_clients);
                    continue;
                }
            },
        };
        let (ops, depends) = job(&mut rng, shared);
        let look_up = rng.percent(15);
        let high_before = shared.serials().high();
        match client.call("SubmitJob", json!([ops])) {
            Ok(Value::Number(id)) if id.as_u64().is_some() => {
                let id = id.as_u64().expect("just checked");
                let outcome = shared.serials().acknowledge(id, high_before);
                if let Err(message) = outcome {
                    shared.violation(message);
                }
                shared.jobs().insert(
                    id,
                    SubmittedJob {
                        depends,
                        cancel_asked: false,
                        kill_asked: false,
                        dequeued: false,
                    },
                );
                shared
                    .figures
                    .jobs_submitted
                    .fetch_add(1, Ordering::Relaxed);
            }
            Ok(other) => shared.violation(format!("SubmitJob answered {other}")),
            Err(ClientError::Failed { class, args, .. }) => shared.violation(format!(
                "luxid refused a valid job: {class} {}",
                Value::Array(args)
            )),
            Err(_) => {
                // The answer is lost: the job may or may not exist; only
                // acknowledged jobs are checked.
                shared.figures.submits_lost.fetch_add(1, Ordering::Relaxed);
                connection = None;
                continue;
            }
        }
        let mut lost = false;
        if look_up {
            let known: Vec<u64> = shared.jobs().keys().rev().take(20).copied().collect();
            let id = *rng.pick(&known);
            match client.call("QueryJobs", json!([[id], ["id", "status"]])) {
                Ok(rows) => {
                    if rows[0][1].is_null() {
                        shared.violation(format!(
                            "acknowledged job {id} is unknown to luxid: {rows}"
                        ));
                    }
                }
                Err(ClientError::Failed { class, args, .. }) => shared.violation(format!(
                    "luxid refused QueryJobs: {class} {}",
                    Value::Array(args)
                )),
                Err(_) => lost = true,
            }
        }
        if !lost && rng.percent(CANCEL_PERCENT) {
            lost = !cancel(&mut rng, shared, client);
        }
        if lost {
            connection = None;
        }
        std::thread::sleep(Duration::from_millis(rng.below(25)));
    }
}

/// Submissions followed by a `CancelJob` of a recent job.
const CANCEL_PERCENT: u64 = 6;

/// Cancels one of the last jobs, mostly one that is waiting for its
/// locks or running (a third of the time with `kill`), recording what was
/// asked and what luxid answered; false if the connection is lost.
fn cancel(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    let known: Vec<u64> = shared.jobs().keys().rev().take(1000).copied().collect();
    if known.is_empty() {
        return true;
    }
    let started: Vec<u64> = match client.call("QueryJobs", json!([known, ["id", "status"]])) {
        Ok(rows) => rows
            .as_array()
            .into_iter()
            .flatten()
            .filter(|row| matches!(row[1].as_str(), Some("waiting" | "running")))
            .filter_map(|row| row[0].as_u64())
            .collect(),
        Err(ClientError::Failed { .. }) => Vec::new(),
        Err(_) => return false,
    };
    let id = if !started.is_empty() && rng.percent(75) {
        *rng.pick(&started)
    } else {
        *rng.pick(&known[..known.len().min(10)])
    };
    let kill = rng.percent(33);
    // Recorded before asking: if the answer is lost, the cancel may
    // still have happened.
    if let Some(job) = shared.jobs().get_mut(&id) {
        job.cancel_asked = true;
        job.kill_asked |= kill;
    }
    shared.figures.cancels.fetch_add(1, Ordering::Relaxed);
    if kill {
        shared
            .figures
            .cancels_killing
            .fetch_add(1, Ordering::Relaxed);
    }
    let args = if kill { json!([id, true]) } else { json!([id]) };
    match client.call("CancelJob", args) {
        Ok(answer) => {
            let dequeued = answer[0] == json!(true)
                && answer[1]
                    .as_str()
                    .is_some_and(|text| text.starts_with("Dequeued"));
            if dequeued {
                shared.figures.dequeued.fetch_add(1, Ordering::Relaxed);
                if let Some(job) = shared.jobs().get_mut(&id) {
                    job.dequeued = true;
                }
            }
            true
        }
        Err(ClientError::Failed { class, args, .. }) => {
            shared.violation(format!(
                "luxid refused CancelJob of acknowledged job {id}: {class} {}",
                Value::Array(args)
            ));
            true
        }
        Err(_) => false,
    }
}

/// A random job (its opcodes) and the jobs it depends on.
fn job(rng: &mut Rng, shared: &Shared) -> (Value, Vec<u64>) {
    let opcodes = if rng.percent(15) { 2 } else { 1 };
    let mut depends = Vec::new();
    if rng.percent(20) {
        let known: Vec<u64> = shared.jobs().keys().rev().take(30).copied().collect();
        if !known.is_empty() {
            depends.push(*rng.pick(&known));
        }
    }
    let ops: Vec<Value> = (0..opcodes)
        .map(|index| {
            let mut op = opcode(rng);
            if index == 0 && !depends.is_empty() {
                let accepted = if rng.percent(50) {
                    json!([])
                } else {
                    json!(["success"])
                };
                op["depends"] = json!([[depends[0], accepted]]);
            }
            op
        })
        .collect();
    (Value::Array(ops), depends)
}

fn opcode(rng: &mut Rng) -> Value {
    let node = *rng.pick(&NODES);
    let sleep = format!("0.0{}", rng.between(1, 5));
    match rng.below(5) {
        0 => json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"]}),
        1 => json!({"OP_ID": "OP_EXEC", "argv": ["/bin/sleep", sleep],
                    "locks": [[format!("node/{node}"), "exclusive"]]}),
        2 => json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"],
                    "locks": [[format!("node/{node}"), "shared"]]}),
        // `no_locks` defaults to true, as in Ganeti.
        3 => json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.01 * rng.between(1, 4) as f64,
                    "on_nodes": [node], "no_locks": false}),
        _ => json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.005}),
    }
}
