//! Bad input never crashes luxid or changes its queue: a generated corpus
//! of malformed, truncated, deeply nested, invalid UTF-8 and ill-typed
//! requests for every LUXI method and every opcode field, frames around
//! the limit, answers that would outgrow the frame limit, and clients that
//! stall, vanish or never read. After each, luxid still serves another
//! connection and its jobs and queue directory are unchanged.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::corpus::{
    Accepts, Method, anything, bad_envelopes, bad_frames, check_frame_limit, nothing, palette,
    request, send_expecting_errors,
};
use crate::daemon::{Client, DEADLINE, memory_kib, wait_until};
use crate::luxid::{Cluster, Luxid};

/// Errors luxid answers bad requests with.
const CLASSES: [&str; 3] = ["GenericError", "OpPrereqError", "JobLost"];

fn exec(argv: &[&str]) -> Value {
    json!({"OP_ID": "OP_EXEC", "argv": argv})
}

/// A queue of every kind of job: one archived, one finished, one running
/// (it sleeps, and with `max_running_jobs = 1` it keeps the next one
/// queued), one queued.
struct Fixture {
    cluster: Cluster,
    finished: u64,
    running: u64,
    queued: u64,
}

impl Fixture {
    fn start(settings: &str) -> Fixture {
        let cluster =
            Cluster::start_with_settings(&format!("[luxid]\nmax_running_jobs = 1\n{settings}"));
        let archived = cluster.submit(json!([exec(&["/bin/true"])]));
        assert_eq!(cluster.wait_final(archived), "success");
        assert_eq!(
            cluster.client().ok("ArchiveJob", json!([archived])),
            json!(true)
        );
        let finished = cluster.submit(json!([exec(&["/bin/true"])]));
        assert_eq!(cluster.wait_final(finished), "success");
        let running = cluster.submit(json!([exec(&["/bin/sleep", "300"])]));
        wait_until("the sleeper runs", DEADLINE, || {
            cluster.status(running) == "running"
        });
        let queued = cluster.submit(json!([exec(&["/bin/true"])]));
        Fixture {
            cluster,
            finished,
            running,
            queued,
        }
    }

    fn socket(&self) -> PathBuf {
        Luxid::socket(self.cluster.root())
    }

    fn pid(&self) -> u32 {
        self.cluster.luxid.pid()
    }

    fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("luxid's /proc/PID/fd")
            .count()
    }

    /// Every job with every field, and every file of the queue directory
    /// with its contents.
    fn fingerprint(&self) -> Value {
        let jobs = self
            .cluster
            .client()
            .ok("QueryJobs", json!([null, warden::jobs::FIELDS]));
        let mut files = Vec::new();
        list_files(&self.cluster.root().path().join("queue"), &mut files);
        files.sort();
        json!([jobs, files])
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The sleeper's runner is in its own process group: end it.
        let _ = self
            .cluster
            .client()
            .try_call("CancelJob", json!([self.running, true]));
    }
}

fn list_files(dir: &Path, files: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("read the queue directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            list_files(&path, files);
        } else {
            let contents = std::fs::read(&path).unwrap_or_default();
            files.push((
                path.display().to_string(),
                String::from_utf8_lossy(&contents).into_owned(),
            ));
        }
    }
}

fn is_job_id(value: &Value) -> bool {
    match value {
        Value::Number(number) => number.as_u64().is_some_and(|id| id > 0),
        Value::String(text) => text.parse::<u64>().is_ok_and(|id| id > 0),
        _ => false,
    }
}

fn is_fields(value: &Value) -> bool {
    value.as_array().is_some_and(|fields| {
        fields.iter().all(|field| {
            field
                .as_str()
                .is_some_and(|name| warden::jobs::FIELDS.contains(&name))
        })
    })
}

fn is_job_ids_or_null(value: &Value) -> bool {
    value.is_null()
        || value
            .as_array()
            .is_some_and(|ids| ids.iter().all(is_job_id))
}

