//! The real `job-runner` binary against a real wconfd in a temp root (JOBS.md
//! "Runner lifecycle", "Opcodes"; LIVENESS.md): each test writes a queued
//! job file by hand into `<root>/queue/`, runs the runner, and checks the
//! job file it leaves, the lock table and the livelock directory.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use warden::jobs::{Job, QueuedOpcode, Status, Timestamp};
use warden::queue;

use crate::daemon::{DEADLINE, OwnerProcess, Wconfd, try_update, wait_for_exit, wait_until};

/// A temp root with wconfd running and a queue directory.
fn cluster() -> Wconfd {
    with_queue(Wconfd::start())
}

fn with_queue(wconfd: Wconfd) -> Wconfd {
    fs::create_dir_all(queue_dir(&wconfd.root().path())).expect("create the queue directory");
    wconfd
}

fn queue_dir(root: &Path) -> PathBuf {
    root.join("queue")
}

fn exec(argv: &[&str]) -> Value {
    json!({"OP_ID": "OP_EXEC", "argv": argv})
}

fn delay(seconds: f64) -> Value {
    json!({"OP_ID": "OP_TEST_DELAY", "duration": seconds})
}

/// Writes job `id` with `ops`, queued, as luxid would.
fn write_job(root: &Path, id: u64, ops: &[Value]) {
    let job = Job {
        id,
        ops: ops
            .iter()
            .map(|input| {
                let priority = input.get("priority").and_then(Value::as_i64).unwrap_or(0);
                QueuedOpcode::new(input.clone(), priority)
            })
            .collect(),
        received_timestamp: Some(Timestamp::now()),
        start_timestamp: None,
        end_timestamp: None,
        livelock: None,
        process_id: None,
        workers: Vec::new(),
    };
    write_job_file(root, &job);
}

fn write_job_file(root: &Path, job: &Job) {
    fs::write(
        queue::job_path(&queue_dir(root), job.id),
        queue::encode_job(job),
    )
    .expect("write the job file");
}

fn read_job(root: &Path, id: u64) -> Job {
    queue::read_job_file(&queue::job_path(&queue_dir(root), id))
        .expect("a readable job file")
        .expect("the job file exists")
}

/// A started runner; killed when dropped.
struct Runner {
    child: Child,
    id: u64,
    log_path: PathBuf,
}

