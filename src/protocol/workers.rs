//! The JSON forms of the worker registry (PROTOCOL.md "Workers"): worker
//! objects, requests, listings' filters, sorts and pages, and the notices
//! wconfd gives luxid. wconfd's decoder, its journal and luxid use the
//! same functions, so a form is written in one place.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::jobs::JobId;
use crate::limits::WORKERS_PER_JOB_MAX;
use crate::text::shortened;
use crate::workers::{
    Direction, Filter, Holding, Order, Page, Request, Sort, SortItem, State, Worker,
};

/// A string-to-string object (`caps`).
pub fn decode_caps(value: &Value) -> Result<BTreeMap<String, String>, String> {
    let object = value.as_object().ok_or("is not an object of strings")?;
    object
        .iter()
        .map(|(key, value)| match value {
            Value::String(text) => Ok((key.clone(), text.clone())),
            _ => Err(format!(
                "has a value of {} that is not a string",
                shortened(key)
            )),
        })
        .collect()
}

pub fn decode_groups(value: &Value) -> Result<BTreeSet<String>, String> {
    decode_strings(value, "groups").map(|list| list.into_iter().collect())
}

/// A list of strings (groups, an argv).
pub fn decode_strings(value: &Value, what: &str) -> Result<Vec<String>, String> {
    let list = value
        .as_array()
        .ok_or_else(|| format!("is not a list of {what}"))?;
    list.iter()
        .map(|item| {
            item.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("has {what} that are not strings"))
        })
        .collect()
}

pub fn encode_caps(caps: &BTreeMap<String, String>) -> Value {
    Value::Object(
        caps.iter()
            .map(|(key, value)| (key.clone(), json!(value)))
            .collect(),
    )
}

/// A job's `"workers"` field: `{"groups", "caps", "count"}`, each
/// optional, nothing else.
pub fn decode_request(value: &Value) -> Result<Request, String> {
    let object = value
        .as_object()
        .ok_or("workers: is not an object of groups, caps and count")?;
    let mut groups = BTreeSet::new();
    let mut caps = BTreeMap::new();
    let mut count = None;
    for (key, item) in object {
        match key.as_str() {
            "groups" => {
                groups = decode_groups(item).map_err(|what| format!("workers: groups {what}"))?
            }
            "caps" => caps = decode_caps(item).map_err(|what| format!("workers: caps {what}"))?,
            "count" => {
                count = Some(item.as_u64().ok_or_else(|| {
                    format!("workers: count is not a number from 1 to {WORKERS_PER_JOB_MAX}")
                })?)
            }
            other => {
                return Err(format!(
                    "workers: unknown field '{}' (known: groups, caps, count)",
                    shortened(other)
                ));
            }
        }
    }
    Request::new(groups, caps, count)
}

pub fn encode_request(request: &Request) -> Value {
    json!({
        "groups": request.groups,
        "caps": encode_caps(&request.caps),
        "count": request.count,
    })
}

/// The worker object of `getWorkerInfo` and `listWorkers`.
pub fn encode_worker(worker: &Worker) -> Value {
    let history: Vec<Value> = worker.history.iter().map(encode_holding).collect();
    json!({
        "uuid": worker.uuid,
        "caps": encode_caps(&worker.caps),
        "groups": worker.groups,
        "state": worker.state.wire(),
        "address": worker.address,
        "prepare": worker.prepare,
        "fail_reason": worker.fail_reason,
        "holder": worker.holder,
        "since": worker.since,
        "history": history,
    })
}

/// What a job's programs learn of a worker it holds (`WARDEN_WORKERS`).
pub fn encode_worker_for_job(worker: &Worker) -> Value {
    json!({
        "uuid": worker.uuid,
        "caps": encode_caps(&worker.caps),
        "groups": worker.groups,
        "address": worker.address,
    })
}

fn encode_holding(holding: &Holding) -> Value {
    json!({
        "job": holding.job,
        "from": holding.from,
        "to": holding.to,
        "status": holding.status,
    })
}

/// A worker as the snapshot keeps it: the wire object plus what only
/// the registry needs.
pub fn encode_saved_worker(worker: &Worker) -> Value {
    let mut value = encode_worker(worker);
    let object = value.as_object_mut().expect("an object");
    object.insert("held_since".to_owned(), json!(worker.held_since));
    object.insert("prepare_seq".to_owned(), json!(worker.prepare_seq));
    object.insert("preparing".to_owned(), json!(worker.preparing));
    value
}

