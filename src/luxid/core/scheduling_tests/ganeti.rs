//! Ganeti 3.0's scheduler cases (`test/hs/Test/Ganeti/JQScheduler.hs`:
//! `case_reasonRateLimit`, `case_jobFiltering`, `case_matchPredicate`,
//! `prop_filterRuleOrder`, `case_parseReasonRateLimit`, the properties of
//! `prop_reasonRateLimit` and `prop_jobFiltering`) and the facts of its
//! `selectJobsToRun` (`src/Ganeti/JQScheduler.hs`: dependencies first,
//! then priority order, the ad-hoc buckets, the filter rules, at most the
//! free slots), as a table: the jobs luxid finds started (and how their
//! runners are followed), finished and queued at start-up, the rules it
//! finds, the jobs submitted after -> the jobs started and the jobs
//! rejected.
//!
//! Each case runs through [`QueueCore`] twice: with the rules in force
//! when the jobs are submitted, and with a `PAUSE` of every job in front
//! of them that is deleted once the jobs are queued (the rules change
//! with the jobs waiting). Each case is also run through a transcription
//! of Ganeti's pipeline over the pure functions of `crate::scheduling`:
//! it gives the same jobs, but where a case says Ganeti differs
//! (`ganeti`): warden asks the rules before the buckets (D60).

use super::*;
use crate::scheduling::filters::{self, Action as RuleAction, Decision};
use crate::scheduling::rate_limit::{self, Bucket, Occupancy, buckets_of};

/// A job of a case. By default one `OP_TEST_DELAY`, its comment
/// `cluster1` and the one reason entry `("source1", "reason1", 1234)` of
/// Ganeti's `case_jobFiltering` and `case_matchPredicate` jobs.
#[derive(Clone, Debug)]
struct J {
    id: JobId,
    priority: i64,
    depends: Vec<JobId>,
    opcodes: Vec<Value>,
}

fn j(id: JobId) -> J {
    let mut opcode = delay(0, &[("source1", "reason1", 1234)]);
    opcode["comment"] = json!("cluster1");
    J {
        id,
        priority: 0,
        depends: Vec::new(),
        opcodes: vec![opcode],
    }
}

impl J {
    /// One opcode with these reason texts (source `source1`).
    fn reasons(self, texts: &[&str]) -> J {
        let reasons: Vec<(&str, &str, i64)> =
            texts.iter().map(|text| ("source1", *text, 0)).collect();
        self.opcodes(vec![delay(0, &reasons)])
    }

    fn opcodes(mut self, opcodes: Vec<Value>) -> J {
        self.opcodes = opcodes;
        self
    }

    fn priority(mut self, priority: i64) -> J {
        self.priority = priority;
        self
    }

    fn depends(mut self, depends: &[JobId]) -> J {
        self.depends = depends.to_vec();
        self
    }

    fn job(&self) -> Job {
        make_job(
            self.id,
            self.priority,
            &self.depends,
            false,
            self.opcodes.clone(),
        )
    }
}

/// How luxid finds the runner of a started job at start-up. Ganeti counts
/// its running and its "manipulated" jobs alike; warden's are runners it
/// watches by pid, claimants (a runner holding the livelock that has not
/// recorded its pid yet) and dying ones (no process to watch, the
/// livelock still held).
#[derive(Clone, Copy, Debug)]
enum Held {
    Running,
    Claimant,
    Dying,
}

struct Case {
    name: &'static str,
    max_running: usize,
    running: Vec<(J, Held)>,
    finished: Vec<J>,
    /// In any order.
    rules: Vec<FilterRule>,
    /// Queued jobs, by id: those up to the serial (the highest id of the
    /// other jobs and of the rules' watermarks) found at start-up, the
    /// others submitted in one turn.
    queued: Vec<J>,
    started: &'static [JobId],
    rejected: &'static [JobId],
    /// What Ganeti starts where it deliberately differs (D60).
    ganeti: Option<&'static [JobId]>,
}

