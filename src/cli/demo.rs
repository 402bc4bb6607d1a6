//! `warden demo`: a tour for newcomers. Both daemons on a temporary root,
//! the board farm of `jobs/` registered and let in, the example jobs of
//! `jobs/` submitted together so that they contend for locks and for
//! workers, their progress and the workers' states as they happen, the
//! lock table while a job waits for a lock, the worker table while a job
//! waits for a worker, a summary, and a clean shutdown. Exits 0 only if
//! every job and every worker ended as expected.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};

use super::jobs::{jobs_of, submit_document, text};
use super::launcher::{Daemons, Logs};
use super::output::{Cell, Output, Style, duration, timestamp_secs};
use super::workers::{self, Registration};
use super::{CliError, CliResult, Exit, connect};
use crate::client::{Client, Daemon};
use crate::limits::{DEMO_JOBS_DEADLINE, DEMO_LOOK_INTERVAL};
use crate::workers::Filter;

/// The example jobs, as `jobs/` holds them, in the order the demo submits
/// them, with the status each job must end with. The board farm's jobs
/// run on the workers of [`FARM`].
pub const EXAMPLES: [(&str, &str, &[&str]); 5] = [
    (
        "rolling-maintenance.json",
        include_str!("../../jobs/rolling-maintenance.json"),
        &["success", "success", "success"],
    ),
    (
        "cluster-check.json",
        include_str!("../../jobs/cluster-check.json"),
        &["success"],
    ),
    (
        "hello.json",
        include_str!("../../jobs/hello.json"),
        &["success"],
    ),
    (
        "delay.json",
        include_str!("../../jobs/delay.json"),
        &["success"],
    ),
    (
        "board-farm.json",
        include_str!("../../jobs/board-farm.json"),
        &["success", "success", "success"],
    ),
];

/// A registrations file of `jobs/` and the state each of its workers must
/// be in once the jobs have ended and no prepare runs any more.
pub struct Farm {
    pub file: &'static str,
    pub text: &'static str,
    /// `(uuid, state)`, in the file's order. A worker expected `FAILED`
    /// must also have failed its prepare (`fail_reason`).
    pub expected: &'static [(&'static str, &'static str)],
}

/// The board farm the demo registers before it submits [`EXAMPLES`]:
/// board-b1's prepare fails, so it is FAILED from its first prepare on
/// and no job gets it; the other two are back IDLE after their last job.
pub const FARM: Farm = Farm {
    file: "board-farm-workers.json",
    text: include_str!("../../jobs/board-farm-workers.json"),
    expected: &[
        ("board-a1", "IDLE"),
        ("board-a2", "IDLE"),
        ("board-b1", "FAILED"),
    ],
};

/// How the `fail_reason` of a worker whose prepare failed begins.
const PREPARE_FAILED: &str = "prepare failed";

/// One submitted job of the demo.
struct DemoJob {
    id: u64,
    file: &'static str,
    expected: &'static str,
    status: String,
    /// The workers it asks for, as a listing's filter (groups any of,
    /// caps all of: the workers that fit it).
    workers: Option<Filter>,
}

/// One worker of the demo's farm, as the registry last showed it.
struct DemoWorker {
    uuid: &'static str,
    expected: &'static str,
    state: String,
    fail_reason: Option<String>,
    /// The jobs it was held by, oldest first.
    jobs: Vec<u64>,
}

impl DemoWorker {
    fn as_expected(&self) -> bool {
        self.state == self.expected
            && (self.expected != "FAILED"
                || self
                    .fail_reason
                    .as_deref()
                    .is_some_and(|reason| reason.starts_with(PREPARE_FAILED)))
    }
}

/// How the tour ended.
struct Outcome {
    jobs: Vec<DemoJob>,
    workers: Vec<DemoWorker>,
}

