//! wconfd's event sequence (EVENTS.md, wconfd's catalogue): the events of
//! each turn, made durable in the turn's journal write (the journal
//! already records the operations), then written to the sequence's files
//! through the page cache; the held `watchEvents`.
//!
//! A start appends what the journal holds and the files lack (a kill or
//! a crash between the journal write and the files'); before a snapshot
//! cuts the journal, the files are synced.

use std::fmt::Display;
use std::path::Path;

use mio::Token;
use serde::{Serialize, Serializer};
use serde_json::{Value, json};

use crate::daemon::DaemonError;
use crate::events::{Event, EventLog, Kept, Watches};
use crate::jobs::Timestamp;
use crate::limits::CONFIG_VIOLATIONS_NAMED_MAX;
use crate::locks::allocation::{LockChange, OwnerRef};
use crate::locks::{Entry, Ident, LockName, Mode, Owner};
use crate::paths::WCONFD_EVENTS_DIR;
use crate::protocol::WireError;
use crate::protocol::events::{WatchEvents, encode_reply};
use crate::protocol::wconfd::{encode_entry, encode_violations};
use crate::settings::Settings;
use crate::store::config_check::{self, EntityKind, Violation};
use crate::store::lock_state::LockStore;
use crate::workers::Transition;

/// Events kept in memory for held watches.
const MEMORY_EVENTS: usize = 16_384;

/// The files are written when this many events wait (well below
/// [`MEMORY_EVENTS`]: what is not yet written is always in memory) ...
const FILE_WRITE_BATCH: usize = 1_024;

/// ... or when the oldest waiting is this old (a quiet wconfd's loop wakes
/// for its death checks, which see to it).
const FILE_WRITE_DELAY_SECS: u64 = 1;

/// How a grant came: a plain request, a waiting one, or `awaitLocks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Direct,
    Waiting,
    Await,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Waiting => "waiting",
            Via::Await => "await",
        }
    }
}

pub struct WconfdEvents {
    log: EventLog,
    watches: Watches<Token>,
    /// The last event already in a journal record (with its operation, or
    /// in one of its own); those after it go into the next.
    recorded_through: u64,
    /// Set once a write of the files failed, until one succeeds.
    write_failing: bool,
}

/// An owner as events name it: its ident, as text (a job's id, or a
/// service's name).
struct OwnerText<'a>(&'a Owner);

impl Serialize for OwnerText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0.ident {
            Ident::Name(name) => serializer.serialize_str(name),
            Ident::Job(id) => serializer.collect_str(id),
        }
    }
}

/// `[[lock, mode], ...]`, each lock written as its name.
struct LockModes<'a, L>(Vec<(&'a L, Mode)>);

impl<L: Display> Serialize for LockModes<'_, L> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .iter()
                .map(|(lock, mode)| (Named(*lock), mode.as_str())),
        )
    }
}

struct Named<'a, L>(&'a L);

impl<L: Display> Serialize for Named<'_, L> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self.0)
    }
}

/// `lock.granted` and `lock.released`: written straight from the changes,
/// with no JSON tree between (they are most of wconfd's events).
#[derive(Serialize)]
struct Holdings<'a> {
    owner: OwnerText<'a>,
    entries: LockModes<'a, LockName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    via: Option<&'static str>,
}

impl WconfdEvents {
    /// Opens the sequence and appends what the journal holds of it and
    /// the files lack.
    pub fn open(
        root: &Path,
        settings: &Settings,
        journaled: &[Event],
    ) -> Result<Self, DaemonError> {
        let kept = Kept {
            events: settings.events.keep,
            age_secs: settings.events.keep_secs,
        };
        let mut log = EventLog::open(&root.join(WCONFD_EVENTS_DIR), kept, MEMORY_EVENTS)?;
        let added = log.catch_up(journaled)?;
        if added > 0 {
            tracing::info!(added, "events the journal held and the sequence lacked");
        }
        Ok(WconfdEvents {
            // What the journal held is in the files now (catch_up).
            recorded_through: log.last_seq(),
            log,
            watches: Watches::default(),
            write_failing: false,
        })
    }

    fn push(&mut self, kind: &str, fields: &impl Serialize) {
        self.log.append(kind, fields, Timestamp::now());
    }

