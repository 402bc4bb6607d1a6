//! wconfd's side of the worker registry (WORKERS.md): the methods, and
//! the notices for luxid (`watchWorkers`).
//!
//! Every change is a [`WorkerOp`] applied to the registry and journaled
//! with the lock operations of the same turn, so it is durable before any
//! reply reveals it. What luxid must act on (a job's workers, a job to
//! end, a prepare to run or cancel) becomes a numbered notice in the
//! [`Outbox`], the `WorkerChange` listener luxid follows: it reads notices
//! after its cursor with a held `watchWorkers`. Notices are only memory;
//! everything they say is also in the durable registry, so a reader of an
//! earlier wconfd run (or one that fell too far behind) is given the whole
//! of it instead (`full`).

use std::collections::VecDeque;

use mio::Token;
use serde_json::{Value, json};

use crate::jobs::JobId;
use crate::limits::WORKER_NOTICES_MAX;
use crate::protocol::WireError;
use crate::protocol::workers::{
    NoticeBatch, NoticeCursor, WorkerNotice, encode_batch, encode_worker, encode_worker_for_job,
};
use crate::workers::{Effect, Listing, Registry, Worker, WorkerChange};

/// The numbered notices of this wconfd run, and the one held watch.
pub struct Outbox {
    epoch: u64,
    /// The number of the last notice made.
    seq: u64,
    /// Notices not yet acknowledged, oldest first.
    kept: VecDeque<(u64, WorkerNotice)>,
    /// Notices up to here may have been dropped unread: a cursor before it
    /// gets a full answer.
    dropped_through: u64,
    /// The held `watchWorkers`: its connection and cursor.
    watch: Option<(Token, u64)>,
}

impl Outbox {
    pub fn new(epoch: u64) -> Outbox {
        Outbox {
            epoch,
            seq: 0,
            kept: VecDeque::new(),
            dropped_through: 0,
            watch: None,
        }
    }

    fn push(&mut self, notice: WorkerNotice) {
        if self.kept.len() >= WORKER_NOTICES_MAX {
            // Nobody reads: keep memory bounded; the state says it all.
            self.kept.clear();
            self.dropped_through = self.seq;
        }
        self.seq += 1;
        self.kept.push_back((self.seq, notice));
    }

    /// The notices of `effects`, with the workers as the registry has them
    /// now.
    pub fn add(&mut self, effects: &[Effect], registry: &Registry) {
        let mut listener = Notices {
            registry,
            notices: Vec::new(),
        };
        for effect in effects {
            effect.notify(&mut listener);
        }
        for notice in listener.notices {
            self.push(notice);
        }
    }

    /// A `watchWorkers`: answered now (a full answer, or notices after the
    /// cursor), or `None` to be held. A watch held before is answered
    /// empty (its reader reconnected), through `released`.
    pub fn watch(
        &mut self,
        token: Token,
        cursor: Option<NoticeCursor>,
        registry: &Registry,
        released: &mut Vec<(Token, Result<Value, WireError>)>,
    ) -> Option<Value> {
        if let Some((previous, seq)) = self.watch.take() {
            released.push((previous, Ok(self.batch_after(seq))));
        }
        let seq = match cursor {
            Some(cursor) if cursor.epoch == self.epoch && cursor.seq >= self.dropped_through => {
                cursor.seq.min(self.seq)
            }
            _ => return Some(encode_batch(&self.full(registry))),
        };
        while self.kept.front().is_some_and(|(number, _)| *number <= seq) {
            self.kept.pop_front();
        }
        if self.seq > seq {
            return Some(self.batch_after(seq));
        }
        self.watch = Some((token, seq));
        None
    }

    /// The held watch, if notices arrived for it: its connection and
    /// answer.
    pub fn ready(&mut self) -> Option<(Token, Value)> {
        let (token, seq) = self.watch?;
        if self.seq <= seq {
            return None;
        }
        self.watch = None;
        Some((token, self.batch_after(seq)))
    }

