//! Opcodes: checking a submitted opcode (PROTOCOL.md "5. Opcodes"), the locks it
//! takes, and the fields luxid adds at submit (reason, absolute
//! dependencies).
//!
//! luxid calls [`parse`] on every opcode of a submission and refuses the
//! whole job on the first error; the runner calls it again on the stored
//! `input` to run it.

use serde_json::Value;

use super::{JobId, Status};
use crate::locks::{LockName, Mode};
use crate::text::shortened;

pub const OP_TEST_DELAY: &str = "OP_TEST_DELAY";
pub const OP_EXEC: &str = "OP_EXEC";

/// The priorities accepted at submit (Ganeti's `OP_PRIO_SUBMIT_VALID`).
pub const SUBMIT_PRIORITIES: [i64; 3] = [-10, 0, 10];

/// A checked opcode.
#[derive(Clone, Debug, PartialEq)]
pub struct Opcode {
    pub common: Common,
    pub kind: OpKind,
}

/// The fields every opcode has; missing ones take their defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Common {
    pub priority: i64,
    pub depends: Vec<Dependency>,
    pub comment: Option<String>,
    /// `[source, text, timestamp_ns]` entries.
    pub reason: Vec<Value>,
    pub dry_run: bool,
    pub debug_level: i64,
    /// *(extension)* The workers the job holds while it runs (WORKERS.md);
    /// only on a job's first opcode.
    pub workers: Option<crate::workers::Request>,
    /// *(extension)* Set by luxid alone on the opcode of a worker's
    /// prepare job: which prepare it runs.
    pub prepare_worker: Option<PrepareOf>,
    /// *(extension)* The Unix time the job must have started by, else it
    /// is canceled (SCHEDULING.md); only on a job's first opcode.
    pub start_by: Option<f64>,
    /// *(extension)* While a job with this key is unfinished, a submission
    /// with it answers that job's id (SCHEDULING.md); only on a job's
    /// first opcode.
    pub unique_key: Option<String>,
}

/// The worker and the number of the prepare a prepare job runs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PrepareOf {
    pub uuid: String,
    pub seq: u64,
}

