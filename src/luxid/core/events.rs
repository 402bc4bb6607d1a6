//! [`JobEvents`]: what luxid's event sequence has said of each job, and
//! the events a job's new copy adds (EVENTS.md, luxid's catalogue).
//!
//! The core tells it of every durable copy of a job; it compares the
//! job's path (`Job::path`) and priority with what was said and gives the
//! missing events, each step once and in order, however many steps one
//! file write made. Restored from a checkpoint plus the events after it,
//! it lets a restart say what a crash kept luxid from seeing.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::events::Event;
use crate::jobs::{Job, JobId, PathStep, Status, Timestamp};

/// An event the shell appends (it numbers and stamps it).
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub kind: &'static str,
    pub fields: Map<String, Value>,
}

/// What was said of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Said {
    /// The last step said: its key and status (`None`: only submitted).
    last: Option<((usize, u8), Status)>,
    priority: i64,
    finished: bool,
}

#[derive(Debug, Default)]
pub struct JobEvents {
    /// Every job said submitted and not yet archived.
    jobs: BTreeMap<JobId, Said>,
    drained: Option<bool>,
    pending: Vec<NewEvent>,
}

fn fields(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("fields are built as objects"),
    }
}

fn timestamp(ts: Option<Timestamp>) -> Value {
    json!(ts)
}

impl JobEvents {
    fn push(&mut self, kind: &'static str, value: Value) {
        self.pending.push(NewEvent {
            kind,
            fields: fields(value),
        });
    }

    /// The events given since the last call, in order.
    pub fn take(&mut self) -> Vec<NewEvent> {
        std::mem::take(&mut self.pending)
    }

    pub fn knows(&self, id: JobId) -> bool {
        self.jobs.contains_key(&id)
    }

    /// Whether the sequence says the job finished.
    pub fn said_finished(&self, id: JobId) -> bool {
        self.jobs.get(&id).is_some_and(|said| said.finished)
    }