impl Runner {
    fn start(root: &Path, id: u64) -> Runner {
        let log_path = root.join(format!("runner-{id}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_job-runner"))
            .arg("--root")
            .arg(root)
            .arg(id.to_string())
            .env("WARDEN_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log_path).expect("create the runner's log"))
            .process_group(0)
            .spawn()
            .expect("spawn job-runner");
        Runner {
            child,
            id,
            log_path,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the runner to exit; it must exit 0.
    fn finish(mut self) {
        let status = wait_for_exit(&mut self.child, DEADLINE);
        let log = fs::read_to_string(&self.log_path).unwrap_or_default();
        assert!(
            status.success(),
            "runner of job {} exited with {status}:\n{log}",
            self.id
        );
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs job `id` to its end and answers its job file.
fn run(root: &Path, id: u64) -> Job {
    Runner::start(root, id).finish();
    read_job(root, id)
}

fn messages(job: &Job, op: usize) -> Vec<String> {
    job.ops[op]
        .log
        .iter()
        .map(|entry| match &entry.3 {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// Every serial of the job, in order.
fn serials(job: &Job) -> Vec<u64> {
    job.ops
        .iter()
        .flat_map(|op| op.log.iter().map(|entry| entry.serial()))
        .collect()
}

/// The runner left nothing behind: its livelock is gone and wconfd holds
/// no lock and no request of anyone.
fn assert_clean(wconfd: &Wconfd) {
    let livelocks: Vec<_> = fs::read_dir(wconfd.livelock_dir())
        .expect("the livelock directory")
        .map(|entry| entry.expect("an entry").file_name())
        .filter(|name| name.to_string_lossy().starts_with("job_"))
        .collect();
    assert!(livelocks.is_empty(), "livelocks left: {livelocks:?}");
    let status = wconfd.client().ok("listLocksWaitingStatus", json!([]));
    assert_eq!(status, json!([[], []]), "locks or requests left");
}

fn assert_final_with_timestamps(job: &Job) {
    assert!(job.is_final(), "{job:?}");
    assert!(job.start_timestamp.is_some() && job.end_timestamp.is_some());
    assert!(
        job.livelock
            .as_deref()
            .is_some_and(|path| path.contains("/livelocks/job_"))
    );
    assert!(job.process_id.is_some());
    for op in &job.ops {
        assert!(op.end_timestamp.is_some(), "{op:?}");
    }
}

#[test]
fn exec_success_logs_every_output_line_and_the_exit_status() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let op = json!({
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/sh", "-c",
                 "echo out one; echo err one >&2; echo \"$FOO $WARDEN_JOB_ID\"; pwd; printf last"],
        "env": {"FOO": "foo"},
        "cwd": "/tmp",
    });
    write_job(&root, 1, &[op]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Success, "{job:?}");
    assert_final_with_timestamps(&job);
    let op = &job.ops[0];
    assert_eq!(op.result["exit_code"], json!(0));
    assert_eq!(op.result["signal"], Value::Null);
    assert!(
        op.result["duration"]
            .as_f64()
            .is_some_and(|secs| secs >= 0.0)
    );
    assert!(op.start_timestamp <= op.exec_timestamp && op.exec_timestamp <= op.end_timestamp);
    let mut lines = messages(&job, 0);
    lines.sort();
    assert_eq!(lines, ["/tmp", "err one", "foo 1", "last", "out one"]);
    assert_eq!(serials(&job), [1, 2, 3, 4, 5]);
    assert!(job.ops[0].log.iter().all(|entry| entry.2 == "message"));
    assert_clean(&wconfd);
}

#[test]
fn exec_gets_its_stdin_and_a_minimal_environment() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let cat = json!({"OP_ID": "OP_EXEC", "argv": ["/bin/cat"], "stdin": "a\nb\n"});
    let env = exec(&["/usr/bin/env"]);
    write_job(&root, 1, &[cat, env]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Success, "{job:?}");
    assert_eq!(messages(&job, 0), ["a", "b"]);
    let mut env = messages(&job, 1);
    env.sort();
    // The fence of the opcode's lock grant (D65): a number that varies.
    let fence = env
        .iter()
        .position(|line| line.starts_with("WARDEN_FENCE="))
        .expect("WARDEN_FENCE is set");
    let token = env.remove(fence);
    assert!(
        token["WARDEN_FENCE=".len()..]
            .parse::<u64>()
            .is_ok_and(|token| token > 0),
        "{token}"
    );
    assert_eq!(
        env,
        [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            "WARDEN_JOB_ID=1".to_owned(),
            format!("WARDEN_ROOT={}", root.display()),
        ]
    );
    assert_eq!(serials(&job), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn a_program_inherits_the_livelock_and_no_other_descriptor_of_the_runner() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let list = "for fd in /proc/$$/fd/*; do readlink $fd; done";
    write_job(&root, 1, &[exec(&["/bin/sh", "-c", list])]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Success, "{job:?}");
    let livelock = job.livelock.clone().expect("the livelock is recorded");
    let open = messages(&job, 0);
    assert!(open.contains(&livelock), "{open:?} lacks {livelock}");
    for target in &open {
        assert!(
            target == "/dev/null" || target.starts_with("pipe:") || *target == livelock,
            "the program inherited {target}: {open:?}"
        );
    }
    assert_clean(&wconfd);
}

#[test]
fn a_failing_program_fails_its_opcode_and_every_later_one() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    write_job(
        &root,
        1,
        &[
            exec(&["/bin/true"]),
            exec(&["/bin/sh", "-c", "echo failing; exit 3"]),
            exec(&["/bin/true"]),
            delay(0.01),
        ],
    );
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Error);
    assert_final_with_timestamps(&job);
    let statuses: Vec<Status> = job.ops.iter().map(|op| op.status).collect();
    assert_eq!(
        statuses,
        [Status::Success, Status::Error, Status::Error, Status::Error]
    );
    let failed = &job.ops[1].result;
    assert_eq!(failed[0], "OpExecError");
    assert_eq!(failed[1][0], "/bin/sh exited with code 3");
    assert_eq!(failed[1][1]["exit_code"], 3);
    assert_eq!(failed[1][1]["signal"], Value::Null);
    assert_eq!(messages(&job, 1), ["failing"]);
    for later in &job.ops[2..] {
        assert_eq!(
            later.result,
            json!(["OpExecError", ["Preceding opcode failed"]])
        );
        assert_eq!(later.exec_timestamp, None);
    }
    assert_clean(&wconfd);
}

#[test]
fn a_program_that_cannot_start_fails_with_the_reason() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    write_job(&root, 1, &[exec(&["/nonexistent/program"])]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Error);
    let reason = job.ops[0].result[1][0].as_str().unwrap().to_owned();
    assert!(
        reason.starts_with("cannot start /nonexistent/program"),
        "{reason}"
    );
    assert_eq!(job.ops[0].result[1][1]["exit_code"], Value::Null);
    assert_clean(&wconfd);
}

#[test]
fn a_program_past_its_timeout_is_killed_and_fails() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let op = json!({"OP_ID": "OP_EXEC", "argv": ["/bin/sleep", "30"], "timeout": 0.3});
    write_job(&root, 1, &[op]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Error);
    let result = &job.ops[0].result;
    assert_eq!(
        result[1][0],
        "/bin/sleep timed out after 0.3 s and was killed"
    );
    // SIGTERM first (to its group); sleep dies of it within the grace.
    assert_eq!(result[1][1]["signal"], 15);
    assert_eq!(result[1][1]["exit_code"], Value::Null);
    let duration = result[1][1]["duration"].as_f64().unwrap();
    assert!((0.3..10.0).contains(&duration), "{duration}");
    assert_clean(&wconfd);
}

#[test]
fn test_delay_repeats_with_a_log_line_each() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let op = json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.02, "repeat": 3});
    write_job(&root, 1, &[op, delay(0.01)]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Success, "{job:?}");
    assert_eq!(job.ops[0].result, Value::Null);
    assert_eq!(
        messages(&job, 0),
        [
            " - INFO: Test delay iteration 0/2",
            " - INFO: Test delay iteration 1/2",
            " - INFO: Test delay iteration 2/2",
        ]
    );
    assert!(job.ops[1].log.is_empty());
    assert_eq!(serials(&job), [1, 2, 3]);
    assert_clean(&wconfd);
}

