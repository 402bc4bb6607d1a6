//! Every limit warden enforces, in one place, each with the reason for its
//! value. Each has a test that exceeds it and gets a clear error.

use std::ops::RangeInclusive;
use std::time::Duration;

/// Longest lock name accepted, in bytes of its wire form. Ganeti's names are
/// host names and UUIDs (well under 256 bytes); anything near this is a bug
/// or an attack, and names are copied into several indexes.
pub const LOCK_NAME_BYTES_MAX: usize = 1024;

// Livelocks (LIVENESS.md).

/// Longest livelock file name accepted, in bytes: `NAME_MAX` of Linux file
/// systems. A longer name cannot exist as a file, so an owner naming one is
/// refused up front.
pub const LIVELOCK_NAME_BYTES_MAX: usize = 255;

/// A livelock file younger than this (by its modification time) is never
/// removed as stale: between creating its file and locking it a process holds
/// no lock yet (Ganeti's clients create, then `lockf`), and removing the file
/// in that gap would make a live owner look dead for good.
pub const LIVELOCK_STALE_AGE_MIN: Duration = Duration::from_secs(60);

/// How often `Livelock::create` tries before giving up. A probe or a stale
/// removal holds a livelock's flock for microseconds and may remove a stale
/// file of the same name under it; a retry settles both, a live holder
/// still refuses every attempt.
pub const LIVELOCK_CREATE_ATTEMPTS: u32 = 8;

/// Pause between two attempts of `Livelock::create` that found the flock
/// held: long enough for a probe to finish, short enough to be unnoticeable
/// at the start of a process.
pub const LIVELOCK_CREATE_RETRY_PAUSE: Duration = Duration::from_millis(1);

// Settings of warden.toml (OPERATIONS.md "Settings"): the default of each
// and the range accepted. Names follow the settings' keys.

/// Largest `warden.toml` read: a settings file is a few hundred bytes; a
/// bigger one is a mistake, and nothing is read without a bound.
pub const SETTINGS_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// `[wconfd] death_check_interval_ms`: Ganeti's period for probing lock
/// owners' livelocks; exits of runners are noticed sooner by other means.
pub const WCONFD_DEATH_CHECK_INTERVAL_MS_DEFAULT: u64 = 5_000;
/// Below 10 ms the periodic probe of every owner would be busy work; above
/// an hour dead owners would hold locks for too long.
pub const DEATH_CHECK_INTERVAL_MS_RANGE: RangeInclusive<u64> = 10..=3_600_000;

/// `[wconfd] frame_bytes_max`: largest request or answer frame; the biggest
/// legitimate frames (a lock listing of a large cluster, a job with many
/// opcodes) are a few MiB.
pub const WCONFD_FRAME_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;
/// `[luxid] frame_bytes_max`: as for wconfd; job submissions and query
/// answers are of the same order.
pub const LUXID_FRAME_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;
/// A frame must hold at least a small request (4 KiB); above 1 GiB one
/// connection could exhaust the daemon's memory.
pub const FRAME_BYTES_MAX_RANGE: RangeInclusive<usize> = 4 * 1024..=1024 * 1024 * 1024;

/// `[wconfd] connections_max` and `[luxid] connections_max`: open client
/// connections; one per running job and client, so 1024 leaves a wide
/// margin over `max_running_jobs` (the daemon raises its descriptor limit
/// to fit).
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Buffer bytes (read or write) a connection keeps once it is empty: one
/// read chunk. A larger buffer, left by a large frame, is freed, so idle
/// connections cost at most this each instead of up to the frame limit.
pub const CONNECTION_BUFFER_RETAINED_BYTES_MAX: usize = 64 * 1024;

/// An answer at least this large makes the daemon give its free memory
/// back to the system once it is written (`sys::release_free_memory`): big
/// answers are rare and built from many small allocations, and the walk
/// of the free lists is small beside building them.
pub const RELEASE_MEMORY_AFTER_ANSWER_BYTES: usize = 1024 * 1024;

