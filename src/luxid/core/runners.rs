//! The runners of [`QueueCore`], the end of a turn and the passing of
//! time.

use super::*;
use crate::jobs::{LOG_ATTEMPT, Timestamp};
use crate::scheduling::filters::Action as RuleAction;

impl QueueCore {
    // ----- runners -----

    pub(super) fn spawned(&mut self, id: JobId, pid: u32, effects: &mut Vec<Effect>) {
        if let Some(Started {
            runner: Runner::Starting { .. },
            ..
        }) = self.runners.get(&id)
        {
            self.now_running(id, pid, effects);
        }
    }

    pub(super) fn spawn_failed(&mut self, id: JobId, error: &str, effects: &mut Vec<Effect>) {
        if !matches!(
            self.runners.get(&id).map(|started| &started.runner),
            Some(Runner::Starting { .. })
        ) {
            return;
        }
        self.runners.remove(&id);
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let mut job = job.clone();
        job.finish_unfinished(
            Status::Error,
            &exec_error(format!("cannot start the job runner: {error}")),
        );
        self.ask(
            Pending::SpawnFailed { job: job.clone() },
            Action::WriteJob(job),
            effects,
        );
    }

    pub(super) fn committed(
        &mut self,
        result: Result<(), String>,
        spawned: Vec<(JobId, Result<u32, String>)>,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let new_jobs = std::mem::take(&mut self.new_jobs);
        if result.is_err() {
            // Nothing of these jobs may be revealed or run: their runners
            // get no word and leave the job alone.
            for id in new_jobs {
                self.unqueue(id);
                if let Some(job) = self.jobs.remove(&id) {
                    self.scheduling.forget(&job);
                }
                self.depends.remove(&id);
                self.forget_worker_parts(id);
                self.changed.insert(id);
            }
            self.check_watchers(effects);
            self.schedule(now, effects);
            return;
        }
        for &id in &new_jobs {
            if let Some(job) = self.jobs.get(&id) {
                self.events.observe(job);
            }
        }
        for &id in &new_jobs {
            if let (Some(request), Some(job)) = (self.worker_requests.get(&id), self.jobs.get(&id))
            {
                effects.push(Effect::RequestWorkers {
                    id,
                    priority: job.priority(),
                    request: request.clone(),
                });
            }
        }
        for (id, outcome) in spawned {
            // One that failed stays queued: started again below.
            if let Ok(pid) = outcome
                && self.unqueue(id)
            {
                self.scheduling.started(id);
                self.runners.insert(
                    id,
                    Started {
                        runner: Runner::Running { pid },
                        livelock: self.livelock_of(id),
                        cancel_asked: false,
                    },
                );
            }
        }
        self.schedule(now, effects);
    }

    pub(super) fn livelock_of(&self, id: JobId) -> PathBuf {
        match self.jobs.get(&id) {
            Some(job) => named_livelock(&self.config.livelock_dir, job),
            None => self.config.livelock_dir.join(job_livelock_name(id, 0)),
        }
    }

    pub(super) fn runner_exited(
        &mut self,
        id: JobId,
        cause: Option<&'static str>,
        livelock_held: bool,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(started) = self.runners.get(&id) else {
            return;
        };
        let Runner::Running { pid } = started.runner else {
            return;
        };
        let Some(job) = self.jobs.get(&id) else {
            self.runner_done(id, effects);
            return;
        };
        if job.process_id != Some(pid) && livelock_held {
            // Our runner found the job held by one a dead luxid started:
            // follow that one.
            let started = self.runners.get_mut(&id).expect("looked up above");
            started.runner = Runner::Claimant {
                next_probe: now,
                deferred: Deferred::default(),
            };
            return;
        }
        // The runner died: kill what is left of the job, then wait for its
        // livelock to be released before ending it and freeing its locks.
        let livelock = runner_livelock(&self.config.livelock_dir, job);
        effects.push(Effect::KillGroup { id, pid });
        effects.push(Effect::WatchLivelock {
            id,
            path: livelock.clone(),
        });
        let started = self.runners.get_mut(&id).expect("looked up above");
        started.runner = Runner::Dying {
            cause,
            livelock: livelock.clone(),
            next_probe: now + RELEASE_PROBE_INTERVAL,
            failed_writes: 0,
            ended: None,
        };
        effects.push(Effect::Probe { id, path: livelock });
    }

