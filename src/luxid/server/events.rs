//! luxid's event sequence in its shell: the [`EventLog`] the core's
//! [`Effect::Events`](queue_core::Effect::Events) are appended to, its
//! sync on a thread of its own ([`Syncer`]), the checkpoint of what the
//! sequence said of each job, and the held `WatchEvents`.
//!
//! luxid's events describe changes already durable elsewhere (job files,
//! the drain file), so a failed or lost write of events loses nothing a
//! restart cannot say again: it reads the checkpoint and the events after
//! it, and the core gives what they miss. Readers see an event only once
//! it is synced, so a number they saw is never given again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::{Registry, Token, Waker};
use serde_json::{Value, json};

use super::super::core::{self as queue_core, Conn, JobEvents, NewEvent};
use crate::daemon::DaemonError;
use crate::events::{EventLog, EventsError, Kept, Syncer, Watches};
use crate::jobs::Timestamp;
use crate::limits::WATCH_EVENTS_MAX;
use crate::paths::{LUXID_EVENTS_CHECKPOINT_FILE, LUXID_EVENTS_DIR};
use crate::protocol::WireError;
use crate::protocol::events::{WatchEvents, encode_reply};
use crate::settings::Settings;
use crate::store::atomic_write;

/// Events kept in memory for held watches (older ones are read from the
/// files).
const MEMORY_EVENTS: usize = 16_384;

/// A checkpoint is written after this many events (a start reads at most
/// about this many, whatever the retention).
const CHECKPOINT_EVERY: u64 = 32_768;

/// A failed write or sync is tried again after this long.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

pub(super) struct LuxidEvents {
    log: EventLog,
    syncer: Syncer,
    syncing: bool,
    watches: Watches<Conn>,
    checkpoint_path: PathBuf,
    checkpoint_seq: u64,
    retry_at: Option<Instant>,
}

impl LuxidEvents {
    /// Opens the sequence and reads back what it said of the jobs: the
    /// checkpoint, then every event after it.
    pub(super) fn open(
        root: &Path,
        settings: &Settings,
        registry: &Registry,
        waker_token: Token,
    ) -> Result<(LuxidEvents, JobEvents), DaemonError> {
        let dir = root.join(LUXID_EVENTS_DIR);
        let kept = Kept {
            events: settings.events.keep,
            age_secs: settings.events.keep_secs,
        };
        let log = EventLog::open(&dir, kept, MEMORY_EVENTS)?;
        let checkpoint_path = root.join(LUXID_EVENTS_CHECKPOINT_FILE);
        let (checkpoint_seq, mut said) = read_checkpoint(&checkpoint_path, &log)?;
        let mut since = checkpoint_seq;
        loop {
            let (events, next) = log.read_after(Some(since), None, WATCH_EVENTS_MAX)?;
            for line in &events {
                let event = line.decode().map_err(|what| EventsError::Damaged {
                    path: dir.clone(),
                    what: format!("event {}: {what}", line.seq()),
                })?;
                said.replay(&event);
            }
            if next == since {
                break;
            }
            since = next;
        }
        let waker = Waker::new(registry, waker_token).map_err(|source| DaemonError::Io {
            what: "cannot create a waker for",
            path: dir.clone(),
            source,
        })?;
        let syncer =
            Syncer::start("luxid-events-sync", waker).map_err(|source| DaemonError::Io {
                what: "cannot start the sync thread of",
                path: dir.clone(),
                source,
            })?;
        Ok((
            LuxidEvents {
                log,
                syncer,
                syncing: false,
                watches: Watches::default(),
                checkpoint_path,
                checkpoint_seq,
                retry_at: None,
            },
            said,
        ))
    }

    pub(super) fn append(&mut self, events: Vec<NewEvent>) {
        let now = Timestamp::now();
        for event in events {
            self.log.append(event.kind, &event.fields, now);
        }
    }

    /// The end of a turn: the turn's events written and their sync asked
    /// for; a checkpoint when one is due.
    pub(super) fn finish_turn(&mut self, core: &queue_core::QueueCore, now: Instant) {
        if self.retry_at.is_some_and(|at| now < at) {
            return;
        }
        self.retry_at = None;
        if let Err(error) = self.log.write_pending() {
            self.failed(&error.to_string(), now);
            return;
        }
        if self.log.last_seq() >= self.checkpoint_seq + CHECKPOINT_EVERY {
            self.checkpoint(core, now);
        }
        if !self.syncing && self.log.unsynced() {
            match self.log.sync_handle() {
                Ok(Some(handle)) => {
                    self.syncer.request(handle);
                    self.syncing = true;
                }
                Ok(None) => {}
                Err(error) => self.failed(&error.to_string(), now),
            }
        }
    }

