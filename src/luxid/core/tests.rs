//! One or more tests for each input of the queue core, driven by hand:
//! every effect the core asks for is looked at, and answered as a shell
//! would (or refused, as a full disk would).

use super::*;
use crate::jobs::{LOG_ATTEMPT, QueuedOpcode};
use serde_json::json;

const C: Conn = Conn(7);

fn config(max_running_jobs: usize) -> Config {
    Config {
        max_running_jobs,
        queue_jobs_max: 10,
        livelock_dir: PathBuf::from("/ll"),
        clock: ClockOrigin::now(),
    }
}

/// An unfinished job of one opcode, depending on `depends`.
fn job(id: JobId, priority: i64, depends: &[JobId]) -> Job {
    let depends: Vec<Value> = depends.iter().map(|dep| json!([dep, []])).collect();
    let input = json!({
        "OP_ID": "OP_TEST_DELAY",
        "duration": 0.1,
        "priority": priority,
        "depends": depends,
    });
    Job {
        id,
        ops: vec![QueuedOpcode::new(input, priority)],
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

/// The job as its runner writes it once it runs.
fn running(job: Job, pid: u32) -> Job {
    let mut job = with_status(job, Status::Running);
    job.livelock = Some(format!("/ll/job_{:06}_1000", job.id));
    job.process_id = Some(pid);
    job
}

struct Driver {
    core: QueueCore,
    now: Instant,
    /// The events the core gave, kept apart from its other effects.
    events: Vec<NewEvent>,
}

/// The effects but the events, which go to `events`.
fn without_events(effects: Vec<Effect>, events: &mut Vec<NewEvent>) -> Vec<Effect> {
    effects
        .into_iter()
        .filter_map(|effect| match effect {
            Effect::Events(mut given) => {
                events.append(&mut given);
                None
            }
            other => Some(other),
        })
        .collect()
}

impl Driver {
    fn new(max_running_jobs: usize) -> Driver {
        Driver::restored(max_running_jobs, Restored::default()).0
    }

    fn restored(max_running_jobs: usize, restored: Restored) -> (Driver, Vec<Effect>) {
        let config = config(max_running_jobs);
        let now = config.clock.instant;
        let (core, effects) = QueueCore::new(config, restored, RandomState::new(), now);
        core.check_invariants();
        let mut events = Vec::new();
        let effects = without_events(effects, &mut events);
        (Driver { core, now, events }, effects)
    }

    fn feed(&mut self, input: Input) -> Vec<Effect> {
        let effects = self.core.handle(input, self.now);
        self.core.check_invariants();
        without_events(effects, &mut self.events)
    }

    /// The kinds of the events given since the last call, with the job
    /// each names (0: none).
    fn take_events(&mut self) -> Vec<(&'static str, u64)> {
        std::mem::take(&mut self.events)
            .into_iter()
            .map(|event| {
                let id = event.fields.get("id").and_then(Value::as_u64).unwrap_or(0);
                (event.kind, id)
            })
            .collect()
    }

    fn request(&mut self, command: Command) -> Vec<Effect> {
        self.feed(Input::Request { conn: C, command })
    }

    /// Submits `jobs` (one request each) and commits them, starting
    /// every runner the core asks for; answers the pids given (pid = 100 +
    /// id).
    fn submit(&mut self, jobs: Vec<Job>) {
        for job in jobs {
            let effects = self.request(Command::Submit {
                jobs: vec![Submission::New(job)],
                ignore_drain: false,
                many: false,
            });
            assert!(
                matches!(&effects[..], [Effect::Reply { reply: Ok(_), .. }]),
                "{effects:?}"
            );
        }
        let effects = self.feed(Input::EndTurn);
        let [Effect::Commit { start, .. }] = &effects[..] else {
            panic!("{effects:?}")
        };
        let spawned = start.iter().map(|&id| (id, Ok(100 + id as u32))).collect();
        let effects = self.feed(Input::Committed {
            result: Ok(()),
            spawned,
        });
        self.spawn_all(effects);
    }

    fn spawn_all(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            if let Effect::Spawn { id } = effect {
                let more = self.feed(Input::Spawned {
                    id,
                    pid: 100 + id as u32,
                });
                assert!(more.is_empty(), "{more:?}");
            }
        }
    }

    fn do_ok(&mut self, effects: &[Effect]) -> Vec<Effect> {
        self.answer(effects, Ok(()))
    }

    fn answer(&mut self, effects: &[Effect], result: Result<(), String>) -> Vec<Effect> {
        let ticket = effects
            .iter()
            .find_map(|effect| match effect {
                Effect::Do { ticket, .. } => Some(*ticket),
                _ => None,
            })
            .expect("an action");
        self.feed(Input::Done { ticket, result })
    }

    fn status(&self, id: JobId) -> Option<Status> {
        self.core.job(id).map(|job| job.status())
    }
}

fn reply(effects: &[Effect]) -> &Reply {
    effects
        .iter()
        .find_map(|effect| match effect {
            Effect::Reply { reply, .. } => Some(reply),
            _ => None,
        })
        .expect("a reply")
}

fn outcome(done: bool, message: &str) -> Reply {
    Ok(Answer::Outcome(done, message.to_owned()))
}

#[test]
fn submissions_take_the_next_ids_and_are_checked_in_order() {
    let mut driver = Driver::new(2);
    let effects = driver.request(Command::Submit {
        jobs: vec![
            Submission::New(job(1, 0, &[])),
            Submission::Refused("bad".to_owned()),
            Submission::New(job(2, 0, &[])),
        ],
        ignore_drain: false,
        many: true,
    });
    assert_eq!(
        reply(&effects),
        &Ok(Answer::SubmittedMany(vec![
            Ok(1),
            Err("bad".to_owned()),
            Ok(2)
        ]))
    );
    assert_eq!(driver.core.serial(), 2);
    let effects = driver.request(Command::Submit {
        jobs: vec![Submission::Refused("no opcodes".to_owned())],
        ignore_drain: false,
        many: false,
    });
    assert_eq!(
        reply(&effects),
        &Err(Refusal::Prereq("no opcodes".to_owned()))
    );
    let effects = driver.request(Command::Submit {
        jobs: vec![Submission::Refused(String::new()); SUBMIT_MANY_JOBS_MAX + 1],
        ignore_drain: false,
        many: true,
    });
    assert_eq!(
        reply(&effects),
        &Err(Refusal::TooManyJobs(SUBMIT_MANY_JOBS_MAX + 1))
    );
    let effects = driver.request(Command::Submit {
        jobs: (3..12).map(|id| Submission::New(job(id, 0, &[]))).collect(),
        ignore_drain: false,
        many: true,
    });
    assert_eq!(
        reply(&effects),
        &Err(Refusal::QueueFull { jobs: 2, max: 10 })
    );
    assert_eq!(driver.core.serial(), 2, "a refused submission takes no id");
}

#[test]
fn a_drained_queue_refuses_submissions_but_the_drained_kind() {
    let mut driver = Driver::new(1);
    let effects = driver.request(Command::SetDrain { drained: true });
    assert!(!driver.core.is_drained(), "only once written");
    let effects = driver.answer(&effects, Err("disk full".to_owned()));
    assert_eq!(
        reply(&effects),
        &Err(Refusal::Failed(
            "cannot set the drain flag: disk full".to_owned()
        ))
    );
    assert!(!driver.core.is_drained());
    let effects = driver.request(Command::SetDrain { drained: true });
    assert_eq!(reply(&driver.do_ok(&effects)), &Ok(Answer::DrainSet));
    let effects = driver.request(Command::Submit {
        jobs: vec![Submission::New(job(1, 0, &[]))],
        ignore_drain: false,
        many: false,
    });
    assert_eq!(reply(&effects), &Err(Refusal::Drained));
    let effects = driver.request(Command::Submit {
        jobs: vec![Submission::New(job(1, 0, &[]))],
        ignore_drain: true,
        many: false,
    });
    assert_eq!(reply(&effects), &Ok(Answer::Submitted(1)));
}

#[test]
fn new_jobs_start_during_their_commit_up_to_the_limit_in_priority_order() {
    let mut driver = Driver::new(2);
    for job in [
        job(1, 0, &[]),
        job(2, -5, &[]),
        job(3, 0, &[]),
        job(4, -10, &[1]),
    ] {
        driver.request(Command::Submit {
            jobs: vec![Submission::New(job)],
            ignore_drain: false,
            many: false,
        });
    }
    let effects = driver.feed(Input::EndTurn);
    // Job 4 has the best priority but waits for job 1.
    assert_eq!(
        effects,
        [Effect::Commit {
            jobs: vec![1, 2, 3, 4],
            start: vec![2, 1],
        }]
    );
    // The commit returned after one spawn: the other starts after it.
    let effects = driver.feed(Input::Committed {
        result: Ok(()),
        spawned: vec![(2, Ok(102))],
    });
    assert_eq!(effects, [Effect::Spawn { id: 1 }]);
    assert_eq!(driver.core.runner(2), Some(&Runner::Running { pid: 102 }));
    driver.spawn_all(effects);
    assert_eq!(driver.core.queued().collect::<Vec<_>>(), [4, 3]);
}

#[test]
fn a_refused_commit_forgets_its_jobs_and_answers_their_watchers() {
    let mut driver = Driver::new(1);
    driver.request(Command::Submit {
        jobs: vec![Submission::New(job(1, 0, &[]))],
        ignore_drain: false,
        many: false,
    });
    let effects = driver.request(Command::WaitForChange {
        id: 1,
        fields: vec!["status"],
        previous: json!(["queued"]),
        log_serial: 0,
        timeout: Duration::from_secs(10),
    });
    assert!(matches!(effects[..], [Effect::Hold { .. }]));
    driver.feed(Input::EndTurn);
    let effects = driver.feed(Input::Committed {
        result: Err("disk full".to_owned()),
        spawned: vec![(1, Ok(101))],
    });
    assert_eq!(
        effects,
        [Effect::Release {
            conn: C,
            reply: Err(Refusal::JobLost(1))
        }]
    );
    assert_eq!(driver.core.job_count(), 0);
    assert!(!driver.core.is_started(1));
    assert_eq!(driver.core.serial(), 1, "its id is not handed out again");
}

#[test]
fn a_queued_job_is_canceled_once_its_file_is_written() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[]), job(2, 0, &[])]);
    let effects = driver.request(Command::Cancel { id: 2, kill: false });
    let refused = driver.answer(&effects, Err("read-only".to_owned()));
    assert_eq!(
        reply(&refused),
        &Err(Refusal::Failed("cannot write job 2: read-only".to_owned()))
    );
    assert_eq!(driver.core.queued().collect::<Vec<_>>(), [2]);
    let effects = driver.request(Command::Cancel { id: 2, kill: false });
    assert_eq!(
        reply(&driver.do_ok(&effects)),
        &outcome(true, "Dequeued job 2")
    );
    assert_eq!(driver.status(2), Some(Status::Canceled));
    let effects = driver.request(Command::Cancel { id: 2, kill: false });
    assert_eq!(
        reply(&effects),
        &outcome(false, "Job 2 has already finished")
    );
    let effects = driver.request(Command::Cancel { id: 9, kill: true });
    assert_eq!(reply(&effects), &outcome(false, "Job 9 not found in queue"));
}

