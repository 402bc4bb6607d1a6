//! Job clients: threads that submit jobs to luxid over LUXI, record the
//! ids luxid acknowledged, and look some of them up again. Jobs are short:
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
                shared.jobs().insert(id, SubmittedJob { depends });
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
                Err(_) => connection = None,
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(25)));
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
