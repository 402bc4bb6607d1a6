//! Failing syncs: the kernel answers `EIO` to the daemons' `fsync`,
//! `fdatasync` and journal writes while the test says so, and nothing a
//! daemon acknowledged is lost, nothing it refused appears later, and a
//! failed sync is never taken for a good one.
//!
//! The failure is injected into the running daemon by `strace` (its
//! `inject=SYSCALL:error=EIO`), attached to every thread of the daemon
//! for as long as the fault lasts: the system call is not made and the
//! daemon sees the error, exactly as from a disk that fails. The tests
//! need `strace` (`tests/ganeti_client/setup.sh` installs it); without
//! it they fail saying so, they never pass without having faulted.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::daemon::{DEADLINE, OwnerProcess, Wconfd, file_names, wait_for_exit, wait_until};
use crate::luxid::{Cluster, Luxid};

/// `strace` attached to every thread of a process (and to those it starts
/// meanwhile), failing `syscalls`
/// with `EIO` until lifted (or until the process exits).
struct SyncFault {
    strace: Option<Child>,
}

impl SyncFault {
    fn inject(pid: u32, syscalls: &str) -> SyncFault {
        let tasks: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the process's threads")
            .map(|task| {
                task.expect("a thread")
                    .file_name()
                    .into_string()
                    .expect("a tid")
            })
            .collect();
        let mut command = Command::new("strace");
        // `-f -p PID` attaches to every thread, and to the threads started
        // while the fault lasts (luxid commits on a thread of its own).
        command
            .args(["-f", "-qq", "-o", "/dev/null"])
            .arg(format!("--trace={syscalls}"))
            .arg(format!("--inject={syscalls}:error=EIO"))
            .arg("-p")
            .arg(pid.to_string());
        let strace = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot run strace ({error}): it injects the failing syncs; \
                     run `bash tests/ganeti_client/setup.sh` as root to install it"
                )
            });
        let tracer = strace.id().to_string();
        wait_until("strace attached to every thread", DEADLINE, || {
            tasks.iter().all(|task| {
                fs::read_to_string(format!("/proc/{pid}/task/{task}/status")).is_ok_and(|status| {
                    status
                        .lines()
                        .any(|line| line.split_whitespace().eq(["TracerPid:", tracer.as_str()]))
                })
            })
        });
        SyncFault {
            strace: Some(strace),
        }
    }

    /// The disk works again: strace detaches.
    fn lift(mut self) {
        let mut strace = self.strace.take().expect("attached");
        kill(Pid::from_raw(strace.id() as i32), Signal::SIGINT).expect("SIGINT to strace");
        wait_for_exit(&mut strace, DEADLINE);
    }
}

impl Drop for SyncFault {
    fn drop(&mut self) {
        if let Some(mut strace) = self.strace.take() {
            let _ = strace.kill();
            let _ = strace.wait();
        }
    }
}

fn lock(name: &str) -> Value {
    json!([name, "exclusive"])
}

fn held(wconfd: &Wconfd, owner: &OwnerProcess) -> Vec<Value> {
    wconfd
        .client()
        .ok("listLocks", json!([owner.owner()]))
        .as_array()
        .expect("a list")
        .iter()
        .map(|entry| entry[0].clone())
        .collect()
}

fn cluster_name(config: &Value) -> Value {
    config["cluster"]["cluster_name"].clone()
}