#[test]
fn test_delay_with_a_bad_duration_fails_before_taking_locks() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    write_job(&root, 1, &[delay(0.0), delay(0.01)]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Error);
    assert_eq!(
        job.ops[0].result,
        json!([
            "OpPrereqError",
            ["Duration must be greater than zero", "wrong_input"]
        ])
    );
    assert!(job.ops[0].start_timestamp.is_some());
    assert_eq!(job.ops[0].exec_timestamp, None);
    assert_eq!(
        job.ops[1].result,
        json!(["OpExecError", ["Preceding opcode failed"]])
    );
    assert_clean(&wconfd);
}

#[test]
fn an_interruptible_delay_ends_when_a_byte_arrives_on_its_socket() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let op = json!({"OP_ID": "OP_TEST_DELAY", "duration": 60.0, "interruptible": true});
    write_job(&root, 1, &[op]);
    let runner = Runner::start(&root, 1);
    let mut socket = None;
    wait_until("the delay logs its socket", DEADLINE, || {
        let job = read_job(&root, 1);
        socket = job.ops[0]
            .log
            .iter()
            .find(|entry| entry.2 == "delay-test")
            .map(|entry| entry.3[0].as_str().expect("a socket path").to_owned());
        socket.is_some()
    });
    let socket = PathBuf::from(socket.expect("just found"));
    assert!(
        socket.starts_with(root.join("socket")),
        "{}",
        socket.display()
    );
    let mut stream = UnixStream::connect(&socket).expect("connect to the delay socket");
    stream.write_all(b"x").expect("write a byte");
    runner.finish();
    let job = read_job(&root, 1);
    assert_eq!(job.status(), Status::Success, "{job:?}");
    let log = messages(&job, 0);
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(
        log[1].starts_with("Received connection, time to go is "),
        "{log:?}"
    );
    assert!(
        log[2].starts_with("Interrupted, time spent waiting: "),
        "{log:?}"
    );
    assert!(!socket.exists(), "the delay socket was removed");
    assert_clean(&wconfd);
}