/// One entry of `depends`: a job (negative: relative, before resolution)
/// and the final statuses it may end with (empty: any but `canceled`).
#[derive(Clone, Debug, PartialEq)]
pub struct Dependency {
    pub job: i64,
    pub statuses: Vec<Status>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    TestDelay(TestDelay),
    Exec(Exec),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TestDelay {
    pub duration: f64,
    pub on_master: bool,
    pub on_nodes: Vec<String>,
    pub repeat: u64,
    pub interruptible: bool,
    pub no_locks: bool,
    /// *(extension)* Seconds the opcode waits for its locks before it
    /// fails; `None`: for ever.
    pub lock_timeout: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Exec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub timeout: Option<f64>,
    pub locks: Vec<(LockName, Mode)>,
    pub stdin: Option<String>,
    /// Seconds the opcode waits for its locks before it fails; `None`:
    /// for ever.
    pub lock_timeout: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL to the program's process group
    /// once its `timeout` passed.
    pub kill_grace: f64,
    /// How a failed attempt is retried; `None`: it is not.
    pub retry: Option<Retry>,
}

/// `OP_EXEC`'s `retry` (SCHEDULING.md "Retries").
#[derive(Clone, Debug, PartialEq)]
pub struct Retry {
    /// Attempts after the first one, at most.
    pub max: u64,
    /// Seconds between the end of an attempt and the start of the next.
    pub backoff: f64,
    /// The exit codes that are retried, sorted; `None`: any failure
    /// (another exit code, a signal, a timeout, a program that did not
    /// start).
    pub on: Option<Vec<i32>>,
    /// Whether luxid may run the job again when its runner died. Parsed
    /// and stored here; luxid acts on it.
    pub on_death: bool,
}

impl Retry {
    /// Whether an attempt that ended with `exit_code` (`None`: killed by a
    /// signal, timed out, or not started) is retried under this policy;
    /// the caller counts the attempts.
    pub fn covers(&self, exit_code: Option<i32>) -> bool {
        match (&self.on, exit_code) {
            (None, _) => true,
            (Some(codes), Some(code)) => codes.binary_search(&code).is_ok(),
            (Some(_), None) => false,
        }
    }
}

/// Why a submitted opcode is refused; luxid answers it as
/// `["OpPrereqError", [message, "wrong_input"]]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OpcodeError(pub String);

/// Checks one submitted opcode: a JSON object with a known `OP_ID`, every
/// field of the right type, the common fields valid (`priority` one of
/// [`SUBMIT_PRIORITIES`], `depends` well formed with known statuses).
/// `OP_TEST_DELAY`'s `duration > 0` is *not* checked here (Ganeti checks
/// it when the opcode runs).
///
/// Fields: every field an opcode may carry is known, and any other field is
/// refused (a misspelt field would otherwise be silently ignored):
/// - common to both (Ganeti's `OpCode.OP_PARAMS`): `OP_ID`, `priority`,
///   `depends`, `comment`, `reason`, `dry_run`, `debug_level`; `null`
///   stands for the default of each, as Ganeti's client sends `null` for
///   `comment`, `dry_run`, `debug_level` and `depends`;
/// - `OP_TEST_DELAY`: exactly what Ganeti 3.0's `OpTestDelay` serialises:
///   `duration` (required), `on_master`, `on_nodes`, `on_node_uuids`
///   (accepted and checked as Ganeti's type, `null` or a list of non-empty
///   strings, then ignored: there are no node UUIDs here), `repeat`,
///   `interruptible`, `no_locks`;
/// - `OP_EXEC`: `argv` (required), `env`, `cwd`, `timeout`, `locks`,
///   `stdin`, `lock_timeout`, `kill_grace`, `retry`; `null` stands for
///   the default of each optional field;
/// - extensions (SCHEDULING.md "Timeouts", "Retries", "Unique jobs"):
///   `lock_timeout` on both opcodes, `start_by` and `unique_key` common to
///   both (luxid allows them on a job's first opcode only, as `workers`).
///
/// Defaults follow Ganeti 3.0's `OpTestDelay`: `on_master` true,
/// `on_nodes` empty, `repeat` 0, `interruptible` false, `no_locks` true.
pub fn parse(input: &Value) -> Result<Opcode, OpcodeError> {
    let Value::Object(fields) = input else {
        return Err(OpcodeError("An opcode must be a JSON object".to_owned()));
    };
    let op_id = match fields.get("OP_ID") {
        Some(Value::String(op_id)) => op_id.as_str(),
        Some(_) => {
            return Err(OpcodeError(
                "Opcode field 'OP_ID' is not a string".to_owned(),
            ));
        }
        None => return Err(OpcodeError("Opcode has no field 'OP_ID'".to_owned())),
    };
    let (op_id, own_fields): (&'static str, &[&str]) = match op_id {
        OP_TEST_DELAY => (OP_TEST_DELAY, &TEST_DELAY_FIELDS),
        OP_EXEC => (OP_EXEC, &EXEC_FIELDS),
        other => {
            return Err(OpcodeError(format!(
                "Unknown opcode '{}'",
                shortened(other)
            )));
        }
    };
    let fields = Fields { op_id, fields };
    for name in fields.fields.keys() {
        let name = name.as_str();
        if name != "OP_ID" && !COMMON_FIELDS.contains(&name) && !own_fields.contains(&name) {
            return Err(OpcodeError(format!(
                "Parameter '{op_id}.{}' is unknown",
                shortened(name)
            )));
        }
    }
    let common = parse_common(&fields)?;
    let kind = match op_id {
        OP_TEST_DELAY => OpKind::TestDelay(parse_test_delay(&fields)?),
        _ => OpKind::Exec(parse_exec(&fields)?),
    };
    Ok(Opcode { common, kind })
}

/// The fields of Ganeti's `OpCode` base class, which every opcode has.
const COMMON_FIELDS: [&str; 10] = [
    "priority",
    "depends",
    "comment",
    "reason",
    "dry_run",
    "debug_level",
    "workers",
    "prepare_worker",
    "start_by",
    "unique_key",
];

/// The fields of Ganeti 3.0's `OpTestDelay`, and `lock_timeout`.
const TEST_DELAY_FIELDS: [&str; 8] = [
    "duration",
    "on_master",
    "on_nodes",
    "on_node_uuids",
    "repeat",
    "interruptible",
    "no_locks",
    "lock_timeout",
];

const EXEC_FIELDS: [&str; 9] = [
    "argv",
    "env",
    "cwd",
    "timeout",
    "locks",
    "stdin",
    "lock_timeout",
    "kill_grace",
    "retry",
];

pub use crate::limits::EXEC_TIMEOUT_SECS_MAX;
use crate::limits::{
    KILL_GRACE_SECS_DEFAULT, KILL_GRACE_SECS_MAX, LOCK_TIMEOUT_SECS_MAX, RETRY_BACKOFF_SECS_MAX,
    RETRY_MAX, START_BY_SECS_MAX, UNIQUE_KEY_BYTES_MAX,
};

/// The fields of one opcode, with errors naming the opcode and the field
/// the way Ganeti does (`Parameter 'OP_TEST_DELAY.duration' ...`).
struct Fields<'a> {
    op_id: &'static str,
    fields: &'a serde_json::Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// The field's value; `None` when it is missing or `null`.
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.fields.get(name).filter(|value| !value.is_null())
    }

    fn bad(&self, name: &str, what: impl std::fmt::Display) -> OpcodeError {
        OpcodeError(format!(
            "Parameter '{}.{name}' fails validation: {what}",
            self.op_id
        ))
    }

    fn required(&self, name: &str) -> Result<&'a Value, OpcodeError> {
        self.get(name)
            .ok_or_else(|| self.bad(name, "it is required"))
    }

    fn bool_or(&self, name: &str, default: bool) -> Result<bool, OpcodeError> {
        match self.get(name) {
            None => Ok(default),
            Some(value) => value
                .as_bool()
                .ok_or_else(|| self.bad(name, "must be a boolean")),
        }
    }

    fn string(&self, name: &str) -> Result<Option<String>, OpcodeError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(self.bad(name, "must be a string")),
        }
    }

    /// A string handed to the operating system: no NUL byte.
    fn os_string(&self, name: &str, value: &Value) -> Result<String, OpcodeError> {
        match value {
            Value::String(text) if !text.contains('\0') => Ok(text.clone()),
            Value::String(_) => Err(self.bad(name, "must not contain a NUL character")),
            _ => Err(self.bad(name, "must be a string")),
        }
    }

    fn list(&self, name: &str) -> Result<&'a [Value], OpcodeError> {
        match self.get(name) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(self.bad(name, "must be a list")),
        }
    }

    fn number(&self, value: &Value, name: &str) -> Result<f64, OpcodeError> {
        value
            .as_f64()
            .filter(|number| number.is_finite())
            .ok_or_else(|| self.bad(name, "must be a number"))
    }

    /// An optional number of seconds from 0 to `max`; `None` when the
    /// field is missing or `null`.
    fn seconds(&self, name: &str, max: f64) -> Result<Option<f64>, OpcodeError> {
        match self.get(name) {
            None => Ok(None),
            Some(value) => value
                .as_f64()
                .filter(|seconds| (0.0..=max).contains(seconds))
                .map(Some)
                .ok_or_else(|| {
                    self.bad(
                        name,
                        format!("must be a non-negative number of seconds up to {max}, or null"),
                    )
                }),
        }
    }
}

fn parse_common(fields: &Fields<'_>) -> Result<Common, OpcodeError> {
    let priority = match fields.get("priority") {
        None => 0,
        Some(value) => value
            .as_i64()
            .filter(|priority| SUBMIT_PRIORITIES.contains(priority))
            .ok_or_else(|| {
                fields.bad(
                    "priority",
                    format!("must be one of {SUBMIT_PRIORITIES:?}, got {value}"),
                )
            })?,
    };
    let depends = fields
        .list("depends")?
        .iter()
        .map(|entry| parse_dependency(fields, entry))
        .collect::<Result<_, _>>()?;
    let comment = fields.string("comment")?;
    let reason = fields.list("reason")?.to_vec();
    let dry_run = fields.bool_or("dry_run", false)?;
    let debug_level = match fields.get("debug_level") {
        None => 0,
        Some(value) => value
            .as_i64()
            .filter(|level| *level >= 0)
            .ok_or_else(|| fields.bad("debug_level", "must be a non-negative integer"))?,
    };
    let workers = match fields.get("workers") {
        None => None,
        Some(value) => Some(
            crate::protocol::workers::decode_request(value)
                .map_err(|error| fields.bad("workers", error))?,
        ),
    };
    let prepare_worker = match fields.get("prepare_worker") {
        None => None,
        Some(value) => Some(PrepareOf {
            uuid: value
                .get("uuid")
                .and_then(Value::as_str)
                .ok_or_else(|| fields.bad("prepare_worker", "has no uuid"))?
                .to_owned(),
            seq: value
                .get("seq")
                .and_then(Value::as_u64)
                .ok_or_else(|| fields.bad("prepare_worker", "has no seq"))?,
        }),
    };
    let start_by = match fields.get("start_by") {
        None => None,
        Some(value) => Some(
            value
                .as_f64()
                .filter(|time| (0.0..=START_BY_SECS_MAX).contains(time))
                .ok_or_else(|| {
                    fields.bad(
                        "start_by",
                        format!(
                            "must be a Unix time in seconds from 0 to {START_BY_SECS_MAX}, or null"
                        ),
                    )
                })?,
        ),
    };
    let unique_key = match fields.get("unique_key") {
        None => None,
        Some(Value::String(key)) if !key.is_empty() && key.len() <= UNIQUE_KEY_BYTES_MAX => {
            Some(key.clone())
        }
        Some(_) => {
            return Err(fields.bad(
                "unique_key",
                format!(
                    "must be a non-empty string of at most {UNIQUE_KEY_BYTES_MAX} bytes, or null"
                ),
            ));
        }
    };
    Ok(Common {
        priority,
        depends,
        comment,
        reason,
        dry_run,
        debug_level,
        workers,
        prepare_worker,
        start_by,
        unique_key,
    })
}