pub fn run(output: &Output) -> CliResult<Exit> {
    // The narrative goes to stdout, or to stderr when stdout carries JSON.
    let say = |text: &str| {
        if output.json {
            output.note(text);
        } else {
            output.line(text);
        }
    };
    let root = tempfile::Builder::new()
        .prefix("warden-demo-")
        .tempdir()
        .map_err(|error| CliError::failure(format!("cannot make a temporary root: {error}")))?;
    say(&format!(
        "{} a tour of warden on a temporary root, {}",
        output.paint("warden demo:", Some(Style::Bold)),
        root.path().display()
    ));
    super::launcher::daemon_binaries()?;
    let started = Instant::now();
    let mut daemons = Daemons::start(root.path(), Logs::Files(root.path().to_owned()))?;
    let pids: Vec<String> = daemons
        .pids()
        .iter()
        .map(|(daemon, pid)| format!("{} (pid {pid})", daemon.name()))
        .collect();
    say(&format!(
        "started {} in {}; their logs are {}/*.log",
        pids.join(" and "),
        duration(started.elapsed().as_secs_f64()),
        daemons.root.display()
    ));
    let outcome = tour(output, &say, &daemons);
    let stopped = daemons.stop();
    let clean = stopped.iter().all(|(_, status)| status.success());
    for (daemon, status) in &stopped {
        if !status.success() {
            output.error(&format!(
                "{} {} at shutdown{}",
                daemon.name(),
                super::launcher::describe(*status),
                daemons.log_hint(*daemon)
            ));
        }
    }
    let Outcome { jobs, workers } = outcome?;
    say("stopped luxid and wconfd");
    let as_expected = jobs.iter().all(|job| job.status == job.expected)
        && workers.iter().all(DemoWorker::as_expected)
        && clean;
    if output.json {
        output.json_value(
            &json!({
                "jobs": jobs.iter().map(|job| json!({
                    "id": job.id,
                    "file": job.file,
                    "status": job.status,
                    "expected": job.expected,
                })).collect::<Vec<_>>(),
                "workers": workers.iter().map(|worker| json!({
                    "uuid": worker.uuid,
                    "state": worker.state,
                    "expected": worker.expected,
                    "fail_reason": worker.fail_reason,
                    "jobs": worker.jobs,
                })).collect::<Vec<_>>(),
                "as_expected": as_expected,
            }),
            false,
        );
    }
    if as_expected {
        say(&format!(
            "{} every job and every worker ended as expected. Next: `warden up`, then `warden exec --watch -- echo hi` in another terminal.",
            output.paint("demo passed:", Some(Style::Green))
        ));
        Ok(Exit::Success)
    } else {
        output.error("the demo did not go as expected (see the summary above)");
        Ok(Exit::Unsuccessful)
    }
}

