//! The filter rules' semantics case by case (Ganeti's design-optables
//! examples and its `Filtering.hs` rules), data-driven: each case is rules
//! and jobs in their wire form, and the decisions expected.

use serde_json::{Value, json};

use super::filters::{Action, Decision, FilterRule, FilteredJob, decide};
use super::*;

struct Job {
    id: u64,
    opcodes: Vec<Value>,
}

impl FilteredJob for Job {
    fn id(&self) -> u64 {
        self.id
    }
    fn opcodes(&self) -> impl Iterator<Item = &Value> {
        self.opcodes.iter()
    }
}

fn job(id: u64, opcodes: Value) -> Job {
    Job {
        id,
        opcodes: opcodes.as_array().expect("a list of opcodes").clone(),
    }
}

fn delay(reason: &str) -> Value {
    json!({"OP_ID": "OP_TEST_DELAY", "duration": 1, "reason": [["gnt:client", reason, 1_700_000_000]]})
}

fn rule(uuid: &str, watermark: u64, priority: u64, predicates: Value, action: Value) -> FilterRule {
    let parts = decode_rule(&json!(priority), &predicates, &action).expect("a good rule");
    FilterRule::new(uuid.to_owned(), watermark, parts, json!([]))
}

fn short(decisions: Vec<Decision>) -> Vec<String> {
    decisions
        .into_iter()
        .map(|decision| match decision {
            Decision::Run(None) => "run".to_owned(),
            Decision::Run(Some(uuid)) => format!("run:{uuid}"),
            Decision::Pause(uuid) => format!("pause:{uuid}"),
            Decision::Reject(uuid) => format!("reject:{uuid}"),
            Decision::RateLimited(uuid) => format!("limited:{uuid}"),
        })
        .collect()
}

fn decisions(rules: &[FilterRule], running: &[Job], queued: &[Job]) -> Vec<String> {
    let running: Vec<&Job> = running.iter().collect();
    let queued: Vec<&Job> = queued.iter().collect();
    short(decide(rules, &running, &queued))
}

#[test]
fn the_first_matching_rule_that_is_not_continue_applies_in_priority_watermark_uuid_order() {
    let all = json!([["jobid", ["&"]]]);
    let cases = [
        // Lower priority number first.
        (
            vec![
                rule("b", 1, 10, all.clone(), json!("PAUSE")),
                rule("a", 9, 0, all.clone(), json!("ACCEPT")),
            ],
            "run:a",
        ),
        // Same priority: lower watermark first.
        (
            vec![
                rule("a", 9, 5, all.clone(), json!("PAUSE")),
                rule("b", 3, 5, all.clone(), json!("REJECT")),
            ],
            "reject:b",
        ),
        // Same priority and watermark: uuid decides.
        (
            vec![
                rule("y", 3, 5, all.clone(), json!("PAUSE")),
                rule("x", 3, 5, all.clone(), json!("REJECT")),
            ],
            "reject:x",
        ),
        // CONTINUE falls through to the next matching rule.
        (
            vec![
                rule("a", 1, 0, all.clone(), json!("CONTINUE")),
                rule("b", 1, 1, all.clone(), json!("PAUSE")),
            ],
            "pause:b",
        ),
        // Only CONTINUE: as if no rule applied.
        (vec![rule("a", 1, 0, all.clone(), json!("CONTINUE"))], "run"),
        // A rule whose predicates do not all match is skipped.
        (
            vec![
                rule(
                    "a",
                    1,
                    0,
                    json!([["jobid", ["&"]], ["jobid", ["=", "id", 99]]]),
                    json!("REJECT"),
                ),
                rule("b", 1, 1, all.clone(), json!("ACCEPT")),
            ],
            "run:b",
        ),
        // No predicates: matches every job.
        (vec![rule("a", 1, 0, json!([]), json!("PAUSE"))], "pause:a"),
    ];
    for (rules, expected) in cases {
        assert_eq!(
            decisions(&rules, &[], &[job(5, json!([delay("x")]))]),
            [expected],
            "{rules:?}"
        );
    }
}