/// `[job_id, [status, ...]]`: a job id is an integer (negative: relative)
/// or, as Ganeti also accepts, a string of digits; the statuses are final
/// ones.
fn parse_dependency(fields: &Fields<'_>, entry: &Value) -> Result<Dependency, OpcodeError> {
    let bad = |what: &str| fields.bad("depends", what);
    let Some([job, statuses]) = entry.as_array().map(Vec::as_slice) else {
        return Err(bad("each entry must be [job_id, [status, ...]]"));
    };
    let job = match job {
        Value::Number(number) => number.as_i64(),
        Value::String(digits)
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            digits.parse().ok()
        }
        _ => None,
    }
    .ok_or_else(|| bad("a job id must be an integer"))?;
    let statuses = statuses
        .as_array()
        .ok_or_else(|| bad("the statuses of an entry must be a list"))?
        .iter()
        .map(|status| {
            status
                .as_str()
                .and_then(Status::parse)
                .filter(|status| status.is_final())
                .ok_or_else(|| bad("a status must be one of \"canceled\", \"error\", \"success\""))
        })
        .collect::<Result<_, _>>()?;
    Ok(Dependency { job, statuses })
}

fn parse_test_delay(fields: &Fields<'_>) -> Result<TestDelay, OpcodeError> {
    let duration = fields.number(fields.required("duration")?, "duration")?;
    let on_master = fields.bool_or("on_master", true)?;
    let on_nodes = fields
        .list("on_nodes")?
        .iter()
        .map(|node| match node.as_str() {
            Some(name) if node_lock(name).is_some() => Ok(name.to_owned()),
            _ => Err(fields.bad("on_nodes", "each entry must be a node name")),
        })
        .collect::<Result<_, _>>()?;
    for uuid in fields.list("on_node_uuids")? {
        if uuid.as_str().is_none_or(str::is_empty) {
            return Err(fields.bad("on_node_uuids", "each entry must be a non-empty string"));
        }
    }
    let repeat = match fields.get("repeat") {
        None => 0,
        Some(value) => value
            .as_u64()
            .ok_or_else(|| fields.bad("repeat", "must be a non-negative integer"))?,
    };
    Ok(TestDelay {
        duration,
        on_master,
        on_nodes,
        repeat,
        interruptible: fields.bool_or("interruptible", false)?,
        no_locks: fields.bool_or("no_locks", true)?,
        lock_timeout: fields.seconds("lock_timeout", LOCK_TIMEOUT_SECS_MAX)?,
    })
}

/// `node/<name>`, if `name` names a node (not the node group lock).
fn node_lock(name: &str) -> Option<LockName> {
    match LockName::parse(&format!("node/{name}")) {
        Ok(lock @ LockName::Node(_)) => Some(lock),
        _ => None,
    }
}