    /// The changes of holdings one operation made: per owner, what it let
    /// go, then what it got; `via` says how each owner's grant came.
    pub fn lock_changes(&mut self, changes: Vec<LockChange>, via: impl Fn(&OwnerRef) -> Via) {
        let mut start = 0;
        while start < changes.len() {
            let owner = &changes[start].owner;
            let end = start
                + changes[start..]
                    .iter()
                    .take_while(|change| Owner::eq(&change.owner, owner))
                    .count();
            let of_owner = &changes[start..end];
            let released: Vec<(&LockName, Mode)> = of_owner
                .iter()
                .filter_map(|change| match (change.before, change.after) {
                    (Some(mode), None) => Some((&change.lock, mode)),
                    _ => None,
                })
                .collect();
            if !released.is_empty() {
                self.push(
                    "lock.released",
                    &Holdings {
                        owner: OwnerText(owner),
                        entries: LockModes(released),
                        via: None,
                    },
                );
            }
            let granted: Vec<(&LockName, Mode)> = of_owner
                .iter()
                .filter_map(|change| change.after.map(|mode| (&change.lock, mode)))
                .collect();
            if !granted.is_empty() {
                self.push(
                    "lock.granted",
                    &Holdings {
                        owner: OwnerText(owner),
                        entries: LockModes(granted),
                        via: Some(via(owner).as_str()),
                    },
                );
            }
            start = end;
        }
    }

    pub fn waiting(
        &mut self,
        owner: &Owner,
        priority: i64,
        request: &[Entry],
        blockers: &[OwnerRef],
    ) {
        self.push(
            "lock.waiting",
            &json!({
                "owner": OwnerText(owner),
                "priority": priority,
                "request": request.iter().map(encode_entry).collect::<Vec<_>>(),
                "blockers": blockers.iter().map(|owner| OwnerText(owner)).collect::<Vec<_>>(),
            }),
        );
    }

    /// A waiting request refused because it would close `cycle` (D68).
    pub fn deadlock_refused(
        &mut self,
        owner: &Owner,
        priority: i64,
        request: &[Entry],
        cycle: &[(OwnerRef, Vec<(LockName, Mode)>)],
    ) {
        let cycle: Vec<Value> = cycle
            .iter()
            .map(|(member, holds)| {
                json!({
                    "owner": OwnerText(member),
                    "holds": LockModes(holds.iter().map(|(lock, mode)| (lock, *mode)).collect()),
                })
            })
            .collect();
        self.push(
            "lock.deadlock",
            &json!({
                "owner": OwnerText(owner),
                "priority": priority,
                "request": request.iter().map(encode_entry).collect::<Vec<_>>(),
                "cycle": cycle,
            }),
        );
    }

    pub fn withdrawn(&mut self, owner: &Owner) {
        self.push("lock.withdrawn", &json!({"owner": OwnerText(owner)}));
    }

    pub fn owner_dead(&mut self, owner: &Owner, held: &[(String, Mode)], waited: Option<Value>) {
        self.push(
            "owner.dead",
            &json!({
                "owner": OwnerText(owner),
                "held": LockModes(held.iter().map(|(lock, mode)| (lock, *mode)).collect()),
                "waited": waited,
            }),
        );
    }

    pub fn config_written(&mut self, serial_no: u64) {
        self.push("config.written", &json!({"serial_no": serial_no}));
    }

    /// `config.lock_violation`: a configuration write of `owner` changes
    /// what it does not hold exclusively (D70); `refused` if it was refused.
    /// The first [`CONFIG_VIOLATIONS_NAMED_MAX`] are named, all counted.
    pub fn config_lock_violation(&mut self, owner: &Owner, refused: bool, found: &[Violation]) {
        let counts = config_check::counts(found);
        let kinds: serde_json::Map<String, Value> = EntityKind::ALL
            .iter()
            .zip(counts)
            .map(|(kind, count)| (kind.as_str().to_owned(), json!(count)))
            .collect();
        self.push(
            "config.lock_violation",
            &json!({
                "owner": OwnerText(owner),
                "refused": refused,
                "count": found.len(),
                "kinds": kinds,
                "violations": encode_violations(found, CONFIG_VIOLATIONS_NAMED_MAX),
            }),
        );
    }

