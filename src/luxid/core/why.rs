//! Why a job is not running, or did not run (SCHEDULING.md "Why"), as far
//! as luxid's queue knows it: the typed reasons a scheduling pass has for
//! leaving a queued job, recursively through the jobs it depends on and
//! the jobs holding the workers it asks for. What a job waiting for locks
//! waits for, and which workers fit a request, are wconfd's to tell: the
//! shell asks it for each [`Reason::Locks`], and lists the workers of
//! each [`Reason::Workers`] request, giving the lists back to
//! [`QueueCore::why`].

use super::*;
use crate::scheduling::filters::Action as RuleAction;
use crate::scheduling::rate_limit::Occupancy;
use crate::workers::{Request, State};

/// How deep [`QueueCore::why`] follows dependencies and worker holders.
const DEPENDENCY_DEPTH_MAX: usize = 8;

/// A registered worker as wconfd listed it for a request.
#[derive(Clone, Debug, PartialEq)]
pub struct ListedWorker {
    pub uuid: String,
    pub state: State,
    pub holder: Option<JobId>,
}

/// wconfd's list of the registered workers fitting a request: the first
/// of them, and how many fit in all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listed {
    pub workers: Vec<ListedWorker>,
    pub total: usize,
}

/// A worker fitting a job's request, with its holder's status and why
/// the holder is not done (unless it runs, was said above or is too deep).
#[derive(Clone, Debug, PartialEq)]
pub struct FittingWorker {
    pub worker: ListedWorker,
    pub holder_status: Option<Status>,
    pub why: Option<Box<WhyJob>>,
}

/// Why a job is where it is.
#[derive(Clone, Debug, PartialEq)]
pub struct WhyJob {
    pub id: JobId,
    pub status: Status,
    /// Empty for a job that runs, or will start in the next pass.
    pub reasons: Vec<Reason>,
}

/// One reason of a [`WhyJob`].
#[derive(Clone, Debug, PartialEq)]
pub enum Reason {
    /// It depends on an unfinished job (and why that one is not done,
    /// unless it was said above or too deep).
    Dependency {
        job: JobId,
        status: Status,
        why: Option<Box<WhyJob>>,
    },
    /// Every slot of `max_running_jobs` is taken, by these jobs.
    Slots { max: usize, running: Vec<JobId> },
    /// A filter rule holds it: a `PAUSE` or `REJECT`, or a `RATE_LIMIT`
    /// whose slots these running jobs hold.
    Filter {
        rule: String,
        action: Value,
        running: Vec<JobId>,
    },
    /// An ad-hoc bucket is full, with these running jobs.
    RateLimit {
        bucket: String,
        limit: u64,
        running: Vec<JobId>,
    },
    /// It asked for workers and has not been given them yet; the workers
    /// fitting its request (`None`: wconfd has not listed them), of
    /// `total` (none fits: empty, 0).
    Workers {
        request: Request,
        fitting: Option<Vec<FittingWorker>>,
        total: usize,
    },
    /// It waits for its locks (its runner's request, at wconfd).
    Locks,
    /// Its runner is being started, or has not said it runs yet.
    Starting,
    /// It must start by this Unix time.
    StartBy { unix_secs: f64 },
    /// Its runner died and `retry.on_death` runs it again, not before
    /// this Unix time (D62).
    Backoff { unix_secs: f64 },
    /// The queue is drained: new jobs are refused (queued ones still run).
    Drained,
    /// It is finished: its status and the result that says why, if it did
    /// not succeed (a cancel, a `REJECT`, a `start_by`, an error).
    Finished { result: Option<Value> },
}

impl QueueCore {
    /// Why job `id` is not running (`None`: no such job in the queue),
    /// with `listed`, wconfd's lists of the workers fitting the requests
    /// asked about so far.
    pub fn why(&self, id: JobId, listed: &BTreeMap<Request, Listed>) -> Option<WhyJob> {
        self.why_of(id, 0, listed, &mut BTreeSet::from([id]))
    }