/// Replies (in bytes) a connection of either daemon may have waiting to be
/// written before the daemon stops reading it until its client reads: a
/// client that sends requests and never reads cannot make the daemon buffer
/// without bound.
pub const CONNECTION_OUTPUT_BYTES_MAX: usize = 16 * 1024 * 1024;
/// At least one client must fit; above 65536 the per-connection buffers
/// alone would be gigabytes.
pub const CONNECTIONS_MAX_RANGE: RangeInclusive<usize> = 1..=65_536;

/// `[wconfd] request_entries_max`: lock entries in one request; Ganeti's
/// largest requests name every node and instance of a cluster (thousands).
pub const WCONFD_REQUEST_ENTRIES_MAX_DEFAULT: usize = 10_000;
/// At least one entry; above a million one request would stall the event
/// loop for a noticeable time.
pub const REQUEST_ENTRIES_MAX_RANGE: RangeInclusive<usize> = 1..=1_000_000;

/// `[wconfd] snapshot_journal_bytes_max`: journal size that triggers a new
/// snapshot of the lock state; bounds both disk use and replay time at
/// start-up (replay runs at about 35 MB/s on a 2-core machine, so 16 MiB
/// keeps a restart well under a second).
pub const WCONFD_SNAPSHOT_JOURNAL_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;
/// At least 64 KiB, or snapshots would be written all the time; at most
/// 64 GiB, or replay after a crash could take minutes.
pub const SNAPSHOT_JOURNAL_BYTES_MAX_RANGE: RangeInclusive<u64> =
    64 * 1024..=64 * 1024 * 1024 * 1024;

/// Longest `awaitLocks` timeout wconfd accepts: an hour; a runner that
/// waits longer asks again, and a held request costs wconfd an entry
/// until then.
pub const AWAIT_TIMEOUT_MS_MAX: u64 = 3_600_000;

/// `[luxid] max_running_jobs`: Ganeti's default number of jobs running at
/// once (each is a process holding a wconfd connection).
pub const LUXID_MAX_RUNNING_JOBS_DEFAULT: usize = 20;
/// At least one job must be able to run; above 10000 processes the machine,
/// not warden, is the limit.
pub const MAX_RUNNING_JOBS_RANGE: RangeInclusive<usize> = 1..=10_000;

/// Fields named by one `QueryJobs` or `WaitForJobChange`: there are 16
/// fields, and a held `WaitForJobChange` keeps its list for up to 89 s,
/// so a frame-sized list of repeated names on each of many connections
/// must not add up to gigabytes.
pub const QUERY_FIELDS_MAX: usize = 1_000;

/// Jobs in one `SubmitManyJobs`: a submission is checked and written in
/// one turn of luxid's loop before any reply, at 0.4 to 1.4 ms a job on the
/// machines warden is measured on, so other clients wait at most about a
/// second behind the largest one.
pub const SUBMIT_MANY_JOBS_MAX: usize = 1_000;

/// `[wconfd] slow_wait_s`: a lock wait this long writes its blocking
/// chain into the job's log once (the flight recorder, SCHEDULING.md).
pub const SLOW_WAIT_SECS_DEFAULT: u64 = 60;

/// Locks of dead owners whose next grantee has not been told yet, kept at
/// most (the oldest are forgotten first): a dead job's own locks, never
/// taken again, must not pile up.
pub const DEATH_MARKS_MAX: usize = 10_000;
pub const SLOW_WAIT_SECS_RANGE: RangeInclusive<u64> = 0..=86_400;

/// The most job filter rules luxid keeps: every rule is tried on every
/// job when the rules change, and each job once when it is submitted.
pub const FILTER_RULES_MAX: usize = 1_000;

/// `[luxid] queue_jobs_max`: jobs not yet archived; each is a file in
/// `queue/` and an entry in luxid's memory, and a queue this long already
/// means jobs are submitted far faster than they run.
pub const LUXID_QUEUE_JOBS_MAX_DEFAULT: usize = 100_000;
/// At least one job; above ten million the queue directory and luxid's
/// memory would be unmanageable.
pub const QUEUE_JOBS_MAX_RANGE: RangeInclusive<usize> = 1..=10_000_000;