#[test]
fn a_running_job_is_signalled_and_killed() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[])]);
    // The answer comes from the file as it is once the signal is sent,
    // not from the copy in memory, which lags the runner's writes.
    let effects = driver.request(Command::Cancel { id: 1, kill: false });
    let [
        Effect::Signal {
            id: 1,
            pid: 101,
            signal: RunnerSignal::Cancel,
        },
        Effect::ReadJobStatus { ticket, id: 1 },
    ] = effects[..]
    else {
        panic!("{effects:?}")
    };
    let effects = driver.feed(Input::JobStatusRead {
        ticket,
        status: Some(Status::Queued),
    });
    assert_eq!(reply(&effects), &outcome(true, "Job 1 will be canceled"));
    let effects = driver.request(Command::Cancel { id: 1, kill: false });
    let Some(Effect::ReadJobStatus { ticket, .. }) = effects.last().cloned() else {
        panic!("{effects:?}")
    };
    let effects = driver.feed(Input::JobStatusRead {
        ticket,
        status: Some(Status::Running),
    });
    assert_eq!(
        reply(&effects),
        &outcome(
            false,
            "Job no longer waiting, can't cancel (informed it anyway)"
        )
    );
    let effects = driver.request(Command::Cancel { id: 1, kill: true });
    assert!(matches!(
        effects[..],
        [Effect::Do {
            action: Action::KillGroup { id: 1, pid: 101 },
            ..
        }]
    ));
    let refused = driver.answer(&effects, Err("no such process".to_owned()));
    assert_eq!(
        reply(&refused),
        &Err(Refusal::Failed(
            "cannot kill job 1: no such process".to_owned()
        ))
    );
}