fn base(name: &'static str) -> Case {
    Case {
        name,
        max_running: 10,
        running: Vec::new(),
        finished: Vec::new(),
        rules: Vec::new(),
        queued: Vec::new(),
        started: &[],
        rejected: &[],
        ganeti: None,
    }
}

/// Ganeti's `chain`: the rules get priorities 1, 2, ... in the order
/// given, so that the first listed is asked first.
fn chain(mut rules: Vec<FilterRule>) -> Vec<FilterRule> {
    for (index, rule) in rules.iter_mut().enumerate() {
        rule.priority = index as u64 + 1;
    }
    rules
}

/// `case_jobFiltering`'s rules: watermark job 1, `["=", "id", 1]` unless
/// given other predicates.
fn fr(uuid: &str, predicates: Value, action: Value) -> FilterRule {
    rule(uuid, 0, 1, predicates, action)
}

fn id_is_1() -> Value {
    json!([["jobid", ["=", "id", 1]]])
}

fn after_watermark() -> Value {
    json!([["jobid", [">", "id", "watermark"]]])
}

const HELLO: &str = "rate-limit:2:hello";

fn cases() -> Vec<Case> {
    let hello = |id| j(id).reasons(&[HELLO]);
    let nightly_limit = |limit: u64| {
        rule(
            "nightly",
            0,
            0,
            json!([["reason", ["=", "reason", "nightly"]]]),
            json!(["RATE_LIMIT", limit]),
        )
    };
    let mut cases = vec![
        // ----- case_reasonRateLimit: 3 jobs, at most 2 of them running.
        Case {
            queued: vec![hello(1)],
            started: &[1],
            ..base("reasonRateLimit: [j1] is not rate-limited")
        },
        Case {
            queued: vec![hello(1), hello(2)],
            started: &[1, 2],
            ..base("reasonRateLimit: [j1, j2] are not rate-limited")
        },
        Case {
            queued: vec![hello(1), hello(2), hello(3)],
            started: &[1, 2],
            ..base("reasonRateLimit: j3 is rate-limited")
        },
        Case {
            running: vec![(hello(1), Held::Running)],
            queued: vec![hello(2), hello(3)],
            started: &[2],
            ..base("reasonRateLimit: j3 is rate-limited, j1 running")
        },
        Case {
            running: vec![(hello(1), Held::Running), (hello(2), Held::Dying)],
            queued: vec![hello(3)],
            started: &[],
            ..base("reasonRateLimit: j3 is rate-limited, j2 manipulated (dying)")
        },
        Case {
            running: vec![(hello(1), Held::Running), (hello(2), Held::Claimant)],
            queued: vec![hello(3)],
            started: &[],
            ..base("reasonRateLimit: j3 is rate-limited, j2 manipulated (claimed)")
        },
        // ----- case_jobFiltering: rules of watermark 1, chained.
        Case {
            rules: chain(vec![fr("fr1", id_is_1(), json!("REJECT"))]),
            queued: vec![j(1)],
            rejected: &[1],
            ..base("jobFiltering: j1 is rejected (by fr1)")
        },
        Case {
            rules: chain(vec![
                fr("fr1", id_is_1(), json!("REJECT")),
                fr("fr2", id_is_1(), json!("ACCEPT")),
            ]),
            queued: vec![j(1)],
            rejected: &[1],
            ..base("jobFiltering: j1 is rejected (by fr1, it has priority)")
        },
        Case {
            rules: chain(vec![
                fr("fr2", id_is_1(), json!("ACCEPT")),
                fr("fr1", id_is_1(), json!("REJECT")),
            ]),
            queued: vec![j(1)],
            started: &[1],
            ..base("jobFiltering: j1 is accepted (by fr2, it has priority)")
        },
        Case {
            rules: chain(vec![fr("fr3", id_is_1(), json!("PAUSE"))]),
            queued: vec![j(1)],
            ..base("jobFiltering: j1 is paused (by fr3)")
        },
        Case {
            rules: chain(vec![fr("fr4", after_watermark(), json!("REJECT"))]),
            queued: vec![j(1), j(2)],
            started: &[1],
            rejected: &[2],
            ..base("jobFiltering: j2 is rejected (over watermark 1)")
        },
        Case {
            rules: chain(vec![fr("fr5", json!([]), json!("REJECT"))]),
            queued: vec![j(1), j(2)],
            rejected: &[1, 2],
            ..base("jobFiltering: all jobs are rejected (no predicates)")
        },
        Case {
            rules: chain(vec![
                fr("fr6", json!([]), json!("CONTINUE")),
                fr("fr7", json!([]), json!(["RATE_LIMIT", 2])),
            ]),
            queued: vec![j(1), j(2), j(3)],
            started: &[1, 2],
            ..base("jobFiltering: j3 is rate-limited (CONTINUE falls through)")
        },
        Case {
            rules: chain(vec![
                fr("fr8", after_watermark(), json!("CONTINUE")),
                fr("fr9", after_watermark(), json!(["RATE_LIMIT", 2])),
            ]),
            queued: vec![j(1), j(2), j(3), j(4)],
            // j1 is not after the watermark: no rule applies to it.
            started: &[1, 2, 3],
            ..base("jobFiltering: j4 is rate-limited (watermark)")
        },
    ];
    // ----- case_matchPredicate: job 1, watermark job 1; a PAUSE of the
    // predicate holds it if the predicate matches.
    let predicates: [(&str, Value, bool); 13] = [
        ("matching jobid", json!(["jobid", ["=", "id", 1]]), true),
        (
            "non-matching jobid",
            json!(["jobid", ["=", "id", 2]]),
            false,
        ),
        (
            "non-matching jobid (string passed)",
            json!(["jobid", ["=", "id", "1"]]),
            false,
        ),
        (
            "matching jobid watermark",
            json!(["jobid", ["=", "id", "watermark"]]),
            true,
        ),
        (
            "matching opcode (type of opcode)",
            json!(["opcode", ["=", "OP_ID", "OP_TEST_DELAY"]]),
            true,
        ),
        (
            "non-matching opcode (type of opcode)",
            json!(["opcode", ["=", "OP_ID", "OP_INSTANCE_CREATE"]]),
            false,
        ),
        (
            "matching opcode (field access)",
            json!(["opcode", ["=", "comment", "cluster1"]]),
            true,
        ),
        (
            "non-matching opcode (nonexistent field)",
            json!(["opcode", ["=", "something", "cluster1"]]),
            false,
        ),
        (
            "matching reason (reason field)",
            json!(["reason", ["=", "reason", "reason1"]]),
            true,
        ),
        (
            "non-matching reason (reason field)",
            json!(["reason", ["=", "reason", "reasonGarbage"]]),
            false,
        ),
        (
            "matching reason (source field)",
            json!(["reason", ["=", "source", "source1"]]),
            true,
        ),
        (
            "matching reason (timestamp field)",
            json!(["reason", ["=", "timestamp", 1234]]),
            true,
        ),
        (
            "non-matching reason (nonexistent field)",
            json!(["reason", ["=", "something", ""]]),
            false,
        ),
    ];
    for (name, predicate, matches) in predicates {
        cases.push(Case {
            rules: vec![rule("p", 0, 1, json!([predicate]), json!("PAUSE"))],
            queued: vec![j(1)],
            started: if matches { &[] } else { &[1] },
            ..base(name)
        });
    }
    cases.extend([
        // ----- prop_filterRuleOrder: (priority, watermark, uuid) alone.
        Case {
            rules: vec![
                rule("a", 1, 0, json!([]), json!("PAUSE")),
                rule("z", 0, 9, json!([]), json!("ACCEPT")),
            ],
            queued: vec![j(10)],
            started: &[10],
            ..base("filterRuleOrder: priority first")
        },
        Case {
            rules: vec![
                rule("a", 0, 1, json!([]), json!("ACCEPT")),
                rule("z", 0, 0, json!([]), json!("PAUSE")),
            ],
            queued: vec![j(2)],
            ..base("filterRuleOrder: then the watermark")
        },
        Case {
            rules: vec![
                rule("b", 0, 0, json!([]), json!("PAUSE")),
                rule("a", 0, 0, json!([]), json!("ACCEPT")),
            ],
            queued: vec![j(1)],
            started: &[1],
            ..base("filterRuleOrder: then the uuid")
        },
        Case {
            rules: vec![
                rule("a", 0, 0, json!([]), json!("CONTINUE")),
                rule(
                    "b",
                    0,
                    0,
                    json!([["jobid", ["=", "id", 9]]]),
                    json!("REJECT"),
                ),
                rule("c", 0, 0, json!([]), json!("PAUSE")),
                rule("d", 0, 0, json!([]), json!("ACCEPT")),
            ],
            queued: vec![j(1)],
            ..base("applyingFilter: the first matching rule that is not CONTINUE")
        },
        // ----- case_parseReasonRateLimit, prop_slotMapFromJob_conflicting
        // _buckets, case_hasSlotsFor, prop_reasonRateLimit: buckets.
        Case {
            queued: vec![
                j(1).reasons(&["rate-limit:2:a", "rate-limit:1:b"]),
                j(2).reasons(&["rate-limit:1:b"]),
                j(3).reasons(&["rate-limit:2:a"]),
                j(4).reasons(&["rate-limit:2:a", "plain"]),
            ],
            started: &[1, 3],
            ..base("reasonRateLimit: a job needs room in every bucket it is in")
        },
        Case {
            running: vec![
                (j(1).reasons(&["rate-limit:1:x"]), Held::Running),
                (j(2).reasons(&["rate-limit:1:x"]), Held::Running),
            ],
            queued: vec![
                j(3).reasons(&["rate-limit:1:x"]),
                j(4).reasons(&["rate-limit:1:y"]),
                j(5).reasons(&["rate-limit:1:y", "rate-limit:1:x"]),
            ],
            started: &[4],
            ..base("reasonRateLimit: an overfull bucket blocks only its own jobs")
        },
        Case {
            running: vec![(j(1).reasons(&["rate-limit:1:x"]), Held::Running)],
            queued: vec![
                j(2).reasons(&["rate-limit:2:x"]),
                j(3).reasons(&["rate-limit:1:x"]),
            ],
            started: &[2],
            ..base("slotMapFromJob: rate-limit:1:x and rate-limit:2:x are two buckets")
        },
        Case {
            queued: vec![
                j(1).opcodes(vec![
                    delay(0, &[("source1", "rate-limit:2:x", 0)]),
                    delay(0, &[("source2", "rate-limit:2:x", 0)]),
                ]),
                j(2).reasons(&["rate-limit:2:x"]),
                j(3).reasons(&["rate-limit:2:x"]),
            ],
            started: &[1, 2],
            ..base("labelCountMapFromJob: a job takes one place in a bucket")
        },
        Case {
            queued: vec![
                j(1).reasons(&[" rate-limit:1:x"]),
                j(2).reasons(&[" rate-limit:1:x"]),
                j(3).reasons(&["rate-limit:0:x"]),
                j(4).reasons(&["rate-limit:0:x"]),
            ],
            started: &[1, 2, 3, 4],
            ..base("parseReasonRateLimit: picky about whitespace, n positive")
        },
        Case {
            running: (1..=19)
                .map(|id| (j(id).reasons(&["rate-limit:20:my label"]), Held::Running))
                .collect(),
            queued: vec![
                j(20).reasons(&["rate-limit:20:my label"]),
                j(21).reasons(&["rate-limit:20:my label"]),
                j(22).reasons(&["rate-limit:21:my label"]),
            ],
            max_running: 30,
            started: &[20, 22],
            ..base("parseReasonRateLimit: rate-limit:20:my label")
        },
        // ----- RATE_LIMIT rules: started, unfinished jobs count.
        Case {
            running: vec![(j(1).reasons(&["nightly"]), Held::Running)],
            finished: vec![j(2).reasons(&["nightly"])],
            rules: vec![nightly_limit(2)],
            queued: vec![
                j(3).reasons(&["nightly"]),
                j(4).reasons(&["nightly"]),
                j(5).reasons(&["other"]),
            ],
            started: &[3, 5],
            ..base("RATE_LIMIT: a running job holds a slot, a finished one none")
        },
        Case {
            running: vec![
                (j(1).reasons(&["nightly"]), Held::Dying),
                (j(2).reasons(&["nightly"]), Held::Claimant),
            ],
            rules: vec![nightly_limit(2)],
            queued: vec![j(3).reasons(&["nightly"])],
            ..base("RATE_LIMIT: manipulated jobs hold slots")
        },
        Case {
            running: vec![(j(1), Held::Running)],
            rules: vec![
                rule(
                    "a",
                    0,
                    1,
                    json!([["jobid", ["<=", "id", "watermark"]]]),
                    json!("ACCEPT"),
                ),
                rule("b", 1, 1, json!([]), json!(["RATE_LIMIT", 1])),
            ],
            queued: vec![j(2), j(3)],
            started: &[2],
            ..base("RATE_LIMIT: a running job another rule applies to holds none")
        },
        Case {
            running: vec![(j(1), Held::Running)],
            rules: vec![
                rule(
                    "a",
                    0,
                    1,
                    json!([["jobid", ["<=", "id", "watermark"]]]),
                    json!("CONTINUE"),
                ),
                rule("b", 1, 1, json!([]), json!(["RATE_LIMIT", 1])),
            ],
            queued: vec![j(2), j(3)],
            ..base("RATE_LIMIT: a running job that fell through a CONTINUE holds one")
        },
        Case {
            running: vec![(j(1), Held::Running), (j(2), Held::Running)],
            rules: vec![rule("all", 0, 2, json!([]), json!(["RATE_LIMIT", 1]))],
            queued: vec![j(3)],
            ..base("RATE_LIMIT: an overfull rule starts nothing more")
        },
        Case {
            running: vec![(j(1), Held::Running)],
            rules: vec![rule("r", 0, 1, json!([]), json!("REJECT"))],
            queued: vec![j(2)],
            rejected: &[2],
            ..base("REJECT: only jobs not yet started are canceled")
        },
        // ----- selectJobsToRun: slots, priorities, dependencies.
        Case {
            max_running: 2,
            running: vec![(j(1), Held::Running)],
            queued: vec![j(2), j(3).priority(-10), j(4).priority(-10)],
            started: &[3],
            ..base("selectJobsToRun: the free slots, in priority order")
        },
        Case {
            max_running: 3,
            queued: vec![
                j(1),
                j(2).priority(10),
                j(3).priority(-10),
                j(4),
                j(5).priority(-10),
            ],
            started: &[1, 3, 5],
            ..base("selectJobsToRun: priority, then id")
        },
        Case {
            max_running: 2,
            running: vec![(j(1), Held::Running), (j(2), Held::Dying)],
            queued: vec![j(3)],
            ..base("selectJobsToRun: manipulated jobs take slots")
        },
        Case {
            max_running: 1,
            running: vec![(j(1), Held::Running), (j(2), Held::Running)],
            queued: vec![j(3)],
            ..base("selectJobsToRun: more running than slots starts nothing")
        },
        Case {
            max_running: 3,
            finished: vec![j(1)],
            queued: vec![
                j(2),
                j(3).depends(&[2]),
                j(4).depends(&[1]),
                j(5).depends(&[3]),
            ],
            started: &[2, 4],
            ..base("jobEligible: a job waits for the unfinished jobs it depends on")
        },
        Case {
            max_running: 1,
            rules: vec![rule(
                "p",
                0,
                0,
                json!([["reason", ["=", "reason", "nightly"]]]),
                json!("PAUSE"),
            )],
            queued: vec![
                j(1).reasons(&["nightly"]).priority(-10),
                j(2).reasons(&["rate-limit:1:x"]).priority(-10),
                j(3).reasons(&["rate-limit:1:x"]),
                j(4),
            ],
            started: &[2],
            ..base("selectJobsToRun: held jobs take no slot, the first that may start does")
        },
        // ----- The rules before the buckets (D60).
        Case {
            rules: vec![rule(
                "p",
                0,
                0,
                json!([["reason", ["=", "reason", "nightly"]]]),
                json!("PAUSE"),
            )],
            queued: vec![
                j(1).reasons(&["nightly", "rate-limit:1:x"]),
                j(2).reasons(&["rate-limit:1:x"]),
            ],
            started: &[2],
            ganeti: Some(&[]),
            ..base("D60: a paused job takes no bucket place")
        },
        Case {
            running: vec![(j(1).reasons(&["nightly"]), Held::Running)],
            rules: vec![nightly_limit(1)],
            queued: vec![
                j(2).reasons(&["nightly", "rate-limit:1:x"]),
                j(3).reasons(&["rate-limit:1:x"]),
            ],
            started: &[3],
            ganeti: Some(&[]),
            ..base("D60: a job its full RATE_LIMIT holds takes no bucket place")
        },
        Case {
            running: vec![(j(1).reasons(&["rate-limit:1:x"]), Held::Running)],
            rules: vec![nightly_limit(1)],
            queued: vec![
                j(2).reasons(&["nightly", "rate-limit:1:x"]),
                j(3).reasons(&["nightly"]),
            ],
            started: &[3],
            ..base("D60: a job its full bucket holds takes no rule slot (as Ganeti)")
        },
    ]);
    cases
}

