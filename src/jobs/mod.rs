//! Jobs as JOBS.md describes them: the model both luxid and the job runner
//! share. A [`Job`] is exactly what a job file holds; its status, priority
//! and query fields are computed from its opcodes, never stored twice.

pub mod opcode;
pub mod runner_contract;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Job ids start at 1 and are handed out by luxid's serial file.
pub type JobId = u64;

/// The status of an opcode, and of a job (computed from its opcodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Queued,
    /// Acquiring locks.
    Waiting,
    Canceling,
    Running,
    Canceled,
    Success,
    Error,
}

impl Status {
    pub const ALL: [Status; 7] = [
        Status::Queued,
        Status::Waiting,
        Status::Canceling,
        Status::Running,
        Status::Canceled,
        Status::Success,
        Status::Error,
    ];

    pub fn is_final(self) -> bool {
        matches!(self, Status::Canceled | Status::Success | Status::Error)
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Waiting => "waiting",
            Status::Canceling => "canceling",
            Status::Running => "running",
            Status::Canceled => "canceled",
            Status::Success => "success",
            Status::Error => "error",
        }
    }

    pub fn parse(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.name() == name)
    }
}

/// `[secs, usecs]` since the epoch, as Ganeti writes timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp(pub u64, pub u64);

impl Timestamp {
    pub fn now() -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(since.as_secs(), u64::from(since.subsec_micros()))
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 + self.1 as f64 / 1e6
    }
}

/// `[serial, [secs, usecs], type, message]`; serials are per job, start at
/// 1 and strictly increase across all its opcodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogEntry(pub u64, pub Timestamp, pub String, pub Value);

impl LogEntry {
    pub fn serial(&self) -> u64 {
        self.0
    }
}

/// The type of an ordinary log line.
pub const LOG_MESSAGE: &str = "message";

/// The type of the entry each attempt of a retried `OP_EXEC` leaves
/// ("Attempt i of n: ..."): the attempts made so far are counted from
/// these, by a runner that continues them and by luxid after a runner's
/// death.
pub const LOG_ATTEMPT: &str = "attempt";

/// One opcode of a job file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueuedOpcode {
    /// The opcode as submitted, with luxid's reason entry appended and
    /// relative dependencies made absolute.
    pub input: Value,
    pub status: Status,
    pub result: Value,
    pub log: Vec<LogEntry>,
    pub priority: i64,
    pub start_timestamp: Option<Timestamp>,
    pub exec_timestamp: Option<Timestamp>,
    pub end_timestamp: Option<Timestamp>,
}

impl QueuedOpcode {
    /// How many attempts of this opcode were made (and logged) so far.
    pub fn attempts_logged(&self) -> u64 {
        self.log
            .iter()
            .filter(|entry| entry.2 == LOG_ATTEMPT)
            .count() as u64
    }

    pub fn new(input: Value, priority: i64) -> QueuedOpcode {
        QueuedOpcode {
            input,
            status: Status::Queued,
            result: Value::Null,
            log: Vec::new(),
            priority,
            start_timestamp: None,
            exec_timestamp: None,
            end_timestamp: None,
        }
    }

    /// `TEST_DELAY(0.5)`: the opcode's id without `OP_`, and its
    /// describing field (Ganeti's `OP_DSC_FIELD`) when it has one.
    pub fn summary(&self) -> String {
        let op_id = self
            .input
            .get("OP_ID")
            .and_then(Value::as_str)
            .unwrap_or("OP_UNKNOWN");
        let short = op_id.strip_prefix("OP_").unwrap_or(op_id);
        let described = match op_id {
            opcode::OP_TEST_DELAY => self.input.get("duration").map(summary_value),
            opcode::OP_EXEC => self
                .input
                .get("argv")
                .and_then(|argv| argv.get(0))
                .map(summary_value),
            _ => None,
        };
        match described {
            Some(value) => format!("{short}({value})"),
            None => short.to_owned(),
        }
    }
}

