//! The crash harness behind `bin/torture.rs`: real wconfd, luxid and job
//! runners on a temp root, clients submitting jobs and churning locks,
//! a worker client churning a board farm that jobs ask for, and a chaos
//! thread that kills the daemons, runners and lock owners with
//! SIGKILL at seeded random moments and starts the daemons again. What the
//! clients were acknowledged is checked after every restart and at the
//! end (see [`checks`]).
//!
//! A run is named by its seed: every thread draws from its own stream of
//! it ([`rng::Rng::stream`]), so a seed replays the same schedule of
//! actions. The operating system's timing differs from run to run, so the
//! moment an action lands (and what it hits: the runner picked among those
//! alive, say) may differ too.

pub mod checks;
pub mod config_client;
pub mod events;
pub mod fences;
pub mod history;
pub mod job_clients;
pub mod lock_clients;
pub mod processes;
pub mod rng;
pub mod worker_clients;

use crate::limits::TORTURE_SETTLE_TIMEOUT;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use self::history::{Interval, Serials};
use self::lock_clients::ClientModel;
use self::processes::{Binaries, DaemonProcess, OwnerProcess};
use self::rng::Rng;

/// Threads submitting jobs.
const JOB_CLIENTS: usize = 3;
/// Threads churning locks on wconfd.
const LOCK_CLIENTS: usize = 3;
/// Reporters kept running: one elected, one standing by.
const REPORTERS: usize = 2;
/// The root's settings: a small scheduler limit (jobs queue up and
/// contend), a quick periodic death check, small snapshots (kills land
/// around them too).
const SETTINGS: &str = "[wconfd]\ndeath_check_interval_ms = 250\n\
                        snapshot_journal_bytes_max = 262144\n\
                        [luxid]\nmax_running_jobs = 8\n";
/// The run's length without `--duration`, and with `--long`.
pub const DURATION_DEFAULT: Duration = Duration::from_secs(20);
pub const DURATION_LONG: Duration = Duration::from_secs(300);

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub duration: Duration,
    /// Where the root goes (kept); default: a temp directory, removed
    /// after a passing run.
    pub root: Option<PathBuf>,
    pub binaries: Binaries,
}

/// Counts of a run, for its report.
#[derive(Debug, Default)]
pub struct Figures {
    pub wconfd_kills: AtomicU64,
    pub luxid_kills: AtomicU64,
    pub runner_kills: AtomicU64,
    pub owner_kills: AtomicU64,
    pub wconfd_starts: AtomicU64,
    pub luxid_starts: AtomicU64,
    pub restart_checks: AtomicU64,
    /// Lock tables of wconfd checked for conflicting holders.
    pub table_checks: AtomicU64,
    pub jobs_submitted: AtomicU64,
    pub submits_lost: AtomicU64,
    pub cancels: AtomicU64,
    pub cancels_killing: AtomicU64,
    pub dequeued: AtomicU64,
    pub many_submissions: AtomicU64,
    pub priority_changes: AtomicU64,
    pub archived: AtomicU64,
    pub auto_archived: AtomicU64,
    pub config_writes: AtomicU64,
    pub config_writes_lost: AtomicU64,
    pub config_checks: AtomicU64,
    pub jobs_checked: AtomicU64,
    pub owners: AtomicU64,
    pub grants: AtomicU64,
    pub blocked: AtomicU64,
    pub releases: AtomicU64,
    pub lock_answers_lost: AtomicU64,
    pub lost_but_applied: AtomicU64,
    pub resyncs: AtomicU64,
    pub intervals_checked: AtomicU64,
    pub job_intervals: AtomicU64,
    pub young_livelocks: AtomicU64,
    pub worker_jobs: AtomicU64,
    pub worker_jobs_refused: AtomicU64,
    pub worker_changes: AtomicU64,
    pub worker_answers_lost: AtomicU64,
    pub farm_checks: AtomicU64,
    pub filter_changes: AtomicU64,
    pub held_jobs_checked: AtomicU64,
    pub unique_hits: AtomicU64,
    pub unique_keys_checked: AtomicU64,
    pub holds_checked: AtomicU64,
    pub handovers_checked: AtomicU64,
    pub reporter_starts: AtomicU64,
    pub reporter_kills: AtomicU64,
    pub events_checked: AtomicU64,
    pub stories_checked: AtomicU64,
    pub hooks_checked: AtomicU64,
    /// Opcodes with a `retry` checked at the end, and of them with
    /// `on_death`.
    pub retry_ops_checked: AtomicU64,
    pub on_death_ops_checked: AtomicU64,
    pub attempts_checked: AtomicU64,
    /// Attempts luxid counted for a runner's death (`on_death`).
    pub death_attempts: AtomicU64,
    /// Opcodes that ended `success` after a failed attempt.
    pub retried_to_success: AtomicU64,
    /// Canceled jobs whose attempts were checked against the cancel.
    pub canceled_attempts_checked: AtomicU64,
    pub exec_timeouts_checked: AtomicU64,
    pub lock_timeouts_checked: AtomicU64,
    pub start_by_checked: AtomicU64,
    pub start_by_canceled: AtomicU64,
    /// Fenced `awaitLocks` grants of the lock clients.
    pub fenced_grants: AtomicU64,
    /// Tokens of grants answered without one, learnt from listings.
    pub tokens_learnt: AtomicU64,
    /// `listAllLocksOwners` with tokens read and checked.
    pub token_listings: AtomicU64,
    /// `checkFence` answers checked (for a lock held, or released).
    pub fence_checks: AtomicU64,
    pub fence_checks_released: AtomicU64,
    /// Tokens seen in all (at the end).
    pub tokens_seen: AtomicU64,
    /// Deaths told (each once), all checked at the end; of them, of the
    /// lock clients' owners.
    pub deaths_told: AtomicU64,
    pub deaths_of_lock_owners: AtomicU64,
}