    /// Ends the held watch of connection `token`, if it is that one;
    /// answers its (empty) batch.
    pub fn end_watch(&mut self, token: Token) -> Option<Value> {
        let (held, seq) = self.watch?;
        if held != token {
            return None;
        }
        self.watch = None;
        Some(self.batch_after(seq))
    }

    pub fn kept(&self) -> usize {
        self.kept.len()
    }

    fn batch_after(&self, seq: u64) -> Value {
        let notices = self
            .kept
            .iter()
            .filter(|(number, _)| *number > seq)
            .map(|(_, notice)| notice.clone())
            .collect();
        encode_batch(&NoticeBatch {
            cursor: NoticeCursor {
                epoch: self.epoch,
                seq: self.seq,
            },
            full: false,
            notices,
        })
    }

    /// Everything luxid must act on, from the registry's durable state.
    fn full(&self, registry: &Registry) -> NoticeBatch {
        let mut notices = Vec::new();
        for (job, uuids) in registry.holdings() {
            notices.push(WorkerNotice::Assigned {
                job,
                workers: uuids
                    .iter()
                    .filter_map(|uuid| registry.get(uuid))
                    .map(encode_worker_for_job)
                    .collect(),
            });
        }
        for (job, reason) in registry.condemned() {
            notices.push(WorkerNotice::EndJob {
                job,
                reason: reason.to_owned(),
            });
        }
        for worker in registry.workers() {
            if let Some(argv) = &worker.preparing {
                notices.push(WorkerNotice::Prepare {
                    uuid: worker.uuid.clone(),
                    seq: worker.prepare_seq,
                    argv: argv.clone(),
                    worker: encode_worker_for_job(worker),
                });
            }
        }
        NoticeBatch {
            cursor: NoticeCursor {
                epoch: self.epoch,
                seq: self.seq,
            },
            full: true,
            notices,
        }
    }
}

/// The listener turning effects into luxid's notices.
struct Notices<'a> {
    registry: &'a Registry,
    notices: Vec<WorkerNotice>,
}

impl WorkerChange for Notices<'_> {
    fn workers_assigned_notification(&mut self, job: JobId, uuids: &[String]) {
        let workers = uuids
            .iter()
            .filter_map(|uuid| self.registry.get(uuid))
            .map(encode_worker_for_job)
            .collect();
        self.notices.push(WorkerNotice::Assigned { job, workers });
    }

    fn job_end_notification(&mut self, job: JobId, reason: &str) {
        self.notices.push(WorkerNotice::EndJob {
            job,
            reason: reason.to_owned(),
        });
    }

    fn prepare_notification(&mut self, uuid: &str, seq: u64, argv: &[String]) {
        let worker = self
            .registry
            .get(uuid)
            .map_or(json!({"uuid": uuid}), encode_worker_for_job);
        self.notices.push(WorkerNotice::Prepare {
            uuid: uuid.to_owned(),
            seq,
            argv: argv.to_vec(),
            worker,
        });
    }

    fn cancel_prepare_notification(&mut self, uuid: &str, seq: u64) {
        self.notices.push(WorkerNotice::CancelPrepare {
            uuid: uuid.to_owned(),
            seq,
        });
    }
}

/// A worker as `getWorkerInfo` and `listWorkers` show it: its wire
/// object and `waits_for`, the job told to end whose release its prepare
/// waits for (null if none).
pub fn worker_object(registry: &Registry, worker: &Worker) -> Value {
    let mut value = encode_worker(worker);
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "waits_for".to_owned(),
            json!(registry.draining_for(&worker.uuid)),
        );
    }
    value
}

/// `listWorkers`' answer.
pub fn encode_listing(registry: &Registry, listing: &Listing<'_>) -> Value {
    let workers: Vec<Value> = listing
        .workers
        .iter()
        .map(|worker| worker_object(registry, worker))
        .collect();
    json!({"workers": workers, "total": listing.total, "remaining": listing.remaining})
}