pub fn decode_saved_worker(value: &Value) -> Result<Worker, String> {
    let field = |name: &str| value.get(name).ok_or_else(|| format!("no field '{name}'"));
    let float = |name: &str| -> Result<f64, String> {
        field(name)?
            .as_f64()
            .ok_or_else(|| format!("{name} is not a number"))
    };
    let optional_string = |name: &str| -> Result<Option<String>, String> {
        match field(name)? {
            Value::Null => Ok(None),
            Value::String(text) => Ok(Some(text.clone())),
            _ => Err(format!("{name} is neither null nor a string")),
        }
    };
    let state = field("state")?
        .as_str()
        .and_then(State::parse)
        .ok_or("state is not a worker state")?;
    let prepare = match field("prepare")? {
        Value::Null => None,
        argv => Some(decode_strings(argv, "arguments").map_err(|what| format!("prepare {what}"))?),
    };
    // Absent in snapshots of before: a prepare under way then ran the
    // worker's own argv.
    let preparing = match value.get("preparing") {
        None => (state == State::Prepare).then(|| prepare.clone()).flatten(),
        Some(Value::Null) => None,
        Some(argv) => {
            Some(decode_strings(argv, "arguments").map_err(|what| format!("preparing {what}"))?)
        }
    };
    let holder = match field("holder")? {
        Value::Null => None,
        job => Some(job.as_u64().ok_or("holder is not a job id")?),
    };
    let history = field("history")?
        .as_array()
        .ok_or("history is not a list")?
        .iter()
        .map(|item| -> Result<Holding, String> {
            Ok(Holding {
                job: item
                    .get("job")
                    .and_then(Value::as_u64)
                    .ok_or("a history entry has no job")?,
                from: item
                    .get("from")
                    .and_then(Value::as_f64)
                    .ok_or("a history entry has no from")?,
                to: item
                    .get("to")
                    .and_then(Value::as_f64)
                    .ok_or("a history entry has no to")?,
                status: item
                    .get("status")
                    .and_then(Value::as_str)
                    .ok_or("a history entry has no status")?
                    .to_owned(),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Worker {
        uuid: field("uuid")?
            .as_str()
            .ok_or("uuid is not a string")?
            .to_owned(),
        caps: decode_caps(field("caps")?).map_err(|what| format!("caps {what}"))?,
        groups: decode_groups(field("groups")?).map_err(|what| format!("groups {what}"))?,
        state,
        address: optional_string("address")?,
        prepare,
        fail_reason: optional_string("fail_reason")?,
        holder,
        held_since: float("held_since")?,
        since: float("since")?,
        prepare_seq: field("prepare_seq")?
            .as_u64()
            .ok_or("prepare_seq is not a number")?,
        preparing,
        history,
    })
}

/// The environment of a job's programs for a `WARDEN_WORKERS` list: the
/// list, and the first worker's uuid and address.
pub fn worker_env_of(list: &str) -> Vec<(String, String)> {
    let mut env = vec![(crate::paths::WORKERS_ENV.to_owned(), list.to_owned())];
    let workers: Value = serde_json::from_str(list).unwrap_or(Value::Null);
    if let Some(first) = workers.get(0) {
        if let Some(uuid) = first.get("uuid").and_then(Value::as_str) {
            env.push(("WARDEN_WORKER_UUID".to_owned(), uuid.to_owned()));
        }
        if let Some(address) = first.get("address").and_then(Value::as_str) {
            env.push(("WARDEN_WORKER_ADDRESS".to_owned(), address.to_owned()));
        }
    }
    env
}

/// The uuids of a `WARDEN_WORKERS` list, in its order.
pub fn worker_uuids_of(list: &str) -> Vec<String> {
    let workers: Value = serde_json::from_str(list).unwrap_or(Value::Null);
    workers
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|worker| worker.get("uuid").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

// ----- listWorkers -----

/// `null` or `{"groups", "caps", "states"}`.
pub fn decode_filter(value: &Value) -> Result<Filter, String> {
    let mut filter = Filter::default();
    let object = match value {
        Value::Null => return Ok(filter),
        Value::Object(object) => object,
        _ => return Err("is neither null nor an object of groups, caps and states".to_owned()),
    };
    for (key, item) in object {
        match key.as_str() {
            "groups" => {
                filter.groups = decode_groups(item).map_err(|what| format!("groups {what}"))?
            }
            "caps" => filter.caps = decode_caps(item).map_err(|what| format!("caps {what}"))?,
            "states" => {
                for name in
                    decode_strings(item, "states").map_err(|what| format!("states {what}"))?
                {
                    let state = State::parse(&name.to_ascii_uppercase()).ok_or_else(|| {
                        format!("states: '{}' is not a worker state", shortened(&name))
                    })?;
                    filter.states.insert(state);
                }
            }
            other => return Err(format!("has an unknown field '{}'", shortened(other))),
        }
    }
    Ok(filter)
}

pub fn encode_filter(filter: &Filter) -> Value {
    let states: Vec<&str> = filter.states.iter().map(|state| state.wire()).collect();
    json!({
        "groups": filter.groups,
        "caps": encode_caps(&filter.caps),
        "states": states,
    })
}

/// `null` or `{"item", "order"}`; a bad item is Boruta's
/// `Unknown sort item`, told by the caller.
pub fn decode_sort(value: &Value) -> Result<Result<Sort, crate::workers::WorkerError>, String> {
    let mut sort = Sort::default();
    let object = match value {
        Value::Null => return Ok(Ok(sort)),
        Value::Object(object) => object,
        _ => return Err("is neither null nor an object of item and order".to_owned()),
    };
    for (key, item) in object {
        let text = item
            .as_str()
            .ok_or_else(|| format!("{} is not a string", shortened(key)))?;
        match key.as_str() {
            "item" => match SortItem::parse(text) {
                Ok(parsed) => sort.item = parsed,
                Err(error) => return Ok(Err(error)),
            },
            "order" => {
                sort.order = match text.to_ascii_lowercase().as_str() {
                    "ascending" | "" => Order::Ascending,
                    "descending" => Order::Descending,
                    _ => {
                        return Err(format!(
                            "order '{}' is neither ascending nor descending",
                            shortened(text)
                        ));
                    }
                }
            }
            other => return Err(format!("has an unknown field '{}'", shortened(other))),
        }
    }
    Ok(Ok(sort))
}

pub fn encode_sort(sort: Sort) -> Value {
    let item = match sort.item {
        SortItem::Uuid => "uuid",
        SortItem::State => "state",
        SortItem::Groups => "groups",
    };
    let order = match sort.order {
        Order::Ascending => "ascending",
        Order::Descending => "descending",
    };
    json!({"item": item, "order": order})
}

/// `null` or `{"after", "direction", "limit"}`.
pub fn decode_page(value: &Value) -> Result<Page, String> {
    let mut page = Page::default();
    let object = match value {
        Value::Null => return Ok(page),
        Value::Object(object) => object,
        _ => return Err("is neither null nor an object of after, direction and limit".to_owned()),
    };
    for (key, item) in object {
        match key.as_str() {
            "after" => {
                page.after = match item {
                    Value::Null => None,
                    Value::String(uuid) => Some(uuid.clone()),
                    _ => return Err("after is neither null nor a uuid".to_owned()),
                }
            }
            "direction" => {
                page.direction = match item.as_str().map(str::to_ascii_lowercase).as_deref() {
                    Some("forward") => Direction::Forward,
                    Some("backward") => Direction::Backward,
                    _ => return Err("direction is neither forward nor backward".to_owned()),
                }
            }
            "limit" => {
                // Anything over the maximum means the maximum.
                page.limit = item
                    .as_u64()
                    .ok_or("limit is not a non-negative integer")?
                    .min(usize::MAX as u64) as usize;
            }
            other => return Err(format!("has an unknown field '{}'", shortened(other))),
        }
    }
    Ok(page)
}

pub fn encode_page(page: &Page) -> Value {
    let direction = match page.direction {
        Direction::Forward => "forward",
        Direction::Backward => "backward",
    };
    json!({"after": page.after, "direction": direction, "limit": page.limit})
}

// ----- what wconfd tells luxid -----

/// Where a reader of wconfd's notices is: wconfd's run (`epoch`) and the
/// last notice read. A cursor of another run asks for everything anew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoticeCursor {
    pub epoch: u64,
    pub seq: u64,
}

/// One thing luxid must act on; each is also recoverable from the
/// registry's durable state, which a full answer lists whole.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerNotice {
    /// The job holds these workers (as its programs see them): start it.
    Assigned { job: JobId, workers: Vec<Value> },
    /// The job must end `error` with this reason.
    EndJob { job: JobId, reason: String },
    /// Run the worker's prepare `seq` as a job.
    Prepare {
        uuid: String,
        seq: u64,
        argv: Vec<String>,
        worker: Value,
    },
    /// Cancel the prepare job `seq` of the worker.
    CancelPrepare { uuid: String, seq: u64 },
}

/// A `watchWorkers` answer.
#[derive(Clone, Debug, PartialEq)]
pub struct NoticeBatch {
    pub cursor: NoticeCursor,
    /// The notices list everything still to do (a new reader, or wconfd
    /// restarted or dropped what was not read).
    pub full: bool,
    pub notices: Vec<WorkerNotice>,
}

pub fn encode_cursor(cursor: Option<NoticeCursor>) -> Value {
    match cursor {
        None => Value::Null,
        Some(cursor) => json!([cursor.epoch, cursor.seq]),
    }
}

pub fn decode_cursor(value: &Value) -> Result<Option<NoticeCursor>, String> {
    match value {
        Value::Null => Ok(None),
        Value::Array(items) => match items.as_slice() {
            [epoch, seq] => Ok(Some(NoticeCursor {
                epoch: epoch.as_u64().ok_or("epoch is not a number")?,
                seq: seq.as_u64().ok_or("seq is not a number")?,
            })),
            _ => Err("is not [epoch, seq]".to_owned()),
        },
        _ => Err("is neither null nor [epoch, seq]".to_owned()),
    }
}

pub fn encode_notice(notice: &WorkerNotice) -> Value {
    match notice {
        WorkerNotice::Assigned { job, workers } => {
            json!({"kind": "assigned", "job": job, "workers": workers})
        }
        WorkerNotice::EndJob { job, reason } => {
            json!({"kind": "end", "job": job, "reason": reason})
        }
        WorkerNotice::Prepare {
            uuid,
            seq,
            argv,
            worker,
        } => json!({"kind": "prepare", "uuid": uuid, "seq": seq, "argv": argv, "worker": worker}),
        WorkerNotice::CancelPrepare { uuid, seq } => {
            json!({"kind": "cancel_prepare", "uuid": uuid, "seq": seq})
        }
    }
}

pub fn encode_batch(batch: &NoticeBatch) -> Value {
    let notices: Vec<Value> = batch.notices.iter().map(encode_notice).collect();
    json!({
        "cursor": encode_cursor(Some(batch.cursor)),
        "full": batch.full,
        "notices": notices,
    })
}

pub fn decode_batch(value: &Value) -> Result<NoticeBatch, String> {
    let cursor = decode_cursor(value.get("cursor").unwrap_or(&Value::Null))?.ok_or("no cursor")?;
    let full = value
        .get("full")
        .and_then(Value::as_bool)
        .ok_or("no full")?;
    let notices = value
        .get("notices")
        .and_then(Value::as_array)
        .ok_or("no notices")?
        .iter()
        .map(decode_notice)
        .collect::<Result<_, _>>()?;
    Ok(NoticeBatch {
        cursor,
        full,
        notices,
    })
}

fn decode_notice(value: &Value) -> Result<WorkerNotice, String> {
    let object: &Map<String, Value> = value.as_object().ok_or("a notice is not an object")?;
    let text = |name: &str| -> Result<String, String> {
        object
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("a notice has no {name}"))
    };
    let number = |name: &str| -> Result<u64, String> {
        object
            .get(name)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("a notice has no {name}"))
    };
    Ok(match text("kind")?.as_str() {
        "assigned" => WorkerNotice::Assigned {
            job: number("job")?,
            workers: object
                .get("workers")
                .and_then(Value::as_array)
                .cloned()
                .ok_or("an assignment has no workers")?,
        },
        "end" => WorkerNotice::EndJob {
            job: number("job")?,
            reason: text("reason")?,
        },
        "prepare" => WorkerNotice::Prepare {
            uuid: text("uuid")?,
            seq: number("seq")?,
            argv: decode_strings(object.get("argv").unwrap_or(&Value::Null), "arguments")?,
            worker: object.get("worker").cloned().unwrap_or(Value::Null),
        },
        "cancel_prepare" => WorkerNotice::CancelPrepare {
            uuid: text("uuid")?,
            seq: number("seq")?,
        },
        other => return Err(format!("unknown notice kind '{}'", shortened(other))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_with_defaults_and_refuse_what_they_do_not_know() {
        let request =
            decode_request(&json!({"groups": ["lab"], "caps": {"arch": "arm64"}})).expect("valid");
        assert_eq!(request.count, 1);
        assert_eq!(decode_request(&encode_request(&request)), Ok(request));
        for (bad, expected) in [
            (json!([]), "is not an object"),
            (json!({"count": 65}), "over the limit of 64"),
            (json!({"count": 0}), "at least 1"),
            (json!({"count": -1}), "count is not a number"),
            (json!({"caps": {"a": 1}}), "not a string"),
            (json!({"groups": "lab"}), "groups is not a list"),
            (json!({"gpus": 2}), "unknown field 'gpus'"),
        ] {
            let error = decode_request(&bad).expect_err(expected);
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }

    #[test]
    fn notices_round_trip() {
        let batch = NoticeBatch {
            cursor: NoticeCursor { epoch: 7, seq: 3 },
            full: true,
            notices: vec![
                WorkerNotice::Assigned {
                    job: 4,
                    workers: vec![json!({"uuid": "b1"})],
                },
                WorkerNotice::EndJob {
                    job: 5,
                    reason: "worker b1 failed: smoke".to_owned(),
                },
                WorkerNotice::Prepare {
                    uuid: "b1".to_owned(),
                    seq: 2,
                    argv: vec!["/bin/true".to_owned()],
                    worker: json!({"uuid": "b1"}),
                },
                WorkerNotice::CancelPrepare {
                    uuid: "b1".to_owned(),
                    seq: 2,
                },
            ],
        };
        assert_eq!(decode_batch(&encode_batch(&batch)), Ok(batch));
    }
}
