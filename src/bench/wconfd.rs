//! wconfd-bench: the real wconfd over its socket, against the targets of
//! design/PERFORMANCE.md.
//!
//! ```text
//! cargo build --release --bins
//! target/release/wconfd-bench [throughput|latency|scale|death|events|reporter] [--runs N] [--quick]
//!     [--dir DIR] [--reporter]
//! ```
//!
//! Every run of a scenario starts the `wconfd` binary that sits next to this
//! executable on a fresh root under DIR (default: the temp directory) and
//! waits for it by connecting. Scenarios:
//! - `throughput`: 1, 16 and 64 clients (one thread, connection and owner
//!   each) loop acquire (`cluster/BGL` shared + `node/<own>` exclusive) and
//!   release through `tryUpdateLocks`; lock RPCs per second. The same loop
//!   runs first against a null server (this executable, answering every
//!   frame at once without doing anything): the machine's ceiling in the
//!   same run, so wconfd's figure can be read as a share of it. Last, the
//!   disk's bound: with one request outstanding per client and one journal
//!   write in flight, a request waits 1.5 writes on average, so N clients
//!   get at most N / (1.5 × one journal write) durable RPCs per second.
//! - `latency`: one client's round trips of the same RPCs, p50 and p99, next
//!   to the cost of one small append + `fdatasync` on the same file system
//!   and to the cost of one journal write as wconfd makes it there (one
//!   block with `O_DIRECT | O_DSYNC` into a zero-filled file where the file
//!   system offers direct I/O, else an overwrite + `fdatasync`): wconfd
//!   answers a change only once it is durable.
//! - `scale`: the 16-client loop on an empty table and with 100,000 node
//!   locks held by 10,000 owners; then the time from spawn to the first
//!   `echo` reply of a restarted wconfd holding that table, after SIGTERM
//!   and after kill -9.
//! - `death`: a child process holds `node/x`, an owner blocks on it with
//!   `awaitLocks`; time from kill -9 of the holder to the waiter's grant.
//! - `events`: one connection holds `watchEvents [since, ["lock.granted"],
//!   30]`, another sends a `tryUpdateLocks` that grants `node/<own>`; the
//!   time from sending the update to the watch's answer arriving (and the
//!   update's own round trip beside it), then the release (not measured).
//!   `since` is where the last answer left off (the first from `[null,
//!   null, 0]`, after one acquire and release), so a watch that reaches
//!   wconfd late cannot miss its event; each update is sent
//!   [`WATCH_HOLD_PAUSE`] after its watch, which an idle wconfd has filed
//!   by then. Both connections are waited on with one epoll, so each
//!   answer's time is the moment it can be read.
//! - `reporter`: 16 clients churn locks (acquire/release pipelined, one
//!   event per update) until the sequence holds 200,000 events, with no
//!   reporter; then `warden reporter` (beside this executable, its
//!   endpoint on a free loopback port) is started and `/status.json`
//!   polled until `reporter.read.wconfd` reaches the last event: events per
//!   second, spawn to caught up. Once `reporter/state.json` holds that
//!   position, the reporter is killed with SIGKILL, 20,000 more events are
//!   made, and a second reporter is started: its catch-up (spawn, election
//!   once wconfd sees the first one dead, reading from the saved position)
//!   must cost the new events, not the whole sequence.
//!
//! `--reporter`: every wconfd started (not the null server) gets a
//! `warden reporter` on its root once it answers (its endpoint off:
//! `[metrics] listen = ""`), elected before the scenario goes on, stopped
//! (SIGTERM, reaped) with wconfd. Its lock (`service/reporter`) is left
//! out of the lock counts the scenarios check.
//!
//! Owners are `[name, <root>/livelocks/<name>, pid]`. This process holds
//! (flock) the livelock of every owner it acts as, except the holders of
//! `death`: those are this executable started as
//! `wconfd-bench --hold-livelock DIR NAME`, so that their death is real.
//!
//! As in lock-bench: the box is shared and noisy, so each scenario runs
//! several times and the summary shows medians; ratios and differences are
//! taken within a run. Every reply is checked: a wrong answer stops the
//! bench with an error (exit 1). A missed target is reported, not an error.

use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::harness::{
    self, Client, Daemon, POLL_PAUSE, PROCESS_TIMEOUT, REPLY_TIMEOUT, Reporter, WatchSamples,
    Workspace, events_position, frame, free_loopback_address, fsync_cost, reporter_read,
    reporter_settings, reporter_status, saved_read, wait_elected,
};
use super::{
    CommandLine, Context as BenchContext, Measure, Report, Target, Unit, counted, grouped,
    percentile, print_mode,
};
use super::{RUNS_DEFAULT, Result, WithContext as _, age, fail, file_system};
use crate::bench;
use crate::liveness::Livelock;
use crate::locks::{Entry, LockName, Owner};
use crate::paths::SETTINGS_FILE;
use crate::paths::{
    LIVELOCK_DIR, LOCK_JOURNAL_FILE as JOURNAL_FILE, WCONFD_SOCKET_PATH as SOCKET_PATH,
};
use crate::protocol::events::WatchEvents;
use crate::protocol::wconfd::WconfdRequest;
use crate::protocol::{ETX, Request};
use crate::store::lock_state::{JOURNAL_HEADER_BYTES, RECORD_HEADER_BYTES};
use serde_json::{Value, json};

const USAGE: &str = "\
usage: wconfd-bench [throughput|latency|scale|death|events|reporter] [--runs N] [--quick]
                    [--dir DIR] [--reporter]
  --dir DIR   where the temporary wconfd roots go (default: the temp directory);
              its file system's fsync cost bounds every figure
  --reporter  a `warden reporter` (beside this executable) on every wconfd's root,
              elected before each scenario measures, stopped with wconfd";

// The targets of design/PERFORMANCE.md.
const THROUGHPUT_RPCS_PER_SECOND_MIN: f64 = 100_000.0;
const THROUGHPUT_TARGET_CLIENTS: [usize; 2] = [16, 64];
const LATENCY_OVER_FSYNC_SECONDS_MAX: f64 = 30e-6;
const SCALE_RATIO_MAX: f64 = 2.0;
const RESTART_SECONDS_MAX: f64 = 1.0;
const DEATH_P99_SECONDS_MAX: f64 = 0.050;
const EVENT_P50_SECONDS_MAX: f64 = 5e-3;
const REPORTER_EVENTS_PER_SECOND_MIN: f64 = 20_000.0;

/// The `watchEvents` timeout of `events`: far above any plausible delay,
/// so a timeout means a lost event (an error).
const WATCH_TIMEOUT: Duration = Duration::from_secs(30);
/// From sending a watch to sending the change it waits for: an idle wconfd
/// reads and files a request in tens of microseconds.
const WATCH_HOLD_PAUSE: Duration = Duration::from_millis(1);
/// Clients churning locks to build the sequence of `reporter`, each with
/// this many updates in flight (one turn, one journal write for many).
const CHURN_CLIENTS: usize = 16;
const CHURN_BATCH: usize = 250;
/// How often `reporter` asks the reporter's `/status.json` how far it is.
const STATUS_POLL_PAUSE: Duration = Duration::from_millis(5);