/// The highest id of the case's started and finished jobs and of its
/// rules' watermarks: queued jobs up to it are found at start-up.
fn serial_of(case: &Case) -> JobId {
    let jobs = case
        .running
        .iter()
        .map(|(job, _)| job.id)
        .chain(case.finished.iter().map(|job| job.id));
    let watermarks = case.rules.iter().map(|rule| rule.watermark);
    jobs.chain(watermarks).max().unwrap_or(0)
}

/// The hold of the second run: every job paused, asked before any rule
/// of a case.
const HOLD: &str = "0-hold";

/// Runs a case through the core: the jobs started and the jobs rejected,
/// by id.
fn through_core(case: &Case, held_first: bool) -> (Vec<JobId>, Vec<JobId>) {
    let serial = serial_of(case);
    let mut restored = Restored {
        serial,
        filter_rules: case.rules.clone(),
        ..Restored::default()
    };
    if held_first {
        restored
            .filter_rules
            .push(rule(HOLD, 0, 0, json!([]), json!("PAUSE")));
    }
    for (spec, held) in &case.running {
        let mut job = spec.job();
        let id = job.id;
        restored.held.insert(id);
        match held {
            Held::Running | Held::Dying => {
                job = with_status(job, Status::Running);
                job.start_timestamp = Some(crate::jobs::Timestamp(1001, 0));
                job.livelock = Some(format!("/ll/job_{id:06}_1000"));
                job.process_id = Some(pid_of(id));
                if let Held::Running = held {
                    restored.watched.insert(id);
                }
            }
            Held::Claimant => {}
        }
        restored.jobs.push(job);
    }
    for spec in &case.finished {
        let mut job = with_status(spec.job(), Status::Success);
        job.end_timestamp = Some(crate::jobs::Timestamp(1002, 0));
        restored.jobs.push(job);
    }
    let mut submitted = Vec::new();
    for spec in &case.queued {
        if spec.id <= serial {
            restored.jobs.push(spec.job());
        } else {
            assert_eq!(
                spec.id,
                serial + 1 + submitted.len() as u64,
                "{}: submitted jobs take the next ids",
                case.name
            );
            submitted.push(spec.job());
        }
    }
    let mut shell = Shell::new(case.max_running, restored);
    let effects = shell.submit(submitted);
    let (mut started, _) = shell.settle(effects, usize::MAX);
    if held_first {
        assert!(
            started.is_empty(),
            "{}: the hold holds every job",
            case.name
        );
        let effects = shell.request(Command::DeleteFilter {
            uuid: HOLD.to_owned(),
        });
        let (now_started, replies) = shell.settle(effects, usize::MAX);
        assert_eq!(replies, [Ok(Answer::FilterDeleted)], "{}", case.name);
        started = now_started;
    }
    started.sort_unstable();
    let mut rejected = Vec::new();
    for spec in &case.queued {
        let id = spec.id;
        let status = shell.core.job(id).map(|job| job.status());
        if started.contains(&id) {
            assert!(shell.core.is_started(id), "{}: job {id} runs", case.name);
        } else if status == Some(Status::Canceled) {
            let job = shell.core.job(id).expect("known");
            assert!(
                job.ops[0]
                    .result
                    .as_str()
                    .is_some_and(|text| text.contains("rejected by filter rule")),
                "{}: job {id} is canceled by a rule: {:?}",
                case.name,
                job.ops[0].result
            );
            rejected.push(id);
        } else {
            assert!(
                shell.core.queued().any(|queued| queued == id),
                "{}: job {id} is neither started, rejected nor queued ({status:?})",
                case.name
            );
        }
    }
    for (spec, _) in &case.running {
        assert!(
            shell.core.is_started(spec.id),
            "{}: started job {} keeps its runner",
            case.name,
            spec.id
        );
    }
    (started, rejected)
}

