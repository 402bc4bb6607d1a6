//! The metrics computed from the event sequences (EVENTS.md, "Metrics").
//!
//! A pure core: [`Metrics`] folds both daemons' events into the gauges,
//! counters and histograms of EVENTS.md's table, saves and restores itself,
//! and renders the figures as Prometheus text or JSON; [`Statsd`] decides
//! which statsd lines are due and packs them into packets. No I/O, no
//! clock (`now` is passed in, seconds since the epoch), no threads.
//!
//! Every family is one row of [`FAMILIES`] (its Prometheus name, its
//! statsd name, its help), so the three renderings cannot disagree.
//!
//! Invariants ([`Metrics::check_invariants`]): the gauges kept up to date
//! event by event equal what the tracked jobs, owners and workers add up
//! to; an owner is tracked only while it holds or waits; a worker's groups
//! are all tracked groups, and at most [`GROUPS_TRACKED_MAX`] are.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};

use crate::events::EventLine;
use crate::events::notify::{LockChange, QueueChange, notify_locks, notify_queue};
use crate::jobs::{JobId, Status, Timestamp};
use crate::limits::{STATSD_PACKET_BYTES_MAX, WORKER_GROUPS_MAX};
use crate::locks::{Level, LockName, Mode};
use crate::workers::State;

#[cfg(test)]
mod tests;

/// Upper bounds of the histograms' buckets, in seconds (`+Inf` follows):
/// from a lock granted at once to a job queued for hours. Past 3600 s, as
/// the alert on locks held over an hour (alerts.yml) needs a bucket beyond
/// it: `histogram_quantile` never answers more than the largest bound.
pub const BUCKET_BOUNDS_SECONDS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0,
    14400.0,
];

/// Timer observations kept for statsd between two sends: a second of a
/// busy farm's lock waits and holds; past it the oldest are dropped (and
/// counted by [`Statsd::dropped_observations`]), the histograms still
/// count them.
pub const OBSERVATIONS_KEPT_MAX: usize = 10_000;

/// Worker groups with gauges, at most: every group ever seen keeps its
/// zeros, so a farm renaming groups forever must not grow the figures
/// without bound. Groups past it are not counted by group.
pub const GROUPS_TRACKED_MAX: usize = 4_096;

/// An unchanged statsd gauge is sent again every this many intervals: a
/// lost UDP packet or a restarted statsd is repaired within it, at a tenth
/// of the cost of sending everything every interval.
pub const HEARTBEAT_INTERVALS: f64 = 10.0;

/// The format version of [`Metrics::save`].
const SAVED_VERSION: u64 = 1;

const BUCKETS: usize = BUCKET_BOUNDS_SECONDS.len() + 1;

/// Lock levels, each with its gauges and hold histogram.
const LEVELS: usize = Level::ALL.len();

/// How a lock was granted (`lock.granted`'s `via`), in the counter's order.
const VIAS: [&str; 3] = ["direct", "waiting", "await"];

const MODES: [Mode; 2] = [Mode::Shared, Mode::Exclusive];

/// The kinds of entity of `config.lock_violation`, in the counter's order.
const ENTITY_KINDS: [&str; 3] = ["instance", "nodegroup", "node"];

/// Which daemon's event sequence an event comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Luxid,
    Wconfd,
}