/// `[luxid] job_log_bytes_max`: log bytes kept per job before a truncation
/// entry; job files are rewritten on every change, so their size is paid
/// again and again.
pub const LUXID_JOB_LOG_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// At least 1 KiB so a truncation entry and some log fit; at most 1 GiB,
/// which no job file should ever approach.
pub const JOB_LOG_BYTES_MAX_RANGE: RangeInclusive<usize> = 1024..=1024 * 1024 * 1024;

// Jobs (JOBS.md).

/// Longest `WaitForJobChange` wait, in seconds: Ganeti's cap. Its client
/// asks for less and calls again; a longer hold would outlive client
/// timeouts.
pub const WAIT_FOR_CHANGE_SECONDS_MAX: f64 = 89.0;

/// Longest `OP_EXEC` timeout accepted, in seconds (a year): longer is no
/// timeout in practice, and `null` says so plainly.
pub const EXEC_TIMEOUT_SECS_MAX: f64 = 365.0 * 24.0 * 3600.0;

/// Longest `lock_timeout` accepted, in seconds (a year), as for `timeout`:
/// `null` says "wait for ever" plainly.
pub const LOCK_TIMEOUT_SECS_MAX: f64 = EXEC_TIMEOUT_SECS_MAX;

/// Blockers named in a lock timeout's result: each costs the runner one
/// `listLocks` call; past a few dozen the list no longer helps a person
/// find the culprit, and the result stays small.
pub const LOCK_TIMEOUT_BLOCKERS_MAX: usize = 32;

/// `OP_EXEC`'s `kill_grace` when absent, in seconds: time for a program
/// to clean up after SIGTERM before its group gets SIGKILL (systemd's
/// default stop timeout is longer; a job's locks are held meanwhile).
pub const KILL_GRACE_SECS_DEFAULT: f64 = 10.0;

/// Longest `kill_grace` accepted, in seconds (an hour): the job holds its
/// locks through the grace, and a program that needs longer to stop
/// should be given a longer `timeout` instead.
pub const KILL_GRACE_SECS_MAX: f64 = 3600.0;

/// Most retries of one `OP_EXEC` (`retry.max`, after the first attempt):
/// each attempt writes log entries and holds the job's locks; a program
/// that needs more is better retried by its own loop.
pub const RETRY_MAX: u64 = 100;

/// Longest pause between two attempts (`retry.backoff`), in seconds (an
/// hour): the job holds its locks while it waits.
pub const RETRY_BACKOFF_SECS_MAX: f64 = 3600.0;

/// Latest `start_by` accepted, as a Unix time in seconds (the end of the
/// year 9999): later is a unit mistake (milliseconds), not a deadline.
pub const START_BY_SECS_MAX: f64 = 253_402_300_799.0;

/// Longest `unique_key`, in bytes: a key names a job (a cron line, a
/// request id), and luxid keeps one per unfinished job in memory.
pub const UNIQUE_KEY_BYTES_MAX: usize = 256;

/// Longest output line of an `OP_EXEC` program kept as one log entry, in
/// bytes; a longer line is cut into pieces of this size. Bounds what one
/// entry can cost (a program writing megabytes without a newline would
/// otherwise grow one buffer without limit).
pub const OUTPUT_LINE_BYTES_MAX: usize = 64 * 1024;

/// How long a starting luxid waits for the queue lock before it says
/// another luxid runs. A killed luxid lets go of the lock only once its
/// process is gone: a runner it was spawning keeps a copy of the lock's
/// descriptor until the child's exec closes it, and a thread of it in a
/// sync keeps the process until the sync returns, which on a busy disk
/// has taken over a second (seen under the crash harness).
pub const QUEUE_LOCK_WAIT: Duration = Duration::from_secs(5);
/// Pause between two attempts at the queue lock.
pub const QUEUE_LOCK_RETRY_PAUSE: Duration = Duration::from_millis(5);