    pub(super) fn job_file_changed(&mut self, job: Job, now: Instant, effects: &mut Vec<Effect>) {
        let id = job.id;
        let Some(started) = self.runners.get(&id) else {
            // Only files of started jobs change behind luxid's back.
            return;
        };
        // A finished job's file never changes again.
        let changed = match self.jobs.get(&id) {
            Some(known) => *known != job,
            None => false,
        };
        if !changed {
            return;
        }
        let finished = job.is_final();
        let recorded = job.process_id;
        let claimant = matches!(started.runner, Runner::Claimant { .. });
        if finished
            && let Some(Started {
                runner: Runner::Dying { ended, .. },
                ..
            }) = self.runners.get_mut(&id)
        {
            // The runner finished the job just before it died: the job's
            // processes may still hold its livelock.
            *ended = Some(Box::new(job));
            return;
        }
        self.put(job);
        if finished && claimant {
            // Its pid is of no use any more: the claimant exits by itself.
            self.runner_done(id, effects);
        } else if claimant {
            match recorded {
                Some(pid) => {
                    self.now_running(id, pid, effects);
                    effects.push(Effect::WatchRunner { id, pid });
                }
                None => {
                    let path = self.livelock_of(id);
                    if let Some(Started {
                        runner: Runner::Claimant { next_probe, .. },
                        ..
                    }) = self.runners.get_mut(&id)
                    {
                        *next_probe = now + RELEASE_PROBE_INTERVAL;
                    }
                    effects.push(Effect::Probe { id, path });
                }
            }
        }
    }

    pub(super) fn probed(
        &mut self,
        id: JobId,
        released: bool,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(started) = self.runners.get_mut(&id) else {
            return;
        };
        match &mut started.runner {
            Runner::Claimant { next_probe, .. } => {
                if !released {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    return;
                }
                // It let go of the job without recording a pid: it never
                // started it. Queued, it is judged as a job never started
                // is: a `REJECT` that applies cancels it, its `start_by`
                // holds.
                self.runners.remove(&id);
                if let Some(job) = self.jobs.get(&id) {
                    self.queued.insert((job.priority(), id));
                    self.scheduling.admit(job, true, &self.config.clock);
                }
                if let Some(reason) = self.doomed.remove(&id) {
                    // Told to end while its claimant ran: it ends now.
                    self.end_job(id, reason, effects);
                }
            }
            Runner::Dying {
                next_probe,
                cause,
                ended,
                ..
            } => {
                if !released {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    return;
                }
                if let Some(job) = ended.take() {
                    if let Some(livelock) = &job.livelock {
                        effects.push(Effect::RemoveLivelock {
                            path: PathBuf::from(livelock),
                        });
                    }
                    self.put(*job);
                    self.runner_done(id, effects);
                    return;
                }
                // Probed again after the write, should it be refused.
                *next_probe = now + DEAD_JOB_WRITE_RETRY_INTERVAL;
                let cause = *cause;
                self.end_dead_job(id, cause, now, effects);
            }
            Runner::Starting { .. } | Runner::Running { .. } => {}
        }
    }