impl Figures {
    pub fn lines(&self) -> Vec<String> {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        vec![
            format!(
                "kills     : wconfd {}, luxid {}, runners {}, lock owners {}",
                get(&self.wconfd_kills),
                get(&self.luxid_kills),
                get(&self.runner_kills),
                get(&self.owner_kills)
            ),
            format!(
                "starts    : wconfd {}, luxid {}; {} checks after restarts, \
                 {} lock tables checked",
                get(&self.wconfd_starts),
                get(&self.luxid_starts),
                get(&self.restart_checks),
                get(&self.table_checks)
            ),
            format!(
                "jobs      : {} acknowledged and checked final at the end ({} checked), \
                 {} submissions lost to kills",
                get(&self.jobs_submitted),
                get(&self.jobs_checked),
                get(&self.submits_lost)
            ),
            format!(
                "cancels   : {} asked ({} with kill), {} of them dequeued",
                get(&self.cancels),
                get(&self.cancels_killing),
                get(&self.dequeued)
            ),
            format!(
                "queue ops : {} SubmitManyJobs, {} priority changes, {} jobs archived \
                 by ArchiveJob and {} by AutoArchiveJobs",
                get(&self.many_submissions),
                get(&self.priority_changes),
                get(&self.archived),
                get(&self.auto_archived)
            ),
            format!(
                "config    : {} writes acknowledged, {} answers lost to kills, \
                 {} configurations read and checked",
                get(&self.config_writes),
                get(&self.config_writes_lost),
                get(&self.config_checks)
            ),
            format!(
                "locks     : {} owners, {} grants, {} blocked, {} releases, \
                 {} answers lost ({} of them applied, {} resyncs)",
                get(&self.owners),
                get(&self.grants),
                get(&self.blocked),
                get(&self.releases),
                get(&self.lock_answers_lost),
                get(&self.lost_but_applied),
                get(&self.resyncs)
            ),
            format!(
                "intervals : {} checked for conflicts ({} of them from jobs' opcodes)",
                get(&self.intervals_checked),
                get(&self.job_intervals)
            ),
            format!(
                "livelocks : {} dead files younger than the stale age left (allowed)",
                get(&self.young_livelocks)
            ),
            format!(
                "workers   : {} jobs asked for boards ({} refused: no board of the kind), \
                 {} farm changes acknowledged, {} answers lost, {} farm listings checked, \
                 {} holds and {} handovers checked",
                get(&self.worker_jobs),
                get(&self.worker_jobs_refused),
                get(&self.worker_changes),
                get(&self.worker_answers_lost),
                get(&self.farm_checks),
                get(&self.holds_checked),
                get(&self.handovers_checked)
            ),
            format!(
                "scheduling: {} filter rule changes acknowledged, {} jobs it held checked; \
                 {} submissions answered with a live job's id, {} unique-key jobs checked",
                get(&self.filter_changes),
                get(&self.held_jobs_checked),
                get(&self.unique_hits),
                get(&self.unique_keys_checked)
            ),
            format!(
                "events    : {} events of both sequences checked, {} jobs' stories, \
                 {} hook runs found; reporters started {}, elected ones killed {}",
                get(&self.events_checked),
                get(&self.stories_checked),
                get(&self.hooks_checked),
                get(&self.reporter_starts),
                get(&self.reporter_kills)
            ),
            format!(
                "retries   : {} opcodes with a retry checked ({} with on_death), {} attempts \
                 ({} of them runner deaths luxid counted), {} succeeded after a failed attempt, \
                 {} canceled jobs' attempts checked against their cancel",
                get(&self.retry_ops_checked),
                get(&self.on_death_ops_checked),
                get(&self.attempts_checked),
                get(&self.death_attempts),
                get(&self.retried_to_success),
                get(&self.canceled_attempts_checked)
            ),
            format!(
                "timeouts  : {} execs timed out, {} lock waits timed out; {} jobs with a \
                 start_by checked, {} of them canceled not started",
                get(&self.exec_timeouts_checked),
                get(&self.lock_timeouts_checked),
                get(&self.start_by_checked),
                get(&self.start_by_canceled)
            ),
            format!(
                "fences    : {} fenced grants, {} tokens learnt from listings, {} listings \
                 with tokens checked, {} tokens seen; {} checkFence answers checked ({} after \
                 a release); {} deaths told and checked ({} of lock clients' owners)",
                get(&self.fenced_grants),
                get(&self.tokens_learnt),
                get(&self.token_listings),
                get(&self.tokens_seen),
                get(&self.fence_checks),
                get(&self.fence_checks_released),
                get(&self.deaths_told),
                get(&self.deaths_of_lock_owners)
            ),
        ]
    }
}

