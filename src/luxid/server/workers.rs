//! The worker registry's side of luxid's shell (WORKERS.md): the calls
//! the core asks for go to wconfd through the link; wconfd's notices,
//! read with a held `watchWorkers` on a link of its own, become the
//! core's inputs and prepare jobs. After wconfd's restart (or luxid's),
//! the first answer lists everything still to do, and luxid asks again
//! for every job it has waiting: each call is idempotent.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};

use super::Shell;
use crate::client::ClientError;
use crate::connection::Reply;
use crate::jobs::opcode::{OP_EXEC, PrepareOf};
use crate::jobs::{JobId, Status};
use crate::limits::{WCONFD_ANSWER_DEADLINE, WORKER_WATCH_TIMEOUT, WORKERS_CHECK_DEADLINE};
use crate::luxid::core::{Command, Conn, Effect, Input, Submission};
use crate::paths::WORKERS_ENV;
use crate::protocol::luxi::LuxiRequest;
use crate::protocol::wconfd::WconfdRequest;
use crate::protocol::workers::worker_env_of;
use crate::protocol::workers::{NoticeBatch, WorkerNotice, decode_batch, decode_request};
use crate::workers::Request as WorkerRequest;

/// What a call to wconfd was made for.
#[derive(Debug)]
pub enum WconfdCall {
    FreeLocks {
        id: JobId,
    },
    /// Whether job `index` of held submission `submission` could ever
    /// have its workers.
    CheckWorkers {
        submission: u64,
        index: usize,
    },
    RequestWorkers {
        id: JobId,
    },
    ReleaseWorkers {
        id: JobId,
    },
    WorkerPrepared {
        of: PrepareOf,
    },
    /// wconfd's explanation of job `job`'s lock wait, for held `WhyJob`
    /// `why`.
    ExplainWait {
        why: u64,
        job: JobId,
    },
    /// The workers fitting `request`, for held `WhyJob` `why`.
    ListFitting {
        why: u64,
        request: WorkerRequest,
    },
}

/// A submission held while wconfd checks its workers requests.
pub struct HeldSubmission {
    conn: Conn,
    request: LuxiRequest,
    unanswered: usize,
    refused: BTreeMap<usize, String>,
}

/// wconfd's text of a refusal.
fn failure_text(error: &ClientError) -> String {
    match error {
        ClientError::Failed { args, .. } => args
            .first()
            .and_then(Value::as_str)
            .unwrap_or("refused")
            .to_owned(),
        other => other.to_string(),
    }
}

impl std::fmt::Display for WconfdCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WconfdCall::FreeLocks { id } => write!(f, "freeing the locks of dead job {id}"),
            WconfdCall::CheckWorkers { submission, index } => {
                write!(f, "checking job {index} of submission {submission}")
            }
            WconfdCall::RequestWorkers { id } => write!(f, "asking for job {id}'s workers"),
            WconfdCall::ReleaseWorkers { id } => write!(f, "releasing job {id}'s workers"),
            WconfdCall::WorkerPrepared { of } => {
                write!(f, "reporting prepare {} of worker {}", of.seq, of.uuid)
            }
            WconfdCall::ExplainWait { job, .. } => {
                write!(f, "asking why job {job} waits for its locks")
            }
            WconfdCall::ListFitting { request, .. } => write!(
                f,
                "listing the workers fitting {}",
                crate::protocol::workers::encode_request(request)
            ),
        }
    }
}

impl Shell {
    /// Makes the call a core effect asks for.
    pub(super) fn worker_call(&mut self, effect: Effect) {
        let now = Instant::now();
        let (request, purpose) = match effect {
            Effect::RequestWorkers {
                id,
                priority,
                request,
            } => (
                WconfdRequest::RequestWorkers {
                    job: id,
                    priority,
                    request,
                },
                WconfdCall::RequestWorkers { id },
            ),
            Effect::ReleaseWorkers { id, status } => (
                WconfdRequest::ReleaseWorkers {
                    job: id,
                    status: status.name().to_owned(),
                },
                WconfdCall::ReleaseWorkers { id },
            ),
            Effect::PrepareEnded { of, status, reason } => (
                WconfdRequest::WorkerPrepared {
                    uuid: of.uuid.clone(),
                    seq: of.seq,
                    status: status.name().to_owned(),
                    reason,
                },
                WconfdCall::WorkerPrepared { of },
            ),
            _ => return,
        };
        self.wconfd.call(request, purpose, now);
    }