/// A value as Python's `str` would print it in a summary.
fn summary_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Number(number) => match number.as_f64() {
            Some(float) if number.is_f64() && float.fract() == 0.0 => format!("{float:.1}"),
            _ => number.to_string(),
        },
        other => other.to_string(),
    }
}

/// One step of a job's path: the job's status became `status` at opcode
/// `opcode`. Steps are ordered by (`opcode`, the status's place in an
/// opcode's life).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathStep {
    pub opcode: usize,
    pub status: Status,
}

impl PathStep {
    /// The step's place: later steps have greater keys.
    pub fn key(self) -> (usize, u8) {
        let rank = match self.status {
            Status::Queued => 0,
            Status::Waiting => 1,
            Status::Running => 2,
            Status::Canceling => 3,
            Status::Success | Status::Error | Status::Canceled => 4,
        };
        (self.opcode, rank)
    }
}

/// A job file, field for field (JOBS.md "Queue on disk").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub ops: Vec<QueuedOpcode>,
    pub received_timestamp: Option<Timestamp>,
    pub start_timestamp: Option<Timestamp>,
    pub end_timestamp: Option<Timestamp>,
    /// The runner's livelock, once it has one.
    pub livelock: Option<String>,
    /// The runner's pid, once it runs.
    pub process_id: Option<u32>,
    /// The uuids of the workers the job was given (WORKERS.md), recorded
    /// by its runner when it starts; absent for a job that asked for none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<String>,
}

impl Job {
    /// The job's status from its opcodes (JOBS.md "Model"): the first
    /// `error`, `canceling` or `canceled` opcode decides; `waiting` or
    /// `running` opcodes are candidates (the last seen wins); all `success`
    /// gives `success`; otherwise the candidate, else `queued`.
    pub fn status(&self) -> Status {
        let mut all_success = true;
        let mut candidate = None;
        for op in &self.ops {
            match op.status {
                Status::Success => continue,
                Status::Error | Status::Canceling | Status::Canceled => return op.status,
                Status::Queued => all_success = false,
                Status::Waiting | Status::Running => {
                    all_success = false;
                    candidate = Some(op.status);
                }
            }
        }
        if all_success {
            Status::Success
        } else {
            candidate.unwrap_or(Status::Queued)
        }
    }

    pub fn is_final(&self) -> bool {
        self.status().is_final()
    }

    /// The job's path as far as its file shows it (EVENTS.md): for each
    /// opcode in turn the statuses it reached (began: `waiting`, ran:
    /// `running`, `canceling`, its end), as the job's status, equal
    /// neighbours merged; a non-last opcode's success is no step (the job
    /// goes on with the next). The first step leaves `queued`. Every
    /// later file of the job has this path as a prefix, give or take a
    /// `canceling` it did not show.
    pub fn path(&self) -> Vec<PathStep> {
        let mut steps = Vec::new();
        let mut current = Status::Queued;
        let last = self.ops.len().saturating_sub(1);
        for (opcode, op) in self.ops.iter().enumerate() {
            let mut reached = Vec::with_capacity(4);
            if op.start_timestamp.is_some() || op.status == Status::Waiting {
                reached.push(Status::Waiting);
            }
            if op.exec_timestamp.is_some() || op.status == Status::Running {
                reached.push(Status::Running);
            }
            if op.status == Status::Canceling || op.status.is_final() {
                reached.push(op.status);
            }
            for status in reached {
                if status == Status::Success && opcode < last {
                    continue;
                }
                if status != current {
                    steps.push(PathStep { opcode, status });
                    current = status;
                }
            }
            if op.status != Status::Success {
                break;
            }
        }
        steps
    }

    /// The smallest priority of the unfinished opcodes, else 0.
    pub fn priority(&self) -> i64 {
        self.ops
            .iter()
            .filter(|op| !op.status.is_final())
            .map(|op| op.priority)
            .min()
            .unwrap_or(0)
    }