    fn why_of(
        &self,
        id: JobId,
        depth: usize,
        listed: &BTreeMap<Request, Listed>,
        said: &mut BTreeSet<JobId>,
    ) -> Option<WhyJob> {
        if let Some(done) = self.finished.get(&id) {
            let job = done.job();
            let result = job
                .ops
                .iter()
                .find(|op| op.status != Status::Success)
                .map(|op| op.result.clone());
            return Some(WhyJob {
                id,
                status: job.status(),
                reasons: vec![Reason::Finished { result }],
            });
        }
        let job = self.jobs.get(&id)?;
        let status = job.status();
        let mut reasons = Vec::new();
        if let Some(started) = self.runners.get(&id) {
            match started.runner {
                Runner::Starting { .. } | Runner::Claimant { .. } => reasons.push(Reason::Starting),
                _ if status == Status::Waiting => reasons.push(Reason::Locks),
                _ => {}
            }
            return Some(WhyJob {
                id,
                status,
                reasons,
            });
        }
        for &dep in self.depends.get(&id).into_iter().flatten() {
            let Some(dependency) = self.jobs.get(&dep) else {
                continue;
            };
            let why = if depth < DEPENDENCY_DEPTH_MAX && said.insert(dep) {
                self.why_of(dep, depth + 1, listed, said).map(Box::new)
            } else {
                None
            };
            reasons.push(Reason::Dependency {
                job: dep,
                status: dependency.status(),
                why,
            });
        }
        if let Some(request) = self.worker_requests.get(&id)
            && !self.assigned.contains_key(&id)
        {
            let list = listed.get(request);
            let fitting = list.map(|list| {
                list.workers
                    .iter()
                    .map(|worker| self.fitting(worker, depth, listed, said))
                    .collect()
            });
            reasons.push(Reason::Workers {
                request: request.clone(),
                fitting,
                total: list.map_or(0, |list| list.total),
            });
        }
        if let Some((index, rule)) = self.scheduling.applying(id) {
            let holders = || -> Vec<JobId> {
                self.runners
                    .keys()
                    .copied()
                    .filter(|running| {
                        self.scheduling
                            .applying(*running)
                            .is_some_and(|(other, _)| other == index)
                    })
                    .collect()
            };
            match rule.action {
                RuleAction::Pause | RuleAction::Reject => reasons.push(Reason::Filter {
                    rule: rule.uuid.clone(),
                    action: rule.action.to_json(),
                    running: Vec::new(),
                }),
                RuleAction::RateLimit(limit) => {
                    let running = holders();
                    if running.len() as u64 >= limit {
                        reasons.push(Reason::Filter {
                            rule: rule.uuid.clone(),
                            action: rule.action.to_json(),
                            running,
                        });
                    }
                }
                RuleAction::Accept | RuleAction::Continue => {}
            }
        }
        let buckets = self.scheduling.buckets(id);
        if !buckets.is_empty() {
            let occupancy =
                Occupancy::of_running(self.runners.keys().map(|id| self.scheduling.buckets(*id)));
            for bucket in buckets {
                if occupancy.running(bucket) >= bucket.limit {
                    reasons.push(Reason::RateLimit {
                        bucket: bucket.name.clone(),
                        limit: bucket.limit,
                        running: self
                            .runners
                            .keys()
                            .copied()
                            .filter(|running| self.scheduling.buckets(*running).contains(bucket))
                            .collect(),
                    });
                }
            }
        }
        if self.runners.len() >= self.config.max_running_jobs {
            reasons.push(Reason::Slots {
                max: self.config.max_running_jobs,
                running: self.runners.keys().copied().collect(),
            });
        }
        if let Some(&not_before) = self.backoff.get(&id) {
            reasons.push(Reason::Backoff {
                unix_secs: self.config.clock.unix_secs_of(not_before),
            });
        }
        if let Some(unix_secs) = self.scheduling.start_by_of(id) {
            reasons.push(Reason::StartBy { unix_secs });
        }
        if self.drained {
            reasons.push(Reason::Drained);
        }
        Some(WhyJob {
            id,
            status,
            reasons,
        })
    }

    /// A fitting worker, and why its holder is not done when it does not
    /// run: the chain goes on through the holder as through a dependency.
    fn fitting(
        &self,
        worker: &ListedWorker,
        depth: usize,
        listed: &BTreeMap<Request, Listed>,
        said: &mut BTreeSet<JobId>,
    ) -> FittingWorker {
        let holder_status = worker
            .holder
            .and_then(|holder| self.job(holder))
            .map(|job| job.status());
        let why = match (worker.holder, holder_status) {
            (Some(holder), Some(status))
                if status != Status::Running
                    && depth < DEPENDENCY_DEPTH_MAX
                    && said.insert(holder) =>
            {
                self.why_of(holder, depth + 1, listed, said).map(Box::new)
            }
            _ => None,
        };
        FittingWorker {
            worker: worker.clone(),
            holder_status,
            why,
        }
    }
}
