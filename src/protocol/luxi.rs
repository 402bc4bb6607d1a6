//! luxid's LUXI methods (PROTOCOL.md "4. luxid methods"), decoded from the
//! wire into typed requests, and encoded again as a client sends them.
//!
//! What a request can be checked for without the queue is checked here:
//! the argument count and shapes, job ids, field names (against
//! [`FIELDS`], at most [`QUERY_FIELDS_MAX`]), priorities, and the
//! `WaitForJobChange` timeout (capped at [`WAIT_FOR_CHANGE_SECONDS_MAX`]).
//! The opcodes of a submission stay JSON: luxid checks them job by job,
//! after the drain flag and the room in the queue, because
//! `SubmitManyJobs` answers a bad job with `[false, message]` in its list,
//! not as an error of the request. For the same reason the number of jobs
//! in one `SubmitManyJobs` is checked by [`check_submit_many_count`] after
//! the drain flag, not here.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Args, Request, WireError};
use crate::jobs::opcode::SUBMIT_PRIORITIES;
use crate::jobs::{FIELDS, JobId};
use crate::limits::{QUERY_FIELDS_MAX, SUBMIT_MANY_JOBS_MAX, WAIT_FOR_CHANGE_SECONDS_MAX};
use crate::text::shortened;

use super::events::WatchEvents;
use crate::scheduling::filters::Action;
use crate::scheduling::{RuleParts, decode_rule};

/// Every LUXI method luxid serves.
#[derive(Clone, Debug, PartialEq)]
pub enum LuxiRequest {
    /// One job: its opcodes as submitted.
    SubmitJob {
        ops: Value,
    },
    /// One job, accepted even while the queue is drained.
    SubmitJobToDrainedQueue {
        ops: Value,
    },
    /// Several jobs, each a list of opcodes as submitted.
    SubmitManyJobs {
        jobs: Vec<Value>,
    },
    /// Rows of `fields` for `ids` (`None`: every job in the queue, and the
    /// archived ones too if `archived` is asked for).
    QueryJobs {
        ids: Option<Vec<JobId>>,
        fields: Vec<&'static str>,
    },
    /// Held until `fields` of the job differ from `previous`, or a log
    /// entry newer than `log_serial` exists, or `timeout` passes.
    WaitForJobChange {
        id: JobId,
        fields: Vec<&'static str>,
        previous: Value,
        log_serial: u64,
        timeout: Duration,
    },
    /// `kill`: SIGKILL the job's processes instead of asking it to stop.
    CancelJob {
        id: JobId,
        kill: bool,
    },
    ArchiveJob {
        id: JobId,
    },
    /// Archives finished jobs older than `age` (`None`: every finished
    /// job), for at most `timeout` (`None`: no limit).
    AutoArchiveJobs {
        age: Option<Duration>,
        timeout: Option<Duration>,
    },
    /// `priority` is one of [`SUBMIT_PRIORITIES`].
    ChangeJobPriority {
        id: JobId,
        priority: i64,
    },
    SetDrainFlag {
        drained: bool,
    },
    /// Each entry a field name; an entry that is not a string (`None`) is
    /// answered `null`, as an unknown name is.
    QueryConfigValues {
        fields: Vec<Option<String>>,
    },
    /// Ganeti's generic query: `what` the resource, `filter` the query
    /// filter as JSON (decoded by the query module that serves it).
    Query {
        what: String,
        fields: Vec<String>,
        filter: Value,
    },
    /// The fields of resource `what` (all of them if `fields` is empty).
    QueryFields {
        what: String,
        fields: Vec<String>,
    },
    /// luxid's event sequence (extension, EVENTS.md): held until events
    /// after the position arrive or the timeout passes.
    WatchEvents(WatchEvents),
    /// Adds a job filter rule (`uuid` `None`: a new one) or replaces one;
    /// answered with its uuid. `reason`: `[source, text, timestamp]`
    /// entries.
    ReplaceFilter {
        uuid: Option<String>,
        rule: RuleParts,
        reason: Vec<Value>,
    },
    DeleteFilter {
        uuid: String,
    },
    /// Rows of `fields` for the rules of `uuids` (`None`: every rule).
    QueryFilters {
        uuids: Option<Vec<String>>,
        fields: Vec<String>,
    },
    /// *(extension)* Why the job is not running (SCHEDULING.md "Why").
    WhyJob {
        id: JobId,
    },
}