/// `[exec, end]` of an opcode in microseconds.
fn ran_between(job: &Job, op: usize) -> (u64, u64) {
    let micros = |ts: Option<Timestamp>| {
        let ts = ts.expect("a timestamp");
        ts.0 * 1_000_000 + ts.1
    };
    (
        micros(job.ops[op].exec_timestamp),
        micros(job.ops[op].end_timestamp),
    )
}

#[test]
fn two_runners_contending_for_a_node_run_one_after_the_other() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let op = json!({
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/sleep", "0.3"],
        "locks": [["node/n1", "exclusive"]],
    });
    write_job(&root, 1, std::slice::from_ref(&op));
    write_job(&root, 2, &[op]);
    let first = Runner::start(&root, 1);
    let second = Runner::start(&root, 2);
    first.finish();
    second.finish();
    let (one, two) = (read_job(&root, 1), read_job(&root, 2));
    assert_eq!(one.status(), Status::Success, "{one:?}");
    assert_eq!(two.status(), Status::Success, "{two:?}");
    let (a, b) = (ran_between(&one, 0), ran_between(&two, 0));
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "ran at the same time: {a:?} {b:?}"
    );
    assert_clean(&wconfd);
}

/// The runner's owner `[id, livelock, pid]`, once its job file names it.
fn owner_of(root: &Path, id: u64) -> Value {
    let mut owner = Value::Null;
    wait_until("the runner records its livelock", DEADLINE, || {
        let job = read_job(root, id);
        if let (Some(livelock), Some(pid)) = (job.livelock, job.process_id) {
            owner = json!([id, livelock, pid]);
        }
        !owner.is_null()
    });
    owner
}

fn sigterm(pid: u32) {
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM the runner");
}

#[test]
fn sigterm_while_waiting_for_locks_cancels_the_job_and_drops_the_request() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let holder = OwnerProcess::spawn(&wconfd.livelock_dir(), 99);
    let mut client = wconfd.client();
    assert_eq!(
        try_update(&mut client, &holder, &[("node/n1", "exclusive")]),
        json!([])
    );
    let op = json!({
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/true"],
        "locks": [["node/n1", "shared"]],
    });
    write_job(&root, 1, &[op, delay(0.01)]);
    let runner = Runner::start(&root, 1);
    let owner = owner_of(&root, 1);
    wait_until("the runner's request is pending", DEADLINE, || {
        client.ok("hasPendingRequest", json!([owner])) == json!(true)
    });
    assert_eq!(read_job(&root, 1).ops[0].status, Status::Waiting);
    sigterm(runner.pid());
    runner.finish();
    let job = read_job(&root, 1);
    assert_eq!(job.status(), Status::Canceled, "{job:?}");
    assert_final_with_timestamps(&job);
    for op in &job.ops {
        assert_eq!(op.status, Status::Canceled);
        assert_eq!(op.result, json!("Job canceled by request"));
        assert_eq!(op.exec_timestamp, None);
    }
    // The holder still holds its lock; the runner holds and waits for
    // nothing.
    assert_eq!(
        client.ok("listLocks", json!([holder.owner()])),
        json!([["node/n1", "exclusive"]])
    );
    assert_eq!(client.ok("hasPendingRequest", json!([owner])), json!(false));
    assert_eq!(client.ok("listLocks", json!([owner])), json!([]));
    holder.exit();
}

#[test]
fn sigterm_while_an_opcode_runs_cancels_only_the_later_ones() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let started = root.join("started");
    let script = format!("touch {}; sleep 0.3; echo done", started.display());
    write_job(
        &root,
        1,
        &[exec(&["/bin/sh", "-c", &script]), exec(&["/bin/true"])],
    );
    let runner = Runner::start(&root, 1);
    wait_until("the program runs", DEADLINE, || started.exists());
    sigterm(runner.pid());
    runner.finish();
    let job = read_job(&root, 1);
    assert_eq!(job.ops[0].status, Status::Success, "{job:?}");
    assert_eq!(messages(&job, 0), ["done"]);
    assert_eq!(job.ops[1].status, Status::Canceled);
    assert_eq!(job.status(), Status::Canceled);
    assert_clean(&wconfd);
}

