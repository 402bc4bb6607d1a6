//! workers-bench: the worker registry's matching in process, its durable
//! calls through wconfd, and a waiting job's start over the real daemons,
//! against the targets recorded in design/PERFORMANCE.md.
//!
//! ```text
//! cargo run --release --bins && target/release/workers-bench [match|calls|start|release] [--runs N] [--quick]
//! ```
//!
//! Scenarios:
//! - `match`: 10,000 workers of 1,000 capability sets and 20,000 jobs
//!   waiting for them (ten per set and more); each worker in turn goes IDLE
//!   (`setWorkerState`) and is assigned to the first waiting job it fits:
//!   the cost of one such call, in process (p50, p99, mean).
//! - `calls`: 16 clients, each with a worker of its own, toggle it between
//!   MAINTENANCE and IDLE through a real wconfd: durable calls per second.
//! - `start`: a job waits for a worker; the worker is let in; the time
//!   from the call to the job's start as the runner records it, over real
//!   daemons (p50).
//! - `release`: a job holds a worker (no prepare) and runs; its runner is
//!   killed with SIGKILL; the time from the kill to the worker being IDLE
//!   again, as `getWorkerInfo` sees it polled every 0.2 ms (p50, max).

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::harness::{Client, Daemon, Workspace, frame, result_of};
use super::{CommandLine, Measure, Report, Target, Unit, WithContext as _, fail, percentile};
use crate::bench;
use crate::protocol::luxi::LuxiRequest;
use crate::protocol::wconfd::WconfdRequest;
use crate::workers::{Registry, Request};

const USAGE: &str = "usage: workers-bench [match|calls|start|release] [--runs N] [--quick]";

const RUNS_DEFAULT: usize = 5;

// The targets of design/PERFORMANCE.md (the workers issue).
const MATCH_SECONDS_MAX: f64 = 100e-6;
const CALLS_PER_SECOND_MIN: f64 = 10_000.0;
const CALLS_CLIENTS: usize = 16;
const START_SECONDS_MAX: f64 = 5e-3;
const RELEASE_SECONDS_MAX: f64 = 50e-3;

pub fn main() -> ExitCode {
    bench::main(
        "workers-bench",
        USAGE,
        |args| CommandLine::parse("workers-bench", args, RUNS_DEFAULT, |_, _| Ok(false)),
        |options| run(&options),
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Match,
    Calls,
    Start,
    Release,
}

impl bench::Scenario for Scenario {
    const ALL: &'static [Scenario] = &[
        Scenario::Match,
        Scenario::Calls,
        Scenario::Start,
        Scenario::Release,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Match => "match",
            Scenario::Calls => "calls",
            Scenario::Start => "start",
            Scenario::Release => "release",
        }
    }
}

struct Sizes {
    workers: usize,
    cap_sets: usize,
    waiting: usize,
    window: Duration,
    starts: usize,
    kills: usize,
}

impl Sizes {
    const FULL: Sizes = Sizes {
        workers: 10_000,
        cap_sets: 1_000,
        waiting: 20_000,
        window: Duration::from_secs(3),
        starts: 30,
        kills: 20,
    };
    const QUICK: Sizes = Sizes {
        workers: 500,
        cap_sets: 50,
        waiting: 1_000,
        window: Duration::from_millis(300),
        starts: 3,
        kills: 2,
    };
}

fn run(options: &CommandLine<Scenario>) -> super::Result<()> {
    let sizes = if options.quick {
        &Sizes::QUICK
    } else {
        &Sizes::FULL
    };
    super::Context::read().print("workers-bench", &options.text);
    super::print_mode(options.quick, options.runs);
    let exe = std::env::current_exe().context(|| "cannot find this executable".to_owned())?;
    let workspace = Workspace::create(&std::env::temp_dir(), "workers-bench")?;
    options.run(|scenario| -> super::Result<Report> {
        let description = match scenario {
            Scenario::Match => format!(
                "{} workers of {} capability sets, {} jobs waiting; each worker goes IDLE \
                 and is assigned, in process",
                sizes.workers, sizes.cap_sets, sizes.waiting
            ),
            Scenario::Calls => format!(
                "{CALLS_CLIENTS} clients toggle their own worker MAINTENANCE <-> IDLE \
                 through wconfd for {:.1} s",
                sizes.window.as_secs_f64()
            ),
            Scenario::Start => format!(
                "{} times: a job waits for a worker, the worker is let in; call to job start",
                sizes.starts
            ),
            Scenario::Release => format!(
                "{} times: the runner of a job holding a worker is killed; kill to worker IDLE",
                sizes.kills
            ),
        };
        bench::run_scenario(scenario, &description, options.runs, || match scenario {
            Scenario::Match => Ok(matching(sizes)),
            Scenario::Calls => calls(&exe, &workspace, sizes),
            Scenario::Start => start(&exe, &workspace, sizes),
            Scenario::Release => release(&exe, &workspace, sizes),
        })
    })
}