    /// The jobs said submitted and not archived.
    pub fn known(&self) -> impl Iterator<Item = JobId> + '_ {
        self.jobs.keys().copied()
    }

    /// The jobs said submitted and not finished.
    pub fn unfinished(&self) -> impl Iterator<Item = JobId> + '_ {
        self.jobs
            .iter()
            .filter(|(_, said)| !said.finished)
            .map(|(id, _)| *id)
    }

    /// A durable copy of `job`: the events it adds.
    pub fn observe(&mut self, job: &Job) {
        let id = job.id;
        let mut said = match self.jobs.get(&id) {
            Some(said) => *said,
            None => {
                let priority = job.ops.first().map_or(0, |op| op.priority);
                self.push(
                    "job.submitted",
                    json!({
                        "id": id,
                        "priority": priority,
                        "summary": job.ops.iter().map(|op| op.summary()).collect::<Vec<_>>(),
                        "received": timestamp(job.received_timestamp),
                    }),
                );
                Said {
                    last: None,
                    priority,
                    finished: false,
                }
            }
        };
        if said.finished {
            return;
        }
        let mut old = said.last.map_or(Status::Queued, |(_, status)| status);
        for PathStep { opcode, status } in job.path() {
            let key = PathStep { opcode, status }.key();
            if said.last.is_some_and(|(said_key, _)| key <= said_key) || status == old {
                continue;
            }
            self.push(
                "job.status",
                json!({"id": id, "old": old.name(), "new": status.name(), "opcode": opcode}),
            );
            said.last = Some((key, status));
            old = status;
        }
        if job.is_final() {
            self.push(
                "job.finished",
                json!({
                    "id": id,
                    "status": job.status().name(),
                    "received": timestamp(job.received_timestamp),
                    "start": timestamp(job.start_timestamp),
                    "end": timestamp(job.end_timestamp),
                    "opcodes": job.ops.iter().map(|op| op.status.name()).collect::<Vec<_>>(),
                }),
            );
            said.finished = true;
        } else if job.priority() != said.priority {
            self.push(
                "job.priority",
                json!({"id": id, "old": said.priority, "new": job.priority()}),
            );
            said.priority = job.priority();
        }
        self.jobs.insert(id, said);
    }

    /// The job's file went to the archive.
    pub fn archived(&mut self, id: JobId) {
        if self.jobs.remove(&id).is_some() {
            self.push("job.archived", json!({"id": id}));
        }
    }

    /// The drain flag is `drained` now.
    pub fn drain(&mut self, drained: bool) {
        if self.drained != Some(drained) {
            self.push("queue.drain", json!({"drained": drained}));
            self.drained = Some(drained);
        }
    }

    /// luxid started, with these settings.
    pub fn started(&mut self, max_running_jobs: usize, drained: bool) {
        // A change while luxid was down is a change; the first start's
        // flag is told by `queue.started` itself.
        if self.drained.is_some() {
            self.drain(drained);
        }
        self.drained = Some(drained);
        self.push(
            "queue.started",
            json!({"max_running_jobs": max_running_jobs, "drained": drained}),
        );
    }

    // ----- restoring -----

    /// Takes in an event of the sequence read back (in order).
    pub fn replay(&mut self, event: &Event) {
        let id = event.fields.get("id").and_then(Value::as_u64);
        let text = |name: &str| event.fields.get(name).and_then(Value::as_str);
        match (event.kind.as_str(), id) {
            ("job.submitted", Some(id)) => {
                let priority = event
                    .fields
                    .get("priority")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                self.jobs.insert(
                    id,
                    Said {
                        last: None,
                        priority,
                        finished: false,
                    },
                );
            }
            ("job.status", Some(id)) => {
                let opcode = event.fields.get("opcode").and_then(Value::as_u64);
                let status = text("new").and_then(Status::parse);
                if let (Some(said), Some(opcode), Some(status)) =
                    (self.jobs.get_mut(&id), opcode, status)
                {
                    let step = PathStep {
                        opcode: opcode as usize,
                        status,
                    };
                    said.last = Some((step.key(), status));
                }
            }
            ("job.finished", Some(id)) => {
                if let Some(said) = self.jobs.get_mut(&id) {
                    said.finished = true;
                }
            }
            ("job.priority", Some(id)) => {
                let new = event.fields.get("new").and_then(Value::as_i64);
                if let (Some(said), Some(new)) = (self.jobs.get_mut(&id), new) {
                    said.priority = new;
                }
            }
            ("job.archived", Some(id)) => {
                self.jobs.remove(&id);
            }
            ("queue.drain" | "queue.started", _) => {
                self.drained = event.fields.get("drained").and_then(Value::as_bool);
            }
            _ => {}
        }
    }

    /// The saved form (a checkpoint): finished jobs as id ranges, the
    /// others with their last step and priority.
    pub fn save(&self) -> Value {
        let mut finished: Vec<[JobId; 2]> = Vec::new();
        let mut open = Vec::new();
        for (&id, said) in &self.jobs {
            if said.finished {
                match finished.last_mut() {
                    Some(range) if range[1] + 1 == id => range[1] = id,
                    _ => finished.push([id, id]),
                }
            } else {
                let last = said
                    .last
                    .map(|((opcode, _), status)| json!([opcode, status.name()]));
                open.push(json!([id, last, said.priority]));
            }
        }
        json!({"finished": finished, "open": open, "drained": self.drained})
    }

    /// From [`JobEvents::save`]'s form; the error says what is wrong.
    pub fn restore(value: &Value) -> Result<JobEvents, String> {
        let mut restored = JobEvents {
            drained: value.get("drained").and_then(Value::as_bool),
            ..JobEvents::default()
        };
        let list = |name: &str| {
            value
                .get(name)
                .and_then(Value::as_array)
                .ok_or_else(|| format!("no {name:?} list"))
        };
        for range in list("finished")? {
            let (Some(first), Some(last)) = (
                range.get(0).and_then(Value::as_u64),
                range.get(1).and_then(Value::as_u64),
            ) else {
                return Err(format!("a finished range is not [first, last]: {range}"));
            };
            if last < first || last - first > 100_000_000 {
                return Err(format!("a finished range is out of bounds: {range}"));
            }
            for id in first..=last {
                restored.jobs.insert(
                    id,
                    Said {
                        last: None,
                        priority: 0,
                        finished: true,
                    },
                );
            }
        }
        for entry in list("open")? {
            let bad = || format!("an open job is not [id, last step, priority]: {entry}");
            let id = entry.get(0).and_then(Value::as_u64).ok_or_else(bad)?;
            let priority = entry.get(2).and_then(Value::as_i64).ok_or_else(bad)?;
            let last = match entry.get(1) {
                Some(Value::Null) => None,
                Some(step) => {
                    let opcode = step.get(0).and_then(Value::as_u64).ok_or_else(bad)?;
                    let status = step
                        .get(1)
                        .and_then(Value::as_str)
                        .and_then(Status::parse)
                        .ok_or_else(bad)?;
                    let step = PathStep {
                        opcode: opcode as usize,
                        status,
                    };
                    Some((step.key(), status))
                }
                None => return Err(bad()),
            };
            restored.jobs.insert(
                id,
                Said {
                    last,
                    priority,
                    finished: false,
                },
            );
        }
        Ok(restored)
    }
}
