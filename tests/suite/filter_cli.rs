//! `warden filter` end to end (SCHEDULING.md "From the command line"):
//! rules added, listed, shown, replaced and deleted with the real
//! `warden` binary against a real luxid, holding and releasing jobs
//! submitted with `warden exec`; bad usage refused before anything is
//! sent, and the rules luxid refuses answered with its message.

use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::{
    REFUSED, SUCCESS, USAGE, cluster_root, code, error_line, exec, expect, json_of, stderr, stdout,
    warden,
};
use crate::luxid::Cluster;
use crate::scheduling::{most_at_once, stays_queued};

const EXEC_PREDICATE: &str = r#"opcode:["=", "OP_ID", "OP_EXEC"]"#;

/// Every rule's uuid, as luxid answers `QueryFilters`.
fn stored_uuids(cluster: &Cluster) -> Value {
    cluster.client().ok("QueryFilters", json!([null, ["uuid"]]))
}

#[test]
fn a_pause_rule_holds_a_job_until_replaced_with_accept_and_is_listed_shown_and_deleted() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let added = json_of(
        &root,
        &[
            "filter",
            "add",
            "--priority",
            "5",
            "--predicate",
            EXEC_PREDICATE,
            "--action",
            "PAUSE",
            "--reason",
            "maintenance",
        ],
    );
    let pause = added["uuid"]
        .as_str()
        .unwrap_or_else(|| panic!("add printed {added}"))
        .to_owned();
    // Without --json: the uuid alone. Priority 0 applies before 5.
    let output = expect(&root, &["filter", "add"], SUCCESS);
    let first = stdout(&output).trim().to_owned();
    assert_eq!(first.len(), 36, "a uuid: {first:?}");

    let held = exec(&root, &[], &["/bin/true"]);
    stays_queued(&cluster, held, Duration::from_millis(300));

    let listed = stdout(&expect(&root, &["filter", "list"], SUCCESS));
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["UUID", "PRIORITY", "ACTION", "WATERMARK", "PREDICATES"]
    );
    let row = |line: &str| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row(lines[1]), [first.as_str(), "0", "CONTINUE", "0", "[]"]);
    assert_eq!(
        row(lines[2]),
        [
            pause.as_str(),
            "5",
            "PAUSE",
            "0",
            r#"[["opcode",["=","OP_ID","OP_EXEC"]]]"#
        ]
    );

    let rules = json_of(&root, &["filter", "list"]);
    let rules = rules.as_array().expect("a list of rules");
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert_eq!(rules[0]["uuid"], json!(first));
    let rule = &rules[1];
    assert_eq!(rule["uuid"], json!(pause));
    assert_eq!(rule["priority"], 5);
    assert_eq!(rule["watermark"], 0);
    assert_eq!(rule["action"], "PAUSE");
    assert_eq!(
        rule["predicates"],
        json!([["opcode", ["=", "OP_ID", "OP_EXEC"]]])
    );
    let trail = rule["reason_trail"].as_array().expect("a reason trail");
    assert_eq!(trail[0][0], "warden:client:filter", "{trail:?}");
    assert_eq!(trail[0][1], "maintenance", "{trail:?}");
    assert!(trail[0][2].as_u64().is_some(), "a timestamp: {trail:?}");
    assert_eq!(trail.last().expect("luxid's entry")[0], "luxid");

    let info = stdout(&expect(&root, &["filter", "info", &pause], SUCCESS));
    let field = |name: &str| {
        info.lines()
            .find(|line| line.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in {info}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(field("uuid"), pause);
    assert_eq!(field("priority"), "5");
    assert_eq!(field("watermark"), "0");
    assert_eq!(field("action"), "PAUSE");
    assert_eq!(
        field("predicates"),
        r#"[["opcode",["=","OP_ID","OP_EXEC"]]]"#
    );
    assert!(
        field("reason_trail").starts_with(r#"warden:client:filter "maintenance" "#),
        "{info}"
    );
    assert!(info.contains("luxid"), "luxid's entry too: {info}");
    let shown = json_of(&root, &["filter", "info", &pause, &first]);
    assert_eq!(shown, json!([rule, rules[0]]), "in the order asked for");

    let unknown = "0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
    let output = expect(&root, &["filter", "info", &pause, unknown], REFUSED);
    assert!(
        error_line(&output).contains(&format!("no filter rule with UUID {unknown}")),
        "{}",
        stderr(&output)
    );

    // Replaced with ACCEPT: same uuid, its predicates and priority kept,
    // and the held job runs.
    let replaced = json_of(&root, &["filter", "replace", &pause, "--action", "ACCEPT"]);
    assert_eq!(replaced, json!({ "uuid": pause }));
    assert_eq!(cluster.wait_final(held), "success");
    let rules = json_of(&root, &["filter", "info", &pause]);
    assert_eq!(rules[0]["action"], "ACCEPT");
    assert_eq!(rules[0]["priority"], 5);
    assert_eq!(rules[0]["predicates"], rule["predicates"]);
    assert_eq!(rules[0]["watermark"], json!(held));

    let output = expect(&root, &["filter", "delete", &pause], SUCCESS);
    assert_eq!(stdout(&output), "", "delete prints nothing");
    assert_eq!(
        json_of(&root, &["filter", "delete", &first]),
        json!({ "deleted": first })
    );
    assert_eq!(stored_uuids(&cluster), json!([]));
    let listed = stdout(&expect(&root, &["filter", "list"], SUCCESS));
    assert_eq!(listed.trim(), "no filter rules");
    assert_eq!(json_of(&root, &["filter", "list"]), json!([]));

    let output = expect(&root, &["filter", "delete", &pause], REFUSED);
    assert!(
        error_line(&output).contains(&format!("Filter rule with UUID {pause} does not exist")),
        "luxid's message: {}",
        stderr(&output)
    );
}

#[test]
fn a_rate_limit_rule_from_the_command_line_holds_its_jobs_to_n() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let added = json_of(
        &root,
        &[
            "filter",
            "add",
            "--predicate",
            r#"opcode:["=", "env.TIER", "limited"]"#,
            "--action",
            "RATE_LIMIT:1",
        ],
    );
    let rules = json_of(
        &root,
        &["filter", "info", added["uuid"].as_str().expect("uuid")],
    );
    assert_eq!(rules[0]["action"], json!(["RATE_LIMIT", 1]));
    let limited: Vec<u64> = (0..3)
        .map(|_| exec(&root, &["--env", "TIER=limited"], &["/bin/sleep", "0.2"]))
        .collect();
    let free: Vec<u64> = (0..2)
        .map(|_| exec(&root, &["--env", "TIER=free"], &["/bin/sleep", "0.5"]))
        .collect();
    for &id in limited.iter().chain(&free) {
        assert_eq!(cluster.wait_final(id), "success", "job {id}");
    }
    assert_eq!(most_at_once(&cluster, &limited), 1, "the rule's limit");
    assert_eq!(
        most_at_once(&cluster, &free),
        2,
        "jobs it does not apply to"
    );
}

#[test]
fn bad_usage_exits_2_naming_the_option_and_sends_nothing() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let uuid = "0f4c8e9a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
    let cases: [(&[&str], &str); 11] = [
        (&["filter", "add", "--action", "DROP"], "--action"),
        (&["filter", "add", "--action", "RATE_LIMIT:0"], "--action"),
        (&["filter", "add", "--action", "RATE_LIMIT"], "--action"),
        (&["filter", "add", "--predicate", "opcode"], "--predicate"),
        (
            &["filter", "add", "--predicate", r#"["opcode", null]"#],
            "--predicate",
        ),
        (
            &["filter", "add", "--predicate", r#"opcode:["=", "OP_ID""#],
            "--predicate",
        ),
        (&["filter", "add", "--predicates", "[["], "--predicates"),
        (&["filter", "add", "--priority", "x"], "--priority"),
        (
            &[
                "filter",
                "add",
                "--predicate",
                EXEC_PREDICATE,
                "--predicates",
                "[]",
            ],
            "--predicate",
        ),
        (&["filter", "replace", uuid, "--action", "NOPE"], "--action"),
        (
            &["filter", "replace", uuid, "--predicate", "jobid:"],
            "--predicate",
        ),
    ];
    for (args, option) in cases {
        let output = warden(&root, args);
        assert_eq!(code(&output), USAGE, "{args:?}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(option),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(stdout(&output), "", "{args:?}");
    }
    assert_eq!(stored_uuids(&cluster), json!([]), "nothing was sent");
}

#[test]
fn a_rule_luxid_refuses_exits_4_with_its_message() {
    let cluster = Cluster::start();
    let root = cluster_root(&cluster);
    let cases: [(&[&str], &str); 5] = [
        (
            &["filter", "add", "--predicate", r#"nodeid:["=", "id", 1]"#],
            r#"predicate 0: unknown kind "nodeid""#,
        ),
        (
            &[
                "filter",
                "add",
                "--predicate",
                r#"opcode:["~~", "OP_ID", "x"]"#,
            ],
            "predicate 0: Unknown filter operand '~~'",
        ),
        (
            &["filter", "add", "--predicates", r#"{"not": "a list"}"#],
            "predicates:",
        ),
        (
            &[
                "filter",
                "add",
                "--predicate",
                EXEC_PREDICATE,
                "--predicate",
                r#"opcode:["=~", "OP_ID", "("]"#,
            ],
            "predicate 1: Invalid regular expression: regex parse error: ( ^ error: unclosed group",
        ),
        (
            &["filter", "replace", "not-a-uuid", "--action", "PAUSE"],
            "Unable to parse UUID 'not-a-uuid'",
        ),
    ];
    for (args, message) in cases {
        let output = warden(&root, args);
        assert_eq!(code(&output), REFUSED, "{args:?}: {}", stderr(&output));
        let line = error_line(&output);
        assert!(line.contains(message), "{args:?}: {line}");
    }
    assert_eq!(stored_uuids(&cluster), json!([]), "nothing was stored");
}