#[test]
fn signals_for_a_runner_without_a_pid_wait_for_it() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[])]);
    driver.request(Command::Submit {
        jobs: vec![Submission::New(job(2, 0, &[]))],
        ignore_drain: false,
        many: false,
    });
    driver.feed(Input::EndTurn);
    driver.feed(Input::Committed {
        result: Ok(()),
        spawned: vec![],
    });
    // Job 1 ends; job 2's runner is asked for and not yet reported.
    driver.feed(Input::JobFileChanged {
        job: with_status(running(job(1, 0, &[]), 101), Status::Success),
    });
    driver.feed(Input::RunnerExited {
        id: 1,
        cause: None,
        livelock_held: false,
    });
    let effects = driver.feed(Input::EndTurn);
    assert_eq!(effects, [Effect::Spawn { id: 2 }]);
    let canceled = driver.request(Command::Cancel { id: 2, kill: false });
    assert_eq!(reply(&canceled), &outcome(true, "Job 2 will be canceled"));
    let killed = driver.request(Command::Cancel { id: 2, kill: true });
    assert_eq!(reply(&killed), &outcome(true, "Job 2 will be killed"));
    let effects = driver.feed(Input::Spawned { id: 2, pid: 102 });
    assert_eq!(
        effects,
        [
            Effect::Signal {
                id: 2,
                pid: 102,
                signal: RunnerSignal::Cancel
            },
            Effect::KillGroup { id: 2, pid: 102 },
        ]
    );
}

#[test]
fn a_priority_change_reorders_the_queue_or_asks_the_runner() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[]), job(2, 0, &[]), job(3, 0, &[])]);
    let effects = driver.request(Command::ChangePriority {
        id: 3,
        priority: -5,
    });
    assert_eq!(
        reply(&driver.do_ok(&effects)),
        &outcome(
            true,
            "Priorities of pending opcodes for job 3 have been changed to -5"
        )
    );
    assert_eq!(driver.core.queued().collect::<Vec<_>>(), [3, 2]);
    let effects = driver.request(Command::ChangePriority { id: 1, priority: 5 });
    assert!(matches!(
        effects[..],
        [Effect::Do {
            action: Action::WritePriorityRequest { id: 1, priority: 5 },
            ..
        }]
    ));
    let effects = driver.do_ok(&effects);
    assert_eq!(
        effects[0],
        Effect::Signal {
            id: 1,
            pid: 101,
            signal: RunnerSignal::Priority
        }
    );
    let effects = driver.request(Command::ChangePriority { id: 9, priority: 5 });
    assert_eq!(reply(&effects), &outcome(false, "Job 9 not found"));
}

#[test]
fn a_priority_request_written_after_its_runner_was_done_is_removed() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[])]);
    let asked = driver.request(Command::ChangePriority { id: 1, priority: 5 });
    assert!(matches!(
        asked[..],
        [Effect::Do {
            action: Action::WritePriorityRequest { id: 1, priority: 5 },
            ..
        }]
    ));
    // The job ends and its runner exits while the file is being written.
    let finished = with_status(running(job(1, 0, &[]), 101), Status::Success);
    driver.feed(Input::JobFileChanged { job: finished });
    let done = driver.feed(Input::RunnerExited {
        id: 1,
        cause: None,
        livelock_held: false,
    });
    assert!(done.contains(&Effect::RemovePriorityRequest { id: 1 }));
    let effects = driver.do_ok(&asked);
    assert!(
        effects.contains(&Effect::RemovePriorityRequest { id: 1 }),
        "the file written after the runner was done goes too: {effects:?}"
    );
}