    /// A submission with a job asking for workers is held until wconfd
    /// says whether some registered worker could ever serve each such job
    /// (refused at submit, nothing written, if not); `None`: not such a
    /// submission.
    pub(super) fn check_workers_first(
        &mut self,
        conn: Conn,
        request: &LuxiRequest,
    ) -> Option<Reply> {
        let submissions: Vec<&Value> = match request {
            LuxiRequest::SubmitJob { ops } | LuxiRequest::SubmitJobToDrainedQueue { ops } => {
                vec![ops]
            }
            LuxiRequest::SubmitManyJobs { jobs }
                if jobs.len() <= crate::limits::SUBMIT_MANY_JOBS_MAX =>
            {
                jobs.iter().collect()
            }
            _ => return None,
        };
        let asked: Vec<(usize, WorkerRequest)> = submissions
            .iter()
            .enumerate()
            .filter_map(|(index, ops)| {
                let wanted = ops.get(0)?.get("workers")?;
                // A malformed one is refused when the job is built.
                Some((index, decode_request(wanted).ok()?))
            })
            .collect();
        if asked.is_empty() {
            return None;
        }
        let submission = self.next_submission;
        self.next_submission += 1;
        let now = Instant::now();
        for (index, request) in &asked {
            self.wconfd.call(
                WconfdRequest::CheckWorkers {
                    request: request.clone(),
                },
                WconfdCall::CheckWorkers {
                    submission,
                    index: *index,
                },
                now,
            );
        }
        self.held_submissions.insert(
            submission,
            HeldSubmission {
                conn,
                request: request.clone(),
                unanswered: asked.len(),
                refused: BTreeMap::new(),
            },
        );
        self.submission_of.insert(conn, submission);
        Some(Reply::Held(now + WORKERS_CHECK_DEADLINE))
    }

    /// A held submission's deadline passed (wconfd did not answer): it
    /// is refused; whether it was one.
    pub(super) fn expire_submission(&mut self, conn: Conn) -> bool {
        let Some(submission) = self.submission_of.remove(&conn) else {
            return false;
        };
        self.held_submissions.remove(&submission);
        self.releases.push((
            mio::Token(conn.0),
            Err(crate::protocol::WireError::generic(
                "wconfd did not answer in time: the jobs' workers requests cannot be checked",
            )),
        ));
        true
    }

    fn checked(&mut self, submission: u64, index: usize, refusal: Option<String>) {
        let Some(held) = self.held_submissions.get_mut(&submission) else {
            return; // expired
        };
        if let Some(message) = refusal {
            held.refused
                .insert(index, format!("opcode 0: workers: {message}"));
        }
        held.unanswered -= 1;
        if held.unanswered > 0 {
            return;
        }
        let held = self
            .held_submissions
            .remove(&submission)
            .expect("looked up above");
        self.submission_of.remove(&held.conn);
        let reply = match self.command(held.conn, held.request, &held.refused) {
            crate::connection::Reply::Now(reply) => reply,
            crate::connection::Reply::Held(_) | crate::connection::Reply::Encoded(_) => {
                Err(crate::protocol::WireError::generic(
                    "a submission was answered as no submission is",
                ))
            }
        };
        self.releases.push((mio::Token(held.conn.0), reply));
    }

    /// The call link's socket is ready.
    pub(super) fn wconfd_event(&mut self) {
        for (purpose, answer) in self.wconfd.event(Instant::now()) {
            match (purpose, answer) {
                (WconfdCall::CheckWorkers { submission, index }, answer) => {
                    let refusal = answer.err().map(|error| failure_text(&error));
                    self.checked(submission, index, refusal);
                }
                (WconfdCall::ExplainWait { why, job }, answer) => {
                    let chain = answer
                        .unwrap_or_else(|error| serde_json::json!({"error": failure_text(&error)}));
                    self.explained(why, job, chain);
                }
                (WconfdCall::ListFitting { why, request }, answer) => {
                    let listed = answer
                        .map_err(|error| failure_text(&error))
                        .and_then(|answer| super::why::decode_listed(&answer));
                    self.listed(why, request, listed);
                }
                (WconfdCall::FreeLocks { id }, Ok(_)) => {
                    tracing::debug!(job = id, "wconfd freed a dead job's locks");
                }
                (_, Ok(_)) => {}
                (WconfdCall::RequestWorkers { id }, Err(error)) => {
                    // Nothing registered fits any more: the job ends.
                    self.run(Input::EndJob {
                        id,
                        reason: format!("workers: {}", failure_text(&error)),
                    });
                }
                (purpose, Err(error)) => {
                    tracing::warn!(%purpose, %error, "wconfd refused a call");
                }
            }
        }
    }