impl LuxiRequest {
    /// Decodes a request; unknown methods and wrong argument shapes are
    /// errors naming the method and the argument.
    pub fn decode(request: &Request) -> Result<LuxiRequest, WireError> {
        use LuxiRequest::*;
        let method = request.method.as_str();
        let args = &request.args;
        let arity = |count| Args::exactly(method, args, count);
        let decoded = match method {
            "SubmitJob" => SubmitJob {
                ops: arity(1)?.get(0).clone(),
            },
            "SubmitJobToDrainedQueue" => SubmitJobToDrainedQueue {
                ops: arity(1)?.get(0).clone(),
            },
            "SubmitManyJobs" => SubmitManyJobs {
                jobs: arity(1)?.list(0)?.to_vec(),
            },
            "QueryJobs" => {
                let args = arity(2)?;
                // The fields are checked first, as luxid always has.
                let fields = field_names(&args, 1)?;
                let ids = match args.get(0) {
                    Value::Null => None,
                    Value::Array(ids) => Some(
                        ids.iter()
                            .map(|id| {
                                parse_job_id(id)
                                    .ok_or_else(|| args.bad(0, "holds something not a job id"))
                            })
                            .collect::<Result<_, _>>()?,
                    ),
                    _ => return Err(args.bad(0, "is neither a list of job ids nor null")),
                };
                QueryJobs { ids, fields }
            }
            "WaitForJobChange" => {
                let args = arity(5)?;
                let id = job_id(&args, 0)?;
                let fields = field_names(&args, 1)?;
                let previous = args.get(2).clone();
                let log_serial = match args.get(3) {
                    Value::Null => 0,
                    value => value
                        .as_u64()
                        .ok_or_else(|| args.bad(3, "is not a log serial"))?,
                };
                let seconds = args
                    .get(4)
                    .as_f64()
                    .filter(|seconds| *seconds >= 0.0)
                    .ok_or_else(|| args.bad(4, "is not a timeout in seconds"))?
                    .min(WAIT_FOR_CHANGE_SECONDS_MAX);
                WaitForJobChange {
                    id,
                    fields,
                    previous,
                    log_serial,
                    timeout: Duration::from_secs_f64(seconds),
                }
            }
            "WatchEvents" => WatchEvents(super::events::WatchEvents::decode(&arity(3)?)?),
            "CancelJob" => match args.len() {
                1 => CancelJob {
                    id: job_id(&arity(1)?, 0)?,
                    kill: false,
                },
                2 => {
                    let args = arity(2)?;
                    CancelJob {
                        id: job_id(&args, 0)?,
                        kill: args.bool(1)?,
                    }
                }
                count => {
                    return Err(WireError::generic(format!(
                        "{method} takes 1 or 2 arguments, got {count}"
                    )));
                }
            },
            "ArchiveJob" => ArchiveJob {
                id: job_id(&arity(1)?, 0)?,
            },
            "AutoArchiveJobs" => {
                let args = arity(2)?;
                let age = args
                    .get(0)
                    .as_f64()
                    .ok_or_else(|| args.bad(0, "is not an age in seconds"))?;
                let timeout = args
                    .get(1)
                    .as_f64()
                    .ok_or_else(|| args.bad(1, "is not a timeout in seconds"))?;
                AutoArchiveJobs {
                    age: unless_negative(age),
                    timeout: unless_negative(timeout),
                }
            }
            "ChangeJobPriority" => {
                let args = arity(2)?;
                let id = job_id(&args, 0)?;
                let priority = args.i64(1)?;
                if !SUBMIT_PRIORITIES.contains(&priority) {
                    return Err(prereq(format!(
                        "priority {priority} is not one of {SUBMIT_PRIORITIES:?}"
                    )));
                }
                ChangeJobPriority { id, priority }
            }
            "SetDrainFlag" => SetDrainFlag {
                drained: arity(1)?.bool(0)?,
            },
            "QueryConfigValues" => QueryConfigValues {
                fields: arity(1)?
                    .list(0)?
                    .iter()
                    .map(|field| field.as_str().map(str::to_owned))
                    .collect(),
            },
            "Query" => {
                let args = arity(3)?;
                Query {
                    what: args.string(0)?.to_owned(),
                    fields: strings(&args, 1)?,
                    filter: args.get(2).clone(),
                }
            }
            "QueryFields" => {
                let args = arity(2)?;
                QueryFields {
                    what: args.string(0)?.to_owned(),
                    fields: strings(&args, 1)?,
                }
            }
            "ReplaceFilter" => {
                let args = arity(5)?;
                let uuid = match args.get(0) {
                    Value::Null => None,
                    _ => Some(filter_uuid(&args, 0)?),
                };
                let rule = decode_rule(args.get(1), args.get(2), args.get(3)).map_err(prereq)?;
                let reason = args.list(4)?;
                if let Some(bad) = reason.iter().find(|entry| !is_reason_entry(entry)) {
                    return Err(prereq(format!(
                        "reason: {} is not [source, text, timestamp]",
                        shortened(&bad.to_string())
                    )));
                }
                ReplaceFilter {
                    uuid,
                    rule,
                    reason: reason.to_vec(),
                }
            }
            "WhyJob" => WhyJob {
                id: job_id(&arity(1)?, 0)?,
            },
            "DeleteFilter" => DeleteFilter {
                uuid: filter_uuid(&arity(1)?, 0)?,
            },
            "QueryFilters" => {
                let args = arity(2)?;
                let uuids = match args.get(0) {
                    Value::Null => None,
                    _ => Some(strings(&args, 0)?),
                };
                QueryFilters {
                    uuids,
                    fields: strings(&args, 1)?,
                }
            }
            other => {
                return Err(WireError::generic(format!(
                    "unknown method '{}'",
                    shortened(other)
                )));
            }
        };
        Ok(decoded)
    }

