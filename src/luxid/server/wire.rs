//! The LUXI side of luxid's shell: a decoded request becomes the
//! core's command (its jobs built from the submitted opcodes), or is
//! answered from the core's read-only view (`QueryJobs`,
//! `QueryConfigValues`); the core's answers are put on the wire.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::Shell;
use crate::connection::Reply;
use crate::jobs::opcode;
use crate::jobs::{Job, JobId, QueuedOpcode, Timestamp};
use crate::luxid::core::{self as queue_core, Answer, Command, Conn, Input, Refusal};
use crate::protocol::WireError;
use crate::protocol::luxi::{self, LuxiRequest};

impl Shell {
    /// Converts a decoded request into the core's command (or answers a
    /// read-only one from the core's state).
    pub(super) fn request(&mut self, conn: Conn, request: LuxiRequest) -> Reply {
        if let Some(reply) = self.check_workers_first(conn, &request) {
            return reply;
        }
        self.command(conn, request, &BTreeMap::new())
    }

    /// Runs a decoded request; `refused`: the jobs of a submission (by
    /// index) whose workers request wconfd refused.
    pub(super) fn command(
        &mut self,
        conn: Conn,
        request: LuxiRequest,
        refused: &BTreeMap<usize, String>,
    ) -> Reply {
        let command = match request {
            LuxiRequest::WatchEvents(watch) => {
                return match self.events.watch(conn, &watch) {
                    Some(reply) => Reply::Encoded(reply),
                    None => Reply::Held(Instant::now() + watch.timeout),
                };
            }
            LuxiRequest::SubmitJob { ops } => Command::Submit {
                jobs: vec![refused_or(refused, 0, || self.build_job(&ops, 0))],
                ignore_drain: false,
                many: false,
            },
            LuxiRequest::SubmitJobToDrainedQueue { ops } => Command::Submit {
                jobs: vec![refused_or(refused, 0, || self.build_job(&ops, 0))],
                ignore_drain: true,
                many: false,
            },
            LuxiRequest::SubmitManyJobs { jobs } => {
                let mut built = Vec::with_capacity(jobs.len());
                if jobs.len() <= crate::limits::SUBMIT_MANY_JOBS_MAX {
                    let mut accepted = 0;
                    for (index, ops) in jobs.iter().enumerate() {
                        let job = refused_or(refused, index, || self.build_job(ops, accepted));
                        accepted += u64::from(job.is_ok());
                        built.push(job);
                    }
                } else {
                    // Refused whole: not worth building.
                    built.resize(jobs.len(), Err(String::new()));
                }
                Command::Submit {
                    jobs: built,
                    ignore_drain: false,
                    many: true,
                }
            }
            LuxiRequest::QueryJobs { ids, fields } => {
                return Reply::Now(self.query_jobs(ids, &fields));
            }
            LuxiRequest::WaitForJobChange {
                id,
                fields,
                previous,
                log_serial,
                timeout,
            } => Command::WaitForChange {
                id,
                fields,
                previous,
                log_serial,
                timeout,
            },
            LuxiRequest::CancelJob { id, kill } => Command::Cancel { id, kill },
            LuxiRequest::ArchiveJob { id } => Command::Archive { id },
            LuxiRequest::AutoArchiveJobs { age, timeout } => Command::AutoArchive {
                age,
                timeout,
                now_secs: Timestamp::now().as_secs_f64(),
            },
            LuxiRequest::ChangeJobPriority { id, priority } => {
                Command::ChangePriority { id, priority }
            }
            LuxiRequest::SetDrainFlag { drained } => Command::SetDrain { drained },
            LuxiRequest::QueryConfigValues { fields } => {
                let drained = self.core.is_drained();
                return Reply::Now(Ok(Value::Array(
                    fields
                        .iter()
                        .map(|field| match field.as_deref() {
                            Some("drain_flag") => json!(drained),
                            Some("cluster_name") => json!("warden"),
                            _ => Value::Null,
                        })
                        .collect(),
                )));
            }
            // Served from the raw request (see `handle`).
            LuxiRequest::Query { .. } | LuxiRequest::QueryFields { .. } => {
                return Reply::Now(Err(WireError::generic("the query was lost")));
            }
        };
        let effects = self
            .core
            .handle(Input::Request { conn, command }, Instant::now());
        self.carry_out(effects)
            .reply
            .unwrap_or_else(|| Reply::Now(Err(WireError::generic("the request was lost"))))
    }