/// A job luxid acknowledged.
#[derive(Clone, Debug, Default)]
pub struct SubmittedJob {
    pub depends: Vec<u64>,
    /// A `CancelJob` was sent for it (whatever the answer).
    pub cancel_asked: bool,
    /// ... with `kill`.
    pub kill_asked: bool,
    /// luxid answered that it dequeued the job: it must end `canceled`.
    pub dequeued: bool,
    /// `ArchiveJob` answered true: its file must be in the archive.
    pub archived: bool,
    /// The kind of board it asked for ([`worker_clients::worker_job`]).
    pub workers: Option<&'static str>,
    /// Its `unique_key`.
    pub unique_key: Option<String>,
    /// When luxid first answered a `CancelJob` of it as taken (the
    /// runner told, or the job dequeued), µs.
    pub cancel_taken_us: Option<u64>,
}

/// What the threads of a run share.
pub struct Shared {
    pub seed: u64,
    pub root: PathBuf,
    pub livelock_dir: PathBuf,
    pub binaries: Binaries,
    /// Set when the clients are to stop (the end, or a violation).
    pub stop_clients: AtomicBool,
    /// Clients hold it shared for each request and the update of their
    /// model; a check after a restart holds it exclusively.
    pub gate: RwLock<()>,
    violations: Mutex<Vec<String>>,
    intervals: Mutex<Vec<Interval>>,
    serials: Mutex<Serials>,
    jobs: Mutex<BTreeMap<u64, SubmittedJob>>,
    /// Every owner of the lock clients.
    pub owners: Mutex<Vec<Arc<OwnerProcess>>>,
    /// Owners found killed by their client, and whether wconfd knew them
    /// for sure then (so that their livelock must be removed).
    pub owners_killed: Mutex<Vec<(Arc<OwnerProcess>, bool)>>,
    pub models: Vec<Arc<Mutex<ClientModel>>>,
    /// Jobs whose runner the chaos thread killed.
    pub runners_killed: Mutex<std::collections::BTreeSet<u64>>,
    /// When the chaos thread killed luxid, µs (taken before the signal):
    /// a cancel luxid took is forgotten by the next one (D62).
    pub luxid_kills: Mutex<Vec<u64>>,
    /// The config client's writes.
    pub config: Mutex<config_client::ConfigHistory>,
    /// What wconfd acknowledged to the worker client.
    pub farm: Mutex<worker_clients::FarmModel>,
    /// Set once the farm is registered: jobs asking for boards wait for
    /// it (before, they would be refused).
    pub farm_ready: AtomicBool,
    /// The changes of the harness's one filter rule, in order.
    pub filter: Mutex<Vec<job_clients::FilterChange>>,
    /// Every fencing token and told death seen.
    fences: Mutex<fences::Fences>,
    /// The pids of reporters killed or found exited (their election lock
    /// is freed as a death).
    pub reporters_gone: Mutex<std::collections::BTreeSet<u32>>,
    pub figures: Figures,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stop_clients.load(Ordering::SeqCst)
    }

    /// Records a violation; the run stops.
    pub fn violation(&self, message: String) {
        eprintln!("torture: VIOLATION: {message}");
        locked(&self.violations).push(message);
        self.stop_clients.store(true, Ordering::SeqCst);
    }

    pub fn violations(&self) -> Vec<String> {
        locked(&self.violations).clone()
    }

    pub fn failed(&self) -> bool {
        !locked(&self.violations).is_empty()
    }

    pub fn intervals(&self) -> MutexGuard<'_, Vec<Interval>> {
        locked(&self.intervals)
    }

    pub fn serials(&self) -> MutexGuard<'_, Serials> {
        locked(&self.serials)
    }

    pub fn jobs(&self) -> MutexGuard<'_, BTreeMap<u64, SubmittedJob>> {
        locked(&self.jobs)
    }

    pub fn fences(&self) -> MutexGuard<'_, fences::Fences> {
        locked(&self.fences)
    }

    /// A `listAllLocksOwners [{"tokens": true}]` answer just read: its
    /// tokens and deaths are recorded and checked.
    pub fn observe_tokens(&self, table: &serde_json::Value) {
        self.figures.token_listings.fetch_add(1, Ordering::Relaxed);
        let errors = self.fences().observe_table(table, history::now_us());
        for error in errors {
            self.violation(error);
        }
    }
}

