//! Bad input never crashes wconfd or changes its state: malformed frames,
//! ill-formed requests for every method, bad lock names, levels and
//! owners, and every limit exceeded (frame size, entries per request,
//! connections, settings), stalled and vanishing clients. After each, the
//! daemon still answers a new connection and its lock table and waiters
//! are unchanged.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;

use serde_json::{Value, json};

use crate::corpus::{
    Accepts, Method, bad_envelopes, bad_frames, check_frame_limit, send_expecting_errors,
};
use crate::daemon::{Client, DEADLINE, OwnerProcess, Root, Wconfd, wait_until};

/// A daemon with some locks and a waiter, and what its state must stay.
struct Fixture {
    wconfd: Wconfd,
    jobs: Vec<OwnerProcess>,
    baseline: Value,
}

impl Fixture {
    fn start() -> Fixture {
        Fixture::with(Wconfd::start())
    }

    fn with_settings(toml: &str) -> Fixture {
        Fixture::with(Wconfd::start_with_settings(toml))
    }

    /// J1 holds the BGL and node/n1, J2 waits for node/n1; J3 holds
    /// nothing.
    fn with(wconfd: Wconfd) -> Fixture {
        let jobs: Vec<OwnerProcess> = (1..=3)
            .map(|id| OwnerProcess::spawn(&wconfd.livelock_dir(), id))
            .collect();
        let mut client = wconfd.client();
        let held = json!([["cluster/BGL", "shared"], ["node/n1", "exclusive"]]);
        assert_eq!(
            client.ok("tryUpdateLocks", json!([jobs[0].owner(), held])),
            json!([])
        );
        assert_eq!(
            client.ok(
                "updateLocksWaiting",
                json!([jobs[1].owner(), 1, [["node/n1", "shared"]]])
            ),
            json!([jobs[0].owner()])
        );
        let baseline = client.ok("listLocksWaitingStatus", json!([]));
        Fixture {
            wconfd,
            jobs,
            baseline,
        }
    }

    /// J1, as on the wire.
    fn owner(&self) -> Value {
        self.jobs[0].owner()
    }

    /// The daemon runs, answers a new connection, and its state is the
    /// baseline.
    fn assert_unchanged(&mut self) {
        let mut client = self.wconfd.client();
        self.assert_unchanged_over(&mut client);
    }

    /// As [`Fixture::assert_unchanged`], over a given connection.
    fn assert_unchanged_over(&mut self, client: &mut Client) {
        assert!(
            self.wconfd.is_running(),
            "wconfd exited:\n{}",
            self.wconfd.log()
        );
        assert_eq!(client.ok("echo", json!(["alive"])), json!("alive"));
        assert_eq!(
            client.ok("listLocksWaitingStatus", json!([])),
            self.baseline,
            "bad input changed the state"
        );
    }
}

/// Sends raw bytes; the answer must be a `GenericError` whose message
/// contains `expected`.
fn assert_refused_raw(client: &mut Client, frame: &[u8], expected: &str) {
    client.send_raw(frame).expect("send");
    let shown = String::from_utf8_lossy(&frame[..frame.len().min(60)]).into_owned();
    match client.read_response().expect("an answer") {
        Ok(value) => panic!("{shown:?} answered {value}"),
        Err((class, args)) => {
            let message = crate::daemon::message(&args);
            assert_eq!(class, "GenericError", "{shown:?}: {message}");
            assert!(
                message.contains(expected),
                "{shown:?}: {message:?} does not say {expected:?}"
            );
        }
    }
}

/// The call must fail with a `GenericError` whose message contains
/// `expected`.
fn assert_refused(client: &mut Client, method: &str, args: Value, expected: &str) {
    let (class, message) = client.fails(method, args.clone());
    assert_eq!(class, "GenericError", "{method} {args}: {message}");
    assert!(
        message.contains(expected),
        "{method} {args}: {message:?} does not say {expected:?}"
    );
}

// ----- frames and envelopes -----