#[test]
fn archiving_moves_finished_jobs_only_and_auto_archiving_stops_in_time() {
    let mut driver = Driver::new(3);
    driver.submit(vec![job(1, 0, &[]), job(2, 0, &[]), job(3, 0, &[])]);
    let effects = driver.request(Command::Archive { id: 1 });
    assert_eq!(reply(&effects), &Ok(Answer::Archived(false)));
    for id in 1..=3 {
        let mut done = with_status(running(job(id, 0, &[]), 100 + id as u32), Status::Success);
        done.end_timestamp = Some(crate::jobs::Timestamp(2000 + id, 0));
        driver.feed(Input::JobFileChanged { job: done });
    }
    let effects = driver.request(Command::Archive { id: 1 });
    let refused = driver.answer(&effects, Err("read-only".to_owned()));
    assert_eq!(reply(&refused), &Ok(Answer::Archived(false)));
    assert_eq!(driver.status(1), Some(Status::Success));
    // Jobs older than 100 s at 2102.5: 1 and 2; 2 is tried after the
    // time limit.
    let effects = driver.request(Command::AutoArchive {
        age: Some(Duration::from_secs(100)),
        timeout: Some(Duration::from_millis(10)),
        now_secs: 2102.5,
    });
    driver.now += Duration::from_millis(11);
    let effects = driver.do_ok(&effects);
    assert_eq!(
        reply(&effects),
        &Ok(Answer::AutoArchived {
            archived: 1,
            left: 1
        })
    );
    assert_eq!(driver.status(1), None);
    assert_eq!(driver.status(2), Some(Status::Success));
}

#[test]
fn a_wait_is_held_answered_on_change_at_the_deadline_or_dropped() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[]), job(2, 0, &[])]);
    let wait = |id| Command::WaitForChange {
        id,
        fields: vec!["status"],
        previous: json!(["queued"]),
        log_serial: 0,
        timeout: Duration::from_secs(1),
    };
    let effects = driver.request(wait(9));
    assert_eq!(reply(&effects), &Err(Refusal::JobLost(9)));
    let effects = driver.request(wait(1));
    assert!(matches!(effects[..], [Effect::Hold { conn: C, .. }]));
    // A change of nothing it watches is not an answer.
    let mut same = job(1, 0, &[]);
    same.process_id = Some(101);
    driver.feed(Input::JobFileChanged { job: same });
    assert_eq!(driver.feed(Input::EndTurn), []);
    driver.feed(Input::JobFileChanged {
        job: running(job(1, 0, &[]), 101),
    });
    let effects = driver.feed(Input::EndTurn);
    assert_eq!(
        effects,
        [Effect::Release {
            conn: C,
            reply: Ok(Answer::Change {
                values: json!(["running"]),
                log: vec![]
            })
        }]
    );
    let effects = driver.request(wait(2));
    assert!(matches!(effects[..], [Effect::Hold { .. }]));
    driver.now += Duration::from_secs(1);
    let effects = driver.feed(Input::Tick);
    assert!(matches!(
        &effects[..],
        [Effect::Release {
            reply: Ok(Answer::Change { .. }),
            ..
        }]
    ));
    driver.request(wait(2));
    driver.feed(Input::ConnectionGone { conn: C });
    assert_eq!(driver.core.watcher_count(), 0);
}

#[test]
fn a_finished_runner_is_done_and_the_next_job_starts() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[]), job(2, 0, &[1])]);
    let finished = with_status(running(job(1, 0, &[]), 101), Status::Success);
    driver.feed(Input::JobFileChanged { job: finished });
    assert!(driver.core.is_started(1), "until its process ends");
    let effects = driver.feed(Input::RunnerExited {
        id: 1,
        cause: None,
        livelock_held: false,
    });
    assert_eq!(
        effects,
        [
            Effect::RemoveLivelock {
                path: PathBuf::from("/ll/job_000001_1000")
            },
            Effect::RemovePriorityRequest { id: 1 },
        ]
    );
    assert_eq!(driver.feed(Input::EndTurn), [Effect::Spawn { id: 2 }]);
}

#[test]
fn a_dead_runner_is_killed_awaited_and_its_job_ended_with_retries() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[])]);
    driver.feed(Input::JobFileChanged {
        job: running(job(1, 0, &[]), 101),
    });
    let effects = driver.feed(Input::RunnerExited {
        id: 1,
        cause: Some("could not write the job file"),
        livelock_held: false,
    });
    let livelock = PathBuf::from("/ll/job_000001_1000");
    assert_eq!(
        effects,
        [
            Effect::KillGroup { id: 1, pid: 101 },
            Effect::WatchLivelock {
                id: 1,
                path: livelock.clone()
            },
            Effect::Probe {
                id: 1,
                path: livelock.clone()
            },
        ]
    );
    let effects = driver.request(Command::Cancel { id: 1, kill: true });
    assert_eq!(
        reply(&effects),
        &outcome(false, "Job 1 is being cleaned up after its death")
    );
    assert_eq!(
        driver.feed(Input::Probed {
            id: 1,
            released: false
        }),
        []
    );
    driver.feed(Input::LivelockClosed { id: 1 });
    let effects = driver.feed(Input::Tick);
    assert_eq!(
        effects,
        [Effect::Probe {
            id: 1,
            path: livelock.clone()
        }]
    );
    let effects = driver.feed(Input::Probed {
        id: 1,
        released: true,
    });
    let Some(Effect::Do {
        action: Action::WriteJob(ended),
        ..
    }) = effects.last()
    else {
        panic!("{effects:?}")
    };
    assert_eq!(ended.status(), Status::Error);
    assert_eq!(
        ended.ops[0].result,
        exec_error("detected death of job 1: its runner could not write the job file")
    );
    // The disk refuses; tried again after the retry interval.
    driver.answer(&effects, Err("disk full".to_owned()));
    assert_eq!(driver.status(1), Some(Status::Running));
    assert!(matches!(
        driver.core.runner(1),
        Some(Runner::Dying {
            failed_writes: 1,
            ..
        })
    ));
    assert_eq!(driver.feed(Input::Tick), []);
    driver.now += DEAD_JOB_WRITE_RETRY_INTERVAL;
    let effects = driver.feed(Input::Tick);
    assert_eq!(
        effects,
        [Effect::Probe {
            id: 1,
            path: livelock.clone()
        }]
    );
    let effects = driver.feed(Input::Probed {
        id: 1,
        released: true,
    });
    let effects = driver.do_ok(&effects);
    assert_eq!(
        effects[0],
        Effect::FreeLocks {
            id: 1,
            livelock: livelock.display().to_string(),
            pid: 101
        }
    );
    assert_eq!(driver.status(1), Some(Status::Error));
    assert!(!driver.core.is_started(1));
}