fn is_array(value: &Value) -> bool {
    value.is_array()
}

fn is_number(value: &Value) -> bool {
    value.is_number()
}

fn is_bool(value: &Value) -> bool {
    value.is_boolean()
}

fn is_log_serial(value: &Value) -> bool {
    value.is_null() || value.is_u64()
}

fn is_timeout(value: &Value) -> bool {
    value.as_f64().is_some_and(|seconds| seconds >= 0.0)
}

fn is_priority(value: &Value) -> bool {
    value
        .as_i64()
        .is_some_and(|priority| [-10, 0, 10].contains(&priority))
}

/// Every LUXI method with a valid request on the fixture's jobs.
fn corpus_methods(fixture: &Fixture) -> Vec<Method> {
    let ops = json!([exec(&["/bin/true"])]);
    let (finished, queued) = (json!(fixture.finished), json!(fixture.queued));
    vec![
        Method::new("SubmitJob", vec![(ops.clone(), nothing as Accepts)]),
        Method::new("SubmitJobToDrainedQueue", vec![(ops.clone(), nothing)]),
        Method::new("SubmitManyJobs", vec![(json!([ops]), is_array)]),
        Method::new(
            "QueryJobs",
            vec![
                (json!([finished]), is_job_ids_or_null),
                (json!(["id", "status"]), is_fields),
            ],
        ),
        Method::new(
            "WaitForJobChange",
            vec![
                (finished.clone(), nothing),
                (json!(["status"]), is_fields),
                (json!(null), anything),
                (json!(null), is_log_serial),
                (json!(0), is_timeout),
            ],
        ),
        Method::new("CancelJob", vec![(queued.clone(), is_job_id)]),
        Method::new("ArchiveJob", vec![(finished.clone(), is_job_id)]),
        Method::new(
            "AutoArchiveJobs",
            vec![(json!(3600), is_number), (json!(0), is_number)],
        ),
        Method::new(
            "ChangeJobPriority",
            vec![(queued.clone(), is_job_id), (json!(0), is_priority)],
        ),
        Method::new("SetDrainFlag", vec![(json!(false), is_bool)]),
        Method::new("QueryConfigValues", vec![(json!(["drain_flag"]), is_array)]),
    ]
}

/// Submissions with one opcode whose fields, one at a time, hold every
/// wrong value (an opcode luxid's own check accepts is left out).
fn bad_submissions() -> Vec<Vec<u8>> {
    let full_exec = json!({
        "OP_ID": "OP_EXEC", "argv": ["/bin/true"], "env": {"A": "b"}, "cwd": "/",
        "timeout": 10, "locks": [["node/n1", "shared"]], "stdin": "",
        "priority": 0, "depends": [], "comment": "c", "reason": [],
        "dry_run": false, "debug_level": 0,
    });
    let full_delay = json!({
        "OP_ID": "OP_TEST_DELAY", "duration": 0.1, "on_master": true,
        "on_nodes": [], "on_node_uuids": null, "repeat": 0,
        "interruptible": false, "no_locks": true,
    });
    let mut values = palette();
    values.extend([
        json!(["a\u{0}b"]),
        json!([["node/n1"]]),
        json!([["nodes/n1", "shared"]]),
        json!([["cluster/BGL", "shared"]]),
        json!([[1, ["bogus"]]]),
        json!([[-5, []]]),
        json!({"A=B": "c"}),
        json!({"A": 1}),
        json!("OP_NOTHING"),
    ]);
    let mut frames = Vec::new();
    for base in [full_exec, full_delay] {
        let fields = base.as_object().expect("an object");
        for name in fields.keys().map(String::as_str).chain(["unknown"]) {
            for value in &values {
                let mut op = base.clone();
                op[name] = value.clone();
                if warden::jobs::opcode::parse(&op).is_ok() {
                    continue;
                }
                let mut frame = request("SubmitJob", &json!([[op]]));
                frame.push(0x03);
                frames.push(frame);
            }
        }
    }
    frames
}

