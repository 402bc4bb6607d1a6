//! The job commands: `submit`, `exec`, `list`, `info`, `watch`, `cancel`,
//! `archive`, `autoarchive`, `priority`, `drain`. Each is one or a few
//! LUXI calls (design/PROTOCOL.md) and a rendering of the answer.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::output::{Cell, Output, Style, duration, now_secs, timestamp_secs, utc_time};
use super::{CliError, CliResult, Exit, connect};
use crate::client::{Client, Daemon};
use crate::jobs::{FIELDS, Status, failure_reason};
use crate::limits::{WATCH_POLL, WATCH_POLL_TERMINAL};
use crate::protocol::luxi::LuxiRequest;

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// Hold this lock while the program runs, exclusively unless `:shared`
    /// is appended (repeatable), e.g. `--lock node/n1 --lock instance/web:shared`
    #[arg(long = "lock", value_name = "NAME[:shared]")]
    locks: Vec<String>,
    /// Job priority: -10 (high), 0 (normal) or 10 (low)
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    priority: i64,
    /// Start only after job ID has finished with one of STATUS (success,
    /// error, canceled; default: any but canceled); repeatable
    #[arg(long = "depends", value_name = "ID[:STATUS,...]")]
    depends: Vec<String>,
    /// Kill the program after this many seconds (the job then fails)
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// After --timeout's SIGTERM, wait this long before SIGKILL [default: 10]
    #[arg(long = "kill-grace", value_name = "SECONDS")]
    kill_grace: Option<f64>,
    /// Fail if the locks are not granted within this many seconds, naming
    /// the jobs in the way
    #[arg(long = "lock-timeout", value_name = "SECONDS")]
    lock_timeout: Option<f64>,
    /// Cancel the job if it has not started by TIME: `+DURATION` from now
    /// (`+90`, `+30s`, `+5m`, `+2h`, `+1d`), a UTC time
    /// (`2026-12-03T18:00Z`) or a Unix time in seconds
    #[arg(long = "start-by", value_name = "TIME")]
    start_by: Option<String>,
    /// Run a failed program again, at most N more times, BACKOFF seconds
    /// after each failure [default backoff: 0]
    #[arg(long, value_name = "N[:BACKOFF]")]
    retry: Option<String>,
    /// Retry only these exit codes (comma-separated) [default: any failure]
    #[arg(long = "retry-on", value_name = "CODE,...", requires = "retry")]
    retry_on: Option<String>,
    /// Also retry when the job's runner dies (the job is queued again)
    #[arg(long = "retry-on-death", requires = "retry")]
    retry_on_death: bool,
    /// While a job with this key is unfinished, answer its id instead of
    /// submitting another
    #[arg(long, value_name = "KEY")]
    unique: Option<String>,
    /// Set this variable for the program (repeatable)
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Run the program in this directory
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Hold a worker of one of these groups while the job runs (repeatable)
    #[arg(long = "worker-group", value_name = "GROUP")]
    worker_groups: Vec<String>,
    /// Hold a worker with this capability (repeatable, all must match)
    #[arg(long = "worker-cap", value_name = "KEY=VALUE")]
    worker_caps: Vec<String>,
    /// Hold this many such workers, all or nothing [default: 1 with
    /// --worker-group or --worker-cap]
    #[arg(long = "workers", value_name = "N")]
    worker_count: Option<u64>,
    /// Run at most N jobs of bucket LABEL at once (Ganeti's ad-hoc rate
    /// limit: a `rate-limit:N:LABEL` reason); repeatable
    #[arg(long = "rate-limit", value_name = "N:LABEL")]
    rate_limits: Vec<String>,
    /// Follow the job to its end, as `warden watch` (exit 0 only on success)
    #[arg(long)]
    watch: bool,
    /// The program and its arguments (put them after `--`)
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM ARGS"
    )]
    argv: Vec<String>,
}

/// `submit FILE|-`.
pub fn submit(root: &Path, output: &Output, file: &str) -> CliResult {
    let document = read_json_file(file)?;
    let mut luxid = connect(root, Daemon::Luxid)?;
    let ids = submit_document(&mut luxid, &document)?;
    print_submitted(output, &ids);
    Ok(())
}

/// A job file's (or a registrations file's) JSON: read from `file`
/// (`-`: standard input).
pub fn read_json_file(file: &str) -> CliResult<Value> {
    let (name, text) = if file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|error| CliError::usage(format!("cannot read standard input: {error}")))?;
        ("standard input".to_owned(), text)
    } else {
        let text = std::fs::read_to_string(file)
            .map_err(|error| CliError::usage(format!("cannot read {file}: {error}")))?;
        (file.to_owned(), text)
    };
    serde_json::from_str(&text)
        .map_err(|error| CliError::usage(format!("{name} is not valid JSON: {error}")))
}