    /// The highest log serial of the job, 0 before its first entry.
    pub fn last_log_serial(&self) -> u64 {
        self.ops
            .iter()
            .flat_map(|op| op.log.last())
            .map(LogEntry::serial)
            .max()
            .unwrap_or(0)
    }

    /// Log entries newer than `serial`, in order.
    pub fn log_after(&self, serial: u64) -> Vec<&LogEntry> {
        self.ops
            .iter()
            .flat_map(|op| op.log.iter())
            .filter(|entry| entry.serial() > serial)
            .collect()
    }

    /// Every opcode not yet final becomes final with `status` and
    /// `result`; the job ends now if it had not.
    pub fn finish_unfinished(&mut self, status: Status, result: &Value) {
        let now = Timestamp::now();
        for op in &mut self.ops {
            if !op.status.is_final() {
                op.status = status;
                op.result = result.clone();
                op.end_timestamp.get_or_insert(now);
            }
        }
        self.end_timestamp.get_or_insert(now);
    }

    /// The value of a QueryJobs field, or `None` for a field that does not
    /// exist.
    pub fn field(&self, name: &str, archived: bool) -> Option<Value> {
        let per_op = |f: &dyn Fn(&QueuedOpcode) -> Value| -> Value {
            Value::Array(self.ops.iter().map(f).collect())
        };
        Some(match name {
            "id" => json!(self.id),
            "status" => json!(self.status()),
            "priority" => json!(self.priority()),
            "archived" => json!(archived),
            "ops" => per_op(&|op| op.input.clone()),
            "opresult" => per_op(&|op| op.result.clone()),
            "opstatus" => per_op(&|op| json!(op.status)),
            "oplog" => per_op(&|op| json!(op.log)),
            "opstart" => per_op(&|op| json!(op.start_timestamp)),
            "opexec" => per_op(&|op| json!(op.exec_timestamp)),
            "opend" => per_op(&|op| json!(op.end_timestamp)),
            "oppriority" => per_op(&|op| json!(op.priority)),
            "summary" => per_op(&|op| json!(op.summary())),
            "received_ts" => json!(self.received_timestamp),
            "start_ts" => json!(self.start_timestamp),
            "end_ts" => json!(self.end_timestamp),
            "workers" => json!(self.workers),
            _ => return None,
        })
    }
}

/// The result of an opcode that failed outside its own program (its
/// runner died, or could not be started): Ganeti's `OpExecError` form.
/// The text of a failed opcode's result: Ganeti's encoded error
/// `[class, [message, ...]]` gives its message; anything else is shown as
/// it is.
pub fn failure_reason(result: &Value) -> String {
    match result.as_array().map(Vec::as_slice) {
        Some([Value::String(_), Value::Array(args)]) => match args.first() {
            Some(Value::String(message)) => message.clone(),
            _ => result.to_string(),
        },
        Some([Value::String(_), Value::String(message)]) => message.clone(),
        _ => result.to_string(),
    }
}

pub fn exec_error(message: impl Into<String>) -> Value {
    json!(["OpExecError", [message.into()]])
}

/// The result of an opcode canceled before it started.
pub fn canceled_by_request() -> Value {
    json!("Job canceled by request")
}

impl Job {
    /// The values of `fields` (known names, see [`FIELDS`]) as one list,
    /// as `WaitForJobChange` compares and answers them.
    pub fn field_values(&self, fields: &[&str]) -> Value {
        Value::Array(
            fields
                .iter()
                .map(|field| self.field(field, false).unwrap_or(Value::Null))
                .collect(),
        )
    }
}

