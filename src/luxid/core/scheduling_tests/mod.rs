//! The scheduling pass of [`QueueCore`] driven as the shell drives it:
//! jobs submitted and committed, runners spawned, writes done, turns
//! ended, until the core asks for nothing more.
//!
//! - `ganeti.rs`: the cases of Ganeti 3.0's scheduler tests
//!   (`Test/Ganeti/JQScheduler.hs`) as a table, each checked against the
//!   core and against Ganeti's pipeline (`selectJobsToRun`) over the
//!   pure functions of `crate::scheduling`;
//! - `reference.rs`: a property test against a naive reference scheduler
//!   written from SCHEDULING.md.

use std::collections::VecDeque;

use super::*;
use crate::jobs::QueuedOpcode;
use crate::scheduling::filters::FilterRule;
use serde_json::json;

mod ganeti;
mod reference;

const CLIENT: Conn = Conn(3);

/// The pid the shell reports for the runner of `id`.
fn pid_of(id: JobId) -> u32 {
    1000 + id as u32
}

/// An `OP_TEST_DELAY` of `duration` seconds with these reason entries.
fn delay(duration: u64, reasons: &[(&str, &str, i64)]) -> Value {
    let reasons: Vec<Value> = reasons
        .iter()
        .map(|(source, text, timestamp)| json!([source, text, timestamp]))
        .collect();
    json!({"OP_ID": "OP_TEST_DELAY", "duration": duration, "reason": reasons})
}

/// An unfinished, queued job of `opcodes` (each an object), every opcode
/// at `priority`, the first depending on `depends` and, if `workers`,
/// asking for one worker. Each opcode is one the checks accept, so that
/// its dependencies and workers are read.
fn make_job(
    id: JobId,
    priority: i64,
    depends: &[JobId],
    workers: bool,
    opcodes: Vec<Value>,
) -> Job {
    let ops = opcodes
        .into_iter()
        .enumerate()
        .map(|(index, mut input)| {
            input["priority"] = json!(priority);
            if index == 0 {
                let depends: Vec<Value> = depends.iter().map(|dep| json!([dep, []])).collect();
                input["depends"] = json!(depends);
                if workers {
                    input["workers"] = json!({});
                }
            }
            assert!(
                opcode::parse(&input).is_ok(),
                "{input} is an opcode the checks accept"
            );
            QueuedOpcode::new(input, priority)
        })
        .collect();
    Job {
        id,
        ops,
        received_timestamp: Some(crate::jobs::Timestamp(1000, 0)),
        start_timestamp: None,
        end_timestamp: None,
        livelock: None,
        process_id: None,
        workers: Vec::new(),
    }
}

fn with_status(mut job: Job, status: Status) -> Job {
    for op in &mut job.ops {
        op.status = status;
    }
    job
}

/// A rule as it is stored.
fn rule(uuid: &str, priority: u64, watermark: u64, predicates: Value, action: Value) -> FilterRule {
    let parts = crate::scheduling::decode_rule(&json!(priority), &predicates, &action)
        .unwrap_or_else(|error| panic!("{predicates} {action}: {error}"));
    FilterRule::new(uuid.to_owned(), watermark, parts, json!([]))
}

/// The core, fed as a shell whose every write succeeds and every runner
/// starts.
struct Shell {
    core: QueueCore,
    now: Instant,
    /// Every job whose runner was asked for, in order.
    started: Vec<JobId>,
}

impl Shell {
    fn new(max_running_jobs: usize, restored: Restored) -> Shell {
        let clock = ClockOrigin::now();
        let config = Config {
            max_running_jobs,
            queue_jobs_max: 100_000,
            livelock_dir: PathBuf::from("/ll"),
            clock,
        };
        let (core, effects) = QueueCore::new(config, restored, RandomState::new(), clock.instant);
        core.check_invariants();
        for effect in &effects {
            assert!(
                !matches!(effect, Effect::Spawn { .. } | Effect::Do { .. }),
                "start-up starts nothing: {effect:?}"
            );
        }
        Shell {
            core,
            now: clock.instant,
            started: Vec::new(),
        }
    }

    fn feed(&mut self, input: Input) -> Vec<Effect> {
        let effects = self.core.handle(input, self.now);
        self.core.check_invariants();
        effects
    }

    fn request(&mut self, command: Command) -> Vec<Effect> {
        self.feed(Input::Request {
            conn: CLIENT,
            command,
        })
    }

    /// Submits `jobs` in one turn, one `SubmitJob` each.
    fn submit(&mut self, jobs: Vec<Job>) -> Vec<Effect> {
        let mut effects = Vec::new();
        for job in jobs {
            let id = job.id;
            let answer = self.request(Command::Submit {
                jobs: vec![Submission::New(job)],
                ignore_drain: false,
                many: false,
            });
            assert!(
                answer.iter().any(|effect| matches!(
                    effect,
                    Effect::Reply { reply: Ok(Answer::Submitted(given)), .. } if *given == id
                )),
                "job {id} is submitted: {answer:?}"
            );
            effects.extend(answer);
        }
        effects
    }

    /// Carries out `effects` and what follows them, ending the turn until
    /// the core asks for nothing more: a commit returns after spawning the
    /// first `commit_spawns` of the runners it was to start (the others
    /// are started after it). The jobs whose runners were asked for, in
    /// order, and the answers given.
    fn settle(&mut self, effects: Vec<Effect>, commit_spawns: usize) -> (Vec<JobId>, Vec<Reply>) {
        let mut started = Vec::new();
        let mut replies = Vec::new();
        let mut pending: VecDeque<Effect> = effects.into();
        loop {
            while let Some(effect) = pending.pop_front() {
                let more = match effect {
                    Effect::Commit { start, .. } => {
                        let spawned: Vec<(JobId, Result<u32, String>)> = start
                            .iter()
                            .take(commit_spawns)
                            .map(|&id| (id, Ok(pid_of(id))))
                            .collect();
                        started.extend(spawned.iter().map(|(id, _)| *id));
                        self.feed(Input::Committed {
                            result: Ok(()),
                            spawned,
                        })
                    }
                    Effect::Spawn { id } => {
                        started.push(id);
                        self.feed(Input::Spawned {
                            id,
                            pid: pid_of(id),
                        })
                    }
                    Effect::Do { ticket, .. } => self.feed(Input::Done {
                        ticket,
                        result: Ok(()),
                    }),
                    Effect::Reply { reply, .. } | Effect::Release { reply, .. } => {
                        replies.push(reply);
                        Vec::new()
                    }
                    _ => Vec::new(),
                };
                pending.extend(more);
            }
            let more = self.feed(Input::EndTurn);
            let acts = more.iter().any(|effect| {
                matches!(
                    effect,
                    Effect::Commit { .. } | Effect::Spawn { .. } | Effect::Do { .. }
                )
            });
            if !acts {
                for effect in more {
                    if let Effect::Reply { reply, .. } | Effect::Release { reply, .. } = effect {
                        replies.push(reply);
                    }
                }
                break;
            }
            pending.extend(more);
        }
        for id in &started {
            assert!(
                !self.started.contains(id),
                "job {id} is started twice: {:?} then {started:?}",
                self.started
            );
            assert!(self.core.is_started(*id), "job {id} has a runner");
        }
        self.started.extend(&started);
        (started, replies)
    }
}