fn parse_exec(fields: &Fields<'_>) -> Result<Exec, OpcodeError> {
    let argv = match fields.required("argv")? {
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| fields.os_string("argv", item))
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(fields.bad("argv", "must be a non-empty list of strings")),
    };
    if argv[0].is_empty() {
        return Err(fields.bad("argv", "the program name must not be empty"));
    }
    let env = match fields.get("env") {
        None => Vec::new(),
        Some(Value::Object(variables)) => variables
            .iter()
            .map(|(name, value)| {
                if name.is_empty() || name.contains(['=', '\0']) {
                    return Err(fields.bad(
                        "env",
                        format!("'{}' is not a variable name", shortened(name)),
                    ));
                }
                Ok((name.clone(), fields.os_string("env", value)?))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(fields.bad("env", "must be an object of strings")),
    };
    let cwd = match fields.get("cwd") {
        None => None,
        Some(value) => Some(fields.os_string("cwd", value)?).filter(|cwd| !cwd.is_empty()),
    };
    if fields.get("cwd").is_some() && cwd.is_none() {
        return Err(fields.bad("cwd", "must not be empty"));
    }
    let timeout = match fields.get("timeout") {
        None => None,
        Some(value) => Some(
            fields
                .number(value, "timeout")
                .ok()
                .filter(|seconds| *seconds > 0.0 && *seconds <= EXEC_TIMEOUT_SECS_MAX)
                .ok_or_else(|| {
                    fields.bad(
                        "timeout",
                        format!("must be a positive number of seconds up to {EXEC_TIMEOUT_SECS_MAX}, or null"),
                    )
                })?,
        ),
    };
    let mut locks: Vec<(LockName, Mode)> = Vec::new();
    for entry in fields.list("locks")? {
        let (lock, mode) = crate::protocol::wconfd::decode_lock_mode(entry)
            .map_err(|what| fields.bad("locks", format!("an entry {what}")))?;
        if lock.level() == crate::locks::Level::Cluster || lock == LockName::Config {
            return Err(fields.bad(
                "locks",
                format!("'{lock}' cannot be asked for (the runner takes cluster/BGL itself)"),
            ));
        }
        if locks.iter().any(|(held, _)| *held == lock) {
            return Err(fields.bad("locks", format!("'{lock}' is named twice")));
        }
        locks.push((lock, mode));
    }
    let stdin = fields.string("stdin")?;
    let lock_timeout = fields.seconds("lock_timeout", LOCK_TIMEOUT_SECS_MAX)?;
    let kill_grace = fields
        .seconds("kill_grace", KILL_GRACE_SECS_MAX)?
        .unwrap_or(KILL_GRACE_SECS_DEFAULT);
    let retry = match fields.get("retry") {
        None => None,
        Some(value) => Some(parse_retry(value).map_err(|what| fields.bad("retry", what))?),
    };
    Ok(Exec {
        argv,
        env,
        cwd,
        timeout,
        locks,
        stdin,
        lock_timeout,
        kill_grace,
        retry,
    })
}

/// `{"max": n, "backoff": seconds, "on": [exit codes] or null, "on_death":
/// bool}`: `max` required, the others default to 0, `null` (any failure)
/// and false. `Err`: what is wrong, for [`Fields::bad`].
fn parse_retry(value: &Value) -> Result<Retry, String> {
    let Value::Object(fields) = value else {
        return Err("must be an object {\"max\": n, \"backoff\": seconds, \"on\": [exit codes] or null, \"on_death\": bool}, or null".to_owned());
    };
    for name in fields.keys() {
        if !["max", "backoff", "on", "on_death"].contains(&name.as_str()) {
            return Err(format!("'{}' is unknown", shortened(name)));
        }
    }
    let field = |name: &str| fields.get(name).filter(|value| !value.is_null());
    let max = field("max")
        .ok_or_else(|| "max is required".to_owned())?
        .as_u64()
        .filter(|max| (1..=RETRY_MAX).contains(max))
        .ok_or_else(|| format!("max must be an integer from 1 to {RETRY_MAX}"))?;
    let backoff = match field("backoff") {
        None => 0.0,
        Some(value) => value
            .as_f64()
            .filter(|seconds| (0.0..=RETRY_BACKOFF_SECS_MAX).contains(seconds))
            .ok_or_else(|| {
                format!("backoff must be a non-negative number of seconds up to {RETRY_BACKOFF_SECS_MAX}")
            })?,
    };
    let on = match field("on") {
        None => None,
        Some(Value::Array(codes)) if !codes.is_empty() => {
            let mut codes = codes
                .iter()
                .map(|code| {
                    code.as_i64()
                        .filter(|code| (1..=255).contains(code))
                        .and_then(|code| i32::try_from(code).ok())
                        .ok_or_else(|| {
                            "on must list exit codes from 1 to 255 (0 is success)".to_owned()
                        })
                })
                .collect::<Result<Vec<i32>, String>>()?;
            codes.sort_unstable();
            codes.dedup();
            Some(codes)
        }
        Some(_) => {
            return Err(
                "on must be a non-empty list of exit codes, or null (any failure)".to_owned(),
            );
        }
    };
    let on_death = match field("on_death") {
        None => false,
        Some(value) => value
            .as_bool()
            .ok_or_else(|| "on_death must be a boolean".to_owned())?,
    };
    Ok(Retry {
        max,
        backoff,
        on,
        on_death,
    })
}

impl Opcode {
    /// The opcode's own locks (the runner adds `cluster/BGL` shared):
    /// `node/<name>` exclusive for each of `on_nodes`, whatever `no_locks`
    /// says (Ganeti 3.0's `LUTestDelay.ExpandNames` reads `no_locks` and
    /// then overwrites its lock list with the nodes, so its delays on a
    /// node are serialised either way); `OP_EXEC`'s `locks`.
    pub fn locks(&self) -> Vec<(LockName, Mode)> {
        match &self.kind {
            OpKind::TestDelay(delay) => {
                let mut locks: Vec<(LockName, Mode)> = Vec::new();
                for name in &delay.on_nodes {
                    let lock = node_lock(name).expect("parse checked every name of on_nodes");
                    if !locks.iter().any(|(held, _)| *held == lock) {
                        locks.push((lock, Mode::Exclusive));
                    }
                }
                locks
            }
            OpKind::Exec(exec) => exec.locks.clone(),
        }
    }

    /// How long the opcode waits for its locks; `None`: for ever.
    pub fn lock_timeout(&self) -> Option<f64> {
        match &self.kind {
            OpKind::TestDelay(delay) => delay.lock_timeout,
            OpKind::Exec(exec) => exec.lock_timeout,
        }
    }

    /// The opcode's `OP_ID`.
    pub fn op_id(&self) -> &'static str {
        match self.kind {
            OpKind::TestDelay(_) => OP_TEST_DELAY,
            OpKind::Exec(_) => OP_EXEC,
        }
    }
}

/// `input` with luxid's reason entry appended:
/// `["gnt:opcode:<op_id lowercased without OP_>", "job=<id>;index=<i>", <ns>]`.
///
/// `input` is an opcode [`parse`] accepted; a missing or `null` `reason`
/// becomes a list holding only the new entry.
pub fn with_submit_reason(input: &Value, job: JobId, index: usize, now_ns: u128) -> Value {
    let mut output = input.clone();
    let Value::Object(fields) = &mut output else {
        return output;
    };
    let op_id = fields.get("OP_ID").and_then(Value::as_str).unwrap_or("");
    let short = op_id.strip_prefix("OP_").unwrap_or(op_id).to_lowercase();
    // Nanoseconds since the epoch fit 64 bits until the year 2554.
    let now_ns = u64::try_from(now_ns).unwrap_or(u64::MAX);
    let entry = serde_json::json!([
        format!("gnt:opcode:{short}"),
        format!("job={job};index={index}"),
        now_ns
    ]);
    match fields.get_mut("reason") {
        Some(Value::Array(trail)) => trail.push(entry),
        _ => {
            fields.insert("reason".to_owned(), Value::Array(vec![entry]));
        }
    }
    output
}