#[test]
fn jobid_predicates_compare_ids_and_the_watermark_only() {
    let queued = [
        job(4, json!([delay("x")])),
        job(5, json!([delay("x")])),
        job(6, json!([delay("x")])),
    ];
    let cases = [
        // Jobs after the rule was made (Ganeti's example: pause new jobs).
        (json!([">", "id", "watermark"]), ["run", "run", "pause:r"]),
        (
            json!(["<=", "id", "watermark"]),
            ["pause:r", "pause:r", "run"],
        ),
        (json!(["=", "id", 4]), ["pause:r", "run", "run"]),
        (json!(["!=", "id", 4]), ["run", "pause:r", "pause:r"]),
        (
            json!(["|", ["=", "id", 4], ["=", "id", 6]]),
            ["pause:r", "run", "pause:r"],
        ),
        (json!(["!", ["<", "id", 5]]), ["run", "pause:r", "pause:r"]),
        // Anything but comparisons, other fields, other texts: false.
        (json!(["=", "id", "five"]), ["run", "run", "run"]),
        (json!(["=", "status", "queued"]), ["run", "run", "run"]),
        (json!(["=~", "id", "4"]), ["run", "run", "run"]),
        (json!(["?", "id"]), ["run", "run", "run"]),
        // One leaf that cannot be evaluated fails the whole predicate,
        // even under an "|" another operand would decide.
        (
            json!(["|", ["=", "id", 4], ["=", "bogus", 1]]),
            ["run", "run", "run"],
        ),
        (json!(["!", ["=", "bogus", 1]]), ["run", "run", "run"]),
    ];
    for (filter, expected) in cases {
        let rules = [rule(
            "r",
            5,
            0,
            json!([["jobid", filter.clone()]]),
            json!("PAUSE"),
        )];
        assert_eq!(decisions(&rules, &[], &queued), expected, "{filter}");
    }
}

#[test]
fn reason_predicates_look_at_every_reason_of_every_opcode() {
    let queued = [
        job(1, json!([delay("nightly build")])),
        job(2, json!([delay("other"), delay("rate-limit:2:x")])),
        job(3, json!([{"OP_ID": "OP_TEST_DELAY", "duration": 0}])),
    ];
    let cases = [
        (
            json!(["=", "reason", "nightly build"]),
            ["reject:r", "run", "run"],
        ),
        (
            json!(["=", "reason", "rate-limit:2:x"]),
            ["run", "reject:r", "run"],
        ),
        (
            json!(["=", "source", "gnt:client"]),
            ["reject:r", "reject:r", "run"],
        ),
        (
            json!([">", "timestamp", 1_600_000_000]),
            ["reject:r", "reject:r", "run"],
        ),
        // A text orders before any number (Ganeti's order of values).
        (json!(["<", "reason", 5]), ["reject:r", "reject:r", "run"]),
        (json!(["=~", "reason", "night"]), ["run", "run", "run"]),
        (json!(["=", "user", "me"]), ["run", "run", "run"]),
    ];
    for (filter, expected) in cases {
        let rules = [rule(
            "r",
            0,
            0,
            json!([["reason", filter.clone()]]),
            json!("REJECT"),
        )];
        assert_eq!(decisions(&rules, &[], &queued), expected, "{filter}");
    }
}

#[test]
fn opcode_predicates_match_any_opcode_by_dotted_paths_with_the_whole_language() {
    let exec = json!({"OP_ID": "OP_EXEC", "command": ["/bin/true"], "env": {"TIER": "gold"}});
    let queued = [
        job(1, json!([delay("x")])),
        job(2, json!([delay("x"), exec.clone()])),
        job(3, json!([exec])),
    ];
    let cases = [
        (
            json!(["=", "OP_ID", "OP_EXEC"]),
            ["run", "pause:r", "pause:r"],
        ),
        (
            json!(["=", "env.TIER", "gold"]),
            ["run", "pause:r", "pause:r"],
        ),
        (
            json!(["=~", "OP_ID", "DELAY$"]),
            ["pause:r", "pause:r", "run"],
        ),
        (
            json!(["&", ["=", "OP_ID", "OP_TEST_DELAY"], [">=", "duration", 1]]),
            ["pause:r", "pause:r", "run"],
        ),
        // A path an opcode lacks: false for that opcode.
        (
            json!(["!", ["=", "env.TIER", "gold"]]),
            ["run", "run", "run"],
        ),
        (json!(["=", "duration", "one"]), ["run", "run", "run"]),
    ];
    for (filter, expected) in cases {
        let rules = [rule(
            "r",
            0,
            0,
            json!([["opcode", filter.clone()]]),
            json!("PAUSE"),
        )];
        assert_eq!(decisions(&rules, &[], &queued), expected, "{filter}");
    }
}

