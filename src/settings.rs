//! `warden.toml`: the optional settings of the daemons (OPERATIONS.md
//! "Settings").
//!
//! Every setting has a default (in [`crate::limits`], with its reason) and an
//! accepted range; a missing file means all defaults. Unknown sections and
//! keys are errors, so a misspelt setting is never silently ignored.
//!
//! ```toml
//! [wconfd]
//! death_check_interval_ms = 5000
//! frame_bytes_max = 16777216
//! connections_max = 1024
//! request_entries_max = 10000
//! socket_group = "ganeti"        # or a numeric gid; absent: root and the daemon's uid only
//! snapshot_journal_bytes_max = 16777216
//! slow_wait_s = 60               # a lock wait this long logs who is in the way, once; 0: never
//! fairness = "ganeti"            # or "fifo": new requests queue behind conflicting waiters
//! deadlock_check = "refuse"      # or "off": a wait that closes a cycle waits, as in Ganeti
//! config_lock_check = "off"      # or "log", "refuse": a config write changing an instance,
//!                                # node or node group whose lock the writer lacks
//!
//! [luxid]
//! max_running_jobs = 20
//! frame_bytes_max = 16777216
//! connections_max = 1024
//! queue_jobs_max = 100000
//! job_log_bytes_max = 1048576
//! runner_path = "/usr/lib/warden/job-runner"   # absent: beside luxid
//!
//! [workers]
//! quarantine_after = 0           # holders in a row ending in error that fail a worker; 0: off
//!
//! [events]
//! keep = 1000000                 # events kept per daemon, at least
//! keep_secs = 3600               # and at least everything this recent
//!
//! [metrics]
//! listen = "127.0.0.1:9188"      # the reporter's Prometheus endpoint; "" : none
//! statsd = "127.0.0.1:8125"      # absent: no statsd
//! prefix = "warden"
//! interval_ms = 1000             # at most one statsd report per gauge this often
//!
//! [hooks]
//! "job.finished" = ["/usr/local/bin/notify", "--to", "ops"]
//! ```

use std::fmt;
use std::io::{self, Read};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::limits;
use crate::paths::SETTINGS_FILE;
use crate::store::config_check::ConfigLockCheck;

/// All settings of `warden.toml`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// `[wconfd]`
    pub wconfd: WconfdSettings,
    /// `[luxid]`
    pub luxid: LuxidSettings,
    /// `[workers]`
    pub workers: WorkersSettings,
    /// `[events]`
    pub events: EventsSettings,
    /// `[metrics]`
    pub metrics: MetricsSettings,
    /// `[hooks]`: an event type prefix to the argv run for each event of
    /// that type (no shell).
    pub hooks: std::collections::BTreeMap<String, Vec<String>>,
}

/// `[events]`: each daemon's event sequence (EVENTS.md).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsSettings {
    /// Events kept per daemon, at least.
    pub keep: u64,
    /// And at least every event this many seconds old or newer.
    pub keep_secs: u64,
}

impl Default for EventsSettings {
    fn default() -> Self {
        EventsSettings {
            keep: limits::EVENTS_KEEP_DEFAULT,
            keep_secs: limits::EVENTS_KEEP_SECS_DEFAULT,
        }
    }
}

/// `[metrics]`: what the elected reporter sends and serves.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// `host:port` of the Prometheus endpoint (`/metrics`); empty: none.
    pub listen: String,
    /// `host:port` of a statsd server; `None`: no statsd.
    pub statsd: Option<String>,
    /// The first part of every statsd name.
    pub prefix: String,
    /// At most one statsd report per gauge this often, in milliseconds.
    pub interval_ms: u64,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            listen: limits::METRICS_LISTEN_DEFAULT.to_owned(),
            statsd: None,
            prefix: "warden".to_owned(),
            interval_ms: limits::METRICS_INTERVAL_MS_DEFAULT,
        }
    }
}

/// `[workers]`: the worker registry (WORKERS.md), kept by wconfd.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersSettings {
    /// This many holders in a row, all different jobs, ending in `error`
    /// put a worker in FAILED; 0: never.
    pub quarantine_after: usize,
}

