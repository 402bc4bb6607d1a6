//! The requests of [`QueueCore`] and the actions they wait for.

use super::*;
use crate::limits::FILTER_RULES_MAX;
use crate::scheduling::filters::FilterRule;

impl QueueCore {
    // ----- requests -----

    pub(super) fn ticket(&mut self, pending: Pending) -> Ticket {
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.pending.insert(ticket, pending);
        ticket
    }

    pub(super) fn ask(&mut self, pending: Pending, action: Action, effects: &mut Vec<Effect>) {
        let ticket = self.ticket(pending);
        effects.push(Effect::Do { ticket, action });
    }

    pub(super) fn request(
        &mut self,
        conn: Conn,
        command: Command,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let reply = |reply: Reply, effects: &mut Vec<Effect>| {
            effects.push(Effect::Reply { conn, reply });
        };
        match command {
            Command::Submit {
                jobs,
                ignore_drain,
                many,
            } => reply(self.submit(jobs, ignore_drain, many), effects),
            Command::Cancel { id, kill } => self.cancel(conn, id, kill, effects),
            Command::ChangePriority { id, priority } => {
                self.change_priority(conn, id, priority, effects)
            }
            Command::Archive { id } => {
                if self.finished.contains_key(&id) {
                    self.ask(Pending::Archive { conn, id }, Action::Archive(id), effects);
                } else {
                    reply(Ok(Answer::Archived(false)), effects);
                }
            }
            Command::AutoArchive {
                age,
                timeout,
                now_secs,
            } => {
                let mut rest: Vec<JobId> = self
                    .finished
                    .values()
                    .filter(|job| match age {
                        None => true,
                        Some(age) => job
                            .end_timestamp
                            .is_some_and(|end| now_secs - end.as_secs_f64() >= age.as_secs_f64()),
                    })
                    .map(|job| job.id)
                    .collect();
                rest.reverse();
                let progress = AutoArchiving {
                    total: rest.len(),
                    rest,
                    checked: 0,
                    archived: 0,
                    started: now,
                    timeout,
                };
                self.auto_archive(conn, progress, now, effects);
            }
            Command::SetDrain { drained } => {
                self.ask(
                    Pending::Drain { conn, drained },
                    Action::SetDrain(drained),
                    effects,
                );
            }
            Command::WaitForChange {
                id,
                fields,
                previous,
                log_serial,
                timeout,
            } => {
                let Some(job) = self.job(id) else {
                    return reply(Err(Refusal::JobLost(id)), effects);
                };
                let values = job.field_values(&fields);
                let log: Vec<LogEntry> = job.log_after(log_serial).into_iter().cloned().collect();
                if values != previous || !log.is_empty() || job.is_final() {
                    return reply(Ok(Answer::Change { values, log }), effects);
                }
                let deadline = now + timeout;
                let seen_digest = digest_values(&self.digest_keys, &values);
                self.watchers.insert(
                    conn,
                    Watcher {
                        id,
                        fields,
                        seen_digest,
                        log_serial,
                        deadline,
                    },
                );
                effects.push(Effect::Hold { conn, deadline });
            }
            Command::ReplaceFilter {
                uuid,
                new_uuid,
                rule,
                reason_trail,
            } => {
                let uuid = uuid.unwrap_or(new_uuid);
                let mut rules: Vec<FilterRule> = self
                    .filter_rules()
                    .iter()
                    .filter(|known| known.uuid != uuid)
                    .cloned()
                    .collect();
                if rules.len() >= FILTER_RULES_MAX {
                    return reply(
                        Err(Refusal::Prereq(format!(
                            "there are {} filter rules, the most luxid keeps (delete some first)",
                            rules.len()
                        ))),
                        effects,
                    );
                }
                let watermark = self.serial;
                rules.push(FilterRule::new(
                    uuid.clone(),
                    watermark,
                    rule,
                    Value::Array(reason_trail),
                ));
                let action = Action::WriteFilters(rules.clone());
                let pending = Pending::Filters {
                    conn,
                    rules,
                    answer: Answer::FilterReplaced(uuid),
                };
                self.ask(pending, action, effects);
            }
            Command::DeleteFilter { uuid } => {
                if !self.filter_rules().iter().any(|known| known.uuid == uuid) {
                    return reply(
                        Err(Refusal::Failed(format!(
                            "Filter rule with UUID {uuid} does not exist"
                        ))),
                        effects,
                    );
                }
                let rules: Vec<FilterRule> = self
                    .filter_rules()
                    .iter()
                    .filter(|known| known.uuid != uuid)
                    .cloned()
                    .collect();
                let action = Action::WriteFilters(rules.clone());
                let pending = Pending::Filters {
                    conn,
                    rules,
                    answer: Answer::FilterDeleted,
                };
                self.ask(pending, action, effects);
            }
        }
    }