#[test]
fn rate_limit_rules_count_running_jobs_they_apply_to_then_the_ones_let_through() {
    let delays = json!([["opcode", ["=", "OP_ID", "OP_TEST_DELAY"]]]);
    let rules = [
        rule("limit", 0, 0, delays, json!(["RATE_LIMIT", 2])),
        rule("other", 0, 1, json!([]), json!(["RATE_LIMIT", 1])),
    ];
    let exec = || json!([{"OP_ID": "OP_EXEC", "command": ["/bin/true"]}]);
    let running = [job(1, json!([delay("x")]))];
    let queued = [
        job(2, json!([delay("x")])),
        job(3, exec()),
        job(4, json!([delay("x")])),
        job(5, exec()),
    ];
    assert_eq!(
        decisions(&rules, &running, &queued),
        ["run:limit", "run:other", "limited:limit", "limited:other"]
    );
    // A running job another rule applies to takes none of this one's.
    let running = [job(1, exec())];
    assert_eq!(
        decisions(&rules, &running, &queued),
        ["run:limit", "limited:other", "run:limit", "limited:other"]
    );
}

#[test]
fn bad_rules_are_refused_naming_what_is_wrong() {
    let good_predicates = json!([["jobid", [">", "id", "watermark"]]]);
    let cases = [
        (
            json!(-1),
            good_predicates.clone(),
            json!("PAUSE"),
            "priority",
        ),
        (
            json!(1.5),
            good_predicates.clone(),
            json!("PAUSE"),
            "priority",
        ),
        (
            json!("1"),
            good_predicates.clone(),
            json!("PAUSE"),
            "priority",
        ),
        (json!(0), json!({"jobid": 1}), json!("PAUSE"), "predicates"),
        (
            json!(0),
            json!([["owner", ["=", "id", 1]]]),
            json!("PAUSE"),
            "predicate 0: unknown kind",
        ),
        (
            json!(0),
            json!([["jobid", ["~~", "id", 1]]]),
            json!("PAUSE"),
            "predicate 0: Unknown filter operand",
        ),
        (
            json!(0),
            json!([["opcode", ["=~", "OP_ID", "("]]]),
            json!("PAUSE"),
            "predicate 0: Invalid regular expression",
        ),
        (json!(0), json!([["jobid"]]), json!("PAUSE"), "predicate 0"),
        (
            json!(0),
            good_predicates.clone(),
            json!("DROP"),
            "action: unknown action",
        ),
        (
            json!(0),
            good_predicates.clone(),
            json!(["RATE_LIMIT", 0]),
            "action: RATE_LIMIT needs a positive",
        ),
        (
            json!(0),
            good_predicates.clone(),
            json!(["RATE_LIMIT", -2]),
            "action: RATE_LIMIT",
        ),
        (
            json!(0),
            good_predicates.clone(),
            json!(["RATE_LIMIT"]),
            "action",
        ),
        (json!(0), good_predicates.clone(), json!(7), "action"),
    ];
    for (priority, predicates, action, expected) in cases {
        match decode_rule(&priority, &predicates, &action) {
            Ok(parts) => panic!("accepted {priority} {predicates} {action}: {parts:?}"),
            Err(what) => assert!(
                what.starts_with(expected),
                "{what:?} should start with {expected:?}"
            ),
        }
    }
    let parts = decode_rule(&json!(3), &good_predicates, &json!(["RATE_LIMIT", 4])).expect("good");
    assert_eq!((parts.priority, parts.action), (3, Action::RateLimit(4)));
}