/// How often the livelock of a dead runner's job, or of a runner another
/// luxid started, is probed should its inotify close event be missed (a
/// livelock found by name only).
pub const RELEASE_PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// How often the end of a dead runner's job is written again when the disk
/// refused it (full, read-only): the job ends promptly once the disk takes
/// writes again, and a full disk costs a write attempt, not a busy loop.
pub const DEAD_JOB_WRITE_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// A temp file in the queue directory younger than this is never removed
/// as a crash's leftover: it may be a live runner's write in progress.
pub const STALE_TEMP_AGE_MIN: Duration = Duration::from_secs(60);

// Queries (`Query`, `QueryFields`).

/// Operators and operands in one query filter. A filter is evaluated on
/// every job a query looks at, so its size multiplies the cost of the
/// query; Ganeti's `gnt-job list` with a thousand job ids sends about a
/// thousand nodes.
pub const QUERY_FILTER_NODES_MAX: usize = 10_000;

/// Regular expressions (`=~`) in one query filter: each is compiled once
/// per query, up to [`QUERY_FILTER_REGEX_BYTES_MAX`], so this bounds the
/// memory one query's patterns can take (16 MiB).
pub const QUERY_FILTER_REGEXES_MAX: usize = 16;

/// Compiled size of one regular expression of a query filter, in bytes
/// (the regex crate's size limit): far above any pattern a person writes
/// (`^web\d+\.example\.com$` is a few KiB), far below what a pattern of
/// repetitions could otherwise claim.
pub const QUERY_FILTER_REGEX_BYTES_MAX: usize = 1024 * 1024;

// Clients of both daemons (PROTOCOL.md "1. Transport").

/// How long one read or write on a client's connection may block before
/// the daemon counts as hung. Both daemons answer every request within
/// milliseconds but a held one (`awaitLocks`, `WaitForJobChange`, at most
/// [`WAIT_FOR_CHANGE_SECONDS_MAX`]); a held `awaitLocks` is waited for by
/// the caller's event loop, not by a blocking read.
pub const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(120);

/// Bytes asked of a socket or a pipe per read: a frame or a burst of a
/// program's output in a few reads, at a fixed cost per read.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Error texts quote at most this many characters of a client's string:
/// enough to recognise it, never a frame's worth of it in a log line.
pub const QUOTED_CHARS_MAX: usize = 100;

// The job runner (JOBS.md "Runner lifecycle").

/// Log entries are written at most this often (status changes at once):
/// a program printing thousands of lines costs a few file writes a
/// second, and a watching client still sees its output promptly.
pub const LOG_FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// The timeout of one `awaitLocks` call of a runner; on timeout it asks
/// again. Long, as a grant is answered at once, but below wconfd's limit.
pub const AWAIT_TIMEOUT_MS: u64 = 60_000;

/// How much longer than an `awaitLocks` timeout its answer may take before
/// wconfd counts as hung.
pub const AWAIT_ANSWER_GRACE: Duration = Duration::from_secs(30);

/// An opcode whose locks are granted within this is never shown `waiting`:
/// its `waiting` and `running` go to the job file in one write. Short
/// against anything a watcher could act on; long enough for wconfd's
/// answer to an uncontended request (one journal sync).
pub const WAITING_SHOWN_AFTER: Duration = Duration::from_millis(3);

/// The first pause before a runner connects to an unreachable wconfd
/// again; it doubles up to [`WCONFD_RECONNECT_PAUSE_MAX`]. A restarted
/// wconfd serves within milliseconds.
pub const WCONFD_RECONNECT_PAUSE_MIN: Duration = Duration::from_millis(2);

/// The longest pause between two attempts to reach wconfd: a runner
/// waiting for a wconfd that stays down costs a connect attempt every
/// half second, and notices its return within that.
pub const WCONFD_RECONNECT_PAUSE_MAX: Duration = Duration::from_millis(500);

/// How long luxid waits for wconfd's answer to one of its calls before
/// it counts the connection as hung, drops it and asks again on a new one
/// (wconfd answers within milliseconds when it runs; luxid goes on serving
/// meanwhile either way).
pub const WCONFD_ANSWER_DEADLINE: Duration = Duration::from_secs(5);