#[test]
fn the_log_is_capped_with_one_truncation_entry() {
    let wconfd = with_queue(Wconfd::start_with_settings(
        "[luxid]\njob_log_bytes_max = 1024\n",
    ));
    let root = wconfd.root().path();
    // 200 lines of 18 bytes (without the newline).
    let script = "i=0; while [ $i -lt 200 ]; do echo line-$(printf %013d $i); i=$((i+1)); done";
    write_job(
        &root,
        1,
        &[
            exec(&["/bin/sh", "-c", script]),
            exec(&["/bin/echo", "after"]),
        ],
    );
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Success, "{job:?}");
    let log = messages(&job, 0);
    let (truncation, kept) = log.split_last().expect("entries");
    assert_eq!(kept.len(), 1024 / 18, "{kept:?}");
    assert_eq!(kept[0], "line-0000000000000");
    assert!(kept.iter().all(|line| line.len() == 18));
    let dropped = 200 - kept.len();
    assert!(
        truncation.starts_with(&format!(
            "Log truncated: {dropped} entries ({} bytes) dropped",
            dropped * 18
        )),
        "{truncation}"
    );
    // The cap is the job's: the next opcode's line is dropped too, and
    // said so.
    let after = messages(&job, 1);
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(
        after[0].starts_with("Log truncated: 1 entries (5 bytes)"),
        "{after:?}"
    );
    let all = serials(&job);
    assert_eq!(all, (1..=all.len() as u64).collect::<Vec<_>>());
    assert_clean(&wconfd);
}

#[test]
fn a_final_job_is_left_alone() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    write_job(&root, 1, &[exec(&["/bin/true"])]);
    let mut job = read_job(&root, 1);
    job.finish_unfinished(Status::Canceled, &json!("Job canceled by request"));
    write_job_file(&root, &job);
    let before = fs::read(queue::job_path(&queue_dir(&root), 1)).unwrap();
    Runner::start(&root, 1).finish();
    let after = fs::read(queue::job_path(&queue_dir(&root), 1)).unwrap();
    assert_eq!(before, after);
    assert_clean(&wconfd);
}

#[test]
fn dependencies_decide_per_opcode() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let finished = |id: u64, status: Status| {
        write_job(&root, id, &[exec(&["/bin/true"])]);
        let mut job = read_job(&root, id);
        job.finish_unfinished(status, &Value::Null);
        write_job_file(&root, &job);
    };
    finished(1, Status::Success);
    finished(2, Status::Canceled);
    let depending =
        |depends: Value| json!({"OP_ID": "OP_EXEC", "argv": ["/bin/true"], "depends": depends});
    // Met (any final status but canceled), then a status not accepted.
    write_job(
        &root,
        3,
        &[
            depending(json!([[1, []]])),
            depending(json!([[1, ["error"]]])),
        ],
    );
    let job = run(&root, 3);
    assert_eq!(job.ops[0].status, Status::Success);
    assert_eq!(
        job.ops[1].result,
        json!([
            "OpExecError",
            ["Dependency job 1 finished with status 'success', not one of 'error' as required"]
        ])
    );
    // A canceled dependency cancels; accepted, it is met.
    write_job(
        &root,
        4,
        &[
            depending(json!([[2, ["canceled"]]])),
            depending(json!([[2, []]])),
        ],
    );
    let job = run(&root, 4);
    assert_eq!(job.ops[0].status, Status::Success);
    assert_eq!(job.ops[1].status, Status::Canceled);
    assert_eq!(job.ops[1].result, json!("Dependency job 2 was cancelled"));
    // An unknown job and the job itself.
    write_job(&root, 5, &[depending(json!([[77, []]]))]);
    let job = run(&root, 5);
    assert_eq!(job.status(), Status::Error);
    assert_eq!(
        job.ops[0].result,
        json!(["OpExecError", ["Dependency error: job 77 not found"]])
    );
    write_job(&root, 6, &[depending(json!([[6, []]]))]);
    let job = run(&root, 6);
    assert_eq!(
        job.ops[0].result,
        json!(["OpExecError", ["Job can't depend on itself"]])
    );
    // An archived dependency is found in the archive.
    let mut archived = read_job(&root, 1);
    archived.id = 10_001;
    let path = queue::archived_job_path(&queue_dir(&root), 10_001);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, queue::encode_job(&archived)).unwrap();
    write_job(&root, 7, &[depending(json!([[10_001, ["success"]]]))]);
    assert_eq!(run(&root, 7).status(), Status::Success);
    assert_clean(&wconfd);
}

