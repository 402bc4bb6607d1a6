//! The layout of a root directory: where each daemon, the runner and the
//! `warden` command find what they share. Every path here is relative to
//! the root (`--root DIR` or `WARDEN_ROOT`); the queue's files are
//! relative to [`QUEUE_DIR`].

/// The directory of both sockets.
pub const SOCKET_DIR: &str = "socket";
/// wconfd's socket.
pub const WCONFD_SOCKET_PATH: &str = "socket/wconfd.sock";
/// luxid's socket.
pub const LUXID_SOCKET_PATH: &str = "socket/luxid.sock";

/// Held (flock) by the running wconfd of a root.
pub const WCONFD_INSTANCE_LOCK_FILE: &str = "wconfd.lock";
/// Livelock files of owners (runners, clients) and daemons.
pub const LIVELOCK_DIR: &str = "livelocks";
/// The cluster configuration, written by wconfd.
pub const CONFIG_FILE: &str = "config.data";
/// The lock state's snapshot, beside its journal.
pub const LOCK_SNAPSHOT_FILE: &str = "locks.data";
/// The journal of lock operations since the snapshot.
pub const LOCK_JOURNAL_FILE: &str = "locks.journal";
/// The optional settings file.
pub const SETTINGS_FILE: &str = "warden.toml";

/// The job queue: job files, serial, archive, drain flag.
pub const QUEUE_DIR: &str = "queue";

/// Each daemon's event sequence (segment files, EVENTS.md).
pub const LUXID_EVENTS_DIR: &str = "events/luxid";
pub const WCONFD_EVENTS_DIR: &str = "events/wconfd";

/// What luxid's sequence had said of every job at some event, so that a
/// start reads only the events after it (`{"seq": n, "jobs": ...}`).
pub const LUXID_EVENTS_CHECKPOINT_FILE: &str = "events/luxid.checkpoint";

/// The elected reporter's positions in both sequences, its metrics and
/// its last statsd send, for the next one to go on from.
pub const REPORTER_STATE_FILE: &str = "reporter/state.json";
/// Under [`QUEUE_DIR`]: the last serial given, written at a clean stop.
pub const SERIAL_FILE: &str = "serial";
/// Under [`QUEUE_DIR`]: the queue's format version.
pub const VERSION_FILE: &str = "version";
/// Under [`QUEUE_DIR`]: held (flock) by the running luxid.
pub const QUEUE_LOCK_FILE: &str = "lock";
/// Under [`QUEUE_DIR`]: present while the queue is drained.
pub const DRAIN_FILE: &str = "drain";
/// Under [`QUEUE_DIR`]: the job filter rules (absent: none).
pub const FILTERS_FILE: &str = "filters.json";
/// Under [`QUEUE_DIR`]: archived jobs.
pub const ARCHIVE_DIR: &str = "archive";

/// The environment variable that carries a job's workers (a JSON list of
/// `{uuid, caps, groups, address}`) from luxid to its runner and on to
/// its programs.
pub const WORKERS_ENV: &str = "WARDEN_WORKERS";
