//! `warden demo`: a tour for newcomers. Both daemons on a temporary root,
//! the example jobs of `jobs/` submitted together so that they contend
//! for locks, their progress as it happens, the lock table while a job
//! waits, a summary, and a clean shutdown. Exits 0 only if every job ended
//! as expected.

use std::time::Instant;

use serde_json::{Value, json};

use super::jobs::{submit_document, text};
use super::launcher::{Daemons, Logs};
use super::output::{Cell, Output, Style, duration, timestamp_secs};
use super::{CliError, CliResult, Exit, connect};
use crate::client::Daemon;
use crate::limits::{DEMO_JOBS_DEADLINE, DEMO_LOOK_INTERVAL};

/// The example jobs, as `jobs/` holds them, in the order the demo submits
/// them, with the status each job must end with.
pub const EXAMPLES: [(&str, &str, &[&str]); 4] = [
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
];

/// One submitted job of the demo.
struct DemoJob {
    id: u64,
    file: &'static str,
    expected: &'static str,
    status: String,
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
    let jobs = outcome?;
    say("stopped luxid and wconfd");
    let as_expected = jobs.iter().all(|job| job.status == job.expected) && clean;
    if output.json {
        output.json_value(
            &json!({
                "jobs": jobs.iter().map(|job| json!({
                    "id": job.id,
                    "file": job.file,
                    "status": job.status,
                    "expected": job.expected,
                })).collect::<Vec<_>>(),
                "as_expected": as_expected,
            }),
            false,
        );
    }
    if as_expected {
        say(&format!(
            "{} every job ended as expected. Next: `warden up`, then `warden exec --watch -- echo hi` in another terminal.",
            output.paint("demo passed:", Some(Style::Green))
        ));
        Ok(Exit::Success)
    } else {
        output.error("the demo did not go as expected (see the summary above)");
        Ok(Exit::Unsuccessful)
    }
}

/// Submits the examples, follows them to their end, and prints the
/// summary; the jobs and how they ended.
fn tour(output: &Output, say: &dyn Fn(&str), daemons: &Daemons) -> CliResult<Vec<DemoJob>> {
    let root = &daemons.root;
    let mut luxid = connect(root, Daemon::Luxid)?;
    let mut wconfd = connect(root, Daemon::Wconfd)?;
    let mut jobs: Vec<DemoJob> = Vec::new();
    say("\nsubmitting the example jobs of jobs/ together:");
    for (file, text, expected) in EXAMPLES {
        let document: Value = serde_json::from_str(text)
            .map_err(|error| CliError::failure(format!("jobs/{file} is not JSON: {error}")))?;
        let ids = submit_document(&mut luxid, &document)?;
        let listed: Vec<String> = ids.iter().map(u64::to_string).collect();
        say(&format!(
            "  {file:<26} job{} {}",
            if ids.len() == 1 { " " } else { "s" },
            listed.join(", ")
        ));
        for (id, expected) in ids.into_iter().zip(expected.iter()) {
            jobs.push(DemoJob {
                id,
                file,
                expected,
                status: "queued".to_owned(),
            });
        }
    }
    say("\nprogress (time since submission, job, new status):");
    let ids: Vec<u64> = jobs.iter().map(|job| job.id).collect();
    let submitted = Instant::now();
    let mut lock_table_shown = false;
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
        let finished = jobs.iter().all(|job| {
            crate::jobs::Status::parse(&job.status).is_some_and(crate::jobs::Status::is_final)
        });
        if finished {
            break;
        }
        if submitted.elapsed() > DEMO_JOBS_DEADLINE {
            return Err(CliError::new(
                Exit::Unsuccessful,
                format!(
                    "the jobs did not finish within {} s{}",
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
    Ok(jobs)
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
