//! What [`QueueCore`] knows of each job for scheduling (SCHEDULING.md):
//! the job filter rules, each unfinished job's applying rule and ad-hoc
//! rate-limit buckets, worked out once per job (and again for every job
//! when the rules change), so that a scheduling pass only looks them up;
//! the unique keys of the unfinished jobs; the `start_by` deadlines of
//! the queued ones.
//!
//! A job's applying rule depends on its id and its opcodes as submitted,
//! which never change, and on the rules; its buckets on its opcodes'
//! reasons alone.

use std::collections::HashMap;
use std::time::SystemTime;

use super::*;
use crate::scheduling::filters::{Action as RuleAction, FilterRule, applying_index, reason_texts};
use crate::scheduling::rate_limit::{Bucket, Occupancy, buckets_of};

/// The rules and what they, and the reasons, make of each unfinished job.
#[derive(Debug, Default)]
pub(super) struct Scheduling {
    /// In the order they apply: `(priority, watermark, uuid)`.
    rules: Vec<FilterRule>,
    /// The applying rule (its place in `rules`) of each unfinished job
    /// one applies to.
    applying: HashMap<JobId, usize>,
    /// The buckets of each unfinished job that is in any.
    buckets: HashMap<JobId, Vec<Bucket>>,
    /// Queued jobs a `REJECT` applies to, to be canceled.
    rejected: BTreeSet<JobId>,
    /// The unfinished job of each unique key.
    unique: HashMap<String, JobId>,
    /// Queued jobs that must start by a time: when (on the core's clock),
    /// and the Unix time asked for.
    start_by: BTreeSet<(Instant, JobId)>,
    start_by_secs: HashMap<JobId, (Instant, f64)>,
}

/// A job's first opcode's text field `name`.
fn first_opcode_text<'a>(job: &'a Job, name: &str) -> Option<&'a str> {
    job.ops.first()?.input.get(name)?.as_str()
}

/// A job's `unique_key` (its first opcode's).
pub fn unique_key(job: &Job) -> Option<&str> {
    first_opcode_text(job, "unique_key")
}

/// A job's `start_by` (a Unix time).
fn start_by(job: &Job) -> Option<f64> {
    job.ops.first()?.input.get("start_by")?.as_f64()
}

impl Scheduling {
    pub(super) fn rules(&self) -> &[FilterRule] {
        &self.rules
    }

    /// Notes a new unfinished job: its unique key, and its `start_by`
    /// when it is `queued` (`clock`: the core's clock against the wall's),
    /// then [`Scheduling::classify`].
    pub(super) fn admit(&mut self, job: &Job, queued: bool, clock: &ClockOrigin) {
        if let Some(key) = unique_key(job) {
            self.unique.insert(key.to_owned(), job.id);
        }
        // A job queued again after its runner died (`on_death`) has
        // started: its `start_by` was met. Its first runner may have died
        // before writing a start time; the attempt luxid counted says it
        // ran.
        if queued
            && job.start_timestamp.is_none()
            && job.ops.iter().all(|op| op.attempts_logged() == 0)
            && let Some(secs) = start_by(job)
        {
            let deadline = clock.instant_of(secs);
            self.start_by.insert((deadline, job.id));
            self.start_by_secs.insert(job.id, (deadline, secs));
        }
        self.classify(job, queued);
    }

    /// The unfinished job with this unique key.
    pub(super) fn live_unique(&self, key: &str) -> Option<JobId> {
        self.unique.get(key).copied()
    }

    /// The job started: its `start_by` is met.
    pub(super) fn started(&mut self, id: JobId) {
        if let Some((deadline, _)) = self.start_by_secs.remove(&id) {
            self.start_by.remove(&(deadline, id));
        }
    }

    /// The Unix time a queued job must start by.
    pub(super) fn start_by_of(&self, id: JobId) -> Option<f64> {
        self.start_by_secs.get(&id).map(|(_, secs)| *secs)
    }

    /// Whether queued job `id`'s `start_by` deadline is `now` or past.
    pub(super) fn start_by_passed(&self, id: JobId, now: Instant) -> bool {
        self.start_by_secs
            .get(&id)
            .is_some_and(|(deadline, _)| *deadline <= now)
    }