/// `[wconfd]`: the lock daemon.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WconfdSettings {
    /// How often every lock owner's livelock is probed, in milliseconds.
    pub death_check_interval_ms: u64,
    /// Largest request or answer frame, in bytes.
    pub frame_bytes_max: usize,
    /// Most client connections open at once.
    pub connections_max: usize,
    /// Most lock entries in one request.
    pub request_entries_max: usize,
    /// Members of this group may connect, besides root and the daemon's own
    /// uid; `None`: only those two.
    pub socket_group: Option<SocketGroup>,
    /// Journal size, in bytes, that triggers a new snapshot of the lock
    /// state.
    pub snapshot_journal_bytes_max: u64,
    /// A job's lock wait longer than this many seconds writes its blocking
    /// chain once into the job's log, as a `why` entry (0: never).
    pub slow_wait_s: u64,
    /// Whether new requests may overtake conflicting waiters (Ganeti) or
    /// queue behind them (fifo).
    #[serde(deserialize_with = "fairness")]
    pub fairness: crate::locks::Fairness,
    /// Whether a waiting request that would close a cycle of waits is
    /// refused, naming the cycle, or waits as in Ganeti.
    #[serde(deserialize_with = "deadlock_check")]
    pub deadlock_check: crate::locks::Deadlocks,
    /// What a configuration write that changes an instance, node or node
    /// group whose lock the writer does not hold exclusively gets: nothing
    /// (off), a log line, an event and a count (log), or refused (D70).
    #[serde(deserialize_with = "config_lock_check")]
    pub config_lock_check: ConfigLockCheck,
}

/// `"ganeti"` or `"fifo"` (the lock core knows no serde).
fn fairness<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<crate::locks::Fairness, D::Error> {
    let text = String::deserialize(deserializer)?;
    crate::locks::Fairness::parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "fairness {text:?} is neither \"ganeti\" nor \"fifo\""
        ))
    })
}

/// `"refuse"` or `"off"`.
fn deadlock_check<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<crate::locks::Deadlocks, D::Error> {
    let text = String::deserialize(deserializer)?;
    crate::locks::Deadlocks::parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "deadlock_check {text:?} is neither \"refuse\" nor \"off\""
        ))
    })
}

/// `"off"`, `"log"` or `"refuse"`.
fn config_lock_check<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<ConfigLockCheck, D::Error> {
    let text = String::deserialize(deserializer)?;
    ConfigLockCheck::parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "config_lock_check {text:?} is none of \"off\", \"log\" and \"refuse\""
        ))
    })
}

/// `[luxid]`: the job queue daemon.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LuxidSettings {
    /// Most jobs running (with a runner process) at once.
    pub max_running_jobs: usize,
    /// Largest request or answer frame, in bytes.
    pub frame_bytes_max: usize,
    /// Most client connections open at once.
    pub connections_max: usize,
    /// Most jobs in the queue not yet archived.
    pub queue_jobs_max: usize,
    /// Log bytes kept per job before a truncation entry.
    pub job_log_bytes_max: usize,
    /// The `job-runner` executable; `None`: the one beside luxid's own
    /// executable. Must be absolute.
    pub runner_path: Option<PathBuf>,
}

impl Default for WconfdSettings {
    fn default() -> Self {
        WconfdSettings {
            death_check_interval_ms: limits::WCONFD_DEATH_CHECK_INTERVAL_MS_DEFAULT,
            frame_bytes_max: limits::WCONFD_FRAME_BYTES_MAX_DEFAULT,
            connections_max: limits::CONNECTIONS_MAX_DEFAULT,
            request_entries_max: limits::WCONFD_REQUEST_ENTRIES_MAX_DEFAULT,
            socket_group: None,
            snapshot_journal_bytes_max: limits::WCONFD_SNAPSHOT_JOURNAL_BYTES_MAX_DEFAULT,
            slow_wait_s: limits::SLOW_WAIT_SECS_DEFAULT,
            fairness: crate::locks::Fairness::Ganeti,
            deadlock_check: crate::locks::Deadlocks::Refuse,
            config_lock_check: ConfigLockCheck::Off,
        }
    }
}

impl Default for LuxidSettings {
    fn default() -> Self {
        LuxidSettings {
            max_running_jobs: limits::LUXID_MAX_RUNNING_JOBS_DEFAULT,
            frame_bytes_max: limits::LUXID_FRAME_BYTES_MAX_DEFAULT,
            connections_max: limits::CONNECTIONS_MAX_DEFAULT,
            queue_jobs_max: limits::LUXID_QUEUE_JOBS_MAX_DEFAULT,
            job_log_bytes_max: limits::LUXID_JOB_LOG_BYTES_MAX_DEFAULT,
            runner_path: None,
        }
    }
}

