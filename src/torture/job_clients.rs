//! Job clients: threads that submit jobs to luxid over LUXI (one at a
//! time, or several in one `SubmitManyJobs` with relative dependencies),
//! record the ids luxid acknowledged, look some of them up again, cancel
//! some of them (some with `kill`), queued, waiting or running, change the
//! priority of some and archive some finished ones. Jobs are short:
//! `OP_EXEC` of `true` or `sleep 0.0x`, `OP_TEST_DELAY`s, some taking the
//! same `node/<n>` locks as the lock clients, some depending on earlier
//! jobs, some of two opcodes, some asking for boards of the worker
//! client's farm, some in ad-hoc rate-limit buckets, some held by the
//! harness's `PAUSE` rule while it exists (the first client adds and
//! deletes it now and then), some with a unique key. Some `OP_EXEC`s are
//! retried (`retry`, some on their runner's death), some run past their
//! `timeout`, some wait for a node with a `lock_timeout`, and some jobs
//! must start by a `start_by` that may have passed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{Client, ClientError, Daemon};
use crate::protocol::luxi::LuxiRequest;

use super::lock_clients::NODES;
use super::rng::Rng;
use super::{Backoff, Shared, SubmittedJob, worker_clients};
use crate::workers::NO_WORKER_MATCHES;

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
        let look_up = rng.percent(15);
        let submitted = if rng.percent(MANY_PERCENT) {
            submit_many(&mut rng, shared, client)
        } else {
            submit_one(&mut rng, shared, client)
        };
        if !submitted {
            // The answer is lost: the jobs may or may not exist; only
            // acknowledged jobs are checked.
            shared.figures.submits_lost.fetch_add(1, Ordering::Relaxed);
            connection = None;
            continue;
        }
        let mut lost = false;
        if look_up {
            let known: Vec<u64> = shared.jobs().keys().rev().take(20).copied().collect();
            let id = *rng.pick(&known);
            // An unknown job's row has a null status.
            let what = format!("QueryJobs of acknowledged job {id}");
            let request = LuxiRequest::QueryJobs {
                ids: Some(vec![id]),
                fields: vec!["id", "status"],
            };
            let answer = checked_call(shared, client, request, &what, |rows| !rows[0][1].is_null());
            lost = matches!(answer, Answer::Lost);
        }
        if !lost && rng.percent(CANCEL_PERCENT) {
            lost = !cancel(&mut rng, shared, client);
        }
        if !lost && rng.percent(PRIORITY_PERCENT) {
            lost = !change_priority(&mut rng, shared, client);
        }
        if !lost && rng.percent(ARCHIVE_PERCENT) {
            lost = !archive(&mut rng, shared, client);
        }
        if !lost && index == 0 && rng.percent(20) {
            lost = !toggle_filter(shared, client);
        }
        if lost {
            connection = None;
        }
        std::thread::sleep(Duration::from_millis(rng.below(25)));
    }
}

/// Submissions followed by a `CancelJob` of a recent job.
const CANCEL_PERCENT: u64 = 6;
/// Single submissions asking for boards of the farm.
const WORKERS_PERCENT: u64 = 25;
/// Submissions made with `SubmitManyJobs`.
const MANY_PERCENT: u64 = 10;
/// Submissions followed by a `ChangeJobPriority` of a recent job.
const PRIORITY_PERCENT: u64 = 5;
/// Submissions followed by an `ArchiveJob` (one in ten an
/// `AutoArchiveJobs`).
const ARCHIVE_PERCENT: u64 = 5;

/// Records an id luxid acknowledged (`high_before`: the highest id
/// acknowledged when the submission was sent).
fn acknowledged(shared: &Shared, id: u64, high_before: u64, depends: Vec<u64>) {
    if let Err(message) = shared.serials().acknowledge(id, high_before) {
        shared.violation(message);
    }
    shared.jobs().insert(
        id,
        SubmittedJob {
            depends,
            ..SubmittedJob::default()
        },
    );
    shared
        .figures
        .jobs_submitted
        .fetch_add(1, Ordering::Relaxed);
}

