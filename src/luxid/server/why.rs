//! `WhyJob` (SCHEDULING.md "Why"): the core's reasons for a job, with
//! wconfd's word on the workers fitting each workers request among them
//! (`listWorkers`) and on every job among them that waits for locks
//! (`explainWait`), one call each on luxid's non-blocking link. The
//! request is held while wconfd answers, never waited for. A list can name
//! holders that have reasons of their own, so once a round of calls is
//! answered the reasons are worked out again, and asked about again, until
//! nothing new is to be asked; a wconfd that does not answer in time
//! leaves the reasons it did not explain without their part.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde_json::{Value, json};

use super::Shell;
use super::workers::WconfdCall;
use crate::connection::Reply;
use crate::jobs::JobId;
use crate::limits::{WCONFD_ANSWER_DEADLINE, WHY_WORKERS_MAX};
use crate::luxid::core::{Conn, FittingWorker, Listed, ListedWorker, Reason, WhyJob};
use crate::protocol::WireError;
use crate::protocol::wconfd::WconfdRequest;
use crate::protocol::workers::encode_request;
use crate::workers::{Direction, Filter, Page, Request as WorkerRequest, Sort, State};

/// A `WhyJob` held until wconfd lists the fitting workers and explains
/// the lock waits.
pub struct HeldWhy {
    conn: Conn,
    id: JobId,
    /// wconfd's list for each workers request asked about (`None`: not
    /// answered yet; `Err`: why there is none).
    lists: BTreeMap<WorkerRequest, Option<Result<Listed, String>>>,
    /// wconfd's `explainWait` answer for each job waiting for locks
    /// (`None`: not answered yet).
    waits: BTreeMap<JobId, Option<Value>>,
}

impl HeldWhy {
    fn unanswered(&self) -> bool {
        self.lists.values().any(Option::is_none) || self.waits.values().any(Option::is_none)
    }

    fn listed(&self) -> BTreeMap<WorkerRequest, Listed> {
        self.lists
            .iter()
            .filter_map(|(request, list)| Some((request.clone(), list.clone()?.ok()?)))
            .collect()
    }
}

/// What wconfd is asked of `why`, recursively: the workers requests and
/// the jobs that wait for locks.
fn to_ask(why: &WhyJob, requests: &mut BTreeSet<WorkerRequest>, waiting: &mut BTreeSet<JobId>) {
    for reason in &why.reasons {
        match reason {
            Reason::Locks => {
                waiting.insert(why.id);
            }
            Reason::Dependency {
                why: Some(inner), ..
            } => to_ask(inner, requests, waiting),
            Reason::Workers {
                request, fitting, ..
            } => {
                requests.insert(request.clone());
                for inner in fitting.iter().flatten().filter_map(|fit| fit.why.as_ref()) {
                    to_ask(inner, requests, waiting);
                }
            }
            _ => {}
        }
    }
}

/// `listWorkers` of the workers that could ever fit `request`, the first
/// [`WHY_WORKERS_MAX`] by uuid.
fn list_fitting(request: &WorkerRequest) -> WconfdRequest {
    WconfdRequest::ListWorkers {
        filter: Filter {
            groups: request.groups.clone(),
            caps: request.caps.clone(),
            states: BTreeSet::new(),
        },
        sort: Sort::default(),
        page: Page {
            after: None,
            direction: Direction::Forward,
            limit: WHY_WORKERS_MAX,
        },
    }
}