#[test]
fn a_runner_that_found_another_one_follows_it() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[])]);
    let effects = driver.feed(Input::RunnerExited {
        id: 1,
        cause: None,
        livelock_held: true,
    });
    assert_eq!(effects, []);
    assert!(matches!(
        driver.core.runner(1),
        Some(Runner::Claimant { .. })
    ));
    let effects = driver.request(Command::Cancel { id: 1, kill: false });
    assert_eq!(reply(&effects), &outcome(true, "Job 1 will be canceled"));
    let effects = driver.feed(Input::JobFileChanged {
        job: running(job(1, 0, &[]), 555),
    });
    assert_eq!(
        effects,
        [
            Effect::Signal {
                id: 1,
                pid: 555,
                signal: RunnerSignal::Cancel
            },
            Effect::WatchRunner { id: 1, pid: 555 },
        ]
    );
}

#[test]
fn start_up_follows_live_runners_and_ends_dead_ones() {
    let restored = Restored {
        events: JobEvents::default(),
        archived: Vec::new(),
        serial: 3,
        drained: false,
        jobs: vec![
            running(job(1, 0, &[]), 101),
            running(job(2, 0, &[]), 102),
            job(3, 0, &[]),
            running(job(4, 0, &[]), 104),
            job(5, 0, &[]),
        ],
        finished: vec![],
        finished_livelocks: vec![PathBuf::from("/ll/job_000009_1000")],
        held: BTreeSet::from([1, 2, 3]),
        watched: BTreeSet::from([1]),
        filter_rules: Vec::new(),
    };
    let (mut driver, effects) = Driver::restored(1, restored);
    assert_eq!(driver.core.serial(), 5, "at least every job's id");
    assert_eq!(
        effects,
        [
            // A finished job's runner killed before its exit left this.
            Effect::RemoveLivelock {
                path: PathBuf::from("/ll/job_000009_1000")
            },
            Effect::WatchLivelock {
                id: 2,
                path: PathBuf::from("/ll/job_000002_1000")
            }
        ]
    );
    assert_eq!(driver.core.runner(1), Some(&Runner::Running { pid: 101 }));
    assert!(matches!(driver.core.runner(2), Some(Runner::Dying { .. })));
    assert!(matches!(
        driver.core.runner(3),
        Some(Runner::Claimant { .. })
    ));
    assert!(matches!(driver.core.runner(4), Some(Runner::Dying { .. })));
    assert_eq!(driver.core.queued().collect::<Vec<_>>(), [5]);
    // Four runners over a limit of one: none starts.
    assert_eq!(driver.feed(Input::EndTurn), []);
    let effects = driver.feed(Input::Tick);
    assert_eq!(effects.len(), 3, "{effects:?}");
    // The claimant lets go without a pid: queued again.
    driver.feed(Input::Probed {
        id: 3,
        released: true,
    });
    assert_eq!(driver.core.queued().collect::<Vec<_>>(), [3, 5]);
    let effects = driver.feed(Input::Probed {
        id: 4,
        released: true,
    });
    driver.do_ok(&effects);
    assert_eq!(driver.status(4), Some(Status::Error));
}

#[test]
fn a_runner_that_cannot_start_ends_its_job() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[])]);
    driver.feed(Input::JobFileChanged {
        job: with_status(running(job(1, 0, &[]), 101), Status::Success),
    });
    driver.feed(Input::RunnerExited {
        id: 1,
        cause: None,
        livelock_held: false,
    });
    driver.request(Command::Submit {
        jobs: vec![Submission::New(job(2, 0, &[]))],
        ignore_drain: false,
        many: false,
    });
    driver.feed(Input::EndTurn);
    // It could not be spawned during the commit: tried again after.
    let effects = driver.feed(Input::Committed {
        result: Ok(()),
        spawned: vec![(2, Err("no memory".to_owned()))],
    });
    assert_eq!(effects, [Effect::Spawn { id: 2 }]);
    let effects = driver.feed(Input::SpawnFailed {
        id: 2,
        error: "no memory".to_owned(),
    });
    driver.do_ok(&effects);
    assert_eq!(driver.status(2), Some(Status::Error));
    assert!(!driver.core.is_started(2));
}

#[test]
fn dependencies_are_parsed_once_and_absolute() {
    let mut with_deps = job(5, 0, &[2, 3]);
    with_deps.ops.push(QueuedOpcode::new(
        json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.1, "depends": [[1, ["success"]], [5, []]]}),
        0,
    ));
    assert_eq!(dependencies(&with_deps), [1, 2, 3]);
    let mut broken = job(6, 0, &[]);
    broken.ops[0].input = json!({"OP_ID": "OP_NONE"});
    assert_eq!(dependencies(&broken), Vec::<JobId>::new());
}