/// The uuid of the harness's one filter rule.
pub const FILTER_UUID: &str = "70c7a0e0-0000-4000-8000-000000000001";
/// The reason text the rule holds: jobs with it stay queued while it exists.
pub const HELD_REASON: &str = "torture:held";
/// The rule changes no sooner than this after its last change, so that a
/// held job has time to be seen held.
const FILTER_CHANGE_PAUSE_US: u64 = 3_000_000;
/// Submissions with a unique key.
const UNIQUE_PERCENT: u64 = 5;

/// One change of the harness's rule: added (`present`) or deleted, when
/// it was sent and when luxid acknowledged it (`None`: the answer was
/// lost, so it may or may not have happened).
#[derive(Clone, Debug)]
pub struct FilterChange {
    pub present: bool,
    pub sent_us: u64,
    pub acked_us: Option<u64>,
}

/// Adds the rule if the last change deleted it (or there was none), or
/// deletes it; at most every [`FILTER_CHANGE_PAUSE_US`]. False if the
/// answer is lost.
pub fn toggle_filter(shared: &Shared, client: &mut Client) -> bool {
    let _gate = shared
        .gate
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut changes = shared
        .filter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = super::history::now_us();
    if changes
        .last()
        .is_some_and(|last| now < last.sent_us + FILTER_CHANGE_PAUSE_US)
    {
        return true;
    }
    let present = !changes.last().is_some_and(|last| last.present);
    let request = if present {
        crate::protocol::Request {
            method: "ReplaceFilter".to_owned(),
            args: vec![
                json!(FILTER_UUID),
                json!(0),
                json!([["reason", ["=", "reason", HELD_REASON]]]),
                json!("PAUSE"),
                json!([]),
            ],
        }
    } else {
        crate::protocol::Request {
            method: "DeleteFilter".to_owned(),
            args: vec![json!(FILTER_UUID)],
        }
    };
    let answer = client.request(&request);
    let acked_us = match &answer {
        Ok(_) => Some(super::history::now_us()),
        // Deleting a rule a lost add never made.
        Err(ClientError::Failed { args, .. })
            if !present
                && args
                    .first()
                    .and_then(Value::as_str)
                    .is_some_and(|text| text.contains("does not exist")) =>
        {
            Some(super::history::now_us())
        }
        Err(ClientError::Failed { class, args, .. }) => {
            shared.violation(format!(
                "luxid refused the harness's {}: {class} {}",
                request.method,
                Value::Array(args.clone())
            ));
            None
        }
        Err(_) => None,
    };
    changes.push(FilterChange {
        present,
        sent_us: now,
        acked_us,
    });
    if acked_us.is_some() {
        shared
            .figures
            .filter_changes
            .fetch_add(1, Ordering::Relaxed);
    }
    answer.is_ok() || acked_us.is_some()
}

/// A `SubmitJob` of a job with a unique key: a new id is acknowledged as
/// any; an older one must be a job submitted with the same key (or one
/// whose answer was lost). False if the answer is lost.
fn submit_unique(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    let key = format!("torture-key-{}", rng.below(3));
    let (mut ops, depends) = job(rng, shared);
    ops[0]["unique_key"] = json!(key);
    let high_before = shared.serials().high();
    match checked_call(
        shared,
        client,
        LuxiRequest::SubmitJob { ops },
        "SubmitJob of a job with a unique key",
        Value::is_u64,
    ) {
        Answer::Valid(id) => {
            let id = id.as_u64().expect("checked valid");
            // Another client's submission with the key may have been
            // answered the same new id first.
            let mut serials = shared.serials();
            if id > high_before && !serials.is_acknowledged(id) {
                if let Err(message) = serials.acknowledge(id, high_before) {
                    shared.violation(message);
                }
                drop(serials);
                shared.jobs().insert(
                    id,
                    SubmittedJob {
                        depends,
                        unique_key: Some(key),
                        ..SubmittedJob::default()
                    },
                );
                shared
                    .figures
                    .jobs_submitted
                    .fetch_add(1, Ordering::Relaxed);
                return true;
            }
            drop(serials);
            shared.figures.unique_hits.fetch_add(1, Ordering::Relaxed);
            if let Some(known) = shared.jobs().get(&id)
                && known.unique_key.as_deref() != Some(key.as_str())
            {
                shared.violation(format!(
                    "a submission with unique key {key} was answered with job {id},                      submitted with {:?}",
                    known.unique_key
                ));
            }
            true
        }
        Answer::Violation => true,
        Answer::Lost => false,
    }
}