/// Ganeti's `selectJobsToRun` and `cancelRejectedJobs`, transcribed: the
/// queued jobs no unfinished job blocks (`jobEligible`), stably sorted by
/// priority, through the buckets (`reasonRateLimit`, here
/// [`rate_limit::fitting`]), then the rules (`jobFiltering`, here
/// [`filters::decide`]), at most as many as there are free slots (running
/// and manipulated jobs both take one). The jobs started and the jobs
/// rejected, by id.
fn through_ganeti(case: &Case) -> (Vec<JobId>, Vec<JobId>) {
    let running: Vec<Job> = case.running.iter().map(|(spec, _)| spec.job()).collect();
    let queued: Vec<Job> = case.queued.iter().map(J::job).collect();
    let unfinished: BTreeSet<JobId> = running.iter().chain(&queued).map(|job| job.id).collect();
    let ordered = filters::ordered(&case.rules);
    let rejected = queued
        .iter()
        .filter(|job| {
            filters::applying(&ordered, *job).is_some_and(|rule| rule.action == RuleAction::Reject)
        })
        .map(|job| job.id)
        .collect();
    let free = case.max_running.saturating_sub(running.len());
    let mut eligible: Vec<&Job> = queued
        .iter()
        .filter(|job| {
            dependencies(job)
                .iter()
                .all(|dep| !unfinished.contains(dep))
        })
        .collect();
    eligible.sort_by_key(|job| job.priority());
    let buckets = |job: &Job| buckets_of(filters::reason_texts(job));
    let running_buckets: Vec<Vec<Bucket>> = running.iter().map(buckets).collect();
    let occupancy = Occupancy::of_running(running_buckets.iter().map(Vec::as_slice));
    let candidate_buckets: Vec<Vec<Bucket>> = eligible.iter().map(|job| buckets(job)).collect();
    let candidates: Vec<&[Bucket]> = candidate_buckets.iter().map(Vec::as_slice).collect();
    let fitting: Vec<&Job> = rate_limit::fitting(&occupancy, &candidates)
        .into_iter()
        .map(|index| eligible[index])
        .collect();
    let running_refs: Vec<&Job> = running.iter().collect();
    let decisions = filters::decide(&case.rules, &running_refs, &fitting);
    let mut started: Vec<JobId> = fitting
        .iter()
        .zip(decisions)
        .filter(|(_, decision)| matches!(decision, Decision::Run(_)))
        .map(|(job, _)| job.id)
        .take(free)
        .collect();
    started.sort_unstable();
    (started, rejected)
}

#[test]
fn ganetis_scheduler_cases_through_the_core() {
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for case in &cases {
        let expected = (case.started.to_vec(), case.rejected.to_vec());
        for held_first in [false, true] {
            assert_eq!(
                through_core(case, held_first),
                expected,
                "{} (the rules changed with the jobs waiting: {held_first})",
                case.name
            );
        }
        let ganeti = (
            case.ganeti.unwrap_or(case.started).to_vec(),
            case.rejected.to_vec(),
        );
        assert_eq!(
            through_ganeti(case),
            ganeti,
            "{}: Ganeti's pipeline",
            case.name
        );
    }
}