/// The waiter's `awaitLocks` timeout in `death`: far above any plausible
/// detection time, so a timeout means detection failed.
const AWAIT_TIMEOUT_MS: u64 = 5_000;
/// Bytes per append of the fsync probe: about one journal record of the
/// lock loop.
const FSYNC_RECORD_BYTES: usize = 100;
/// Descriptors the bench needs beside its livelocks (connections, pipes).
const DESCRIPTORS_SPARE: u64 = 1_024;

/// The bench binary: its command line, its scenarios, its exit code.
pub fn main() -> ExitCode {
    // This executable started again as a helper of a scenario.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let helper = match args.as_slice() {
        [flag, dir, name] if flag == "--hold-livelock" => Some(hold_livelock(Path::new(dir), name)),
        [flag, root] if flag == "--null-server" => Some(null_server(Path::new(root))),
        _ => None,
    };
    if let Some(outcome) = helper {
        return bench::exit_code("wconfd-bench", outcome);
    }
    bench::main("wconfd-bench", USAGE, Options::parse, |options| {
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
    Scale,
    Death,
    Events,
    Reporter,
}

impl bench::Scenario for Scenario {
    const ALL: &'static [Scenario] = &[
        Scenario::Throughput,
        Scenario::Latency,
        Scenario::Scale,
        Scenario::Death,
        Scenario::Events,
        Scenario::Reporter,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Throughput => "throughput",
            Scenario::Latency => "latency",
            Scenario::Scale => "scale",
            Scenario::Death => "death",
            Scenario::Events => "events",
            Scenario::Reporter => "reporter",
        }
    }
}

impl Scenario {
    fn run(self, bench: &Bench) -> Result<Vec<Measure>> {
        match self {
            Scenario::Throughput => throughput(bench),
            Scenario::Latency => latency(bench),
            Scenario::Scale => scale(bench),
            Scenario::Death => death(bench),
            Scenario::Events => events(bench),
            Scenario::Reporter => reporter(bench),
        }
    }
}

struct Options {
    shared: CommandLine<Scenario>,
    /// Parent of the temporary roots.
    dir: PathBuf,
    /// A reporter beside every wconfd.
    reporter: bool,
}