#[test]
fn a_job_its_runner_ended_before_dying_ends_once_its_livelock_is_released() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job(1, 0, &[])]);
    driver.feed(Input::JobFileChanged {
        job: running(job(1, 0, &[]), 101),
    });
    driver.feed(Input::RunnerExited {
        id: 1,
        cause: None,
        livelock_held: false,
    });
    // The runner's last write arrives after its death, while the job's
    // processes may still hold the livelock: nothing is removed yet.
    let ended = with_status(running(job(1, 0, &[]), 101), Status::Success);
    let effects = driver.feed(Input::JobFileChanged { job: ended });
    assert_eq!(effects, []);
    assert!(matches!(driver.core.runner(1), Some(Runner::Dying { .. })));
    assert_eq!(
        driver.feed(Input::Probed {
            id: 1,
            released: false
        }),
        []
    );
    let effects = driver.feed(Input::Probed {
        id: 1,
        released: true,
    });
    let livelock = PathBuf::from("/ll/job_000001_1000");
    assert_eq!(
        effects,
        [
            Effect::RemoveLivelock {
                path: livelock.clone()
            },
            Effect::UnwatchLivelock { id: 1 },
            Effect::RemoveLivelock { path: livelock },
            Effect::RemovePriorityRequest { id: 1 },
        ]
    );
    assert_eq!(
        driver.status(1),
        Some(Status::Success),
        "as its runner wrote it"
    );
    assert!(!driver.core.is_started(1));
}

#[test]
fn the_events_tell_each_step_once_however_many_one_file_write_made() {
    let mut driver = Driver::new(1);
    assert_eq!(driver.take_events(), [("queue.started", 0)]);
    driver.submit(vec![job(1, 0, &[]), job(2, 0, &[])]);
    assert_eq!(
        driver.take_events(),
        [("job.submitted", 1), ("job.submitted", 2)]
    );
    // One write of the runner took job 1 from queued to its end.
    let mut done = with_status(running(job(1, 0, &[]), 101), Status::Success);
    done.ops[0].start_timestamp = Some(crate::jobs::Timestamp(10, 0));
    done.ops[0].exec_timestamp = Some(crate::jobs::Timestamp(11, 0));
    driver.feed(Input::JobFileChanged { job: done.clone() });
    let statuses: Vec<String> = driver
        .events
        .iter()
        .filter(|event| event.kind == "job.status")
        .map(|event| format!("{}>{}", event.fields["old"], event.fields["new"]))
        .collect();
    assert_eq!(
        statuses,
        [
            "\"queued\">\"waiting\"",
            "\"waiting\">\"running\"",
            "\"running\">\"success\""
        ]
    );
    assert_eq!(
        driver.take_events(),
        [
            ("job.status", 1),
            ("job.status", 1),
            ("job.status", 1),
            ("job.finished", 1)
        ]
    );
    // The same file again says nothing new.
    driver.feed(Input::JobFileChanged { job: done });
    assert_eq!(driver.take_events(), []);
    let effects = driver.request(Command::Archive { id: 1 });
    driver.do_ok(&effects);
    assert_eq!(driver.take_events(), [("job.archived", 1)]);
    // A restart from what the sequence said gives nothing twice; job 2,
    // which ran to its end while luxid was down, gets its steps.
    let mut said = JobEvents::default();
    let saved = driver.core.saved_events();
    let restored_said = JobEvents::restore(&saved).expect("restored");
    said.replay(&crate::events::Event {
        seq: 1,
        ts: crate::jobs::Timestamp(0, 0),
        kind: "job.submitted".to_owned(),
        fields: serde_json::from_value(json!({"id": 2, "priority": 0})).unwrap(),
    });
    assert_eq!(restored_said.save()["open"], said.save()["open"]);
    assert_eq!(restored_said.save()["finished"], json!([]));
    let mut ended = with_status(job(2, 0, &[]), Status::Error);
    ended.ops[0].start_timestamp = Some(crate::jobs::Timestamp(12, 0));
    let (mut restarted, _) = Driver::restored(
        1,
        Restored {
            serial: 2,
            finished: vec![FinishedJob::new(&ended)],
            events: restored_said,
            ..Restored::default()
        },
    );
    assert_eq!(
        restarted.take_events(),
        [
            ("job.status", 2),
            ("job.status", 2),
            ("job.finished", 2),
            ("queue.started", 0)
        ]
    );
}

/// A job whose first opcode has `field` set to `value`.
fn job_with(id: JobId, field: &str, value: Value) -> Job {
    let mut job = job(id, 0, &[]);
    job.ops[0].input[field] = value;
    job
}

#[test]
fn a_unique_key_is_known_while_its_job_is_unfinished() {
    let mut driver = Driver::new(1);
    driver.submit(vec![job_with(1, "unique_key", json!("nightly"))]);
    assert_eq!(driver.core.live_unique("nightly"), Some(1));
    assert_eq!(driver.core.live_unique("other"), None);
    // A submission the shell found live is answered with that job's id.
    let effects = driver.request(Command::Submit {
        jobs: vec![Submission::Live(1)],
        ignore_drain: false,
        many: false,
    });
    assert_eq!(reply(&effects), &Ok(Answer::Submitted(1)));
    assert_eq!(driver.core.serial(), 1, "nothing created");
    driver.feed(Input::JobFileChanged {
        job: with_status(
            running(job_with(1, "unique_key", json!("nightly")), 101),
            Status::Success,
        ),
    });
    assert_eq!(driver.core.live_unique("nightly"), None, "its job finished");
}