impl Source {
    pub const ALL: [Source; 2] = [Source::Luxid, Source::Wconfd];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Luxid => "luxid",
            Source::Wconfd => "wconfd",
        }
    }

    fn index(self) -> usize {
        match self {
            Source::Luxid => 0,
            Source::Wconfd => 1,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn status_index(status: Status) -> usize {
    Status::ALL
        .iter()
        .position(|each| *each == status)
        .expect("every status is in Status::ALL")
}

fn level_index(level: Level) -> usize {
    Level::ALL
        .iter()
        .position(|each| *each == level)
        .expect("every level is in Level::ALL")
}

fn state_index(state: State) -> usize {
    State::ALL
        .iter()
        .position(|each| *each == state)
        .expect("every state is in State::ALL")
}

fn mode_index(mode: Mode) -> usize {
    match mode {
        Mode::Shared => 0,
        Mode::Exclusive => 1,
    }
}

fn parse_mode(text: &str) -> Option<Mode> {
    MODES.into_iter().find(|mode| mode.as_str() == text)
}

/// A histogram with the buckets of [`BUCKET_BOUNDS_SECONDS`].
#[derive(Clone, Debug, Default, PartialEq)]
struct Histogram {
    /// Observations per bucket, not cumulative; the last is `+Inf`.
    counts: [u64; BUCKETS],
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        let bucket = BUCKET_BOUNDS_SECONDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS - 1);
        self.counts[bucket] += 1;
        self.sum += seconds;
    }

    fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(le, cumulative count)` per bucket, `+Inf` last.
    fn cumulative(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        let mut total = 0;
        self.counts.iter().enumerate().map(move |(index, count)| {
            total += count;
            let le = match BUCKET_BOUNDS_SECONDS.get(index) {
                Some(bound) => format_float(*bound),
                None => "+Inf".to_owned(),
            };
            (le, total)
        })
    }

    fn save(&self) -> Value {
        json!([self.sum, self.counts.to_vec()])
    }

    fn restore(value: &Value, what: &str) -> Result<Histogram, String> {
        let bad = || format!("histogram {what} is not [sum, [{BUCKETS} counts]]");
        let parts = value
            .as_array()
            .filter(|parts| parts.len() == 2)
            .ok_or_else(bad)?;
        let sum = parts[0]
            .as_f64()
            .filter(|sum| sum.is_finite() && *sum >= 0.0)
            .ok_or_else(bad)?;
        let counts = parts[1]
            .as_array()
            .filter(|c| c.len() == BUCKETS)
            .ok_or_else(bad)?;
        let mut histogram = Histogram {
            sum,
            ..Histogram::default()
        };
        for (slot, count) in histogram.counts.iter_mut().zip(counts) {
            *slot = count.as_u64().ok_or_else(bad)?;
        }
        Ok(histogram)
    }
}

/// What a timer observation is of (statsd sends each one).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Timer {
    QueueDelay,
    Run,
    LockWait,
    LockHold(Level),
}

#[derive(Clone, Debug, PartialEq)]
struct Job {
    status: Status,
    /// `received`, µs since the epoch; unknown for a job whose
    /// `job.submitted` was never read.
    received_us: Option<u64>,
    /// Its queue delay is in the histogram already (once a job).
    delay_observed: bool,
}

#[derive(Clone, Debug, PartialEq)]
struct Held {
    level: Level,
    mode: Mode,
    /// When it was granted, µs since the epoch (a mode change keeps it).
    since_us: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Owner {
    /// By the lock's wire name.
    held: BTreeMap<String, Held>,
    /// Since when its request waits, µs since the epoch.
    waiting_since_us: Option<u64>,
}

impl Owner {
    fn is_idle(&self) -> bool {
        self.held.is_empty() && self.waiting_since_us.is_none()
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Worker {
    state: State,
    /// Only tracked groups (see [`GROUPS_TRACKED_MAX`]).
    groups: BTreeSet<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Counters {
    jobs_finished: [u64; 7],
    opcodes: [u64; 7],
    lock_grants: [u64; 3],
    owner_deaths: u64,
    deadlocks_refused: u64,
    config_lock_violations: [u64; 3],
    hook_runs: u64,
    hook_failures: u64,
    events_read: [u64; 2],
}

/// Every figure of EVENTS.md's metrics table, and what it takes to keep
/// them from the events alone.
#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    // Tracking state.
    jobs: BTreeMap<JobId, Job>,
    owners: BTreeMap<String, Owner>,
    workers: BTreeMap<String, Worker>,
    // Gauges kept event by event (the ages are computed at `now`).
    jobs_by_status: [u64; 7],
    slots_max: u64,
    locks_held: [[u64; 2]; LEVELS],
    workers_by_state: [u64; 6],
    /// Every tracked group, zeros included.
    workers_by_group: BTreeMap<String, [u64; 6]>,
    counters: Counters,
    queue_delay: Histogram,
    run: Histogram,
    lock_wait: Histogram,
    lock_hold: [Histogram; LEVELS],
    /// The newest timer observations, for statsd; not saved.
    recent: VecDeque<(Timer, f64)>,
    /// Observations ever made by this value (the last of `recent` is
    /// number `observed`).
    observed: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn micros(ts: Timestamp) -> u64 {
    ts.0.saturating_mul(1_000_000).saturating_add(ts.1)
}

/// A timestamp field: `[secs, usecs]` (or seconds as a number), in µs.
fn timestamp_us(value: &Value) -> Option<u64> {
    match value {
        Value::Array(parts) if parts.len() == 2 => {
            let secs = parts[0].as_u64()?;
            let usecs = parts[1].as_u64()?;
            Some(micros(Timestamp(secs, usecs)))
        }
        Value::Number(number) => number
            .as_f64()
            .filter(|secs| secs.is_finite() && *secs >= 0.0)
            .map(|secs| (secs * 1e6) as u64),
        _ => None,
    }
}

/// Seconds from `from_us` to `to_us`; 0 if the clocks disagree.
fn seconds_between(from_us: u64, to_us: u64) -> f64 {
    to_us.saturating_sub(from_us) as f64 / 1e6
}

/// Seconds from `since_us` to `now`, 0 if `now` is earlier.
fn age(since_us: u64, now: f64) -> f64 {
    (now - since_us as f64 / 1e6).max(0.0)
}

/// A saved `[lock, mode]` entry: its name, level and mode; `None` if
/// either does not parse.
fn lock_entry(entry: &Value) -> Option<(&str, Level, Option<Mode>)> {
    let parts = entry.as_array()?;
    let name = parts.first()?.as_str()?;
    let level = LockName::level_of(name).ok()?;
    let mode = parts.get(1).and_then(Value::as_str).and_then(parse_mode);
    Some((name, level, mode))
}

/// The fields of `lock.granted` and `lock.released` (most of wconfd's
/// events), read from the line without a tree of values. Each part is
/// read leniently: a part of the wrong type is `None` (an entry that is
/// not `[text, text]` has no name), as the other handlers' field lookups.
#[derive(Deserialize)]
struct LockChangeFields<'a> {
    #[serde(borrow, default)]
    owner: Text<'a>,
    #[serde(borrow, default)]
    entries: Entries<'a>,
    #[serde(borrow, default)]
    via: Text<'a>,
}

/// A text, or `None` for anything else.
#[derive(Default)]
struct Text<'a>(Option<Cow<'a, str>>);

/// A list of `[lock, mode]` entries, or `None` for anything else.
#[derive(Default)]
struct Entries<'a>(Option<Vec<LockEntry<'a>>>);

/// A `[lock, mode]` entry; its parts `None` where they are not text.
struct LockEntry<'a> {
    name: Option<Cow<'a, str>>,
    mode: Option<Cow<'a, str>>,
}

/// What [`Text`], [`Entries`] and [`LockEntry`] make of a JSON value.
struct Lenient<T>(std::marker::PhantomData<T>);

/// Skips what a lenient part does not take.
macro_rules! lenient_otherwise {
    ($none:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($none)
        }
    };
}

impl<'de: 'a, 'a> Visitor<'de> for Lenient<Text<'a>> {
    type Value = Text<'a>;
    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("any value")
    }
    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Borrowed(text))))
    }
    fn visit_str<E>(self, text: &str) -> Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Owned(text.to_owned()))))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text<'a>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Text(None))
    }
    lenient_otherwise!(Text(None));
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Lenient::<Self>(std::marker::PhantomData))
    }
}

impl<'de: 'a, 'a> Visitor<'de> for Lenient<Entries<'a>> {
    type Value = Entries<'a>;
    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("any value")
    }
    fn visit_str<E>(self, _: &str) -> Result<Entries<'a>, E> {
        Ok(Entries(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entries<'a>, A::Error> {
        let mut entries = Vec::with_capacity(seq.size_hint().unwrap_or(1));
        while let Some(entry) = seq.next_element::<LockEntry<'a>>()? {
            entries.push(entry);
        }
        Ok(Entries(Some(entries)))
    }
    lenient_otherwise!(Entries(None));
}

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Lenient::<Self>(std::marker::PhantomData))
    }
}

impl<'de: 'a, 'a> Visitor<'de> for Lenient<LockEntry<'a>> {
    type Value = LockEntry<'a>;
    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("any value")
    }
    fn visit_str<E>(self, _: &str) -> Result<LockEntry<'a>, E> {
        Ok(LockEntry::NONE)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LockEntry<'a>, A::Error> {
        let name = seq.next_element::<Text<'a>>()?.and_then(|text| text.0);
        let mode = seq.next_element::<Text<'a>>()?.and_then(|text| text.0);
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LockEntry { name, mode })
    }
    lenient_otherwise!(LockEntry::NONE);
}

impl LockEntry<'_> {
    const NONE: LockEntry<'static> = LockEntry {
        name: None,
        mode: None,
    };

    /// Its name, level and mode; `None` if the name or level does not
    /// parse (the mode is `None` if it does not).
    fn parts(&self) -> Option<(&str, Level, Option<Mode>)> {
        let name = self.name.as_deref()?;
        let level = LockName::level_of(name).ok()?;
        Some((name, level, self.mode.as_deref().and_then(parse_mode)))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LockEntry<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Lenient::<Self>(std::marker::PhantomData))
    }
}

fn text_field<'a>(fields: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    fields.get(name).and_then(Value::as_str)
}

fn id_field(fields: &Map<String, Value>) -> Option<JobId> {
    fields.get("id").and_then(Value::as_u64)
}

fn status_field(fields: &Map<String, Value>, name: &str) -> Option<Status> {
    text_field(fields, name).and_then(Status::parse)
}

fn worker_gauges(
    by_state: &mut [u64; 6],
    by_group: &mut BTreeMap<String, [u64; 6]>,
    worker: &Worker,
    up: bool,
) {
    let state = state_index(worker.state);
    let change = |count: &mut u64| {
        if up { *count += 1 } else { *count -= 1 }
    };
    change(&mut by_state[state]);
    for group in &worker.groups {
        let counts = by_group
            .get_mut(group)
            .expect("a worker's groups are tracked groups");
        change(&mut counts[state]);
    }
}

impl Metrics {
    /// Every gauge at zero, nothing counted.
    pub fn new() -> Metrics {
        Metrics {
            jobs: BTreeMap::new(),
            owners: BTreeMap::new(),
            workers: BTreeMap::new(),
            jobs_by_status: [0; 7],
            slots_max: 0,
            locks_held: [[0; 2]; LEVELS],
            workers_by_state: [0; 6],
            workers_by_group: BTreeMap::new(),
            counters: Counters::default(),
            queue_delay: Histogram::default(),
            run: Histogram::default(),
            lock_wait: Histogram::default(),
            lock_hold: Default::default(),
            recent: VecDeque::new(),
            observed: 0,
        }
    }

    /// Folds one event in. Every event counts as read; one that is
    /// malformed or of an unknown type changes nothing else (a field that
    /// does not parse skips the event, or only its entry in a list). The
    /// metrics are a listener of both sequences' notifications.
    pub fn apply(&mut self, source: Source, event: &EventLine) {
        self.counters.events_read[source.index()] += 1;
        match source {
            Source::Luxid => notify_queue(event, self),
            Source::Wconfd => notify_locks(event, self),
        }
    }

    /// A hook ran; a failed run counts as a run and a failure.
    pub fn hook_ran(&mut self, ok: bool) {
        self.counters.hook_runs += 1;
        if !ok {
            self.counters.hook_failures += 1;
        }
    }

    fn observe(&mut self, timer: Timer, seconds: f64) {
        let seconds = seconds.max(0.0);
        match timer {
            Timer::QueueDelay => self.queue_delay.observe(seconds),
            Timer::Run => self.run.observe(seconds),
            Timer::LockWait => self.lock_wait.observe(seconds),
            Timer::LockHold(level) => self.lock_hold[level_index(level)].observe(seconds),
        }
        if self.recent.len() == OBSERVATIONS_KEPT_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back((timer, seconds));
        self.observed += 1;
    }

    /// Sets a job's status, tracking it if it was not.
    fn set_status(&mut self, id: JobId, status: Status) -> &mut Job {
        let counts = &mut self.jobs_by_status;
        let job = self
            .jobs
            .entry(id)
            .and_modify(|job| counts[status_index(job.status)] -= 1)
            .or_insert(Job {
                status,
                received_us: None,
                delay_observed: false,
            });
        job.status = status;
        counts[status_index(status)] += 1;
        job
    }

    fn job_submitted(&mut self, fields: &Map<String, Value>) -> Option<()> {
        let id = id_field(fields)?;
        let received_us = fields.get("received").and_then(timestamp_us);
        if !self.jobs.contains_key(&id) {
            self.set_status(id, Status::Queued);
        }
        let job = self.jobs.get_mut(&id).expect("tracked just now");
        job.received_us = job.received_us.or(received_us);
        Some(())
    }

    fn job_status(&mut self, fields: &Map<String, Value>, ts_us: u64) -> Option<()> {
        let id = id_field(fields)?;
        let new = status_field(fields, "new")?;
        let old = self
            .jobs
            .get(&id)
            .map(|job| job.status)
            .or_else(|| status_field(fields, "old"));
        let job = self.set_status(id, new);
        // Leaving `queued` for a step of a run is the job's start (its
        // first opcode's start timestamp is taken then).
        let started = old == Some(Status::Queued)
            && matches!(new, Status::Waiting | Status::Running | Status::Canceling);
        if started
            && !job.delay_observed
            && let Some(received_us) = job.received_us
        {
            job.delay_observed = true;
            self.observe(Timer::QueueDelay, seconds_between(received_us, ts_us));
        }
        Some(())
    }

    fn job_finished(&mut self, fields: &Map<String, Value>) -> Option<()> {
        let id = id_field(fields)?;
        let status = status_field(fields, "status")?;
        let timestamp = |name| fields.get(name).and_then(timestamp_us);
        let (received_us, start_us, end_us) =
            (timestamp("received"), timestamp("start"), timestamp("end"));
        self.counters.jobs_finished[status_index(status)] += 1;
        let opcodes = fields.get("opcodes").and_then(Value::as_array);
        for opcode in opcodes.into_iter().flatten() {
            if let Some(opcode) = opcode.as_str().and_then(Status::parse) {
                self.counters.opcodes[status_index(opcode)] += 1;
            }
        }
        let job = self.set_status(id, status);
        job.received_us = job.received_us.or(received_us);
        let delay = match (job.delay_observed, job.received_us, start_us) {
            (false, Some(received_us), Some(start_us)) => {
                job.delay_observed = true;
                Some(seconds_between(received_us, start_us))
            }
            _ => None,
        };
        if let Some(delay) = delay {
            self.observe(Timer::QueueDelay, delay);
        }
        if let (Some(start_us), Some(end_us)) = (start_us, end_us) {
            self.observe(Timer::Run, seconds_between(start_us, end_us));
        }
        Some(())
    }

    fn job_archived(&mut self, fields: &Map<String, Value>) -> Option<()> {
        let job = self.jobs.remove(&id_field(fields)?)?;
        self.jobs_by_status[status_index(job.status)] -= 1;
        Some(())
    }

    fn lock_granted(&mut self, fields: &LockChangeFields<'_>, ts_us: u64) -> Option<()> {
        let name = fields.owner.0.as_deref()?;
        let entries = fields.entries.0.as_ref()?;
        let via = (fields.via.0.as_deref()).and_then(|via| VIAS.iter().position(|v| *v == via));
        if let Some(via) = via {
            self.counters.lock_grants[via] += 1;
        }
        if !self.owners.contains_key(name) {
            self.owners.insert(name.to_owned(), Owner::default());
        }
        let owner = self.owners.get_mut(name).expect("inserted above");
        for (lock, level, mode) in entries.iter().filter_map(LockEntry::parts) {
            let Some(mode) = mode else { continue };
            let counts = &mut self.locks_held[level_index(level)];
            match owner.held.get_mut(lock) {
                Some(held) if held.mode == mode => {}
                Some(held) => {
                    counts[mode_index(held.mode)] -= 1;
                    counts[mode_index(mode)] += 1;
                    held.mode = mode;
                }
                None => {
                    counts[mode_index(mode)] += 1;
                    let since_us = ts_us;
                    owner.held.insert(
                        lock.to_owned(),
                        Held {
                            level,
                            mode,
                            since_us,
                        },
                    );
                }
            }
        }
        // A grant through the waiting path ends the owner's wait.
        let waited_us = match via {
            Some(1 | 2) => owner.waiting_since_us.take(),
            _ => None,
        };
        if owner.is_idle() {
            self.owners.remove(name);
        }
        if let Some(since_us) = waited_us {
            self.observe(Timer::LockWait, seconds_between(since_us, ts_us));
        }
        Some(())
    }

    fn lock_released(&mut self, fields: &LockChangeFields<'_>, ts_us: u64) -> Option<()> {
        let name = fields.owner.0.as_deref()?;
        let entries = fields.entries.0.as_ref()?;
        let owner = self.owners.get_mut(name)?;
        let mut holds = Vec::new();
        for (lock, _, _) in entries.iter().filter_map(LockEntry::parts) {
            // The tracked mode counts: it is the one the gauge holds.
            if let Some(held) = owner.held.remove(lock) {
                self.locks_held[level_index(held.level)][mode_index(held.mode)] -= 1;
                holds.push((held.level, seconds_between(held.since_us, ts_us)));
            }
        }
        if owner.is_idle() {
            self.owners.remove(name);
        }
        for (level, seconds) in holds {
            self.observe(Timer::LockHold(level), seconds);
        }
        Some(())
    }

    fn lock_waiting(&mut self, fields: &Map<String, Value>, ts_us: u64) -> Option<()> {
        let name = text_field(fields, "owner")?;
        // A standby reporter waits for its election forever: no one is
        // kept from work by that.
        let services_only =
            fields
                .get("request")
                .and_then(Value::as_array)
                .is_some_and(|request| {
                    request.iter().all(|entry| {
                        entry[0]
                            .as_str()
                            .is_some_and(|lock| lock.starts_with("service/"))
                    })
                });
        if services_only {
            return Some(());
        }
        let owner = self.owners.entry(name.to_owned()).or_default();
        // A replaced request: the owner has waited since the first one.
        owner.waiting_since_us.get_or_insert(ts_us);
        Some(())
    }

    /// `lock.withdrawn` and `owner.dead`: the owner waits no more.
    fn wait_ended(&mut self, fields: &Map<String, Value>) -> Option<()> {
        let name = text_field(fields, "owner")?;
        if let Some(owner) = self.owners.get_mut(name) {
            owner.waiting_since_us = None;
            if owner.is_idle() {
                self.owners.remove(name);
            }
        }
        Some(())
    }

    /// `worker.<state>` and `worker.groups`: the worker's state is `new`
    /// (or the type's), its groups `groups` (or the ones it had).
    fn worker_changed(&mut self, kind: &str, fields: &Map<String, Value>) -> Option<()> {
        let uuid = text_field(fields, "uuid")?;
        let state = text_field(fields, "new")
            .and_then(State::parse)
            .or_else(|| State::parse(&kind.to_ascii_uppercase()))?;
        let old = self.workers.remove(uuid);
        let groups = match fields.get("groups").and_then(Value::as_array) {
            Some(groups) => {
                let mut tracked = BTreeSet::new();
                for group in groups
                    .iter()
                    .filter_map(Value::as_str)
                    .take(WORKER_GROUPS_MAX)
                {
                    if !self.workers_by_group.contains_key(group)
                        && self.workers_by_group.len() < GROUPS_TRACKED_MAX
                    {
                        self.workers_by_group.insert(group.to_owned(), [0; 6]);
                    }
                    if self.workers_by_group.contains_key(group) {
                        tracked.insert(group.to_owned());
                    }
                }
                tracked
            }
            None => old
                .as_ref()
                .map(|old| old.groups.clone())
                .unwrap_or_default(),
        };
        if let Some(old) = &old {
            worker_gauges(
                &mut self.workers_by_state,
                &mut self.workers_by_group,
                old,
                false,
            );
        }
        let worker = Worker { state, groups };
        worker_gauges(
            &mut self.workers_by_state,
            &mut self.workers_by_group,
            &worker,
            true,
        );
        self.workers.insert(uuid.to_owned(), worker);
        Some(())
    }

    /// Counts each kind's entities of `kinds`; a malformed count skips the
    /// whole event.
    fn config_lock_violation(&mut self, fields: &Map<String, Value>) -> Option<()> {
        let kinds = fields.get("kinds")?.as_object()?;
        let mut counts = [0; 3];
        for (slot, kind) in counts.iter_mut().zip(ENTITY_KINDS) {
            *slot = match kinds.get(kind) {
                None => 0,
                Some(count) => count.as_u64()?,
            };
        }
        for (total, count) in self.counters.config_lock_violations.iter_mut().zip(counts) {
            *total = total.saturating_add(count);
        }
        Some(())
    }

    fn worker_deregistered(&mut self, fields: &Map<String, Value>) -> Option<()> {
        let worker = self.workers.remove(text_field(fields, "uuid")?)?;
        worker_gauges(
            &mut self.workers_by_state,
            &mut self.workers_by_group,
            &worker,
            false,
        );
        Some(())
    }

    /// Every family of the table with its samples at `now`, in the
    /// table's order.
    fn families(&self, now: f64) -> Vec<Family<'_>> {
        let by_status = |counts: &[u64; 7], all: bool| -> Vec<Sample<'_>> {
            Status::ALL
                .into_iter()
                .filter(|status| all || status.is_final() || counts[status_index(*status)] > 0)
                .map(|status| Sample::count(vec![status.name()], counts[status_index(status)]))
                .collect()
        };
        let slots_used = [Status::Waiting, Status::Running, Status::Canceling]
            .into_iter()
            .map(|status| self.jobs_by_status[status_index(status)])
            .sum();
        // Scans rather than indexes: rendered about once a second, while
        // an index would cost at every event.
        let oldest_queued = self
            .jobs
            .values()
            .filter(|job| job.status == Status::Queued)
            .filter_map(|job| job.received_us)
            .min()
            .map_or(0.0, |received_us| age(received_us, now));
        let waiting = self
            .owners
            .values()
            .filter_map(|owner| owner.waiting_since_us);
        let owners_waiting = waiting.clone().count() as u64;
        let longest_wait = waiting.min().map_or(0.0, |since_us| age(since_us, now));
        let locks_held = Level::ALL
            .into_iter()
            .flat_map(|level| {
                MODES.into_iter().map(move |mode| {
                    let count = self.locks_held[level_index(level)][mode_index(mode)];
                    Sample::count(vec![level.as_str(), mode.as_str()], count)
                })
            })
            .collect();
        let workers = State::ALL
            .into_iter()
            .map(|state| {
                Sample::count(
                    vec![state.wire()],
                    self.workers_by_state[state_index(state)],
                )
            })
            .collect();
        let by_group = self
            .workers_by_group
            .iter()
            .flat_map(|(group, counts)| {
                State::ALL.into_iter().map(move |state| {
                    Sample::count(
                        vec![group.as_str(), state.wire()],
                        counts[state_index(state)],
                    )
                })
            })
            .collect();
        let counters = &self.counters;
        let lock_grants = VIAS
            .iter()
            .zip(counters.lock_grants)
            .map(|(via, count)| Sample::count(vec![*via], count))
            .collect();
        let config_lock_violations = ENTITY_KINDS
            .iter()
            .zip(counters.config_lock_violations)
            .map(|(kind, count)| Sample::count(vec![*kind], count))
            .collect();
        let events_read = Source::ALL
            .into_iter()
            .map(|source| {
                Sample::count(vec![source.as_str()], counters.events_read[source.index()])
            })
            .collect();
        let lock_hold = Level::ALL
            .into_iter()
            .map(|level| Sample {
                labels: vec![level.as_str()],
                figure: Figure::Histogram(&self.lock_hold[level_index(level)]),
            })
            .collect();
        let one = |figure| {
            vec![Sample {
                labels: Vec::new(),
                figure,
            }]
        };
        let samples: [Vec<Sample<'_>>; 22] = [
            by_status(&self.jobs_by_status, true),
            one(Figure::Count(slots_used)),
            one(Figure::Count(self.slots_max)),
            one(Figure::Seconds(oldest_queued)),
            locks_held,
            one(Figure::Count(owners_waiting)),
            one(Figure::Seconds(longest_wait)),
            workers,
            by_group,
            by_status(&counters.jobs_finished, false),
            by_status(&counters.opcodes, false),
            lock_grants,
            one(Figure::Count(counters.owner_deaths)),
            one(Figure::Count(counters.deadlocks_refused)),
            config_lock_violations,
            one(Figure::Count(counters.hook_runs)),
            one(Figure::Count(counters.hook_failures)),
            events_read,
            one(Figure::Histogram(&self.queue_delay)),
            one(Figure::Histogram(&self.run)),
            one(Figure::Histogram(&self.lock_wait)),
            lock_hold,
        ];
        FAMILIES
            .iter()
            .zip(samples)
            .map(|(spec, samples)| {
                debug_assert!(samples.iter().all(|s| s.labels.len() == spec.labels.len()));
                Family { spec, samples }
            })
            .collect()
    }

    /// The Prometheus text exposition (format 0.0.4) of every family.
    pub fn prometheus_text(&self, now: f64) -> String {
        self.prometheus_text_with(now, &[])
    }

    /// [`Metrics::prometheus_text`] followed by the caller's own gauges,
    /// `(name, help, value)` each (`warden_reporter_leader` and the like).
    /// A name that is not a snake-case metric name or repeats one is a
    /// programmer error.
    pub fn prometheus_text_with(&self, now: f64, extra: &[(&str, &str, f64)]) -> String {
        let mut text = String::new();
        for family in self.families(now) {
            let spec = family.spec;
            if family.samples.is_empty() {
                // No group seen yet: a family without samples says nothing.
                continue;
            }
            write_family_head(&mut text, spec.prom, spec.help, spec.kind.as_str());
            for sample in &family.samples {
                let labels: Vec<(&str, &str)> = spec
                    .labels
                    .iter()
                    .copied()
                    .zip(sample.labels.iter().copied())
                    .collect();
                match sample.figure {
                    Figure::Count(count) => {
                        write_sample(&mut text, spec.prom, &labels, None, &count.to_string())
                    }
                    Figure::Seconds(seconds) => {
                        write_sample(&mut text, spec.prom, &labels, None, &format_float(seconds))
                    }
                    Figure::Histogram(histogram) => {
                        let bucket = format!("{}_bucket", spec.prom);
                        for (le, count) in histogram.cumulative() {
                            write_sample(
                                &mut text,
                                &bucket,
                                &labels,
                                Some(&le),
                                &count.to_string(),
                            );
                        }
                        let sum = format!("{}_sum", spec.prom);
                        write_sample(&mut text, &sum, &labels, None, &format_float(histogram.sum));
                        let count = format!("{}_count", spec.prom);
                        write_sample(
                            &mut text,
                            &count,
                            &labels,
                            None,
                            &histogram.count().to_string(),
                        );
                    }
                }
            }
        }
        let mut seen = BTreeSet::new();
        for (name, help, value) in extra {
            assert!(
                is_metric_name(name),
                "{name:?} is not a snake-case metric name"
            );
            assert!(
                !FAMILIES.iter().any(|spec| spec.prom == *name) && seen.insert(*name),
                "{name} repeats a family"
            );
            write_family_head(&mut text, name, help, "gauge");
            write_sample(&mut text, name, &[], None, &format_float(*value));
        }
        text
    }

    /// The same figures as JSON, for `warden status --json`:
    ///
    /// `{"gauges": {...}, "counters": {...}, "histograms": {...}}`, each
    /// family under its Prometheus name without `warden_`
    /// (`"jobs"`, `"jobs_finished_total"`, `"lock_wait_seconds"`). A
    /// family without labels is its value; a labelled one an object by
    /// label value, nested in the label order (`"locks_held": {"node":
    /// {"shared": 0, "exclusive": 2}}`, `"workers_by_group": {group:
    /// {state: n}}`). A histogram is `{"count": n, "sum": seconds,
    /// "buckets": {"0.001": n, ..., "+Inf": n}}` with cumulative counts.
    /// Ages and sums are seconds.
    pub fn to_json(&self, now: f64) -> Value {
        let mut sections = [Map::new(), Map::new(), Map::new()];
        for family in self.families(now) {
            let spec = family.spec;
            let section = &mut sections[spec.kind as usize];
            let key = spec.prom.strip_prefix("warden_").unwrap_or(spec.prom);
            let mut value = if spec.labels.is_empty() {
                Value::Null
            } else {
                Value::Object(Map::new())
            };
            for sample in &family.samples {
                let figure = match sample.figure {
                    Figure::Count(count) => Value::from(count),
                    Figure::Seconds(seconds) => Value::from(seconds),
                    Figure::Histogram(histogram) => {
                        let buckets: Map<String, Value> = histogram
                            .cumulative()
                            .map(|(le, count)| (le, Value::from(count)))
                            .collect();
                        json!({"count": histogram.count(), "sum": histogram.sum, "buckets": buckets})
                    }
                };
                let mut slot = &mut value;
                for label in &sample.labels {
                    slot = slot
                        .as_object_mut()
                        .expect("a labelled family nests objects")
                        .entry((*label).to_owned())
                        .or_insert_with(|| Value::Object(Map::new()));
                }
                *slot = figure;
            }
            section.insert(key.to_owned(), value);
        }
        let [gauges, counters, histograms] = sections;
        json!({"gauges": gauges, "counters": counters, "histograms": histograms})
    }

    /// Everything but the statsd observations, compact: the tracking state
    /// (the gauges are recomputed from it), the counters and the
    /// histograms. Timestamps are µs since the epoch.
    pub fn save(&self) -> Value {
        let jobs: Vec<Value> = self
            .jobs
            .iter()
            .map(|(id, job)| {
                json!([
                    id,
                    job.status.name(),
                    job.received_us,
                    u8::from(job.delay_observed)
                ])
            })
            .collect();
        let owners: Vec<Value> = self
            .owners
            .iter()
            .map(|(name, owner)| {
                let held: Vec<Value> = owner
                    .held
                    .iter()
                    .map(|(lock, held)| json!([lock, held.mode.as_str(), held.since_us]))
                    .collect();
                json!([name, owner.waiting_since_us, held])
            })
            .collect();
        let workers: Vec<Value> = self
            .workers
            .iter()
            .map(|(uuid, worker)| json!([uuid, worker.state.wire(), worker.groups]))
            .collect();
        let by_status = |counts: &[u64; 7]| -> Map<String, Value> {
            Status::ALL
                .into_iter()
                .filter(|status| counts[status_index(*status)] > 0)
                .map(|status| {
                    (
                        status.name().to_owned(),
                        Value::from(counts[status_index(status)]),
                    )
                })
                .collect()
        };
        let counters = &self.counters;
        let lock_hold: Map<String, Value> = Level::ALL
            .into_iter()
            .map(|level| {
                (
                    level.as_str().to_owned(),
                    self.lock_hold[level_index(level)].save(),
                )
            })
            .collect();
        json!({
            "version": SAVED_VERSION,
            "slots_max": self.slots_max,
            "jobs": jobs,
            "owners": owners,
            "workers": workers,
            "groups": self.workers_by_group.keys().collect::<Vec<_>>(),
            "counters": {
                "jobs_finished": by_status(&counters.jobs_finished),
                "opcodes": by_status(&counters.opcodes),
                "lock_grants": counters.lock_grants,
                "owner_deaths": counters.owner_deaths,
                "deadlocks_refused": counters.deadlocks_refused,
                "config_lock_violations": counters.config_lock_violations,
                "hook_runs": counters.hook_runs,
                "hook_failures": counters.hook_failures,
                "events_read": counters.events_read,
            },
            "histograms": {
                "job_queue_delay": self.queue_delay.save(),
                "job_run": self.run.save(),
                "lock_wait": self.lock_wait.save(),
                "lock_hold": lock_hold,
            },
        })
    }

    /// The metrics [`Metrics::save`] gave; the error says what is wrong.
    pub fn restore(value: &Value) -> Result<Metrics, String> {
        let saved = value.as_object().ok_or("not an object")?;
        let field = |name: &str| saved.get(name).ok_or_else(|| format!("no {name}"));
        let array = |name: &str| -> Result<&Vec<Value>, String> {
            field(name)?
                .as_array()
                .ok_or_else(|| format!("{name} is not a list"))
        };
        let number = |value: &Value, what: &str| {
            value
                .as_u64()
                .ok_or_else(|| format!("{what} is not a count"))
        };
        let version = number(field("version")?, "version")?;
        if version != SAVED_VERSION {
            return Err(format!("format version {version}, not {SAVED_VERSION}"));
        }
        let mut metrics = Metrics::new();
        metrics.slots_max = number(field("slots_max")?, "slots_max")?;
        for group in array("groups")? {
            let group = group.as_str().ok_or("a group is not a string")?;
            if metrics.workers_by_group.len() == GROUPS_TRACKED_MAX {
                return Err(format!("more than {GROUPS_TRACKED_MAX} groups"));
            }
            if metrics
                .workers_by_group
                .insert(group.to_owned(), [0; 6])
                .is_some()
            {
                return Err(format!("group {group:?} twice"));
            }
        }
        for job in array("jobs")? {
            let bad = || format!("job {job} is not [id, status, received or null, 0 or 1]");
            let parts = job
                .as_array()
                .filter(|parts| parts.len() == 4)
                .ok_or_else(bad)?;
            let id = parts[0].as_u64().ok_or_else(bad)?;
            let status = parts[1].as_str().and_then(Status::parse).ok_or_else(bad)?;
            let received_us = match &parts[2] {
                Value::Null => None,
                received => Some(received.as_u64().ok_or_else(bad)?),
            };
            let delay_observed = match parts[3].as_u64() {
                Some(0) => false,
                Some(1) => true,
                _ => return Err(bad()),
            };
            let job = Job {
                status,
                received_us,
                delay_observed,
            };
            if metrics.jobs.insert(id, job).is_some() {
                return Err(format!("job {id} twice"));
            }
            metrics.jobs_by_status[status_index(status)] += 1;
        }
        for owner in array("owners")? {
            let bad = || format!("owner {owner} is not [name, waiting since or null, held]");
            let parts = owner
                .as_array()
                .filter(|parts| parts.len() == 3)
                .ok_or_else(bad)?;
            let name = parts[0].as_str().ok_or_else(bad)?;
            let waiting_since_us = match &parts[1] {
                Value::Null => None,
                since => Some(since.as_u64().ok_or_else(bad)?),
            };
            let mut track = Owner {
                held: BTreeMap::new(),
                waiting_since_us,
            };
            for held in parts[2].as_array().ok_or_else(bad)? {
                let bad = || format!("lock {held} of {name:?} is not [lock, mode, since]");
                let entry = held
                    .as_array()
                    .filter(|entry| entry.len() == 3)
                    .ok_or_else(bad)?;
                let (lock, level, mode) = lock_entry(held).ok_or_else(bad)?;
                let mode = mode.ok_or_else(bad)?;
                let since_us = entry[2].as_u64().ok_or_else(bad)?;
                if track
                    .held
                    .insert(
                        lock.to_owned(),
                        Held {
                            level,
                            mode,
                            since_us,
                        },
                    )
                    .is_some()
                {
                    return Err(format!("lock {lock} of {name:?} twice"));
                }
                metrics.locks_held[level_index(level)][mode_index(mode)] += 1;
            }
            if track.is_idle() {
                return Err(format!("owner {name:?} neither holds nor waits"));
            }
            if metrics.owners.insert(name.to_owned(), track).is_some() {
                return Err(format!("owner {name:?} twice"));
            }
        }
        for worker in array("workers")? {
            let bad = || format!("worker {worker} is not [uuid, state, [tracked groups]]");
            let parts = worker
                .as_array()
                .filter(|parts| parts.len() == 3)
                .ok_or_else(bad)?;
            let uuid = parts[0].as_str().ok_or_else(bad)?;
            let state = parts[1].as_str().and_then(State::parse).ok_or_else(bad)?;
            let mut groups = BTreeSet::new();
            for group in parts[2].as_array().ok_or_else(bad)? {
                let group = group.as_str().ok_or_else(bad)?;
                if !metrics.workers_by_group.contains_key(group) {
                    return Err(format!("worker {uuid:?}: group {group:?} is not tracked"));
                }
                groups.insert(group.to_owned());
            }
            let track = Worker { state, groups };
            worker_gauges(
                &mut metrics.workers_by_state,
                &mut metrics.workers_by_group,
                &track,
                true,
            );
            if metrics.workers.insert(uuid.to_owned(), track).is_some() {
                return Err(format!("worker {uuid:?} twice"));
            }
        }
        let counters = field("counters")?;
        let counter = |name: &str| {
            counters
                .get(name)
                .ok_or_else(|| format!("no counter {name}"))
        };
        let by_status = |name: &str| -> Result<[u64; 7], String> {
            let saved = counter(name)?
                .as_object()
                .ok_or_else(|| format!("{name} is not an object"))?;
            let mut counts = [0; 7];
            for (status, count) in saved {
                let status =
                    Status::parse(status).ok_or_else(|| format!("{name}: no status {status:?}"))?;
                counts[status_index(status)] = number(count, name)?;
            }
            Ok(counts)
        };
        let list = |name: &str, counts: &mut [u64]| -> Result<(), String> {
            let saved = counter(name)?
                .as_array()
                .filter(|saved| saved.len() == counts.len())
                .ok_or_else(|| format!("{name} is not {} counts", counts.len()))?;
            for (slot, count) in counts.iter_mut().zip(saved) {
                *slot = number(count, name)?;
            }
            Ok(())
        };
        let c = &mut metrics.counters;
        c.jobs_finished = by_status("jobs_finished")?;
        c.opcodes = by_status("opcodes")?;
        list("lock_grants", &mut c.lock_grants)?;
        list("events_read", &mut c.events_read)?;
        // Saved before the counter existed: none counted yet.
        if counters.get("config_lock_violations").is_some() {
            list("config_lock_violations", &mut c.config_lock_violations)?;
        }
        c.owner_deaths = number(counter("owner_deaths")?, "owner_deaths")?;
        // Saved before deadlocks were refused: none were.
        c.deadlocks_refused = match counters.get("deadlocks_refused") {
            Some(saved) => number(saved, "deadlocks_refused")?,
            None => 0,
        };
        c.hook_runs = number(counter("hook_runs")?, "hook_runs")?;
        c.hook_failures = number(counter("hook_failures")?, "hook_failures")?;
        let histograms = field("histograms")?;
        let histogram = |name: &str| {
            let saved = histograms
                .get(name)
                .ok_or_else(|| format!("no histogram {name}"))?;
            Histogram::restore(saved, name)
        };
        metrics.queue_delay = histogram("job_queue_delay")?;
        metrics.run = histogram("job_run")?;
        metrics.lock_wait = histogram("lock_wait")?;
        let lock_hold = histograms
            .get("lock_hold")
            .and_then(Value::as_object)
            .ok_or("no histograms lock_hold")?;
        for level in Level::ALL {
            let what = format!("lock_hold {level}");
            let saved = lock_hold
                .get(level.as_str())
                .ok_or_else(|| format!("no histogram {what}"))?;
            metrics.lock_hold[level_index(level)] = Histogram::restore(saved, &what)?;
        }
        Ok(metrics)
    }

    /// Panics unless the gauges kept event by event equal what the tracked
    /// state adds up to (see the module's invariants).
    pub fn check_invariants(&self) {
        let mut jobs = [0; 7];
        for job in self.jobs.values() {
            jobs[status_index(job.status)] += 1;
        }
        assert_eq!(
            jobs, self.jobs_by_status,
            "jobs by status are the tracked jobs"
        );
        let mut locks = [[0; 2]; LEVELS];
        for (name, owner) in &self.owners {
            assert!(
                !owner.is_idle(),
                "owner {name} neither holds nor waits, yet is tracked"
            );
            for (lock, held) in &owner.held {
                let level = LockName::parse(lock).map(|lock| lock.level());
                assert_eq!(level, Ok(held.level), "{lock} is filed under its level");
                locks[level_index(held.level)][mode_index(held.mode)] += 1;
            }
        }
        assert_eq!(locks, self.locks_held, "locks held are the owners' locks");
        assert!(self.workers_by_group.len() <= GROUPS_TRACKED_MAX);
        let mut states = [0; 6];
        let mut groups: BTreeMap<&str, [u64; 6]> = self
            .workers_by_group
            .keys()
            .map(|group| (group.as_str(), [0; 6]))
            .collect();
        for (uuid, worker) in &self.workers {
            states[state_index(worker.state)] += 1;
            for group in &worker.groups {
                let counts = groups.get_mut(group.as_str());
                let counts =
                    counts.unwrap_or_else(|| panic!("{uuid}: group {group} is not tracked"));
                counts[state_index(worker.state)] += 1;
            }
        }
        assert_eq!(
            states, self.workers_by_state,
            "workers by state are the workers"
        );
        for (group, counts) in &self.workers_by_group {
            assert_eq!(&groups[group.as_str()], counts, "workers of group {group}");
        }
        let histograms = [&self.queue_delay, &self.run, &self.lock_wait];
        for histogram in histograms.into_iter().chain(&self.lock_hold) {
            assert!(
                histogram.sum.is_finite() && histogram.sum >= 0.0,
                "{histogram:?}"
            );
        }
        assert!(self.recent.len() <= OBSERVATIONS_KEPT_MAX);
        assert!(self.recent.len() as u64 <= self.observed);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    // The order of `to_json`'s sections.
    Gauge = 0,
    Counter = 1,
    Histogram = 2,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// One row of EVENTS.md's metrics table.
struct Spec {
    prom: &'static str,
    /// Without the prefix; the label values follow, dot-separated.
    statsd: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
}

const fn spec(
    prom: &'static str,
    statsd: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Spec {
    Spec {
        prom,
        statsd,
        help,
        kind,
        labels,
    }
}

/// EVENTS.md's metrics table, in its order ([`Metrics::families`] gives
/// the samples in the same order).
const FAMILIES: [Spec; 22] = {
    use Kind::{Counter, Gauge, Histogram};
    [
        spec(
            "warden_jobs",
            "jobs",
            Gauge,
            &["status"],
            "Jobs in the queue (not archived) by status.",
        ),
        spec(
            "warden_slots_used",
            "slots.used",
            Gauge,
            &[],
            "Jobs waiting, running or canceling.",
        ),
        spec(
            "warden_slots_max",
            "slots.max",
            Gauge,
            &[],
            "luxid's max_running_jobs.",
        ),
        spec(
            "warden_oldest_queued_job_age_seconds",
            "jobs.oldest_queued_age",
            Gauge,
            &[],
            "Age of the oldest queued job, 0 if none.",
        ),
        spec(
            "warden_locks_held",
            "locks.held",
            Gauge,
            &["level", "mode"],
            "Locks held by level and mode.",
        ),
        spec(
            "warden_owners_waiting",
            "owners.waiting",
            Gauge,
            &[],
            "Owners with a waiting lock request.",
        ),
        spec(
            "warden_longest_wait_seconds",
            "owners.longest_wait",
            Gauge,
            &[],
            "Age of the oldest waiting lock request, 0 if none.",
        ),
        spec(
            "warden_workers",
            "workers",
            Gauge,
            &["state"],
            "Workers by state.",
        ),
        spec(
            "warden_workers_by_group",
            "workers.group",
            Gauge,
            &["group", "state"],
            "Workers by group and state.",
        ),
        spec(
            "warden_jobs_finished_total",
            "jobs.finished",
            Counter,
            &["status"],
            "Jobs finished, by final status.",
        ),
        spec(
            "warden_opcodes_total",
            "opcodes",
            Counter,
            &["status"],
            "Opcodes of finished jobs, by final status.",
        ),
        spec(
            "warden_lock_grants_total",
            "locks.grants",
            Counter,
            &["via"],
            "Lock grants by path.",
        ),
        spec(
            "warden_owner_deaths_total",
            "owners.deaths",
            Counter,
            &[],
            "Lock owners found dead.",
        ),
        spec(
            "warden_lock_deadlocks_refused_total",
            "locks.deadlocks_refused",
            Counter,
            &[],
            "Waiting lock requests refused because they would close a cycle of waits.",
        ),
        spec(
            "warden_config_lock_violations_total",
            "config.lock_violations",
            Counter,
            &["kind"],
            "Entities changed by config writes whose writer lacked their locks, by kind.",
        ),
        spec(
            "warden_hook_runs_total",
            "hooks.runs",
            Counter,
            &[],
            "Hook runs.",
        ),
        spec(
            "warden_hook_failures_total",
            "hooks.failures",
            Counter,
            &[],
            "Hook runs that failed.",
        ),
        spec(
            "warden_events_read_total",
            "events.read",
            Counter,
            &["daemon"],
            "Events read, by daemon.",
        ),
        spec(
            "warden_job_queue_delay_seconds",
            "jobs.queue_delay",
            Histogram,
            &[],
            "Time from a job's receipt to its start.",
        ),
        spec(
            "warden_job_run_seconds",
            "jobs.run_time",
            Histogram,
            &[],
            "Time from a job's start to its end.",
        ),
        spec(
            "warden_lock_wait_seconds",
            "locks.wait",
            Histogram,
            &[],
            "Time from a lock request to its grant.",
        ),
        spec(
            "warden_lock_hold_seconds",
            "locks.hold",
            Histogram,
            &["level"],
            "Time from a lock's grant to its release, by level.",
        ),
    ]
};

/// The family a timer's observations belong to, and its label values.
fn timer_family(timer: Timer) -> (&'static Spec, Vec<&'static str>) {
    let (prom, labels) = match timer {
        Timer::QueueDelay => ("warden_job_queue_delay_seconds", Vec::new()),
        Timer::Run => ("warden_job_run_seconds", Vec::new()),
        Timer::LockWait => ("warden_lock_wait_seconds", Vec::new()),
        Timer::LockHold(level) => ("warden_lock_hold_seconds", vec![level.as_str()]),
    };
    let spec = FAMILIES.iter().find(|spec| spec.prom == prom);
    (spec.expect("every timer is a family"), labels)
}

enum Figure<'a> {
    Count(u64),
    Seconds(f64),
    Histogram(&'a Histogram),
}

struct Sample<'a> {
    /// One value for each of the family's labels.
    labels: Vec<&'a str>,
    figure: Figure<'a>,
}

impl<'a> Sample<'a> {
    fn count(labels: Vec<&'a str>, count: u64) -> Sample<'a> {
        Sample {
            labels,
            figure: Figure::Count(count),
        }
    }
}

struct Family<'a> {
    spec: &'static Spec,
    samples: Vec<Sample<'a>>,
}

/// A float as Prometheus reads it: shortest round-trip digits, no exponent.
fn format_float(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        value.to_string()
    }
}

fn is_metric_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn write_family_head(text: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn write_sample(
    text: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: &str,
) {
    text.push_str(name);
    let le = le.map(|le| ("le", le));
    let mut labels = labels.iter().copied().chain(le).peekable();
    if labels.peek().is_some() {
        text.push('{');
        for (index, (label, value)) in labels.enumerate() {
            if index > 0 {
                text.push(',');
            }
            let value = value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(text, "{label}=\"{value}\"");
        }
        text.push('}');
    }
    let _ = writeln!(text, " {value}");
}

/// A name part for statsd: `.`, `:`, `|`, spaces and the like would change
/// a line's meaning, so everything but `[A-Za-z0-9_-]` becomes `_`.
fn sanitised(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Milliseconds (or seconds) for a statsd line: at most three decimals.
fn format_decimal(value: f64) -> String {
    let text = format!("{:.3}", value.max(0.0));
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// When a gauge was last sent, and its text then.
#[derive(Clone, Debug)]
struct Sent {
    value: String,
    at: f64,
}

/// luxid's events; `None` from a handler: malformed, nothing changed.
/// These come at job rates: the handlers read the event decoded.
impl QueueChange for Metrics {
    fn queue_started_notification(&mut self, event: &EventLine) {
        let Ok(event) = event.decode() else { return };
        if let Some(max) = event.fields.get("max_running_jobs").and_then(Value::as_u64) {
            self.slots_max = max;
        }
    }

    fn job_submitted_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode() {
            let _: Option<()> = self.job_submitted(&event.fields);
        }
    }

    fn job_status_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode() {
            let _: Option<()> = self.job_status(&event.fields, micros(event.ts));
        }
    }

    fn job_finished_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode() {
            let _: Option<()> = self.job_finished(&event.fields);
        }
    }

    fn job_archived_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode() {
            let _: Option<()> = self.job_archived(&event.fields);
        }
    }
}

/// wconfd's events (`config.written` counts only as read). Grants and
/// releases come at lock RPC rates and are read borrowed from the line;
/// the rest decoded.
impl LockChange for Metrics {
    fn lock_granted_notification(&mut self, event: &EventLine) {
        if let Ok(fields) = event.fields::<LockChangeFields>() {
            let _: Option<()> = self.lock_granted(&fields, micros(event.ts()));
        }
    }

    fn lock_released_notification(&mut self, event: &EventLine) {
        if let Ok(fields) = event.fields::<LockChangeFields>() {
            let _: Option<()> = self.lock_released(&fields, micros(event.ts()));
        }
    }

    fn lock_waiting_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode() {
            let _: Option<()> = self.lock_waiting(&event.fields, micros(event.ts));
        }
    }

    fn lock_withdrawn_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode() {
            let _: Option<()> = self.wait_ended(&event.fields);
        }
    }

    fn lock_deadlock_notification(&mut self, _event: &EventLine) {
        self.counters.deadlocks_refused += 1;
    }

    fn owner_dead_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode()
            && self.wait_ended(&event.fields).is_some()
        {
            self.counters.owner_deaths += 1;
        }
    }

    fn config_lock_violation_notification(&mut self, event: &EventLine) {
        if let Ok(event) = event.decode() {
            let _: Option<()> = self.config_lock_violation(&event.fields);
        }
    }

    fn worker_changed_notification(&mut self, event: &EventLine, change: &str) {
        let Ok(event) = event.decode() else { return };
        let _: Option<()> = match change {
            "deregistered" => self.worker_deregistered(&event.fields),
            state => self.worker_changed(state, &event.fields),
        };
    }
}