/// What a job file holds.
enum JobFile<'a> {
    /// A list of opcodes: one job.
    One(&'a Value),
    /// A list of lists of opcodes: several jobs.
    Many(&'a [Value]),
}

fn classify(document: &Value) -> CliResult<JobFile<'_>> {
    let shape_error = || {
        CliError::usage(
            "a job file holds a JSON list of opcodes (one job), or a list of such lists (several jobs)",
        )
    };
    let items = document.as_array().ok_or_else(shape_error)?;
    if !items.is_empty() && items.iter().all(Value::is_object) {
        Ok(JobFile::One(document))
    } else if !items.is_empty() && items.iter().all(Value::is_array) {
        Ok(JobFile::Many(items))
    } else {
        Err(shape_error())
    }
}

/// A job file's jobs, each a list of opcodes, in order.
pub fn jobs_of(document: &Value) -> CliResult<Vec<&Value>> {
    Ok(match classify(document)? {
        JobFile::One(ops) => vec![ops],
        JobFile::Many(jobs) => jobs.iter().collect(),
    })
}

/// Submits a job file's jobs; their ids in order. Several jobs go in one
/// `SubmitManyJobs`, so relative dependencies resolve among them.
pub fn submit_document(luxid: &mut Client, document: &Value) -> CliResult<Vec<u64>> {
    match classify(document)? {
        JobFile::One(ops) => Ok(vec![luxid.submit_job(ops)?]),
        JobFile::Many(jobs) => {
            let mut ids = Vec::new();
            let mut refusals = Vec::new();
            for (index, entry) in luxid.submit_many_jobs(jobs)?.into_iter().enumerate() {
                match entry {
                    Ok(id) => ids.push(id),
                    Err(message) => {
                        refusals.push(format!("job {} of the file: {message}", index + 1))
                    }
                }
            }
            if refusals.is_empty() {
                Ok(ids)
            } else {
                Err(CliError::refused(format!(
                    "refused {}{}",
                    refusals.join("; "),
                    if ids.is_empty() {
                        String::new()
                    } else {
                        format!(" (submitted: {})", join_ids(&ids))
                    }
                )))
            }
        }
    }
}

fn print_submitted(output: &Output, ids: &[u64]) {
    if output.json {
        output.json_value(&json!({ "jobs": ids }), false);
    } else if let [id] = ids {
        output.line(&format!(
            "submitted job {id}; follow it with: warden watch {id}"
        ));
    } else {
        output.line(&format!("submitted jobs {}", join_ids(ids)));
    }
}