#[test]
fn a_generated_corpus_of_bad_requests_is_refused_for_every_method() {
    const FRAME_BYTES_MAX: usize = 4 * 1024 * 1024;
    let fixture = Fixture::start(&format!("frame_bytes_max = {FRAME_BYTES_MAX}\n"));
    let socket = fixture.socket();
    let before = fixture.fingerprint();
    let mut probe = fixture.cluster.client();
    let methods = corpus_methods(&fixture);
    let mut tried = send_expecting_errors(&socket, &bad_envelopes(), &CLASSES);
    for method in &methods {
        tried += send_expecting_errors(&socket, &bad_frames(method), &CLASSES);
        // Everyone else is served meanwhile.
        assert_eq!(
            probe.ok("QueryConfigValues", json!([["cluster_name"]])),
            json!(["warden"]),
            "after {}",
            method.name
        );
    }
    // CancelJob's second argument.
    let kills: Vec<Vec<u8>> = palette()
        .into_iter()
        .filter(|value| !value.is_boolean())
        .map(|kill| {
            let mut frame = request("CancelJob", &json!([fixture.queued, kill]));
            frame.push(0x03);
            frame
        })
        .collect();
    tried += send_expecting_errors(&socket, &kills, &CLASSES);
    tried += send_expecting_errors(&socket, &bad_submissions(), &["OpPrereqError"]);
    tried += check_frame_limit(
        &socket,
        FRAME_BYTES_MAX,
        "QueryConfigValues",
        json!([["cluster_name"]]),
    );
    eprintln!("luxid: {tried} bad requests refused");
    assert!(tried > 2_000, "only {tried} bad requests");
    assert_eq!(
        fixture.fingerprint(),
        before,
        "bad input changed the queue:\n{}",
        fixture.cluster.logs()
    );
}

#[test]
fn an_answer_longer_than_the_frame_limit_is_refused_not_built() {
    let fixture = Fixture::start("frame_bytes_max = 65536\n");
    let before = fixture.fingerprint();
    let peak_before = memory_kib(fixture.pid(), "VmHWM");
    let mut client = fixture.cluster.client();
    // 30,000 times the same job with every field: a 200 KB request that
    // would be answered with about 30 MB.
    let ids = vec![fixture.finished; 30_000];
    let mut frame = request("QueryJobs", &json!([ids, warden::jobs::FIELDS]));
    frame.push(0x03);
    // Over the limit as a request too: refused and closed.
    let _ = client.send_raw(&frame);
    let (class, _) = client
        .read_response()
        .expect("an answer")
        .expect_err("refused");
    assert_eq!(class, "GenericError");
    // Within the limit as a request, over it as an answer.
    let mut client = fixture.cluster.client();
    let (class, message) = client.fails(
        "QueryJobs",
        json!([vec![fixture.finished; 3_000], warden::jobs::FIELDS]),
    );
    assert_eq!(class, "GenericError");
    assert!(message.contains("frame limit of 65536 bytes"), "{message}");
    // Below the limit: answered.
    let rows = client.ok("QueryJobs", json!([vec![fixture.finished; 10], ["id"]]));
    assert_eq!(rows.as_array().map(Vec::len), Some(10));
    let grown = memory_kib(fixture.pid(), "VmHWM").saturating_sub(peak_before);
    eprintln!("luxid: peak RSS grew {grown} KiB");
    assert!(grown < 16 * 1024, "luxid's peak RSS grew {grown} KiB");
    assert_eq!(fixture.fingerprint(), before);
}