    /// The method's name on the wire.
    pub fn method(&self) -> &'static str {
        use LuxiRequest::*;
        match self {
            SubmitJob { .. } => "SubmitJob",
            SubmitJobToDrainedQueue { .. } => "SubmitJobToDrainedQueue",
            SubmitManyJobs { .. } => "SubmitManyJobs",
            QueryJobs { .. } => "QueryJobs",
            WaitForJobChange { .. } => "WaitForJobChange",
            CancelJob { .. } => "CancelJob",
            ArchiveJob { .. } => "ArchiveJob",
            AutoArchiveJobs { .. } => "AutoArchiveJobs",
            ChangeJobPriority { .. } => "ChangeJobPriority",
            SetDrainFlag { .. } => "SetDrainFlag",
            QueryConfigValues { .. } => "QueryConfigValues",
            Query { .. } => "Query",
            QueryFields { .. } => "QueryFields",
            WatchEvents(_) => "WatchEvents",
            ReplaceFilter { .. } => "ReplaceFilter",
            DeleteFilter { .. } => "DeleteFilter",
            QueryFilters { .. } => "QueryFilters",
            WhyJob { .. } => "WhyJob",
        }
    }

    /// The request as a client sends it (Ganeti's argument forms: a
    /// negative age or timeout for none, `CancelJob` with one argument
    /// unless it kills).
    pub fn encode(&self) -> Request {
        use LuxiRequest::*;
        let args = match self {
            SubmitJob { ops } | SubmitJobToDrainedQueue { ops } => vec![ops.clone()],
            SubmitManyJobs { jobs } => vec![Value::Array(jobs.clone())],
            QueryJobs { ids, fields } => vec![json!(ids), json!(fields)],
            WaitForJobChange {
                id,
                fields,
                previous,
                log_serial,
                timeout,
            } => vec![
                json!(id),
                json!(fields),
                previous.clone(),
                json!(log_serial),
                json!(timeout.as_secs_f64()),
            ],
            CancelJob { id, kill: false } => vec![json!(id)],
            CancelJob { id, kill: true } => vec![json!(id), json!(true)],
            ArchiveJob { id } => vec![json!(id)],
            AutoArchiveJobs { age, timeout } => {
                vec![seconds_or_none(*age), seconds_or_none(*timeout)]
            }
            ChangeJobPriority { id, priority } => vec![json!(id), json!(priority)],
            SetDrainFlag { drained } => vec![json!(drained)],
            QueryConfigValues { fields } => vec![json!(fields)],
            Query {
                what,
                fields,
                filter,
            } => vec![json!(what), json!(fields), filter.clone()],
            QueryFields { what, fields } => vec![json!(what), json!(fields)],
            WatchEvents(watch) => watch.encode(),
            ReplaceFilter { uuid, rule, reason } => replace_filter_args(
                uuid.as_deref(),
                rule.priority,
                &rule.predicates_json,
                &rule.action,
                reason,
            ),
            DeleteFilter { uuid } => vec![json!(uuid)],
            QueryFilters { uuids, fields } => vec![json!(uuids), json!(fields)],
            WhyJob { id } => vec![json!(id)],
        };
        Request {
            method: self.method().to_owned(),
            args,
        }
    }
}