    pub fn worker_transitions(&mut self, transitions: Vec<Transition>) {
        for change in transitions {
            let kind = match (change.old, change.new) {
                (_, None) => "worker.deregistered".to_owned(),
                (Some(old), Some(new)) if old == new => "worker.groups".to_owned(),
                (_, Some(new)) => format!("worker.{}", new.to_string().to_lowercase()),
            };
            self.push(
                &kind,
                &json!({
                    "uuid": change.uuid,
                    "old": change.old.map(|state| state.to_string()),
                    "new": change.new.map(|state| state.to_string()),
                    "holder": change.holder,
                    "reason": change.reason,
                    "groups": change.groups,
                }),
            );
        }
    }

    // ----- the turn -----

    /// The events made since the last call, for the record of the
    /// operation that made them.
    pub fn unrecorded(&mut self) -> impl Iterator<Item = &[u8]> {
        let from = self.recorded_through;
        self.recorded_through = self.log.last_seq();
        self.log.pending_after(from)
    }

    /// Before the journal write: events of no operation get a record of
    /// their own.
    pub fn record_rest(&mut self, store: &mut LockStore) {
        if self.recorded_through < self.log.last_seq() {
            store.record_events(self.unrecorded());
        }
    }

    /// After the journal write: the events are durable (in the journal),
    /// so readable. They are written to the files through the page cache
    /// in batches ([`FILE_WRITE_BATCH`] events, or the oldest waiting
    /// [`FILE_WRITE_DELAY_SECS`]): a write a turn cost the lock path a
    /// syscall per turn. The journal holds what is not yet written (a
    /// start appends it, a snapshot first writes it). A write of the files
    /// that fails (a full disk) loses nothing: the events stay pending and
    /// in memory, and are written with a later turn's.
    pub fn written(&mut self) {
        self.log.mark_all_durable();
        // A fresh sequence gets its first segment (and the file it keeps
        // open) with its first events, not a batch later.
        let due = self.log.pending_count() >= FILE_WRITE_BATCH
            || (self.log.has_pending() && !self.log.has_segments())
            || self
                .log
                .oldest_pending_ts()
                .is_some_and(|ts| ts.0.saturating_add(FILE_WRITE_DELAY_SECS) <= Timestamp::now().0);
        if !due {
            return;
        }
        let result = self.log.write_pending();
        match (&result, self.write_failing) {
            (Err(error), false) => {
                tracing::warn!(%error, "cannot write the event files; the journal holds the events meanwhile");
            }
            (Ok(()), true) => tracing::info!("the event files are written again"),
            _ => {}
        }
        self.write_failing = result.is_err();
    }

    /// At a clean stop: every event in the files and synced, so a start
    /// has nothing to append (it would from the journal otherwise).
    pub fn stop(&mut self) {
        if let Err(error) = self.log.write_pending().and_then(|()| self.log.sync()) {
            tracing::warn!(%error, "cannot write the event files at the stop; the journal holds the events");
        }
    }

    /// Before a snapshot cuts the journal: every event in the files and
    /// synced (and old segments trimmed); else no snapshot yet.
    pub fn sync_before_snapshot(&mut self) -> Result<(), DaemonError> {
        self.log.write_pending()?;
        self.log.sync()?;
        if let Err(error) = self.log.trim(Timestamp::now().0) {
            tracing::warn!(%error, "cannot remove old event segments");
        }
        Ok(())
    }

    // ----- watchEvents -----

    pub fn watch(
        &mut self,
        token: Token,
        request: &WatchEvents,
    ) -> Option<Result<Vec<u8>, WireError>> {
        self.watches
            .watch(token, request, &self.log)
            .map(encode_reply)
    }

    pub fn ready(&mut self) -> Vec<(Token, Result<Vec<u8>, WireError>)> {
        self.watches
            .ready(&self.log)
            .into_iter()
            .map(|(token, answer)| (token, encode_reply(answer)))
            .collect()
    }

    pub fn expire(&mut self, token: Token) -> Option<Result<Vec<u8>, WireError>> {
        self.watches.expire(token).map(encode_reply)
    }

    pub fn drop_watch(&mut self, token: Token) {
        self.watches.drop_watch(token);
    }

    /// For the SIGUSR2 dump: first kept, last, held watches.
    pub fn dump(&self) -> (u64, u64, usize) {
        (
            self.log.first_retained(),
            self.log.last_seq(),
            self.watches.len(),
        )
    }
}