#[test]
fn a_stalled_half_frame_does_not_hold_up_other_clients() {
    let fixture = Fixture::start("");
    let before = fixture.fingerprint();
    let mut stalled = fixture.cluster.client();
    stalled
        .send_raw(b"{\"method\": \"QueryConfigValues\", \"args\": [[\"drain_")
        .expect("send");
    let mut other = fixture.cluster.client();
    for _ in 0..10 {
        assert_eq!(
            other.ok("QueryConfigValues", json!([["cluster_name"]])),
            json!(["warden"])
        );
    }
    stalled.send_raw(b"flag\"]]}\n\x03").expect("send");
    assert_eq!(
        stalled.read_response().expect("an answer"),
        Ok(json!([false]))
    );
    // A client that vanishes with half a submission leaves nothing.
    stalled
        .send_raw(b"{\"method\": \"SubmitJob\", \"args\": [[{\"OP_ID\": \"OP_EXEC\", ")
        .expect("send");
    drop(stalled);
    assert_eq!(fixture.fingerprint(), before);
}

/// A peer that sends part of a request and shuts down its end is closed
/// unanswered (the requests it completed before are answered): it must not
/// stay open, counted against the connection limit. Sent while luxid is
/// paused, so that the bytes and the end arrive in one event.
#[test]
fn a_half_closed_connection_with_a_partial_frame_is_closed() {
    let fixture = Fixture::start("");
    let before = fixture.fingerprint();
    let cases: [(&[u8], Option<Value>); 2] = [
        (b"{\"meth", None),
        (
            b"{\"method\": \"QueryConfigValues\", \"args\": [[\"cluster_name\"]]}\x03{\"method\": \"SubmitJob\"",
            Some(json!(["warden"])),
        ),
    ];
    for (sent, answered) in cases {
        let mut client = fixture.cluster.client();
        fixture.cluster.luxid.pause();
        client.send_raw(sent).expect("send");
        client
            .stream()
            .shutdown(std::net::Shutdown::Write)
            .expect("shut down");
        fixture.cluster.luxid.resume();
        client
            .stream()
            .set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .expect("a read timeout");
        if let Some(answer) = answered {
            assert_eq!(client.read_response().expect("an answer"), Ok(answer));
        }
        assert!(client.closed_by_daemon(), "a reply came instead of the end");
    }
    assert_eq!(fixture.fingerprint(), before);
}

#[test]
fn a_client_closing_mid_reply_does_not_disturb_luxid() {
    let fixture = Fixture::start("");
    let before = fixture.fingerprint();
    let mut probe = fixture.cluster.client();
    probe.ok("QueryConfigValues", json!([["cluster_name"]]));
    let descriptors = fixture.descriptors();
    // Answers of about 100 KB each: more than the socket buffers.
    let ids = vec![fixture.finished; 200];
    for _ in 0..8 {
        let mut client = fixture.cluster.client();
        for _ in 0..4 {
            client
                .send("QueryJobs", json!([ids, warden::jobs::FIELDS]))
                .expect("send");
        }
        let mut partial = [0u8; 1000];
        let _ = Read::read(&mut client.stream(), &mut partial);
        drop(client);
        let mut client = fixture.cluster.client();
        client
            .send("QueryJobs", json!([null, warden::jobs::FIELDS]))
            .expect("send");
        drop(client);
    }
    wait_until("luxid closes what the clients left", DEADLINE, || {
        fixture.descriptors() <= descriptors
    });
    assert_eq!(
        probe.ok("QueryConfigValues", json!([["cluster_name"]])),
        json!(["warden"])
    );
    assert_eq!(fixture.fingerprint(), before);
}