#[test]
fn malformed_requests_are_answered_and_the_connection_stays_usable() {
    let mut fixture = Fixture::start();
    let mut client = fixture.wconfd.client();
    let deep = format!("{}\x03", "[".repeat(100_000));
    let deep_balanced = format!(
        "{{\"method\": \"echo\", \"args\": [{}{}]}}\x03",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let long_method = format!(
        "{{\"method\": \"{}\", \"args\": []}}\x03",
        "m".repeat(10_000)
    );
    let cases: Vec<(&[u8], &str)> = vec![
        (b"{\"method\": \x03", "not valid JSON"),
        (b"\xff\xfe{}\x03", "not valid UTF-8"),
        (
            b"{\"method\": \"echo\", \"args\": [\"\xc3\x28\"]}\x03",
            "not valid UTF-8",
        ),
        (deep.as_bytes(), "not valid JSON"),
        (deep_balanced.as_bytes(), "recursion limit"),
        (b"\x03", "not valid JSON"),
        (b"  \n\x03", "not valid JSON"),
        (
            b"{\"method\": \"echo\", \"args\": [\"a\"]} {}\x03",
            "not valid JSON",
        ),
        (b"[\"echo\", [\"a\"]]\x03", "not a JSON object"),
        (b"\"echo\"\x03", "not a JSON object"),
        (b"null\x03", "not a JSON object"),
        (b"{\"args\": []}\x03", "no field 'method'"),
        (
            b"{\"method\": 1, \"args\": []}\x03",
            "'method' is not a string",
        ),
        (
            b"{\"method\": null, \"args\": []}\x03",
            "'method' is not a string",
        ),
        (b"{\"method\": \"echo\"}\x03", "no field 'args'"),
        (
            b"{\"method\": \"echo\", \"args\": {}}\x03",
            "'args' is not a list",
        ),
        (
            b"{\"method\": \"echo\", \"args\": \"x\"}\x03",
            "'args' is not a list",
        ),
        (
            b"{\"method\": \"noSuchMethod\", \"args\": []}\x03",
            "unknown method 'noSuchMethod'",
        ),
        (b"{\"method\": \"\", \"args\": []}\x03", "unknown method ''"),
        (
            b"{\"method\": \"TryUpdateLocks\", \"args\": []}\x03",
            "unknown method",
        ),
        (long_method.as_bytes(), "unknown method 'mmmm"),
    ];
    for (frame, expected) in cases {
        assert_refused_raw(&mut client, frame, expected);
        assert_eq!(client.ok("echo", json!(["next"])), json!("next"));
    }
    fixture.assert_unchanged();
}

#[test]
fn an_etx_inside_a_string_splits_the_frame_and_the_stream_resynchronises() {
    let mut fixture = Fixture::start();
    let mut client = fixture.wconfd.client();
    client
        .send_raw(b"{\"method\": \"echo\", \"args\": [\"a\x03b\"]}\x03")
        .expect("send");
    for _ in 0..2 {
        let (class, _) = client
            .read_response()
            .expect("an answer")
            .expect_err("half a request is refused");
        assert_eq!(class, "GenericError");
    }
    assert_eq!(client.ok("echo", json!(["a\u{3}b"])), json!("a\u{3}b"));
    fixture.assert_unchanged();
}

/// Every method and its number of arguments.
const METHODS: [(&str, usize); 22] = [
    ("echo", 1),
    ("cleanupLocks", 0),
    ("readConfig", 0),
    ("verifyConfig", 0),
    ("flushConfig", 0),
    ("listAllLocks", 0),
    ("listLocksWaitingStatus", 0),
    ("writeConfig", 2),
    ("writeConfigAndUnlock", 2),
    ("lockConfig", 2),
    ("unlockConfig", 1),
    ("listLocks", 1),
    ("hasPendingRequest", 1),
    ("freeLocks", 1),
    ("tryUpdateLocks", 2),
    ("updateLocksWaiting", 3),
    ("checkFence", 3),
    ("freeLocksLevel", 2),
    ("downGradeLocksLevel", 2),
    ("intersectLocks", 2),
    ("opportunisticLockUnion", 2),
    ("guardedOpportunisticLockUnion", 3),
];

/// The methods whose last arguments are optional (extensions of Ganeti's
/// methods, and `whatIfLocks`): fewest and most arguments.
const RANGED_METHODS: [(&str, usize, usize); 3] = [
    ("listAllLocksOwners", 0, 1),
    ("awaitLocks", 4, 5),
    ("whatIfLocks", 2, 3),
];

#[test]
fn wrong_argument_counts_are_refused_for_every_method() {
    let mut fixture = Fixture::start();
    let mut client = fixture.wconfd.client();
    for (method, count) in METHODS {
        let mut wrong = vec![count + 1, count + 5];
        if count > 0 {
            wrong.push(count - 1);
        }
        for got in wrong {
            // J1 in every position: the count is checked first.
            let args = Value::Array(vec![fixture.owner(); got]);
            let expected = format!(
                "{method} takes {count} argument{}, got {got}",
                if count == 1 { "" } else { "s" }
            );
            assert_refused(&mut client, method, args, &expected);
        }
    }
    for (method, fewest, most) in RANGED_METHODS {
        let mut wrong = vec![most + 1, most + 5];
        if fewest > 0 {
            wrong.push(fewest - 1);
        }
        for got in wrong {
            let args = Value::Array(vec![fixture.owner(); got]);
            let expected = format!("{method} takes {fewest} to {most} arguments, got {got}");
            assert_refused(&mut client, method, args, &expected);
        }
    }
    fixture.assert_unchanged();
}

/// Values that are not owners (`[ident, livelock, pid]` with the livelock
/// directly in the livelock directory), each with what the error says.
fn bad_owners(fixture: &Fixture) -> Vec<(Value, &'static str)> {
    let dir = fixture.wconfd.livelock_dir();
    let path = fixture.jobs[0].path().to_str().expect("UTF-8").to_owned();
    let pid = fixture.jobs[0].pid();
    let dir_text = dir.to_str().expect("UTF-8").to_owned();
    let outside = |path: String| (json!([1, path, pid]), "livelock path");
    vec![
        (json!(null), "is not an owner"),
        (json!(1), "is not an owner"),
        (json!("J1"), "is not an owner"),
        (json!([]), "is not an owner"),
        (json!([1, path]), "is not an owner"),
        (json!([1, path, pid, 0]), "is not an owner"),
        (json!({"ident": 1}), "is not an owner"),
        (json!([-1, path, pid]), "ident"),
        (json!([1.5, path, pid]), "ident"),
        (json!([true, path, pid]), "ident"),
        (json!([null, path, pid]), "ident"),
        (json!([[1], path, pid]), "ident"),
        (json!([1, 7, pid]), "livelock path that is not a string"),
        (json!([1, null, pid]), "livelock path that is not a string"),
        (json!([1, path, 0]), "pid"),
        (json!([1, path, -1]), "pid"),
        (json!([1, path, 2_147_483_648u64]), "pid"),
        (json!([1, path, 1.5]), "pid"),
        (json!([1, path, pid.to_string()]), "pid"),
        outside("/tmp/job_000001_1".to_owned()),
        outside("job_000001_1".to_owned()),
        outside(format!("{dir_text}/../job_000001_1")),
        outside(format!("{dir_text}/sub/job_000001_1")),
        outside(format!("{dir_text}/./job_000001_1")),
        outside(format!("{dir_text}//job_000001_1")),
        outside(format!("{dir_text}/")),
        outside(dir_text.clone()),
        outside(format!("{dir_text}/..")),
        outside(format!("{dir_text}/{}", "x".repeat(256))),
        outside(format!("{dir_text}2/job_000001_1")),
    ]
}

#[test]
fn bad_owners_are_refused_by_every_method_that_takes_one() {
    let mut fixture = Fixture::start();
    let mut client = fixture.wconfd.client();
    let config = client.ok("readConfig", json!([]));
    let request = json!([["node/n9", "exclusive"]]);
    for (bad, expected) in bad_owners(&fixture) {
        let calls = [
            ("writeConfig", json!([bad, config])),
            ("writeConfigAndUnlock", json!([bad, config])),
            ("lockConfig", json!([bad, false])),
            ("unlockConfig", json!([bad])),
            ("listLocks", json!([bad])),
            ("hasPendingRequest", json!([bad])),
            ("freeLocks", json!([bad])),
            ("tryUpdateLocks", json!([bad, request])),
            ("updateLocksWaiting", json!([bad, 0, request])),
            ("awaitLocks", json!([bad, 0, request, 10])),
            ("freeLocksLevel", json!([bad, "node"])),
            ("downGradeLocksLevel", json!([bad, "node"])),
            ("intersectLocks", json!([bad, []])),
            ("opportunisticLockUnion", json!([bad, request])),
            ("guardedOpportunisticLockUnion", json!([1, bad, request])),
            ("checkFence", json!([bad, "node/n9", 1])),
            ("whatIfLocks", json!([bad, request])),
        ];
        for (method, args) in calls {
            assert_refused(&mut client, method, args, expected);
        }
    }
    // The longest livelock name is fine.
    let longest = format!(
        "{}/{}",
        fixture.wconfd.livelock_dir().display(),
        "x".repeat(255)
    );
    assert_eq!(
        client.ok("listLocks", json!([[1, longest, fixture.jobs[0].pid()]])),
        json!([])
    );
    fixture.assert_unchanged();
}

#[test]
fn ill_typed_arguments_are_refused_for_every_method() {
    let mut fixture = Fixture::start();
    let mut client = fixture.wconfd.client();
    let j1 = fixture.owner();
    let requests = [
        json!(null),
        json!({}),
        json!("node/n9"),
        json!([["node/n9"]]),
        json!([["node/n9", "exclusive", 1]]),
        json!([["node/n9", "own"]]),
        json!([["node/n9", null]]),
        json!([[1, "shared"]]),
        json!(["node/n9"]),
        json!([["nodes/n9", "shared"]]),
    ];
    let lock_lists = [
        json!(null),
        json!("node/n1"),
        json!([1]),
        json!(["nodes/n1"]),
        json!([["node/n1", "shared"]]),
    ];
    let lock_modes = [
        json!(null),
        json!([["node/n9", "release"]]),
        json!([["node/n9"]]),
        json!(["node/n9"]),
        json!([["node", "shared"]]),
    ];
    let levels = [
        json!(null),
        json!(3),
        json!("nodes"),
        json!(""),
        json!("Node"),
        json!("node/n1"),
    ];
    let priorities = [
        json!(null),
        json!("0"),
        json!(1.5),
        json!(9_223_372_036_854_775_808u64),
    ];
    let mut cases: Vec<(&str, Value, &str)> = vec![
        ("echo", json!([1]), "argument 1 is not a string"),
        ("echo", json!([null]), "argument 1 is not a string"),
        ("echo", json!([["x"]]), "argument 1 is not a string"),
        (
            "lockConfig",
            json!([j1, "yes"]),
            "argument 2 is not a boolean",
        ),
        ("lockConfig", json!([j1, 0]), "argument 2 is not a boolean"),
        (
            "lockConfig",
            json!([j1, null]),
            "argument 2 is not a boolean",
        ),
        (
            "awaitLocks",
            json!([j1, 0, [["node/n9", "shared"]], -1]),
            "argument 4",
        ),
        (
            "awaitLocks",
            json!([j1, 0, [["node/n9", "shared"]], "10"]),
            "argument 4",
        ),
        (
            "awaitLocks",
            json!([j1, 0, [["node/n9", "shared"]], 1.5]),
            "argument 4",
        ),
        (
            "awaitLocks",
            json!([j1, 0, [["node/n9", "shared"]], 3_600_001]),
            "over the limit of 3600000 ms",
        ),
        (
            "guardedOpportunisticLockUnion",
            json!([-1, j1, []]),
            "argument 1",
        ),
        (
            "guardedOpportunisticLockUnion",
            json!(["1", j1, []]),
            "argument 1",
        ),
        (
            "guardedOpportunisticLockUnion",
            json!([null, j1, []]),
            "argument 1",
        ),
    ];
    for config in [json!([]), json!("config"), json!(null), json!(1)] {
        for method in ["writeConfig", "writeConfigAndUnlock"] {
            cases.push((
                method,
                json!([j1, config]),
                "argument 2 is not a configuration object",
            ));
        }
    }
    let options = [
        (
            json!({"fenc": true}),
            "has the unknown option \"fenc\" (known: fence)",
        ),
        (json!({"fence": 1}), "option \"fence\" is not a boolean"),
        (json!({"fence": null}), "option \"fence\" is not a boolean"),
        (json!(["fence"]), "is not an object of options"),
        (json!("fence"), "is not an object of options"),
    ];
    for (option, expected) in &options {
        let request = json!([["node/n9", "shared"]]);
        cases.push(("awaitLocks", json!([j1, 0, request, 10, option]), expected));
    }
    cases.push((
        "listAllLocksOwners",
        json!([{"token": true}]),
        "argument 1 has the unknown option \"token\" (known: tokens)",
    ));
    cases.push((
        "listAllLocksOwners",
        json!([true]),
        "argument 1 is not an object of options",
    ));
    for lock in [json!(null), json!(1), json!("nodes/n1"), json!(["node/n1"])] {
        cases.push(("checkFence", json!([j1, lock, 1]), "argument 2"));
    }
    for token in [json!(null), json!(-1), json!("1"), json!(1.5)] {
        cases.push(("checkFence", json!([j1, "node/n1", token]), "argument 3"));
    }
    for priority in &priorities {
        let request = json!([["node/n9", "shared"]]);
        cases.push(("whatIfLocks", json!([j1, request, priority]), "argument 3"));
    }
    for request in &requests {
        cases.push(("whatIfLocks", json!([j1, request]), "argument 2"));
        cases.push(("tryUpdateLocks", json!([j1, request]), "argument 2"));
        cases.push(("updateLocksWaiting", json!([j1, 0, request]), "argument 3"));
        cases.push(("awaitLocks", json!([j1, 0, request, 10]), "argument 3"));
    }
    for list in &lock_lists {
        cases.push(("intersectLocks", json!([j1, list]), "argument 2"));
    }
    for wanted in &lock_modes {
        cases.push(("opportunisticLockUnion", json!([j1, wanted]), "argument 2"));
        cases.push((
            "guardedOpportunisticLockUnion",
            json!([1, j1, wanted]),
            "argument 3",
        ));
    }
    for level in &levels {
        cases.push(("freeLocksLevel", json!([j1, level]), "argument 2"));
        cases.push(("downGradeLocksLevel", json!([j1, level]), "argument 2"));
    }
    for priority in &priorities {
        let request = json!([["node/n9", "shared"]]);
        cases.push((
            "updateLocksWaiting",
            json!([j1, priority, request]),
            "argument 2",
        ));
        cases.push((
            "awaitLocks",
            json!([j1, priority, request, 10]),
            "argument 2",
        ));
    }
    for (method, args, expected) in cases {
        // Decoding errors name the method and the argument.
        let (class, message) = client.fails(method, args.clone());
        assert_eq!(class, "GenericError", "{method} {args}: {message}");
        assert!(
            message.starts_with(&format!("{method}: ")) && message.contains(expected),
            "{method} {args}: {message:?} does not say {expected:?}"
        );
    }
    fixture.assert_unchanged();
}

#[test]
fn bad_lock_names_and_levels_are_refused_naming_them() {
    let mut fixture = Fixture::start();
    let mut client = fixture.wconfd.client();
    let j1 = fixture.owner();
    let too_long = format!("node/{}", "x".repeat(1020));
    let names = [
        ("nodes/n1", "'nodes/n1'"),
        ("node/", "'node/'"),
        ("node", "'node'"),
        ("/n1", "'/n1'"),
        ("", "''"),
        ("cluster/foo", "'cluster/foo'"),
        ("cluster/", "'cluster/'"),
        ("config/x", "'config/x'"),
        ("Node/n1", "'Node/n1'"),
        (too_long.as_str(), "longer than the limit of 1024"),
    ];
    for (name, expected) in names {
        let request = json!([[name, "shared"]]);
        assert_refused(
            &mut client,
            "tryUpdateLocks",
            json!([j1, request]),
            expected,
        );
        assert_refused(
            &mut client,
            "updateLocksWaiting",
            json!([fixture.jobs[2].owner(), 0, request]),
            expected,
        );
        assert_refused(
            &mut client,
            "opportunisticLockUnion",
            json!([j1, request]),
            expected,
        );
        assert_refused(&mut client, "intersectLocks", json!([j1, [name]]), expected);
    }
    for level in ["nodes", "", "lockset", "cluster/BGL", "NODE"] {
        let expected = format!("'{level}'");
        assert_refused(&mut client, "freeLocksLevel", json!([j1, level]), &expected);
        assert_refused(
            &mut client,
            "downGradeLocksLevel",
            json!([j1, level]),
            &expected,
        );
    }
    // A name of exactly the limit is a lock.
    let longest = format!("node/{}", "x".repeat(1019));
    let j3 = fixture.jobs[2].owner();
    assert_eq!(
        client.ok("tryUpdateLocks", json!([j3, [[longest, "shared"]]])),
        json!([])
    );
    assert_eq!(client.ok("freeLocks", json!([j3])), json!([]));
    fixture.assert_unchanged();
}

// ----- limits -----

#[test]
fn a_frame_over_the_limit_is_answered_then_closed() {
    let mut fixture = Fixture::with_settings("[wconfd]\nframe_bytes_max = 65536\n");
    let mut probe = fixture.wconfd.client();
    assert_eq!(probe.ok("echo", json!(["probe"])), json!("probe"));
    let descriptors = fixture.wconfd.descriptors();
    // Exactly at the limit (the ETX is not counted): served.
    let mut client = fixture.wconfd.client();
    let request = b"{\"method\": \"echo\", \"args\": [\"edge\"]}";
    let mut frame = request.to_vec();
    frame.resize(65_536, b' ');
    frame.push(0x03);
    client.send_raw(&frame).expect("send");
    assert_eq!(client.read_response().expect("answer"), Ok(json!("edge")));

    // One byte over, with its ETX.
    let mut over = request.to_vec();
    over.resize(65_537, b' ');
    over.push(0x03);
    let _ = client.send_raw(&over);
    let (class, args) = client
        .read_response()
        .expect("an answer")
        .expect_err("refused");
    assert_eq!(class, "GenericError");
    assert!(
        crate::daemon::message(&args).contains("frame limit of 65536 bytes"),
        "{args}"
    );
    assert!(client.closed_by_daemon());

    // 100 KiB without any ETX.
    let mut client = fixture.wconfd.client();
    // The daemon may close before it has read all: a failed write is fine.
    let _ = client.send_raw(&vec![b'x'; 100 * 1024]);
    let (class, args) = client
        .read_response()
        .expect("an answer")
        .expect_err("refused");
    assert_eq!(class, "GenericError");
    assert!(
        crate::daemon::message(&args).contains("frame limit of 65536 bytes"),
        "{args}"
    );
    assert!(client.closed_by_daemon());
    wait_until(
        "the daemon lets go of the closed connections",
        DEADLINE,
        || fixture.wconfd.descriptors() <= descriptors,
    );
    fixture.assert_unchanged_over(&mut probe);
}

#[test]
fn more_entries_than_the_limit_are_refused() {
    let mut fixture = Fixture::with_settings("[wconfd]\nrequest_entries_max = 4\n");
    let mut client = fixture.wconfd.client();
    let j3 = fixture.jobs[2].owner();
    let entries = |count: usize| -> Vec<Value> {
        (0..count)
            .map(|i| json!([format!("node/m{i}"), "shared"]))
            .collect()
    };
    let names =
        |count: usize| -> Vec<String> { (0..count).map(|i| format!("node/m{i}")).collect() };
    let five = entries(5);
    let expected = "has 5 entries, over the limit of 4";
    assert_refused(&mut client, "tryUpdateLocks", json!([j3, five]), expected);
    assert_refused(
        &mut client,
        "updateLocksWaiting",
        json!([j3, 0, five]),
        expected,
    );
    assert_refused(
        &mut client,
        "awaitLocks",
        json!([j3, 0, five, 10]),
        expected,
    );
    assert_refused(
        &mut client,
        "opportunisticLockUnion",
        json!([j3, five]),
        expected,
    );
    assert_refused(
        &mut client,
        "guardedOpportunisticLockUnion",
        json!([1, j3, five]),
        expected,
    );
    assert_refused(
        &mut client,
        "intersectLocks",
        json!([j3, names(5)]),
        expected,
    );
    // At the limit: served.
    assert_eq!(
        client.ok("tryUpdateLocks", json!([j3, entries(4)])),
        json!([])
    );
    assert_eq!(
        client.ok("intersectLocks", json!([j3, names(4)])),
        json!([])
    );
    assert_eq!(client.ok("freeLocks", json!([j3])), json!([]));
    fixture.assert_unchanged();
}

/// A new connection that the daemon serves, or None if it was refused.
fn served(wconfd: &Wconfd) -> Option<Client> {
    let mut client = wconfd.client();
    let answered = client.send("echo", json!(["in"])).is_ok()
        && client
            .read_response()
            .is_ok_and(|answer| answer == Ok(json!("in")));
    answered.then_some(client)
}

#[test]
fn a_request_of_many_entries_does_not_stall_other_clients() {
    let mut fixture = Fixture::with_settings("[wconfd]\nrequest_entries_max = 100000\n");
    let entries: Vec<Value> = (0..100_000)
        .map(|i| json!([format!("node/n{i:06}"), "shared"]))
        .collect();
    let mut big = fixture.wconfd.client();
    big.send("tryUpdateLocks", json!([fixture.jobs[2].owner(), entries]))
        .expect("send");
    // Linear work on 100,000 entries takes well under a second.
    let mut other = fixture.wconfd.client();
    other
        .stream()
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("set a read timeout");
    other.send("echo", json!(["meanwhile"])).expect("send");
    assert_eq!(
        other.read_response().expect("an answer within 5 s"),
        Ok(json!("meanwhile"))
    );
    assert_eq!(big.read_response().expect("answer"), Ok(json!([])));
    assert_eq!(
        big.ok("freeLocks", json!([fixture.jobs[2].owner()])),
        json!([])
    );
    fixture.assert_unchanged();
}

#[test]
fn more_connections_than_the_limit_are_closed_and_the_others_served() {
    let mut fixture = Fixture::with_settings("[wconfd]\nconnections_max = 3\n");
    // Connections of the set-up may still count until the daemon has seen
    // them close.
    let mut open: Vec<Client> = Vec::new();
    wait_until("a connection is served", DEADLINE, || {
        open.extend(served(&fixture.wconfd));
        !open.is_empty()
    });
    let mut probe = open.pop().expect("one");
    let descriptors = fixture.wconfd.descriptors();
    wait_until("two more connections are served", DEADLINE, || {
        open.extend(served(&fixture.wconfd));
        open.len() == 2
    });
    let mut extra = fixture.wconfd.client();
    let _ = extra.send("echo", json!(["extra"]));
    let (class, args) = extra
        .read_response()
        .expect("the refusal")
        .expect_err("an error, not an answer");
    assert_eq!(class, "GenericError");
    assert!(
        crate::daemon::message(&args).contains("too many connections"),
        "{args}"
    );
    assert!(extra.closed_by_daemon(), "the extra connection was served");
    assert!(
        fixture.wconfd.log().contains("too many connections"),
        "the refusal is not logged:\n{}",
        fixture.wconfd.log()
    );
    for client in open.iter_mut().chain([&mut probe]) {
        assert_eq!(client.ok("echo", json!(["still"])), json!("still"));
    }
    // Once one closes, a new connection is served again.
    drop(open.pop());
    wait_until("a freed slot is usable", DEADLINE, || {
        open.extend(served(&fixture.wconfd));
        open.len() == 2
    });
    drop(open);
    wait_until(
        "the daemon closes every connection but one",
        DEADLINE,
        || fixture.wconfd.descriptors() <= descriptors,
    );
    fixture.assert_unchanged_over(&mut probe);
}

#[test]
fn a_config_write_refused_by_the_lock_check_changes_nothing() {
    let mut fixture = Fixture::with_settings("[wconfd]\nconfig_lock_check = \"refuse\"\n");
    let mut client = fixture.wconfd.client();
    // J3 holds the config lock and nothing else.
    let j3 = fixture.jobs[2].owner();
    assert_ne!(client.ok("lockConfig", json!([j3, false])), Value::Null);
    fixture.baseline = client.ok("listLocksWaitingStatus", json!([]));
    let path = fixture.wconfd.root().path().join("config.data");
    let file = std::fs::read(&path).expect("config.data");
    let stored = client.ok("readConfig", json!([]));
    let mut config = stored.clone();
    config["nodes"] = json!({"n-uuid-9": {"name": "n9"}});
    config["instances"] = json!({"i-uuid-9": {"name": "web9"}});
    for method in ["writeConfig", "writeConfigAndUnlock"] {
        assert_refused(
            &mut client,
            method,
            json!([j3, config]),
            "instance web9 (uuid i-uuid-9, added) needs instance/web9; \
             node n9 (uuid n-uuid-9, added) needs node/n-uuid-9",
        );
        // Invalid as well: the validation answers first.
        let mut invalid = config.clone();
        invalid["disks"] = json!([]);
        let (class, message) = client.fails(method, json!([j3, invalid]));
        assert_eq!(class, "ConfigVerifyError", "{message}");
        assert_eq!(client.ok("readConfig", json!([])), stored);
        assert_eq!(std::fs::read(&path).expect("config.data"), file);
        fixture.assert_unchanged_over(&mut client);
    }
    fixture.assert_unchanged();
}

#[test]
fn out_of_range_settings_stop_start_up_naming_the_setting() {
    let cases = [
        ("[wconfd]\nframe_bytes_max = 4095\n", "frame_bytes_max"),
        ("[wconfd]\nconnections_max = 0\n", "connections_max"),
        ("[wconfd]\nrequest_entries_max = 0\n", "request_entries_max"),
        (
            "[wconfd]\ndeath_check_interval_ms = 9\n",
            "death_check_interval_ms",
        ),
        ("[wconfd]\nframe_bytes = 65536\n", "frame_bytes"),
        ("[wconfd]\nframe_bytes_max = \"big\"\n", "frame_bytes_max"),
        (
            "[wconfd]\nconfig_lock_check = \"warn\"\n",
            "config_lock_check",
        ),
        ("[wconfd\n", "warden.toml"),
    ];
    for (toml, expected) in cases {
        let root = Root::new();
        std::fs::write(root.path().join("warden.toml"), toml).expect("write warden.toml");
        let Err((status, log)) = Wconfd::try_start_on(&root) else {
            panic!("wconfd started with {toml:?}");
        };
        assert!(!status.success(), "{toml:?}: {status}");
        assert!(
            log.contains("warden.toml") && log.contains(expected),
            "{toml:?}: the error does not name {expected}:\n{log}"
        );
    }
}

#[test]
fn damaged_state_files_stop_start_up_naming_them_and_are_kept() {
    let cases: [(&str, &[u8], &str); 5] = [
        ("config.data", b"{\"serial_no\": 1", "not valid JSON"),
        ("config.data", b"[]", "not a JSON object"),
        ("config.data", b"{\"mtime\": 1}", "serial_no is missing"),
        ("locks.data", b"\x00\x01 not a snapshot", "locks.data"),
        (
            "warden.toml",
            b"[wconfd]\nconnections_max = -1\n",
            "connections_max",
        ),
    ];
    for (file, damage, expected) in cases {
        let root = Root::new();
        let path = root.path().join(file);
        std::fs::write(&path, damage).expect("write the damaged file");
        let Err((status, log)) = Wconfd::try_start_on(&root) else {
            panic!("wconfd started with a damaged {file}");
        };
        assert!(!status.success(), "{file}: {status}");
        assert!(
            log.contains(file) && log.contains(expected),
            "{file}: the error does not say {expected:?}:\n{log}"
        );
        assert_eq!(
            std::fs::read(&path).expect("the damaged file is still there"),
            damage,
            "{file} was replaced"
        );
    }
}

#[test]
fn a_journal_damaged_before_its_end_stops_start_up() {
    let fixture = Fixture::start();
    let root = fixture.wconfd.root().clone();
    let Fixture {
        mut wconfd, jobs, ..
    } = fixture;
    wconfd.stop();
    let journal = root.path().join("locks.journal");
    let mut bytes = std::fs::read(&journal).expect("the journal");
    // After the journal's header block, the first record: its header, then
    // its JSON. The fixture's later updates were written after it.
    use warden::store::lock_state::{JOURNAL_HEADER_BYTES, RECORD_HEADER_BYTES};
    let first_json = JOURNAL_HEADER_BYTES + RECORD_HEADER_BYTES;
    assert_eq!(
        bytes[first_json], b'{',
        "the fixture's updates are journalled"
    );
    // A flipped byte in the first record's JSON: not a torn last write.
    bytes[first_json + 2] ^= 0x55;
    std::fs::write(&journal, &bytes).expect("damage the journal");
    let Err((status, log)) = Wconfd::try_start_on(&root) else {
        panic!("wconfd started with a damaged journal");
    };
    assert!(!status.success());
    assert!(
        log.contains("locks.journal") && log.contains("written after it"),
        "{log}"
    );
    assert_eq!(std::fs::read(&journal).expect("kept"), bytes);
    drop(jobs);
}

#[test]
fn state_files_of_an_older_format_stop_start_up_naming_them() {
    // Format version 1: a journal of records appended from its first byte,
    // and snapshots saying version 1.
    let payload = br#"{"op":"freeLocks","owner":[1,"/r/livelocks/a",1],"seq":1}"#;
    let mut old_journal = Vec::new();
    old_journal.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    old_journal.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
    old_journal.extend_from_slice(payload);
    let old_snapshot = br#"{"version": 1, "last_seq": 0, "holdings": [], "pending": []}"#;
    let cases: [(&str, &[u8], &str); 2] = [
        ("locks.journal", &old_journal, "format version 2"),
        (
            "locks.data",
            old_snapshot,
            "format version 1 is not the supported 2",
        ),
    ];
    for (file, bytes, expected) in cases {
        let root = Root::new();
        let path = root.path().join(file);
        std::fs::write(&path, bytes).expect("an old file");
        let Err((status, log)) = Wconfd::try_start_on(&root) else {
            panic!("wconfd started with an old {file}");
        };
        assert!(!status.success(), "{file}: {status}");
        assert!(
            log.contains(file) && log.contains(expected),
            "{file}: the error does not say {expected:?}:\n{log}"
        );
        assert_eq!(
            std::fs::read(&path).expect("kept"),
            bytes,
            "{file} was replaced"
        );
    }
}

// ----- stalled and vanishing clients -----

#[test]
fn a_stalled_half_frame_does_not_hold_up_other_clients() {
    let mut fixture = Fixture::start();
    let mut stalled = fixture.wconfd.client();
    stalled
        .send_raw(b"{\"method\": \"echo\", \"args\": [\"sl")
        .expect("send");
    let mut other = fixture.wconfd.client();
    for _ in 0..10 {
        assert_eq!(other.ok("echo", json!(["other"])), json!("other"));
    }
    fixture.assert_unchanged();
    stalled.send_raw(b"ow\"]}\n\x03").expect("send");
    assert_eq!(stalled.read_response().expect("answer"), Ok(json!("slow")));
    // A client that vanishes with half a frame leaves nothing behind.
    stalled
        .send_raw(b"{\"method\": \"freeLocks\"")
        .expect("send");
    drop(stalled);
    fixture.assert_unchanged();
}

/// A peer that sends part of a request and shuts down its end is closed
/// unanswered (the requests it completed before are answered): it must not
/// stay open, counted against the connection limit. Sent while wconfd is
/// paused, so that the bytes and the end arrive in one event.
#[test]
fn a_half_closed_connection_with_a_partial_frame_is_closed() {
    let mut fixture = Fixture::start();
    let cases: [(&[u8], Option<Value>); 2] = [
        (b"{\"meth", None),
        (
            b"{\"method\": \"echo\", \"args\": [\"whole\"]}\x03{\"method\": \"freeLocks\"",
            Some(json!("whole")),
        ),
    ];
    for (sent, answered) in cases {
        let mut client = fixture.wconfd.client();
        fixture.wconfd.pause();
        client.send_raw(sent).expect("send");
        client
            .stream()
            .shutdown(Shutdown::Write)
            .expect("shut down");
        fixture.wconfd.resume();
        client
            .stream()
            .set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .expect("a read timeout");
        if let Some(answer) = answered {
            assert_eq!(client.read_response().expect("an answer"), Ok(answer));
        }
        assert!(client.closed_by_daemon(), "a reply came instead of the end");
    }
    fixture.assert_unchanged();
}

/// Gives J3 `count` node locks, so that listings are large.
fn hold_many(fixture: &Fixture, count: usize) -> Value {
    let entries: Vec<Value> = (0..count)
        .map(|i| json!([format!("node/many-{i:05}"), "shared"]))
        .collect();
    let mut client = fixture.wconfd.client();
    assert_eq!(
        client.ok("tryUpdateLocks", json!([fixture.jobs[2].owner(), entries])),
        json!([])
    );
    client.ok("listLocksWaitingStatus", json!([]))
}

#[test]
fn a_client_closing_mid_reply_does_not_disturb_the_daemon() {
    let mut fixture = Fixture::start();
    // A listing of about 200 KB: more than the socket buffers.
    fixture.baseline = hold_many(&fixture, 2000);
    let mut probe = fixture.wconfd.client();
    assert_eq!(probe.ok("echo", json!(["probe"])), json!("probe"));
    let descriptors = fixture.wconfd.descriptors();
    for _ in 0..8 {
        let mut client = fixture.wconfd.client();
        for _ in 0..2 {
            client
                .send("listLocksWaitingStatus", json!([]))
                .expect("send");
        }
        // Half-read, then gone.
        let mut partial = [0u8; 1000];
        let _ = std::io::Read::read(&mut client.stream(), &mut partial);
        drop(client);
        let mut client = fixture.wconfd.client();
        client.send("listAllLocksOwners", json!([])).expect("send");
        drop(client);
    }
    wait_until("the daemon closes what the clients left", DEADLINE, || {
        fixture.wconfd.descriptors() <= descriptors
    });
    fixture.assert_unchanged_over(&mut probe);
}

#[test]
fn a_client_that_does_not_read_its_replies_does_not_hold_up_others() {
    let mut fixture = Fixture::start();
    let mut lazy = fixture.wconfd.client();
    // 18 MB of answers are due, more than the daemon buffers for one
    // connection (16 MiB); it stops answering that connection, not others.
    const REQUESTS: usize = 300;
    let text = |i: usize| format!("{i:04}{}", "x".repeat(60_000));
    for i in 0..REQUESTS {
        lazy.send("echo", json!([text(i)])).expect("send");
    }
    let mut other = fixture.wconfd.client();
    for _ in 0..5 {
        assert_eq!(other.ok("echo", json!(["busy"])), json!("busy"));
    }
    fixture.assert_unchanged();
    for i in 0..REQUESTS {
        assert_eq!(lazy.read_response().expect("answer"), Ok(json!(text(i))));
    }
}

#[test]
fn requests_before_a_half_close_are_answered() {
    let mut fixture = Fixture::start();
    let j3 = fixture.jobs[2].owner();
    // The daemon stopped: the requests and the end of input are all
    // queued by the time it reads the connection.
    fixture.wconfd.pause();
    let stream = UnixStream::connect(fixture.wconfd.root().socket()).expect("connect");
    let mut client = Client::over(stream.try_clone().expect("clone"));
    client
        .send("tryUpdateLocks", json!([j3, [["node/n7", "exclusive"]]]))
        .expect("send");
    client.send("echo", json!(["last"])).expect("send");
    stream.shutdown(Shutdown::Write).expect("shut down writing");
    fixture.wconfd.resume();
    let first = client.read_response();
    // Whatever was answered, the update was applied: undo it.
    let held = fixture.wconfd.client().ok("listLocks", json!([j3]));
    assert_eq!(
        fixture.wconfd.client().ok("freeLocks", json!([j3])),
        json!([])
    );
    fixture.assert_unchanged();
    assert_eq!(
        first.expect("an answer to the update"),
        Ok(json!([])),
        "J3 holds {held}"
    );
    assert_eq!(
        client.read_response().expect("an answer to the echo"),
        Ok(json!("last"))
    );
}

#[test]
fn requests_before_a_half_close_are_answered_even_with_an_await_held() {
    let mut fixture = Fixture::start();
    let j3 = fixture.jobs[2].owner();
    fixture.wconfd.pause();
    let stream = UnixStream::connect(fixture.wconfd.root().socket()).expect("connect");
    let mut client = Client::over(stream.try_clone().expect("clone"));
    client.send("echo", json!(["first"])).expect("send");
    // Blocked by J1: held until granted or timed out.
    client
        .send(
            "awaitLocks",
            json!([j3, 0, [["node/n1", "exclusive"]], 10_000]),
        )
        .expect("send");
    stream.shutdown(Shutdown::Write).expect("shut down writing");
    fixture.wconfd.resume();
    let first = client.read_response();
    // The await's request stays pending without its connection: drop it.
    assert_eq!(
        fixture.wconfd.client().ok("freeLocks", json!([j3])),
        json!([])
    );
    fixture.assert_unchanged();
    assert_eq!(
        first.expect("an answer to the echo sent before the await"),
        Ok(json!("first"))
    );
}

// ----- the generated corpus -----

fn is_string(value: &Value) -> bool {
    value.is_string()
}

fn is_bool(value: &Value) -> bool {
    value.is_boolean()
}

fn is_object(value: &Value) -> bool {
    value.is_object()
}

fn is_i64(value: &Value) -> bool {
    value.is_i64()
}

fn is_u64(value: &Value) -> bool {
    value.is_u64()
}

fn is_timeout(value: &Value) -> bool {
    value.as_u64().is_some_and(|ms| ms <= 3_600_000)
}

fn is_level(value: &Value) -> bool {
    value
        .as_str()
        .is_some_and(|text| warden::locks::Level::parse(text).is_ok())
}

fn all(value: &Value, valid: fn(&Value) -> bool) -> bool {
    value
        .as_array()
        .is_some_and(|items| items.iter().all(valid))
}

fn is_lock(value: &Value) -> bool {
    warden::protocol::wconfd::decode_lock(value).is_ok()
}

fn is_entries(value: &Value) -> bool {
    all(value, |item| {
        warden::protocol::wconfd::decode_entry(item).is_ok()
    })
}

fn is_locks(value: &Value) -> bool {
    all(value, is_lock)
}

fn is_lock_modes(value: &Value) -> bool {
    all(value, |item| {
        warden::protocol::wconfd::decode_lock_mode(item).is_ok()
    })
}

/// Every method of wconfd with a valid request acting as `owner`.
fn corpus_methods(owner: &Value, config: &Value) -> Vec<Method> {
    use crate::corpus::nothing;
    let entries = json!([["node/n9", "exclusive"]]);
    let wanted = json!([["node/n9", "shared"]]);
    let mut methods: Vec<Method> = [
        "cleanupLocks",
        "readConfig",
        "verifyConfig",
        "flushConfig",
        "listAllLocks",
        "listAllLocksOwners",
        "listLocksWaitingStatus",
        "listWaiters",
    ]
    .into_iter()
    .map(|name| Method::new(name, vec![]))
    .collect();
    let owner_only = |name| Method::new(name, vec![(owner.clone(), nothing as Accepts)]);
    methods.extend(
        [
            "unlockConfig",
            "listLocks",
            "hasPendingRequest",
            "freeLocks",
        ]
        .map(owner_only),
    );
    methods.extend([
        Method::new("echo", vec![(json!("x"), is_string as Accepts)]),
        Method::new(
            "writeConfig",
            vec![(owner.clone(), nothing), (config.clone(), is_object)],
        ),
        Method::new(
            "writeConfigAndUnlock",
            vec![(owner.clone(), nothing), (config.clone(), is_object)],
        ),
        Method::new(
            "lockConfig",
            vec![(owner.clone(), nothing), (json!(false), is_bool)],
        ),
        Method::new(
            "tryUpdateLocks",
            vec![(owner.clone(), nothing), (entries.clone(), is_entries)],
        ),
        Method::new(
            "updateLocksWaiting",
            vec![
                (owner.clone(), nothing),
                (json!(0), is_i64),
                (entries.clone(), is_entries),
            ],
        ),
        Method::new(
            "awaitLocks",
            vec![
                (owner.clone(), nothing),
                (json!(0), is_i64),
                (entries.clone(), is_entries),
                (json!(10), is_timeout),
            ],
        ),
        Method::new(
            "freeLocksLevel",
            vec![(owner.clone(), nothing), (json!("node"), is_level)],
        ),
        Method::new(
            "downGradeLocksLevel",
            vec![(owner.clone(), nothing), (json!("node"), is_level)],
        ),
        Method::new(
            "intersectLocks",
            vec![(owner.clone(), nothing), (json!(["node/n1"]), is_locks)],
        ),
        Method::new(
            "opportunisticLockUnion",
            vec![(owner.clone(), nothing), (wanted.clone(), is_lock_modes)],
        ),
        Method::new(
            "guardedOpportunisticLockUnion",
            vec![
                (json!(1), is_u64),
                (owner.clone(), nothing),
                (wanted.clone(), is_lock_modes),
            ],
        ),
    ]);
    methods
}

/// wconfd's state: the locks, the waiters and the configuration.
fn fingerprint(client: &mut Client) -> Value {
    json!([
        client.ok("listLocksWaitingStatus", json!([])),
        client.ok("readConfig", json!([])),
    ])
}

#[test]
fn a_generated_corpus_of_bad_requests_is_refused_for_every_method() {
    const FRAME_BYTES_MAX: usize = 4 * 1024 * 1024;
    let mut fixture =
        Fixture::with_settings(&format!("[wconfd]\nframe_bytes_max = {FRAME_BYTES_MAX}\n"));
    let socket = fixture.wconfd.root().socket();
    let mut probe = fixture.wconfd.client();
    let before = fingerprint(&mut probe);
    let config = before[1].clone();
    let methods = corpus_methods(&fixture.jobs[2].owner(), &config);
    assert_eq!(methods.len(), 24, "every method of wconfd");
    let mut tried = send_expecting_errors(&socket, &bad_envelopes(), &["GenericError"]);
    for method in &methods {
        tried += send_expecting_errors(&socket, &bad_frames(method), &["GenericError"]);
        // Everyone else is served meanwhile.
        assert_eq!(probe.ok("echo", json!([method.name])), json!(method.name));
    }
    tried += check_frame_limit(&socket, FRAME_BYTES_MAX, "echo", json!(["edge"]));
    eprintln!("wconfd: {tried} bad requests refused");
    assert!(tried > 4_000, "only {tried} bad requests");
    assert_eq!(
        fingerprint(&mut probe),
        before,
        "bad input changed the state"
    );
    fixture.assert_unchanged();
}

#[test]
fn connections_that_sent_large_frames_do_not_keep_large_buffers() {
    let mut fixture = Fixture::with_settings("[wconfd]\nframe_bytes_max = 8388608\n");
    let pid = fixture.wconfd.pid();
    let before = crate::daemon::memory_kib(pid, "VmRSS");
    // Twenty connections, kept open, each sent a 4 MB request and read a
    // 4 MB answer: 160 MB if each kept its buffers.
    let text = "x".repeat(4 * 1024 * 1024);
    let mut open = Vec::new();
    for _ in 0..20 {
        let mut client = fixture.wconfd.client();
        assert_eq!(client.ok("echo", json!([text])), json!(text));
        open.push(client);
    }
    let grown = crate::daemon::memory_kib(pid, "VmRSS").saturating_sub(before);
    eprintln!("wconfd: VmRSS grew {grown} KiB");
    assert!(grown < 48 * 1024, "wconfd's VmRSS grew {grown} KiB");
    fixture.assert_unchanged();
}