/// A `ReplaceFilter` as a client sends it: the rule's predicates as the
/// user wrote them, unchecked, so that luxid judges them and its refusal
/// names the bad part. ([`LuxiRequest::ReplaceFilter`] is what luxid
/// decoded: a checked rule.) Both encode through one function.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplaceFilterCall {
    /// `None`: a new rule.
    pub uuid: Option<String>,
    pub priority: u64,
    /// A list of `[kind, filter]`, as JSON.
    pub predicates: Value,
    pub action: Action,
    /// `[source, text, timestamp]` entries.
    pub reason: Vec<Value>,
}

impl ReplaceFilterCall {
    pub fn encode(&self) -> Request {
        Request {
            method: "ReplaceFilter".to_owned(),
            args: replace_filter_args(
                self.uuid.as_deref(),
                self.priority,
                &self.predicates,
                &self.action,
                &self.reason,
            ),
        }
    }
}

/// `ReplaceFilter`'s arguments: `[uuid|null, priority, predicates,
/// action, reason]`.
fn replace_filter_args(
    uuid: Option<&str>,
    priority: u64,
    predicates: &Value,
    action: &Action,
    reason: &[Value],
) -> Vec<Value> {
    vec![
        json!(uuid),
        json!(priority),
        predicates.clone(),
        action.to_json(),
        json!(reason),
    ]
}

/// The check of a `SubmitManyJobs`'s size, made once the queue is known
/// not to be drained (so a drained queue says so first).
pub fn check_submit_many_count(count: usize) -> Result<(), WireError> {
    if count > SUBMIT_MANY_JOBS_MAX {
        return Err(WireError::generic(format!(
            "SubmitManyJobs: {count} jobs are over the limit of {SUBMIT_MANY_JOBS_MAX} per submission; submit them in parts"
        )));
    }
    Ok(())
}

/// The `OpPrereqError` of a request a job's checks refuse (Ganeti's
/// `wrong_input`).
pub fn prereq(message: impl Into<String>) -> WireError {
    WireError {
        class: "OpPrereqError",
        args: vec![json!(message.into()), json!("wrong_input")],
    }
}

/// A job id on the wire: a positive number, or a string of digits (older
/// Ganeti clients send those).
pub fn parse_job_id(value: &Value) -> Option<JobId> {
    match value {
        Value::Number(number) => number.as_u64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    }
    .filter(|&id| id > 0)
}

/// A QueryJobs field name as the one `&'static str` of [`FIELDS`], or
/// `None` if there is no such field.
pub fn job_field(name: &str) -> Option<&'static str> {
    FIELDS.iter().find(|known| **known == name).copied()
}

/// A filter rule's uuid: Ganeti's form, 8-4-4-4-12 hexadecimal digits.
fn filter_uuid(args: &Args, index: usize) -> Result<String, WireError> {
    let uuid = args.string(index)?;
    let groups: Vec<&str> = uuid.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|group| group.len()).collect();
    let hex = groups
        .iter()
        .all(|group| group.bytes().all(|byte| byte.is_ascii_hexdigit()));
    if lengths == [8, 4, 4, 4, 12] && hex {
        Ok(uuid.to_owned())
    } else {
        Err(WireError::generic(format!(
            "Unable to parse UUID '{}'",
            shortened(uuid)
        )))
    }
}

