//! `WhyJob` (SCHEDULING.md "Why"): the core's reasons for a job, with
//! wconfd's word on every job among them that waits for locks. The
//! request is held while wconfd answers (`explainWait`, one call per such
//! job, on luxid's non-blocking link), never waited for; a wconfd that
//! does not answer in time leaves those reasons without their chain.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};

use super::Shell;
use super::workers::WconfdCall;
use crate::connection::Reply;
use crate::jobs::JobId;
use crate::limits::WCONFD_ANSWER_DEADLINE;
use crate::luxid::core::{Conn, Reason, WhyJob};
use crate::protocol::WireError;
use crate::protocol::wconfd::WconfdRequest;

/// A `WhyJob` held until wconfd explains its lock waits.
pub struct HeldWhy {
    conn: Conn,
    why: WhyJob,
    /// wconfd's `explainWait` answer for each job waiting for locks
    /// (`None`: not answered yet).
    waits: BTreeMap<JobId, Option<Value>>,
}

/// The jobs of `why` (recursively) that wait for locks.
fn waiting_jobs(why: &WhyJob, found: &mut Vec<JobId>) {
    for reason in &why.reasons {
        match reason {
            Reason::Locks => found.push(why.id),
            Reason::Dependency {
                why: Some(inner), ..
            } => waiting_jobs(inner, found),
            _ => {}
        }
    }
}

impl Shell {
    /// `WhyJob [id]`: answered now, or held for wconfd.
    pub(super) fn why_job(&mut self, conn: Conn, id: JobId) -> Reply {
        let Some(why) = self.core.why(id) else {
            return Reply::Now(Err(WireError::generic(format!(
                "Job {id} not found in queue"
            ))));
        };
        let mut waiting = Vec::new();
        waiting_jobs(&why, &mut waiting);
        if waiting.is_empty() {
            return Reply::Now(Ok(encode_why(&why, &BTreeMap::new())));
        }
        let held = self.next_why;
        self.next_why += 1;
        let now = Instant::now();
        for &job in &waiting {
            self.wconfd.call(
                WconfdRequest::ExplainWait { job },
                WconfdCall::ExplainWait { why: held, job },
                now,
            );
        }
        self.held_whys.insert(
            held,
            HeldWhy {
                conn,
                why,
                waits: waiting.into_iter().map(|job| (job, None)).collect(),
            },
        );
        self.why_of.insert(conn, held);
        Reply::Held(now + WCONFD_ANSWER_DEADLINE)
    }

    /// wconfd's `explainWait` of `job` for held `WhyJob` `held`.
    pub(super) fn explained(&mut self, held: u64, job: JobId, answer: Value) {
        let Some(why) = self.held_whys.get_mut(&held) else {
            return; // expired
        };
        why.waits.insert(job, Some(answer));
        if why.waits.values().all(Option::is_some) {
            let why = self.held_whys.remove(&held).expect("looked up above");
            self.why_of.remove(&why.conn);
            self.release_why(why);
        }
    }

    /// A held `WhyJob` whose deadline passed: answered with what wconfd
    /// said so far; whether it was one.
    pub(super) fn expire_why(&mut self, conn: Conn) -> bool {
        let Some(held) = self.why_of.remove(&conn) else {
            return false;
        };
        if let Some(why) = self.held_whys.remove(&held) {
            self.release_why(why);
        }
        true
    }

    fn release_why(&mut self, held: HeldWhy) {
        let waits: BTreeMap<JobId, Value> = held
            .waits
            .into_iter()
            .filter_map(|(job, answer)| Some((job, answer?)))
            .collect();
        self.releases
            .push((mio::Token(held.conn.0), Ok(encode_why(&held.why, &waits))));
    }
}

/// A `WhyJob` answer (PROTOCOL.md "WhyJob").
pub fn encode_why(why: &WhyJob, waits: &BTreeMap<JobId, Value>) -> Value {
    let reasons: Vec<Value> = why
        .reasons
        .iter()
        .map(|reason| match reason {
            Reason::Dependency { job, status, why } => json!({
                "kind": "dependency",
                "job": job,
                "status": status.name(),
                "why": why.as_ref().map(|why| encode_why(why, waits)),
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
            Reason::Workers { request } => json!({"kind": "workers", "request": request}),
            Reason::Locks => match waits.get(&why.id) {
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