#[test]
fn a_queued_job_past_its_start_by_is_canceled_saying_so() {
    // No slot: the job stays queued.
    let mut driver = Driver::new(0);
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    driver.submit(vec![
        job_with(1, "start_by", json!(wall_now + 3600.0)),
        job_with(2, "start_by", json!(wall_now - 1.0)),
    ]);
    assert!(
        driver.core.next_wakeup().is_some_and(|at| at <= driver.now),
        "the passed deadline is due now"
    );
    let effects = driver.feed(Input::Tick);
    let written: Vec<&Job> = effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Do {
                action: Action::WriteJob(job),
                ..
            } => Some(job),
            _ => None,
        })
        .collect();
    assert_eq!(written.len(), 1, "{effects:?}");
    assert_eq!(written[0].id, 2);
    let result = written[0].ops[0]
        .result
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        result.starts_with("Job canceled: not started by "),
        "{result}"
    );
    driver.answer(&effects, Ok(()));
    assert_eq!(driver.status(2), Some(Status::Canceled));
    assert_eq!(
        driver.status(1),
        Some(Status::Queued),
        "its time has not come"
    );
    assert_eq!(driver.feed(Input::Tick), [], "nothing more is due");
}

/// A job waiting for workers is told with the fitting workers wconfd
/// listed; through a holder that does not run the chain goes on, once per
/// holder, and stops at one that runs.
#[test]
fn a_job_waiting_for_workers_names_the_fitting_ones_and_why_their_holder_waits() {
    let mut driver = Driver::new(4);
    let arm = json!({"caps": {"arch": "arm64"}});
    driver.submit(vec![
        job_with(1, "workers", json!({"caps": {"arch": "arm64"}, "count": 2})),
        job_with(2, "workers", arm.clone()),
        job_with(3, "workers", json!({"caps": {"arch": "sparc"}})),
    ]);
    let request = crate::protocol::workers::decode_request(&arm).expect("a request");
    let sparc = crate::protocol::workers::decode_request(&json!({"caps": {"arch": "sparc"}}))
        .expect("a request");
    // Before wconfd listed them: the request alone.
    let why = driver.core.why(2, &BTreeMap::new()).expect("job 2");
    assert_eq!(
        why.reasons,
        [Reason::Workers {
            request: request.clone(),
            fitting: None,
            total: 0,
        }]
    );
    // Job 1 gets b1 and b2 and waits for its locks.
    let effects = driver.feed(Input::WorkersAssigned {
        id: 1,
        workers: vec![json!({"uuid": "b1"}), json!({"uuid": "b2"})],
    });
    assert_eq!(effects, [Effect::Spawn { id: 1 }]);
    driver.spawn_all(effects);
    let waiting = with_status(
        running(
            job_with(1, "workers", json!({"caps": {"arch": "arm64"}, "count": 2})),
            101,
        ),
        Status::Waiting,
    );
    driver.feed(Input::JobFileChanged {
        job: waiting.clone(),
    });
    assert_eq!(driver.status(1), Some(Status::Waiting));
    let listed_worker = |uuid: &str, state, holder| ListedWorker {
        uuid: uuid.to_owned(),
        state,
        holder,
    };
    let listed = BTreeMap::from([
        (
            request.clone(),
            Listed {
                workers: vec![
                    listed_worker("b1", crate::workers::State::Running, Some(1)),
                    listed_worker("b2", crate::workers::State::Running, Some(1)),
                    listed_worker("b3", crate::workers::State::Maintenance, None),
                ],
                total: 4,
            },
        ),
        (sparc.clone(), Listed::default()),
    ]);
    let why = driver.core.why(2, &listed).expect("job 2");
    let holder_waits = WhyJob {
        id: 1,
        status: Status::Waiting,
        reasons: vec![Reason::Locks],
    };
    let fit = |uuid: &str, state, holder, holder_status, why: Option<WhyJob>| FittingWorker {
        worker: listed_worker(uuid, state, holder),
        holder_status,
        why: why.map(Box::new),
    };
    assert_eq!(
        why.reasons,
        [Reason::Workers {
            request: request.clone(),
            fitting: Some(vec![
                fit(
                    "b1",
                    crate::workers::State::Running,
                    Some(1),
                    Some(Status::Waiting),
                    Some(holder_waits),
                ),
                // Said above.
                fit(
                    "b2",
                    crate::workers::State::Running,
                    Some(1),
                    Some(Status::Waiting),
                    None,
                ),
                fit("b3", crate::workers::State::Maintenance, None, None, None),
            ]),
            total: 4,
        }]
    );
    // None registered fits.
    let why = driver.core.why(3, &listed).expect("job 3");
    assert_eq!(
        why.reasons,
        [Reason::Workers {
            request: sparc,
            fitting: Some(Vec::new()),
            total: 0,
        }]
    );
    // A holder that runs is in no one's way but its own work's.
    driver.feed(Input::JobFileChanged {
        job: with_status(waiting, Status::Running),
    });
    let why = driver.core.why(2, &listed).expect("job 2");
    let Reason::Workers {
        fitting: Some(fitting),
        ..
    } = &why.reasons[0]
    else {
        panic!("{why:?}")
    };
    assert_eq!(fitting[0].holder_status, Some(Status::Running));
    assert_eq!(fitting[0].why, None);
}