/// How long a submission asking for workers waits for wconfd's check
/// before it is refused: past a reconnection or two.
pub const WORKERS_CHECK_DEADLINE: Duration = Duration::from_secs(15);

/// How long wconfd holds luxid's `watchWorkers` with nothing to tell: a
/// held watch costs nothing, and one answered empty now and then shows
/// the link alive.
pub const WORKER_WATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// luxid's calls waiting for wconfd at most: one per job whose runner died
/// while wconfd did not answer. Past this a call is not made (wconfd's own
/// probe of dead owners frees them), so a wconfd that stays away cannot
/// make luxid's memory grow.
pub const WCONFD_CALLS_QUEUED_MAX: usize = 100_000;

/// Bytes read from one pipe of an `OP_EXEC` program before the runner
/// looks at its other duties (the timeout, the other pipe, the log
/// flush): a program writing without pause cannot starve them.
pub const READ_BUDGET_BYTES: usize = 1024 * 1024;

/// Read budgets spent on a pipe after the program exited, at most: what
/// the pipe held at the exit (64 KiB by default) fits many times over.
pub const DRAIN_AFTER_EXIT_BUDGETS: usize = 16;

/// How often a runner looks in `/proc` for the descendants of a timed-out
/// program that exited within its grace (nothing signals their exits).
pub const DESCENDANTS_POLL: Duration = Duration::from_millis(20);

/// How long a runner waits for a timed-out program's descendants to die
/// of their SIGKILL; one stuck in the kernel beyond that is left to the
/// job's end.
pub const KILLED_WAIT_MAX: Duration = Duration::from_secs(5);

/// Longest socket path `bind` takes (`OP_TEST_DELAY`'s socket):
/// `sun_path` is 108 bytes, with the terminating NUL.
pub const SOCKET_PATH_BYTES_MAX: usize = 107;

// The `warden` command.

/// How long one `WaitForJobChange` may be held by `watch` on a terminal:
/// short, so that the elapsed time on the status line moves.
pub const WATCH_POLL_TERMINAL: Duration = Duration::from_secs(1);
/// How long one `WaitForJobChange` may be held by `watch` elsewhere:
/// well under [`WAIT_FOR_CHANGE_SECONDS_MAX`] and [`CLIENT_IO_TIMEOUT`].
pub const WATCH_POLL: Duration = Duration::from_secs(30);

/// How often the demo looks at the jobs, the locks and the workers.
pub const DEMO_LOOK_INTERVAL: Duration = Duration::from_millis(25);
/// How long the demo's jobs (and its workers' last prepares) may take
/// before the demo gives up on them.
pub const DEMO_JOBS_DEADLINE: Duration = Duration::from_secs(60);

/// How long a daemon the launcher started may take from spawn to
/// answering on its socket (recovery of a large state takes about a
/// second).
pub const DAEMON_READY_WAIT: Duration = Duration::from_secs(30);
/// Pause between two connection attempts while a daemon starts.
pub const DAEMON_READY_RETRY_PAUSE: Duration = Duration::from_millis(5);
/// How long a daemon may take to stop after SIGTERM before the launcher
/// kills it.
pub const DAEMON_STOP_GRACE: Duration = Duration::from_secs(10);

// Workers (WORKERS.md).

/// Workers one job may ask for (`count`): Boruta has no limit, but a
/// request of hundreds is a mistake, and the all-or-nothing match costs
/// a sort of the fitting workers each time one becomes idle.
pub const WORKERS_PER_JOB_MAX: usize = 64;

/// Groups of one worker or one request: a handful in every farm, and the
/// match compares them for every idle worker.
pub const WORKER_GROUPS_MAX: usize = 256;

/// Workers in one page of `listWorkers` (Boruta's 16-bit limit); a limit
/// of 0 or above means this.
pub const WORKERS_PAGE_MAX: usize = 65_535;

/// Workers fitting a request that `WhyJob` names at most (with how many
/// fit in all): as many as the largest request asks for.
pub const WHY_WORKERS_MAX: usize = WORKERS_PER_JOB_MAX;

