//! What [`QueueCore`] knows of each job for scheduling (SCHEDULING.md):
//! the job filter rules, each unfinished job's applying rule and ad-hoc
//! rate-limit buckets, worked out once per job (and again for every job
//! when the rules change), so that a scheduling pass only looks them up.
//!
//! A job's applying rule depends on its id and its opcodes as submitted,
//! which never change, and on the rules; its buckets on its opcodes'
//! reasons alone.

use std::collections::HashMap;

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
}

impl Scheduling {
    pub(super) fn rules(&self) -> &[FilterRule] {
        &self.rules
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
    pub(super) fn forget(&mut self, id: JobId) {
        self.applying.remove(&id);
        self.buckets.remove(&id);
        self.rejected.remove(&id);
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
        for id in &self.rejected {
            assert!(
                self.applying(*id)
                    .is_some_and(|(_, rule)| rule.action == RuleAction::Reject),
                "rejected job {id} has a REJECT applying"
            );
        }
    }
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
                Pending::Rejected { job: job.clone() },
                Action::WriteJob(job),
                effects,
            );
        }
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