impl WconfdSettings {
    /// [`death_check_interval_ms`](Self::death_check_interval_ms) as a
    /// `Duration`.
    pub fn death_check_interval(&self) -> Duration {
        Duration::from_millis(self.death_check_interval_ms)
    }

    /// The lock policy these settings ask for.
    pub fn lock_policy(&self) -> crate::locks::LockPolicy {
        crate::locks::LockPolicy {
            fairness: self.fairness,
            deadlocks: self.deadlock_check,
        }
    }
}

/// The group whose members may connect to a daemon's socket: a group name or
/// a numeric gid (`socket_group = "ganeti"` or `socket_group = 1001`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketGroup {
    /// A group name, looked up in the group database when resolved.
    Name(String),
    /// A numeric gid, used as it is.
    Gid(u32),
}

impl SocketGroup {
    /// The gid of the group, looking a name up in the group database
    /// (`getgrnam_r`, so `/etc/group` or NSS).
    pub fn gid(&self) -> Result<u32, SettingsError> {
        match self {
            SocketGroup::Gid(gid) => Ok(*gid),
            SocketGroup::Name(name) => match nix::unistd::Group::from_name(name) {
                Ok(Some(group)) => Ok(group.gid.as_raw()),
                Ok(None) => Err(SettingsError::UnknownGroup {
                    group: name.clone(),
                    source: None,
                }),
                Err(errno) => Err(SettingsError::UnknownGroup {
                    group: name.clone(),
                    source: Some(io::Error::from(errno)),
                }),
            },
        }
    }
}

impl fmt::Display for SocketGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketGroup::Name(name) => write!(f, "{name:?}"),
            SocketGroup::Gid(gid) => write!(f, "{gid}"),
        }
    }
}

impl<'de> Deserialize<'de> for SocketGroup {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl serde::de::Visitor<'_> for Visitor {
            type Value = SocketGroup;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a group name or a numeric gid")
            }

            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<SocketGroup, E> {
                u32::try_from(value).map(SocketGroup::Gid).map_err(|_| {
                    E::invalid_value(
                        serde::de::Unexpected::Signed(value),
                        &"a gid (0..=4294967295)",
                    )
                })
            }

            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<SocketGroup, E> {
                u32::try_from(value).map(SocketGroup::Gid).map_err(|_| {
                    E::invalid_value(
                        serde::de::Unexpected::Unsigned(value),
                        &"a gid (0..=4294967295)",
                    )
                })
            }

            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<SocketGroup, E> {
                if is_group_name(value) {
                    Ok(SocketGroup::Name(value.to_owned()))
                } else {
                    Err(E::invalid_value(
                        serde::de::Unexpected::Str(value),
                        &"a group name (1 to 256 bytes, no ':', whitespace or control characters)",
                    ))
                }
            }
        }

        deserializer.deserialize_any(Visitor)
    }
}

/// Whether `name` can be a group name: what the group database can hold (no
/// `:` separator, no whitespace or control characters), not empty, bounded.
fn is_group_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && !name
            .chars()
            .any(|c| c == ':' || c.is_whitespace() || c.is_control())
}

/// Why settings could not be loaded. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file exists but cannot be read.
    #[error("cannot read settings file {}: {source}", path.display())]
    Read {
        /// The settings file.
        path: PathBuf,
        /// What reading it gave.
        #[source]
        source: io::Error,
    },
    /// The file is larger than [`limits::SETTINGS_FILE_BYTES_MAX`].
    #[error(
        "settings file {} is larger than {limit} bytes; it cannot be a settings file",
        path.display()
    )]
    TooLarge {
        /// The settings file.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },
    /// Not valid TOML, an unknown section or key, or a value of the wrong
    /// type. The message is toml's, with the line, the column and the key.
    #[error("invalid settings file {}: {message}", path.display())]
    Parse {
        /// The settings file.
        path: PathBuf,
        /// toml's description, naming line, column and key.
        message: String,
    },
    /// A value outside its accepted range.
    #[error(
        "invalid settings file {}: [{section}] {key} = {value} is out of range (accepted: {range})",
        path.display()
    )]
    OutOfRange {
        /// The settings file.
        path: PathBuf,
        /// The section, `wconfd` or `luxid`.
        section: &'static str,
        /// The key within the section.
        key: &'static str,
        /// The value given.
        value: u64,
        /// The accepted range, as `low..=high`.
        range: String,
    },
    /// A value of the right type that is not acceptable for another reason.
    #[error("invalid settings file {}: [{section}] {key}: {reason}", path.display())]
    Invalid {
        /// The settings file.
        path: PathBuf,
        /// The section, `wconfd` or `luxid`.
        section: &'static str,
        /// The key within the section.
        key: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// `socket_group` names a group that the group database does not have
    /// (or could not be asked).
    #[error(
        "socket_group {group:?} is not a known group{}",
        source.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
    )]
    UnknownGroup {
        /// The group name.
        group: String,
        /// The lookup's error, if it failed rather than found nothing.
        #[source]
        source: Option<io::Error>,
    },
}