#[test]
fn a_client_that_does_not_read_its_replies_is_paused_not_buffered() {
    let fixture = Fixture::start("frame_bytes_max = 1048576\n");
    let before = fixture.fingerprint();
    let peak_before = memory_kib(fixture.pid(), "VmHWM");
    // Each request of 1 KB is answered with about 180 KB: 1,000 of them
    // are 180 MB, far more than luxid keeps for one connection (16 MiB).
    const REQUESTS: usize = 1_000;
    let ids = vec![fixture.finished; 500];
    let mut frame = request("QueryJobs", &json!([ids.clone(), warden::jobs::FIELDS]));
    frame.push(0x03);
    let stream = UnixStream::connect(fixture.socket()).expect("connect");
    let mut writer = stream.try_clone().expect("clone");
    let writing = std::thread::spawn(move || {
        for _ in 0..REQUESTS {
            writer.write_all(&frame).expect("send");
        }
    });
    let mut other = fixture.cluster.client();
    for _ in 0..20 {
        assert_eq!(
            other.ok("QueryConfigValues", json!([["cluster_name"]])),
            json!(["warden"])
        );
    }
    let mut lazy = Client::over(stream);
    let first = lazy.read_frame().expect("an answer");
    let rows = crate::daemon::decode_response(serde_json::from_slice(&first).expect("JSON"))
        .expect("rows");
    assert_eq!(rows.as_array().map(Vec::len), Some(ids.len()));
    // The same answer every time, byte for byte.
    for index in 1..REQUESTS {
        let frame = lazy.read_frame().expect("an answer");
        assert!(frame == first, "answer {index} differs");
    }
    writing.join().expect("the writer");
    let grown = memory_kib(fixture.pid(), "VmHWM").saturating_sub(peak_before);
    let answer_bytes = first.len();
    eprintln!("luxid: peak RSS grew {grown} KiB for {REQUESTS} answers of {answer_bytes} bytes");
    // The output buffer and what one turn stages, the copies of a growing
    // buffer, the answers being made: well under the 180 MB due.
    assert!(grown < 100 * 1024, "luxid's peak RSS grew {grown} KiB");
    assert_eq!(fixture.fingerprint(), before);
}

#[test]
fn requests_behind_a_held_wait_beyond_the_frame_buffer_are_answered() {
    // The smallest frame buffer: the requests behind the held wait do not
    // all fit in it.
    let fixture = Fixture::start("frame_bytes_max = 4096\n");
    let mut client = fixture.cluster.client();
    let mut bytes = request(
        "WaitForJobChange",
        &json!([fixture.running, ["status"], ["running"], null, 0.2]),
    );
    bytes.push(0x03);
    const BEHIND: usize = 400;
    for _ in 0..BEHIND {
        bytes.extend(request("QueryConfigValues", &json!([["cluster_name"]])));
        bytes.push(0x03);
    }
    assert!(bytes.len() > 3 * 4096);
    client.send_raw(&bytes).expect("send");
    // The wait times out unchanged...
    assert_eq!(
        client.read_response().expect("the wait's answer"),
        Ok(json!([["running"], []]))
    );
    // ...and every request behind it is answered.
    for index in 0..BEHIND {
        assert_eq!(
            client
                .read_response()
                .unwrap_or_else(|error| panic!("request {index}: {error}")),
            Ok(json!(["warden"]))
        );
    }
}

#[test]
fn connections_that_sent_large_frames_do_not_keep_large_buffers() {
    let fixture = Fixture::start("frame_bytes_max = 8388608\n");
    let before = memory_kib(fixture.pid(), "VmRSS");
    // Twenty connections, kept open, each sent a 4 MB request: 80 MB if
    // each kept its buffer (answers are small: wconfd's test has large
    // ones, written by the same code).
    let fields = vec!["x".repeat(1000); 4 * 1024];
    let mut open = Vec::new();
    for _ in 0..20 {
        let mut client = fixture.cluster.client();
        let answer = client.ok("QueryConfigValues", json!([fields]));
        assert_eq!(answer.as_array().map(Vec::len), Some(fields.len()));
        open.push(client);
    }
    let grown = memory_kib(fixture.pid(), "VmRSS").saturating_sub(before);
    eprintln!("luxid: VmRSS grew {grown} KiB");
    assert!(grown < 48 * 1024, "luxid's VmRSS grew {grown} KiB");
}