    pub(super) fn submit(
        &mut self,
        jobs: Vec<Submission>,
        ignore_drain: bool,
        many: bool,
    ) -> Reply {
        if !ignore_drain && self.drained {
            return Err(Refusal::Drained);
        }
        if many && jobs.len() > SUBMIT_MANY_JOBS_MAX {
            return Err(Refusal::TooManyJobs(jobs.len()));
        }
        let max = self.config.queue_jobs_max;
        if self.job_count() + jobs.len() > max {
            return Err(Refusal::QueueFull {
                jobs: self.job_count(),
                max,
            });
        }
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            match job {
                Submission::New(job) => {
                    assert_eq!(job.id, self.serial + 1, "a new job has the next id");
                    assert!(!job.is_final(), "a new job is unfinished");
                    self.serial = job.id;
                    results.push(Ok(job.id));
                    self.depends.insert(job.id, dependencies(&job));
                    self.note_worker_parts(&job);
                    self.scheduling.admit(&job, true, &self.config.clock);
                    self.new_jobs.push(job.id);
                    self.jobs.insert(job.id, job);
                }
                Submission::Live(id) => results.push(Ok(id)),
                Submission::Refused(message) => results.push(Err(message)),
            }
        }
        if many {
            return Ok(Answer::SubmittedMany(results));
        }
        match results.pop() {
            Some(Ok(id)) => Ok(Answer::Submitted(id)),
            Some(Err(message)) => Err(Refusal::Prereq(message)),
            None => Err(Refusal::Prereq(
                "a job needs at least one opcode".to_owned(),
            )),
        }
    }

    pub(super) fn cancel(&mut self, conn: Conn, id: JobId, kill: bool, effects: &mut Vec<Effect>) {
        let reply = |reply: Reply, effects: &mut Vec<Effect>| {
            effects.push(Effect::Reply { conn, reply });
        };
        let outcome = |done: bool, message: String| Ok(Answer::Outcome(done, message));
        if self.finished.contains_key(&id) {
            return reply(
                outcome(false, format!("Job {id} has already finished")),
                effects,
            );
        }
        let Some(job) = self.jobs.get(&id) else {
            return reply(
                outcome(false, format!("Job {id} not found in queue")),
                effects,
            );
        };
        let waiting = matches!(job.status(), Status::Waiting | Status::Queued);
        let Some(started) = self.runners.get_mut(&id) else {
            // Not started: luxid owns the file.
            let mut job = job.clone();
            job.finish_unfinished(Status::Canceled, &canceled_by_request());
            let action = Action::WriteJob(job.clone());
            return self.ask(Pending::Dequeue { conn, job }, action, effects);
        };
        if !matches!(started.runner, Runner::Dying { .. }) {
            started.cancel_asked = true;
        }
        let deferred = match &mut started.runner {
            Runner::Dying { .. } => {
                return reply(
                    outcome(
                        false,
                        format!("Job {id} is being cleaned up after its death"),
                    ),
                    effects,
                );
            }
            Runner::Running { pid } => {
                let pid = *pid;
                if kill {
                    return self.ask(
                        Pending::Kill { conn, id },
                        Action::KillGroup { id, pid },
                        effects,
                    );
                }
                effects.push(Effect::Signal {
                    id,
                    pid,
                    signal: RunnerSignal::Cancel,
                });
                // The copy in memory lags the runner's writes (inotify):
                // the answer comes from the file as it is once the signal
                // is sent. The runner checks for a SIGTERM once more after
                // writing `running`, so a file without a running opcode
                // means the signal stops it.
                let ticket = self.ticket(Pending::CancelAnswer { conn, id });
                effects.push(Effect::ReadJobStatus { ticket, id });
                return;
            }
            Runner::Starting { deferred } | Runner::Claimant { deferred, .. } => Some(deferred),
        };
        if let Some(deferred) = deferred {
            // Its pid is not known yet: signalled once it is.
            if kill {
                deferred.kill = true;
            } else {
                deferred.cancel = true;
            }
        }
        if kill {
            reply(outcome(true, format!("Job {id} will be killed")), effects);
        } else if waiting {
            reply(outcome(true, format!("Job {id} will be canceled")), effects);
        } else {
            reply(
                outcome(
                    false,
                    "Job no longer waiting, can't cancel (informed it anyway)".to_owned(),
                ),
                effects,
            );
        }
    }

    pub(super) fn change_priority(
        &mut self,
        conn: Conn,
        id: JobId,
        priority: i64,
        effects: &mut Vec<Effect>,
    ) {
        let reply = |reply: Reply, effects: &mut Vec<Effect>| {
            effects.push(Effect::Reply { conn, reply });
        };
        if self.finished.contains_key(&id) {
            return reply(
                Ok(Answer::Outcome(false, format!("Job {id} is finished"))),
                effects,
            );
        }
        let Some(job) = self.jobs.get(&id) else {
            return reply(
                Ok(Answer::Outcome(false, format!("Job {id} not found"))),
                effects,
            );
        };
        match self.runners.get(&id).map(|started| &started.runner) {
            Some(Runner::Dying { .. }) => reply(
                Ok(Answer::Outcome(
                    false,
                    format!("Job {id} is being cleaned up after its death"),
                )),
                effects,
            ),
            // The runner owns the job file: it applies the request to its
            // unfinished opcodes (and files a waiting lock request again).
            Some(_) => self.ask(
                Pending::PriorityRequest { conn, id, priority },
                Action::WritePriorityRequest { id, priority },
                effects,
            ),
            None => {
                let mut job = job.clone();
                for op in job.ops.iter_mut().filter(|op| !op.status.is_final()) {
                    op.priority = priority;
                }
                let action = Action::WriteJob(job.clone());
                self.ask(
                    Pending::Reprioritize {
                        conn,
                        job,
                        priority,
                    },
                    action,
                    effects,
                );
            }
        }
    }

    pub(super) fn auto_archive(
        &mut self,
        conn: Conn,
        mut progress: AutoArchiving,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let out_of_time = progress
            .timeout
            .is_some_and(|timeout| now.saturating_duration_since(progress.started) > timeout);
        match progress.rest.pop() {
            Some(id) if !out_of_time => {
                progress.checked += 1;
                self.ask(
                    Pending::AutoArchive { conn, id, progress },
                    Action::Archive(id),
                    effects,
                );
            }
            _ => effects.push(Effect::Reply {
                conn,
                reply: Ok(Answer::AutoArchived {
                    archived: progress.archived,
                    left: progress.total - progress.checked,
                }),
            }),
        }
    }

    // ----- actions done -----

    /// The answer to a cancel signalled to a running runner: whether its
    /// file, read after the signal, still shows the job waiting.
    pub(super) fn status_read(
        &mut self,
        ticket: Ticket,
        status: Option<Status>,
        effects: &mut Vec<Effect>,
    ) {
        let Some(Pending::CancelAnswer { conn, id }) = self.pending.remove(&ticket) else {
            return;
        };
        let reply = if matches!(status, Some(Status::Waiting | Status::Queued)) {
            Answer::Outcome(true, format!("Job {id} will be canceled"))
        } else {
            Answer::Outcome(
                false,
                "Job no longer waiting, can't cancel (informed it anyway)".to_owned(),
            )
        };
        effects.push(Effect::Reply {
            conn,
            reply: Ok(reply),
        });
    }

    pub(super) fn done(
        &mut self,
        ticket: Ticket,
        result: Result<(), String>,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(pending) = self.pending.remove(&ticket) else {
            return;
        };
        let ok = result.is_ok();
        let failed = |what: String| Err(Refusal::Failed(what));
        match pending {
            Pending::Dequeue { conn, job } => {
                let id = job.id;
                let reply = match result {
                    Err(error) => failed(format!("cannot write job {id}: {error}")),
                    Ok(()) => {
                        self.unqueue(id);
                        self.put(job);
                        Ok(Answer::Outcome(true, format!("Dequeued job {id}")))
                    }
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::Reprioritize {
                conn,
                job,
                priority,
            } => {
                let id = job.id;
                let reply = match result {
                    Err(error) => failed(format!("cannot write job {id}: {error}")),
                    Ok(()) => {
                        if self.unqueue(id) {
                            self.queued.insert((job.priority(), id));
                        }
                        if let Some(request) = self.worker_requests.get(&id)
                            && !self.assigned.contains_key(&id)
                        {
                            // Its place among the jobs waiting for workers.
                            effects.push(Effect::RequestWorkers {
                                id,
                                priority: job.priority(),
                                request: request.clone(),
                            });
                        }
                        self.put(job);
                        Ok(Answer::Outcome(
                            true,
                            format!(
                                "Priorities of pending opcodes for job {id} have been changed to {priority}"
                            ),
                        ))
                    }
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::Kill { conn, id } => {
                let reply = match result {
                    Ok(()) => Ok(Answer::Outcome(true, format!("Job {id} will be killed"))),
                    Err(error) => failed(format!("cannot kill job {id}: {error}")),
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::PriorityRequest { conn, id, priority } => {
                let reply = match result {
                    Ok(()) => {
                        self.signal(id, RunnerSignal::Priority, effects);
                        if !self.runners.contains_key(&id) {
                            // The runner was done before the request file
                            // was written: nobody will read or remove it.
                            effects.push(Effect::RemovePriorityRequest { id });
                        }
                        Ok(Answer::Outcome(
                            true,
                            format!(
                                "Priorities of pending opcodes for job {id} have been changed to {priority}"
                            ),
                        ))
                    }
                    Err(error) => failed(format!(
                        "cannot pass the new priority to job {id}'s runner: {error}"
                    )),
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::Archive { conn, id } => {
                if ok {
                    self.archived(id);
                }
                effects.push(Effect::Reply {
                    conn,
                    reply: Ok(Answer::Archived(ok)),
                });
            }
            Pending::AutoArchive {
                conn,
                id,
                mut progress,
            } => {
                if ok {
                    self.archived(id);
                    progress.archived += 1;
                }
                self.auto_archive(conn, progress, now, effects);
            }
            // Answered by `status_read`.
            Pending::CancelAnswer { .. } => {}
            Pending::Drain { conn, drained } => {
                let reply = match result {
                    Ok(()) => {
                        self.drained = drained;
                        self.events.drain(drained);
                        Ok(Answer::DrainSet)
                    }
                    Err(error) => failed(format!("cannot set the drain flag: {error}")),
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::SpawnFailed { job } => {
                // Not written: the job stays as it was, with no runner,
                // until luxid restarts.
                if ok {
                    self.put(job);
                }
            }
            Pending::Ended { job } | Pending::SchedulerCanceled { job } => {
                // A rejected job whose write failed stays queued, never
                // started, until the rules change or luxid starts again; an
                // expired one may start late (D61).
                if ok {
                    self.unqueue(job.id);
                    self.put(job);
                }
            }
            Pending::Filters {
                conn,
                rules,
                answer,
            } => {
                let reply = match result {
                    Ok(()) => {
                        self.rules_changed(rules);
                        Ok(answer)
                    }
                    Err(error) => failed(format!("cannot write the filter rules: {error}")),
                };
                effects.push(Effect::Reply { conn, reply });
            }
            Pending::DeadRetry {
                job,
                owner,
                not_before,
            } => {
                if ok {
                    self.requeue_dead_job(job, owner, not_before, now, effects);
                } else if let Some(Started {
                    runner:
                        Runner::Dying {
                            next_probe,
                            failed_writes,
                            ..
                        },
                    ..
                }) = self.runners.get_mut(&job.id)
                {
                    // Tried again at the next probe, as a dead end is.
                    *failed_writes += 1;
                    *next_probe = now + DEAD_JOB_WRITE_RETRY_INTERVAL;
                }
            }
            Pending::DeadEnd { job } => {
                let id = job.id;
                if ok {
                    if let (Some(livelock), Some(pid)) = (&job.livelock, job.process_id) {
                        effects.push(Effect::FreeLocks {
                            id,
                            livelock: livelock.clone(),
                            pid,
                        });
                    }
                    self.put(job);
                    self.runner_done(id, effects);
                } else if let Some(Started {
                    runner:
                        Runner::Dying {
                            next_probe,
                            failed_writes,
                            ..
                        },
                    ..
                }) = self.runners.get_mut(&id)
                {
                    *failed_writes += 1;
                    *next_probe = now + DEAD_JOB_WRITE_RETRY_INTERVAL;
                }
            }
        }
    }
}