// ---------------------------------------------------------------------------
// match

fn caps(uuid: &str, set: usize) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("UUID".to_owned(), uuid.to_owned()),
        ("board".to_owned(), format!("type-{set}")),
        (
            "arch".to_owned(),
            ["arm64", "x86", "riscv"][set % 3].to_owned(),
        ),
    ])
}

fn matching(sizes: &Sizes) -> Vec<Measure> {
    let mut registry = Registry::new();
    let mut now = 1.0;
    let uuids: Vec<String> = (0..sizes.workers).map(|i| format!("w{i:06}")).collect();
    for (index, uuid) in uuids.iter().enumerate() {
        let groups = BTreeSet::from([format!("rack-{}", index % 20)]);
        registry
            .register(
                caps(uuid, index % sizes.cap_sets),
                Some(groups),
                None,
                None,
                now,
            )
            .expect("a good registration");
    }
    // Waiting jobs ask for one board of a type, some also for a rack;
    // spread over the types, with priorities.
    for job in 0..sizes.waiting as u64 {
        let set = (job as usize * 7919) % sizes.cap_sets;
        let mut wanted = BTreeMap::from([("board".to_owned(), format!("type-{set}"))]);
        if job % 3 == 0 {
            wanted.insert(
                "arch".to_owned(),
                ["arm64", "x86", "riscv"][set % 3].to_owned(),
            );
        }
        let request = Request::new(BTreeSet::new(), wanted, None).expect("a good request");
        let priority = [-10, 0, 10][(job % 3) as usize];
        registry
            .request(job + 1, priority, request, now)
            .expect("some worker fits");
    }
    let mut times = Vec::with_capacity(sizes.workers);
    let mut assigned = 0;
    for uuid in &uuids {
        now += 0.001;
        let started = Instant::now();
        let effects = registry
            .set_state(uuid, "IDLE", false, now)
            .expect("MAINTENANCE to IDLE");
        times.push(started.elapsed().as_secs_f64());
        assigned += effects
            .iter()
            .filter(|effect| matches!(effect, crate::workers::Effect::Assigned { .. }))
            .count();
    }
    assert_eq!(
        assigned, sizes.workers,
        "every worker went to a waiting job"
    );
    assert_eq!(
        registry.waiters().count(),
        sizes.waiting - sizes.workers,
        "the others still wait"
    );
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    times.sort_by(f64::total_cmp);
    vec![
        Measure::new(
            "IDLE to assigned, p50",
            Unit::Seconds,
            percentile(&times, 0.5),
        )
        .with_target(Target::Below(MATCH_SECONDS_MAX)),
        Measure::new(
            "IDLE to assigned, p99",
            Unit::Seconds,
            percentile(&times, 0.99),
        ),
        Measure::new("IDLE to assigned, mean", Unit::Seconds, mean),
    ]
}

// ---------------------------------------------------------------------------
// calls and start: real daemons

fn daemon(exe: &std::path::Path, name: &'static str, root: &std::path::Path) -> Daemon {
    Daemon::new(
        name,
        &exe.with_file_name(name),
        "--root",
        root,
        root.join("socket").join(format!("{name}.sock")),
        root.join(format!("{name}.log")),
    )
}

fn register_frame(uuid: &str) -> Vec<u8> {
    frame(
        &WconfdRequest::RegisterWorker {
            caps: BTreeMap::from([("UUID".to_owned(), uuid.to_owned())]),
            groups: None,
            address: None,
            prepare: None,
        }
        .encode(),
    )
}

fn state_frame(uuid: &str, state: &str) -> Vec<u8> {
    frame(
        &WconfdRequest::SetWorkerState {
            uuid: uuid.to_owned(),
            state: state.to_owned(),
            kill: false,
        }
        .encode(),
    )
}