/// A keyed 64-bit digest of a value's structure: equal values share it;
/// two different ones do with a chance of about 2^-64. Walks the value,
/// writes no text.
pub fn digest_values(keys: &std::hash::RandomState, value: &Value) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    fn feed(hasher: &mut impl Hasher, value: &Value) {
        match value {
            Value::Null => 0u8.hash(hasher),
            Value::Bool(b) => (1u8, *b).hash(hasher),
            Value::Number(number) => {
                2u8.hash(hasher);
                if let Some(n) = number.as_u64() {
                    (0u8, n).hash(hasher);
                } else if let Some(n) = number.as_i64() {
                    (1u8, n).hash(hasher);
                } else {
                    (2u8, number.as_f64().unwrap_or(f64::NAN).to_bits()).hash(hasher);
                }
            }
            Value::String(text) => (3u8, text).hash(hasher),
            Value::Array(items) => {
                (4u8, items.len()).hash(hasher);
                for item in items {
                    feed(hasher, item);
                }
            }
            Value::Object(fields) => {
                (5u8, fields.len()).hash(hasher);
                for (name, item) in fields {
                    name.hash(hasher);
                    feed(hasher, item);
                }
            }
        }
    }
    let mut hasher = keys.build_hasher();
    feed(&mut hasher, value);
    hasher.finish()
}

