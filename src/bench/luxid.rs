//! luxid-bench: the real luxid, wconfd and job runners over LUXI, against
//! the targets of design/PERFORMANCE.md.
//!
//! ```text
//! cargo build --release --bins
//! target/release/luxid-bench [throughput|latency|restart|events|scheduling] [--runs N] [--quick] [--dir DIR]
//!     [--runner PATH] [--reporter] [--filter-rules]
//! ```
//!
//! Every run of a scenario starts the `wconfd` and `luxid` binaries that sit
//! next to this executable on a fresh root under DIR (default: the temp
//! directory), with `max_running_jobs = 20`, and waits for each by
//! connecting (both bind their socket only once ready). luxid starts the
//! `job-runner` beside it, one process per job. Scenarios:
//! - `throughput`: 8 clients (one thread and connection each) submit
//!   10,000 one-opcode jobs in all, half `OP_EXEC /bin/true` and half
//!   `OP_TEST_DELAY 0.001`, interleaved, each client one `SubmitJob` at a
//!   time as fast as it is answered. The clock runs from the first submit
//!   to the moment the bench has seen every job final: jobs per second,
//!   and the submits per second of the submitting alone. The watching
//!   starts once every submit is answered and keeps the bench's own load
//!   small: one connection blocks in `WaitForJobChange` on the highest
//!   unfinished id (luxid starts jobs in id order, so it is among the last
//!   to end); once that job is final, or a wait passes a second unchanged,
//!   one `QueryJobs` of the ids not yet seen final prunes the list. Every
//!   job must end `success`.
//! - `latency`: an idle queue and one client; 200 jobs of
//!   `OP_TEST_DELAY 0.001`, each submitted once the one before is final.
//!   Received to started is the job's `start_ts - received_ts` (both written
//!   by the daemons). The notification latency is the client's wall clock
//!   when its blocked `WaitForJobChange` on `["status"]` returns the new
//!   status, minus the time of that change as the job records it: the
//!   opcode's `opexec` for `running`, its `opend` for `success` (the
//!   timestamp written with the change; the job's `end_ts` may be written
//!   by a later update of the file, and is checked to be no earlier once
//!   the runners are gone). Only waits sent before the change count (a wait
//!   sent after it is answered at once and says nothing about the
//!   notification).
//! - `restart`: 100,000 finished `OP_EXEC` jobs (two log lines each) are
//!   written straight into a fresh root's queue with warden's own job type
//!   and encoding, and synced (set-up, not measured; the files stay in the
//!   page cache, as for a daemon restart on a running machine). With wconfd
//!   up, luxid is started: the time from its spawn to its first
//!   `QueryJobs` reply, its resident memory then (VmRSS of
//!   /proc/<pid>/status, and its peak, VmHWM), and the round trip of a
//!   `QueryJobs` of one job (`["id", "status"]`) over 1,000 calls.
//! - `events`: one connection holds `WatchEvents [since,
//!   ["job.submitted"], 30]`, another submits a job of `OP_TEST_DELAY
//!   0.001`; the time from sending the `SubmitJob` to the watch's answer
//!   arriving (and the submit's own round trip beside it). `since` is where
//!   the last answer left off (the first from `[null, null, 0]`), so a
//!   watch that reaches luxid late cannot miss its event; each submit is
//!   sent [`WATCH_HOLD_PAUSE`] after its watch, which luxid has filed by
//!   then; both connections are waited on with one epoll. Jobs run
//!   meanwhile, as they would.
//! - `scheduling`: in-process, no daemon: luxid's queue core holding
//!   100 running jobs and the queued ones, with 100 filter rules (opcode,
//!   reason and jobid predicates, most matching nothing) and 10 ad-hoc
//!   buckets. Every queued job is held (a `PAUSE`, a full `RATE_LIMIT`
//!   or a full bucket) while 100 slots are free, so a scheduling pass
//!   (`Input::EndTurn`) looks at every one; and the reclassification of
//!   every job after a `ReplaceFilter` is written. Medians of 20.
//!
//! `--reporter`: once wconfd and luxid answer, a `warden reporter`
//! (beside this executable) is started on the root (its endpoint off:
//! `[metrics] listen = ""`) and elected before the scenario goes on; it
//! is stopped (SIGTERM, reaped) with the daemons. In `restart` it starts
//! once luxid has answered its first `QueryJobs`.
//!
//! As in wconfd-bench: the box is shared and noisy, so each scenario runs
//! several times and the summary shows medians. Every reply is checked
//! (ids handed out 1..N once each, statuses, timestamps, log serials never
//! resent, every job loaded after a restart): a wrong answer stops the
//! bench with an error (exit 1). A missed target is reported, not an error.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::harness::{
    self, Client, Daemon, POLL_PAUSE, PROCESS_TIMEOUT, Reporter, WatchSamples, Workspace,
    events_position, frame, fsync_cost, reporter_settings, wait_elected,
};
use super::{
    CommandLine, Context as BenchContext, Measure, Report, Target, Unit, counted, grouped,
    percentile, print_mode,
};
use super::{Error, RUNS_DEFAULT, Result, WithContext as _, age, fail, file_system};
use crate::bench;
use crate::jobs::opcode::{OP_EXEC, OP_TEST_DELAY, with_submit_reason};
use crate::jobs::{Job, JobId, LOG_MESSAGE, LogEntry, QueuedOpcode, Status, Timestamp};
use crate::liveness::job_livelock_name;
use crate::paths::{LIVELOCK_DIR, QUEUE_DIR, SETTINGS_FILE};
use crate::protocol::Request;
use crate::protocol::events::WatchEvents;
use crate::protocol::luxi::LuxiRequest;
use crate::queue::{Queue, encode_job, job_path};
use rayon::prelude::*;
use serde_json::{Value, json};

const USAGE: &str = "\
usage: luxid-bench [throughput|latency|restart|events|scheduling|why] [--runs N] [--quick] [--dir DIR]
                   [--runner PATH] [--reporter] [--filter-rules]
  --dir DIR      where the temporary roots go (default: the temp directory);
                 its file system's fsync cost bounds every submit
  --runner PATH  the job-runner luxid starts (its `runner_path` setting;
                 default: the one beside luxid)
  --reporter     a `warden reporter` (beside this executable) on every root once
                 the daemons answer, elected before measuring, stopped with them
  --filter-rules 100 job filter rules on every root (ReplaceFilter, once luxid
                 answers), each tried on every job, none applying to the
                 scenario's jobs";

// The targets of design/PERFORMANCE.md (the luxid issue).
const THROUGHPUT_JOBS_PER_SECOND_MIN: f64 = 360.0;
const RECEIVED_TO_STARTED_P50_SECONDS_MAX: f64 = 2.75e-3;
const NOTIFICATION_P50_SECONDS_MAX: f64 = 5e-3;
const RESTART_SECONDS_MAX: f64 = 2.0;
const RESTART_RSS_BYTES_MAX: f64 = 200.0 * 1024.0 * 1024.0;
const QUERY_P50_SECONDS_MAX: f64 = 1e-3;
const EVENT_P50_SECONDS_MAX: f64 = 5e-3;
const WHY_P99_SECONDS_MAX: f64 = 5e-3;

/// The rules of `--filter-rules`.
const THROUGHPUT_FILTER_RULES: usize = 100;

/// The settings of every root: the scheduler's limit of the targets.
const SETTINGS: &str = "[luxid]\nmax_running_jobs = 20\n";
/// Clients of `throughput`, each with its own thread and connection.
const THROUGHPUT_CLIENTS: usize = 8;
/// The duration of every `OP_TEST_DELAY` the bench submits, in seconds.
const DELAY_SECONDS: f64 = 0.001;