/// What the statsd sender has told statsd, to decide what is due.
///
/// Rules, with `interval` the setting (`[metrics] interval_ms`):
/// - A gauge is sent at most once per `interval`: every gauge at the first
///   call (so the zeros appear), then a changed gauge at the first call at
///   or after its last send + `interval`, with the value it has then (so
///   a burst of changes ends with its last value sent). An unchanged
///   gauge is sent again every [`HEARTBEAT_INTERVALS`] intervals.
/// - Counters (deltas since their last send, `name:delta|c`) and timers
///   (each observation since the last send, `name:ms|ms`) go together at
///   most once per `interval`, so calls in a busy loop cost nothing.
/// - Ages are gauges in seconds (to the millisecond), timers milliseconds
///   (to the microsecond).
///
/// The caller calls [`Statsd::due`] after applying events and on a tick of
/// a fraction of `interval` (a quarter keeps a change's delay under 1.25
/// intervals); a call with nothing due costs a walk over the figures.
///
/// Statsd's names cannot hold every character: group names and label
/// values are [`sanitised`]; two groups differing only there share a name.
#[derive(Clone, Debug)]
pub struct Statsd {
    prefix: String,
    interval: f64,
    gauges: BTreeMap<String, Sent>,
    /// Each counter's total at its last send.
    counters: BTreeMap<String, u64>,
    /// When counters and timers were last sent.
    flushed_at: Option<f64>,
    /// The number of the next observation to send.
    next_observation: u64,
    dropped_observations: u64,
    dropped_lines: u64,
    /// Nothing is sent before this (a reporter taking over waits out its
    /// predecessor's interval).
    quiet_until: f64,
}