impl Settings {
    /// Loads `<root>/warden.toml`: all defaults if the file does not exist,
    /// an error naming the file if it cannot be read, is not valid TOML, has
    /// an unknown section or key, a value of the wrong type, or a value out
    /// of range.
    pub fn load(root: &Path) -> Result<Settings, SettingsError> {
        let path = root.join(SETTINGS_FILE);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Ok(Settings::default());
            }
            Err(source) => return Err(SettingsError::Read { path, source }),
        };
        let limit = limits::SETTINGS_FILE_BYTES_MAX;
        let mut text = String::new();
        // One byte more than the limit tells "exactly at" from "beyond".
        if let Err(source) = file.take(limit + 1).read_to_string(&mut text) {
            return Err(SettingsError::Read { path, source });
        }
        if text.len() as u64 > limit {
            return Err(SettingsError::TooLarge { path, limit });
        }
        Settings::parse(&text, &path)
    }

    /// Parses and validates the text of a settings file; `path` is only used
    /// in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Settings, SettingsError> {
        let settings: Settings = toml::from_str(text).map_err(|error| SettingsError::Parse {
            path: path.to_path_buf(),
            message: error.to_string().trim_end().to_owned(),
        })?;
        settings.validate(path)?;
        Ok(settings)
    }

    /// Checks every value against its range in [`crate::limits`].
    fn validate(&self, path: &Path) -> Result<(), SettingsError> {
        let w = &self.wconfd;
        check(
            path,
            "wconfd",
            "death_check_interval_ms",
            w.death_check_interval_ms,
            &limits::DEATH_CHECK_INTERVAL_MS_RANGE,
        )?;
        check_usize(
            path,
            "wconfd",
            "frame_bytes_max",
            w.frame_bytes_max,
            &limits::FRAME_BYTES_MAX_RANGE,
        )?;
        check_usize(
            path,
            "wconfd",
            "connections_max",
            w.connections_max,
            &limits::CONNECTIONS_MAX_RANGE,
        )?;
        check_usize(
            path,
            "wconfd",
            "request_entries_max",
            w.request_entries_max,
            &limits::REQUEST_ENTRIES_MAX_RANGE,
        )?;
        check(
            path,
            "wconfd",
            "snapshot_journal_bytes_max",
            w.snapshot_journal_bytes_max,
            &limits::SNAPSHOT_JOURNAL_BYTES_MAX_RANGE,
        )?;
        check(
            path,
            "wconfd",
            "slow_wait_s",
            w.slow_wait_s,
            &limits::SLOW_WAIT_SECS_RANGE,
        )?;

        check_usize(
            path,
            "workers",
            "quarantine_after",
            self.workers.quarantine_after,
            &limits::QUARANTINE_AFTER_RANGE,
        )?;

        let l = &self.luxid;
        check_usize(
            path,
            "luxid",
            "max_running_jobs",
            l.max_running_jobs,
            &limits::MAX_RUNNING_JOBS_RANGE,
        )?;
        check_usize(
            path,
            "luxid",
            "frame_bytes_max",
            l.frame_bytes_max,
            &limits::FRAME_BYTES_MAX_RANGE,
        )?;
        check_usize(
            path,
            "luxid",
            "connections_max",
            l.connections_max,
            &limits::CONNECTIONS_MAX_RANGE,
        )?;
        check_usize(
            path,
            "luxid",
            "queue_jobs_max",
            l.queue_jobs_max,
            &limits::QUEUE_JOBS_MAX_RANGE,
        )?;
        check_usize(
            path,
            "luxid",
            "job_log_bytes_max",
            l.job_log_bytes_max,
            &limits::JOB_LOG_BYTES_MAX_RANGE,
        )?;
        check(
            path,
            "events",
            "keep",
            self.events.keep,
            &limits::EVENTS_KEEP_RANGE,
        )?;
        check(
            path,
            "events",
            "keep_secs",
            self.events.keep_secs,
            &limits::EVENTS_KEEP_SECS_RANGE,
        )?;
        check(
            path,
            "metrics",
            "interval_ms",
            self.metrics.interval_ms,
            &limits::METRICS_INTERVAL_MS_RANGE,
        )?;
        let m = &self.metrics;
        for (key, address) in [("listen", Some(&m.listen)), ("statsd", m.statsd.as_ref())] {
            let Some(address) = address.filter(|address| !address.is_empty()) else {
                continue;
            };
            if address.parse::<std::net::SocketAddr>().is_err() {
                return Err(SettingsError::Invalid {
                    path: path.to_path_buf(),
                    section: "metrics",
                    key,
                    reason: format!("{address:?} is not an address and port (\"127.0.0.1:9188\")"),
                });
            }
        }
        if m.prefix.is_empty()
            || !m
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
        {
            return Err(SettingsError::Invalid {
                path: path.to_path_buf(),
                section: "metrics",
                key: "prefix",
                reason: format!(
                    "{:?} is not a name of letters, digits, '_', '-' and '.'",
                    m.prefix
                ),
            });
        }
        for (prefix, argv) in &self.hooks {
            let reason = if prefix.is_empty() {
                Some("an empty type prefix would run for every event; name a type".to_owned())
            } else if argv.is_empty() {
                Some("no command".to_owned())
            } else if !Path::new(&argv[0]).is_absolute() {
                Some(format!("the command {:?} is not an absolute path", argv[0]))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(SettingsError::Invalid {
                    path: path.to_path_buf(),
                    section: "hooks",
                    key: "a hook",
                    reason: format!("{prefix:?}: {reason}"),
                });
            }
        }
        if let Some(runner_path) = &l.runner_path
            && !runner_path.is_absolute()
        {
            return Err(SettingsError::Invalid {
                path: path.to_path_buf(),
                section: "luxid",
                key: "runner_path",
                reason: format!("{} is not an absolute path", runner_path.display()),
            });
        }
        Ok(())
    }
}