/// `input` with relative dependencies (negative ids) replaced by absolute
/// ones, relative to `job` (`-1` is `job - 1`). A dependency that resolves
/// to an id < 1 or to `job` itself is an error.
///
/// `input` is an opcode [`parse`] accepted; every id of the output is an
/// integer (a string of digits becomes the number it spells).
pub fn with_absolute_dependencies(input: &Value, job: JobId) -> Result<Value, OpcodeError> {
    let parsed = parse(input)?;
    if parsed.common.depends.is_empty() {
        return Ok(input.clone());
    }
    let this = i64::try_from(job).map_err(|_| OpcodeError(format!("Job id {job} is too large")))?;
    let mut absolute = Vec::with_capacity(parsed.common.depends.len());
    for dependency in &parsed.common.depends {
        let id = if dependency.job < 0 {
            this.saturating_add(dependency.job)
        } else {
            dependency.job
        };
        if id < 1 {
            return Err(OpcodeError(format!(
                "Dependency on job {} resolves to job {id}, which cannot exist",
                dependency.job
            )));
        }
        if id == this {
            return Err(OpcodeError(format!(
                "Dependency on job {} is the job itself",
                dependency.job
            )));
        }
        let statuses: Vec<&str> = dependency.statuses.iter().map(|s| s.name()).collect();
        absolute.push(serde_json::json!([id, statuses]));
    }
    let mut output = input.clone();
    if let Value::Object(fields) = &mut output {
        fields.insert("depends".to_owned(), Value::Array(absolute));
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What Ganeti 3.0's client sends for
    /// `opcodes.OpTestDelay(duration=0.5, on_master=False)`
    /// (`__getstate__`).
    fn ganeti_test_delay() -> Value {
        json!({
            "duration": 0.5, "on_master": false, "on_nodes": [],
            "on_node_uuids": null, "repeat": 0, "interruptible": false,
            "no_locks": true, "dry_run": null, "debug_level": null,
            "priority": 0, "depends": null, "comment": null, "reason": [],
            "OP_ID": "OP_TEST_DELAY"
        })
    }

    fn error_of(input: Value) -> String {
        parse(&input).expect_err("refused").0
    }

    #[test]
    fn ganetis_test_delay_parses() {
        let op = parse(&ganeti_test_delay()).unwrap();
        assert_eq!(
            op,
            Opcode {
                common: Common {
                    priority: 0,
                    depends: vec![],
                    comment: None,
                    reason: vec![],
                    dry_run: false,
                    debug_level: 0,
                    workers: None,
                    prepare_worker: None,
                    start_by: None,
                    unique_key: None,
                },
                kind: OpKind::TestDelay(TestDelay {
                    duration: 0.5,
                    on_master: false,
                    on_nodes: vec![],
                    repeat: 0,
                    interruptible: false,
                    no_locks: true,
                    lock_timeout: None,
                }),
            }
        );
        assert_eq!(op.op_id(), OP_TEST_DELAY);
        assert!(op.locks().is_empty());
    }

    #[test]
    fn missing_fields_take_ganetis_defaults() {
        let op = parse(&json!({"OP_ID": "OP_TEST_DELAY", "duration": 2})).unwrap();
        let OpKind::TestDelay(delay) = op.kind else {
            panic!("not a delay")
        };
        assert_eq!(delay.duration, 2.0);
        assert!(delay.on_master);
        assert!(delay.on_nodes.is_empty());
        assert_eq!(delay.repeat, 0);
        assert!(!delay.interruptible);
        assert!(delay.no_locks);
        assert_eq!(op.common.priority, 0);
    }

    #[test]
    fn duration_is_not_checked_for_sign_at_submit() {
        for duration in [0.0, -1.0] {
            parse(&json!({"OP_ID": "OP_TEST_DELAY", "duration": duration})).unwrap();
        }
    }

    #[test]
    fn test_delay_locks_its_nodes_whatever_no_locks_says() {
        let expected = vec![
            (LockName::parse("node/n1").unwrap(), Mode::Exclusive),
            (LockName::parse("node/n2").unwrap(), Mode::Exclusive),
        ];
        let mut input =
            json!({"OP_ID": "OP_TEST_DELAY", "duration": 1, "on_nodes": ["n1", "n2", "n1"]});
        // Absent (Ganeti's default, true), true, false: the same locks.
        assert_eq!(parse(&input).unwrap().locks(), expected);
        for no_locks in [true, false] {
            input["no_locks"] = json!(no_locks);
            assert_eq!(
                parse(&input).unwrap().locks(),
                expected,
                "no_locks {no_locks}"
            );
        }
        let without_nodes = json!({"OP_ID": "OP_TEST_DELAY", "duration": 1, "no_locks": false});
        assert!(parse(&without_nodes).unwrap().locks().is_empty());
    }

    #[test]
    fn wrong_types_name_the_field() {
        let delay = |field: &str, value: Value| {
            let mut input = ganeti_test_delay();
            input[field] = value;
            input
        };
        let cases = [
            (json!([]), "JSON object"),
            (json!({"duration": 1}), "no field 'OP_ID'"),
            (json!({"OP_ID": 7}), "'OP_ID' is not a string"),
            (
                json!({"OP_ID": "OP_CLUSTER_DESTROY"}),
                "Unknown opcode 'OP_CLUSTER_DESTROY'",
            ),
            (
                json!({"OP_ID": "OP_TEST_DELAY"}),
                "'OP_TEST_DELAY.duration' fails validation: it is required",
            ),
            (delay("duration", json!("1")), "'OP_TEST_DELAY.duration'"),
            (delay("on_master", json!(1)), "'OP_TEST_DELAY.on_master'"),
            (delay("on_nodes", json!("n1")), "'OP_TEST_DELAY.on_nodes'"),
            (delay("on_nodes", json!([""])), "'OP_TEST_DELAY.on_nodes'"),
            (
                delay("on_nodes", json!(["[lockset]"])),
                "'OP_TEST_DELAY.on_nodes'",
            ),
            (
                delay("on_node_uuids", json!([""])),
                "'OP_TEST_DELAY.on_node_uuids'",
            ),
            (delay("repeat", json!(-1)), "'OP_TEST_DELAY.repeat'"),
            (delay("repeat", json!(1.5)), "'OP_TEST_DELAY.repeat'"),
            (
                delay("interruptible", json!("yes")),
                "'OP_TEST_DELAY.interruptible'",
            ),
            (delay("no_locks", json!(0)), "'OP_TEST_DELAY.no_locks'"),
            (delay("priority", json!(5)), "'OP_TEST_DELAY.priority'"),
            (delay("priority", json!("0")), "'OP_TEST_DELAY.priority'"),
            (delay("comment", json!(1)), "'OP_TEST_DELAY.comment'"),
            (delay("reason", json!("why")), "'OP_TEST_DELAY.reason'"),
            (delay("dry_run", json!("no")), "'OP_TEST_DELAY.dry_run'"),
            (
                delay("debug_level", json!(-1)),
                "'OP_TEST_DELAY.debug_level'",
            ),
            (delay("depends", json!({})), "'OP_TEST_DELAY.depends'"),
            (delay("depends", json!([[1]])), "'OP_TEST_DELAY.depends'"),
            (
                delay("depends", json!([[1.5, []]])),
                "'OP_TEST_DELAY.depends'",
            ),
            (
                delay("depends", json!([[1, "success"]])),
                "'OP_TEST_DELAY.depends'",
            ),
            (
                delay("depends", json!([[1, ["running"]]])),
                "'OP_TEST_DELAY.depends'",
            ),
            (
                delay("depends", json!([[1, ["done"]]])),
                "'OP_TEST_DELAY.depends'",
            ),
            (
                delay("ponies", json!(1)),
                "'OP_TEST_DELAY.ponies' is unknown",
            ),
        ];
        for (input, expected) in cases {
            let error = error_of(input.clone());
            assert!(error.contains(expected), "{input}: {error}");
        }
    }

    fn exec(fields: Value) -> Value {
        let mut input = json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"]});
        for (name, value) in fields.as_object().unwrap() {
            input[name] = value.clone();
        }
        input
    }

    #[test]
    fn exec_parses_every_field() {
        let op = parse(&exec(json!({
            "argv": ["/bin/sh", "-c", "echo hi"],
            "env": {"A": "1", "B": ""},
            "cwd": "/tmp",
            "timeout": 2.5,
            "locks": [["node/n1", "exclusive"], ["instance/i1", "shared"]],
            "stdin": "data",
            "priority": -10,
            "depends": [[-1, ["success", "error"]], ["7", []]],
            "comment": "why",
            "reason": [["user", "text", 1]],
        })))
        .unwrap();
        let node = LockName::parse("node/n1").unwrap();
        let instance = LockName::parse("instance/i1").unwrap();
        assert_eq!(
            op.kind,
            OpKind::Exec(Exec {
                argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
                env: vec![("A".into(), "1".into()), ("B".into(), "".into())],
                cwd: Some("/tmp".into()),
                timeout: Some(2.5),
                locks: vec![
                    (node.clone(), Mode::Exclusive),
                    (instance.clone(), Mode::Shared)
                ],
                stdin: Some("data".into()),
                lock_timeout: None,
                kill_grace: 10.0,
                retry: None,
            })
        );
        assert_eq!(
            op.locks(),
            vec![(node, Mode::Exclusive), (instance, Mode::Shared)]
        );
        assert_eq!(op.common.priority, -10);
        assert_eq!(
            op.common.depends,
            vec![
                Dependency {
                    job: -1,
                    statuses: vec![Status::Success, Status::Error]
                },
                Dependency {
                    job: 7,
                    statuses: vec![]
                },
            ]
        );
        assert_eq!(op.common.comment.as_deref(), Some("why"));
        assert_eq!(op.common.reason.len(), 1);
    }

    #[test]
    fn exec_nulls_are_defaults() {
        let op = parse(&exec(json!({
            "env": null, "cwd": null, "timeout": null, "locks": null, "stdin": null
        })))
        .unwrap();
        let OpKind::Exec(exec) = op.kind else {
            panic!("not an exec")
        };
        assert!(exec.env.is_empty() && exec.locks.is_empty());
        assert_eq!((exec.cwd, exec.timeout, exec.stdin), (None, None, None));
    }

    #[test]
    fn exec_refuses_bad_fields_naming_them() {
        let cases = [
            (
                json!({"OP_ID": "OP_EXEC"}),
                "'OP_EXEC.argv' fails validation: it is required",
            ),
            (exec(json!({"argv": []})), "'OP_EXEC.argv'"),
            (exec(json!({"argv": "/bin/true"})), "'OP_EXEC.argv'"),
            (exec(json!({"argv": ["/bin/echo", 1]})), "'OP_EXEC.argv'"),
            (exec(json!({"argv": [""]})), "'OP_EXEC.argv'"),
            (
                exec(json!({"argv": ["/bin/echo", "a\u{0}b"]})),
                "'OP_EXEC.argv'",
            ),
            (exec(json!({"env": ["A=1"]})), "'OP_EXEC.env'"),
            (exec(json!({"env": {"A": 1}})), "'OP_EXEC.env'"),
            (exec(json!({"env": {"A=B": "1"}})), "'OP_EXEC.env'"),
            (exec(json!({"env": {"": "1"}})), "'OP_EXEC.env'"),
            (exec(json!({"cwd": 1})), "'OP_EXEC.cwd'"),
            (exec(json!({"cwd": ""})), "'OP_EXEC.cwd'"),
            (exec(json!({"timeout": 0})), "'OP_EXEC.timeout'"),
            (exec(json!({"timeout": -1})), "'OP_EXEC.timeout'"),
            (exec(json!({"timeout": "1"})), "'OP_EXEC.timeout'"),
            (exec(json!({"timeout": 1e12})), "'OP_EXEC.timeout'"),
            (exec(json!({"locks": {}})), "'OP_EXEC.locks'"),
            (exec(json!({"locks": ["node/n1"]})), "'OP_EXEC.locks'"),
            (
                exec(json!({"locks": [["node/n1", "release"]]})),
                "'OP_EXEC.locks'",
            ),
            (
                exec(json!({"locks": [["nodes/n1", "shared"]]})),
                "'OP_EXEC.locks'",
            ),
            (
                exec(json!({"locks": [["cluster/BGL", "shared"]]})),
                "'OP_EXEC.locks'",
            ),
            (
                exec(json!({"locks": [["cluster/[lockset]", "shared"]]})),
                "'OP_EXEC.locks'",
            ),
            (
                exec(json!({"locks": [["cluster/config", "shared"]]})),
                "'OP_EXEC.locks'",
            ),
            (
                exec(json!({"locks": [["node/n1", "shared"], ["node/n1", "exclusive"]]})),
                "'OP_EXEC.locks'",
            ),
            (exec(json!({"stdin": ["x"]})), "'OP_EXEC.stdin'"),
            (
                exec(json!({"duration": 1})),
                "'OP_EXEC.duration' is unknown",
            ),
        ];
        for (input, expected) in cases {
            let error = error_of(input.clone());
            assert!(error.contains(expected), "{input}: {error}");
        }
    }

    #[test]
    fn timeouts_and_retries_parse() {
        let op = parse(&exec(json!({
            "lock_timeout": 0,
            "kill_grace": 2.5,
            "retry": {"max": 3, "backoff": 0.5, "on": [7, 2, 7], "on_death": true},
            "start_by": 1_700_000_000.5,
            "unique_key": "nightly-backup",
        })))
        .unwrap();
        assert_eq!(op.lock_timeout(), Some(0.0));
        assert_eq!(op.common.start_by, Some(1_700_000_000.5));
        assert_eq!(op.common.unique_key.as_deref(), Some("nightly-backup"));
        let OpKind::Exec(parsed) = op.kind else {
            panic!("not an exec")
        };
        assert_eq!(parsed.kill_grace, 2.5);
        let retry = parsed.retry.expect("a retry");
        assert_eq!(
            retry,
            Retry {
                max: 3,
                backoff: 0.5,
                on: Some(vec![2, 7]),
                on_death: true
            }
        );
        assert!(retry.covers(Some(7)) && !retry.covers(Some(1)) && !retry.covers(None));

        let defaults = parse(&exec(json!({
            "lock_timeout": null, "kill_grace": null, "retry": null,
            "start_by": null, "unique_key": null,
        })))
        .unwrap();
        assert_eq!(defaults.lock_timeout(), None);
        assert_eq!(
            (defaults.common.start_by, defaults.common.unique_key),
            (None, None)
        );
        let OpKind::Exec(parsed) = defaults.kind else {
            panic!("not an exec")
        };
        assert_eq!(
            (parsed.kill_grace, parsed.retry),
            (KILL_GRACE_SECS_DEFAULT, None)
        );
        let minimal = parse(&exec_retry(json!({"max": 1}))).unwrap();
        let OpKind::Exec(Exec {
            retry: Some(retry), ..
        }) = minimal.kind
        else {
            panic!("no retry")
        };
        assert_eq!(
            (retry.backoff, &retry.on, retry.on_death),
            (0.0, &None, false)
        );
        assert!(retry.covers(None) && retry.covers(Some(1)));

        let delay =
            parse(&json!({"OP_ID": "OP_TEST_DELAY", "duration": 1, "lock_timeout": 1.5})).unwrap();
        assert_eq!(delay.lock_timeout(), Some(1.5));
    }

    fn exec_retry(retry: Value) -> Value {
        exec(json!({ "retry": retry }))
    }

    #[test]
    fn timeouts_and_retries_refuse_bad_values_naming_the_field() {
        let long_key = "k".repeat(UNIQUE_KEY_BYTES_MAX + 1);
        let delay =
            |value: Value| json!({"OP_ID": "OP_TEST_DELAY", "duration": 1, "lock_timeout": value});
        let cases = [
            (
                exec(json!({"lock_timeout": -1})),
                "'OP_EXEC.lock_timeout' fails validation",
            ),
            (exec(json!({"lock_timeout": "1"})), "'OP_EXEC.lock_timeout'"),
            (
                exec(json!({"lock_timeout": 1e12})),
                "'OP_EXEC.lock_timeout'",
            ),
            (
                delay(json!(-0.5)),
                "'OP_TEST_DELAY.lock_timeout' fails validation",
            ),
            (delay(json!(true)), "'OP_TEST_DELAY.lock_timeout'"),
            (
                exec(json!({"kill_grace": -1})),
                "'OP_EXEC.kill_grace' fails validation",
            ),
            (exec(json!({"kill_grace": [1]})), "'OP_EXEC.kill_grace'"),
            (
                exec(json!({"kill_grace": KILL_GRACE_SECS_MAX + 1.0})),
                "'OP_EXEC.kill_grace'",
            ),
            (
                exec_retry(json!(3)),
                "'OP_EXEC.retry' fails validation: must be an object",
            ),
            (
                exec_retry(json!({})),
                "'OP_EXEC.retry' fails validation: max is required",
            ),
            (
                exec_retry(json!({"max": 0})),
                "'OP_EXEC.retry' fails validation: max",
            ),
            (
                exec_retry(json!({"max": -1})),
                "'OP_EXEC.retry' fails validation: max",
            ),
            (
                exec_retry(json!({"max": 1.5})),
                "'OP_EXEC.retry' fails validation: max",
            ),
            (
                exec_retry(json!({"max": RETRY_MAX + 1})),
                "'OP_EXEC.retry' fails validation: max",
            ),
            (
                exec_retry(json!({"max": 1, "backoff": -1})),
                "'OP_EXEC.retry' fails validation: backoff",
            ),
            (
                exec_retry(json!({"max": 1, "backoff": RETRY_BACKOFF_SECS_MAX + 1.0})),
                "'OP_EXEC.retry' fails validation: backoff",
            ),
            (
                exec_retry(json!({"max": 1, "backoff": "1"})),
                "'OP_EXEC.retry' fails validation: backoff",
            ),
            (
                exec_retry(json!({"max": 1, "on": []})),
                "'OP_EXEC.retry' fails validation: on",
            ),
            (
                exec_retry(json!({"max": 1, "on": 1})),
                "'OP_EXEC.retry' fails validation: on",
            ),
            (
                exec_retry(json!({"max": 1, "on": [0]})),
                "'OP_EXEC.retry' fails validation: on",
            ),
            (
                exec_retry(json!({"max": 1, "on": [256]})),
                "'OP_EXEC.retry' fails validation: on",
            ),
            (
                exec_retry(json!({"max": 1, "on": ["1"]})),
                "'OP_EXEC.retry' fails validation: on",
            ),
            (
                exec_retry(json!({"max": 1, "on_death": "yes"})),
                "'OP_EXEC.retry' fails validation: on_death",
            ),
            (
                exec_retry(json!({"max": 1, "tries": 2})),
                "'OP_EXEC.retry' fails validation: 'tries' is unknown",
            ),
            (
                exec(json!({"start_by": "tomorrow"})),
                "'OP_EXEC.start_by' fails validation",
            ),
            (exec(json!({"start_by": -1})), "'OP_EXEC.start_by'"),
            (
                exec(json!({"start_by": START_BY_SECS_MAX * 1000.0})),
                "'OP_EXEC.start_by'",
            ),
            (
                exec(json!({"unique_key": ""})),
                "'OP_EXEC.unique_key' fails validation",
            ),
            (exec(json!({"unique_key": 7})), "'OP_EXEC.unique_key'"),
            (
                exec(json!({"unique_key": long_key})),
                "'OP_EXEC.unique_key'",
            ),
            (
                json!({"OP_ID": "OP_TEST_DELAY", "duration": 1, "retry": {"max": 1}}),
                "'OP_TEST_DELAY.retry' is unknown",
            ),
            (
                json!({"OP_ID": "OP_TEST_DELAY", "duration": 1, "kill_grace": 1}),
                "'OP_TEST_DELAY.kill_grace' is unknown",
            ),
        ];
        for (input, expected) in cases {
            let error = error_of(input.clone());
            assert!(error.contains(expected), "{input}: {error}");
        }
        // The longest key passes.
        parse(&exec(
            json!({"unique_key": "k".repeat(UNIQUE_KEY_BYTES_MAX)}),
        ))
        .unwrap();
    }

    #[test]
    fn group_locks_may_be_asked_for() {
        let op = parse(&exec(json!({"locks": [["node/[lockset]", "shared"]]}))).unwrap();
        assert_eq!(op.locks(), vec![(LockName::NodeSet, Mode::Shared)]);
    }

    #[test]
    fn submit_reason_is_appended() {
        let mut input = ganeti_test_delay();
        input["reason"] = json!([["gnt:client:gnt-debug", "delay", 1]]);
        let output = with_submit_reason(&input, 42, 3, 1_700_000_000_000_000_123);
        assert_eq!(
            output["reason"],
            json!([
                ["gnt:client:gnt-debug", "delay", 1],
                [
                    "gnt:opcode:test_delay",
                    "job=42;index=3",
                    1_700_000_000_000_000_123u64
                ]
            ])
        );
        let bare = with_submit_reason(&exec(json!({})), 1, 0, 5);
        assert_eq!(
            bare["reason"],
            json!([["gnt:opcode:exec", "job=1;index=0", 5]])
        );
        parse(&bare).unwrap();
    }

    #[test]
    fn relative_dependencies_become_absolute() {
        let input = exec(json!({"depends": [[-1, ["success"]], [3, []], ["2", ["error"]]]}));
        let output = with_absolute_dependencies(&input, 10).unwrap();
        assert_eq!(
            output["depends"],
            json!([[9, ["success"]], [3, []], [2, ["error"]]])
        );
        assert_eq!(output["argv"], input["argv"]);
        let plain = exec(json!({}));
        assert_eq!(with_absolute_dependencies(&plain, 10).unwrap(), plain);
    }

    #[test]
    fn dependencies_on_no_job_or_on_itself_are_refused() {
        for (depends, job) in [(-1, 1), (-5, 3), (0, 3), (3, 3)] {
            let input = exec(json!({"depends": [[depends, []]]}));
            let error = with_absolute_dependencies(&input, job).expect_err("refused");
            assert!(error.0.contains("Dependency on job"), "{error}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A valid opcode as a client sends it: either kind, optional
        /// fields present, `null` or absent.
        fn valid_opcode() -> impl Strategy<Value = Value> {
            let optional = |value: BoxedStrategy<Value>| {
                prop_oneof![Just(None), Just(Some(Value::Null)), value.prop_map(Some)]
            };
            let common = (
                optional(
                    proptest::sample::select(SUBMIT_PRIORITIES.to_vec())
                        .prop_map(Value::from)
                        .boxed(),
                ),
                optional(
                    proptest::collection::vec(
                        (
                            -5i64..5,
                            proptest::sample::subsequence(
                                vec!["success", "error", "canceled"],
                                0..=3,
                            ),
                        )
                            .prop_filter("not 0", |(job, _)| *job != 0)
                            .prop_map(|(job, statuses)| json!([job, statuses])),
                        0..3,
                    )
                    .prop_map(Value::Array)
                    .boxed(),
                ),
                optional(".{0,10}".prop_map(Value::String).boxed()),
                optional(any::<bool>().prop_map(Value::Bool).boxed()),
            );
            let delay = (
                0.0f64..10.0,
                optional(any::<bool>().prop_map(Value::Bool).boxed()),
                0u64..5,
            )
                .prop_map(|(duration, on_master, repeat)| {
                    let mut op =
                        json!({"OP_ID": OP_TEST_DELAY, "duration": duration, "repeat": repeat});
                    if let Some(on_master) = on_master {
                        op["on_master"] = on_master;
                    }
                    op
                });
            let exec = (
                proptest::collection::vec("[a-z/]{1,8}", 1..4),
                optional((0.5f64..1000.0).prop_map(Value::from).boxed()),
                proptest::sample::subsequence(vec!["node/a", "node/b", "instance/i"], 0..=3),
            )
                .prop_map(|(argv, timeout, locks)| {
                    let locks: Vec<Value> =
                        locks.iter().map(|lock| json!([lock, "shared"])).collect();
                    let mut op = json!({"OP_ID": OP_EXEC, "argv": argv, "locks": locks});
                    if let Some(timeout) = timeout {
                        op["timeout"] = timeout;
                    }
                    op
                });
            (prop_oneof![delay, exec], common).prop_map(
                |(mut op, (priority, depends, comment, dry_run))| {
                    for (name, value) in [
                        ("priority", priority),
                        ("depends", depends),
                        ("comment", comment),
                        ("dry_run", dry_run),
                    ] {
                        if let Some(value) = value {
                            op[name] = value;
                        }
                    }
                    op
                },
            )
        }

        proptest! {
            /// Whatever a client sends as an opcode: checked or refused,
            /// never a panic, and luxid's rewrites of it never panic.
            #[test]
            fn any_value_is_checked_or_refused(
                input in crate::protocol::arbitrary::json(),
                job in 1u64..u64::MAX,
            ) {
                if parse(&input).is_ok() {
                    let _ = with_absolute_dependencies(&input, job);
                    let _ = with_submit_reason(&input, job, 0, 1);
                }
            }

            /// An opcode field by field: any value in any field of a
            /// valid opcode is checked or refused, never a panic.
            #[test]
            fn any_field_value_is_checked_or_refused(
                op in valid_opcode(),
                field in proptest::sample::select(vec![
                    "OP_ID", "priority", "depends", "comment", "reason", "dry_run",
                    "debug_level", "duration", "on_master", "on_nodes", "on_node_uuids",
                    "repeat", "interruptible", "no_locks", "argv", "env", "cwd",
                    "timeout", "locks", "stdin", "lock_timeout", "kill_grace", "retry",
                    "start_by", "unique_key", "unknown",
                ]),
                value in crate::protocol::arbitrary::json(),
            ) {
                let mut op = op;
                op[field] = value;
                if let Ok(parsed) = parse(&op) {
                    let _ = parsed.locks();
                    let _ = with_absolute_dependencies(&op, 100);
                }
            }

            /// A valid opcode is accepted, and what luxid stores (absolute
            /// dependencies, its reason appended) is accepted again as the
            /// same opcode.
            #[test]
            fn valid_opcodes_round_trip(op in valid_opcode(), index in 0usize..10) {
                let parsed = parse(&op).expect("a valid opcode");
                let job = 10;
                let stored = with_submit_reason(
                    &with_absolute_dependencies(&op, job).expect("dependencies resolve"),
                    job,
                    index,
                    7,
                );
                let again = parse(&stored).expect("the stored opcode is valid");
                prop_assert_eq!(&again.kind, &parsed.kind);
                prop_assert_eq!(again.common.priority, parsed.common.priority);
                prop_assert_eq!(&again.common.comment, &parsed.common.comment);
                prop_assert_eq!(again.common.reason.len(), parsed.common.reason.len() + 1);
                let absolute: Vec<i64> = parsed
                    .common
                    .depends
                    .iter()
                    .map(|dependency| if dependency.job < 0 { 10 + dependency.job } else { dependency.job })
                    .collect();
                let stored_jobs: Vec<i64> = again.common.depends.iter().map(|dependency| dependency.job).collect();
                prop_assert_eq!(stored_jobs, absolute);
                // Stored twice, it stays the same (ids are absolute now).
                prop_assert_eq!(with_absolute_dependencies(&stored, job).expect("valid"), stored);
            }
        }
    }
}