    /// A job of a submission, with the id the core gives it if the
    /// `accepted` jobs before it in the submission are accepted.
    fn build_job(&self, ops: &Value, accepted: u64) -> Result<Job, String> {
        build_job(ops, self.core.serial() + 1 + accepted, Submitter::Client)
            .map_err(|error| error.message())
    }

    /// A job luxid submits itself (a worker's prepare).
    pub(super) fn build_internal_job(&self, ops: &Value) -> Result<Job, String> {
        build_job(ops, self.core.serial() + 1, Submitter::Luxid).map_err(|error| error.message())
    }

    fn query_jobs(
        &self,
        ids: Option<Vec<JobId>>,
        fields: &[&'static str],
    ) -> Result<Value, WireError> {
        let ids: Vec<JobId> = match ids {
            None => {
                let mut ids: Vec<JobId> = self
                    .core
                    .unfinished()
                    .keys()
                    .chain(self.core.finished().keys())
                    .copied()
                    .collect();
                ids.sort_unstable();
                if fields.contains(&"archived") {
                    ids.extend(self.queue.archived_ids());
                    ids.sort_unstable();
                    ids.dedup();
                }
                ids
            }
            Some(ids) => ids,
        };
        // Rows are counted as they are made: a short request (the same id
        // many times, every field) must not build an answer of gigabytes.
        let limit_bytes = self.settings.luxid.frame_bytes_max;
        let mut answer_bytes = 0;
        let mut rows = Vec::with_capacity(ids.len().min(1024));
        // The row of a finished job (decoded) or an archived one (read
        // from disk) is made once, however often it is asked for.
        let mut made: HashMap<JobId, Value> = HashMap::new();
        for id in ids {
            let row = match made.get(&id) {
                Some(row) => row.clone(),
                None if self.core.unfinished().contains_key(&id) || id > self.core.serial() => {
                    self.row(id, fields)
                }
                None => {
                    let row = self.row(id, fields);
                    made.insert(id, row.clone());
                    row
                }
            };
            answer_bytes += encoded_bytes(&row) + 1;
            if answer_bytes > limit_bytes {
                return Err(WireError::generic(format!(
                    "the answer would be longer than the frame limit of {limit_bytes} bytes; \
                     ask for fewer jobs or fields"
                )));
            }
            rows.push(row);
        }
        Ok(Value::Array(rows))
    }

    /// A QueryJobs row; an unknown job has its id and nulls.
    fn row(&self, id: JobId, fields: &[&str]) -> Value {
        let archived;
        let job = match self.core.job(id) {
            Some(job) => {
                archived = false;
                Some(job)
            }
            // Above the serial no job was ever submitted: nothing to read.
            None if id > self.core.serial() => {
                archived = false;
                None
            }
            None => {
                archived = true;
                match self.queue.read_archived(id) {
                    Ok(job) => job.map(std::borrow::Cow::Owned),
                    Err(error) => {
                        // Answered as unknown, never as a guess.
                        tracing::error!(job = id, %error, "skipped an archived job file that cannot be read");
                        None
                    }
                }
            }
        };
        Value::Array(
            fields
                .iter()
                .map(|field| match &job {
                    Some(job) => job.field(field, archived).unwrap_or(Value::Null),
                    None if *field == "id" => json!(id),
                    None => Value::Null,
                })
                .collect(),
        )
    }
}

/// The core's answer on the wire.
pub(super) fn wire_reply(reply: queue_core::Reply) -> Result<Value, WireError> {
    match reply {
        Ok(Answer::Submitted(id)) => Ok(json!(id)),
        Ok(Answer::SubmittedMany(results)) => Ok(Value::Array(
            results
                .into_iter()
                .map(|result| match result {
                    Ok(id) => json!([true, id]),
                    Err(message) => json!([false, message]),
                })
                .collect(),
        )),
        Ok(Answer::Outcome(done, message)) => Ok(json!([done, message])),
        Ok(Answer::Archived(archived)) => Ok(json!(archived)),
        Ok(Answer::AutoArchived { archived, left }) => Ok(json!([archived, left])),
        Ok(Answer::DrainSet) => Ok(json!(true)),
        Ok(Answer::Change { values, log }) => {
            let log: Vec<Value> = log.iter().map(|entry| json!(entry)).collect();
            Ok(json!([values, log]))
        }
        Err(Refusal::Drained) => Err(WireError::generic("Queue drained")),
        Err(Refusal::TooManyJobs(count)) => Err(luxi::check_submit_many_count(count)
            .err()
            .unwrap_or_else(|| WireError::generic("too many jobs"))),
        Err(Refusal::QueueFull { jobs, max }) => Err(WireError {
            class: "JobQueueFull",
            args: vec![json!(format!(
                "the queue holds {jobs} jobs, its limit is {max} (archive finished jobs)"
            ))],
        }),
        Err(Refusal::Prereq(message)) => Err(luxi::prereq(message)),
        Err(Refusal::JobLost(id)) => Err(WireError {
            class: "JobLost",
            args: vec![json!(format!("Job {id} not found"))],
        }),
        Err(Refusal::Failed(message)) => Err(WireError::generic(message)),
    }
}

/// A job refused by wconfd's check of its workers request, or built.
fn refused_or(
    refused: &BTreeMap<usize, String>,
    index: usize,
    build: impl FnOnce() -> Result<Job, String>,
) -> Result<Job, String> {
    match refused.get(&index) {
        Some(message) => Err(message.clone()),
        None => build(),
    }
}

/// Who submits a job: only luxid marks a worker's prepare job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Submitter {
    Client,
    Luxid,
}