/// Registers the farm and lets it in, submits the examples, follows the
/// jobs and the workers to their end, and prints the summary; how the
/// jobs and the workers ended.
fn tour(output: &Output, say: &dyn Fn(&str), daemons: &Daemons) -> CliResult<Outcome> {
    let root = &daemons.root;
    let mut luxid = connect(root, Daemon::Luxid)?;
    let mut wconfd = connect(root, Daemon::Wconfd)?;
    let mut farm = let_in_farm(output, say, &mut wconfd)?;
    let mut jobs: Vec<DemoJob> = Vec::new();
    say("\nsubmitting the example jobs of jobs/ together:");
    for (file, text, expected) in EXAMPLES {
        let document: Value = serde_json::from_str(text)
            .map_err(|error| CliError::failure(format!("jobs/{file} is not JSON: {error}")))?;
        let requests = jobs_of(&document)?
            .into_iter()
            .map(|ops| workers_asked(file, ops))
            .collect::<CliResult<Vec<_>>>()?;
        let ids = submit_document(&mut luxid, &document)?;
        let listed: Vec<String> = ids.iter().map(u64::to_string).collect();
        say(&format!(
            "  {file:<26} job{} {}",
            if ids.len() == 1 { " " } else { "s" },
            listed.join(", ")
        ));
        for ((id, expected), workers) in ids.into_iter().zip(expected.iter()).zip(requests) {
            jobs.push(DemoJob {
                id,
                file,
                expected,
                status: "queued".to_owned(),
                workers,
            });
        }
    }
    say("\nprogress (time since submission, job or worker, new status):");
    let ids: Vec<u64> = jobs.iter().map(|job| job.id).collect();
    let submitted = Instant::now();
    let mut lock_table_shown = false;
    let mut worker_table_shown = false;
    loop {
        let rows = luxid.query_jobs(Some(&ids), &["id", "status", "oplog"])?;
        for (job, row) in jobs.iter_mut().zip(&rows) {
            let status = text(row.get(1));
            if status != job.status {
                let at = duration(submitted.elapsed().as_secs_f64());
                let mut line = format!(
                    "  {at:>8}  job {:<3} {}",
                    job.id,
                    output.paint(&status, Style::of_status(&status))
                );
                if status == "success"
                    && let Some(last) = last_log_message(row.get(2))
                {
                    line.push_str(&format!("  (said: {last})"));
                }
                say(&line);
                job.status = status;
            }
        }
        let listing = workers::list(&mut wconfd, Filter::default())?;
        for line in farm.changes(output, &listing) {
            let at = duration(submitted.elapsed().as_secs_f64());
            say(&format!("  {at:>8}  {line}"));
        }
        if !lock_table_shown {
            let waiters = wconfd.list_waiters()?;
            if waiters
                .as_array()
                .is_some_and(|waiters| !waiters.is_empty())
            {
                say(&format!(
                    "\n  {} a job waits for a lock another job holds:",
                    output.paint("contention!", Some(Style::Yellow))
                ));
                for line in super::locks::lock_table_lines(output, &mut wconfd)? {
                    say(format!("    {line}").trim_end());
                }
                say("");
                lock_table_shown = true;
            }
        }
        if !worker_table_shown
            && let Some((job, held)) = waiting_for_a_held_worker(&mut wconfd, &jobs)?
        {
            say(&format!(
                "\n  {} job {job} waits (queued) for a worker another job holds: {held}",
                output.paint("contention!", Some(Style::Yellow))
            ));
            for line in workers::listing_lines(output, &listing) {
                say(format!("    {line}").trim_end());
            }
            say("");
            worker_table_shown = true;
        }
        let finished = jobs.iter().all(|job| {
            crate::jobs::Status::parse(&job.status).is_some_and(crate::jobs::Status::is_final)
        });
        if finished && farm.settled() {
            break;
        }
        if submitted.elapsed() > DEMO_JOBS_DEADLINE {
            return Err(CliError::new(
                Exit::Unsuccessful,
                format!(
                    "the jobs did not finish, or the workers did not settle, within {} s{}",
                    DEMO_JOBS_DEADLINE.as_secs(),
                    daemons.log_hint(Daemon::Luxid)
                ),
            ));
        }
        std::thread::sleep(DEMO_LOOK_INTERVAL);
    }
    if !lock_table_shown {
        say("  (no job was caught waiting for a lock this time: the machine was quick)");
    }
    if !worker_table_shown {
        say("  (no job was caught waiting for a worker another job holds this time)");
    }
    say("\nsummary:");
    let rows = luxid.query_jobs(
        Some(&ids),
        &["summary", "received_ts", "start_ts", "end_ts"],
    )?;
    let table: Vec<Vec<Cell>> = jobs
        .iter()
        .zip(&rows)
        .map(|(job, row)| {
            let at = |index: usize| row.get(index).and_then(timestamp_secs);
            let span = |from: Option<f64>, to: Option<f64>| match (from, to) {
                (Some(from), Some(to)) => duration(to - from),
                _ => "-".to_owned(),
            };
            let verdict = if job.status == job.expected {
                Cell::styled("as expected", Some(Style::Green))
            } else {
                Cell::styled(format!("expected {}", job.expected), Some(Style::Red))
            };
            let summary = row
                .get(0)
                .and_then(Value::as_array)
                .map(|parts| {
                    parts
                        .iter()
                        .map(|part| part.as_str().unwrap_or("?"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            vec![
                job.id.to_string().into(),
                job.file.into(),
                summary.into(),
                Cell::styled(job.status.clone(), Style::of_status(&job.status)),
                span(at(1), at(2)).into(),
                span(at(2), at(3)).into(),
                verdict,
            ]
        })
        .collect();
    for line in output.table_lines(
        &[
            "ID", "FILE", "OPCODES", "STATUS", "WAITED", "RAN", "VERDICT",
        ],
        &table,
    ) {
        say(&format!("  {line}"));
    }
    let workers = farm.finish(&workers::list(&mut wconfd, Filter::default())?);
    let expected: Vec<String> = workers
        .iter()
        .map(|worker| {
            let by = if worker.expected == "FAILED" {
                " by its prepare"
            } else {
                ""
            };
            format!("{} {}{by}", worker.uuid, worker.expected)
        })
        .collect();
    say(&format!(
        "\nthe workers at the end (expected: {}):",
        expected.join(", ")
    ));
    let table: Vec<Vec<Cell>> = workers
        .iter()
        .map(|worker| {
            let verdict = if worker.as_expected() {
                Cell::styled("as expected", Some(Style::Green))
            } else {
                Cell::styled(format!("expected {}", worker.expected), Some(Style::Red))
            };
            let held: Vec<String> = worker.jobs.iter().map(u64::to_string).collect();
            vec![
                worker.uuid.into(),
                Cell::styled(worker.state.clone(), workers::state_style(&worker.state)),
                Cell::from(if held.is_empty() {
                    "-".to_owned()
                } else {
                    held.join(", ")
                }),
                Cell::from(worker.fail_reason.clone().unwrap_or_else(|| "-".to_owned())),
                verdict,
            ]
        })
        .collect();
    for line in output.table_lines(
        &["UUID", "STATE", "HELD BY", "FAIL REASON", "VERDICT"],
        &table,
    ) {
        say(&format!("  {line}"));
    }
    Ok(Outcome { jobs, workers })
}

/// The workers a job asks for on its first opcode, as the filter of the
/// workers that fit it.
fn workers_asked(file: &str, ops: &Value) -> CliResult<Option<Filter>> {
    let Some(asked) = ops.get(0).and_then(|first| first.get("workers")) else {
        return Ok(None);
    };
    let request = crate::protocol::workers::decode_request(asked)
        .map_err(|what| CliError::failure(format!("jobs/{file}: {what}")))?;
    Ok(Some(Filter {
        groups: request.groups,
        caps: request.caps,
        states: Default::default(),
    }))
}

/// A job still queued although workers fit it, because every one of them
/// is busy and one is held by another job: the job, and who holds what.
fn waiting_for_a_held_worker(
    wconfd: &mut Client,
    jobs: &[DemoJob],
) -> CliResult<Option<(u64, String)>> {
    for job in jobs.iter().filter(|job| job.status == "queued") {
        let Some(filter) = &job.workers else {
            continue;
        };
        let listing = workers::list(wconfd, filter.clone())?;
        let fitting = workers::workers_of(&listing);
        if fitting.iter().any(|worker| worker["state"] == "IDLE") {
            continue;
        }
        let held: Vec<String> = fitting
            .iter()
            .filter(|worker| worker["state"] == "RUNNING")
            .filter_map(|worker| {
                let holder = worker["holder"].as_u64()?;
                (holder != job.id)
                    .then(|| format!("{} is held by job {holder}", workers::text(&worker["uuid"])))
            })
            .collect();
        if !held.is_empty() {
            return Ok(Some((job.id, held.join(", "))));
        }
    }
    Ok(None)
}

/// The demo's workers as the registry last showed them, to tell their
/// changes as they happen.
struct FarmWatch {
    /// uuid: (state, holder), as last seen.
    seen: BTreeMap<String, (String, Option<u64>)>,
}

/// Registers the workers of [`FARM`] (new ones start in MAINTENANCE) and
/// lets them in, as `warden workers register` and `warden workers state
/// UUID idle` do.
fn let_in_farm(output: &Output, say: &dyn Fn(&str), wconfd: &mut Client) -> CliResult<FarmWatch> {
    let document: Value = serde_json::from_str(FARM.text)
        .map_err(|error| CliError::failure(format!("jobs/{} is not JSON: {error}", FARM.file)))?;
    let registrations = workers::registrations(&document)?;
    let uuids: Vec<&str> = registrations.iter().map(Registration::uuid).collect();
    let expected: Vec<&str> = FARM.expected.iter().map(|(uuid, _)| *uuid).collect();
    if uuids != expected {
        return Err(CliError::failure(format!(
            "jobs/{} registers {}, the demo expects {}",
            FARM.file,
            uuids.join(", "),
            expected.join(", ")
        )));
    }
    workers::register_all(wconfd, &registrations)?;
    say(&format!(
        "\nregistered the board farm of jobs/{} (new workers start in MAINTENANCE):",
        FARM.file
    ));
    let rows: Vec<Vec<Cell>> = registrations
        .iter()
        .map(|registration| {
            let groups: Vec<&str> = registration
                .groups
                .iter()
                .flatten()
                .map(String::as_str)
                .collect();
            vec![
                registration.uuid().into(),
                workers::caps_text(&json!(registration.caps)).into(),
                groups.join(",").into(),
                registration
                    .prepare
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), argv_text)
                    .into(),
            ]
        })
        .collect();
    for line in output.table_lines(&["UUID", "CAPS", "GROUPS", "PREPARE"], &rows) {
        say(&format!("  {line}"));
    }
    for uuid in &uuids {
        workers::set_state(wconfd, uuid, "idle", false)?;
    }
    say(
        "let them in (`warden workers state UUID idle`): each runs its prepare (a job of its own) in PREPARE, then is IDLE, or FAILED if the prepare fails",
    );
    let mut farm = FarmWatch {
        seen: BTreeMap::new(),
    };
    let listing = workers::list(wconfd, Filter::default())?;
    for line in farm.changes(output, &listing) {
        say(&format!("  {line}"));
    }
    Ok(farm)
}

impl FarmWatch {
    /// One line per worker whose state or holder changed since the last
    /// look.
    fn changes(&mut self, output: &Output, listing: &Value) -> Vec<String> {
        let mut lines = Vec::new();
        for worker in workers::workers_of(listing) {
            let uuid = workers::text(&worker["uuid"]);
            let state = workers::text(&worker["state"]);
            let holder = worker["holder"].as_u64();
            let before = self.seen.get(&uuid).cloned();
            if before.as_ref() == Some(&(state.clone(), holder)) {
                continue;
            }
            let was_held = before.as_ref().and_then(|(_, holder)| *holder);
            let why = match state.as_str() {
                "PREPARE" => match was_held {
                    Some(job) => format!("job {job} gave it back: its prepare runs"),
                    None => "its prepare runs".to_owned(),
                },
                "RUNNING" => holder.map_or_else(String::new, |job| format!("held by job {job}")),
                "IDLE" if before.as_ref().is_some_and(|(state, _)| state != "PREPARE") => {
                    "back through its prepare".to_owned()
                }
                "IDLE" => "ready for a job".to_owned(),
                "FAILED" => workers::text(&worker["fail_reason"]),
                _ => String::new(),
            };
            let mut line = format!(
                "worker {uuid} {}",
                output.paint(&state, workers::state_style(&state))
            );
            if !why.is_empty() {
                line.push_str(&format!("  ({why})"));
            }
            lines.push(line);
            self.seen.insert(uuid, (state, holder));
        }
        lines
    }

    /// Whether no worker is on its way anywhere: none held, none
    /// preparing.
    fn settled(&self) -> bool {
        self.seen
            .values()
            .all(|(state, _)| !matches!(state.as_str(), "PREPARE" | "RUNNING" | "BUSY"))
    }

    /// The farm's workers as `listing` shows them, in [`FARM`]'s order.
    fn finish(&self, listing: &Value) -> Vec<DemoWorker> {
        FARM.expected
            .iter()
            .map(|(uuid, expected)| {
                let worker = workers::workers_of(listing)
                    .iter()
                    .find(|worker| worker["uuid"] == *uuid);
                DemoWorker {
                    uuid,
                    expected,
                    state: worker.map_or_else(
                        || "unregistered".to_owned(),
                        |worker| workers::text(&worker["state"]),
                    ),
                    fail_reason: worker
                        .and_then(|worker| worker["fail_reason"].as_str())
                        .map(str::to_owned),
                    jobs: worker
                        .and_then(|worker| worker["history"].as_array())
                        .into_iter()
                        .flatten()
                        .filter_map(|holding| holding["job"].as_u64())
                        .collect(),
                }
            })
            .collect()
    }
}

/// An argv as a shell would take it back: arguments with spaces or
/// quotes in single quotes.
fn argv_text(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| {
            if !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last message of a job's log (`oplog`: a list per opcode).
fn last_log_message(oplog: Option<&Value>) -> Option<String> {
    oplog?
        .as_array()?
        .iter()
        .filter_map(Value::as_array)
        .flatten()
        .last()
        .and_then(|entry| entry.get(3))
        .and_then(Value::as_str)
        .map(str::to_owned)
}