/// One `SubmitJob`; false if the answer is lost.
fn submit_one(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    if rng.percent(WORKERS_PERCENT) && shared.farm_ready.load(Ordering::SeqCst) {
        return submit_worker_job(rng, shared, client);
    }
    if rng.percent(UNIQUE_PERCENT) {
        return submit_unique(rng, shared, client);
    }
    let (ops, depends) = job(rng, shared);
    let high_before = shared.serials().high();
    let what = "SubmitJob of a valid job";
    match checked_call(
        shared,
        client,
        LuxiRequest::SubmitJob { ops },
        what,
        Value::is_u64,
    ) {
        Answer::Valid(id) => {
            acknowledged(
                shared,
                id.as_u64().expect("checked valid"),
                high_before,
                depends,
            );
            true
        }
        Answer::Violation => true,
        Answer::Lost => false,
    }
}

/// One `SubmitJob` of a job asking for boards of the farm (its first
/// opcode records what its program held, see
/// [`super::worker_clients`]); false if the answer is lost. Asking for
/// the transient board's kind may be refused while it is not registered.
fn submit_worker_job(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    let records = shared.root.join(worker_clients::RECORDS_DIR);
    let (first, kind) = worker_clients::worker_job(rng, &records);
    let mut ops = vec![first];
    if rng.percent(20) {
        ops.push(opcode(rng));
    }
    let high_before = shared.serials().high();
    match client.luxi(&LuxiRequest::SubmitJob {
        ops: Value::Array(ops),
    }) {
        Ok(Value::Number(id)) if id.is_u64() => {
            let id = id.as_u64().expect("checked above");
            acknowledged(shared, id, high_before, Vec::new());
            if let Some(job) = shared.jobs().get_mut(&id) {
                job.workers = Some(kind);
            }
            shared.figures.worker_jobs.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(ClientError::Failed { args, .. })
            if kind == "c"
                && args
                    .first()
                    .and_then(Value::as_str)
                    .is_some_and(|text| text.contains(NO_WORKER_MATCHES)) =>
        {
            shared
                .figures
                .worker_jobs_refused
                .fetch_add(1, Ordering::Relaxed);
            true
        }
        Ok(other) => {
            shared.violation(format!(
                "SubmitJob of a job asking for boards answered {other}"
            ));
            true
        }
        Err(ClientError::Failed { class, args, .. }) => {
            shared.violation(format!(
                "luxid refused a job asking for boards of kind {kind}: {class} {}",
                Value::Array(args)
            ));
            true
        }
        Err(_) => false,
    }
}

/// One `SubmitManyJobs` of two or three jobs, each after the first
/// depending on the one before it by a relative id (`-1`); false if the
/// answer is lost. Every job is valid, so each must be accepted, with
/// consecutive ids.
fn submit_many(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    let count = rng.between(2, 3) as usize;
    let mut batch = Vec::new();
    let mut depends = Vec::new();
    for index in 0..count {
        let (mut ops, absolute) = job(rng, shared);
        if index > 0 {
            let accepted = if rng.percent(50) {
                json!([])
            } else {
                json!(["success"])
            };
            let relative = json!([-1, accepted]);
            match ops[0]["depends"].as_array_mut() {
                Some(depends) => depends.push(relative),
                None => ops[0]["depends"] = json!([relative]),
            }
        }
        depends.push(absolute);
        batch.push(ops);
    }
    let high_before = shared.serials().high();
    // Each job accepted: `[true, id]`.
    let ids_of = |answer: &Value| -> Option<Vec<u64>> {
        let ids: Option<Vec<u64>> = answer
            .as_array()?
            .iter()
            .map(|entry| {
                (entry[0] == json!(true))
                    .then(|| entry[1].as_u64())
                    .flatten()
            })
            .collect();
        ids.filter(|ids| ids.len() == count)
    };
    let what = format!("SubmitManyJobs of {count} valid jobs");
    let request = LuxiRequest::SubmitManyJobs { jobs: batch };
    let ids = match checked_call(shared, client, request, &what, |answer| {
        ids_of(answer).is_some()
    }) {
        Answer::Valid(answer) => ids_of(&answer).expect("checked valid"),
        Answer::Violation => return true,
        Answer::Lost => return false,
    };
    if ids.windows(2).any(|pair| pair[1] != pair[0] + 1) {
        shared.violation(format!(
            "SubmitManyJobs gave ids that do not follow each other: {ids:?}"
        ));
    }
    shared
        .figures
        .many_submissions
        .fetch_add(1, Ordering::Relaxed);
    for (index, (id, mut depends)) in ids.iter().zip(depends).enumerate() {
        // The relative dependency, as the ordering check needs it.
        if index > 0 {
            depends.insert(0, ids[index - 1]);
        }
        acknowledged(shared, *id, high_before, depends);
    }
    true
}

/// What became of a [`checked_call`].
enum Answer {
    Valid(Value),
    /// A refusal or a malformed answer, reported as a violation.
    Violation,
    /// The connection (and the answer) was lost.
    Lost,
}

/// Sends `request`: a refusal, or an answer `valid` rejects, is a
/// violation (`what` names the call there).
fn checked_call(
    shared: &Shared,
    client: &mut Client,
    request: LuxiRequest,
    what: &str,
    valid: impl Fn(&Value) -> bool,
) -> Answer {
    match client.luxi(&request) {
        Ok(answer) if valid(&answer) => Answer::Valid(answer),
        Ok(other) => {
            shared.violation(format!("{what} answered {other}"));
            Answer::Violation
        }
        Err(ClientError::Failed { class, args, .. }) => {
            shared.violation(format!(
                "luxid refused {what}: {class} {}",
                Value::Array(args)
            ));
            Answer::Violation
        }
        Err(_) => Answer::Lost,
    }
}

/// A `[bool, message]` answer (`CancelJob`, `ChangeJobPriority`).
fn flag_and_message(answer: &Value) -> Option<(bool, &str)> {
    Some((answer[0].as_bool()?, answer[1].as_str()?))
}

/// A `ChangeJobPriority` of one of the last jobs to -10, 0 or 10; false
/// if the connection is lost. "Not found" is right only for a job that
/// was archived (which is final).
fn change_priority(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    let known: Vec<u64> = shared.jobs().keys().rev().take(30).copied().collect();
    if known.is_empty() {
        return true;
    }
    let id = *rng.pick(&known);
    let priority = *rng.pick(&[-10, 0, 10]);
    shared
        .figures
        .priority_changes
        .fetch_add(1, Ordering::Relaxed);
    let what = format!("ChangeJobPriority of acknowledged job {id}");
    let answer = checked_call(
        shared,
        client,
        LuxiRequest::ChangeJobPriority { id, priority },
        &what,
        |answer| flag_and_message(answer).is_some(),
    );
    match answer {
        Answer::Valid(answer) => {
            let (changed, message) = flag_and_message(&answer).expect("checked valid");
            let not_found = !changed && message.ends_with("not found");
            !not_found || expect_final(shared, client, id, "ChangeJobPriority answered not found")
        }
        Answer::Violation => true,
        Answer::Lost => false,
    }
}

/// An `ArchiveJob` of one of the last jobs (or, one time in ten, an
/// `AutoArchiveJobs` of the jobs that ended over a second ago); false if
/// the connection is lost. A job archived must be final, and its file
/// must be in the archive from then on, across every restart.
fn archive(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    if rng.percent(10) {
        let answer = checked_call(
            shared,
            client,
            LuxiRequest::AutoArchiveJobs {
                age: Some(Duration::from_secs(1)),
                timeout: Some(Duration::from_secs(1)),
            },
            "AutoArchiveJobs",
            |answer| answer[0].is_u64() && answer[1].is_u64(),
        );
        if let Answer::Valid(answer) = &answer {
            let count = answer[0].as_u64().expect("checked valid");
            shared
                .figures
                .auto_archived
                .fetch_add(count, Ordering::Relaxed);
        }
        return !matches!(answer, Answer::Lost);
    }
    let known: Vec<u64> = shared.jobs().keys().rev().take(100).copied().collect();
    if known.is_empty() {
        return true;
    }
    let id = *rng.pick(&known);
    let what = format!("ArchiveJob of acknowledged job {id}");
    match checked_call(
        shared,
        client,
        LuxiRequest::ArchiveJob { id },
        &what,
        Value::is_boolean,
    ) {
        Answer::Valid(Value::Bool(true)) => {
            if let Some(job) = shared.jobs().get_mut(&id) {
                job.archived = true;
            }
            shared.figures.archived.fetch_add(1, Ordering::Relaxed);
            expect_final(shared, client, id, "ArchiveJob archived it")
        }
        Answer::Valid(_) | Answer::Violation => true,
        Answer::Lost => false,
    }
}

/// Job `id` must be final now (`why`: what made it so); false if the
/// connection is lost.
fn expect_final(shared: &Shared, client: &mut Client, id: u64, why: &str) -> bool {
    let final_row =
        |rows: &Value| matches!(rows[0][0].as_str(), Some("success" | "error" | "canceled"));
    let what = format!("QueryJobs of job {id} ({why})");
    let request = LuxiRequest::QueryJobs {
        ids: Some(vec![id]),
        fields: vec!["status"],
    };
    !matches!(
        checked_call(shared, client, request, &what, final_row),
        Answer::Lost
    )
}

/// Cancels one of the last jobs, mostly one that is waiting for its
/// locks or running (a third of the time with `kill`), recording what was
/// asked and what luxid answered; false if the connection is lost.
fn cancel(rng: &mut Rng, shared: &Shared, client: &mut Client) -> bool {
    let known: Vec<u64> = shared.jobs().keys().rev().take(1000).copied().collect();
    if known.is_empty() {
        return true;
    }
    let started: Vec<u64> = match client.query_jobs(Some(&known), &["id", "status"]) {
        Ok(rows) => rows
            .iter()
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
    let what = format!("CancelJob of acknowledged job {id}");
    let answer = checked_call(
        shared,
        client,
        LuxiRequest::CancelJob { id, kill },
        &what,
        |answer| flag_and_message(answer).is_some(),
    );
    match answer {
        Answer::Valid(answer) => {
            let (canceled, message) = flag_and_message(&answer).expect("checked valid");
            // Told to a running runner too, though answered false.
            if (canceled || message.contains("informed it anyway"))
                && let Some(job) = shared.jobs().get_mut(&id)
            {
                job.cancel_taken_us
                    .get_or_insert_with(super::history::now_us);
            }
            if canceled && message.starts_with("Dequeued") {
                shared.figures.dequeued.fetch_add(1, Ordering::Relaxed);
                if let Some(job) = shared.jobs().get_mut(&id) {
                    job.dequeued = true;
                }
            }
            true
        }
        Answer::Violation => true,
        Answer::Lost => false,
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
    let mut ops = Value::Array(ops);
    if rng.percent(START_BY_PERCENT) {
        // Passed already, or soon: a job held, rate-limited or waiting
        // for its dependency may miss it.
        let offset = *rng.pick(&[-5.0, 0.0, 0.3, 1.0, 3.0]);
        ops[0]["start_by"] = json!(super::history::now_us() as f64 / 1e6 + offset);
    }
    (ops, depends)
}

fn opcode(rng: &mut Rng) -> Value {
    let mut op = plain_opcode(rng);
    // Some in ad-hoc rate-limit buckets, which the final checks hold to
    // their limits.
    match rng.below(10) {
        0 => op["reason"] = json!([["torture", "rate-limit:2:torture", 0]]),
        1 => op["reason"] = json!([["torture", "rate-limit:1:solo", 0]]),
        2 => op["reason"] = json!([["torture", HELD_REASON, 0]]),
        _ => {}
    }
    op
}

fn plain_opcode(rng: &mut Rng) -> Value {
    if rng.percent(RETRY_PERCENT) {
        return retried_opcode(rng);
    }
    if rng.percent(TIMEOUT_PERCENT) {
        return timed_opcode(rng);
    }
    let node = *rng.pick(&NODES);
    if rng.percent(LOCK_TIMEOUT_PERCENT) {
        let lock_timeout = *rng.pick(&[0.0, 0.02, 0.2]);
        return if rng.percent(50) {
            json!({"OP_ID": "OP_EXEC", "argv": ["/bin/sleep", "0.02"],
                   "locks": [[format!("node/{node}"), "exclusive"]],
                   "lock_timeout": lock_timeout})
        } else {
            json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.01 * rng.between(1, 4) as f64,
                   "on_nodes": [node], "no_locks": false, "lock_timeout": lock_timeout})
        };
    }
    let sleep = format!("0.0{}", rng.between(1, 5));
    match rng.below(5) {
        0 => json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"]}),
        1 => json!({"OP_ID": "OP_EXEC", "argv": ["/bin/sleep", sleep],
                    "locks": [[format!("node/{node}"), "exclusive"]]}),
        2 => json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"],
                    "locks": [[format!("node/{node}"), "shared"]]}),
        // `on_nodes` locks the node whatever `no_locks` says (Ganeti
        // 3.0); `false` is what Ganeti's own tests send.
        3 => json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.01 * rng.between(1, 4) as f64,
                    "on_nodes": [node], "no_locks": false}),
        _ => json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.005}),
    }
}