impl Statsd {
    /// Sends nothing before `at` (seconds since the epoch): a reporter
    /// taking over keeps one interval after its predecessor's last send.
    pub fn not_before(&mut self, at: f64) {
        self.quiet_until = at;
    }

    /// A sender for a statsd that has been told nothing: the first call
    /// sends the counters' whole totals and every observation kept.
    /// `prefix` (`"warden"`) may hold dots; other characters statsd
    /// cannot take become `_`. `interval` is in seconds, positive.
    pub fn new(prefix: &str, interval: f64) -> Statsd {
        assert!(
            interval.is_finite() && interval > 0.0,
            "interval {interval}"
        );
        let prefix: String = prefix
            .split('.')
            .filter(|part| !part.is_empty())
            .map(sanitised)
            .collect::<Vec<_>>()
            .join(".");
        Statsd {
            prefix,
            interval,
            gauges: BTreeMap::new(),
            counters: BTreeMap::new(),
            flushed_at: None,
            next_observation: 0,
            dropped_observations: 0,
            dropped_lines: 0,
            quiet_until: 0.0,
        }
    }

    /// A sender taking over from another (a reporter that restored
    /// `metrics` or has just been elected): counters count from their
    /// totals now and only later observations are sent, as the previous
    /// sender sent what came before. Gauges are all sent at the first call.
    pub fn resume(prefix: &str, interval: f64, metrics: &Metrics) -> Statsd {
        let mut statsd = Statsd::new(prefix, interval);
        for family in metrics.families(0.0) {
            if family.spec.kind != Kind::Counter {
                continue;
            }
            for sample in &family.samples {
                if let Figure::Count(count) = sample.figure {
                    let name = statsd.name(family.spec, &sample.labels);
                    statsd.counters.insert(name, count);
                }
            }
        }
        statsd.next_observation = metrics.observed;
        statsd
    }