/// A `listWorkers` answer, as far as `WhyJob` tells it.
pub(super) fn decode_listed(answer: &Value) -> Result<Listed, String> {
    let workers = answer["workers"]
        .as_array()
        .ok_or("wconfd's list of workers has no workers")?
        .iter()
        .map(|worker| -> Result<ListedWorker, String> {
            Ok(ListedWorker {
                uuid: worker["uuid"]
                    .as_str()
                    .ok_or("a listed worker has no uuid")?
                    .to_owned(),
                state: worker["state"]
                    .as_str()
                    .and_then(State::parse)
                    .ok_or("a listed worker has no state")?,
                holder: worker["holder"].as_u64(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let total = answer["total"]
        .as_u64()
        .map_or(workers.len(), |total| total as usize);
    Ok(Listed { workers, total })
}

fn not_found(id: JobId) -> WireError {
    WireError::generic(format!("Job {id} not found in queue"))
}

impl Shell {
    /// `WhyJob [id]`: answered now, or held for wconfd.
    pub(super) fn why_job(&mut self, conn: Conn, id: JobId) -> Reply {
        let number = self.next_why;
        self.next_why += 1;
        let mut held = HeldWhy {
            conn,
            id,
            lists: BTreeMap::new(),
            waits: BTreeMap::new(),
        };
        if let Some(answer) = self.ask_why(number, &mut held) {
            return Reply::Now(answer);
        }
        self.held_whys.insert(number, held);
        self.why_of.insert(conn, number);
        Reply::Held(Instant::now() + WCONFD_ANSWER_DEADLINE)
    }

    /// Works the reasons out with what wconfd said so far and asks it what
    /// they need and it was not asked yet; the answer once nothing is left
    /// to ask.
    fn ask_why(&mut self, number: u64, held: &mut HeldWhy) -> Option<Result<Value, WireError>> {
        let Some(why) = self.core.why(held.id, &held.listed()) else {
            return Some(Err(not_found(held.id)));
        };
        let (mut requests, mut waiting) = (BTreeSet::new(), BTreeSet::new());
        to_ask(&why, &mut requests, &mut waiting);
        let now = Instant::now();
        let refused = || Some(Err("too many calls wait for wconfd".to_owned()));
        for request in requests {
            if held.lists.contains_key(&request) {
                continue;
            }
            let purpose = WconfdCall::ListFitting {
                why: number,
                request: request.clone(),
            };
            let made = self.wconfd.call(list_fitting(&request), purpose, now);
            held.lists
                .insert(request, if made { None } else { refused() });
        }
        for job in waiting {
            if held.waits.contains_key(&job) {
                continue;
            }
            let purpose = WconfdCall::ExplainWait { why: number, job };
            let made = self
                .wconfd
                .call(WconfdRequest::ExplainWait { job }, purpose, now);
            held.waits.insert(
                job,
                (!made).then(|| json!({"error": "too many calls wait for wconfd"})),
            );
        }
        if held.unanswered() {
            return None;
        }
        Some(Ok(encode_why(&why, &Said::of(held))))
    }

    /// wconfd's list of the workers fitting `request`, for held `WhyJob`
    /// `number`.
    pub(super) fn listed(
        &mut self,
        number: u64,
        request: WorkerRequest,
        answer: Result<Listed, String>,
    ) {
        if let Some(held) = self.held_whys.get_mut(&number) {
            held.lists.insert(request, Some(answer));
            self.why_answered(number);
        }
    }

    /// wconfd's `explainWait` of `job` for held `WhyJob` `number`.
    pub(super) fn explained(&mut self, number: u64, job: JobId, answer: Value) {
        if let Some(held) = self.held_whys.get_mut(&number) {
            held.waits.insert(job, Some(answer));
            self.why_answered(number);
        }
    }

    /// A round of answers is complete: the next round, or the answer.
    fn why_answered(&mut self, number: u64) {
        if self.held_whys.get(&number).is_none_or(HeldWhy::unanswered) {
            return;
        }
        let mut held = self.held_whys.remove(&number).expect("looked up above");
        match self.ask_why(number, &mut held) {
            Some(answer) => {
                self.why_of.remove(&held.conn);
                self.releases.push((mio::Token(held.conn.0), answer));
            }
            None => {
                self.held_whys.insert(number, held);
            }
        }
    }

    /// A held `WhyJob` whose deadline passed: answered with what wconfd
    /// said so far; whether it was one.
    pub(super) fn expire_why(&mut self, conn: Conn) -> bool {
        let Some(number) = self.why_of.remove(&conn) else {
            return false;
        };
        if let Some(held) = self.held_whys.remove(&number) {
            let answer = match self.core.why(held.id, &held.listed()) {
                Some(why) => Ok(encode_why(&why, &Said::of(&held))),
                None => Err(not_found(held.id)),
            };
            self.releases.push((mio::Token(held.conn.0), answer));
        }
        true
    }
}

/// What wconfd said for an answer: the lock waits it explained, and why
/// a request's workers are not listed.
pub struct Said {
    waits: BTreeMap<JobId, Value>,
    unlisted: BTreeMap<WorkerRequest, String>,
}

impl Said {
    fn of(held: &HeldWhy) -> Said {
        Said {
            waits: held
                .waits
                .iter()
                .filter_map(|(job, answer)| Some((*job, answer.clone()?)))
                .collect(),
            unlisted: held
                .lists
                .iter()
                .filter_map(|(request, list)| match list {
                    Some(Err(error)) => Some((request.clone(), error.clone())),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// A `WhyJob` answer (PROTOCOL.md "WhyJob").
pub fn encode_why(why: &WhyJob, said: &Said) -> Value {
    let reasons: Vec<Value> = why
        .reasons
        .iter()
        .map(|reason| match reason {
            Reason::Dependency { job, status, why } => json!({
                "kind": "dependency",
                "job": job,
                "status": status.name(),
                "why": why.as_ref().map(|why| encode_why(why, said)),
            }),
            Reason::Slots { max, running } => json!({
                "kind": "slots",
                "max_running_jobs": max,
                "running": running,
            }),
            Reason::Filter {
                rule,
                action,
                running,
            } => json!({
                "kind": "filter",
                "rule": rule,
                "action": action,
                "running": running,
            }),
            Reason::RateLimit {
                bucket,
                limit,
                running,
            } => json!({
                "kind": "rate_limit",
                "bucket": bucket,
                "limit": limit,
                "running": running,
            }),
            Reason::Workers {
                request,
                fitting,
                total,
            } => match fitting {
                Some(fitting) => json!({
                    "kind": "workers",
                    "request": encode_request(request),
                    "workers": fitting.iter().map(|fit| encode_fitting(fit, said)).collect::<Vec<_>>(),
                    "total": total,
                }),
                None => json!({
                    "kind": "workers",
                    "request": encode_request(request),
                    "workers": null,
                    "error": said.unlisted.get(request).map_or(
                        "wconfd did not list the workers in time",
                        String::as_str,
                    ),
                }),
            },
            Reason::Locks => match said.waits.get(&why.id) {
                Some(chain) => json!({"kind": "locks", "waits": with_jobs(chain)}),
                None => json!({"kind": "locks", "waits": null,
                               "error": "wconfd did not explain the wait in time"}),
            },
            Reason::Starting => json!({"kind": "starting"}),
            Reason::StartBy { unix_secs } => json!({
                "kind": "start_by",
                "unix_secs": unix_secs,
                "utc": crate::text::utc_time(*unix_secs),
            }),
            Reason::Backoff { unix_secs } => json!({
                "kind": "backoff",
                "unix_secs": unix_secs,
                "utc": crate::text::utc_time(*unix_secs),
            }),
            Reason::Drained => json!({"kind": "drained"}),
            Reason::Finished { result } => json!({"kind": "finished", "result": result}),
        })
        .collect();
    json!({
        "id": why.id,
        "status": why.status.name(),
        "reasons": reasons,
    })
}

/// A fitting worker; its holder in a dependency's shape.
fn encode_fitting(fit: &FittingWorker, said: &Said) -> Value {
    let holder = fit.worker.holder.map(|job| {
        json!({
            "job": job,
            "status": fit.holder_status.map(|status| status.name()),
            "why": fit.why.as_ref().map(|why| encode_why(why, said)),
        })
    });
    json!({
        "uuid": fit.worker.uuid,
        "state": fit.worker.state.wire(),
        "holder": holder,
    })
}

/// wconfd's chain with each owner that is a job also named by `"job"`.
fn with_jobs(chain: &Value) -> Value {
    match chain {
        Value::Array(items) => Value::Array(items.iter().map(with_jobs).collect()),
        Value::Object(fields) => {
            let mut fields = fields.clone();
            if let Some(job) = fields
                .get("owner")
                .and_then(|owner| owner.get(0))
                .and_then(Value::as_u64)
            {
                fields.insert("job".to_owned(), json!(job));
            }
            for key in ["blockers", "waits"] {
                if let Some(inner) = fields.get(key).map(with_jobs) {
                    fields.insert(key.to_owned(), inner);
                }
            }
            Value::Object(fields)
        }
        other => other.clone(),
    }
}