    /// Asks for the notices after the cursor (held by wconfd until there
    /// are some).
    pub(super) fn watch_workers(&mut self) {
        let request = WconfdRequest::WatchWorkers {
            cursor: self.notice_cursor,
            timeout_ms: WORKER_WATCH_TIMEOUT.as_millis() as u64,
        };
        self.worker_watch.call_within(
            request,
            (),
            WORKER_WATCH_TIMEOUT + WCONFD_ANSWER_DEADLINE,
            Instant::now(),
        );
    }

    /// The watch link's socket is ready: notices, then the next watch.
    pub(super) fn worker_watch_event(&mut self) {
        let answers = self.worker_watch.event(Instant::now());
        if answers.is_empty() {
            return;
        }
        for ((), answer) in answers {
            match answer
                .map_err(|error| error.to_string())
                .and_then(|value| decode_batch(&value))
            {
                Ok(batch) => self.notices(batch),
                Err(error) => {
                    tracing::warn!(%error, "wconfd's worker notices cannot be read; asking for all");
                    self.notice_cursor = None;
                }
            }
        }
        self.watch_workers();
    }

    fn notices(&mut self, batch: NoticeBatch) {
        self.notice_cursor = Some(batch.cursor);
        let mut preparing = Vec::new();
        for notice in batch.notices {
            match notice {
                WorkerNotice::Assigned { job, workers } => {
                    self.run(Input::WorkersAssigned { id: job, workers });
                }
                WorkerNotice::EndJob { job, reason } => {
                    self.run(Input::EndJob { id: job, reason });
                }
                WorkerNotice::Prepare {
                    uuid,
                    seq,
                    argv,
                    worker,
                } => {
                    let of = PrepareOf { uuid, seq };
                    preparing.push(of.clone());
                    self.prepare(of, argv, worker);
                }
                WorkerNotice::CancelPrepare { uuid, seq } => {
                    self.cancel_prepare(&PrepareOf { uuid, seq });
                }
            }
        }
        if batch.full {
            // wconfd (or luxid) started anew: what wconfd may not have,
            // it gets again; prepares it no longer runs end.
            for (id, priority, request) in self.core.waiting_for_workers() {
                self.worker_call(Effect::RequestWorkers {
                    id,
                    priority,
                    request,
                });
            }
            let stale: Vec<PrepareOf> = self
                .core
                .prepare_jobs()
                .map(|(of, _)| of.clone())
                .filter(|of| !preparing.contains(of))
                .collect();
            for of in stale {
                self.cancel_prepare(&of);
            }
        }
    }

    /// Runs a worker's prepare as a job of its own at the highest
    /// priority, unless one runs it already.
    fn prepare(&mut self, of: PrepareOf, argv: Vec<String>, worker: Value) {
        if let Some(id) = self.core.prepare_job(&of) {
            if let Some(job) = self.core.job(id)
                && job.is_final()
            {
                // Its end did not reach wconfd: told again.
                let status = job.status();
                self.worker_call(Effect::PrepareEnded {
                    of,
                    status,
                    reason: status.name().to_owned(),
                });
            }
            return;
        }
        let list = Value::Array(vec![worker]).to_string();
        let env: serde_json::Map<String, Value> = worker_env_of(&list)
            .into_iter()
            .map(|(name, value)| (name, json!(value)))
            .collect();
        let opcode = json!({
            "OP_ID": OP_EXEC,
            "argv": argv,
            "env": env,
            "priority": crate::jobs::opcode::SUBMIT_PRIORITIES[0],
            "comment": format!("prepare of worker {}", of.uuid),
            "prepare_worker": {"uuid": of.uuid, "seq": of.seq},
        });
        let job = self.build_internal_job(&json!([opcode]));
        if let Err(error) = &job {
            tracing::error!(worker = %of.uuid, %error, "cannot make a prepare job");
        }
        tracing::info!(worker = %of.uuid, seq = of.seq, "submitting the worker's prepare job");
        debug_assert_eq!(WORKERS_ENV, "WARDEN_WORKERS");
        self.run(Input::Request {
            conn: Conn::LUXID,
            command: Command::Submit {
                jobs: vec![match job {
                    Ok(job) => Submission::New(job),
                    Err(message) => Submission::Refused(message),
                }],
                ignore_drain: true,
                many: false,
            },
        });
    }

    fn cancel_prepare(&mut self, of: &PrepareOf) {
        let Some(id) = self.core.prepare_job(of) else {
            return;
        };
        if self
            .core
            .job(id)
            .is_some_and(|job| job.status() != Status::Canceled && !job.is_final())
        {
            tracing::info!(worker = %of.uuid, seq = of.seq, job = id, "a newer state won: canceling the prepare job");
            self.run(Input::Request {
                conn: Conn::LUXID,
                command: Command::Cancel { id, kill: true },
            });
        }
    }
}