    /// Timer observations dropped because more than
    /// [`OBSERVATIONS_KEPT_MAX`] came between two sends.
    pub fn dropped_observations(&self) -> u64 {
        self.dropped_observations
    }

    /// Lines dropped because they alone exceed a packet (a group name of
    /// hundreds of bytes).
    pub fn dropped_lines(&self) -> u64 {
        self.dropped_lines
    }

    fn name(&self, spec: &Spec, labels: &[&str]) -> String {
        let mut name = self.prefix.clone();
        for part in std::iter::once(spec.statsd.to_owned())
            .chain(labels.iter().map(|label| sanitised(label)))
        {
            if !name.is_empty() {
                name.push('.');
            }
            name.push_str(&part);
        }
        name
    }

    /// The packets due at `now`, each at most [`STATSD_PACKET_BYTES_MAX`]
    /// bytes of whole lines joined by `\n`; none if nothing is due.
    pub fn due(&mut self, metrics: &Metrics, now: f64) -> Vec<Vec<u8>> {
        if now < self.quiet_until {
            return Vec::new();
        }
        let mut lines = Vec::new();
        let flush = self
            .flushed_at
            .is_none_or(|at| now - at >= self.interval || now < at);
        if flush {
            self.flushed_at = Some(now);
        }
        for family in metrics.families(now) {
            let spec = family.spec;
            for sample in &family.samples {
                let name = self.name(spec, &sample.labels);
                match (spec.kind, &sample.figure) {
                    (Kind::Gauge, figure) => {
                        let value = match figure {
                            Figure::Count(count) => count.to_string(),
                            Figure::Seconds(seconds) => format_decimal(*seconds),
                            Figure::Histogram(_) => unreachable!("a gauge is a number"),
                        };
                        let due = self.gauges.get(&name).is_none_or(|sent| {
                            let elapsed = now - sent.at;
                            // A clock set back must not silence a gauge.
                            elapsed < 0.0
                                || (elapsed >= self.interval && sent.value != value)
                                || elapsed >= self.interval * HEARTBEAT_INTERVALS
                        });
                        if due {
                            lines.push(format!("{name}:{value}|g"));
                            self.gauges.insert(name, Sent { value, at: now });
                        }
                    }
                    (Kind::Counter, Figure::Count(count)) if flush => {
                        let last = self.counters.insert(name.clone(), *count).unwrap_or(0);
                        // Less than before: restored from older metrics; count on.
                        if *count > last {
                            lines.push(format!("{name}:{}|c", count - last));
                        }
                    }
                    _ => {}
                }
            }
        }
        if flush {
            let first = metrics.observed - metrics.recent.len() as u64;
            if self.next_observation < first {
                self.dropped_observations += first - self.next_observation;
                self.next_observation = first;
            }
            // More sent than made: another `Metrics`; go on from its end.
            let skip = self.next_observation.min(metrics.observed) - first;
            for (timer, seconds) in metrics.recent.iter().skip(skip as usize) {
                let (spec, labels) = timer_family(*timer);
                let name = self.name(spec, &labels);
                lines.push(format!("{name}:{}|ms", format_decimal(seconds * 1000.0)));
            }
            self.next_observation = metrics.observed;
        }
        self.pack(lines)
    }

    fn pack(&mut self, lines: Vec<String>) -> Vec<Vec<u8>> {
        let mut packets = Vec::new();
        let mut packet: Vec<u8> = Vec::new();
        for line in lines {
            if line.len() > STATSD_PACKET_BYTES_MAX {
                self.dropped_lines += 1;
                continue;
            }
            if !packet.is_empty() && packet.len() + 1 + line.len() > STATSD_PACKET_BYTES_MAX {
                packets.push(std::mem::take(&mut packet));
            }
            if !packet.is_empty() {
                packet.push(b'\n');
            }
            packet.extend_from_slice(line.as_bytes());
        }
        if !packet.is_empty() {
            packets.push(packet);
        }
        packets
    }
}