    /// The earliest `start_by` deadline.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.start_by.first().map(|(deadline, _)| *deadline)
    }

    /// Takes the jobs whose `start_by` is due at `now` and that may be
    /// canceled (not `keep`); each with the Unix time it asked for.
    pub(super) fn take_expired(
        &mut self,
        now: Instant,
        keep: impl Fn(JobId) -> bool,
    ) -> Vec<(JobId, f64)> {
        let due: Vec<(Instant, JobId)> = self
            .start_by
            .iter()
            .take_while(|(deadline, _)| *deadline <= now)
            .filter(|(_, id)| !keep(*id))
            .copied()
            .collect();
        due.into_iter()
            .map(|(deadline, id)| {
                self.start_by.remove(&(deadline, id));
                let (_, secs) = self.start_by_secs.remove(&id).unwrap_or((deadline, 0.0));
                (id, secs)
            })
            .collect()
    }

    /// Works out what the rules and reasons make of `job`; `queued`:
    /// it has not started (only such a job is rejected).
    pub(super) fn classify(&mut self, job: &Job, queued: bool) {
        let buckets = buckets_of(reason_texts(job));
        if buckets.is_empty() {
            self.buckets.remove(&job.id);
        } else {
            self.buckets.insert(job.id, buckets);
        }
        self.classify_by_rules(job, queued);
    }

    fn classify_by_rules(&mut self, job: &Job, queued: bool) {
        self.rejected.remove(&job.id);
        match applying_index(&self.rules, job) {
            Some(index) => {
                self.applying.insert(job.id, index);
                if queued && self.rules[index].action == RuleAction::Reject {
                    self.rejected.insert(job.id);
                }
            }
            None => {
                self.applying.remove(&job.id);
            }
        }
    }

    /// The job is finished or gone.
    pub(super) fn forget(&mut self, job: &Job) {
        let id = job.id;
        self.applying.remove(&id);
        self.buckets.remove(&id);
        self.rejected.remove(&id);
        if let Some(key) = unique_key(job)
            && self.unique.get(key) == Some(&id)
        {
            self.unique.remove(key);
        }
        self.started(id);
    }

    /// New rules, in any order; every unfinished job is classified again
    /// (`started` tells which have runners).
    pub(super) fn set_rules<'a>(
        &mut self,
        mut rules: Vec<FilterRule>,
        jobs: impl Iterator<Item = (&'a Job, bool)>,
    ) {
        rules.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        self.rules = rules;
        self.applying.clear();
        self.rejected.clear();
        for (job, started) in jobs {
            self.classify_by_rules(job, !started);
        }
    }

    /// Takes the rejected jobs that may be canceled now (not `keep`).
    pub(super) fn take_rejected(&mut self, keep: impl Fn(JobId) -> bool) -> Vec<JobId> {
        let (kept, taken): (BTreeSet<JobId>, BTreeSet<JobId>) = std::mem::take(&mut self.rejected)
            .into_iter()
            .partition(|&id| keep(id));
        self.rejected = kept;
        taken.into_iter().collect()
    }

    /// The rule applying to a job, if any.
    pub(super) fn applying(&self, id: JobId) -> Option<(usize, &FilterRule)> {
        self.applying
            .get(&id)
            .map(|&index| (index, &self.rules[index]))
    }

    pub(super) fn buckets(&self, id: JobId) -> &[Bucket] {
        self.buckets.get(&id).map_or(&[], Vec::as_slice)
    }

    /// What the jobs in `running` hold: bucket places, and slots of
    /// `RATE_LIMIT` rules (by place in `rules`).
    pub(super) fn occupied(
        &self,
        running: impl Iterator<Item = JobId>,
    ) -> (Occupancy, HashMap<usize, u64>) {
        let mut buckets = Occupancy::default();
        let mut slots = HashMap::new();
        for id in running {
            buckets.occupy(self.buckets(id));
            if let Some((index, rule)) = self.applying(id)
                && let RuleAction::RateLimit(_) = rule.action
            {
                *slots.entry(index).or_default() += 1;
            }
        }
        (buckets, slots)
    }

    /// Panics unless what is kept of each job is what its job says.
    pub(super) fn check_invariants(&self, jobs: &BTreeMap<JobId, Job>) {
        for window in self.rules.windows(2) {
            assert!(
                window[0].order_key() < window[1].order_key(),
                "the rules are in order, each uuid once"
            );
        }
        for (id, job) in jobs {
            let buckets = buckets_of(reason_texts(job));
            assert_eq!(self.buckets(*id), buckets.as_slice(), "job {id}'s buckets");
            assert_eq!(
                self.applying.get(id).copied(),
                applying_index(&self.rules, job),
                "job {id}'s applying rule"
            );
        }
        for id in self.applying.keys().chain(self.buckets.keys()) {
            assert!(jobs.contains_key(id), "job {id} is classified yet gone");
        }
        for (key, id) in &self.unique {
            let job = jobs.get(id).expect("a unique key's job is unfinished");
            assert_eq!(unique_key(job), Some(key.as_str()), "job {id}'s unique key");
        }
        for job in jobs.values() {
            if let Some(key) = unique_key(job) {
                assert!(
                    self.unique.contains_key(key),
                    "job {}'s key {key} is known",
                    job.id
                );
            }
        }
        assert_eq!(
            self.start_by.len(),
            self.start_by_secs.len(),
            "the start_by indexes agree"
        );
        for (deadline, id) in &self.start_by {
            assert!(
                jobs.contains_key(id),
                "job {id} must start by a time, yet is gone"
            );
            assert_eq!(self.start_by_secs.get(id).map(|(at, _)| at), Some(deadline));
        }
        for id in &self.rejected {
            assert!(
                self.applying(*id)
                    .is_some_and(|(_, rule)| rule.action == RuleAction::Reject),
                "rejected job {id} has a REJECT applying"
            );
        }
    }
}