/// A reason trail entry: `[source, text, timestamp]`.
fn is_reason_entry(entry: &Value) -> bool {
    matches!(
        entry.as_array().map(Vec::as_slice),
        Some([Value::String(_), Value::String(_), Value::Number(timestamp)]) if timestamp.is_i64() || timestamp.is_u64()
    )
}

fn job_id(args: &Args, index: usize) -> Result<JobId, WireError> {
    parse_job_id(args.get(index)).ok_or_else(|| args.bad(index, "is not a job id"))
}

/// The list of field names at `index`: at most [`QUERY_FIELDS_MAX`], each
/// one of [`FIELDS`].
fn field_names(args: &Args, index: usize) -> Result<Vec<&'static str>, WireError> {
    let fields = args.list(index)?;
    check_field_count(fields.len())?;
    fields
        .iter()
        .map(|field| match field.as_str() {
            Some(name) => {
                job_field(name).ok_or_else(|| prereq(format!("Unknown job field '{name}'")))
            }
            None => Err(args.bad(index, "holds a field name that is not a string")),
        })
        .collect()
}

/// A list of names at `index` (the fields of a generic query), at most
/// [`QUERY_FIELDS_MAX`].
fn strings(args: &Args, index: usize) -> Result<Vec<String>, WireError> {
    let list = args.list(index)?;
    check_field_count(list.len())?;
    list.iter()
        .map(|field| {
            field
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| args.bad(index, "holds a field name that is not a string"))
        })
        .collect()
}

fn check_field_count(count: usize) -> Result<(), WireError> {
    if count > QUERY_FIELDS_MAX {
        return Err(prereq(format!(
            "{count} fields are over the limit of {QUERY_FIELDS_MAX} per query"
        )));
    }
    Ok(())
}

/// Seconds as Ganeti sends an age or a time limit: negative for none. A
/// value beyond what a `Duration` holds is as good as endless.
fn unless_negative(seconds: f64) -> Option<Duration> {
    if seconds < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
}