#[test]
fn a_job_its_claimant_let_go_is_judged_as_one_never_started() {
    // Found held by claimants at start-up: job 1 a REJECT applies to, job
    // 2 past its start_by. Neither is judged while a runner may have it.
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let reject = crate::scheduling::decode_rule(
        &json!(0),
        &json!([["jobid", ["=", "id", 1]]]),
        &json!("REJECT"),
    )
    .expect("a good rule");
    let restored = Restored {
        serial: 2,
        jobs: vec![
            job(1, 0, &[]),
            job_with(2, "start_by", json!(wall_now - 1.0)),
        ],
        held: BTreeSet::from([1, 2]),
        filter_rules: vec![crate::scheduling::filters::FilterRule::new(
            "r".to_owned(),
            0,
            reject,
            json!([]),
        )],
        ..Restored::default()
    };
    let (mut driver, _) = Driver::restored(0, restored);
    let written = |effects: &[Effect]| -> Vec<(JobId, String)> {
        effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Do {
                    action: Action::WriteJob(job),
                    ..
                } => Some((
                    job.id,
                    job.ops[0].result.as_str().unwrap_or_default().to_owned(),
                )),
                _ => None,
            })
            .collect()
    };
    assert_eq!(driver.feed(Input::EndTurn), []);
    let effects = driver.feed(Input::Tick);
    assert_eq!(written(&effects), [], "only probes: {effects:?}");
    // They let go without a pid: queued, and judged as any queued job.
    for id in [1, 2] {
        driver.feed(Input::Probed { id, released: true });
    }
    let effects = driver.feed(Input::EndTurn);
    assert_eq!(
        written(&effects),
        [(1, "Job canceled: rejected by filter rule r".to_owned())]
    );
    driver.do_ok(&effects);
    assert_eq!(driver.status(1), Some(Status::Canceled));
    let effects = driver.feed(Input::Tick);
    let canceled = written(&effects);
    assert!(
        matches!(&canceled[..], [(2, result)] if result.starts_with("Job canceled: not started by ")),
        "{canceled:?}"
    );
    driver.do_ok(&effects);
    assert_eq!(driver.status(2), Some(Status::Canceled));
}

/// A job of one `OP_EXEC` retried on its runner's death (`max + 1`
/// attempts), running, whose runner logged `logged` attempts and died.
fn dying_after_attempts(driver: &mut Driver, max: u64, logged: u64) -> Vec<Effect> {
    let mut exec = job(1, 0, &[]);
    exec.ops[0].input = json!({
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/false"],
        "retry": {"max": max, "on_death": true},
    });
    driver.submit(vec![exec.clone()]);
    let mut ran = running(exec, 101);
    for number in 1..=logged {
        ran.ops[0].log.push(LogEntry(
            number,
            crate::jobs::Timestamp(1001, 0),
            LOG_ATTEMPT.to_owned(),
            json!(format!(
                "Attempt {number} of {}: /bin/false exited with code 1",
                max + 1
            )),
        ));
    }
    driver.feed(Input::JobFileChanged { job: ran });
    driver.feed(Input::RunnerExited {
        id: 1,
        cause: None,
        livelock_held: false,
    });
    driver.feed(Input::Probed {
        id: 1,
        released: true,
    })
}

fn written_job(effects: &[Effect]) -> &Job {
    effects
        .iter()
        .find_map(|effect| match effect {
            Effect::Do {
                action: Action::WriteJob(job),
                ..
            } => Some(job),
            _ => None,
        })
        .expect("a job written")
}

#[test]
fn a_runner_death_with_attempts_left_is_one_more_attempt_and_queues_the_job_again() {
    let mut driver = Driver::new(1);
    let effects = dying_after_attempts(&mut driver, 2, 1);
    let requeued = written_job(&effects);
    assert_eq!(requeued.status(), Status::Queued);
    let attempts: Vec<&Value> = requeued.ops[0]
        .log
        .iter()
        .filter(|entry| entry.2 == LOG_ATTEMPT)
        .map(|entry| &entry.3)
        .collect();
    assert_eq!(
        attempts,
        [
            &json!("Attempt 1 of 3: /bin/false exited with code 1"),
            &json!("Attempt 2 of 3: its runner died"),
        ]
    );
}

#[test]
fn a_runner_death_after_its_last_attempt_was_logged_adds_no_attempt() {
    // The runner logged its last attempt and died before writing the
    // opcode's end: the death is no attempt of its own.
    let mut driver = Driver::new(1);
    let effects = dying_after_attempts(&mut driver, 1, 2);
    let ended = written_job(&effects);
    assert_eq!(ended.status(), Status::Error);
    assert_eq!(ended.ops[0].attempts_logged(), 2, "{:?}", ended.ops[0].log);
    assert_eq!(ended.ops[0].result, exec_error("detected death of job 1"));
}

#[test]
fn a_job_submitted_past_its_start_by_is_canceled_not_started_though_a_slot_is_free() {
    let mut driver = Driver::new(1);
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    driver.submit(vec![job_with(1, "start_by", json!(wall_now - 5.0))]);
    assert!(!driver.core.is_started(1), "its time had passed");
    let effects = driver.feed(Input::Tick);
    assert_eq!(written_job(&effects).status(), Status::Canceled);
    driver.answer(&effects, Ok(()));
    assert_eq!(driver.status(1), Some(Status::Canceled));
    assert!(!driver.core.is_started(1));
}

#[test]
fn a_job_queued_again_after_a_death_before_its_start_time_keeps_its_start_by_met() {
    // Its first runner died before writing a start time; luxid counted
    // the death as an attempt and queued it again, then restarted.
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let mut requeued = job(1, 0, &[]);
    requeued.ops[0].input = json!({
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/true"],
        "retry": {"max": 2, "on_death": true},
        "start_by": wall_now - 5.0,
    });
    requeued.ops[0].log.push(LogEntry(
        1,
        crate::jobs::Timestamp(1001, 0),
        LOG_ATTEMPT.to_owned(),
        json!("Attempt 1 of 3: its runner died"),
    ));
    let restored = Restored {
        events: JobEvents::default(),
        archived: Vec::new(),
        serial: 1,
        drained: false,
        jobs: vec![requeued],
        finished: vec![],
        finished_livelocks: vec![],
        held: BTreeSet::new(),
        watched: BTreeSet::new(),
        filter_rules: Vec::new(),
    };
    let (mut driver, _) = Driver::restored(1, restored);
    assert_eq!(driver.feed(Input::Tick), [], "not canceled");
    assert_eq!(driver.feed(Input::EndTurn), [Effect::Spawn { id: 1 }]);
}