/// wconfd: a `writeConfig` whose sync fails is refused and changes
/// nothing (locks go on being served); a lock change whose journal write
/// fails is never acknowledged: wconfd stops naming the journal, and the
/// restart has every acknowledged lock and not the refused one.
#[test]
fn wconfd_refuses_a_config_write_and_stops_on_a_lock_change_whose_sync_fails() {
    let mut wconfd = Wconfd::start();
    let first = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let second = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    let writer = OwnerProcess::spawn(&wconfd.livelock_dir(), 3);
    let mut client = wconfd.client();
    assert_eq!(
        client.ok("tryUpdateLocks", json!([first.owner(), [lock("node/a")]])),
        json!([])
    );
    let config = client.ok("readConfig", json!([]));
    assert_eq!(
        client.ok("lockConfig", json!([writer.owner(), false])),
        config
    );

    // Config files are replaced with fsync (of the file, then of its
    // directory).
    let fault = SyncFault::inject(wconfd.pid(), "fsync");
    let mut changed = config.clone();
    changed["cluster"] = json!({"cluster_name": "after-the-fault"});
    let (class, args) = client
        .call("writeConfig", json!([writer.owner(), changed]))
        .expect_err("a config write whose sync fails");
    assert!(
        args.to_string().contains("Input/output error"),
        "{class}: {args}"
    );
    assert_eq!(client.ok("readConfig", json!([])), config);
    // Lock changes do not need fsync: served on.
    assert_eq!(
        client.ok("tryUpdateLocks", json!([first.owner(), [lock("node/b")]])),
        json!([])
    );
    fault.lift();
    assert_eq!(
        client.ok("writeConfig", json!([writer.owner(), changed])),
        json!([]),
        "the same write once syncs work"
    );
    assert_eq!(
        cluster_name(&client.ok("readConfig", json!([]))),
        json!("after-the-fault")
    );

    // The journal: direct writes (pwrite64 with O_DSYNC), or buffered
    // writes and fdatasync where the file system has no direct I/O.
    let fault = SyncFault::inject(wconfd.pid(), "pwrite64,fdatasync");
    let answer = client.try_call("tryUpdateLocks", json!([second.owner(), [lock("node/c")]]));
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "a lock change whose journal write failed was acknowledged: {answer:?}"
    );
    let status = wconfd.wait_exit();
    drop(fault);
    assert!(!status.success(), "wconfd exited with {status}");
    let log = wconfd.log();
    assert!(
        log.contains("locks.journal") && log.contains("Input/output error"),
        "the log names the journal and the error:\n{log}"
    );

    let restarted = Wconfd::restart_on(wconfd.root());
    assert_eq!(held(&restarted, &first), [json!("node/a"), json!("node/b")]);
    assert_eq!(held(&restarted, &second), Vec::<Value>::new());
    assert_eq!(
        cluster_name(&restarted.client().ok("readConfig", json!([]))),
        json!("after-the-fault")
    );
}

/// The queue's files other than its fixed ones (`lock`, `serial`,
/// `version`, `archive`): job files and any temp file.
fn job_and_temp_files(root: &Path) -> Vec<String> {
    file_names(&root.join("queue"))
        .into_iter()
        .filter(|name| !matches!(name.as_str(), "lock" | "serial" | "version" | "archive"))
        .collect()
}

fn delay_job() -> Value {
    json!([[{"OP_ID": "OP_TEST_DELAY", "duration": 0.01}]])
}

/// luxid: a submission whose sync fails is refused (the client is told
/// why), leaves no file, and is not there after a restart; the drain flag
/// is not set by a refused `SetDrainFlag`; service resumes when syncs
/// work, with ids that never go back.
#[test]
fn luxid_refuses_submissions_whose_sync_fails_and_never_shows_them() {
    let mut cluster = Cluster::start();
    let mut client = cluster.client();
    let before = client.ok("SubmitJob", delay_job()).as_u64().expect("an id");
    assert_eq!(cluster.wait_final(before), "success", "{}", cluster.logs());

    let fault = SyncFault::inject(cluster.luxid.pid(), "fsync,fdatasync");
    let (class, args) = client
        .call("SubmitJob", delay_job())
        .expect_err("a submission whose sync fails");
    let reason = args.to_string();
    assert!(
        reason.contains("cannot write the job queue") && reason.contains("Input/output error"),
        "{class}: {reason}"
    );
    let mut client = cluster.client();
    let (_, args) = client
        .call("SetDrainFlag", json!([true]))
        .expect_err("a drain flag whose sync fails");
    assert!(args.to_string().contains("Input/output error"), "{args}");
    assert_eq!(
        client.ok("QueryConfigValues", json!([["drain_flag"]])),
        json!([false])
    );
    let files_during = job_and_temp_files(&cluster.root().path());
    assert_eq!(
        files_during,
        [format!("job-{before}")],
        "only the acknowledged job has a file (no temp files either)"
    );
    fault.lift();

    let after = client.ok("SubmitJob", delay_job()).as_u64().expect("an id");
    assert!(after > before);
    assert_eq!(cluster.wait_final(after), "success");

    cluster.luxid.kill9();
    cluster.luxid = Luxid::start_on(cluster.root());
    let mut client = cluster.client();
    let listed = client.ok("QueryJobs", json!([null, ["id", "status"]]));
    let listed: Vec<(u64, String)> = listed
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            (
                row[0].as_u64().expect("an id"),
                row[1].as_str().expect("a status").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (before, "success".to_owned()),
            (after, "success".to_owned())
        ]
    );
    let next = client.ok("SubmitJob", delay_job()).as_u64().expect("an id");
    assert!(next > after, "ids never go back: {next} after {after}");
    assert_eq!(cluster.wait_final(next), "success");
}