#[test]
fn a_query_of_many_unknown_or_repeated_ids_does_not_stall_luxid() {
    let fixture = Fixture::start("");
    let before = fixture.fingerprint();
    // Job 1 is archived: each row of it was a read of its file, so a
    // million of them kept luxid from everyone for about half a minute.
    // Ids above the serial were never submitted: each was a failed open.
    let archived = vec![1u64; 1_000_000];
    let unknown: Vec<u64> = (1_000_000..1_300_000).collect();
    for ids in [archived, unknown] {
        let mut big = fixture.cluster.client();
        big.send("QueryJobs", json!([ids, ["id"]])).expect("send");
        let mut other = fixture.cluster.client();
        other
            .stream()
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("set a read timeout");
        assert_eq!(
            other
                .call("QueryConfigValues", json!([["cluster_name"]]))
                .expect("an answer within 5 s"),
            json!(["warden"])
        );
        // Within the harness's deadline (10 s): one row per id.
        let rows = big.read_response().expect("an answer").expect("rows");
        let rows = rows.as_array().expect("rows");
        assert_eq!(rows.len(), ids.len());
        assert!(
            rows.iter().zip(&ids).all(|(row, id)| *row == json!([id])),
            "rows with other ids"
        );
    }
    assert_eq!(fixture.fingerprint(), before);
}

#[test]
fn held_waits_keep_no_copy_of_the_values_their_clients_have() {
    let fixture = Fixture::start("frame_bytes_max = 8388608\n");
    // A queued job (behind the sleeper) whose opcodes take 2 MB.
    let long = "x".repeat(2 * 1024 * 1024);
    let big = fixture.cluster.submit(json!([exec(&["/bin/true", &long])]));
    let ops = fixture.cluster.query(big, &["ops"]).remove(0);
    let before = memory_kib(fixture.pid(), "VmRSS");
    // Thirty clients wait for a change of what they have, 60 MB of values
    // if each wait kept the values it was sent.
    let mut waiting = Vec::new();
    for _ in 0..30 {
        let mut client = fixture.cluster.client();
        client
            .send(
                "WaitForJobChange",
                json!([big, ["ops", "priority"], [ops, 0], null, 30.0]),
            )
            .expect("send");
        waiting.push(client);
    }
    // Every wait is held (answered only on a change or the timeout).
    let mut other = fixture.cluster.client();
    assert_eq!(
        other.ok("QueryJobs", json!([[big], ["status"]])),
        json!([["queued"]])
    );
    let grown = memory_kib(fixture.pid(), "VmRSS").saturating_sub(before);
    eprintln!("luxid: VmRSS grew {grown} KiB with 30 held waits");
    assert!(grown < 24 * 1024, "luxid's VmRSS grew {grown} KiB");
    // A change answers them all, with the values they did not have.
    other.ok("ChangeJobPriority", json!([big, -10]));
    for client in &mut waiting {
        let answer = client.read_response().expect("an answer").expect("values");
        assert_eq!(answer[0][1], json!(-10));
    }
}

#[test]
fn a_query_of_more_fields_than_the_limit_is_refused() {
    let fixture = Fixture::start("");
    let mut client = fixture.cluster.client();
    let at_limit = vec!["id"; warden::limits::QUERY_FIELDS_MAX];
    let row = client.ok("QueryJobs", json!([[fixture.finished], at_limit]));
    assert_eq!(row[0].as_array().map(Vec::len), Some(at_limit.len()));
    let over = vec!["id"; warden::limits::QUERY_FIELDS_MAX + 1];
    for (method, args) in [
        ("QueryJobs", json!([[fixture.finished], over])),
        (
            "WaitForJobChange",
            json!([fixture.running, over, null, null, 1.0]),
        ),
    ] {
        let (class, message) = client.fails(method, args);
        assert_eq!(class, "OpPrereqError", "{method}: {message}");
        assert!(
            message.to_string().contains("over the limit of 1000"),
            "{method}: {message}"
        );
    }
}