fn seconds_or_none(duration: Option<Duration>) -> Value {
    match duration {
        Some(duration) => json!(duration.as_secs_f64()),
        None => json!(-1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode(method: &str, args: Value) -> Result<LuxiRequest, WireError> {
        let Value::Array(args) = args else {
            panic!("args")
        };
        LuxiRequest::decode(&Request {
            method: method.to_owned(),
            args,
        })
    }

    #[test]
    fn requests_decode_to_typed_values() {
        assert_eq!(
            decode("QueryJobs", json!([[3, "4"], ["id", "status"]])),
            Ok(LuxiRequest::QueryJobs {
                ids: Some(vec![3, 4]),
                fields: vec!["id", "status"],
            })
        );
        assert_eq!(
            decode("WaitForJobChange", json!([7, ["status"], null, null, 500])),
            Ok(LuxiRequest::WaitForJobChange {
                id: 7,
                fields: vec!["status"],
                previous: Value::Null,
                log_serial: 0,
                timeout: Duration::from_secs(89),
            })
        );
        assert_eq!(
            decode("CancelJob", json!(["2"])),
            Ok(LuxiRequest::CancelJob { id: 2, kill: false })
        );
        assert_eq!(
            decode("AutoArchiveJobs", json!([-1, 1e300])),
            Ok(LuxiRequest::AutoArchiveJobs {
                age: None,
                timeout: Some(Duration::MAX),
            })
        );
        let replace = decode(
            "ReplaceFilter",
            json!([
                "0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
                2,
                [["jobid", [">", "id", "watermark"]]],
                ["RATE_LIMIT", 3],
                [["gnt:user", "why", 5]]
            ]),
        )
        .expect("a good rule");
        let LuxiRequest::ReplaceFilter { uuid, rule, reason } = &replace else {
            panic!("decoded as {replace:?}");
        };
        assert_eq!(
            uuid.as_deref(),
            Some("0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6")
        );
        assert_eq!(rule.priority, 2);
        assert_eq!(
            rule.action,
            crate::scheduling::filters::Action::RateLimit(3)
        );
        assert_eq!(reason, &vec![json!(["gnt:user", "why", 5])]);
        let encoded = replace.encode();
        assert_eq!(LuxiRequest::decode(&encoded), Ok(replace));
        // A client's call of the same rule is the same request.
        let call = ReplaceFilterCall {
            uuid: Some("0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6".to_owned()),
            priority: 2,
            predicates: json!([["jobid", [">", "id", "watermark"]]]),
            action: crate::scheduling::filters::Action::RateLimit(3),
            reason: vec![json!(["gnt:user", "why", 5])],
        };
        assert_eq!(call.encode(), encoded);
        assert_eq!(
            decode("QueryFilters", json!([null, ["uuid"]])),
            Ok(LuxiRequest::QueryFilters {
                uuids: None,
                fields: vec!["uuid".to_owned()],
            })
        );
        assert_eq!(
            decode("QueryConfigValues", json!([["drain_flag", 3]])),
            Ok(LuxiRequest::QueryConfigValues {
                fields: vec![Some("drain_flag".to_owned()), None],
            })
        );
    }

    #[test]
    fn bad_requests_keep_luxids_classes_and_texts() {
        let many_fields = vec!["id"; QUERY_FIELDS_MAX + 1];
        let cases = [
            (
                "NoSuchMethod",
                json!([]),
                "GenericError",
                "unknown method 'NoSuchMethod'",
            ),
            (
                "SubmitJob",
                json!([]),
                "GenericError",
                "SubmitJob takes 1 argument, got 0",
            ),
            (
                "SubmitManyJobs",
                json!([{}]),
                "GenericError",
                "SubmitManyJobs: argument 1 is not a list",
            ),
            (
                "QueryJobs",
                json!([[0], ["id"]]),
                "GenericError",
                "QueryJobs: argument 1 holds something not a job id",
            ),
            (
                "QueryJobs",
                json!([{}, ["id"]]),
                "GenericError",
                "QueryJobs: argument 1 is neither a list of job ids nor null",
            ),
            // The fields are checked before the ids.
            (
                "QueryJobs",
                json!([{}, ["nope"]]),
                "OpPrereqError",
                "Unknown job field 'nope'",
            ),
            (
                "QueryJobs",
                json!([null, [1]]),
                "GenericError",
                "QueryJobs: argument 2 holds a field name that is not a string",
            ),
            (
                "QueryJobs",
                json!([null, many_fields]),
                "OpPrereqError",
                "1001 fields are over the limit of 1000 per query",
            ),
            (
                "WaitForJobChange",
                json!([1, ["id"], null, -1, 1]),
                "GenericError",
                "WaitForJobChange: argument 4 is not a log serial",
            ),
            (
                "WaitForJobChange",
                json!([1, ["id"], null, 0, -1]),
                "GenericError",
                "WaitForJobChange: argument 5 is not a timeout in seconds",
            ),
            (
                "WaitForJobChange",
                json!([true, ["id"], null, 0, 1]),
                "GenericError",
                "WaitForJobChange: argument 1 is not a job id",
            ),
            (
                "CancelJob",
                json!([]),
                "GenericError",
                "CancelJob takes 1 or 2 arguments, got 0",
            ),
            (
                "CancelJob",
                json!([1, 2, 3]),
                "GenericError",
                "CancelJob takes 1 or 2 arguments, got 3",
            ),
            (
                "CancelJob",
                json!([1, "yes"]),
                "GenericError",
                "CancelJob: argument 2 is not a boolean",
            ),
            (
                "ArchiveJob",
                json!([-4]),
                "GenericError",
                "ArchiveJob: argument 1 is not a job id",
            ),
            (
                "AutoArchiveJobs",
                json!(["old", 1]),
                "GenericError",
                "AutoArchiveJobs: argument 1 is not an age in seconds",
            ),
            (
                "AutoArchiveJobs",
                json!([1, null]),
                "GenericError",
                "AutoArchiveJobs: argument 2 is not a timeout in seconds",
            ),
            (
                "ChangeJobPriority",
                json!([1, 5]),
                "OpPrereqError",
                "priority 5 is not one of [-10, 0, 10]",
            ),
            (
                "ChangeJobPriority",
                json!([1, 0.5]),
                "GenericError",
                "ChangeJobPriority: argument 2 is not an integer",
            ),
            (
                "ReplaceFilter",
                json!([null, -1, [], "ACCEPT", []]),
                "OpPrereqError",
                "priority: -1 is not an integer of 0 or more",
            ),
            (
                "ReplaceFilter",
                json!([null, 0, [["nodeid", null]], "ACCEPT", []]),
                "OpPrereqError",
                "predicate 0: unknown kind \"nodeid\" (jobid, opcode or reason)",
            ),
            (
                "ReplaceFilter",
                json!([null, 0, [["opcode", ["~~", "OP_ID", "x"]]], "ACCEPT", []]),
                "OpPrereqError",
                "predicate 0: Unknown filter operand '~~'",
            ),
            (
                "ReplaceFilter",
                json!([null, 0, [["opcode", ["=~", "OP_ID", "("]]], "ACCEPT", []]),
                "OpPrereqError",
                "predicate 0: Invalid regular expression: regex parse error:\n    (\n    ^\nerror: unclosed group",
            ),
            (
                "ReplaceFilter",
                json!([null, 0, [], "DROP", []]),
                "OpPrereqError",
                "action: unknown action \"DROP\" (ACCEPT, PAUSE, REJECT, CONTINUE or [\"RATE_LIMIT\", n])",
            ),
            (
                "ReplaceFilter",
                json!([null, 0, [], ["RATE_LIMIT", 0], []]),
                "OpPrereqError",
                "action: RATE_LIMIT needs a positive integer, not 0",
            ),
            (
                "ReplaceFilter",
                json!([null, 0, [], "PAUSE", [["gnt:user", "why"]]]),
                "OpPrereqError",
                "reason: [\"gnt:user\",\"why\"] is not [source, text, timestamp]",
            ),
            (
                "ReplaceFilter",
                json!(["not-a-uuid", 0, [], "PAUSE", []]),
                "GenericError",
                "Unable to parse UUID 'not-a-uuid'",
            ),
            (
                "DeleteFilter",
                json!([7]),
                "GenericError",
                "DeleteFilter: argument 1 is not a string",
            ),
            (
                "QueryFilters",
                json!([null, "uuid"]),
                "GenericError",
                "QueryFilters: argument 2 is not a list",
            ),
            (
                "SetDrainFlag",
                json!([1]),
                "GenericError",
                "SetDrainFlag: argument 1 is not a boolean",
            ),
            (
                "QueryConfigValues",
                json!(["drain_flag"]),
                "GenericError",
                "QueryConfigValues: argument 1 is not a list",
            ),
            (
                "Query",
                json!([1, [], null]),
                "GenericError",
                "Query: argument 1 is not a string",
            ),
            (
                "QueryFields",
                json!(["filter", [null]]),
                "GenericError",
                "QueryFields: argument 2 holds a field name that is not a string",
            ),
        ];
        for (method, args, class, text) in cases {
            let error = decode(method, args).expect_err(text);
            assert_eq!(error.class, class, "{method}: {error}");
            assert_eq!(error.message(), text, "{method}");
        }
    }

    #[test]
    fn the_submit_many_limit_is_its_own_check() {
        // Decoding takes any number: the drain flag is told first.
        let jobs = vec![json!([]); SUBMIT_MANY_JOBS_MAX + 1];
        assert!(decode("SubmitManyJobs", json!([jobs])).is_ok());
        assert_eq!(check_submit_many_count(SUBMIT_MANY_JOBS_MAX), Ok(()));
        let error = check_submit_many_count(SUBMIT_MANY_JOBS_MAX + 1).expect_err("over");
        assert_eq!(
            error.message(),
            "SubmitManyJobs: 1001 jobs are over the limit of 1000 per submission; submit them in parts"
        );
    }

    /// Every method name, and some that are none.
    const METHOD_NAMES: [&str; 16] = [
        "SubmitJob",
        "SubmitJobToDrainedQueue",
        "SubmitManyJobs",
        "QueryJobs",
        "WaitForJobChange",
        "CancelJob",
        "ArchiveJob",
        "AutoArchiveJobs",
        "ChangeJobPriority",
        "SetDrainFlag",
        "QueryConfigValues",
        "Query",
        "QueryFields",
        "",
        "submitJob",
        "NoSuchMethod",
    ];

    fn id_strategy() -> impl Strategy<Value = JobId> {
        1..=u64::MAX
    }

    fn fields_strategy() -> impl Strategy<Value = Vec<&'static str>> {
        proptest::collection::vec(proptest::sample::select(FIELDS.to_vec()), 0..5)
    }

    /// Durations a seconds float holds exactly (steps of 1/512 s).
    fn seconds_strategy(max_seconds: u64) -> impl Strategy<Value = Duration> {
        (0..=max_seconds * 512).prop_map(|steps| {
            Duration::from_secs(steps / 512) + Duration::from_nanos(steps % 512 * 1_953_125)
        })
    }

    fn json() -> impl Strategy<Value = Value> {
        crate::protocol::arbitrary::json()
    }

    fn names() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec(".{0,8}", 0..4)
    }

    fn request_strategy() -> impl Strategy<Value = LuxiRequest> {
        use LuxiRequest::*;
        prop_oneof![
            json().prop_map(|ops| SubmitJob { ops }),
            json().prop_map(|ops| SubmitJobToDrainedQueue { ops }),
            proptest::collection::vec(json(), 0..4).prop_map(|jobs| SubmitManyJobs { jobs }),
            (
                proptest::option::of(proptest::collection::vec(id_strategy(), 0..4)),
                fields_strategy()
            )
                .prop_map(|(ids, fields)| QueryJobs { ids, fields }),
            (
                id_strategy(),
                fields_strategy(),
                json(),
                any::<u64>(),
                seconds_strategy(WAIT_FOR_CHANGE_SECONDS_MAX as u64)
            )
                .prop_map(|(id, fields, previous, log_serial, timeout)| {
                    WaitForJobChange {
                        id,
                        fields,
                        previous,
                        log_serial,
                        timeout,
                    }
                }),
            (id_strategy(), any::<bool>()).prop_map(|(id, kill)| CancelJob { id, kill }),
            id_strategy().prop_map(|id| ArchiveJob { id }),
            (
                proptest::option::of(seconds_strategy(1 << 40)),
                proptest::option::of(seconds_strategy(1 << 20))
            )
                .prop_map(|(age, timeout)| AutoArchiveJobs { age, timeout }),
            (
                id_strategy(),
                proptest::sample::select(SUBMIT_PRIORITIES.to_vec())
            )
                .prop_map(|(id, priority)| ChangeJobPriority { id, priority }),
            any::<bool>().prop_map(|drained| SetDrainFlag { drained }),
            proptest::collection::vec(proptest::option::of(".{0,8}"), 0..4)
                .prop_map(|fields| QueryConfigValues { fields }),
            (".{0,8}", names(), json()).prop_map(|(what, fields, filter)| Query {
                what,
                fields,
                filter
            }),
            (".{0,8}", names()).prop_map(|(what, fields)| QueryFields { what, fields }),
        ]
    }

    proptest! {
        /// Any arguments to any method: a request or an error, never a
        /// panic; errors are of luxid's classes and say something.
        #[test]
        fn any_arguments_decode_or_are_refused(
            method in proptest::sample::select(&METHOD_NAMES[..]),
            args in proptest::collection::vec(json(), 0..6),
        ) {
            let request = Request { method: method.to_owned(), args };
            match LuxiRequest::decode(&request) {
                Ok(decoded) => {
                    prop_assert_eq!(decoded.method(), method);
                    if let LuxiRequest::WaitForJobChange { timeout, .. } = decoded {
                        prop_assert!(timeout.as_secs_f64() <= WAIT_FOR_CHANGE_SECONDS_MAX);
                    }
                }
                Err(error) => {
                    prop_assert!(["GenericError", "OpPrereqError"].contains(&error.class));
                    prop_assert!(!error.message().is_empty());
                }
            }
        }

        /// Whole requests as bytes: whatever arrives, an answer.
        #[test]
        fn any_frame_parses_or_is_refused(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(request) = crate::protocol::parse_request(&frame) {
                let _ = LuxiRequest::decode(&request);
            }
        }

        /// What a client encodes decodes back to the same request.
        #[test]
        fn valid_requests_round_trip(request in request_strategy()) {
            prop_assert_eq!(LuxiRequest::decode(&request.encode()), Ok(request));
        }
    }
}