    /// Every process of a dead runner's job is gone: its livelock is
    /// removed, and its unfinished opcodes become `error` (once written),
    /// unless the death is retried (SCHEDULING.md "Retries", D62): then
    /// the job is queued again, its next runner started after the
    /// backoff.
    pub(super) fn end_dead_job(
        &mut self,
        id: JobId,
        cause: Option<&'static str>,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(job) = self.jobs.get(&id) else {
            self.runner_done(id, effects);
            return;
        };
        if let Some(livelock) = &job.livelock {
            effects.push(Effect::RemoveLivelock {
                path: PathBuf::from(livelock),
            });
        }
        let mut job = job.clone();
        let doomed = self.doomed.remove(&id);
        let cancel_asked = self
            .runners
            .get(&id)
            .is_some_and(|started| started.cancel_asked);
        let died = match cause {
            Some(cause) => format!("its runner {cause}"),
            None => "its runner died".to_owned(),
        };
        if doomed.is_none()
            && !cancel_asked
            && let Some(retry) = DeathRetry::of(&job)
        {
            let (index, number, attempts) = (retry.index, retry.number, retry.attempts);
            let serial = job.last_log_serial() + 1;
            job.ops[index].log.push(LogEntry(
                serial,
                Timestamp::now(),
                LOG_ATTEMPT.to_owned(),
                Value::String(format!("Attempt {number} of {attempts}: {died}")),
            ));
            if number < attempts {
                let owner = job.livelock.take().zip(job.process_id.take());
                for op in &mut job.ops {
                    if !op.status.is_final() {
                        op.status = Status::Queued;
                    }
                }
                let not_before = now + retry.backoff;
                let pending = Pending::DeadRetry {
                    job: job.clone(),
                    owner,
                    not_before,
                };
                return self.ask(pending, Action::WriteJob(job), effects);
            }
        }
        let message = match (doomed, cause) {
            (Some(reason), _) => reason,
            (None, Some(cause)) => format!("detected death of job {id}: its runner {cause}"),
            (None, None) => format!("detected death of job {id}"),
        };
        job.finish_unfinished(Status::Error, &exec_error(message));
        self.ask(
            Pending::DeadEnd { job: job.clone() },
            Action::WriteJob(job),
            effects,
        );
    }

    /// The dead runner's job is durable as queued again: its old runner's
    /// locks are freed, and it waits for its backoff, then for what any
    /// queued job waits for.
    pub(super) fn requeue_dead_job(
        &mut self,
        job: Job,
        owner: Option<(String, u32)>,
        not_before: Instant,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let id = job.id;
        if let Some((livelock, pid)) = owner {
            effects.push(Effect::FreeLocks { id, livelock, pid });
        }
        self.put(job);
        self.runner_done(id, effects);
        let job = &self.jobs[&id];
        self.queued.insert((job.priority(), id));
        // Queued again: a `REJECT` that applies now cancels it.
        self.scheduling.classify(job, true);
        self.backoff.insert(id, not_before);
        self.schedule(now, effects);
    }

    // ----- turns and time -----

    pub(super) fn end_turn(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        self.check_watchers(effects);
        if self.new_jobs.is_empty() {
            self.schedule(now, effects);
            return;
        }
        for id in &self.new_jobs {
            let job = &self.jobs[id];
            self.queued.insert((job.priority(), *id));
        }
        // The new jobs among those the scheduler would start now (the
        // others it starts after the commit still fit): their runners
        // start while the commit is synced (D40).
        let start = self
            .startable(now)
            .into_iter()
            .filter(|id| self.new_jobs.contains(id))
            .collect();
        effects.push(Effect::Commit {
            jobs: self.new_jobs.clone(),
            start,
        });
    }

    pub(super) fn tick(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        self.cancel_expired(now, effects);
        let backed_off = self.backoff.len();
        self.backoff.retain(|_, not_before| *not_before > now);
        if self.backoff.len() < backed_off {
            self.schedule(now, effects);
        }
        let due: Vec<JobId> = self
            .runners
            .iter()
            .filter(|(_, started)| match &started.runner {
                Runner::Claimant { next_probe, .. } | Runner::Dying { next_probe, .. } => {
                    *next_probe <= now
                }
                _ => false,
            })
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(started) = self.runners.get_mut(&id) else {
                continue;
            };
            let path = match &mut started.runner {
                Runner::Claimant { next_probe, .. } => {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    started.livelock.clone()
                }
                Runner::Dying {
                    next_probe,
                    livelock,
                    ..
                } => {
                    *next_probe = now + RELEASE_PROBE_INTERVAL;
                    livelock.clone()
                }
                _ => continue,
            };
            effects.push(Effect::Probe { id, path });
        }
        let expired: Vec<Conn> = self
            .watchers
            .iter()
            .filter(|(_, watcher)| watcher.deadline <= now)
            .map(|(&conn, _)| conn)
            .collect();
        for conn in expired {
            let watcher = self.watchers.remove(&conn).expect("just listed");
            let reply = match self.job(watcher.id) {
                Some(job) => Ok(Answer::Change {
                    values: job.field_values(&watcher.fields),
                    log: job
                        .log_after(watcher.log_serial)
                        .into_iter()
                        .cloned()
                        .collect(),
                }),
                None => Err(Refusal::JobLost(watcher.id)),
            };
            effects.push(Effect::Release { conn, reply });
        }
    }

    /// Answers the watchers of changed jobs whose view changed (or whose
    /// job is gone: `JobLost`).
    pub(super) fn check_watchers(&mut self, effects: &mut Vec<Effect>) {
        let changed = std::mem::take(&mut self.changed);
        if changed.is_empty() {
            return;
        }
        let mut due = Vec::new();
        for (&conn, watcher) in &self.watchers {
            if !changed.contains(&watcher.id) {
                continue;
            }
            let reply = match self.job(watcher.id) {
                Some(job) => {
                    let values = job.field_values(&watcher.fields);
                    let log: Vec<LogEntry> = job
                        .log_after(watcher.log_serial)
                        .into_iter()
                        .cloned()
                        .collect();
                    let same = digest_values(&self.digest_keys, &values) == watcher.seen_digest;
                    if same && log.is_empty() && !job.is_final() {
                        continue;
                    }
                    Ok(Answer::Change { values, log })
                }
                None => Err(Refusal::JobLost(watcher.id)),
            };
            due.push((conn, reply));
        }
        for (conn, reply) in due {
            self.watchers.remove(&conn);
            effects.push(Effect::Release { conn, reply });
        }
    }

    /// Starts queued jobs whose dependencies are final, in (priority, id)
    /// order, up to `max_running_jobs`.
    pub(super) fn schedule(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        self.cancel_rejected(effects);
        for id in self.startable(now) {
            self.unqueue(id);
            self.scheduling.started(id);
            let livelock = self.livelock_of(id);
            self.runners.insert(
                id,
                Started {
                    runner: Runner::Starting {
                        deferred: Deferred::default(),
                    },
                    livelock,
                    cancel_asked: false,
                },
            );
            effects.push(Effect::Spawn { id });
        }
    }

    /// The queued jobs [`QueueCore::schedule`] would start now, in order:
    /// dependencies final, workers given, no `PAUSE` or `REJECT` rule
    /// applying, a slot of its `RATE_LIMIT` rule free, and room in every
    /// ad-hoc rate-limit bucket it is in (SCHEDULING.md), counting the
    /// jobs running and those chosen before it.
    pub(super) fn startable(&self, now: Instant) -> Vec<JobId> {
        let mut room = self
            .config
            .max_running_jobs
            .saturating_sub(self.runners.len());
        if room == 0 {
            return Vec::new();
        }
        let (mut buckets, mut slots) = self.scheduling.occupied(self.runners.keys().copied());
        let mut startable = Vec::new();
        for &(_, id) in &self.queued {
            if room == 0 {
                break;
            }
            // Past its `start_by`: canceled at the next tick (one
            // submitted late is not yet durable, so not canceled yet).
            if !(self.dependencies_final(id) && self.has_its_workers(id))
                || self.backoff.contains_key(&id)
                || self.scheduling.start_by_passed(id, now)
            {
                continue;
            }
            let rate_limited = match self.scheduling.applying(id) {
                None => None,
                Some((index, rule)) => match rule.action {
                    RuleAction::Pause | RuleAction::Reject => continue,
                    RuleAction::RateLimit(limit) => {
                        if slots.get(&index).copied().unwrap_or(0) >= limit {
                            continue;
                        }
                        Some(index)
                    }
                    RuleAction::Accept | RuleAction::Continue => None,
                },
            };
            let wanted = self.scheduling.buckets(id);
            if !buckets.has_room(wanted) {
                continue;
            }
            buckets.occupy(wanted);
            if let Some(index) = rate_limited {
                *slots.entry(index).or_default() += 1;
            }
            startable.push(id);
            room -= 1;
        }
        startable
    }

    /// Whether every job the job depends on is final (archived and unknown
    /// ones count as final: the runner judges them).
    pub(super) fn dependencies_final(&self, id: JobId) -> bool {
        self.depends
            .get(&id)
            .is_some_and(|deps| deps.iter().all(|dep| !self.jobs.contains_key(dep)))
    }
}