/// Every field QueryJobs and WaitForJobChange know.
pub const FIELDS: [&str; 17] = [
    "id",
    "status",
    "priority",
    "archived",
    "ops",
    "opresult",
    "opstatus",
    "oplog",
    "opstart",
    "opexec",
    "opend",
    "oppriority",
    "summary",
    "received_ts",
    "start_ts",
    "end_ts",
    "workers",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn job_with(statuses: &[Status]) -> Job {
        Job {
            id: 1,
            ops: statuses
                .iter()
                .map(|&status| QueuedOpcode {
                    status,
                    ..QueuedOpcode::new(json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.5}), 0)
                })
                .collect(),
            received_timestamp: None,
            start_timestamp: None,
            end_timestamp: None,
            livelock: None,
            process_id: None,
            workers: Vec::new(),
        }
    }

    /// A job whose opcodes have `statuses`, each with the timestamps a
    /// runner writes on the way to it.
    fn job_run_to(statuses: &[Status]) -> Job {
        let mut job = job_with(statuses);
        for op in &mut job.ops {
            let began = op.status != Status::Queued;
            let ran = matches!(op.status, Status::Running | Status::Success | Status::Error);
            op.start_timestamp = began.then_some(Timestamp(1, 0));
            op.exec_timestamp = ran.then_some(Timestamp(2, 0));
        }
        job
    }

    fn path_of(job: &Job) -> Vec<(usize, Status)> {
        job.path()
            .into_iter()
            .map(|step| (step.opcode, step.status))
            .collect()
    }

    #[test]
    fn a_path_has_each_step_of_the_opcodes_once() {
        use Status::*;
        assert_eq!(path_of(&job_run_to(&[Queued, Queued])), []);
        assert_eq!(path_of(&job_run_to(&[Waiting, Queued])), [(0, Waiting)]);
        assert_eq!(
            path_of(&job_run_to(&[Success, Running])),
            [(0, Waiting), (0, Running), (1, Waiting), (1, Running)]
        );
        assert_eq!(
            path_of(&job_run_to(&[Success, Success])),
            [
                (0, Waiting),
                (0, Running),
                (1, Waiting),
                (1, Running),
                (1, Success)
            ]
        );
        // The later opcodes of a failed job add nothing.
        assert_eq!(
            path_of(&job_run_to(&[Error, Error])),
            [(0, Waiting), (0, Running), (0, Error)]
        );
        // Canceled while queued: one step.
        assert_eq!(path_of(&job_with(&[Canceled, Canceled])), [(0, Canceled)]);
        // Every earlier file's path is a prefix of a later one's.
        let files = [
            job_run_to(&[Queued, Queued]),
            job_run_to(&[Waiting, Queued]),
            job_run_to(&[Running, Queued]),
            job_run_to(&[Success, Waiting]),
            job_run_to(&[Success, Running]),
            job_run_to(&[Success, Success]),
        ];
        for pair in files.windows(2) {
            let (earlier, later) = (pair[0].path(), pair[1].path());
            assert_eq!(earlier[..], later[..earlier.len()]);
        }
        let keys: Vec<_> = files[5].path().iter().map(|step| step.key()).collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "{keys:?}");
    }

    #[test]
    fn job_status_follows_the_scan_of_jobs_md() {
        use Status::*;
        let cases: &[(&[Status], Status)] = &[
            (&[], Success),
            (&[Success, Success], Success),
            (&[Queued, Queued], Queued),
            (&[Success, Queued], Queued),
            (&[Success, Waiting, Queued], Waiting),
            (&[Running, Waiting], Waiting),
            (&[Waiting, Running], Running),
            (&[Running, Error, Canceled], Error),
            (&[Success, Canceling, Error], Canceling),
            (&[Canceled, Canceled], Canceled),
        ];
        for (ops, expected) in cases {
            assert_eq!(job_with(ops).status(), *expected, "{ops:?}");
        }
    }

    #[test]
    fn priority_is_the_smallest_of_unfinished_opcodes() {
        let mut job = job_with(&[Status::Success, Status::Queued, Status::Queued]);
        job.ops[0].priority = -10;
        job.ops[1].priority = 10;
        job.ops[2].priority = 0;
        assert_eq!(job.priority(), 0);
        job.finish_unfinished(Status::Success, &Value::Null);
        assert_eq!(job.priority(), 0);
    }

    #[test]
    fn job_file_round_trips_with_ganetis_field_names() {
        let mut job = job_with(&[Status::Running]);
        job.received_timestamp = Some(Timestamp(1, 2));
        job.ops[0].log.push(LogEntry(
            1,
            Timestamp(3, 4),
            LOG_MESSAGE.into(),
            json!("hi"),
        ));
        let text = serde_json::to_value(&job).unwrap();
        assert_eq!(text["received_timestamp"], json!([1, 2]));
        assert_eq!(text["ops"][0]["status"], json!("running"));
        assert_eq!(
            text["ops"][0]["log"][0],
            json!([1, [3, 4], "message", "hi"])
        );
        let back: Job = serde_json::from_value(text).unwrap();
        assert_eq!(back, job);
    }

    #[test]
    fn summaries_name_the_describing_field() {
        let op = QueuedOpcode::new(json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.5}), 0);
        assert_eq!(op.summary(), "TEST_DELAY(0.5)");
        let op = QueuedOpcode::new(json!({"OP_ID": "OP_TEST_DELAY", "duration": 2.0}), 0);
        assert_eq!(op.summary(), "TEST_DELAY(2.0)");
        let op = QueuedOpcode::new(json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"]}), 0);
        assert_eq!(op.summary(), "EXEC(/bin/true)");
    }

    #[test]
    fn digests_tell_values_apart_by_structure() {
        let keys = std::hash::RandomState::new();
        let digest = |value: Value| digest_values(&keys, &value);
        assert_eq!(
            digest(json!([1, "a", {"b": null}])),
            digest(json!([1, "a", {"b": null}]))
        );
        for (one, other) in [
            (json!([1]), json!([1.0])),
            (json!([1]), json!(["1"])),
            (json!([[1], 2]), json!([[1, 2]])),
            (json!(["ab", "c"]), json!(["a", "bc"])),
            (json!(null), json!(false)),
            (json!({"a": 1}), json!({"a": 2})),
        ] {
            assert_ne!(digest(one.clone()), digest(other.clone()), "{one} {other}");
        }
    }

    #[test]
    fn log_after_never_returns_what_the_client_has() {
        let mut job = job_with(&[Status::Success, Status::Running]);
        for (op, serial) in [(0, 1), (0, 2), (1, 3)] {
            job.ops[op].log.push(LogEntry(
                serial,
                Timestamp(0, 0),
                LOG_MESSAGE.into(),
                json!(serial),
            ));
        }
        assert_eq!(job.last_log_serial(), 3);
        let serials: Vec<u64> = job.log_after(1).iter().map(|e| e.serial()).collect();
        assert_eq!(serials, [2, 3]);
        assert!(job.log_after(3).is_empty());
    }
}
