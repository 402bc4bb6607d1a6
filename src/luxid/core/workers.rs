//! The jobs of [`QueueCore`] that hold workers (WORKERS.md): such a job
//! is asked for at wconfd once durable, waits `queued` (no runner, no
//! running slot) until wconfd gives it its workers, and tells wconfd when
//! it ends; a job wconfd says must end does, killed if it runs. A
//! worker's prepare job is an `OP_EXEC` job luxid submits itself; its end
//! is reported to wconfd too.

use super::*;

impl QueueCore {
    /// Files what the job's first opcode says of workers.
    pub(super) fn note_worker_parts(&mut self, job: &Job) {
        let Some(first) = job.ops.first() else {
            return;
        };
        let Ok(parsed) = opcode::parse(&first.input) else {
            return;
        };
        if let Some(request) = parsed.common.workers {
            self.worker_requests.insert(job.id, request);
        }
        if let Some(of) = parsed.common.prepare_worker {
            self.prepare_jobs.insert(of.clone(), job.id);
            self.prepare_of.insert(job.id, of);
        }
    }

    /// A job that is gone before it was durable.
    pub(super) fn forget_worker_parts(&mut self, id: JobId) {
        self.worker_requests.remove(&id);
        self.assigned.remove(&id);
        if let Some(of) = self.prepare_of.remove(&id) {
            self.prepare_jobs.remove(&of);
        }
    }

    /// Whether the job may start as far as workers go.
    pub(super) fn has_its_workers(&self, id: JobId) -> bool {
        !self.worker_requests.contains_key(&id)
            || (self.assigned.contains_key(&id) && !self.doomed.contains_key(&id))
    }

    /// An unfinished job became final: wconfd hears of it.
    pub(super) fn job_ended(&mut self, job: &Job) {
        let id = job.id;
        let status = job.status();
        if self.worker_requests.remove(&id).is_some() {
            self.assigned.remove(&id);
            self.doomed.remove(&id);
            self.ended.push(Effect::ReleaseWorkers { id, status });
        }
        if let Some(of) = self.prepare_of.get(&id) {
            self.ended.push(Effect::PrepareEnded {
                of: of.clone(),
                status,
                reason: failure_reason(job),
            });
        }
    }

    pub(super) fn workers_assigned(
        &mut self,
        id: JobId,
        workers: Vec<Value>,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        match self.jobs.get(&id) {
            Some(_) if self.worker_requests.contains_key(&id) => {
                self.assigned.insert(id, workers);
                if !self.runners.contains_key(&id) {
                    self.schedule(now, effects);
                }
            }
            // An unfinished job that asked for none cannot hold any; a
            // finished or unknown one's end did not reach wconfd.
            _ => effects.push(Effect::ReleaseWorkers {
                id,
                status: self.job(id).map_or(Status::Error, |job| job.status()),
            }),
        }
    }

    pub(super) fn end_job(&mut self, id: JobId, reason: String, effects: &mut Vec<Effect>) {
        let job = self
            .jobs
            .get(&id)
            .filter(|_| self.worker_requests.contains_key(&id));
        let Some(job) = job else {
            // Already over, or it never asked for workers (someone else
            // asked in its name): wconfd learns it again, nothing ends.
            effects.push(Effect::ReleaseWorkers {
                id,
                status: self.job(id).map_or(Status::Error, |job| job.status()),
            });
            return;
        };
        if self.doomed.contains_key(&id) {
            return;
        }
        let Some(started) = self.runners.get_mut(&id) else {
            let mut job = job.clone();
            job.finish_unfinished(Status::Error, &exec_error(reason));
            return self.ask(
                Pending::Ended { job: job.clone() },
                Action::WriteJob(job),
                effects,
            );
        };
        self.doomed.insert(id, reason);
        match &mut started.runner {
            Runner::Running { pid } => effects.push(Effect::KillGroup { id, pid: *pid }),
            Runner::Starting { deferred } | Runner::Claimant { deferred, .. } => {
                deferred.kill = true
            }
            Runner::Dying { .. } => {}
        }
    }

    /// The workers wconfd gave a job, as its programs see them.
    pub fn assigned_workers(&self, id: JobId) -> Option<&[Value]> {
        self.assigned.get(&id).map(Vec::as_slice)
    }

    /// The job running (or that ran) prepare `of`, while in the queue.
    pub fn prepare_job(&self, of: &opcode::PrepareOf) -> Option<JobId> {
        self.prepare_jobs.get(of).copied()
    }

    /// The unfinished prepare jobs.
    pub fn prepare_jobs(&self) -> impl Iterator<Item = (&opcode::PrepareOf, JobId)> {
        self.prepare_jobs
            .iter()
            .filter(|(_, id)| self.jobs.contains_key(id))
            .map(|(of, id)| (of, *id))
    }

    /// The queued jobs still waiting for their workers, with what they
    /// ask (asked again after wconfd restarted).
    pub fn waiting_for_workers(&self) -> Vec<(JobId, i64, crate::workers::Request)> {
        self.worker_requests
            .iter()
            .filter(|(id, _)| !self.assigned.contains_key(id) && !self.runners.contains_key(id))
            .filter_map(|(id, request)| {
                let job = self.jobs.get(id)?;
                Some((*id, job.priority(), request.clone()))
            })
            .collect()
    }
}

/// Why a job failed, for a prepare's `fail_reason`: its first failed
/// opcode's reason, else its status.
fn failure_reason(job: &Job) -> String {
    job.ops
        .iter()
        .find(|op| op.status == Status::Error)
        .map(|op| crate::jobs::failure_reason(&op.result))
        .unwrap_or_else(|| job.status().name().to_owned())
}