/// A job from a submission: every opcode checked, ids made absolute and
/// the submit reason appended. Nothing is written here.
fn build_job(ops: &Value, id: JobId, submitter: Submitter) -> Result<Job, WireError> {
    let Some(ops) = ops.as_array() else {
        return Err(luxi::prereq("a job is a list of opcodes"));
    };
    if ops.is_empty() {
        return Err(luxi::prereq("a job needs at least one opcode"));
    }
    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    let mut queued = Vec::with_capacity(ops.len());
    for (index, op) in ops.iter().enumerate() {
        let parsed =
            opcode::parse(op).map_err(|error| luxi::prereq(format!("opcode {index}: {error}")))?;
        if index > 0 && parsed.common.workers.is_some() {
            return Err(luxi::prereq(format!(
                "opcode {index}: workers: only the first opcode of a job may ask for workers"
            )));
        }
        if index > 0 {
            let first_only = [
                ("start_by", parsed.common.start_by.is_some()),
                ("unique_key", parsed.common.unique_key.is_some()),
            ];
            if let Some((field, _)) = first_only.iter().find(|(_, present)| *present) {
                return Err(luxi::prereq(format!(
                    "opcode {index}: {field}: only the first opcode of a job may have a {field}"
                )));
            }
        }
        if submitter == Submitter::Client && parsed.common.prepare_worker.is_some() {
            return Err(luxi::prereq(format!(
                "opcode {index}: prepare_worker is set by luxid alone"
            )));
        }
        let input = opcode::with_absolute_dependencies(op, id)
            .map_err(|error| luxi::prereq(format!("opcode {index}: {error}")))?;
        let input = opcode::with_submit_reason(&input, id, index, now_ns);
        queued.push(QueuedOpcode::new(input, parsed.common.priority));
    }
    Ok(Job {
        id,
        ops: queued,
        received_timestamp: Some(Timestamp::now()),
        start_timestamp: None,
        end_timestamp: None,
        livelock: None,
        process_id: None,
        workers: Vec::new(),
    })
}

/// The length of `value` as JSON, counted without keeping the text.
fn encoded_bytes(value: &Value) -> usize {
    struct Counter(usize);
    impl io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value).expect("counting JSON cannot fail");
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_long_answer_is_counted_without_being_written() {
        let value = json!([1, "two", {"three": [null, 3.5]}]);
        assert_eq!(
            encoded_bytes(&value),
            serde_json::to_vec(&value).expect("JSON").len()
        );
    }

    proptest! {
        /// Whatever a submission holds, it becomes a job or an
        /// `OpPrereqError`, never a panic; a job keeps one opcode per
        /// submitted one.
        #[test]
        fn any_submission_is_a_job_or_refused(
            ops in crate::protocol::arbitrary::json(),
            id in 1u64..u64::MAX,
        ) {
            match build_job(&ops, id, Submitter::Client) {
                Ok(job) => {
                    prop_assert_eq!(job.id, id);
                    prop_assert_eq!(job.ops.len(), ops.as_array().map_or(0, Vec::len));
                    prop_assert!(!job.is_final());
                }
                Err(error) => prop_assert_eq!(error.class, "OpPrereqError"),
            }
        }
    }
}