fn join_ids(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `exec [options] -- PROGRAM ARGS...`.
pub fn exec(root: &Path, output: &Output, args: &ExecArgs) -> CliResult<Exit> {
    let opcode = exec_opcode(args)?;
    let mut luxid = connect(root, Daemon::Luxid)?;
    let id = luxid.submit_job(&json!([opcode]))?;
    if args.watch {
        if !output.json {
            output.line(&format!("submitted job {id}"));
        }
        return follow(&mut luxid, output, id);
    }
    print_submitted(output, &[id]);
    Ok(Exit::Success)
}

/// The `OP_EXEC` opcode of `exec`'s arguments.
fn exec_opcode(args: &ExecArgs) -> CliResult<Value> {
    let mut opcode = Map::new();
    opcode.insert("OP_ID".to_owned(), json!("OP_EXEC"));
    opcode.insert("argv".to_owned(), json!(args.argv));
    if !args.locks.is_empty() {
        let locks: Vec<Value> = args.locks.iter().map(|lock| lock_entry(lock)).collect();
        opcode.insert("locks".to_owned(), Value::Array(locks));
    }
    if args.priority != 0 {
        opcode.insert("priority".to_owned(), json!(args.priority));
    }
    if !args.depends.is_empty() {
        let depends = args
            .depends
            .iter()
            .map(|dependency| dependency_entry(dependency))
            .collect::<CliResult<Vec<Value>>>()?;
        opcode.insert("depends".to_owned(), Value::Array(depends));
    }
    if let Some(timeout) = args.timeout {
        opcode.insert("timeout".to_owned(), json!(timeout));
    }
    if let Some(grace) = args.kill_grace {
        opcode.insert("kill_grace".to_owned(), json!(grace));
    }
    if let Some(timeout) = args.lock_timeout {
        opcode.insert("lock_timeout".to_owned(), json!(timeout));
    }
    if let Some(time) = &args.start_by {
        opcode.insert(
            "start_by".to_owned(),
            json!(start_by_secs(time, now_secs())?),
        );
    }
    if let Some(spec) = &args.retry {
        let mut retry = retry_entry(spec)?;
        if let Some(codes) = &args.retry_on {
            retry.insert("on".to_owned(), exit_codes(codes)?);
        }
        if args.retry_on_death {
            retry.insert("on_death".to_owned(), json!(true));
        }
        opcode.insert("retry".to_owned(), Value::Object(retry));
    }
    if let Some(key) = &args.unique {
        opcode.insert("unique_key".to_owned(), json!(key));
    }
    if !args.worker_groups.is_empty() || !args.worker_caps.is_empty() || args.worker_count.is_some()
    {
        let mut workers = Map::new();
        if !args.worker_groups.is_empty() {
            workers.insert("groups".to_owned(), json!(args.worker_groups));
        }
        if !args.worker_caps.is_empty() {
            workers.insert(
                "caps".to_owned(),
                json!(super::workers::key_values(&args.worker_caps)?),
            );
        }
        if let Some(count) = args.worker_count {
            workers.insert("count".to_owned(), json!(count));
        }
        opcode.insert("workers".to_owned(), Value::Object(workers));
    }
    if !args.env.is_empty() {
        let mut env = Map::new();
        for variable in &args.env {
            let (name, value) = variable
                .split_once('=')
                .ok_or_else(|| CliError::usage(format!("--env {variable}: expected NAME=VALUE")))?;
            env.insert(name.to_owned(), json!(value));
        }
        opcode.insert("env".to_owned(), Value::Object(env));
    }
    if let Some(cwd) = &args.cwd {
        opcode.insert("cwd".to_owned(), json!(cwd));
    }
    if !args.rate_limits.is_empty() {
        let reasons = args
            .rate_limits
            .iter()
            .map(|limit| {
                let text = format!("rate-limit:{limit}");
                match crate::scheduling::rate_limit::Bucket::of_reason(&text) {
                    Some(_) if limit.contains(':') => Ok(reason_entry("exec", &text)),
                    _ => Err(CliError::usage(format!(
                        "--rate-limit {limit}: expected N:LABEL with N a positive integer"
                    ))),
                }
            })
            .collect::<CliResult<Vec<Value>>>()?;
        opcode.insert("reason".to_owned(), Value::Array(reasons));
    }
    Ok(Value::Object(opcode))
}

/// `--start-by`'s TIME as a Unix time, `now` being the current one. The
/// range is luxid's to check.
fn start_by_secs(time: &str, now: f64) -> CliResult<f64> {
    let bad = || {
        CliError::usage(format!(
            "--start-by {time}: expected +DURATION (+90, +30s, +5m, +2h, +1d), \
             a UTC time (2026-12-03T18:00Z) or a Unix time in seconds"
        ))
    };
    if let Some(relative) = time.strip_prefix('+') {
        return duration_secs(relative)
            .map(|secs| (now + secs).floor())
            .ok_or_else(bad);
    }
    if let Some(secs) = crate::text::parse_utc_time(time) {
        return Ok(secs as f64);
    }
    match time.parse::<f64>() {
        Ok(secs) if secs.is_finite() => Ok(secs),
        _ => Err(bad()),
    }
}

/// `3` or `3:2.5` → `{"max": 3, "backoff": 2.5}`; the limits are luxid's
/// to check.
fn retry_entry(spec: &str) -> CliResult<Map<String, Value>> {
    let bad = || {
        CliError::usage(format!(
            "--retry {spec}: expected N[:BACKOFF], N retries after the first attempt, \
             BACKOFF seconds between them"
        ))
    };
    let (max, backoff) = match spec.split_once(':') {
        Some((max, backoff)) => (max, Some(backoff)),
        None => (spec, None),
    };
    let mut retry = Map::new();
    retry.insert(
        "max".to_owned(),
        json!(max.parse::<u64>().map_err(|_| bad())?),
    );
    if let Some(backoff) = backoff {
        let backoff: f64 = backoff.parse().map_err(|_| bad())?;
        if !backoff.is_finite() {
            return Err(bad());
        }
        retry.insert("backoff".to_owned(), json!(backoff));
    }
    Ok(retry)
}

/// `1,75` → `[1, 75]`.
fn exit_codes(codes: &str) -> CliResult<Value> {
    codes
        .split(',')
        .map(|code| {
            code.trim()
                .parse::<i64>()
                .map(|code| json!(code))
                .map_err(|_| {
                    CliError::usage(format!(
                        "--retry-on {codes}: expected exit codes separated by commas"
                    ))
                })
        })
        .collect::<CliResult<Vec<Value>>>()
        .map(Value::Array)
}

/// A reason entry of the command `command` (`exec`, `filter`), as
/// Ganeti's clients make theirs: `["warden:client:<command>", text,
/// <nanoseconds since the epoch>]`.
pub fn reason_entry(command: &str, text: &str) -> Value {
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    json!([format!("warden:client:{command}"), text, now_ns])
}

/// `node/n1` or `node/n1:exclusive` → `["node/n1", "exclusive"]`;
/// `node/n1:shared` → `["node/n1", "shared"]`. The name itself is checked
/// by luxid, which knows the lock order.
fn lock_entry(spec: &str) -> Value {
    for mode in ["shared", "exclusive"] {
        if let Some(name) = spec.strip_suffix(&format!(":{mode}")) {
            return json!([name, mode]);
        }
    }
    json!([spec, "exclusive"])
}

/// `12` or `12:success,error` → `[12, ["success", "error"]]`.
fn dependency_entry(spec: &str) -> CliResult<Value> {
    let (id, statuses) = spec.split_once(':').unwrap_or((spec, ""));
    let bad = || {
        CliError::usage(format!(
            "--depends {spec}: expected ID[:STATUS,...] with STATUS one of success, error, canceled"
        ))
    };
    let id: i64 = id.parse().map_err(|_| bad())?;
    let statuses = statuses
        .split(',')
        .filter(|status| !status.is_empty())
        .map(|status| {
            Status::parse(status)
                .filter(|status| status.is_final())
                .map(|status| json!(status.name()))
                .ok_or_else(bad)
        })
        .collect::<CliResult<Vec<Value>>>()?;
    Ok(json!([id, statuses]))
}

/// The fields `list` shows.
const LIST_FIELDS: [&str; 9] = [
    "id",
    "status",
    "priority",
    "summary",
    "received_ts",
    "start_ts",
    "end_ts",
    "workers",
    "archived",
];

/// `list [--status S]... [--archived]`.
pub fn list(root: &Path, output: &Output, statuses: &[String], archived: bool) -> CliResult {
    for status in statuses {
        if Status::parse(status).is_none() {
            return Err(CliError::usage(format!(
                "unknown status '{status}' (one of {})",
                Status::ALL.map(Status::name).join(", ")
            )));
        }
    }
    let fields: &[&str] = if archived {
        &LIST_FIELDS
    } else {
        &LIST_FIELDS[..LIST_FIELDS.len() - 1]
    };
    let mut luxid = connect(root, Daemon::Luxid)?;
    let rows = luxid.query_jobs(None, fields)?;
    let jobs: Vec<Map<String, Value>> = rows
        .iter()
        .map(|row| named_row(fields, row))
        .filter(|job| {
            statuses.is_empty()
                || job
                    .get("status")
                    .and_then(Value::as_str)
                    .is_some_and(|status| statuses.iter().any(|wanted| wanted == status))
        })
        .collect();
    if output.json {
        let jobs: Vec<Value> = jobs.into_iter().map(listed_job_json).collect();
        output.json_value(&Value::Array(jobs), false);
        return Ok(());
    }
    if jobs.is_empty() {
        output.line("no jobs");
        return Ok(());
    }
    let now = now_secs();
    // The WORKERS column only where some job holds workers.
    let workers_of = |job: &Map<String, Value>| given_workers(job).join(",");
    let with_workers = jobs.iter().any(|job| !workers_of(job).is_empty());
    let rows: Vec<Vec<Cell>> = jobs
        .iter()
        .map(|job| {
            let status = text(job.get("status"));
            let received = job.get("received_ts").and_then(timestamp_secs);
            let started = job.get("start_ts").and_then(timestamp_secs);
            let ended = job.get("end_ts").and_then(timestamp_secs);
            let ran = match (started, ended) {
                (Some(start), Some(end)) => duration(end - start),
                (Some(start), None) => format!("{}…", duration(now - start)),
                _ => "-".to_owned(),
            };
            let mut status_cell = Cell::styled(status.clone(), Style::of_status(&status));
            if job.get("archived") == Some(&Value::Bool(true)) {
                status_cell.text.push_str(" (archived)");
            }
            let mut row = vec![
                text(job.get("id")).into(),
                status_cell,
                text(job.get("priority")).into(),
                received
                    .map_or("-".to_owned(), |at| format!("{} ago", duration(now - at)))
                    .into(),
                ran.into(),
            ];
            if with_workers {
                let workers = workers_of(job);
                row.push(
                    if workers.is_empty() {
                        "-".to_owned()
                    } else {
                        workers
                    }
                    .into(),
                );
            }
            row.push(summary(job.get("summary")).into());
            row
        })
        .collect();
    let mut headers = vec!["ID", "STATUS", "PRIO", "RECEIVED", "RAN"];
    if with_workers {
        headers.push("WORKERS");
    }
    headers.push("SUMMARY");
    output.table(&headers, &rows);
    Ok(())
}

/// A QueryJobs row as an object of its fields.
fn named_row(fields: &[&str], row: &Value) -> Map<String, Value> {
    fields
        .iter()
        .zip(row.as_array().into_iter().flatten())
        .map(|(field, value)| ((*field).to_owned(), value.clone()))
        .collect()
}

/// `list --json`'s shape: timestamps as seconds since the epoch.
fn listed_job_json(mut job: Map<String, Value>) -> Value {
    for field in ["received_ts", "start_ts", "end_ts"] {
        if let Some(value) = job.get_mut(field) {
            *value = timestamp_secs(value).map_or(Value::Null, |secs| json!(secs));
        }
    }
    job.entry("archived").or_insert(json!(false));
    Value::Object(job)
}

/// `info ID`.
pub fn info(root: &Path, output: &Output, id: u64) -> CliResult {
    let mut luxid = connect(root, Daemon::Luxid)?;
    let job = query_one(&mut luxid, id, &FIELDS)?;
    if output.json {
        output.json_value(&Value::Object(job), false);
        return Ok(());
    }
    let status = text(job.get("status"));
    let mut header = format!(
        "job {id}  {}  priority {}",
        output.paint(&status, Style::of_status(&status)),
        text(job.get("priority"))
    );
    if job.get("archived") == Some(&Value::Bool(true)) {
        header.push_str("  (archived)");
    }
    output.line(&header);
    let received = job.get("received_ts").and_then(timestamp_secs);
    let started = job.get("start_ts").and_then(timestamp_secs);
    let ended = job.get("end_ts").and_then(timestamp_secs);
    let mut times = Vec::new();
    if let Some(at) = received {
        times.push(vec!["received".into(), utc_time(at).into(), "".into()]);
    }
    if let Some(at) = started {
        let waited = received.map_or(String::new(), |from| {
            format!("after {}", duration(at - from))
        });
        times.push(vec!["started".into(), utc_time(at).into(), waited.into()]);
    }
    if let Some(at) = ended {
        let ran = started.map_or(String::new(), |from| format!("ran {}", duration(at - from)));
        times.push(vec!["ended".into(), utc_time(at).into(), ran.into()]);
    }
    for line in output.table_lines(&["", "", ""], &times).iter().skip(1) {
        output.line(&format!("  {line}"));
    }
    if let Some(line) = workers_line(&job) {
        output.line(&format!("  {line}"));
    }
    let per_op = |field: &str| -> Vec<Value> {
        job.get(field)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (summaries, statuses, results, logs) = (
        per_op("summary"),
        per_op("opstatus"),
        per_op("opresult"),
        per_op("oplog"),
    );
    for (index, summary) in summaries.iter().enumerate() {
        let status = text(statuses.get(index));
        output.line(&format!(
            "opcode {}  {}  {}",
            index + 1,
            summary.as_str().unwrap_or("?"),
            output.paint(&status, Style::of_status(&status))
        ));
        if let Some(result) = results.get(index).filter(|result| !result.is_null()) {
            output.line(&format!("  result  {}", compact(result)));
        }
        for entry in logs
            .get(index)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            output.line(&format!("  {}", log_line(output, entry)));
        }
    }
    Ok(())
}

/// The uuids of the workers a job was given (its `workers` field).
fn given_workers(job: &Map<String, Value>) -> Vec<&str> {
    job.get("workers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// What `info` says of a job's workers: those it was given, or what it
/// asks for while it waits; None for a job that asked for none.
fn workers_line(job: &Map<String, Value>) -> Option<String> {
    let given = given_workers(job);
    if !given.is_empty() {
        return Some(format!("workers   {}", given.join(", ")));
    }
    let asked = job.get("ops")?.get(0)?.get("workers")?;
    let waiting = job.get("status").and_then(Value::as_str) == Some("queued");
    Some(format!(
        "workers   {} {}",
        if waiting { "waiting for" } else { "asked for" },
        compact(asked)
    ))
}

/// The job's fields as an object; an unknown job is refused.
fn query_one(
    luxid: &mut Client,
    id: u64,
    fields: &[&'static str],
) -> CliResult<Map<String, Value>> {
    let rows = luxid.query_jobs(Some(&[id]), fields)?;
    let row = rows
        .first()
        .ok_or_else(|| malformed("QueryJobs", &Value::Array(Vec::new())))?;
    let job = named_row(fields, row);
    if job.get("status").is_none_or(Value::is_null) {
        return Err(unknown_job(id));
    }
    Ok(job)
}

fn unknown_job(id: u64) -> CliError {
    CliError::refused(format!("job {id} does not exist"))
}

/// `watch ID`.
pub fn watch(root: &Path, output: &Output, id: u64) -> CliResult<Exit> {
    let mut luxid = connect(root, Daemon::Luxid)?;
    follow(&mut luxid, output, id)
}

/// Follows a job to its end: its log as it comes, its status changes, a
/// status line with the elapsed time on a terminal; `Success` only if it
/// ends `success`.
pub fn follow(luxid: &mut Client, output: &Output, id: u64) -> CliResult<Exit> {
    let watching_since = Instant::now();
    let start = query_one(luxid, id, &["status", "received_ts", "oplog"])?;
    let received = start.get("received_ts").and_then(timestamp_secs);
    let elapsed = || match received {
        Some(at) => now_secs() - at,
        None => watching_since.elapsed().as_secs_f64(),
    };
    let poll = if output.is_terminal() {
        WATCH_POLL_TERMINAL
    } else {
        WATCH_POLL
    };
    let mut previous = Value::Null;
    let mut log_serial = 0u64;
    let mut status_line = StatusLine::new(output);
    // A finished job (perhaps archived, which WaitForJobChange does not
    // see) has its whole log at hand.
    let first_status = text(start.get("status"));
    let status = if Status::parse(&first_status).is_some_and(Status::is_final) {
        let entries = start
            .get("oplog")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_array)
            .flatten();
        for entry in entries {
            print_log_entry(output, entry);
        }
        print_status(output, id, &first_status);
        first_status
    } else {
        loop {
            let answer = luxid
                .luxi(&LuxiRequest::WaitForJobChange {
                    id,
                    fields: vec!["status"],
                    previous: previous.clone(),
                    log_serial,
                    timeout: poll,
                })
                .map_err(|error| match CliError::from(error) {
                    error if error.exit == Exit::Refused => unknown_job(id),
                    error => error,
                })?;
            let Some([values, log]) = answer.as_array().map(Vec::as_slice) else {
                // "nochange": nothing new within the poll.
                status_line.show(&text(previous.get(0)), elapsed());
                continue;
            };
            for entry in log.as_array().into_iter().flatten() {
                if let Some(serial) = entry.get(0).and_then(Value::as_u64) {
                    log_serial = log_serial.max(serial);
                }
                status_line.clear();
                print_log_entry(output, entry);
            }
            let status = text(values.get(0));
            if *values != previous {
                status_line.clear();
                // On a terminal the status line shows the status meanwhile.
                if output.json
                    || !output.is_terminal()
                    || Status::parse(&status).is_some_and(Status::is_final)
                {
                    print_status(output, id, &status);
                }
                previous = values.clone();
            }
            if Status::parse(&status).is_some_and(Status::is_final) {
                break status;
            }
            status_line.show(&status, elapsed());
        }
    };
    status_line.clear();
    let job = query_one(
        luxid,
        id,
        &["status", "received_ts", "end_ts", "opstatus", "opresult"],
    )?;
    let took = match (
        job.get("received_ts").and_then(timestamp_secs),
        job.get("end_ts").and_then(timestamp_secs),
    ) {
        (Some(from), Some(to)) => to - from,
        _ => elapsed(),
    };
    let failure = if status == "error" {
        failed_opcode(&job)
    } else {
        None
    };
    if output.json {
        let mut end = json!({"event": "end", "id": id, "status": status, "elapsed_seconds": took});
        if let Some((opcode, reason)) = &failure {
            end["failed_opcode"] = json!(opcode);
            end["reason"] = json!(reason);
        }
        output.json_value(&end, true);
    } else {
        output.line(&format!(
            "job {id} {} after {}",
            output.paint(&status, Style::of_status(&status)),
            duration(took)
        ));
        if let Some((opcode, reason)) = &failure {
            output.line(&format!(
                "{} {reason}",
                output.paint(&format!("opcode {opcode} failed:"), Some(Style::Dim))
            ));
        }
    }
    Ok(if status == "success" {
        Exit::Success
    } else {
        Exit::Unsuccessful
    })
}

/// The first opcode of a job that ended `error` whose own status is
/// `error` (the later ones only say "Preceding opcode failed"), numbered
/// from 1 as `info` shows it, with the reason its result gives.
fn failed_opcode(job: &Map<String, Value>) -> Option<(usize, String)> {
    let statuses = job.get("opstatus")?.as_array()?;
    let index = statuses.iter().position(|status| status == "error")?;
    let result = job
        .get("opresult")
        .and_then(Value::as_array)
        .and_then(|results| results.get(index))
        .unwrap_or(&Value::Null);
    Some((index + 1, failure_reason(result)))
}

fn print_log_entry(output: &Output, entry: &Value) {
    if output.json {
        output.json_value(&log_event(entry), true);
    } else {
        output.line(&log_line(output, entry));
    }
}

fn print_status(output: &Output, id: u64, status: &str) {
    if output.json {
        output.json_value(
            &json!({"event": "status", "id": id, "status": status}),
            true,
        );
    } else {
        output.line(&format!(
            "{} {}",
            output.paint("status", Some(Style::Dim)),
            output.paint(status, Style::of_status(status))
        ));
    }
}

/// The line `watch` keeps at the bottom of a terminal: status and elapsed
/// time, redrawn in place.
struct StatusLine<'a> {
    output: &'a Output,
    shown: bool,
}

impl<'a> StatusLine<'a> {
    fn new(output: &'a Output) -> StatusLine<'a> {
        StatusLine {
            output,
            shown: false,
        }
    }

    fn show(&mut self, status: &str, elapsed: f64) {
        if !self.output.is_terminal() || self.output.json {
            return;
        }
        print!(
            "\r\x1b[K{} {}",
            self.output.paint(status, Style::of_status(status)),
            self.output.paint(&duration(elapsed), Some(Style::Dim))
        );
        let _ = std::io::Write::flush(&mut std::io::stdout());
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            print!("\r\x1b[K");
            self.shown = false;
        }
    }
}

/// A log entry (`[serial, [secs, usecs], type, message]`) for people:
/// `10:03:12.345  hello`.
fn log_line(output: &Output, entry: &Value) -> String {
    let at = entry
        .get(1)
        .and_then(timestamp_secs)
        .map_or_else(|| "?".to_owned(), |secs| utc_time(secs)[11..23].to_owned());
    let kind = entry.get(2).and_then(Value::as_str).unwrap_or("message");
    let message = match entry.get(3) {
        Some(Value::String(text)) => text.clone(),
        Some(other) => compact(other),
        None => String::new(),
    };
    let at = output.paint(&at, Some(Style::Dim));
    if kind == "message" {
        format!("{at}  {message}")
    } else {
        format!("{at}  {kind}: {message}")
    }
}

/// A log entry for `watch --json`.
fn log_event(entry: &Value) -> Value {
    json!({
        "event": "log",
        "serial": entry.get(0),
        "time": entry.get(1).and_then(timestamp_secs),
        "type": entry.get(2),
        "message": entry.get(3),
    })
}

/// `cancel ID [--kill]`.
pub fn cancel(root: &Path, output: &Output, id: u64, kill: bool) -> CliResult {
    let mut luxid = connect(root, Daemon::Luxid)?;
    let (done, message) = luxid.cancel_job(id, kill)?;
    if !done && !kill && message.contains("no longer waiting") {
        return Err(CliError::refused(format!(
            "{message}; its running program goes on: `warden cancel --kill {id}` stops it"
        )));
    }
    if !done {
        return Err(CliError::refused(message));
    }
    if output.json {
        output.json_value(
            &json!({"id": id, "canceled": true, "message": message}),
            false,
        );
    } else {
        output.line(&message);
    }
    Ok(())
}

/// `archive ID`.
pub fn archive(root: &Path, output: &Output, id: u64) -> CliResult {
    let mut luxid = connect(root, Daemon::Luxid)?;
    if !luxid.archive_job(id)? {
        let status = query_one(&mut luxid, id, &["status"])?;
        return Err(CliError::refused(format!(
            "job {id} is {} and cannot be archived until it finishes",
            text(status.get("status"))
        )));
    }
    if output.json {
        output.json_value(&json!({"id": id, "archived": true}), false);
    } else {
        output.line(&format!("archived job {id}"));
    }
    Ok(())
}

/// `autoarchive AGE`.
pub fn autoarchive(root: &Path, output: &Output, age: &str) -> CliResult {
    let seconds = parse_age(age)?;
    let mut luxid = connect(root, Daemon::Luxid)?;
    // No time limit: archive every candidate now (-1, as Ganeti's).
    let age =
        (seconds >= 0.0).then(|| Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX));
    let (archived, left) = luxid.auto_archive_jobs(age, None)?;
    if output.json {
        output.json_value(&json!({"archived": archived, "left": left}), false);
    } else {
        output.line(&format!("archived {archived} jobs"));
    }
    Ok(())
}

/// `90`, `90s`, `30m`, `12h`, `7d` in seconds; `all` is -1 (every finished
/// job, as Ganeti's `AutoArchiveJobs`).
fn parse_age(age: &str) -> CliResult<f64> {
    if age == "all" {
        return Ok(-1.0);
    }
    duration_secs(age).ok_or_else(|| {
        CliError::usage(format!(
            "bad age '{age}': a number of seconds, or with s, m, h or d (e.g. 30m), or all"
        ))
    })
}

/// `90`, `90s`, `30m`, `1.5h`, `7d` in seconds; `None` for anything else
/// (a sign, a negative or infinite number, another unit).
fn duration_secs(text: &str) -> Option<f64> {
    let (number, scale) = match text.char_indices().last() {
        Some((index, 's')) => (&text[..index], 1.0),
        Some((index, 'm')) => (&text[..index], 60.0),
        Some((index, 'h')) => (&text[..index], 3_600.0),
        Some((index, 'd')) => (&text[..index], 86_400.0),
        _ => (text, 1.0),
    };
    if number.starts_with(['+', '-']) {
        return None;
    }
    number
        .parse::<f64>()
        .ok()
        .filter(|value| value.is_finite() && *value >= 0.0)
        .map(|value| value * scale)
}

/// `priority ID P`.
pub fn priority(root: &Path, output: &Output, id: u64, priority: i64) -> CliResult {
    let mut luxid = connect(root, Daemon::Luxid)?;
    let (done, message) = luxid.change_job_priority(id, priority)?;
    if !done {
        return Err(CliError::refused(message));
    }
    if output.json {
        output.json_value(
            &json!({"id": id, "priority": priority, "message": message}),
            false,
        );
    } else {
        output.line(&message);
    }
    Ok(())
}

/// `drain on|off`.
pub fn drain(root: &Path, output: &Output, drained: bool) -> CliResult {
    let mut luxid = connect(root, Daemon::Luxid)?;
    luxid.set_drain_flag(drained)?;
    if output.json {
        output.json_value(&json!({ "drained": drained }), false);
    } else if drained {
        output.line("queue drained: new submissions are refused");
    } else {
        output.line("queue open: submissions are accepted");
    }
    Ok(())
}

fn malformed(method: &str, answer: &Value) -> CliError {
    CliError::failure(format!(
        "luxid answered {method} with something unexpected: {}",
        compact(answer)
    ))
}

/// A value as short text: strings bare, anything else as compact JSON.
pub fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => "-".to_owned(),
        Some(other) => other.to_string(),
    }
}