fn calls(
    exe: &std::path::Path,
    workspace: &Workspace,
    sizes: &Sizes,
) -> super::Result<Vec<Measure>> {
    let root = workspace.next_run_dir();
    std::fs::create_dir_all(&root).context(|| "cannot create the root".to_owned())?;
    let mut wconfd = daemon(exe, "wconfd", &root);
    wconfd.spawn()?;
    let count = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let mut clients = Vec::new();
    for index in 0..CALLS_CLIENTS {
        let mut client = wconfd.connect()?;
        let uuid = format!("c{index}");
        result_of("wconfd", client.call(&register_frame(&uuid))?)?;
        clients.push((client, uuid));
    }
    let rate = thread::scope(|scope| -> super::Result<f64> {
        let threads: Vec<_> = clients
            .into_iter()
            .map(|(mut client, uuid)| {
                let (count, stop) = (&count, &stop);
                scope.spawn(move || -> super::Result<()> {
                    let [idle, maintenance] = [
                        state_frame(&uuid, "IDLE"),
                        state_frame(&uuid, "MAINTENANCE"),
                    ];
                    while !stop.load(Ordering::Relaxed) {
                        result_of("wconfd", client.call(&idle)?)?;
                        result_of("wconfd", client.call(&maintenance)?)?;
                        count.fetch_add(2, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        thread::sleep(sizes.window / 5);
        let (first, started) = (count.load(Ordering::Relaxed), Instant::now());
        thread::sleep(sizes.window);
        let (last, elapsed) = (count.load(Ordering::Relaxed), started.elapsed());
        stop.store(true, Ordering::Relaxed);
        for thread in threads {
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        Ok((last - first) as f64 / elapsed.as_secs_f64())
    })?;
    wconfd.stop()?;
    Ok(vec![
        Measure::new(
            format!("durable setWorkerState, {CALLS_CLIENTS} clients"),
            Unit::PerSecond,
            rate,
        )
        .with_target(Target::AtLeast(CALLS_PER_SECOND_MIN)),
    ])
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |elapsed| elapsed.as_secs_f64())
}

/// Both daemons on a new root, worker `b1` registered (MAINTENANCE).
struct Farm {
    root: std::path::PathBuf,
    wconfd: Daemon,
    wconfd_client: Client,
    luxid: Daemon,
    luxid_client: Client,
}

impl Farm {
    fn start(exe: &std::path::Path, workspace: &Workspace) -> super::Result<Farm> {
        let root = workspace.next_run_dir();
        std::fs::create_dir_all(&root).context(|| "cannot create the root".to_owned())?;
        let mut wconfd = daemon(exe, "wconfd", &root);
        let mut wconfd_client = wconfd.spawn()?;
        let mut luxid = daemon(exe, "luxid", &root);
        let luxid_client = luxid.spawn()?;
        result_of("wconfd", wconfd_client.call(&register_frame("b1"))?)?;
        Ok(Farm {
            root,
            wconfd,
            wconfd_client,
            luxid,
            luxid_client,
        })
    }

    fn stop(mut self) -> super::Result<()> {
        self.luxid.stop()?;
        self.wconfd.stop()
    }
}

/// The p50 (against `p50_max`) and the max of `delays` (seconds).
fn p50_and_max(what: &str, mut delays: Vec<f64>, p50_max: f64) -> Vec<Measure> {
    delays.sort_by(f64::total_cmp);
    vec![
        Measure::new(
            format!("{what}, p50"),
            Unit::Seconds,
            percentile(&delays, 0.5),
        )
        .with_target(Target::Below(p50_max)),
        Measure::new(
            format!("{what}, max"),
            Unit::Seconds,
            delays[delays.len() - 1],
        ),
    ]
}

/// `SubmitJob` of `ops`: the job's id.
fn submit(luxid: &mut Client, ops: Value) -> super::Result<u64> {
    let id = result_of(
        "luxid",
        luxid.call(&frame(&LuxiRequest::SubmitJob { ops }.encode()))?,
    )?;
    id.as_u64()
        .ok_or_else(|| super::Error(format!("SubmitJob answered {id}")))
}

fn start(
    exe: &std::path::Path,
    workspace: &Workspace,
    sizes: &Sizes,
) -> super::Result<Vec<Measure>> {
    let mut farm = Farm::start(exe, workspace)?;
    let (wconfd_client, luxid_client) = (&mut farm.wconfd_client, &mut farm.luxid_client);
    let mut delays = Vec::new();
    for round in 0..sizes.starts {
        let ops = json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "workers": {}}]);
        let id = submit(luxid_client, ops)?;
        // Queued while the worker is out; let in, it starts.
        thread::sleep(Duration::from_millis(20));
        let let_in = unix_now();
        result_of("wconfd", wconfd_client.call(&state_frame("b1", "IDLE"))?)?;
        let started = wait_for_start(luxid_client, id)?;
        delays.push(started - let_in);
        wait_final(luxid_client, id)?;
        result_of(
            "wconfd",
            wconfd_client.call(&state_frame("b1", "MAINTENANCE"))?,
        )
        .context(|| format!("round {round}"))?;
    }
    farm.stop()?;
    Ok(p50_and_max(
        "worker IDLE to job started",
        delays,
        START_SECONDS_MAX,
    ))
}

fn release(
    exe: &std::path::Path,
    workspace: &Workspace,
    sizes: &Sizes,
) -> super::Result<Vec<Measure>> {
    let mut farm = Farm::start(exe, workspace)?;
    let (wconfd_client, luxid_client) = (&mut farm.wconfd_client, &mut farm.luxid_client);
    result_of("wconfd", wconfd_client.call(&state_frame("b1", "IDLE"))?)?;
    let info = frame(
        &WconfdRequest::GetWorkerInfo {
            uuid: "b1".to_owned(),
        }
        .encode(),
    );
    let mut delays = Vec::new();
    for round in 0..sizes.kills {
        // The program names its runner (its parent) and keeps running.
        let pid_file = farm.root.join(format!("runner-{round}.pid"));
        let script = format!(
            "echo $PPID > {}.tmp && mv {0}.tmp {0} && exec sleep 60",
            pid_file.display()
        );
        let ops = json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/sh", "-c", script], "workers": {}}]);
        let id = submit(luxid_client, ops)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let runner: i32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                break pid;
            }
            if Instant::now() > deadline {
                return fail(format!("job {id}'s program did not start within 10 s"));
            }
            thread::sleep(Duration::from_millis(1));
        };
        let killed = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(runner),
            nix::sys::signal::Signal::SIGKILL,
        )
        .map_err(|error| super::Error(format!("cannot kill runner {runner}: {error}")))?;
        loop {
            let worker = result_of("wconfd", wconfd_client.call(&info)?)?;
            if worker["state"] == "IDLE" {
                break;
            }
            if killed.elapsed() > Duration::from_secs(10) {
                return fail(format!(
                    "worker b1 not IDLE 10 s after job {id}'s runner died"
                ));
            }
            thread::sleep(Duration::from_micros(200));
        }
        delays.push(killed.elapsed().as_secs_f64());
        wait_final(luxid_client, id)?;
    }
    farm.stop()?;
    Ok(p50_and_max(
        "runner killed to worker IDLE",
        delays,
        RELEASE_SECONDS_MAX,
    ))
}