/// The `WaitForJobChange` timeout of `latency`: far above a job of 1 ms, so
/// a wait that times out means a stuck job (an error).
const LATENCY_WAIT_SECONDS: f64 = 10.0;
/// The `WaitForJobChange` timeout of the `throughput` watcher: after a
/// second without change of the highest unfinished job, the list of the
/// others is refreshed (which also tells a stalled queue).
const THROUGHPUT_WAIT_SECONDS: f64 = 1.0;
/// The `WatchEvents` timeout of `events`: far above any plausible delay,
/// so a timeout means a lost event (an error).
const WATCH_TIMEOUT: Duration = Duration::from_secs(30);
/// From sending a watch to sending the submit it waits for: luxid reads
/// and files a request in tens of microseconds.
const WATCH_HOLD_PAUSE: Duration = Duration::from_millis(1);
/// A queue in which no job ends for this long has stalled (an error).
const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Threads removing a run's job files (see [`remove_files_in_parallel`]).
const REMOVE_THREADS: usize = 32;
/// Bytes per append of the fsync probe: about one small job file.
const FSYNC_RECORD_BYTES: usize = 512;
/// Appends + syncs of the fsync probe, at most this many or this long.
const FSYNCS_MAX: usize = 200;
const FSYNC_TIME_MAX: Duration = Duration::from_millis(500);

/// The bench binary: its command line, its scenarios, its exit code.
pub fn main() -> ExitCode {
    bench::main("luxid-bench", USAGE, Options::parse, |options| {
        bench(&options)
    })
}

fn bench(options: &Options) -> Result<()> {
    let bench = Bench::new(options)?;
    print_context(&bench)?;
    options
        .shared
        .run(|scenario| run_scenario(scenario, &bench))
}

// ---------------------------------------------------------------------------
// Options and sizes

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Throughput,
    Latency,
    Restart,
    Events,
    Scheduling,
    Why,
}

impl bench::Scenario for Scenario {
    const ALL: &'static [Scenario] = &[
        Scenario::Throughput,
        Scenario::Latency,
        Scenario::Restart,
        Scenario::Events,
        Scenario::Scheduling,
        Scenario::Why,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Throughput => "throughput",
            Scenario::Latency => "latency",
            Scenario::Restart => "restart",
            Scenario::Events => "events",
            Scenario::Scheduling => "scheduling",
            Scenario::Why => "why",
        }
    }
}

impl Scenario {
    fn run(self, bench: &Bench) -> Result<Vec<Measure>> {
        match self {
            Scenario::Throughput => throughput(bench),
            Scenario::Latency => latency(bench),
            Scenario::Restart => restart(bench),
            Scenario::Events => events(bench),
            Scenario::Scheduling => Ok(scheduling(bench.sizes)),
            Scenario::Why => why(bench),
        }
    }
}

struct Options {
    shared: CommandLine<Scenario>,
    /// Parent of the temporary roots.
    dir: PathBuf,
    /// The runner luxid starts, if not the one beside it.
    runner: Option<PathBuf>,
    /// A reporter beside the daemons.
    reporter: bool,
    /// Filter rules on every root.
    filter_rules: bool,
}