/// A dead runner's job whose death its current opcode retries: an
/// `OP_EXEC` with `retry.on_death` (SCHEDULING.md "Retries", D62). The
/// death counts as attempt `number` of `attempts`; the job runs again
/// only if attempts remain.
struct DeathRetry {
    /// The opcode the runner was at: the job's first unfinished one.
    index: usize,
    number: u64,
    attempts: u64,
    backoff: Duration,
}

impl DeathRetry {
    fn of(job: &Job) -> Option<DeathRetry> {
        if job.status() == Status::Canceling {
            return None;
        }
        let index = job.ops.iter().position(|op| !op.status.is_final())?;
        let op = &job.ops[index];
        let parsed = opcode::parse(&op.input).ok()?;
        let opcode::OpKind::Exec(exec) = parsed.kind else {
            return None;
        };
        let retry = exec.retry.filter(|retry| retry.on_death)?;
        let attempts = retry.max + 1;
        // A runner that logged its last attempt and died before writing
        // the opcode's end made every attempt: the death is none of them.
        let made = op.attempts_logged();
        if made >= attempts {
            return None;
        }
        Some(DeathRetry {
            index,
            number: made + 1,
            attempts,
            backoff: Duration::try_from_secs_f64(retry.backoff).unwrap_or(Duration::ZERO),
        })
    }
}