fn compact(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value always serialises")
}

/// A job's `summary` field (one text per opcode) as one cell.
fn summary(value: Option<&Value>) -> String {
    match value.and_then(Value::as_array) {
        Some(parts) => parts
            .iter()
            .map(|part| part.as_str().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join(", "),
        None => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_opcode_gives_its_reason() {
        let job = |statuses: Value, results: Value| {
            named_row(&["opstatus", "opresult"], &json!([statuses, results]))
        };
        let failed = job(
            json!(["success", "error", "error"]),
            json!([
                null,
                ["OpExecError", ["cannot start /no/such/program: No such file or directory", {"exit_code": null}]],
                ["OpExecError", ["Preceding opcode failed"]]
            ]),
        );
        assert_eq!(
            failed_opcode(&failed),
            Some((
                2,
                "cannot start /no/such/program: No such file or directory".to_owned()
            ))
        );
        let prereq = job(
            json!(["error"]),
            json!([[
                "OpPrereqError",
                ["Duration must be greater than zero", "wrong_input"]
            ]]),
        );
        assert_eq!(
            failed_opcode(&prereq),
            Some((1, "Duration must be greater than zero".to_owned()))
        );
        let odd = job(json!(["error"]), json!([{"not": "an error"}]));
        assert_eq!(
            failed_opcode(&odd),
            Some((1, r#"{"not":"an error"}"#.to_owned()))
        );
        assert_eq!(failed_opcode(&job(json!(["success"]), json!([null]))), None);
    }

    #[test]
    fn start_by_times_become_unix_times() {
        let now = 1_796_252_806.5;
        assert_eq!(start_by_secs("+90", now).unwrap(), 1_796_252_896.0);
        assert_eq!(start_by_secs("+30s", now).unwrap(), 1_796_252_836.0);
        assert_eq!(start_by_secs("+5m", now).unwrap(), 1_796_253_106.0);
        assert_eq!(start_by_secs("+2h", now).unwrap(), 1_796_260_006.0);
        assert_eq!(start_by_secs("+1d", now).unwrap(), 1_796_339_206.0);
        assert_eq!(
            start_by_secs("2026-12-02T23:06:46Z", now).unwrap(),
            1_796_252_806.0
        );
        assert_eq!(start_by_secs("1796252806", now).unwrap(), 1_796_252_806.0);
        for bad in [
            "+",
            "+-5m",
            "++5",
            "+5x",
            "+infd",
            "tomorrow",
            "2026-12-02T23:06",
        ] {
            assert!(start_by_secs(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn retry_specs_become_retry_entries() {
        assert_eq!(Value::Object(retry_entry("3").unwrap()), json!({"max": 3}));
        assert_eq!(
            Value::Object(retry_entry("3:2.5").unwrap()),
            json!({"max": 3, "backoff": 2.5})
        );
        for bad in ["", "x", "3:", "3:x", "-1", "3:inf", ":2"] {
            assert!(retry_entry(bad).is_err(), "{bad}");
        }
        assert_eq!(exit_codes("1, 75").unwrap(), json!([1, 75]));
        assert!(exit_codes("1,x").is_err());
    }

    #[test]
    fn lock_specs_become_lock_entries() {
        assert_eq!(lock_entry("node/n1"), json!(["node/n1", "exclusive"]));
        assert_eq!(lock_entry("node/n1:shared"), json!(["node/n1", "shared"]));
        assert_eq!(
            lock_entry("node/n1:exclusive"),
            json!(["node/n1", "exclusive"])
        );
    }

    #[test]
    fn dependency_specs_become_depends_entries() {
        assert_eq!(dependency_entry("12").unwrap(), json!([12, []]));
        assert_eq!(
            dependency_entry("12:success,error").unwrap(),
            json!([12, ["success", "error"]])
        );
        for bad in ["x", "12:running", "12:bogus", ":success"] {
            assert_eq!(
                dependency_entry(bad).unwrap_err().exit,
                Exit::Usage,
                "{bad}"
            );
        }
    }

    #[test]
    fn ages_take_units() {
        assert_eq!(parse_age("90").unwrap(), 90.0);
        assert_eq!(parse_age("90s").unwrap(), 90.0);
        assert_eq!(parse_age("30m").unwrap(), 1800.0);
        assert_eq!(parse_age("1.5h").unwrap(), 5400.0);
        assert_eq!(parse_age("7d").unwrap(), 604_800.0);
        assert_eq!(parse_age("all").unwrap(), -1.0);
        for bad in ["", "m", "-5", "5y", "inf"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn job_files_are_one_job_or_several() {
        assert!(matches!(
            classify(&json!([{"OP_ID": "OP_EXEC"}])),
            Ok(JobFile::One(_))
        ));
        assert!(matches!(
            classify(&json!([[{"OP_ID": "OP_EXEC"}], [{"OP_ID": "OP_EXEC"}]])),
            Ok(JobFile::Many(jobs)) if jobs.len() == 2
        ));
        for bad in [
            json!([]),
            json!({}),
            json!([1]),
            json!([[], {}]),
            json!("x"),
        ] {
            assert!(classify(&bad).is_err(), "{bad}");
        }
    }
}