impl Options {
    /// `None` for `--help`.
    fn parse(args: &[String]) -> std::result::Result<Option<Options>, String> {
        let mut dir = std::env::temp_dir();
        let mut runner = None;
        let mut reporter = false;
        let mut filter_rules = false;
        let shared = CommandLine::parse("luxid-bench", args, RUNS_DEFAULT, |arg, rest| {
            let mut value = || rest.next().ok_or(format!("{arg} needs a path"));
            match arg {
                "--dir" => dir = PathBuf::from(value()?),
                "--runner" => runner = Some(PathBuf::from(value()?)),
                "--reporter" => reporter = true,
                "--filter-rules" => filter_rules = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(shared.map(|shared| Options {
            shared,
            dir,
            runner,
            reporter,
            filter_rules,
        }))
    }
}

/// How much work each scenario does per run.
struct Sizes {
    /// Jobs submitted in all by the clients of `throughput`.
    throughput_jobs: usize,
    /// Jobs of `latency`, one after another.
    latency_jobs: usize,
    /// Finished jobs in the queue luxid restarts with.
    restart_jobs: usize,
    /// Round trips of the one-job `QueryJobs` after the restart.
    restart_queries: usize,
    /// Watched submits of `events`.
    event_samples: usize,
    /// Queued jobs of `scheduling`.
    scheduled_jobs: usize,
    /// Queued jobs, held locks and calls of `why`.
    why_queued_jobs: usize,
    why_held_locks: usize,
    why_calls: usize,
}

impl Sizes {
    const FULL: Sizes = Sizes {
        throughput_jobs: 10_000,
        latency_jobs: 200,
        restart_jobs: 100_000,
        restart_queries: 1_000,
        event_samples: 500,
        scheduled_jobs: 10_000,
        why_queued_jobs: 10_000,
        why_held_locks: 100_000,
        why_calls: 1_000,
    };

    /// A smoke run for CI: every code path and check, in a few seconds. Its
    /// figures mean nothing, so targets are not judged.
    const QUICK: Sizes = Sizes {
        throughput_jobs: 100,
        latency_jobs: 20,
        restart_jobs: 1_000,
        restart_queries: 100,
        event_samples: 20,
        scheduled_jobs: 500,
        why_queued_jobs: 200,
        why_held_locks: 2_000,
        why_calls: 50,
    };
}

/// What every scenario shares: the binaries, the scratch directory, the
/// sizes.
struct Bench {
    wconfd: PathBuf,
    luxid: PathBuf,
    /// Not started by the bench: luxid starts it (beside its own binary,
    /// or as `--runner` says).
    runner: PathBuf,
    /// `--runner`: written into each root's settings as `runner_path`.
    runner_setting: Option<PathBuf>,
    /// `--reporter`: `warden`, whose reporter runs beside the daemons.
    reporter: Option<PathBuf>,
    /// `--filter-rules`.
    filter_rules: bool,
    workspace: Workspace,
    sizes: &'static Sizes,
    runs: usize,
    quick: bool,
    command_line: String,
}

impl Bench {
    fn new(options: &Options) -> Result<Bench> {
        let exe = std::env::current_exe().context(|| "cannot find this executable".to_owned())?;
        let [wconfd, luxid, runner] = ["wconfd", "luxid", "job-runner"].map(|name| {
            let path = exe.with_file_name(name);
            if path.is_file() {
                Ok(path)
            } else {
                fail(format!(
                    "no {name} next to this executable ({}): build every binary \
                     (cargo build --release --bins)",
                    path.display()
                ))
            }
        });
        let reporter = if options.reporter {
            let warden = exe.with_file_name("warden");
            if !warden.is_file() {
                return fail(format!(
                    "no warden next to this executable ({}), whose reporter --reporter \
                     runs: build every binary (cargo build --release --bins)",
                    warden.display()
                ));
            }
            Some(warden)
        } else {
            None
        };
        let runner_setting = match &options.runner {
            Some(path) => Some(
                path.canonicalize()
                    .context(|| format!("no runner at {}", path.display()))?,
            ),
            None => None,
        };
        Ok(Bench {
            wconfd: wconfd?,
            luxid: luxid?,
            runner: runner_setting.clone().map_or(runner, Ok)?,
            runner_setting,
            reporter,
            filter_rules: options.filter_rules,
            workspace: Workspace::create(&options.dir, "luxid-bench")?,
            sizes: if options.shared.quick {
                &Sizes::QUICK
            } else {
                &Sizes::FULL
            },
            runs: options.shared.runs,
            quick: options.shared.quick,
            command_line: options.shared.text.clone(),
        })
    }
}

/// A path as a TOML basic string.
fn toml_string(path: &Path) -> String {
    serde_json::to_string(&path.to_string_lossy()).expect("a string always serialises")
}

// ---------------------------------------------------------------------------
// Scenario: throughput

fn throughput(bench: &Bench) -> Result<Vec<Measure>> {
    let jobs = bench.sizes.throughput_jobs;
    let mut cluster = Cluster::start(bench)?;
    let connections = (0..THROUGHPUT_CLIENTS)
        .map(|_| cluster.luxid.connect())
        .collect::<Result<Vec<_>>>()?;
    let mut watcher = cluster.luxid.connect()?;
    // Job index i is an OP_EXEC if even, an OP_TEST_DELAY if odd; client c
    // submits the indexes c, c + 8, c + 16, ...
    let frames = [
        submit_frame(&json!({"OP_ID": OP_EXEC, "argv": ["/bin/true"]})),
        submit_frame(&json!({"OP_ID": OP_TEST_DELAY, "duration": DELAY_SECONDS})),
    ];
    let barrier = Barrier::new(THROUGHPUT_CLIENTS);
    let submitted: Vec<Submitted> = thread::scope(|scope| {
        let workers: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(index, client)| {
                let (frames, barrier) = (&frames, &barrier);
                scope.spawn(move || submit_share(client, index, jobs, frames, barrier))
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let started = submitted
        .iter()
        .map(|share| share.first_sent)
        .min()
        .expect("there are clients");
    let submits_done = submitted
        .iter()
        .map(|share| share.last_answered)
        .max()
        .expect("there are clients");
    let mut ids: Vec<JobId> = submitted.into_iter().flat_map(|share| share.ids).collect();
    ids.sort_unstable();
    // A fresh queue hands out 1..=N, each once.
    if ids.iter().copied().ne(1..=jobs as JobId) {
        let duplicate = ids.windows(2).find(|pair| pair[0] == pair[1]);
        return fail(format!(
            "{} submits were answered with ids {}..{} (repeated: {duplicate:?}), \
             not 1..{jobs} once each",
            ids.len(),
            ids.first().unwrap_or(&0),
            ids.last().unwrap_or(&0),
        ));
    }
    let finished = watch_until_all_succeeded(&mut watcher, ids)?;
    cluster.stop()?;
    let seconds = |until: Instant| until.duration_since(started).as_secs_f64();
    Ok(vec![
        Measure::new(
            format!("jobs, first submit to all final ({THROUGHPUT_CLIENTS} clients)"),
            Unit::PerSecond,
            jobs as f64 / seconds(finished),
        )
        .with_target(Target::AtLeast(THROUGHPUT_JOBS_PER_SECOND_MIN)),
        Measure::new(
            "submits, first to last answered",
            Unit::PerSecond,
            jobs as f64 / seconds(submits_done),
        ),
        Measure::new(
            "last submit answered to all final",
            Unit::Seconds,
            finished.duration_since(submits_done).as_secs_f64(),
        ),
    ])
}

/// What one submitting client did.
struct Submitted {
    ids: Vec<JobId>,
    first_sent: Instant,
    last_answered: Instant,
}

/// One client of `throughput`: submits the job indexes `client`,
/// `client + THROUGHPUT_CLIENTS`, ... below `jobs`, one at a time, once
/// every client is ready.
fn submit_share(
    mut luxid: Client,
    client: usize,
    jobs: usize,
    frames: &[Vec<u8>; 2],
    barrier: &Barrier,
) -> Result<Submitted> {
    let mut ids = Vec::with_capacity(jobs / THROUGHPUT_CLIENTS + 1);
    barrier.wait();
    let first_sent = Instant::now();
    for index in (client..jobs).step_by(THROUGHPUT_CLIENTS) {
        let id = submitted_id(luxid.call(&frames[index % 2])?)
            .context(|| format!("SubmitJob of job index {index}"))?;
        ids.push(id);
    }
    Ok(Submitted {
        ids,
        first_sent,
        last_answered: Instant::now(),
    })
}

/// Waits until every job of `ids` is final, checking that each ended
/// `success`; answers the moment the last one was seen final. Blocks in
/// `WaitForJobChange` on the highest job not seen final; when it is final
/// (or a wait passed unchanged), one `QueryJobs` of the rest prunes them.
fn watch_until_all_succeeded(luxid: &mut Client, mut pending: Vec<JobId>) -> Result<Instant> {
    let mut last_progress = Instant::now();
    let mut watched: Option<Watch> = None;
    while let Some(&highest) = pending.last() {
        if watched.as_ref().is_none_or(|watch| watch.id != highest) {
            watched = Some(Watch::new(highest));
        }
        let watch = watched.as_mut().expect("just set");
        let change = watch.wait(luxid, THROUGHPUT_WAIT_SECONDS)?;
        if !change.status.is_final() && change.changed {
            continue;
        }
        let before = pending.len();
        pending = unfinished_of(luxid, &pending)?;
        if pending.len() < before {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > STALL_TIMEOUT {
            return fail(format!(
                "no job ended in {} s; {} still unfinished (job {highest} is {})",
                STALL_TIMEOUT.as_secs(),
                counted(pending.len(), "job"),
                change.status.name(),
            ));
        }
    }
    Ok(Instant::now())
}

/// The jobs of `ids` (ascending) that are not final yet; a job that ended
/// other than `success` is an error.
fn unfinished_of(luxid: &mut Client, ids: &[JobId]) -> Result<Vec<JobId>> {
    let rows = query_jobs(luxid, ids, &["id", "status"])?;
    let mut unfinished = Vec::new();
    for (&id, row) in ids.iter().zip(&rows) {
        let status = row_status(row, id)?;
        if !status.is_final() {
            unfinished.push(id);
        } else if status != Status::Success {
            return fail(format!(
                "job {id} ended {}: {}",
                status.name(),
                job_outcome(luxid, id)
            ));
        }
    }
    Ok(unfinished)
}

// ---------------------------------------------------------------------------
// Scenario: latency

fn latency(bench: &Bench) -> Result<Vec<Measure>> {
    let mut cluster = Cluster::start(bench)?;
    let mut luxid = cluster.luxid.connect()?;
    let frame = submit_frame(&json!({"OP_ID": OP_TEST_DELAY, "duration": DELAY_SECONDS}));
    let mut received_to_started = Vec::new();
    let mut to_running = Vec::new();
    let mut to_success = Vec::new();
    let mut submit_to_seen = Vec::new();
    let mut ids = Vec::with_capacity(bench.sizes.latency_jobs);
    for _ in 0..bench.sizes.latency_jobs {
        let submitted = Instant::now();
        let id = submitted_id(luxid.call(&frame)?).context(|| "SubmitJob".to_owned())?;
        // Every wait: (sent, answered, the status it answered).
        let mut waits = Vec::new();
        let mut watch = Watch::new(id);
        loop {
            let sent = SystemTime::now();
            let change = watch.wait(&mut luxid, LATENCY_WAIT_SECONDS)?;
            waits.push((sent, SystemTime::now(), change.status));
            if !change.changed {
                return fail(format!(
                    "job {id} stayed {} for {LATENCY_WAIT_SECONDS} s",
                    change.status.name()
                ));
            }
            if change.status.is_final() {
                break;
            }
        }
        submit_to_seen.push(submitted.elapsed().as_secs_f64());
        ids.push(id);
        let fields = ["status", "received_ts", "start_ts", "opexec", "opend"];
        let row = query_jobs(&mut luxid, &[id], &fields)?.remove(0);
        let status = row_status(&row, id)?;
        if status != Status::Success {
            return fail(format!(
                "job {id} ended {}: {}",
                status.name(),
                job_outcome(&mut luxid, id)
            ));
        }
        let stamp = |index: usize, value: &Value| {
            timestamp_micros(value).context(|| format!("job {id}'s {}", fields[index]))
        };
        let received = stamp(1, &row[1])?;
        let started = stamp(2, &row[2])?;
        let executed = stamp(3, &row[3][0])?;
        let ended = stamp(4, &row[4][0])?;
        if !(received <= started && started <= executed && executed <= ended) {
            return fail(format!(
                "job {id}'s times are out of order: received {received}, started {started}, \
                 opexec {executed}, opend {ended} (us since the epoch)"
            ));
        }
        received_to_started.push(micros_to_seconds(started - received));
        // A notification counts only if its wait was sent before the change.
        for (sent, answered, status) in waits {
            let (changed, samples) = match status {
                Status::Running => (executed, &mut to_running),
                Status::Success => (ended, &mut to_success),
                _ => continue,
            };
            if unix_micros(sent) < changed {
                samples.push(micros_to_seconds(unix_micros(answered) - changed));
            }
        }
    }
    // Once its runner is gone, every job has ended no earlier than its
    // opcode.
    cluster.wait_for_runners()?;
    let rows = query_jobs(&mut luxid, &ids, &["id", "end_ts", "opend"])?;
    for (&id, row) in ids.iter().zip(&rows) {
        let ended = timestamp_micros(&row[1]).context(|| format!("job {id}'s end_ts"))?;
        let opend = timestamp_micros(&row[2][0]).context(|| format!("job {id}'s opend"))?;
        if row[0] != json!(id) || ended < opend {
            return fail(format!("job {id} ended before its opcode: {row}"));
        }
    }
    cluster.stop()?;
    let jobs = bench.sizes.latency_jobs;
    if to_running.len() < jobs || to_success.len() < jobs {
        // Progress, not a figure: the client was busy when these changed.
        eprintln!(
            "   latency: waited for {} of {jobs} changes to running, {} to success",
            to_running.len(),
            to_success.len()
        );
    }
    let mut notifications: Vec<f64> = to_running.iter().chain(&to_success).copied().collect();
    for (samples, what) in [
        (&mut notifications, "status change"),
        (&mut to_running, "change to running"),
        (&mut to_success, "change to success"),
    ] {
        if samples.is_empty() {
            return fail(format!(
                "no {what} of {} was waited for before it happened \
                 (every wait was answered at once)",
                counted(bench.sizes.latency_jobs, "job")
            ));
        }
    }
    let mut figures = Vec::new();
    let mut both = |label: &str, mut samples: Vec<f64>, p50_max: Option<f64>| {
        samples.sort_by(f64::total_cmp);
        let p50 = Measure::new(
            format!("p50 {label}"),
            Unit::Seconds,
            percentile(&samples, 0.50),
        );
        figures.push(match p50_max {
            Some(max) => p50.with_target(Target::Below(max)),
            None => p50,
        });
        figures.push(Measure::new(
            format!("p99 {label}"),
            Unit::Seconds,
            percentile(&samples, 0.99),
        ));
    };
    both(
        "received to started (start_ts - received_ts)",
        received_to_started,
        Some(RECEIVED_TO_STARTED_P50_SECONDS_MAX),
    );
    both(
        "notification, running + success",
        notifications,
        Some(NOTIFICATION_P50_SECONDS_MAX),
    );
    both("notification, running (opexec)", to_running, None);
    both("notification, success (opend)", to_success, None);
    both("submit to success seen", submit_to_seen, None);
    Ok(figures)
}

/// One job followed with `WaitForJobChange` on `["status"]`: the values and
/// the log serial the client has seen so far.
struct Watch {
    id: JobId,
    /// `null` before the first answer (which is then immediate).
    previous: Value,
    log_serial: u64,
}

/// What one `WaitForJobChange` answered.
struct Change {
    status: Status,
    /// False when the wait timed out with nothing new.
    changed: bool,
}

impl Watch {
    fn new(id: JobId) -> Watch {
        Watch {
            id,
            previous: Value::Null,
            log_serial: 0,
        }
    }

    /// One `WaitForJobChange`; checks the answer's shape, its status and
    /// that no log entry the client has is sent again.
    fn wait(&mut self, luxid: &mut Client, timeout_seconds: f64) -> Result<Change> {
        let id = self.id;
        let frame = frame(
            &LuxiRequest::WaitForJobChange {
                id,
                fields: vec!["status"],
                previous: self.previous.clone(),
                log_serial: self.log_serial,
                timeout: Duration::from_secs_f64(timeout_seconds),
            }
            .encode(),
        );
        let answer = result_of(luxid.call(&frame)?).context(|| format!("waiting for job {id}"))?;
        let shape =
            || format!("WaitForJobChange of job {id} answered {answer}, not [[status], [log]]");
        let (Some(values), Some(log)) = (
            answer
                .get(0)
                .filter(|values| values.as_array().is_some_and(|v| v.len() == 1)),
            answer.get(1).and_then(Value::as_array),
        ) else {
            return fail(shape());
        };
        let Some(status) = values[0].as_str().and_then(Status::parse) else {
            return fail(shape());
        };
        let mut changed = *values != self.previous || status.is_final();
        for entry in log {
            let serial = entry.get(0).and_then(Value::as_u64).unwrap_or(0);
            if serial <= self.log_serial {
                return fail(format!(
                    "WaitForJobChange of job {id} sent log entry {entry} again \
                     (the client had serials up to {})",
                    self.log_serial
                ));
            }
            self.log_serial = serial;
            changed = true;
        }
        self.previous = values.clone();
        Ok(Change { status, changed })
    }
}

// ---------------------------------------------------------------------------
// Scenario: restart

fn restart(bench: &Bench) -> Result<Vec<Measure>> {
    let sizes = bench.sizes;
    let mut cluster = Cluster::create(bench)?;
    let queue_bytes = fill_queue(&cluster.root, sizes.restart_jobs)?;
    cluster.wconfd.spawn()?;

    let spawned = Instant::now();
    cluster.luxid.spawn_process()?;
    let mut luxid = cluster.luxid.wait_ready()?;
    query_jobs(&mut luxid, &[1], &["id", "status"])
        .and_then(|rows| expect_success_row(&rows, 1))
        .map_err(|error| Error(format!("the first QueryJobs after the restart: {error}")))?;
    let ready = spawned.elapsed();
    cluster.attach_reporter()?;
    let pid = cluster.luxid.pid();
    let rss = memory_bytes(pid, "VmRSS")?;
    let peak = memory_bytes(pid, "VmHWM")?;

    // Jobs spread over the whole queue, each asked for alone.
    let jobs = sizes.restart_jobs as JobId;
    let stride = 7_919 % jobs.max(2);
    let mut rtts = Vec::with_capacity(sizes.restart_queries);
    for call in 0..sizes.restart_queries as JobId {
        let id = 1 + (call * stride) % jobs;
        let frame = frame(
            &LuxiRequest::QueryJobs {
                ids: Some(vec![id]),
                fields: vec!["id", "status"],
            }
            .encode(),
        );
        let sent = Instant::now();
        let reply = luxid.call(&frame)?;
        let elapsed = sent.elapsed();
        // luxid's exact bytes first: the bench's own parsing stays off
        // the figure, anything else is parsed.
        if reply != format!(r#"{{"success":true,"result":[[{id},"success"]]}}"#).as_bytes() {
            let rows = result_of(reply)?;
            expect_success_row(rows.as_array().map_or(&[], Vec::as_slice), id)
                .map_err(|error| Error(format!("QueryJobs of job {id}: {error}")))?;
        }
        rtts.push(elapsed.as_secs_f64());
    }
    // Every job came back.
    let all = luxid.result(
        &LuxiRequest::QueryJobs {
            ids: None,
            fields: vec!["id"],
        }
        .encode(),
    )?;
    let loaded = all.as_array().map_or(0, Vec::len);
    if loaded != sizes.restart_jobs {
        return fail(format!(
            "luxid lists {loaded} jobs after the restart, {} were in the queue",
            sizes.restart_jobs
        ));
    }
    cluster.stop()?;
    rtts.sort_by(f64::total_cmp);
    let held = counted(sizes.restart_jobs, "finished job");
    Ok(vec![
        Measure::new(
            format!("spawn to first QueryJobs reply, {held}"),
            Unit::Seconds,
            ready.as_secs_f64(),
        )
        .with_target(Target::Below(RESTART_SECONDS_MAX)),
        Measure::new("luxid's VmRSS then", Unit::Bytes, rss as f64)
            .with_target(Target::Below(RESTART_RSS_BYTES_MAX)),
        Measure::new("luxid's VmHWM (peak) then", Unit::Bytes, peak as f64),
        Measure::new("job files read at start", Unit::Bytes, queue_bytes as f64),
        Measure::new(
            "p50 QueryJobs of one job, round trip",
            Unit::Seconds,
            percentile(&rtts, 0.50),
        )
        .with_target(Target::Below(QUERY_P50_SECONDS_MAX)),
        Measure::new(
            "p99 QueryJobs of one job, round trip",
            Unit::Seconds,
            percentile(&rtts, 0.99),
        ),
    ])
}

/// Writes `jobs` finished jobs into the queue of `root` (in parallel), as
/// luxid and the runner would have left them, then syncs the file system
/// so no write-back runs under the measurement. Answers the bytes written.
fn fill_queue(root: &Path, jobs: usize) -> Result<u64> {
    let (mut queue, loaded) =
        Queue::open(root).context(|| format!("cannot open the queue of {}", root.display()))?;
    if !loaded.jobs.is_empty() {
        return fail(format!("the fresh root {} has jobs", root.display()));
    }
    let ids: Vec<JobId> = (0..jobs).map(|_| queue.next_id()).collect();
    let livelock_dir = root.join(LIVELOCK_DIR);
    let queue_dir = queue.dir();
    let now = Timestamp::now();
    let bytes = ids
        .par_iter()
        .map(|&id| {
            let bytes = encode_job(&finished_job(id, &livelock_dir, now));
            let path = job_path(queue_dir, id);
            fs::write(&path, &bytes)
                .map(|()| bytes.len() as u64)
                .context(|| format!("cannot write {}", path.display()))
        })
        .try_reduce(|| 0, |a, b| Ok(a + b))?;
    // No new job: writes the serial and syncs the directory.
    queue
        .commit_new(&[])
        .context(|| "cannot write the queue's serial".to_owned())?;
    let dir = File::open(queue_dir).context(|| format!("cannot open {}", queue_dir.display()))?;
    nix::unistd::syncfs(&dir).context(|| format!("cannot sync {}", queue_dir.display()))?;
    Ok(bytes)
}

/// A job as a runner leaves it after `OP_EXEC` of a small script that wrote
/// two lines: job `id` was received a day before `now` plus `id` ms.
fn finished_job(id: JobId, livelock_dir: &Path, now: Timestamp) -> Job {
    const DAY_MICROS: u64 = 86_400 * 1_000_000;
    let micros = now.0 * 1_000_000 + now.1 - DAY_MICROS + id * 1_000;
    let at = |offset: u64| Timestamp((micros + offset) / 1_000_000, (micros + offset) % 1_000_000);
    let submitted = json!({
        "OP_ID": OP_EXEC,
        "argv": ["/bin/sh", "-c", "echo copying; echo done"],
    });
    let input = with_submit_reason(&submitted, id, 0, u128::from(micros) * 1_000);
    let line = |serial: u64, offset: u64, text: &str| {
        LogEntry(serial, at(offset), LOG_MESSAGE.to_owned(), json!(text))
    };
    let mut opcode = QueuedOpcode::new(input, 0);
    opcode.status = Status::Success;
    opcode.result = json!({"exit_code": 0, "signal": null, "duration": 0.003_1});
    opcode.log = vec![line(1, 2_100, "copying"), line(2, 4_300, "done")];
    opcode.start_timestamp = Some(at(1_200));
    opcode.exec_timestamp = Some(at(1_500));
    opcode.end_timestamp = Some(at(4_700));
    Job {
        id,
        ops: vec![opcode],
        received_timestamp: Some(at(0)),
        start_timestamp: Some(at(900)),
        end_timestamp: Some(at(4_800)),
        livelock: Some(
            livelock_dir
                .join(job_livelock_name(id, at(0).0))
                .to_string_lossy()
                .into_owned(),
        ),
        process_id: Some(10_000 + (id % 50_000) as u32),
        workers: Vec::new(),
    }
}

/// A line of /proc/<pid>/status in bytes (`VmRSS:   1234 kB`).
fn memory_bytes(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).context(|| format!("cannot read {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| Error(format!("no {field} in kB in {path}")))
}

// ---------------------------------------------------------------------------
// Scenario: events

fn events(bench: &Bench) -> Result<Vec<Measure>> {
    let mut cluster = Cluster::start(bench)?;
    let mut submitter = cluster.luxid.connect()?;
    let mut watcher = cluster.luxid.connect()?;
    let submit = submit_frame(&json!({"OP_ID": OP_TEST_DELAY, "duration": DELAY_SECONDS}));
    let mut since = events_position(&mut watcher, watch_request)?;
    let samples = bench.sizes.event_samples;
    let mut watched_samples = WatchSamples::default();
    for sample in 0..samples {
        let watch = frame(&watch_request(WatchEvents {
            since: Some(since),
            types: Some(vec!["job.submitted".to_owned()]),
            timeout: WATCH_TIMEOUT,
        }));
        let watched = harness::watch_change(
            &mut watcher,
            &watch,
            &mut submitter,
            &submit,
            WATCH_HOLD_PAUSE,
        )
        .context(|| format!("sample {sample} of {samples}"))?;
        let id = submitted_id(&watched.reply).context(|| "SubmitJob".to_owned())?;
        let (events, next) = harness::watch_answer(&watched.answer)?;
        match events {
            [event] if event["type"] == "job.submitted" && event["id"] == id => {}
            _ => {
                return fail(format!(
                    "the watch for job {id}'s submission answered {}",
                    short(&watched.answer)
                ));
            }
        }
        since = next;
        watched_samples.add(watched.sent, watched.replied, watched.answered);
    }
    cluster.stop()?;
    Ok(watched_samples.figures("SubmitJob", EVENT_P50_SECONDS_MAX))
}

/// `why`: see the module documentation.
fn why(bench: &Bench) -> Result<Vec<Measure>> {
    let sizes = bench.sizes;
    let mut cluster = Cluster::start(bench)?;
    let mut luxid = cluster.luxid.connect()?;
    let mut wconfd = cluster.wconfd.connect()?;
    // This process is the owner holding the locks: it holds its livelock.
    let livelock_dir = cluster.root.join(crate::paths::LIVELOCK_DIR);
    let livelock = crate::liveness::Livelock::create(&livelock_dir, "job_999999_1")
        .context(|| "cannot take the holder's livelock".to_owned())?;
    let owner = json!([
        999_999,
        livelock_dir.join("job_999999_1"),
        std::process::id()
    ]);
    let lock = |index: usize| format!("instance/why-{index:06}");
    for chunk in (0..sizes.why_held_locks).collect::<Vec<_>>().chunks(1_000) {
        let entries: Vec<Value> = chunk
            .iter()
            .map(|&index| json!([lock(index), "exclusive"]))
            .collect();
        let request = Request {
            method: "tryUpdateLocks".to_owned(),
            args: vec![owner.clone(), Value::Array(entries)],
        };
        let blockers = result_of(wconfd.call(&frame(&request))?)?;
        if blockers != json!([]) {
            return fail(format!("the holder's locks were not granted: {blockers}"));
        }
    }
    let submit = |luxid: &mut harness::Client, op: Value| -> Result<u64> {
        submitted_id(luxid.call(&frame(
            &LuxiRequest::SubmitJob { ops: json!([op]) }.encode(),
        ))?)
    };
    let waiting = submit(
        &mut luxid,
        json!({"OP_ID": OP_EXEC, "argv": ["/bin/true"], "locks": [[lock(0), "exclusive"]]}),
    )?;
    let rule = Request {
        method: "ReplaceFilter".to_owned(),
        args: vec![
            Value::Null,
            json!(0),
            json!([["jobid", [">", "id", "watermark"]]]),
            json!("PAUSE"),
            json!([]),
        ],
    };
    result_of(luxid.call(&frame(&rule))?)?;
    let dependent = submit(
        &mut luxid,
        json!({"OP_ID": OP_TEST_DELAY, "duration": DELAY_SECONDS, "depends": [[waiting, []]]}),
    )?;
    let delay = json!([{"OP_ID": OP_TEST_DELAY, "duration": DELAY_SECONDS}]);
    let mut left = sizes.why_queued_jobs.saturating_sub(1);
    while left > 0 {
        let batch = left.min(crate::limits::SUBMIT_MANY_JOBS_MAX);
        let request = LuxiRequest::SubmitManyJobs {
            jobs: vec![delay.clone(); batch],
        }
        .encode();
        result_of(luxid.call(&frame(&request))?)?;
        left -= batch;
    }
    let paused = dependent + 1;
    // The waiting job's runner has filed its request.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let request = LuxiRequest::WhyJob { id: waiting }.encode();
        let answer = result_of(luxid.call(&frame(&request))?)?;
        if answer["reasons"][0]["waits"][0]["blockers"][0]["owner"][0] == 999_999 {
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "job {waiting} never waited for the holder: {answer}"
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
    let mut samples: [Vec<f64>; 3] = Default::default();
    for call in 0..sizes.why_calls * 3 {
        let (which, id) = match call % 3 {
            0 => (0, waiting),
            1 => (1, dependent),
            _ => (2, paused),
        };
        let request = frame(&LuxiRequest::WhyJob { id }.encode());
        let started = Instant::now();
        let answer = result_of(luxid.call(&request)?)?;
        samples[which].push(started.elapsed().as_secs_f64());
        let expected = ["locks", "dependency", "filter"][which];
        if answer["reasons"][0]["kind"] != expected {
            return fail(format!(
                "WhyJob of job {id} answered {answer}, not {expected} first"
            ));
        }
    }
    // Let the waiting job run, so that the cluster stops.
    let free = Request {
        method: "freeLocks".to_owned(),
        args: vec![owner],
    };
    result_of(wconfd.call(&frame(&free))?)?;
    livelock
        .release()
        .context(|| "cannot remove the holder's livelock".to_owned())?;
    cluster.stop()?;
    let mut measures = Vec::new();
    for (samples, what) in samples.iter_mut().zip([
        "a job waiting for a lock",
        "a job depending on it",
        "a paused job",
    ]) {
        samples.sort_by(f64::total_cmp);
        measures.push(Measure::new(
            format!("WhyJob of {what}, p50"),
            Unit::Seconds,
            bench::percentile(samples, 0.5),
        ));
        measures.push(
            Measure::new(
                format!("WhyJob of {what}, p99"),
                Unit::Seconds,
                bench::percentile(samples, 0.99),
            )
            .with_target(Target::Below(WHY_P99_SECONDS_MAX)),
        );
    }
    Ok(measures)
}

/// `WatchEvents` as a request.
fn watch_request(watch: WatchEvents) -> Request {
    LuxiRequest::WatchEvents(watch).encode()
}

// ---------------------------------------------------------------------------
// Daemons

/// wconfd and luxid on a fresh root of their own. Both are killed and the
/// root removed when this is dropped.
struct Cluster {
    /// Holds the root and the daemons' logs.
    dir: PathBuf,
    root: PathBuf,
    wconfd: Daemon,
    luxid: Daemon,
    /// `--reporter`: started by [`Cluster::attach_reporter`].
    reporter: Option<Reporter>,
    /// `--filter-rules`: added once luxid answers.
    filter_rules: bool,
}

impl Cluster {
    /// A fresh root with the bench's settings; no daemon runs yet.
    fn create(bench: &Bench) -> Result<Cluster> {
        let dir = bench.workspace.next_run_dir();
        let root = dir.join("root");
        fs::create_dir_all(&root).context(|| format!("cannot create {}", root.display()))?;
        let settings = root.join(SETTINGS_FILE);
        let mut text = SETTINGS.to_owned();
        if let Some(runner) = &bench.runner_setting {
            text.push_str(&format!("runner_path = {}\n", toml_string(runner)));
        }
        if bench.reporter.is_some() {
            text.push_str(&reporter_settings(""));
        }
        fs::write(&settings, text).context(|| format!("cannot write {}", settings.display()))?;
        let reporter = bench
            .reporter
            .as_ref()
            .map(|warden| Reporter::new(warden, &root, dir.join("reporter.log")));
        Ok(Cluster {
            wconfd: daemon("wconfd", &bench.wconfd, &dir, &root),
            luxid: daemon("luxid", &bench.luxid, &dir, &root),
            reporter,
            filter_rules: bench.filter_rules,
            root,
            dir,
        })
    }

    /// A fresh root with wconfd and luxid answering (and the reporter
    /// elected, with `--reporter`).
    fn start(bench: &Bench) -> Result<Cluster> {
        let mut cluster = Cluster::create(bench)?;
        cluster.wconfd.spawn()?;
        cluster.luxid.spawn()?;
        cluster.attach_reporter()?;
        cluster.add_filter_rules()?;
        Ok(cluster)
    }

    /// With `--filter-rules`: [`THROUGHPUT_FILTER_RULES`] rules, none of
    /// which applies to a job of the scenarios, so each is tried on each.
    fn add_filter_rules(&mut self) -> Result<()> {
        if !self.filter_rules {
            return Ok(());
        }
        let mut luxid = self.luxid.connect()?;
        for index in 0..THROUGHPUT_FILTER_RULES {
            let predicates = match index % 3 {
                0 => json!([["reason", ["=", "reason", format!("no such reason {index}")]]]),
                1 => json!([["opcode", ["=", "OP_ID", format!("OP_NONE_{index}")]]]),
                _ => json!([
                    ["jobid", [">", "id", 0]],
                    ["opcode", ["=~", "comment", format!("^nothing-{index}$")]]
                ]),
            };
            let action = match index % 4 {
                0 => json!("PAUSE"),
                1 => json!("REJECT"),
                2 => json!(["RATE_LIMIT", 1]),
                _ => json!("ACCEPT"),
            };
            let request = crate::protocol::Request {
                method: "ReplaceFilter".to_owned(),
                args: vec![
                    Value::Null,
                    json!(index % 10),
                    predicates,
                    action,
                    json!([]),
                ],
            };
            result_of(luxid.call(&frame(&request))?)
                .context(|| format!("ReplaceFilter of rule {index}"))?;
        }
        Ok(())
    }

    /// With `--reporter`: starts the reporter and waits until it is
    /// elected (the daemons answer already).
    fn attach_reporter(&mut self) -> Result<()> {
        if let Some(reporter) = &mut self.reporter {
            reporter.spawn()?;
            wait_elected(&mut self.wconfd.connect()?, reporter)?;
        }
        Ok(())
    }

    /// Waits until no runner is left, then stops the reporter, luxid and
    /// wconfd.
    fn stop(&mut self) -> Result<()> {
        self.wait_for_runners()?;
        if let Some(reporter) = &mut self.reporter {
            reporter.stop()?;
        }
        self.luxid.stop()?;
        self.wconfd.stop()
    }

    /// Waits until every job livelock is gone: a runner removes its own
    /// before it exits.
    fn wait_for_runners(&self) -> Result<()> {
        let livelocks = self.root.join(LIVELOCK_DIR);
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            let left: Vec<String> = fs::read_dir(&livelocks)
                .context(|| format!("cannot list {}", livelocks.display()))?
                .flatten()
                .filter_map(|entry| entry.file_name().into_string().ok())
                .filter(|name| name.starts_with("job_"))
                .collect();
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "every job is final but {} livelocks are still there after {} s \
                     (runners not gone?), e.g. {}",
                    left.len(),
                    PROCESS_TIMEOUT.as_secs(),
                    left[0]
                ));
            }
            thread::sleep(POLL_PAUSE);
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(reporter) = &mut self.reporter {
            let _ = reporter.kill();
        }
        let _ = self.luxid.kill();
        let _ = self.wconfd.kill();
        remove_files_in_parallel(&self.root.join(QUEUE_DIR));
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One of a cluster's daemons: `<binary> --root <root>`, its log in `dir`.
fn daemon(name: &'static str, binary: &Path, dir: &Path, root: &Path) -> Daemon {
    Daemon::new(
        name,
        binary,
        "--root",
        root,
        root.join("socket").join(format!("{name}.sock")),
        dir.join(format!("{name}.log")),
    )
}

/// Removes the files of `dir` (best effort), [`REMOVE_THREADS`] at a time:
/// on a file system mounted with `discard` each unlink waits for the device
/// to discard the file's blocks (about 3 ms here), so only overlapping them
/// clears a queue of 100,000 job files in seconds rather than minutes.
fn remove_files_in_parallel(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let paths: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
    let Ok(pool) = rayon::ThreadPoolBuilder::new()
        .num_threads(REMOVE_THREADS)
        .build()
    else {
        return;
    };
    pool.install(|| {
        paths.par_iter().for_each(|path| {
            let _ = fs::remove_file(path);
        });
    });
}

// ---------------------------------------------------------------------------
// Client side of the protocol

/// `SubmitJob` of a job of one opcode.
fn submit_frame(opcode: &Value) -> Vec<u8> {
    frame(
        &LuxiRequest::SubmitJob {
            ops: json!([opcode]),
        }
        .encode(),
    )
}

/// The result of a reply of either daemon.
fn result_of(reply: &[u8]) -> Result<Value> {
    harness::result_of("the daemon", reply)
}

/// The job id a `SubmitJob` answered.
fn submitted_id(reply: &[u8]) -> Result<JobId> {
    // luxid's exact bytes parsed by hand, so the submitting clients' own
    // CPU stays off the figures; anything else is parsed.
    let quick = reply
        .strip_prefix(br#"{"success":true,"result":"#)
        .and_then(|rest| rest.strip_suffix(b"}"))
        .and_then(|digits| std::str::from_utf8(digits).ok())
        .and_then(|digits| digits.parse::<JobId>().ok());
    if let Some(id) = quick.filter(|&id| id > 0) {
        return Ok(id);
    }
    match result_of(reply)? {
        Value::Number(id) if id.as_u64().is_some_and(|id| id > 0) => {
            Ok(id.as_u64().expect("just checked"))
        }
        other => fail(format!("expected a job id, got {other}")),
    }
}

/// `QueryJobs` of `ids` and `fields`: one row per id, in order, each with
/// one value per field.
fn query_jobs(luxid: &mut Client, ids: &[JobId], fields: &[&'static str]) -> Result<Vec<Value>> {
    let frame = frame(
        &LuxiRequest::QueryJobs {
            ids: Some(ids.to_vec()),
            fields: fields.to_vec(),
        }
        .encode(),
    );
    let rows = result_of(luxid.call(&frame)?)?;
    match rows {
        Value::Array(rows)
            if rows.len() == ids.len()
                && rows
                    .iter()
                    .all(|row| row.as_array().is_some_and(|row| row.len() == fields.len())) =>
        {
            Ok(rows)
        }
        other => fail(format!(
            "QueryJobs of {} and {} fields answered {}",
            counted(ids.len(), "id"),
            fields.len(),
            short(&other)
        )),
    }
}

/// The status of a row whose first value is the status, or whose values
/// are `[id, status]` with `id` as expected.
fn row_status(row: &Value, id: JobId) -> Result<Status> {
    let status = match row.get(0) {
        Some(Value::Number(number)) if number.as_u64() == Some(id) => row.get(1),
        Some(Value::Number(_)) => return fail(format!("QueryJobs of job {id} answered {row}")),
        first => first,
    };
    status
        .and_then(Value::as_str)
        .and_then(Status::parse)
        .ok_or_else(|| Error(format!("job {id}'s row {row} has no status")))
}

/// Checks that `rows` is `[[id, "success"]]`.
fn expect_success_row(rows: &[Value], id: JobId) -> Result<()> {
    match rows {
        [row] if *row == json!([id, "success"]) => Ok(()),
        _ => fail(format!(
            "expected [[{id}, \"success\"]], got {}",
            short(&json!(rows))
        )),
    }
}

/// How a job ended, for an error message: its opcodes' statuses and results.
fn job_outcome(luxid: &mut Client, id: JobId) -> String {
    match query_jobs(luxid, &[id], &["opstatus", "opresult"]) {
        Ok(rows) => rows[0].to_string(),
        Err(error) => format!("(cannot ask: {error})"),
    }
}

/// `[secs, usecs]` as microseconds since the epoch.
fn timestamp_micros(value: &Value) -> Result<i64> {
    match value.as_array().map(Vec::as_slice) {
        Some([secs, usecs]) => match (secs.as_i64(), usecs.as_i64()) {
            (Some(secs), Some(usecs)) if (0..1_000_000).contains(&usecs) => {
                Ok(secs * 1_000_000 + usecs)
            }
            _ => fail(format!("{value} is not [secs, usecs]")),
        },
        _ => fail(format!("{value} is not [secs, usecs]")),
    }
}

/// The bench's wall clock, as the daemons write timestamps.
fn unix_micros(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as i64)
}

fn micros_to_seconds(micros: i64) -> f64 {
    micros as f64 / 1e6
}

/// A value for an error message, cut short.
fn short(value: &Value) -> String {
    const CHARS: usize = 300;
    let text = value.to_string();
    match text.char_indices().nth(CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

// ---------------------------------------------------------------------------
// Runs (measures and reports: crate::bench)

fn run_scenario(scenario: Scenario, bench: &Bench) -> Result<Report> {
    let description = describe(scenario, bench.sizes);
    bench::run_scenario(scenario, &description, bench.runs, || scenario.run(bench))
}

fn describe(scenario: Scenario, sizes: &Sizes) -> String {
    match scenario {
        Scenario::Scheduling => format!(
            "in-process, luxid's queue core: {} queued jobs (one opcode each, a third in one \
             of 10 rate-limit\n   buckets), {SCHEDULING_RUNNING} running, room for \
             {SCHEDULING_RUNNING} more, {SCHEDULING_RULES} filter rules (opcode, reason and \
             jobid\n   predicates; each queued job held by a PAUSE, a full RATE_LIMIT or a full \
             bucket, so a pass looks\n   at every one); a scheduling pass (EndTurn), and the \
             reclassification after a ReplaceFilter,\n   median of {SCHEDULING_PASSES}",
            sizes.scheduled_jobs
        ),
        Scenario::Why => format!(
            "{} queued jobs (held by a PAUSE rule), {} locks held by one owner; one job waits \
             for one of them,\n   one queued job depends on it; WhyJob of each and of a paused \
             job, {} calls each, one at a time",
            sizes.why_queued_jobs, sizes.why_held_locks, sizes.why_calls
        ),
        Scenario::Throughput => format!(
            "{THROUGHPUT_CLIENTS} clients (thread + connection each) submit {} jobs in all, \
             one SubmitJob at a time,\n   half OP_EXEC /bin/true, half OP_TEST_DELAY \
             {DELAY_SECONDS} s, interleaved; max_running_jobs 20;\n   jobs/s from the \
             first submit until every job is seen final (one watcher: WaitForJobChange on \
             the\n   highest unfinished job, then one QueryJobs of the rest); every job \
             must end success",
            grouped(sizes.throughput_jobs as u64)
        ),
        Scenario::Latency => format!(
            "one client on an idle queue, {} jobs of OP_TEST_DELAY {DELAY_SECONDS} s, each \
             submitted once the last is final;\n   received to started = start_ts - \
             received_ts; notification = the client's clock when its blocked\n   \
             WaitForJobChange [\"status\"] answers, minus opexec (running) or opend \
             (success); waits sent\n   after the change are not counted",
            grouped(sizes.latency_jobs as u64)
        ),
        Scenario::Restart => format!(
            "{} finished OP_EXEC jobs (2 log lines each) written into a fresh queue and \
             synced; wconfd up;\n   luxid's spawn to its first QueryJobs reply, its \
             VmRSS then; {} QueryJobs of one job\n   ([\"id\", \"status\"], ids spread \
             over the queue), every reply checked, then a QueryJobs of all",
            grouped(sizes.restart_jobs as u64),
            grouped(sizes.restart_queries as u64),
        ),
        Scenario::Events => format!(
            "one connection holds WatchEvents [since, [\"job.submitted\"], 30] (since: where \
             the last answer ended),\n   another submits, {} later, a job of OP_TEST_DELAY \
             {DELAY_SECONDS} s: time from sending the SubmitJob\n   to the watch's answer \
             arriving (that job's job.submitted); {} samples, jobs left to run",
            Unit::Seconds.format(WATCH_HOLD_PAUSE.as_secs_f64()),
            grouped(sizes.event_samples as u64),
        ),
    }
}

// ---------------------------------------------------------------------------
// Output

/// What a figure needs beside it to mean something later: the machine, the
/// code, the binaries, the file system under the roots and the load.
fn print_context(bench: &Bench) -> Result<()> {
    let context = BenchContext::read();
    let fsync = fsync_cost(
        &bench.workspace.dir,
        FSYNC_RECORD_BYTES,
        FSYNCS_MAX,
        FSYNC_TIME_MAX,
    )?;
    context.print(
        "luxid-bench: the real luxid, wconfd and job runners over LUXI, one fresh root per run",
        &bench.command_line,
    );
    for (name, path) in [
        ("wconfd", &bench.wconfd),
        ("luxid", &bench.luxid),
        ("runner", &bench.runner),
    ] {
        println!("{name:<8}: {} (built {})", path.display(), age(path));
    }
    match &bench.reporter {
        Some(warden) => println!(
            "reporter: {} reporter (built {}), [metrics] listen = \"\"",
            warden.display(),
            age(warden)
        ),
        None => println!("reporter: none"),
    }
    println!(
        "roots   : {} ({})",
        bench.workspace.dir.display(),
        file_system(&bench.workspace.dir)
    );
    println!(
        "fsync   : {} median ({FSYNC_RECORD_BYTES} B append + fdatasync there, at start)",
        Unit::Seconds.format(fsync)
    );
    print_mode(bench.quick, bench.runs);
    Ok(())
}

// ---------------------------------------------------------------------------
// Scenario: scheduling

const SCHEDULING_RULES: usize = 100;
const SCHEDULING_PASSES: usize = 20;
const SCHEDULING_RUNNING: usize = 100;
const SCHEDULING_PASS_SECONDS_MAX: f64 = 10e-3;

/// A job of the scheduling scenario: even ids run `/bin/true`, odd ones
/// a delay; a third are in one of 10 rate-limit buckets.
fn scheduled_job(id: u64) -> crate::jobs::Job {
    let mut reasons = vec![json!([
        "gnt:client",
        format!("submitted by user {}", id % 7),
        0
    ])];
    if id.is_multiple_of(3) {
        reasons.push(json!([
            "gnt:client",
            format!("rate-limit:{}:bucket{}", 2 + id % 10, id % 10),
            0
        ]));
    }
    let op = if id.is_multiple_of(2) {
        json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "reason": reasons})
    } else {
        json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.1, "reason": reasons})
    };
    crate::jobs::Job {
        id,
        ops: vec![crate::jobs::QueuedOpcode::new(op, 0)],
        received_timestamp: None,
        start_timestamp: None,
        end_timestamp: None,
        livelock: None,
        process_id: None,
        workers: Vec::new(),
    }
}

/// The scheduling scenario's rules: `(priority, predicates, action)`.
/// Every queued job is held by one (the delays submitted after the
/// running jobs by the last, `PAUSE`; the `/bin/true`s by the
/// `RATE_LIMIT 50` the 50 running ones fill), and most match nothing.
fn scheduling_rule(index: usize, watermark: u64) -> (u64, Value, Value) {
    let (predicates, action) = match index {
        0 => (
            json!([["opcode", ["=", "OP_ID", "OP_EXEC"]]]),
            json!(["RATE_LIMIT", 50]),
        ),
        _ if index == SCHEDULING_RULES - 1 => (
            json!([
                ["opcode", ["=", "OP_ID", "OP_TEST_DELAY"]],
                ["jobid", [">", "id", watermark]]
            ]),
            json!("PAUSE"),
        ),
        _ => match index % 25 {
            1..=8 => (
                json!([["reason", ["=", "reason", format!("no such reason {index}")]]]),
                json!("PAUSE"),
            ),
            9..=16 => (
                json!([[
                    "opcode",
                    [
                        "&",
                        ["=", "OP_ID", "OP_TEST_DELAY"],
                        [">", "duration", 1000 + index]
                    ]
                ]]),
                json!("REJECT"),
            ),
            17..=20 => (
                json!([["opcode", ["=~", "argv", format!("^/no/such/{index}")]]]),
                json!(["RATE_LIMIT", 3]),
            ),
            _ => (
                json!([["jobid", ["<", "id", "watermark"]]]),
                json!("CONTINUE"),
            ),
        },
    };
    ((index % 10) as u64, predicates, action)
}

/// luxid's queue core (no daemon) holding the scenario's running and
/// queued jobs and its rules.
fn scheduling_core(sizes: &Sizes) -> crate::luxid::core::QueueCore {
    use crate::luxid::core::{Config, QueueCore, Restored};
    use crate::scheduling::{decode_rule, filters::FilterRule};

    let running = SCHEDULING_RUNNING as u64;
    let mut restored = Restored::default();
    for id in 1..=running {
        let mut job = scheduled_job(id);
        job.livelock = Some(format!("/nonexistent/livelock-{id}"));
        job.process_id = Some(u32::try_from(100_000 + id).expect("a small pid"));
        restored.held.insert(id);
        restored.watched.insert(id);
        restored.jobs.push(job);
    }
    let last = running + sizes.scheduled_jobs as u64;
    restored
        .jobs
        .extend((running + 1..=last).map(scheduled_job));
    restored.serial = last;
    restored.filter_rules = (0..SCHEDULING_RULES)
        .map(|index| {
            let (priority, predicates, action) = scheduling_rule(index, running);
            let parts = decode_rule(&json!(priority), &predicates, &action).expect("a good rule");
            FilterRule::new(uuid_of(index), running, parts, json!([]))
        })
        .collect();
    let config = Config {
        // Room for 100 more: a pass looks at every queued job.
        max_running_jobs: 2 * SCHEDULING_RUNNING,
        queue_jobs_max: 2 * last as usize,
        livelock_dir: PathBuf::from("/nonexistent"),
        clock: crate::luxid::core::ClockOrigin::now(),
    };
    let (core, _) = QueueCore::new(config, restored, Default::default(), Instant::now());
    core
}

fn uuid_of(index: usize) -> String {
    format!("00000000-0000-4000-8000-{index:012}")
}

fn scheduling(sizes: &Sizes) -> Vec<Measure> {
    use crate::luxid::core::{Answer, Command, Conn, Effect, Input};
    use crate::scheduling::decode_rule;

    let mut core = scheduling_core(sizes);
    assert_eq!(core.filter_rules().len(), SCHEDULING_RULES);
    let mut passes = Vec::with_capacity(SCHEDULING_PASSES);
    let mut changes = Vec::with_capacity(SCHEDULING_PASSES);
    for pass in 0..SCHEDULING_PASSES {
        // A scheduling pass: every queued job looked at, none may start.
        let started = Instant::now();
        let effects = core.handle(Input::EndTurn, Instant::now());
        passes.push(started.elapsed().as_secs_f64());
        assert!(
            !effects
                .iter()
                .any(|effect| matches!(effect, Effect::Spawn { .. } | Effect::Do { .. })),
            "nothing starts and nothing is rejected: {effects:?}"
        );
        // A rule replaced (a CONTINUE's priority): every unfinished job is
        // classified again once the shell says the rules are written.
        let (_, predicates, action) = scheduling_rule(SCHEDULING_RULES - 2, 0);
        let rule = decode_rule(&json!(pass % 10), &predicates, &action).expect("a good rule");
        let request = Input::Request {
            conn: Conn(1),
            command: Command::ReplaceFilter {
                uuid: Some(uuid_of(SCHEDULING_RULES - 2)),
                new_uuid: uuid_of(SCHEDULING_RULES),
                rule,
                reason_trail: Vec::new(),
            },
        };
        let effects = core.handle(request, Instant::now());
        let Some(ticket) = effects.iter().find_map(|effect| match effect {
            Effect::Do { ticket, .. } => Some(*ticket),
            _ => None,
        }) else {
            panic!("ReplaceFilter asks for the rules to be written: {effects:?}");
        };
        let started = Instant::now();
        let effects = core.handle(
            Input::Done {
                ticket,
                result: Ok(()),
            },
            Instant::now(),
        );
        changes.push(started.elapsed().as_secs_f64());
        assert!(
            effects.iter().any(|effect| matches!(
                effect,
                Effect::Reply {
                    reply: Ok(Answer::FilterReplaced(_)),
                    ..
                }
            )),
            "the replacement is answered: {effects:?}"
        );
    }
    vec![
        Measure::new(
            "scheduling pass (queue core)",
            Unit::Seconds,
            median(&mut passes),
        )
        .with_target(Target::Below(SCHEDULING_PASS_SECONDS_MAX)),
        Measure::new(
            "a rule replaced: every job classified again",
            Unit::Seconds,
            median(&mut changes),
        ),
    ]
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