fn query(client: &mut Client, id: u64, field: &'static str) -> super::Result<Value> {
    let request = LuxiRequest::QueryJobs {
        ids: Some(vec![id]),
        fields: vec![field],
    };
    let rows = result_of("luxid", client.call(&frame(&request.encode()))?)?;
    Ok(rows[0][0].clone())
}

/// Polls the job's `field` until `done` makes something of it, for at
/// most 10 s (`what` names the wait in the error).
fn poll_job<T>(
    client: &mut Client,
    id: u64,
    field: &'static str,
    what: &str,
    done: impl Fn(&Value) -> Option<T>,
) -> super::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(found) = done(&query(client, id, field)?) {
            return Ok(found);
        }
        if Instant::now() > deadline {
            return fail(format!("job {id} did not {what} within 10 s"));
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// The job's start timestamp, once it has one.
fn wait_for_start(client: &mut Client, id: u64) -> super::Result<f64> {
    poll_job(client, id, "start_ts", "start", |start| {
        Some(start[0].as_f64()? + start[1].as_f64()? / 1e6)
    })
}

fn wait_final(client: &mut Client, id: u64) -> super::Result<()> {
    poll_job(client, id, "status", "finish", |status| {
        matches!(status.as_str(), Some("success" | "error" | "canceled")).then_some(())
    })
}