fn check(
    path: &Path,
    section: &'static str,
    key: &'static str,
    value: u64,
    range: &RangeInclusive<u64>,
) -> Result<(), SettingsError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(SettingsError::OutOfRange {
            path: path.to_path_buf(),
            section,
            key,
            value,
            range: format!("{}..={}", range.start(), range.end()),
        })
    }
}

fn check_usize(
    path: &Path,
    section: &'static str,
    key: &'static str,
    value: usize,
    range: &RangeInclusive<usize>,
) -> Result<(), SettingsError> {
    // usize is at most 64 bits on every target warden builds for.
    let widen = |v: usize| u64::try_from(v).expect("usize fits in u64");
    check(
        path,
        section,
        key,
        widen(value),
        &(widen(*range.start())..=widen(*range.end())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Settings, SettingsError> {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join(SETTINGS_FILE), text).unwrap();
        Settings::load(root.path())
    }

    fn error_text(text: &str) -> String {
        load_text(text).unwrap_err().to_string()
    }

    #[test]
    fn a_missing_file_gives_the_defaults() {
        let root = tempfile::tempdir().unwrap();
        let settings = Settings::load(root.path()).unwrap();
        assert_eq!(settings, Settings::default());
        assert_eq!(settings.wconfd.death_check_interval_ms, 5000);
        assert_eq!(
            settings.wconfd.death_check_interval(),
            Duration::from_secs(5)
        );
        assert_eq!(settings.wconfd.frame_bytes_max, 16 * 1024 * 1024);
        assert_eq!(settings.wconfd.connections_max, 1024);
        assert_eq!(settings.wconfd.request_entries_max, 10_000);
        assert_eq!(settings.wconfd.socket_group, None);
        assert_eq!(settings.wconfd.snapshot_journal_bytes_max, 16 * 1024 * 1024);
        assert_eq!(settings.luxid.max_running_jobs, 20);
        assert_eq!(settings.luxid.frame_bytes_max, 16 * 1024 * 1024);
        assert_eq!(settings.luxid.connections_max, 1024);
        assert_eq!(settings.luxid.queue_jobs_max, 100_000);
        assert_eq!(settings.luxid.job_log_bytes_max, 1024 * 1024);
        assert_eq!(settings.luxid.runner_path, None);
        assert_eq!(settings.wconfd.config_lock_check, ConfigLockCheck::Off);
    }

    #[test]
    fn the_words_of_the_wconfd_policies_are_checked() {
        for (word, check) in [
            ("off", ConfigLockCheck::Off),
            ("log", ConfigLockCheck::Log),
            ("refuse", ConfigLockCheck::Refuse),
        ] {
            let text = format!("[wconfd]\nconfig_lock_check = \"{word}\"\n");
            assert_eq!(load_text(&text).unwrap().wconfd.config_lock_check, check);
        }
        for (text, named) in [
            (
                "[wconfd]\nconfig_lock_check = \"warn\"\n",
                "config_lock_check",
            ),
            ("[wconfd]\nconfig_lock_check = true\n", "config_lock_check"),
            (
                "[wconfd]\nconfig_lock_check = \"Log\"\n",
                "config_lock_check",
            ),
            ("[wconfd]\nfairness = \"lifo\"\n", "fairness"),
            ("[wconfd]\ndeadlock_check = \"log\"\n", "deadlock_check"),
        ] {
            let message = error_text(text);
            assert!(message.contains("warden.toml"), "{text}: {message}");
            assert!(message.contains(named), "{text}: {message}");
            assert!(message.contains("line 2"), "{text}: {message}");
        }
    }

    #[test]
    fn the_defaults_are_valid() {
        Settings::default().validate(Path::new("defaults")).unwrap();
    }

    #[test]
    fn empty_file_and_empty_sections_give_the_defaults() {
        assert_eq!(load_text("").unwrap(), Settings::default());
        assert_eq!(
            load_text("[wconfd]\n[luxid]\n").unwrap(),
            Settings::default()
        );
    }

    #[test]
    fn a_full_file() {
        let settings = load_text(
            r#"
            [wconfd]
            death_check_interval_ms = 250
            frame_bytes_max = 1048576
            connections_max = 64
            request_entries_max = 500
            socket_group = "ganeti"
            snapshot_journal_bytes_max = 1048576
            slow_wait_s = 30
            fairness = "fifo"
            deadlock_check = "off"
            config_lock_check = "refuse"

            [luxid]
            max_running_jobs = 4
            frame_bytes_max = 2097152
            connections_max = 32
            queue_jobs_max = 1000
            job_log_bytes_max = 4096
            runner_path = "/usr/lib/warden/job-runner"

            [workers]
            quarantine_after = 3

            [events]
            keep = 200000
            keep_secs = 60

            [metrics]
            listen = "127.0.0.1:9999"
            statsd = "127.0.0.1:8125"
            prefix = "farm.warden"
            interval_ms = 500

            [hooks]
            "job.finished" = ["/usr/local/bin/notify", "--to", "ops"]
            "#,
        )
        .unwrap();
        assert_eq!(
            settings,
            Settings {
                wconfd: WconfdSettings {
                    death_check_interval_ms: 250,
                    frame_bytes_max: 1_048_576,
                    connections_max: 64,
                    request_entries_max: 500,
                    socket_group: Some(SocketGroup::Name("ganeti".to_owned())),
                    snapshot_journal_bytes_max: 1_048_576,
                    slow_wait_s: 30,
                    fairness: crate::locks::Fairness::Fifo,
                    deadlock_check: crate::locks::Deadlocks::Wait,
                    config_lock_check: ConfigLockCheck::Refuse,
                },
                luxid: LuxidSettings {
                    max_running_jobs: 4,
                    frame_bytes_max: 2_097_152,
                    connections_max: 32,
                    queue_jobs_max: 1000,
                    job_log_bytes_max: 4096,
                    runner_path: Some(PathBuf::from("/usr/lib/warden/job-runner")),
                },
                workers: WorkersSettings {
                    quarantine_after: 3,
                },
                events: EventsSettings {
                    keep: 200_000,
                    keep_secs: 60,
                },
                metrics: MetricsSettings {
                    listen: "127.0.0.1:9999".to_owned(),
                    statsd: Some("127.0.0.1:8125".to_owned()),
                    prefix: "farm.warden".to_owned(),
                    interval_ms: 500,
                },
                hooks: [(
                    "job.finished".to_owned(),
                    vec![
                        "/usr/local/bin/notify".to_owned(),
                        "--to".to_owned(),
                        "ops".to_owned()
                    ]
                )]
                .into(),
            }
        );
        assert_eq!(
            settings.wconfd.death_check_interval(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn a_partial_file_keeps_the_other_defaults() {
        let settings = load_text("[luxid]\nmax_running_jobs = 3\n").unwrap();
        assert_eq!(settings.luxid.max_running_jobs, 3);
        assert_eq!(settings.luxid.queue_jobs_max, 100_000);
        assert_eq!(settings.wconfd, WconfdSettings::default());
    }

    #[test]
    fn socket_group_is_a_name_or_a_gid() {
        let settings = load_text("[wconfd]\nsocket_group = 1001\n").unwrap();
        assert_eq!(settings.wconfd.socket_group, Some(SocketGroup::Gid(1001)));
        assert_eq!(SocketGroup::Gid(1001).gid().unwrap(), 1001);
        for bad in [
            "\"\"",
            "\"a:b\"",
            "\"a b\"",
            "-1",
            "4294967296",
            "1.5",
            "true",
        ] {
            let message = error_text(&format!("[wconfd]\nsocket_group = {bad}\n"));
            assert!(message.contains("socket_group"), "{bad}: {message}");
        }
    }

    #[test]
    fn socket_group_names_are_resolved() {
        // Group 0 exists everywhere; its name varies (root, wheel).
        let root_name = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(0))
            .unwrap()
            .expect("group 0 exists")
            .name;
        assert_eq!(SocketGroup::Name(root_name).gid().unwrap(), 0);
        let error = SocketGroup::Name("no-such-group-warden-test".to_owned())
            .gid()
            .unwrap_err();
        assert!(
            error.to_string().contains("no-such-group-warden-test"),
            "{error}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let message = error_text("[wconfd]\ndeath_check_interval = 5000\n");
        assert!(message.contains("warden.toml"), "{message}");
        assert!(message.contains("death_check_interval"), "{message}");
        assert!(message.contains("line 2"), "{message}");

        let message = error_text("[luxid]\nmax_running_jobs = 2\nmax_jobs = 3\n");
        assert!(message.contains("max_jobs"), "{message}");
        assert!(message.contains("line 3"), "{message}");

        let message = error_text("[wconfd]\n[confd]\nx = 1\n");
        assert!(message.contains("confd"), "{message}");

        let message = error_text("verbose = true\n");
        assert!(message.contains("verbose"), "{message}");
    }

    #[test]
    fn wrong_types_are_refused() {
        for (text, key, line) in [
            (
                "[wconfd]\ndeath_check_interval_ms = \"5s\"\n",
                "death_check_interval_ms",
                2,
            ),
            ("[luxid]\n\nmax_running_jobs = 2.5\n", "max_running_jobs", 3),
            ("[luxid]\nmax_running_jobs = -1\n", "max_running_jobs", 2),
            ("[luxid]\nrunner_path = 7\n", "runner_path", 2),
            ("wconfd = 3\n", "wconfd", 1),
        ] {
            let message = error_text(text);
            assert!(message.contains("warden.toml"), "{message}");
            assert!(message.contains(key), "{text:?}: {message}");
            assert!(
                message.contains(&format!("line {line}")),
                "{text:?}: {message}"
            );
        }
    }

    #[test]
    fn invalid_toml_is_refused_with_its_line() {
        let message = error_text("[wconfd]\ndeath_check_interval_ms = \n");
        assert!(message.contains("line 2"), "{message}");
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let cases: &[(&str, &str, u64)] = &[
            ("wconfd", "death_check_interval_ms", 9),
            ("wconfd", "death_check_interval_ms", 3_600_001),
            ("wconfd", "frame_bytes_max", 4095),
            ("wconfd", "frame_bytes_max", (1 << 30) + 1),
            ("wconfd", "connections_max", 0),
            ("wconfd", "connections_max", 65_537),
            ("wconfd", "request_entries_max", 0),
            ("wconfd", "request_entries_max", 1_000_001),
            ("wconfd", "snapshot_journal_bytes_max", 65_535),
            ("wconfd", "snapshot_journal_bytes_max", (64 << 30) + 1),
            ("wconfd", "slow_wait_s", 86_401),
            ("luxid", "max_running_jobs", 0),
            ("luxid", "max_running_jobs", 10_001),
            ("luxid", "frame_bytes_max", 4095),
            ("luxid", "frame_bytes_max", (1 << 30) + 1),
            ("luxid", "connections_max", 0),
            ("luxid", "connections_max", 65_537),
            ("luxid", "queue_jobs_max", 0),
            ("luxid", "queue_jobs_max", 10_000_001),
            ("luxid", "job_log_bytes_max", 1023),
            ("luxid", "job_log_bytes_max", (1 << 30) + 1),
        ];
        for &(section, key, value) in cases {
            let error = load_text(&format!("[{section}]\n{key} = {value}\n")).unwrap_err();
            match &error {
                SettingsError::OutOfRange {
                    section: s,
                    key: k,
                    value: v,
                    ..
                } => assert_eq!((*s, *k, *v), (section, key, value)),
                other => panic!("{section}.{key} = {value}: {other}"),
            }
            let message = error.to_string();
            assert!(message.contains("warden.toml"), "{message}");
            assert!(
                message.contains(&format!("[{section}] {key} = {value}")),
                "{message}"
            );
            assert!(message.contains("out of range"), "{message}");
        }
    }

    #[test]
    fn the_range_limits_themselves_are_accepted() {
        let text = "[wconfd]\n\
            death_check_interval_ms = 10\n\
            frame_bytes_max = 4096\n\
            connections_max = 1\n\
            request_entries_max = 1\n\
            snapshot_journal_bytes_max = 65536\n\
            [luxid]\n\
            max_running_jobs = 10000\n\
            frame_bytes_max = 1073741824\n\
            connections_max = 65536\n\
            queue_jobs_max = 10000000\n\
            job_log_bytes_max = 1024\n";
        load_text(text).unwrap();
    }

    #[test]
    fn bad_events_metrics_and_hooks_settings_are_refused() {
        for (text, named) in [
            ("[events]\nkeep = 10\n", "keep"),
            ("[metrics]\nlisten = \"localhost\"\n", "listen"),
            ("[metrics]\nstatsd = \"udp://x\"\n", "statsd"),
            ("[metrics]\nprefix = \"a b\"\n", "prefix"),
            ("[metrics]\ninterval_ms = 1\n", "interval_ms"),
            ("[hooks]\n\"job.\" = []\n", "no command"),
            ("[hooks]\n\"job.\" = [\"notify\"]\n", "absolute"),
            ("[hooks]\n\"\" = [\"/bin/true\"]\n", "every event"),
        ] {
            let message = error_text(text);
            assert!(message.contains(named), "{text}: {message}");
        }
        // An empty listen turns the endpoint off.
        load_text("[metrics]\nlisten = \"\"\n").unwrap();
    }

    #[test]
    fn a_relative_runner_path_is_refused() {
        let message = error_text("[luxid]\nrunner_path = \"bin/job-runner\"\n");
        assert!(message.contains("runner_path"), "{message}");
        assert!(message.contains("absolute"), "{message}");
    }

    #[test]
    fn an_oversized_file_is_refused() {
        let padding = "#".repeat(usize::try_from(limits::SETTINGS_FILE_BYTES_MAX).unwrap());
        let message = error_text(&format!("{padding}\n"));
        assert!(message.contains("larger than"), "{message}");
    }

    #[test]
    fn an_unreadable_file_is_an_error_naming_it() {
        // A directory in place of the file cannot be read as text.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(SETTINGS_FILE)).unwrap();
        let error = Settings::load(root.path()).unwrap_err();
        assert!(matches!(error, SettingsError::Read { .. }), "{error}");
        assert!(error.to_string().contains("warden.toml"), "{error}");
    }

    #[test]
    fn invalid_utf8_is_an_error_naming_the_file() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join(SETTINGS_FILE), b"[wconfd]\n\xff\n").unwrap();
        let error = Settings::load(root.path()).unwrap_err();
        assert!(error.to_string().contains("warden.toml"), "{error}");
    }
}