    /// The sync thread woke the loop: its events are readable now.
    pub(super) fn synced(&mut self, now: Instant) {
        self.syncing = false;
        let ((seq, len), failed) = self.syncer.synced();
        self.log.mark_synced(seq, len);
        if let Some(error) = failed {
            self.failed(&error, now);
        }
    }

    /// A write or sync failed: what is not known durable is written again
    /// after a pause (the kernel may have dropped it without saying so
    /// twice).
    fn failed(&mut self, error: &str, now: Instant) {
        tracing::error!(%error, "cannot make the event sequence durable; trying again");
        if let Err(error) = self.log.rewrite_unsynced() {
            tracing::error!(%error, "cannot cut the event sequence back to its durable part");
        }
        self.retry_at = Some(now + RETRY_PAUSE);
    }

    /// The sequence synced, then what it said of every job, in one
    /// replaced file; old segments trimmed.
    fn checkpoint(&mut self, core: &queue_core::QueueCore, now: Instant) {
        if let Err(error) = self.log.sync() {
            self.failed(&error.to_string(), now);
            return;
        }
        let seq = self.log.last_seq();
        let text = json!({"seq": seq, "said": core.saved_events()}).to_string();
        if let Err(error) = atomic_write(&self.checkpoint_path, text.as_bytes()) {
            tracing::warn!(%error, "cannot write the event sequence's checkpoint");
            return;
        }
        self.checkpoint_seq = seq;
        let now_secs = Timestamp::now().0;
        if let Err(error) = self.log.trim(now_secs) {
            tracing::warn!(%error, "cannot remove old event segments");
        }
    }

    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        self.retry_at
    }

    // ----- WatchEvents -----

    /// The answer now, or `None`: held (the caller holds the reply until
    /// `request.timeout`).
    pub(super) fn watch(
        &mut self,
        conn: Conn,
        request: &WatchEvents,
    ) -> Option<Result<Vec<u8>, WireError>> {
        self.watches
            .watch(conn, request, &self.log)
            .map(encode_reply)
    }

    /// The held watches with events now, answered.
    pub(super) fn ready(&mut self) -> Vec<(Token, Result<Vec<u8>, WireError>)> {
        self.watches
            .ready(&self.log)
            .into_iter()
            .map(|(conn, answer)| (Token(conn.0), encode_reply(answer)))
            .collect()
    }

    /// A held watch's deadline: its empty answer, if `conn` held one.
    pub(super) fn expire(&mut self, conn: Conn) -> Option<Result<Vec<u8>, WireError>> {
        self.watches.expire(conn).map(encode_reply)
    }

    pub(super) fn drop_watch(&mut self, conn: Conn) {
        self.watches.drop_watch(conn);
    }

    /// For the SIGUSR2 dump.
    pub(super) fn dump(&self) -> (u64, u64, u64, usize) {
        (
            self.log.first_retained(),
            self.log.readable_last(),
            self.log.last_seq(),
            self.watches.len(),
        )
    }
}

/// The checkpoint's seq and what the sequence had said then; none yet:
/// nothing said before the first retained event.
fn read_checkpoint(path: &Path, log: &EventLog) -> Result<(u64, JobEvents), DaemonError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if log.first_retained() > 1 {
                tracing::warn!(
                    path = %path.display(),
                    "no checkpoint of the event sequence: jobs it said before event {} may be said again",
                    log.first_retained()
                );
            }
            return Ok((log.first_retained().saturating_sub(1), JobEvents::default()));
        }
        Err(source) => {
            return Err(DaemonError::Io {
                what: "cannot read",
                path: path.to_owned(),
                source,
            });
        }
    };
    let damaged = |what: String| {
        DaemonError::Events(crate::events::EventsError::Damaged {
            path: path.to_owned(),
            what,
        })
    };
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|error| damaged(format!("not JSON: {error}")))?;
    let seq = value
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or_else(|| damaged("no seq".to_owned()))?;
    if seq > log.last_seq() || seq + 1 < log.first_retained() {
        return Err(damaged(format!(
            "it is of event {seq}, outside the events kept ({} to {})",
            log.first_retained(),
            log.last_seq()
        )));
    }
    let said = JobEvents::restore(value.get("said").unwrap_or(&Value::Null)).map_err(damaged)?;
    Ok((seq, said))
}