/// Notices for luxid wconfd keeps unread before it drops them: a reader
/// that far behind (or none) is given the whole registry state instead,
/// which says the same.
pub const WORKER_NOTICES_MAX: usize = 65_536;

/// `[workers] quarantine_after`: 0 is off; past a worker's remembered
/// history ([`crate::workers::HISTORY_MAX`]) a row could not be seen.
pub const QUARANTINE_AFTER_RANGE: RangeInclusive<usize> = 0..=20;

// Durable state (`store`).

/// Largest journal record accepted when reading; a longer length field is
/// not a record (requests are bounded far below this by the frame limit).
pub const JOURNAL_RECORD_BYTES_MAX: usize = 1 << 30;

/// Entities a configuration lock violation names (in its log line, its
/// error and its event), at most; the rest are counted. A write may change
/// every instance of a large cluster, and ten say what went wrong.
pub const CONFIG_VIOLATIONS_NAMED_MAX: usize = 10;

// The crash harness (`torture`): how long it waits for what it started
// before it reports a hang.

/// Longest wait for a job whose runner is dead to be marked final.
pub const TORTURE_DEATH_MARK_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest `awaitLocks` of a lock client: short, so that a check waiting
/// for the clients' requests to finish is never held up long.
pub const TORTURE_AWAIT_TIMEOUT_MS: u64 = 150;

/// Longest wait for a started daemon to answer.
pub const TORTURE_DAEMON_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause between connection attempts to a starting daemon.
pub const TORTURE_READY_POLL_PAUSE: Duration = Duration::from_millis(2);

/// Longest wait for an owner's process to ignore SIGHUP.
pub const TORTURE_OWNER_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// After the chaos: how long every acknowledged job may take to end.
pub const TORTURE_SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Events one segment file of an event sequence holds before the next
/// begins (retention removes whole segments).
pub const EVENTS_SEGMENT_EVENTS: u64 = 65_536;

/// Bytes read from a segment's head or tail to find its first or last
/// event (an event line is far shorter).
pub const EVENTS_TAIL_BYTES: usize = 64 * 1024;

/// Events kept per daemon, at least (`[events] keep`).
pub const EVENTS_KEEP_DEFAULT: u64 = 1_000_000;

/// A sequence keeps at least two segments, so that luxid's checkpoint is
/// never older than what is kept.
pub const EVENTS_KEEP_RANGE: RangeInclusive<u64> = 2 * EVENTS_SEGMENT_EVENTS..=1_000_000_000;

/// And at least every event this recent (`[events] keep_secs`).
pub const EVENTS_KEEP_SECS_DEFAULT: u64 = 3600;

pub const EVENTS_KEEP_SECS_RANGE: RangeInclusive<u64> = 0..=365 * 24 * 3600;

/// Events in one `WatchEvents` answer, at most.
pub const WATCH_EVENTS_MAX: usize = 10_000;

/// Type prefixes in one `WatchEvents` call, at most, each at most this
/// long.
pub const WATCH_EVENTS_TYPES_MAX: usize = 64;
pub const WATCH_EVENTS_TYPE_BYTES_MAX: usize = 128;

/// The reporter's Prometheus endpoint (`[metrics] listen`): loopback.
pub const METRICS_LISTEN_DEFAULT: &str = "127.0.0.1:9188";

/// At most one statsd report per gauge this often (`[metrics]
/// interval_ms`).
pub const METRICS_INTERVAL_MS_DEFAULT: u64 = 1000;
pub const METRICS_INTERVAL_MS_RANGE: RangeInclusive<u64> = 10..=3_600_000;

/// A statsd packet's payload, at most (fits any network's MTU).
pub const STATSD_PACKET_BYTES_MAX: usize = 512;

/// Hooks running at once, at most.
pub const HOOKS_RUNNING_MAX: usize = 4;

/// A hook's run is killed after this long.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// A failing hook is run again this many times, after pauses doubling from
/// `HOOK_RETRY_PAUSE`.
pub const HOOK_RETRIES: u32 = 3;
pub const HOOK_RETRY_PAUSE: Duration = Duration::from_millis(500);