/// Reconnection pauses: 2 ms doubling to 100 ms.
pub struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(2);
    const MAX: Duration = Duration::from_millis(100);

    pub fn new() -> Backoff {
        Backoff(Backoff::FIRST)
    }

    pub fn reset(&mut self) {
        self.0 = Backoff::FIRST;
    }

    /// Sleeps the current pause (shorter once `stop` is set) and doubles
    /// it.
    pub fn wait(&mut self, stop: &AtomicBool) {
        let pause = if stop.load(Ordering::Relaxed) {
            Backoff::FIRST
        } else {
            self.0
        };
        std::thread::sleep(pause);
        self.0 = (self.0 * 2).min(Backoff::MAX);
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

/// A client's connection to a daemon, made again after a loss, with a
/// [`Backoff`] between attempts.
pub struct Connection {
    daemon: crate::client::Daemon,
    client: Option<crate::client::Client>,
    backoff: Backoff,
}

impl Connection {
    pub fn new(daemon: crate::client::Daemon) -> Connection {
        Connection {
            daemon,
            client: None,
            backoff: Backoff::new(),
        }
    }

    /// The connected client, connecting first if needed; None (after a
    /// pause) if the daemon cannot be reached now.
    pub fn get(&mut self, shared: &Shared) -> Option<&mut crate::client::Client> {
        if self.client.is_none() {
            match crate::client::Client::connect(&shared.root, self.daemon, 1 << 24) {
                Ok(client) => {
                    self.backoff.reset();
                    self.client = Some(client);
                }
                Err(_) => {
                    self.backoff.wait(&shared.stop_clients);
                    return None;
                }
            }
        }
        self.client.as_mut()
    }

    /// The connection was lost: the next [`Connection::get`] makes a new
    /// one.
    pub fn lose(&mut self) {
        self.client = None;
    }
}

/// The outcome of a run.
pub struct Outcome {
    pub root: PathBuf,
    pub violations: Vec<String>,
    pub figures: Vec<String>,
    pub elapsed: Duration,
}

/// Runs the harness: chaos for `options.duration`, then the settling and
/// the final checks.
pub fn run(options: &Options) -> Result<Outcome, String> {
    let started = Instant::now();
    let (temp, root) = match &options.root {
        Some(root) => {
            std::fs::create_dir_all(root)
                .map_err(|error| format!("cannot create {}: {error}", root.display()))?;
            (None, root.clone())
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("warden-torture.")
                .tempdir()
                .map_err(|error| format!("cannot make a temp root: {error}"))?;
            let path = temp.path().to_owned();
            (Some(temp), path)
        }
    };
    let root = root
        .canonicalize()
        .map_err(|error| format!("cannot resolve {}: {error}", root.display()))?;
    let settings = format!("{SETTINGS}{}", events::settings(&root)?);
    std::fs::write(root.join(crate::paths::SETTINGS_FILE), settings)
        .map_err(|error| format!("cannot write the settings: {error}"))?;
    let shared = Arc::new(Shared {
        seed: options.seed,
        livelock_dir: root.join(crate::paths::LIVELOCK_DIR),
        root: root.clone(),
        binaries: options.binaries.clone(),
        stop_clients: AtomicBool::new(false),
        gate: RwLock::new(()),
        violations: Mutex::new(Vec::new()),
        intervals: Mutex::new(Vec::new()),
        serials: Mutex::new(Serials::default()),
        jobs: Mutex::new(BTreeMap::new()),
        owners: Mutex::new(Vec::new()),
        owners_killed: Mutex::new(Vec::new()),
        models: (0..LOCK_CLIENTS)
            .map(|_| Arc::new(Mutex::new(ClientModel::default())))
            .collect(),
        runners_killed: Mutex::new(std::collections::BTreeSet::new()),
        luxid_kills: Mutex::new(Vec::new()),
        config: Mutex::new(config_client::ConfigHistory::default()),
        farm: Mutex::new(worker_clients::FarmModel::default()),
        farm_ready: AtomicBool::new(false),
        filter: Mutex::new(Vec::new()),
        fences: Mutex::new(fences::Fences::default()),
        reporters_gone: Mutex::new(std::collections::BTreeSet::new()),
        figures: Figures::default(),
    });
    let mut daemons = checks::Daemons {
        wconfd: DaemonProcess::new(
            "wconfd",
            &options.binaries.wconfd,
            &root,
            crate::paths::WCONFD_SOCKET_PATH,
        ),
        luxid: DaemonProcess::new(
            "luxid",
            &options.binaries.luxid,
            &root,
            crate::paths::LUXID_SOCKET_PATH,
        ),
        reporters: events::Reporters::new(&options.binaries.warden, &root),
    };
    daemons.start_wconfd(&shared)?;
    daemons.start_luxid(&shared)?;
    daemons.reporters.keep(REPORTERS, &shared);

    let threads: Vec<std::thread::JoinHandle<()>> = (0..LOCK_CLIENTS)
        .map(|index| {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("lock-client-{index}"))
                .spawn(move || {
                    let model = Arc::clone(&shared.models[index]);
                    lock_clients::run(&shared, index, &model);
                })
                .expect("spawn a lock client thread")
        })
        .chain((0..JOB_CLIENTS).map(|index| {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("job-client-{index}"))
                .spawn(move || job_clients::run(&shared, index))
                .expect("spawn a job client thread")
        }))
        .chain(std::iter::once({
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("config-client".to_owned())
                .spawn(move || config_client::run(&shared))
                .expect("spawn the config client thread")
        }))
        .chain(std::iter::once({
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("worker-client".to_owned())
                .spawn(move || worker_clients::run(&shared))
                .expect("spawn the worker client thread")
        }))
        .collect();

    let mut rng = Rng::stream(options.seed, 0);
    let chaos_end = Instant::now() + options.duration;
    while Instant::now() < chaos_end && !shared.failed() {
        checks::chaos_step(&mut rng, &shared, &mut daemons);
    }

    // Settle: the daemons up, no more kills; the clients free everything.
    if !daemons.wconfd.is_running() {
        daemons.start_wconfd(&shared)?;
    }
    if !daemons.luxid.is_running() {
        daemons.start_luxid(&shared)?;
    }
    daemons.reporters.keep(REPORTERS, &shared);
    shared.stop_clients.store(true, Ordering::SeqCst);
    for thread in threads {
        if thread.join().is_err() {
            shared.violation("a client thread panicked".to_owned());
        }
    }
    if !shared.failed() {
        checks::final_checks(&shared, &mut daemons, TORTURE_SETTLE_TIMEOUT);
    }
    daemons.reporters.stop(Duration::from_secs(10));
    daemons.luxid.stop(Duration::from_secs(10));
    daemons.wconfd.stop(Duration::from_secs(10));
    // A run stopped by a violation may leave runners waiting for a wconfd
    // that will not come back (D39): end them and their programs.
    for runner in processes::runners(&options.binaries.runner, &root) {
        processes::kill_runner_group(runner);
    }
    let violations = shared.violations();
    let root = if violations.is_empty() {
        root
    } else {
        // Keep a failing run's root for a look.
        temp.map_or(root, tempfile::TempDir::keep)
    };
    Ok(Outcome {
        root,
        violations,
        figures: shared.figures.lines(),
        elapsed: started.elapsed(),
    })
}

/// A seed for a run without `--seed`: the clock and the process id mixed.
pub fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    Rng::new(nanos ^ (u64::from(std::process::id()) << 32)).next_u64()
}
