//! LUXI's generic `Query` and `QueryFields` of the `job` resource against
//! the real luxid (with real runners and wconfd): Ganeti's answer shape,
//! result statuses, the filter language over the socket, its errors, the
//! archive, and the frame limit.

use serde_json::{Value, json};

use crate::luxid::Cluster;

fn exec(argv: &[&str]) -> Value {
    json!([{"OP_ID": "OP_EXEC", "argv": argv}])
}

/// The `[status, value]` pairs of the first field of every row.
fn first_column(answer: &Value) -> Vec<Value> {
    answer["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|row| row[0].clone())
        .collect()
}

fn ids(answer: &Value) -> Vec<u64> {
    first_column(answer)
        .iter()
        .map(|cell| {
            assert_eq!(cell[0], json!(0), "an id is always normal: {cell}");
            cell[1].as_u64().expect("an id")
        })
        .collect()
}

/// Three finished jobs (1 and 2 succeed, 3 fails), job 1 archived, job 4
/// running `sleep` and job 5 queued behind it (one job runs at a time).
fn cluster_with_jobs() -> Cluster {
    let cluster = Cluster::start_with_settings("[luxid]\nmax_running_jobs = 1\n");
    for argv in [&["/bin/true"][..], &["/bin/true"], &["/bin/false"]] {
        let id = cluster.submit(exec(argv));
        cluster.wait_final(id);
    }
    assert_eq!(
        cluster.client().ok("ArchiveJob", json!([1])),
        json!(true),
        "{}",
        cluster.logs()
    );
    let running = cluster.submit(exec(&["/bin/sleep", "30"]));
    crate::daemon::wait_until("job 4 runs", crate::daemon::DEADLINE, || {
        cluster.status(running) == "running"
    });
    cluster.submit(exec(&["/bin/true"]));
    cluster
}

#[test]
fn query_answers_ganetis_shape_with_statuses_and_the_archive() {
    let cluster = cluster_with_jobs();
    let mut client = cluster.client();
    let answer = client.ok(
        "Query",
        json!(["job", ["id", "status", "nosuch", "start_ts"], null]),
    );
    assert_eq!(
        answer["fields"],
        json!([
            {"name": "id", "title": "ID", "kind": "number", "doc": "Job ID"},
            {"name": "status", "title": "Status", "kind": "text", "doc": "Job status"},
            {"name": "nosuch", "title": "nosuch", "kind": "unknown", "doc": "Unknown field 'nosuch'"},
            {"name": "start_ts", "title": "Start", "kind": "other",
             "doc": "Timestamp of job start (tuple containing seconds and microseconds)"},
        ])
    );
    // Without "archived" among the fields, the archive is not looked at.
    assert_eq!(ids(&answer), [2, 3, 4, 5]);
    let rows = answer["data"].as_array().expect("rows");
    assert_eq!(rows[0][1], json!([0, "success"]));
    assert_eq!(rows[1][1], json!([0, "error"]));
    assert_eq!(rows[2][1], json!([0, "running"]));
    assert_eq!(rows[3][1], json!([0, "queued"]));
    for row in rows {
        assert_eq!(row[2], json!([1, null]), "an unknown field: {row}");
    }
    // A queued job has no start time: unavailable.
    assert_eq!(rows[3][3], json!([3, null]));
    assert_eq!(rows[0][3][0], json!(0));
    // With it, archived jobs are listed too.
    let answer = client.ok("Query", json!(["job", ["id", "archived"], null]));
    assert_eq!(ids(&answer), [1, 2, 3, 4, 5]);
    assert_eq!(answer["data"][0][1], json!([0, true]));
    assert_eq!(answer["data"][1][1], json!([0, false]));
    // Jobs asked for by id are found in the archive whatever the fields;
    // one that does not exist has its id and nothing else.
    let answer = client.ok(
        "Query",
        json!([
            "job",
            ["id", "status", "archived"],
            ["|", ["=", "id", 9], ["==", "id", 1]]
        ]),
    );
    assert_eq!(
        answer["data"],
        json!([
            [[0, 9], [3, null], [3, null]],
            [[0, 1], [0, "success"], [0, true]],
        ])
    );
    cluster.client().ok("CancelJob", json!([4, true]));
}

#[test]
fn every_operator_filters_over_the_socket() {
    let cluster = cluster_with_jobs();
    let mut client = cluster.client();
    let query = |client: &mut crate::daemon::Client, filter: Value| -> Vec<u64> {
        ids(&client.ok("Query", json!(["job", ["id"], filter])))
    };
    let cases = [
        (json!(["=", "status", "success"]), vec![2]),
        (json!(["==", "status", "error"]), vec![3]),
        (json!(["!=", "status", "success"]), vec![3, 4, 5]),
        (json!(["<", "id", 4]), vec![2, 3]),
        (json!(["<=", "id", 4]), vec![2, 3, 4]),
        (json!([">", "id", 4]), vec![5]),
        (json!([">=", "id", 4]), vec![4, 5]),
        (json!(["=~", "status", "^(run|que)"]), vec![4, 5]),
        (json!(["=[]", "opstatus", "error"]), vec![3]),
        (json!(["=[]", "summary", "EXEC(/bin/sleep)"]), vec![4]),
        (json!(["!", ["?", "archived"]]), vec![2, 3, 4, 5]),
        (
            json!([
                "&",
                [">", "id", 2],
                ["|", ["=", "status", "queued"], ["=", "status", "error"]]
            ]),
            vec![3, 5],
        ),
        (json!(["|"]), vec![]),
        (json!(["&"]), vec![2, 3, 4, 5]),
        // A job not started has no start time and passes a leaf on it.
        (json!([">", "start_ts", 4_000_000_000u64]), vec![5]),
        (
            json!(["<", "received_ts", 4_000_000_000u64]),
            vec![2, 3, 4, 5],
        ),
    ];
    for (filter, expected) in cases {
        assert_eq!(query(&mut client, filter.clone()), expected, "{filter}");
    }
    cluster.client().ok("CancelJob", json!([4, true]));
}

#[test]
fn bad_filters_are_refused_as_ganeti_refuses_them() {
    let cluster = Cluster::start();
    let id = cluster.submit(exec(&["/bin/true"]));
    cluster.wait_final(id);
    let mut client = cluster.client();
    let cases = [
        // An unknown field inside the filter refuses the query.
        (
            json!(["=", "nosuch", 1]),
            "ParameterError",
            "Can't find field named 'nosuch'",
        ),
        // Values that cannot answer what the filter asks.
        (
            json!(["=", "status", 1]),
            "ParameterError",
            "Invalid types in comparison, trying to compare \"success\" with '1'",
        ),
        (
            json!(["?", "status"]),
            "ParameterError",
            "Unexpected value '\"success\"' in boolean context",
        ),
        (
            json!(["=~", "id", "1"]),
            "ParameterError",
            "Invalid field value used in regexp matching, expecting string but got '1'",
        ),
        (
            json!(["=[]", "status", "x"]),
            "GenericError",
            "Cannot convert value",
        ),
        // Malformed filters.
        (
            json!(["~", "id", 1]),
            "GenericError",
            "Unknown filter operand '~'",
        ),
        (
            json!(["=", "id"]),
            "GenericError",
            "expected [fieldname, value]",
        ),
        (
            json!(["=", "id", true]),
            "GenericError",
            "expecting string or integer",
        ),
        (
            json!(["=~", "status", "("]),
            "GenericError",
            "Invalid regular expression",
        ),
        (json!("id"), "GenericError", "expected array [string, args]"),
        (
            json!(["=", "id", -1]),
            "GenericError",
            "Invalid value for job ID ' -1'",
        ),
    ];
    for (filter, class, text) in cases {
        let (got_class, message) = client.fails("Query", json!(["job", ["id"], filter.clone()]));
        assert_eq!(got_class, class, "{filter}: {message}");
        assert!(message.contains(text), "{filter}: {message}");
    }
    // Not a resource warden answers, wrong shapes.
    let (class, message) = client.fails("Query", json!(["node", ["name"], null]));
    assert_eq!(
        (class.as_str(), message.as_str()),
        (
            "GenericError",
            "Query 'node' not supported (warden answers 'job' and 'filter')"
        )
    );
    let (class, _) = client.fails("Query", json!(["job", "id", null]));
    assert_eq!(class, "GenericError");
    let (class, _) = client.fails("QueryFields", json!(["job"]));
    assert_eq!(class, "GenericError");
    // The connection still serves.
    let answer = client.ok("Query", json!(["job", ["id"], ["=", "id", id]]));
    assert_eq!(ids(&answer), [id]);
}

#[test]
fn query_fields_lists_every_field_sorted_or_the_named_ones() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let all = client.ok("QueryFields", json!(["job", null]));
    let names: Vec<&str> = all["fields"]
        .as_array()
        .expect("fields")
        .iter()
        .map(|def| def["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(
        names,
        [
            "archived",
            "end_ts",
            "id",
            "opend",
            "opexec",
            "oplog",
            "oppriority",
            "opresult",
            "ops",
            "opstart",
            "opstatus",
            "priority",
            "received_ts",
            "start_ts",
            "status",
            "summary"
        ]
    );
    assert_eq!(client.ok("QueryFields", json!(["job", []])), all);
    assert_eq!(
        client.ok("QueryFields", json!(["job", ["priority", "x"]])),
        json!({"fields": [
            {"name": "priority", "title": "Priority", "kind": "number",
             "doc": "Current job priority (19 to -20)"},
            {"name": "x", "title": "x", "kind": "unknown", "doc": "Unknown field 'x'"},
        ]})
    );
}

#[test]
fn a_query_answer_past_the_frame_limit_is_refused() {
    let cluster = Cluster::start_with_settings("[luxid]\nframe_bytes_max = 4096\n");
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(cluster.submit(exec(&["/bin/echo", &"x".repeat(600)])));
    }
    for id in &ids {
        cluster.wait_final(*id);
    }
    let mut client = cluster.client();
    let (class, message) = client.fails("Query", json!(["job", ["id", "oplog"], null]));
    assert_eq!(class, "GenericError");
    assert!(message.contains("frame limit of 4096 bytes"), "{message}");
    // A smaller answer is still given.
    let answer = client.ok("Query", json!(["job", ["id", "status"], null]));
    assert_eq!(answer["data"].as_array().map(Vec::len), Some(8));
}