/// Opcodes with a `retry`, in percent of those drawn.
const RETRY_PERCENT: u64 = 8;
/// ... with an exec `timeout` (and no `retry`).
const TIMEOUT_PERCENT: u64 = 3;
/// ... with a `lock_timeout` on a node lock.
const LOCK_TIMEOUT_PERCENT: u64 = 4;
/// Jobs with a `start_by` on their first opcode.
const START_BY_PERCENT: u64 = 5;

/// The environment variable naming what a program of the harness does,
/// which the final checks read from the job's opcodes.
pub const PROGRAM_VAR: &str = "TORTURE_PROGRAM";
/// Fails (exit code `on` or 1) until its run of the opcode reaches a
/// count, then succeeds.
pub const FLAKY: &str = "flaky";
/// `/bin/false`: every attempt fails.
pub const FAILING: &str = "false";
/// Kills its runner with SIGKILL on its first runs (`retry.on_death`).
pub const RUNNER_KILLER: &str = "runner-killer";
/// Runs past its `timeout` and ends on SIGTERM.
pub const SLOW: &str = "slow";
/// Runs past its `timeout` ignoring SIGTERM: SIGKILL after the grace.
pub const STUBBORN: &str = "stubborn";
/// Where the programs count their runs, one file per job and opcode.
const RUNS_DIR: &str = "torture-runs";