#[test]
fn without_wconfd_the_job_waits_and_can_be_canceled() {
    // D39: an unreachable wconfd is waited for, not an opcode failure.
    let mut wconfd = cluster();
    let root = wconfd.root().path();
    wconfd.stop();
    write_job(&root, 1, &[exec(&["/bin/true"]), exec(&["/bin/true"])]);
    let runner = Runner::start(&root, 1);
    wait_until("the opcode shows waiting", DEADLINE, || {
        read_job(&root, 1).ops[0].status == Status::Waiting
    });
    kill(Pid::from_raw(runner.pid() as i32), Signal::SIGTERM).expect("SIGTERM the runner");
    runner.finish();
    let job = read_job(&root, 1);
    assert_eq!(job.status(), Status::Canceled);
    assert_final_with_timestamps(&job);
    let left: Vec<_> = fs::read_dir(root.join("livelocks"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .filter(|name| name.to_string_lossy().starts_with("job_"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn unreadable_settings_fail_the_job_and_it_still_ends() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    fs::write(root.join("warden.toml"), "[luxid]\nno_such_setting = 1\n").unwrap();
    write_job(&root, 1, &[exec(&["/bin/true"]), exec(&["/bin/true"])]);
    let job = run(&root, 1);
    assert_eq!(job.status(), Status::Error);
    assert_final_with_timestamps(&job);
    let reason = job.ops[0].result[1][0].as_str().unwrap().to_owned();
    assert!(reason.starts_with("cannot load the settings: "), "{reason}");
    assert_eq!(job.ops[0].exec_timestamp, None);
    assert_clean(&wconfd);
}

#[test]
fn two_runners_of_one_job_run_it_once() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    let marks = root.join("marks");
    let append = format!("echo ran >> {}; sleep 0.2", marks.display());
    write_job(&root, 1, &[exec(&["/bin/sh", "-c", &append])]);
    // As when a luxid killed right after starting a runner is followed by
    // one that starts another.
    let first = Runner::start(&root, 1);
    let second = Runner::start(&root, 1);
    first.finish();
    second.finish();
    let job = read_job(&root, 1);
    assert_eq!(job.status(), Status::Success, "{job:?}");
    let ran = fs::read_to_string(&marks).expect("the program ran");
    assert_eq!(ran.lines().count(), 1, "the job ran more than once");
    assert_clean(&wconfd);
}

#[test]
fn a_runner_started_before_the_commit_waits_for_luxids_word() {
    let wconfd = cluster();
    let root = wconfd.root().path();
    write_job(&root, 1, &[exec(&["/bin/true"])]);
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_job-runner"))
            .arg("--root")
            .arg(&root)
            .arg(warden::jobs::runner_contract::WAIT_FOR_COMMIT_FLAG)
            .arg("1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn job-runner")
    };
    // Its stdin ends without a byte: luxid's commit failed, or luxid died.
    let mut child = spawn();
    drop(child.stdin.take());
    assert!(wait_for_exit(&mut child, DEADLINE).success());
    let job = read_job(&root, 1);
    assert_eq!(job.status(), Status::Queued);
    assert_eq!(job.process_id, None, "the runner touched the job");
    assert_eq!(job.start_timestamp, None, "the runner touched the job");
    let livelocks = fs::read_dir(root.join("livelocks"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("job_"))
        .count();
    assert_eq!(livelocks, 0, "the runner made a livelock");
    // A byte: the job is durable, the runner goes on.
    let mut child = spawn();
    child
        .stdin
        .take()
        .expect("a pipe")
        .write_all(b"g")
        .expect("tell the runner");
    assert!(wait_for_exit(&mut child, DEADLINE).success());
    assert_eq!(read_job(&root, 1).status(), Status::Success);
    assert_clean(&wconfd);
}