/// The wall clock against the core's: the shell reads both once when it
/// builds the core, and a Unix time becomes a deadline on the core's
/// clock from them (a later jump of the wall clock is not followed).
#[derive(Clone, Copy, Debug)]
pub struct ClockOrigin {
    pub wall: SystemTime,
    pub instant: Instant,
}

impl ClockOrigin {
    pub fn now() -> ClockOrigin {
        ClockOrigin {
            wall: SystemTime::now(),
            instant: Instant::now(),
        }
    }

    /// The instant of a Unix time (the origin's, if it is before it).
    pub fn instant_of(&self, unix_secs: f64) -> Instant {
        let wall_secs = self
            .wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        let ahead = unix_secs - wall_secs;
        if ahead <= 0.0 || !ahead.is_finite() {
            return self.instant;
        }
        self.instant
            + Duration::try_from_secs_f64(ahead).unwrap_or(Duration::from_secs(u32::MAX.into()))
    }

    /// The Unix time of an instant of the core's clock.
    pub fn unix_secs_of(&self, instant: Instant) -> f64 {
        let wall_secs = self
            .wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        if instant >= self.instant {
            wall_secs + (instant - self.instant).as_secs_f64()
        } else {
            wall_secs - (self.instant - instant).as_secs_f64()
        }
    }
}

/// The result of the opcodes of a job a `start_by` canceled.
fn not_started_by(unix_secs: f64) -> Value {
    Value::String(format!(
        "Job canceled: not started by {} (start_by {unix_secs})",
        crate::text::utc_time(unix_secs)
    ))
}

/// The result of the opcodes of a job a `REJECT` rule canceled.
fn rejected_by(uuid: &str) -> Value {
    Value::String(format!("Job canceled: rejected by filter rule {uuid}"))
}

impl QueueCore {
    /// The rules' part of a scheduling pass: queued jobs a `REJECT`
    /// applies to are canceled (new ones once committed).
    pub(super) fn cancel_rejected(&mut self, effects: &mut Vec<Effect>) {
        let new_jobs = &self.new_jobs;
        let runners = &self.runners;
        let rejected = self
            .scheduling
            .take_rejected(|id| new_jobs.contains(&id) || runners.contains_key(&id));
        for id in rejected {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let Some((_, rule)) = self.scheduling.applying(id) else {
                continue;
            };
            let mut job = job.clone();
            job.finish_unfinished(Status::Canceled, &rejected_by(&rule.uuid));
            self.ask(
                Pending::SchedulerCanceled { job: job.clone() },
                Action::WriteJob(job),
                effects,
            );
        }
    }

    /// Queued jobs whose `start_by` passed are canceled (new ones once
    /// committed).
    pub(super) fn cancel_expired(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        let new_jobs = &self.new_jobs;
        let runners = &self.runners;
        let expired = self.scheduling.take_expired(now, |id| {
            new_jobs.contains(&id) || runners.contains_key(&id)
        });
        for (id, secs) in expired {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let mut job = job.clone();
            job.finish_unfinished(Status::Canceled, &not_started_by(secs));
            self.ask(
                Pending::SchedulerCanceled { job: job.clone() },
                Action::WriteJob(job),
                effects,
            );
        }
    }

    /// The unfinished job whose unique key is `key`.
    pub fn live_unique(&self, key: &str) -> Option<JobId> {
        self.scheduling.live_unique(key)
    }

    /// The rules, in the order they apply.
    pub fn filter_rules(&self) -> &[FilterRule] {
        self.scheduling.rules()
    }

    /// Rules changed (a `ReplaceFilter` or `DeleteFilter` made durable):
    /// every job is classified again, and the end of the turn schedules.
    pub(super) fn rules_changed(&mut self, rules: Vec<FilterRule>) {
        let runners = &self.runners;
        let jobs = self
            .jobs
            .values()
            .map(|job| (job, runners.contains_key(&job.id)));
        self.scheduling.set_rules(rules, jobs);
    }
}