fn program(kind: &str, argv: Value) -> Value {
    json!({"OP_ID": "OP_EXEC", "argv": argv, "env": {PROGRAM_VAR: kind}})
}

/// An `OP_EXEC` run again on failure: a program failing its first runs
/// (retried on any failure or on its exit code, or not retried: `on`
/// names another), `/bin/false`, one that kills its runner (`on_death`),
/// or one that always times out; some hold a node.
fn retried_opcode(rng: &mut Rng) -> Value {
    let node = *rng.pick(&NODES);
    // The shell's count of its runs of this opcode, in `n`.
    let runs = format!(
        "f=\"$WARDEN_ROOT/{RUNS_DIR}/$WARDEN_JOB_ID.{}\"; mkdir -p \"${{f%/*}}\"; \
         echo run >> \"$f\"; n=$(wc -l < \"$f\")",
        rng.below(1 << 32)
    );
    let pause = format!("0.0{}", rng.between(1, 5));
    let backoff = *rng.pick(&[0.0, 0.02, 0.1]);
    let (mut op, retry) = match rng.below(6) {
        0..=2 => {
            let succeeds_at = rng.between(1, 3);
            let code = *rng.pick(&[1, 3]);
            let on = match rng.below(3) {
                0 => Value::Null,
                1 => json!([code]),
                _ => json!([code + 1]),
            };
            let script =
                format!("{runs}; sleep {pause}; [ \"$n\" -ge {succeeds_at} ] || exit {code}");
            (
                program(FLAKY, json!(["/bin/sh", "-c", script])),
                json!({"max": rng.between(1, 3), "backoff": backoff, "on": on,
                       "on_death": rng.percent(50)}),
            )
        }
        3 => (
            program(FAILING, json!(["/bin/false"])),
            json!({"max": rng.between(2, 3), "backoff": backoff}),
        ),
        4 => {
            let deaths = rng.between(1, 2);
            // The program goes with its runner's group (luxid kills it).
            let script = format!(
                "{runs}; if [ \"$n\" -le {deaths} ]; then kill -9 $PPID; exec sleep 5; fi; \
                 sleep {pause}"
            );
            (
                program(RUNNER_KILLER, json!(["/bin/sh", "-c", script])),
                json!({"max": deaths + rng.below(2), "backoff": backoff, "on_death": true}),
            )
        }
        _ => {
            let mut op = program(SLOW, json!(["/bin/sleep", "3"]));
            op["timeout"] = json!(0.1);
            op["kill_grace"] = json!(0.5);
            (op, json!({"max": 1, "backoff": backoff}))
        }
    };
    op["retry"] = retry;
    if rng.percent(30) {
        op["locks"] = json!([[format!("node/{node}"), "exclusive"]]);
    }
    op
}

/// An `OP_EXEC` with a `timeout`: a program that runs past it (ending on
/// SIGTERM, or ignoring it until SIGKILL after `kill_grace`), or one
/// well within it.
fn timed_opcode(rng: &mut Rng) -> Value {
    let timeout = 0.1 * rng.between(1, 3) as f64;
    match rng.below(3) {
        0 => {
            let mut op = program(SLOW, json!(["/bin/sleep", "3"]));
            op["timeout"] = json!(timeout);
            op["kill_grace"] = json!(0.1 * rng.below(3) as f64);
            op
        }
        1 => {
            let script = "trap '' TERM; exec sleep 3";
            let mut op = program(STUBBORN, json!(["/bin/sh", "-c", script]));
            op["timeout"] = json!(timeout);
            op["kill_grace"] = json!(0.1 * rng.between(1, 2) as f64);
            op
        }
        // Far within it, however loaded the machine.
        _ => json!({"OP_ID": "OP_EXEC", "argv": ["/bin/sleep", "0.01"], "timeout": 30}),
    }
}