impl Options {
    /// `None` for `--help`.
    fn parse(args: &[String]) -> std::result::Result<Option<Options>, String> {
        let mut dir = std::env::temp_dir();
        let mut reporter = false;
        let shared = CommandLine::parse("wconfd-bench", args, RUNS_DEFAULT, |arg, rest| {
            match arg {
                "--dir" => dir = PathBuf::from(rest.next().ok_or("--dir needs a path")?),
                "--reporter" => reporter = true,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(shared.map(|shared| Options {
            shared,
            dir,
            reporter,
        }))
    }
}

/// How much work each scenario does per run.
struct Sizes {
    /// The lock loop runs this long before it is measured (connections and
    /// owners settle) ...
    warmup: Duration,
    /// ... and is then measured for this long.
    window: Duration,
    throughput_clients: [usize; 3],
    /// Round trips of `latency`: at most this many, for at most this long
    /// (a slow disk makes each one cost milliseconds).
    latency_rtts_max: usize,
    latency_time_max: Duration,
    /// Appends + syncs of the fsync probe, bounded the same way.
    fsyncs_max: usize,
    fsync_time_max: Duration,
    scale_clients: usize,
    /// The large table of `scale`: this many owners, each holding
    /// `scale_locks_per_owner` node locks exclusively.
    scale_owners: usize,
    scale_locks_per_owner: usize,
    /// Setup requests sent before reading their replies: a batch shares
    /// wconfd's turns and syncs.
    setup_batch: usize,
    /// Holders killed per run of `death`.
    death_kills: usize,
    /// Watched updates of `events`.
    event_samples: usize,
    /// Events in the sequence before the first reporter of `reporter`
    /// starts, at least ...
    reporter_events: usize,
    /// ... and events made while no reporter runs, before the second.
    takeover_events: usize,
}

impl Sizes {
    const FULL: Sizes = Sizes {
        warmup: Duration::from_millis(500),
        window: Duration::from_secs(2),
        throughput_clients: [1, 16, 64],
        latency_rtts_max: 5_000,
        latency_time_max: Duration::from_secs(2),
        fsyncs_max: 1_000,
        fsync_time_max: Duration::from_secs(1),
        scale_clients: 16,
        scale_owners: 10_000,
        scale_locks_per_owner: 10,
        setup_batch: 250,
        death_kills: 100,
        event_samples: 1_000,
        reporter_events: 200_000,
        takeover_events: 20_000,
    };

    /// A smoke run for CI: every code path and check, in a few seconds. Its
    /// figures mean nothing, so targets are not judged.
    const QUICK: Sizes = Sizes {
        warmup: Duration::from_millis(20),
        window: Duration::from_millis(100),
        throughput_clients: [1, 16, 64],
        latency_rtts_max: 50,
        latency_time_max: Duration::from_millis(200),
        fsyncs_max: 20,
        fsync_time_max: Duration::from_millis(200),
        scale_clients: 16,
        scale_owners: 100,
        scale_locks_per_owner: 10,
        setup_batch: 30,
        death_kills: 3,
        event_samples: 30,
        reporter_events: 2_000,
        takeover_events: 500,
    };
}

/// What every scenario shares: the binaries, the scratch directory, the
/// sizes.
struct Bench {
    /// This executable (started again as the holder of `death`).
    exe: PathBuf,
    wconfd: PathBuf,
    /// `warden`, for its reporter (`reporter`, `--reporter`); `None` if
    /// not built.
    warden: Option<PathBuf>,
    /// `--reporter`.
    attach_reporter: bool,
    workspace: Workspace,
    sizes: &'static Sizes,
    runs: usize,
    quick: bool,
    command_line: String,
}

impl Bench {
    fn new(options: &Options) -> Result<Bench> {
        let exe = std::env::current_exe().context(|| "cannot find this executable".to_owned())?;
        let wconfd = exe.with_file_name("wconfd");
        if !wconfd.is_file() {
            return fail(format!(
                "no wconfd next to this executable ({}): build every binary \
                 (cargo build --release --bins)",
                wconfd.display()
            ));
        }
        let warden = Some(exe.with_file_name("warden")).filter(|path| path.is_file());
        let wants_warden =
            options.reporter || options.shared.scenarios.contains(&Scenario::Reporter);
        if wants_warden && warden.is_none() {
            return fail(format!(
                "no warden next to this executable ({}), whose reporter the bench runs: \
                 build every binary (cargo build --release --bins)",
                exe.with_file_name("warden").display()
            ));
        }
        let sizes = if options.shared.quick {
            &Sizes::QUICK
        } else {
            &Sizes::FULL
        };
        // One descriptor per livelock held at once: the large table of `scale`.
        raise_descriptor_limit(sizes.scale_owners as u64 + DESCRIPTORS_SPARE)?;
        // wconfd tells an owner that a pending request was granted with
        // SIGHUP to its pid, which is ours; the default action would end the
        // bench. Grants here come through awaitLocks, so none is expected.
        signal_hook::flag::register(
            signal_hook::consts::SIGHUP,
            Arc::new(AtomicBool::new(false)),
        )
        .context(|| "cannot handle SIGHUP".to_owned())?;
        Ok(Bench {
            exe,
            wconfd,
            warden,
            attach_reporter: options.reporter,
            workspace: Workspace::create(&options.dir, "wconfd-bench")?,
            sizes,
            runs: options.shared.runs,
            quick: options.shared.quick,
            command_line: options.shared.text.clone(),
        })
    }
}

fn raise_descriptor_limit(wanted: u64) -> Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .context(|| "cannot read the descriptor limit".to_owned())?;
    if soft >= wanted {
        return Ok(());
    }
    if hard < wanted {
        return fail(format!(
            "the bench holds up to {wanted} descriptors (one per livelock) \
             but the hard limit is {hard}: raise it (ulimit -Hn)"
        ));
    }
    setrlimit(Resource::RLIMIT_NOFILE, wanted, hard)
        .context(|| format!("cannot raise the descriptor limit to {wanted}"))
}

// ---------------------------------------------------------------------------
// Scenario: throughput

fn throughput(bench: &Bench) -> Result<Vec<Measure>> {
    let clients = bench.sizes.throughput_clients;
    // The same loop against a server that does nothing, in the same run:
    // what this machine allows right now.
    let mut null = Wconfd::start_kind(bench, ServerKind::Null)?;
    let ceilings = clients
        .iter()
        .map(|&count| lock_loop_rate(&null, count, "null", bench.sizes))
        .collect::<Result<Vec<f64>>>()?;
    null.stop()?;
    let mut wconfd = Wconfd::start(bench)?;
    let mut measures = Vec::new();
    for (&count, ceiling) in clients.iter().zip(ceilings) {
        let rate = lock_loop_rate(&wconfd, count, "loop", bench.sizes)?;
        expect_lock_count(&wconfd, 0).context(|| "after the lock loop".to_owned())?;
        let label = format!("lock RPCs, {}", counted(count, "client"));
        let measure = Measure::new(label, Unit::PerSecond, rate);
        measures.push(if THROUGHPUT_TARGET_CLIENTS.contains(&count) {
            measure.with_target(Target::AtLeast(THROUGHPUT_RPCS_PER_SECOND_MIN))
        } else {
            measure
        });
        measures.push(Measure::new(
            format!("null server, {}", counted(count, "client")),
            Unit::PerSecond,
            ceiling,
        ));
        measures.push(Measure::new(
            format!("wconfd / null server, {}", counted(count, "client")),
            Unit::Ratio,
            rate / ceiling,
        ));
    }
    wconfd.stop()?;
    // What the disk allows: each client has one request outstanding, and
    // a request waits for the rest of the write under way and then the
    // write with its record, 1.5 writes on average (design/PERFORMANCE.md).
    let sizes = bench.sizes;
    let write = journal_write_cost(&wconfd.dir, sizes.fsyncs_max, sizes.fsync_time_max)?;
    measures.push(Measure::new(
        "journal write (as wconfd writes)",
        Unit::Seconds,
        write,
    ));
    for count in THROUGHPUT_TARGET_CLIENTS {
        measures.push(Measure::new(
            format!("bound of one write in flight, {}", counted(count, "client")),
            Unit::PerSecond,
            count as f64 / (1.5 * write),
        ));
    }
    Ok(measures)
}

/// `clients` threads, each with its own connection and owner, loop acquire
/// and release; answers the lock RPCs per second wconfd answered (all
/// granted) during the measuring window. Every owner holds nothing after.
fn lock_loop_rate(wconfd: &Wconfd, clients: usize, tag: &str, sizes: &Sizes) -> Result<f64> {
    let owners = (0..clients)
        .map(|index| BenchOwner::new(&wconfd.livelock_dir, &format!("{tag}-{clients}-{index}")))
        .collect::<Result<Vec<_>>>()?;
    let connections = (0..clients)
        .map(|_| wconfd.connect())
        .collect::<Result<Vec<_>>>()?;
    let counts: Vec<AtomicU64> = (0..clients).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let total = || -> u64 {
        counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .sum()
    };
    thread::scope(|scope| {
        let workers: Vec<_> = owners
            .iter()
            .zip(connections)
            .zip(&counts)
            .map(|((owner, client), count)| scope.spawn(|| lock_loop(client, owner, count, &stop)))
            .collect();
        thread::sleep(sizes.warmup);
        let (first, started) = (total(), Instant::now());
        thread::sleep(sizes.window);
        let (last, elapsed) = (total(), started.elapsed());
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        Ok((last - first) as f64 / elapsed.as_secs_f64())
    })
}

/// One client of the lock loop: acquire, release, count, until `stop`. It
/// stops after a release, so its owner ends up holding nothing.
fn lock_loop(
    mut client: Client,
    owner: &BenchOwner,
    count: &AtomicU64,
    stop: &AtomicBool,
) -> Result<()> {
    let [acquire, release] = lock_pair(owner);
    while !stop.load(Ordering::Relaxed) {
        client
            .call_granted(&acquire)
            .context(|| format!("acquire of {}", owner.name))?;
        client
            .call_granted(&release)
            .context(|| format!("release of {}", owner.name))?;
        count.fetch_add(2, Ordering::Relaxed);
    }
    Ok(())
}

/// The requests of the lock loop, as a job takes its locks: the BGL shared,
/// then its node exclusively; and the release of both.
fn lock_pair(owner: &BenchOwner) -> [Vec<u8>; 2] {
    let node = format!("node/{}", owner.name);
    let node = LockName::parse(&node).expect("a bench owner's name makes a valid node name");
    let update = |request: Vec<Entry>| {
        frame(
            &WconfdRequest::TryUpdateLocks {
                owner: owner.owner.clone(),
                request,
            }
            .encode(),
        )
    };
    [
        update(vec![
            Entry::shared(LockName::Bgl),
            Entry::exclusive(node.clone()),
        ]),
        update(vec![Entry::release(LockName::Bgl), Entry::release(node)]),
    ]
}

// ---------------------------------------------------------------------------
// Scenario: latency

fn latency(bench: &Bench) -> Result<Vec<Measure>> {
    let sizes = bench.sizes;
    let mut wconfd = Wconfd::start(bench)?;
    let owner = BenchOwner::new(&wconfd.livelock_dir, "latency")?;
    let pair = lock_pair(&owner);
    let mut client = wconfd.connect()?;
    let mut rtts = Vec::with_capacity(sizes.latency_rtts_max);
    let started = Instant::now();
    while rtts.len() < sizes.latency_rtts_max && started.elapsed() < sizes.latency_time_max {
        for frame in &pair {
            let sent = Instant::now();
            client.call_granted(frame)?;
            rtts.push(sent.elapsed().as_secs_f64());
        }
    }
    wconfd.stop()?;
    // Measured while wconfd is down, on the same file system as its journal.
    let fsync = fsync_cost(
        &wconfd.dir,
        FSYNC_RECORD_BYTES,
        sizes.fsyncs_max,
        sizes.fsync_time_max,
    )?;
    let journal_write = journal_write_cost(&wconfd.dir, sizes.fsyncs_max, sizes.fsync_time_max)?;
    rtts.sort_by(f64::total_cmp);
    let p50 = percentile(&rtts, 0.50);
    Ok(vec![
        Measure::new("p50 round trip", Unit::Seconds, p50),
        Measure::new("p99 round trip", Unit::Seconds, percentile(&rtts, 0.99)),
        Measure::new("fsync (100 B append + fdatasync)", Unit::Seconds, fsync),
        Measure::new("p50 round trip - fsync", Unit::Seconds, p50 - fsync),
        Measure::new(
            "journal write (as wconfd writes)",
            Unit::Seconds,
            journal_write,
        ),
        Measure::new(
            "p50 round trip - journal write",
            Unit::Seconds,
            p50 - journal_write,
        )
        .with_target(Target::AtMost(LATENCY_OVER_FSYNC_SECONDS_MAX)),
    ])
}

/// Median seconds of one durable journal write the way wconfd makes it in
/// `dir`: one aligned block with `O_DIRECT | O_DSYNC` into a zero-filled
/// file where the file system offers direct I/O, else an overwrite of
/// zero-filled space plus `fdatasync`. This is the floor under a reply
/// that reveals a change.
fn journal_write_cost(dir: &Path, count_max: usize, time_max: Duration) -> Result<f64> {
    const FILE_BYTES: usize = 1024 * 1024;
    let path = dir.join("journal-probe");
    let cannot = |what: &'static str| {
        let path = path.clone();
        move || format!("cannot {what} {}", path.display())
    };
    fs::write(&path, vec![0u8; FILE_BYTES]).context(cannot("write"))?;
    let plain = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .context(cannot("open"))?;
    plain.sync_all().context(cannot("sync"))?;
    let alignment = crate::sys::direct_io_alignment(&plain)
        .ok()
        .flatten()
        .filter(|alignment| *alignment <= 4096);
    let (file, block) = match alignment {
        Some(alignment) => (
            crate::sys::open_direct_dsync(&path).context(cannot("open with O_DIRECT"))?,
            alignment,
        ),
        None => (plain, FSYNC_RECORD_BYTES),
    };
    // An aligned block of record-like bytes.
    let mut storage = vec![b'x'; 2 * 4096];
    let offset = storage.as_ptr().align_offset(4096);
    let record = &mut storage[offset..offset + block];
    let mut samples = Vec::with_capacity(count_max);
    let started = Instant::now();
    let mut at = 0;
    while samples.len() < count_max && (samples.is_empty() || started.elapsed() < time_max) {
        let written = Instant::now();
        std::os::unix::fs::FileExt::write_all_at(&file, record, at as u64)
            .and_then(|()| match alignment {
                Some(_) => Ok(()),
                None => file.sync_data(),
            })
            .context(cannot("write to"))?;
        samples.push(written.elapsed().as_secs_f64());
        at = (at + block) % FILE_BYTES;
        record[0] = record[0].wrapping_add(1);
    }
    drop(file);
    fs::remove_file(&path).context(cannot("remove"))?;
    samples.sort_by(f64::total_cmp);
    Ok(percentile(&samples, 0.50))
}

// ---------------------------------------------------------------------------
// Scenario: scale

fn scale(bench: &Bench) -> Result<Vec<Measure>> {
    let sizes = bench.sizes;
    let clients = sizes.scale_clients;
    let mut wconfd = Wconfd::start(bench)?;
    let small = lock_loop_rate(&wconfd, clients, "empty", sizes)?;

    let table = fill_table(&wconfd, sizes)?;
    // The node locks plus their group node/[lockset], in use indirectly.
    let locks = table.len() * sizes.scale_locks_per_owner + 1;
    expect_lock_count(&wconfd, locks).context(|| "after filling the table".to_owned())?;
    let large = lock_loop_rate(&wconfd, clients, "table", sizes)?;
    expect_lock_count(&wconfd, locks).context(|| "after the lock loop".to_owned())?;

    // The table must come back whole: its owners' livelocks are alive.
    wconfd.stop()?;
    // Both restarts replay this journal: their cost grows with it.
    let journal_bytes = journal_round_bytes(&wconfd.root.join(JOURNAL_FILE))?;
    let after_stop = wconfd.spawn()?;
    expect_lock_count(&wconfd, locks).context(|| "after a restart".to_owned())?;
    wconfd.kill()?;
    let after_kill = wconfd.spawn()?;
    expect_lock_count(&wconfd, locks).context(|| "after kill -9 and a restart".to_owned())?;
    wconfd.stop()?;
    // Only now may the table's owners die (their livelocks are released).
    drop(table);

    let held = format!(
        "{} locks / {}",
        grouped(locks as u64 - 1),
        counted(sizes.scale_owners, "owner")
    );
    let restart = Target::Below(RESTART_SECONDS_MAX);
    Ok(vec![
        Measure::new(
            format!("empty table, {clients} clients"),
            Unit::PerSecond,
            small,
        ),
        Measure::new(format!("{held}, {clients} clients"), Unit::PerSecond, large),
        Measure::new(
            "cost per RPC, ratio large/empty",
            Unit::Ratio,
            small / large,
        )
        .with_target(Target::AtMost(SCALE_RATIO_MAX)),
        Measure::new(
            format!("restart after SIGTERM, {held}"),
            Unit::Seconds,
            after_stop.as_secs_f64(),
        )
        .with_target(restart),
        Measure::new(
            format!("restart after kill -9, {held}"),
            Unit::Seconds,
            after_kill.as_secs_f64(),
        )
        .with_target(restart),
        Measure::new(
            "journal read by each restart",
            Unit::Bytes,
            journal_bytes as f64,
        ),
    ])
}

/// Creates the owners of the large table and has each take its node locks
/// exclusively, in pipelined batches; answers the owners, whose livelocks
/// must stay held for the table to stay.
fn fill_table(wconfd: &Wconfd, sizes: &Sizes) -> Result<Vec<BenchOwner>> {
    let owners = (0..sizes.scale_owners)
        .map(|index| BenchOwner::new(&wconfd.livelock_dir, &format!("table-{index:05}")))
        .collect::<Result<Vec<_>>>()?;
    let mut client = wconfd.connect()?;
    for batch in owners.chunks(sizes.setup_batch) {
        for owner in batch {
            let request = (0..sizes.scale_locks_per_owner)
                .map(|slot| Entry::exclusive(node_lock(&format!("{}-{slot:02}", owner.name))))
                .collect();
            client.send(&frame(
                &WconfdRequest::TryUpdateLocks {
                    owner: owner.owner.clone(),
                    request,
                }
                .encode(),
            ))?;
        }
        for owner in batch {
            expect_granted(client.receive()?)
                .context(|| format!("the table locks of {}", owner.name))?;
        }
    }
    Ok(owners)
}

/// Bytes of the records of the journal's current round, which a restart
/// reads (the file is zero-filled ahead of them, so its size says little):
/// records from the header on while their sequence numbers follow.
fn journal_round_bytes(path: &Path) -> Result<u64> {
    let bytes = fs::read(path).context(|| format!("cannot read {}", path.display()))?;
    let field = |at: usize, width: usize| -> u64 {
        bytes[at..at + width]
            .iter()
            .rev()
            .fold(0, |value, byte| value << 8 | u64::from(*byte))
    };
    let mut at = JOURNAL_HEADER_BYTES;
    let mut previous: Option<u64> = None;
    while at + RECORD_HEADER_BYTES <= bytes.len() {
        let length = field(at + 4, 4) as usize;
        let seq = field(at + 8, 8);
        if length == 0 || previous.is_some_and(|last| seq != last + 1) {
            break;
        }
        previous = Some(seq);
        at += RECORD_HEADER_BYTES + length;
    }
    Ok((at.min(bytes.len()) - JOURNAL_HEADER_BYTES) as u64)
}

// ---------------------------------------------------------------------------
// Scenario: death

fn death(bench: &Bench) -> Result<Vec<Measure>> {
    let mut wconfd = Wconfd::start(bench)?;
    let waiter = BenchOwner::new(&wconfd.livelock_dir, "waiter")?;
    let x = node_lock("x");
    let wanted = vec![Entry::exclusive(x.clone())];
    let await_x = frame(
        &WconfdRequest::AwaitLocks {
            fence: false,
            owner: waiter.owner.clone(),
            priority: 0,
            request: wanted.clone(),
            timeout_ms: AWAIT_TIMEOUT_MS,
        }
        .encode(),
    );
    let release_x = frame(
        &WconfdRequest::TryUpdateLocks {
            owner: waiter.owner.clone(),
            request: vec![Entry::release(x)],
        }
        .encode(),
    );
    let pending = frame(
        &WconfdRequest::HasPendingRequest {
            owner: waiter.owner.clone(),
        }
        .encode(),
    );
    let mut control = wconfd.connect()?;
    let mut waiting = wconfd.connect()?;
    let mut seconds = Vec::with_capacity(bench.sizes.death_kills);
    for kill in 0..bench.sizes.death_kills {
        let name = format!("holder-{kill}");
        let mut holder = Holder::spawn(&bench.exe, &wconfd.livelock_dir, &name)?;
        let take_x = frame(
            &WconfdRequest::TryUpdateLocks {
                owner: holder.owner.clone(),
                request: wanted.clone(),
            }
            .encode(),
        );
        control
            .call_granted(&take_x)
            .context(|| format!("{name} taking node/x"))?;
        waiting.send(&await_x)?;
        // The await is held (not answered) once wconfd has filed it.
        wait_until(&mut control, &pending, &json!(true))
            .context(|| "the waiter's awaitLocks to be filed".to_owned())?;

        let killed = Instant::now();
        holder.kill()?;
        expect_granted(waiting.receive()?).context(|| {
            format!(
                "the waiter's awaitLocks after kill -9 of {name} (within {AWAIT_TIMEOUT_MS} ms)"
            )
        })?;
        seconds.push(killed.elapsed().as_secs_f64());

        holder.reap()?;
        waiting.call_granted(&release_x)?;
    }
    expect_lock_count(&wconfd, 0).context(|| "after the last kill".to_owned())?;
    wconfd.stop()?;
    seconds.sort_by(f64::total_cmp);
    Ok(vec![
        Measure::new(
            "p50 kill -9 to grant",
            Unit::Seconds,
            percentile(&seconds, 0.50),
        ),
        Measure::new(
            "p99 kill -9 to grant",
            Unit::Seconds,
            percentile(&seconds, 0.99),
        )
        .with_target(Target::Below(DEATH_P99_SECONDS_MAX)),
    ])
}

// ---------------------------------------------------------------------------
// Scenario: events

fn events(bench: &Bench) -> Result<Vec<Measure>> {
    let mut wconfd = Wconfd::start(bench)?;
    let owner = BenchOwner::new(&wconfd.livelock_dir, "events")?;
    let [acquire, release] = lock_pair(&owner);
    let mut updater = wconfd.connect()?;
    let mut watcher = wconfd.connect()?;
    // A sequence with events written: while a fresh one's first event is
    // not, wconfd answers a watch from 0 with EventsExpired [2] (its first
    // kept is taken as one past the last when no segment exists yet).
    for frame in [&acquire, &release] {
        updater.call_granted(frame)?;
    }
    let mut since = events_position(&mut watcher, watch_request)?;
    let samples = bench.sizes.event_samples;
    let mut watched_samples = WatchSamples::default();
    for sample in 0..samples {
        let watch = frame(&watch_request(WatchEvents {
            since: Some(since),
            types: Some(vec!["lock.granted".to_owned()]),
            timeout: WATCH_TIMEOUT,
        }));
        let watched = harness::watch_change(
            &mut watcher,
            &watch,
            &mut updater,
            &acquire,
            WATCH_HOLD_PAUSE,
        )
        .context(|| format!("sample {sample} of {samples}"))?;
        expect_granted(&watched.reply).context(|| format!("acquire of {}", owner.name))?;
        let (events, next) = harness::watch_answer(&watched.answer)?;
        match events {
            [event] if event["type"] == "lock.granted" && event["owner"] == owner.name.as_str() => {
            }
            _ => {
                return fail(format!(
                    "the watch for {}'s grant answered {}",
                    owner.name, watched.answer
                ));
            }
        }
        since = next;
        watched_samples.add(watched.sent, watched.replied, watched.answered);
        updater
            .call_granted(&release)
            .context(|| format!("release of {}", owner.name))?;
    }
    expect_lock_count(&wconfd, 0).context(|| "after the updates".to_owned())?;
    wconfd.stop()?;
    Ok(watched_samples.figures("update", EVENT_P50_SECONDS_MAX))
}

/// `watchEvents` as a request.
fn watch_request(watch: WatchEvents) -> Request {
    WconfdRequest::WatchEvents(watch).encode()
}

// ---------------------------------------------------------------------------
// Scenario: reporter

fn reporter(bench: &Bench) -> Result<Vec<Measure>> {
    let sizes = bench.sizes;
    let address = free_loopback_address()?;
    let mut wconfd = Wconfd::create(bench, ServerKind::Wconfd, &reporter_settings(&address))?;
    wconfd.spawn()?;
    let warden = bench.warden.as_ref().expect("found at the bench's start");
    let mut control = wconfd.connect()?;

    let churned = Instant::now();
    let before = events_position(&mut control, watch_request)?;
    let last = churn_until(&wconfd, &mut control, sizes.reporter_events as u64, "churn")?;
    let churn_rate = (last - before) as f64 / churned.elapsed().as_secs_f64();

    // A reporter with nothing saved reads the whole sequence.
    let mut first = Reporter::new(warden, &wconfd.root, wconfd.dir.join("reporter-1.log"));
    let spawned = Instant::now();
    first.spawn()?;
    wait_read(&mut first, &address, last)?;
    let first_seconds = spawned.elapsed().as_secs_f64();
    let first_events = last;

    // Its position saved, a crash; more events meanwhile.
    wait_saved(&mut first, &wconfd.root, last)?;
    first.kill()?;
    let saved = saved_read(&wconfd.root, "wconfd")?;
    let target = last + sizes.takeover_events as u64;
    let last = churn_until(&wconfd, &mut control, target, "more")?;
    let new_events = last - saved;

    // The next one resumes from the saved position.
    let mut second = Reporter::new(warden, &wconfd.root, wconfd.dir.join("reporter-2.log"));
    let spawned = Instant::now();
    second.spawn()?;
    wait_read(&mut second, &address, last)?;
    let takeover_seconds = spawned.elapsed().as_secs_f64();
    second.stop()?;
    expect_lock_count(&wconfd, 0).context(|| "after the churn".to_owned())?;
    wconfd.stop()?;

    let target = Target::AtLeast(REPORTER_EVENTS_PER_SECOND_MIN);
    Ok(vec![
        Measure::new(
            format!("sequence built ({CHURN_CLIENTS} clients, pipelined)"),
            Unit::PerSecond,
            churn_rate,
        ),
        Measure::new(
            format!(
                "first reporter, spawn to {} events read",
                grouped(first_events)
            ),
            Unit::Seconds,
            first_seconds,
        ),
        Measure::new(
            "first reporter, events read",
            Unit::PerSecond,
            first_events as f64 / first_seconds,
        )
        .with_target(target),
        Measure::new(
            format!(
                "takeover after kill -9, spawn to {} new events read",
                grouped(new_events)
            ),
            Unit::Seconds,
            takeover_seconds,
        ),
        Measure::new(
            "takeover, new events read",
            Unit::PerSecond,
            new_events as f64 / takeover_seconds,
        )
        .with_target(target),
        Measure::new(
            "takeover / first reporter, time",
            Unit::Ratio,
            takeover_seconds / first_seconds,
        ),
    ])
}

/// Churns locks ([`CHURN_CLIENTS`] clients, [`CHURN_BATCH`] updates in
/// flight each, one event per update) until wconfd's sequence reaches
/// `target`; answers its last event then.
fn churn_until(wconfd: &Wconfd, control: &mut Client, target: u64, tag: &str) -> Result<u64> {
    let owners = (0..CHURN_CLIENTS)
        .map(|index| BenchOwner::new(&wconfd.livelock_dir, &format!("{tag}-{index}")))
        .collect::<Result<Vec<_>>>()?;
    loop {
        let position = events_position(control, watch_request)?;
        if position >= target {
            return Ok(position);
        }
        // Pairs of updates per client, so each ends holding nothing.
        let missing = (target - position) as usize;
        let updates = 2 * missing.div_ceil(2 * CHURN_CLIENTS);
        let connections = (0..CHURN_CLIENTS)
            .map(|_| wconfd.connect())
            .collect::<Result<Vec<_>>>()?;
        thread::scope(|scope| {
            let workers: Vec<_> = owners
                .iter()
                .zip(connections)
                .map(|(owner, client)| scope.spawn(move || churn(client, owner, updates)))
                .collect();
            workers.into_iter().try_for_each(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
        })?;
    }
}

/// One client of the churn: `updates` (even) lock updates of its own
/// owner, acquire and release in turn, [`CHURN_BATCH`] sent before their
/// replies are read, every reply checked.
fn churn(mut client: Client, owner: &BenchOwner, updates: usize) -> Result<()> {
    let pair = lock_pair(owner);
    let mut left = updates;
    let mut batch = Vec::new();
    while left > 0 {
        let count = left.min(CHURN_BATCH);
        batch.clear();
        for index in 0..count {
            batch.extend_from_slice(&pair[index % 2]);
        }
        client.send(&batch)?;
        for _ in 0..count {
            expect_granted(client.receive()?).context(|| format!("churn of {}", owner.name))?;
        }
        left -= count;
    }
    Ok(())
}

/// Waits until the reporter's `/status.json` at `address` says it has read
/// wconfd's sequence up to `last`.
fn wait_read(reporter: &mut Reporter, address: &str, last: u64) -> Result<()> {
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    let mut read = 0;
    loop {
        if let Some(status) = reporter_status(address)? {
            read = reporter_read(&status, "wconfd")?;
            if read >= last {
                return Ok(());
            }
        }
        reporter.check_running()?;
        if Instant::now() > deadline {
            return fail(format!(
                "the reporter read {read} of {last} events in {} s",
                PROCESS_TIMEOUT.as_secs()
            ));
        }
        thread::sleep(STATUS_POLL_PAUSE);
    }
}

/// Waits until the reporter's saved state holds wconfd's sequence up to
/// `last` at least (it saves every second).
fn wait_saved(reporter: &mut Reporter, root: &Path, last: u64) -> Result<()> {
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    loop {
        let saved = saved_read(root, "wconfd")?;
        if saved >= last {
            return Ok(());
        }
        reporter.check_running()?;
        if Instant::now() > deadline {
            return fail(format!(
                "the reporter saved {saved} of {last} events read in {} s",
                PROCESS_TIMEOUT.as_secs()
            ));
        }
        thread::sleep(POLL_PAUSE.max(STATUS_POLL_PAUSE));
    }
}

/// Repeats `frame` until its result is `expected`, for at most
/// [`REPLY_TIMEOUT`]. Queries change nothing, so each costs no sync.
fn wait_until(client: &mut Client, frame: &[u8], expected: &Value) -> Result<()> {
    let deadline = Instant::now() + REPLY_TIMEOUT;
    loop {
        let result = result_of(client.call(frame)?)?;
        if result == *expected {
            return Ok(());
        }
        if Instant::now() > deadline {
            return fail(format!(
                "still {result} after {} s, expected {expected}",
                REPLY_TIMEOUT.as_secs()
            ));
        }
    }
}

/// The holder process of `death`: another copy of this executable holding
/// its own livelock. Killed with SIGKILL (and reaped) when dropped.
struct Holder {
    child: Child,
    /// Its owner, with its pid.
    owner: Owner,
    reaped: bool,
}

impl Holder {
    /// Starts a holder and waits until it holds its livelock.
    fn spawn(exe: &Path, livelock_dir: &Path, name: &str) -> Result<Holder> {
        let child = Command::new(exe)
            .arg("--hold-livelock")
            .arg(livelock_dir)
            .arg(name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context(|| format!("cannot start {}", exe.display()))?;
        let mut holder = Holder {
            owner: bench_owner(name, &livelock_dir.join(name), child.id()),
            child,
            reaped: false,
        };
        let stdout = holder.child.stdout.take().expect("stdout was piped");
        let mut line = String::new();
        // A holder that fails exits, which ends this read.
        BufReader::new(stdout)
            .read_line(&mut line)
            .context(|| format!("cannot read from holder {name}"))?;
        if line.trim() != "ready" {
            return fail(format!("holder {name} did not get ready (said {line:?})"));
        }
        Ok(holder)
    }

    fn kill(&mut self) -> Result<()> {
        self.child
            .kill()
            .context(|| format!("cannot kill holder {}", self.child.id()))
    }

    fn reap(&mut self) -> Result<()> {
        self.child
            .wait()
            .context(|| format!("cannot reap holder {}", self.child.id()))?;
        self.reaped = true;
        Ok(())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `wconfd-bench --hold-livelock DIR NAME`: takes the livelock `DIR/NAME`,
/// says "ready" and holds it until killed, or until its stdin closes (the
/// bench ended), so no holder outlives the bench.
fn hold_livelock(dir: &Path, name: &str) -> Result<()> {
    let livelock = Livelock::create(dir, name)
        .context(|| format!("cannot take the livelock {}", dir.join(name).display()))?;
    let mut stdout = io::stdout();
    writeln!(stdout, "ready")
        .and_then(|()| stdout.flush())
        .context(|| "cannot say ready".to_owned())?;
    let _ = io::stdin().read_to_end(&mut Vec::new());
    drop(livelock);
    Ok(())
}

// ---------------------------------------------------------------------------
// wconfd

/// wconfd (or the null server standing in for it) on a fresh root of its
/// own. The daemon is killed and the root removed when this is dropped.
struct Wconfd {
    kind: ServerKind,
    daemon: Daemon,
    /// Holds the root and wconfd's log.
    dir: PathBuf,
    root: PathBuf,
    livelock_dir: PathBuf,
    /// `--reporter`: started by [`Wconfd::spawn`] once wconfd answers (if
    /// it does not run yet), stopped by [`Wconfd::stop`].
    reporter: Option<Reporter>,
}

/// What answers on the socket.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ServerKind {
    Wconfd,
    /// This executable's [`null_server`]: the machine's ceiling.
    Null,
}

impl Wconfd {
    /// Starts wconfd on a fresh root and waits until it answers.
    fn start(bench: &Bench) -> Result<Wconfd> {
        Wconfd::start_kind(bench, ServerKind::Wconfd)
    }

    /// Starts `kind` on a fresh root (with a reporter beside wconfd if
    /// `--reporter` asks) and waits until it answers.
    fn start_kind(bench: &Bench, kind: ServerKind) -> Result<Wconfd> {
        let attach = bench.attach_reporter && kind == ServerKind::Wconfd;
        let settings = if attach {
            reporter_settings("")
        } else {
            String::new()
        };
        let mut wconfd = Wconfd::create(bench, kind, &settings)?;
        if attach {
            let warden = bench.warden.as_ref().expect("found at the bench's start");
            let log = wconfd.dir.join("reporter.log");
            wconfd.reporter = Some(Reporter::new(warden, &wconfd.root, log));
        }
        wconfd.spawn()?;
        Ok(wconfd)
    }

    /// A fresh root with `settings` as its `warden.toml` (none if empty);
    /// nothing runs yet.
    fn create(bench: &Bench, kind: ServerKind, settings: &str) -> Result<Wconfd> {
        let dir = bench.workspace.next_run_dir();
        let root = dir.join("root");
        fs::create_dir_all(&root).context(|| format!("cannot create {}", root.display()))?;
        if !settings.is_empty() {
            let path = root.join(SETTINGS_FILE);
            fs::write(&path, settings).context(|| format!("cannot write {}", path.display()))?;
        }
        let (binary, flag) = match kind {
            ServerKind::Wconfd => (&bench.wconfd, "--root"),
            ServerKind::Null => (&bench.exe, "--null-server"),
        };
        let daemon = Daemon::new(
            "wconfd",
            binary,
            flag,
            &root,
            root.join(SOCKET_PATH),
            dir.join("wconfd.log"),
        );
        Ok(Wconfd {
            kind,
            daemon,
            livelock_dir: root.join(LIVELOCK_DIR),
            root,
            dir,
            reporter: None,
        })
    }

    /// Starts wconfd on the root and answers the time from the spawn to its
    /// first `echo` reply; then its reporter, if it has one that does not
    /// run, until it is elected.
    fn spawn(&mut self) -> Result<Duration> {
        let spawned = Instant::now();
        let mut client = self.daemon.spawn()?;
        let echo =
            result_of(client.call(&frame(&WconfdRequest::Echo("ready?".to_owned()).encode()))?)?;
        let elapsed = spawned.elapsed();
        if echo != json!("ready?") && self.kind == ServerKind::Wconfd {
            return fail(format!("wconfd echoed {echo}, not \"ready?\""));
        }
        if let Some(reporter) = self.reporter.as_mut().filter(|r| !r.is_running()) {
            reporter.spawn()?;
            wait_elected(&mut client, reporter)?;
        }
        Ok(elapsed)
    }

    /// Stops the reporter (if one runs), then wconfd.
    fn stop(&mut self) -> Result<()> {
        if let Some(reporter) = self.reporter.as_mut().filter(|r| r.is_running()) {
            reporter.stop()?;
        }
        self.daemon.stop()
    }

    /// kill -9, as a crash: the next start replays the journal.
    fn kill(&mut self) -> Result<()> {
        self.daemon.kill()
    }

    fn connect(&self) -> Result<Client> {
        self.daemon.connect()
    }
}

impl Drop for Wconfd {
    fn drop(&mut self) {
        if let Some(reporter) = &mut self.reporter {
            let _ = reporter.kill();
        }
        let _ = self.daemon.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Checks that `listAllLocks` lists exactly `count` locks besides the
/// service level's (a reporter's, which `--reporter` adds).
fn expect_lock_count(wconfd: &Wconfd, count: usize) -> Result<()> {
    let mut client = wconfd.connect()?;
    let locks = result_of(client.call(&frame(&WconfdRequest::ListAllLocks.encode()))?)?;
    let Some(locks) = locks.as_array() else {
        return fail(format!("listAllLocks answered {locks}, not a list"));
    };
    let listed = locks
        .iter()
        .filter(|lock| {
            !lock
                .as_str()
                .is_some_and(|name| name.starts_with("service/"))
        })
        .count();
    if listed != count {
        return fail(format!(
            "listAllLocks lists {listed} locks (besides service/), expected {count}"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The null server: the machine's ceiling

/// The reply of the null server to every frame: a granted lock update.
const NULL_REPLY: &[u8] = b"{\"success\":true,\"result\":[]}\x03";

/// How often the null server looks at its stop flag when idle.
const NULL_SERVER_TICK: Duration = Duration::from_millis(50);

/// Serves `root`'s wconfd socket doing nothing at all: every frame gets
/// [`NULL_REPLY`] at once. One thread and one mio loop, as wconfd, so the
/// lock loop against it measures what the machine's sockets, scheduler and
/// this client cost before wconfd does any work. Stops on SIGTERM.
fn null_server(root: &Path) -> Result<()> {
    use mio::net::{UnixListener, UnixStream as MioStream};
    use mio::{Events, Interest, Poll, Token};

    const LISTENER: Token = Token(usize::MAX);
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))
        .context(|| "cannot handle SIGTERM".to_owned())?;
    let path = root.join(SOCKET_PATH);
    // The bench's owners keep their livelocks where wconfd's would be.
    for dir in [
        path.parent().expect("the socket has a directory"),
        &root.join(LIVELOCK_DIR),
    ] {
        fs::create_dir_all(dir).context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut listener =
        UnixListener::bind(&path).context(|| format!("cannot bind {}", path.display()))?;
    let mut poll = Poll::new().context(|| "cannot create a poll".to_owned())?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .context(|| "cannot watch the listener".to_owned())?;
    // Per connection: the stream and the replies not yet written.
    let mut connections: Vec<Option<(MioStream, Vec<u8>)>> = Vec::new();
    let mut events = Events::with_capacity(1024);
    let mut buffer = vec![0; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match poll.poll(&mut events, Some(NULL_SERVER_TICK)) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            other => other.context(|| "cannot poll".to_owned())?,
        }
        for event in &events {
            if event.token() == LISTENER {
                while let Ok((mut stream, _)) = listener.accept() {
                    let token = Token(connections.len());
                    poll.registry()
                        .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
                        .context(|| "cannot watch a connection".to_owned())?;
                    connections.push(Some((stream, Vec::new())));
                }
                continue;
            }
            let slot = &mut connections[event.token().0];
            let Some((stream, pending)) = slot else {
                continue;
            };
            let mut open = true;
            loop {
                match stream.read(&mut buffer) {
                    Ok(0) => {
                        open = false;
                        break;
                    }
                    Ok(read) => {
                        let frames = buffer[..read].iter().filter(|&&byte| byte == ETX).count();
                        for _ in 0..frames {
                            pending.extend_from_slice(NULL_REPLY);
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        open = false;
                        break;
                    }
                }
            }
            while open && !pending.is_empty() {
                match stream.write(pending) {
                    Ok(written) => {
                        pending.drain(..written);
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => open = false,
                }
            }
            if !open {
                *slot = None;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Client side of the protocol

/// The lock loop's call on a connection to wconfd.
trait CallGranted {
    /// Sends a lock update and checks that it was granted.
    fn call_granted(&mut self, frame: &[u8]) -> Result<()>;
}

impl CallGranted for Client {
    fn call_granted(&mut self, frame: &[u8]) -> Result<()> {
        expect_granted(self.call(frame)?)
    }
}

/// The result of a reply of wconfd.
fn result_of(reply: &[u8]) -> Result<Value> {
    harness::result_of("wconfd", reply)
}

/// Checks that a lock update answered `[]` (granted, nobody blocks it).
fn expect_granted(reply: &[u8]) -> Result<()> {
    // wconfd's exact bytes for `[]`: the lock loop checks every reply
    // without parsing it, so the bench's own CPU stays off the figures.
    // Anything else is parsed, so another spelling of `[]` still passes.
    const GRANTED: &[u8] = br#"{"success":true,"result":[]}"#;
    if reply == GRANTED {
        return Ok(());
    }
    match result_of(reply)? {
        Value::Array(blockers) if blockers.is_empty() => Ok(()),
        other => fail(format!("expected [] (granted), got {other}")),
    }
}

/// A lock owner the bench acts as, its livelock held by this process.
struct BenchOwner {
    name: String,
    owner: Owner,
    _livelock: Livelock,
}

impl BenchOwner {
    fn new(livelock_dir: &Path, name: &str) -> Result<BenchOwner> {
        let livelock = Livelock::create(livelock_dir, name)
            .context(|| format!("cannot take the livelock {name}"))?;
        Ok(BenchOwner {
            name: name.to_owned(),
            owner: bench_owner(name, livelock.path(), std::process::id()),
            _livelock: livelock,
        })
    }
}

/// An owner named `name` with `livelock` and `pid`. The workspace path
/// was checked to be UTF-8, so the lossy conversion is exact.
/// `node/<name>`.
fn node_lock(name: &str) -> LockName {
    LockName::parse(&format!("node/{name}")).expect("the bench's node names are valid")
}

fn bench_owner(name: &str, livelock: &Path, pid: u32) -> Owner {
    Owner::named(name, livelock.to_string_lossy(), pid)
}

// ---------------------------------------------------------------------------
// Runs (measures and reports: crate::bench)

fn run_scenario(scenario: Scenario, bench: &Bench) -> Result<Report> {
    let description = describe(scenario, bench.sizes);
    bench::run_scenario(scenario, &description, bench.runs, || scenario.run(bench))
}

fn describe(scenario: Scenario, sizes: &Sizes) -> String {
    let window = format!(
        "{} warm-up, then {} measured",
        Unit::Seconds.format(sizes.warmup.as_secs_f64()),
        Unit::Seconds.format(sizes.window.as_secs_f64())
    );
    match scenario {
        Scenario::Throughput => format!(
            "N clients (thread + connection + owner each) loop tryUpdateLocks \
             [cluster/BGL shared, node/<own> exclusive] then [both release];\n   \
             every reply checked; lock RPCs/s over {window}; N = {};\n   \
             the same against a null server (answers every frame at once: the ceiling);\n   \
             then the disk's bound for one write in flight: clients / (1.5 journal writes)",
            sizes.throughput_clients.map(|n| n.to_string()).join(", ")
        ),
        Scenario::Latency => format!(
            "one client, round trips of the same acquire/release (at most {} or {});\n   \
             fsync = median of {FSYNC_RECORD_BYTES} B append + fdatasync in the root's \
             file system (at most {} or {});\n   journal write = median of one block \
             written with O_DIRECT | O_DSYNC into a zero-filled file there (or an \
             overwrite + fdatasync without direct I/O)",
            grouped(sizes.latency_rtts_max as u64),
            Unit::Seconds.format(sizes.latency_time_max.as_secs_f64()),
            grouped(sizes.fsyncs_max as u64),
            Unit::Seconds.format(sizes.fsync_time_max.as_secs_f64()),
        ),
        Scenario::Scale => format!(
            "the {}-client loop ({window}) on an empty table, then with {} owners \
             holding {} node locks each\n   (set up with pipelined tryUpdateLocks, \
             {} per batch); then restarts with that table: spawn to first echo \
             reply,\n   after SIGTERM and after kill -9 (journal replay); \
             listAllLocks checked after each step",
            sizes.scale_clients,
            grouped(sizes.scale_owners as u64),
            sizes.scale_locks_per_owner,
            sizes.setup_batch,
        ),
        Scenario::Death => format!(
            "a holder process (its own livelock) holds node/x, a waiter blocks in \
             awaitLocks (timeout {AWAIT_TIMEOUT_MS} ms);\n   time from kill -9 of the \
             holder to the waiter's [] reply; {} kills per run",
            sizes.death_kills
        ),
        Scenario::Events => format!(
            "one connection holds watchEvents [since, [\"lock.granted\"], 30] (since: where \
             the last answer ended),\n   another sends, {} later, tryUpdateLocks \
             [cluster/BGL shared, node/<own> exclusive]: time from\n   sending it to the \
             watch's answer arriving (one lock.granted of that owner), then the release; \
             {} samples",
            Unit::Seconds.format(WATCH_HOLD_PAUSE.as_secs_f64()),
            grouped(sizes.event_samples as u64),
        ),
        Scenario::Reporter => format!(
            "{CHURN_CLIENTS} clients churn locks ({CHURN_BATCH} tryUpdateLocks in flight \
             each, one event each) until the sequence\n   holds {} events, no reporter; \
             then warden reporter (endpoint on a free loopback port): spawn to\n   \
             /status.json reporter.read.wconfd at the last event; once reporter/state.json \
             holds it, kill -9,\n   {} more events, a second reporter: spawn to the new \
             last event read (from the saved position)",
            grouped(sizes.reporter_events as u64),
            grouped(sizes.takeover_events as u64),
        ),
    }
}

// ---------------------------------------------------------------------------
// Output

/// What a figure needs beside it to mean something later: the machine, the
/// code, the binaries, the file system under the roots and the load.
fn print_context(bench: &Bench) -> Result<()> {
    let context = BenchContext::read();
    let sizes = bench.sizes;
    let fsync = fsync_cost(
        &bench.workspace.dir,
        FSYNC_RECORD_BYTES,
        sizes.fsyncs_max,
        sizes.fsync_time_max,
    )?;
    context.print(
        "wconfd-bench: the real wconfd over its socket, one fresh root per run",
        &bench.command_line,
    );
    println!(
        "wconfd  : {} (built {})",
        bench.wconfd.display(),
        age(&bench.wconfd)
    );
    if let Some(warden) = &bench.warden {
        println!("warden  : {} (built {})", warden.display(), age(warden));
    }
    println!(
        "reporter: {}",
        if bench.attach_reporter {
            "beside every wconfd (--reporter), [metrics] listen = \"\""
        } else {
            "none (but the reporter scenario's own)"
        }
    );
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
