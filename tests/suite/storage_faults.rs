//! Storage faults with the real daemons: the root (or its queue) on a
//! small tmpfs that fills up, and made read-only.
//!
//! Each test runs its daemons in a private mount namespace ([`Sandbox`]):
//! `unshare --user --map-root-user --mount` (no privilege needed), or, where
//! user namespaces are disabled, `unshare --mount` as root. The namespace
//! mounts a tmpfs of a chosen size on the root (and optionally another on
//! `queue/`); the daemons, their runners and their programs live inside it,
//! the test reaches its files and sockets through `/proc/<pid>/root` of the
//! namespace's holder process. If neither form works the test fails with
//! the reason: it never passes without having faulted anything.
//!
//! "Read-only" is a read-only bind mount over the directory: every open
//! for writing after it fails with `EROFS`. Files the daemons opened before
//! (wconfd's journal) stay writable, as they would under an administrator's
//! `mount -o remount,ro` (which the kernel refuses while files are open for
//! writing); a forced read-only remount after an I/O error fails those
//! writes too, which the full-disk test covers (a failed journal write).
//!
//! The journal is written into space allocated ahead of its records, 1 MiB
//! at a time (D28): on a full disk lock changes go on being acknowledged
//! until the records reach the end of that space and the journal must
//! grow. The full-disk tests make large lock changes until then.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::stat::Mode;
use nix::unistd::Pid;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::daemon::{Client, DEADLINE, Root, file_names, wait_for_exit, wait_until};

const MIB: u64 = 1024 * 1024;

/// Locks taken by each lock change on a full disk: its journal record is
/// about 8 KiB, so some 130 changes fill the journal's preallocated
/// space (`JOURNAL_GROWTH_BYTES`, 1 MiB).
const LOCKS_PER_CHANGE: usize = 250;

/// Lock changes tried on a full disk before the test gives up on seeing
/// the journal refuse one: twice as many records as the preallocated
/// space holds.
const LOCK_CHANGES_ON_A_FULL_DISK_MAX: usize = 260;

/// The fault a test injects into a directory of the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The file system is full (`ENOSPC`).
    Full,
    /// The directory is mounted read-only (`EROFS`).
    ReadOnly,
}

impl Fault {
    /// How the daemons' errors spell it (the `io::Error` text).
    fn text(self) -> &'static str {
        match self {
            Fault::Full => "No space left on device",
            Fault::ReadOnly => "Read-only file system",
        }
    }
}

/// A private mount namespace with a tmpfs on a temp root, held open by a
/// holder process until dropped.
struct Sandbox {
    /// The mount point: the root as the daemons see it.
    root: Root,
    holder: Child,
    holder_stdin: Option<ChildStdin>,
    /// Whether the namespace has its own user namespace (`nsenter -U`).
    user_namespace: bool,
    /// Daemon logs, outside the sandbox (a full disk must not lose them).
    logs: TempDir,
}

/// Mounts the tmpfs (and the queue's, if asked), says `ready`, then waits
/// for the end of its stdin.
const HOLDER_SCRIPT: &str = r#"
set -e
mount -t tmpfs -o size="$1",mode=0755 tmpfs "$2"
if [ "$3" != 0 ]; then
    mkdir "$2/queue"
    mount -t tmpfs -o size="$3",mode=0755 tmpfs "$2/queue"
fi
echo ready
read -r _ || true
"#;

impl Sandbox {
    /// A root of `root_bytes`, with `queue/` on its own tmpfs of
    /// `queue_bytes` if given.
    fn new(root_bytes: u64, queue_bytes: Option<u64>) -> Sandbox {
        let root = Root::new();
        let mut refusals = Vec::new();
        for (user_namespace, flags) in [
            (true, &["--user", "--map-root-user", "--mount"][..]),
            (false, &["--mount"][..]),
        ] {
            let mut holder = Command::new("unshare")
                .args(flags)
                .args(["--propagation", "private", "sh", "-c", HOLDER_SCRIPT, "sh"])
                .arg(root_bytes.to_string())
                .arg(root.path())
                .arg(queue_bytes.unwrap_or(0).to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|error| panic!("cannot run unshare: {error}"));
            let stdout = holder.stdout.take().expect("piped");
            let (sender, said) = mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = sender.send(line);
            });
            let line = said
                .recv_timeout(DEADLINE)
                .unwrap_or_else(|_| panic!("the sandbox did not start within {DEADLINE:?}"));
            if line.trim() == "ready" {
                let holder_stdin = holder.stdin.take();
                return Sandbox {
                    root,
                    holder,
                    holder_stdin,
                    user_namespace,
                    logs: tempfile::tempdir().expect("a temp dir for the logs"),
                };
            }
            let status = wait_for_exit(&mut holder, DEADLINE);
            let mut stderr = String::new();
            let _ = holder
                .stderr
                .take()
                .expect("piped")
                .read_to_string(&mut stderr);
            refusals.push(format!(
                "`unshare {}` ({status}): {}",
                flags.join(" "),
                stderr.trim()
            ));
        }
        panic!(
            "the storage-fault tests need a private mount namespace to mount a tmpfs in, \
             and none could be made (user namespaces disabled, and not root?):\n{}",
            refusals.join("\n")
        );
    }

    /// The root as the daemons see it.
    fn root(&self) -> PathBuf {
        self.root.path()
    }

    /// The sandbox's `path` (a path as the daemons see it) as the test
    /// reaches it.
    fn view(&self, path: &Path) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.holder.id()))
            .join(path.strip_prefix("/").expect("sandbox paths are absolute"))
    }

    /// The root's `relative` path as the test reaches it.
    fn view_of(&self, relative: &str) -> PathBuf {
        self.view(&self.root().join(relative))
    }

    /// A command that runs `program` inside the namespace.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg("--target")
            .arg(self.holder.id().to_string())
            .arg("--mount");
        if self.user_namespace {
            command.arg("--user");
        }
        command.arg("--").arg(program);
        command
    }

    /// Runs a shell script inside the namespace; it must succeed.
    fn run(&self, script: &str, args: &[&Path]) {
        let output = self
            .command("sh")
            .args(["-c", script, "sh"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter");
        assert!(
            output.status.success(),
            "{script} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Injects `fault` into the root's `relative` directory (which must be
    /// a tmpfs of its own, or the root).
    fn inject(&self, fault: Fault, relative: &str) {
        match fault {
            Fault::Full => self.fill(relative),
            Fault::ReadOnly => self.run(
                r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1""#,
                &[&self.root().join(relative)],
            ),
        }
    }

    /// Takes `fault` away again.
    fn lift(&self, fault: Fault, relative: &str) {
        match fault {
            Fault::Full => {
                fs::remove_file(self.view_of(relative).join("filler")).expect("remove the filler")
            }
            Fault::ReadOnly => self.run(r#"umount "$1""#, &[&self.root().join(relative)]),
        }
    }

    /// Fills the file system of `relative` up to its last page.
    fn fill(&self, relative: &str) {
        let mut filler = File::create(self.view_of(relative).join("filler")).expect("the filler");
        let chunk = vec![0xA5u8; 64 * 1024];
        let error = loop {
            if let Err(error) = filler.write_all(&chunk) {
                break error;
            }
        };
        assert_eq!(
            error.raw_os_error(),
            Some(Errno::ENOSPC as i32),
            "filling the disk: {error}"
        );
    }

    fn daemon(
        &self,
        name: &'static str,
        socket: &str,
    ) -> Result<SandboxDaemon, (ExitStatus, String)> {
        SandboxDaemon::start(self, name, socket)
    }

    fn wconfd(&self) -> SandboxDaemon {
        self.daemon("wconfd", "socket/wconfd.sock")
            .unwrap_or_else(|(status, log)| panic!("wconfd exited with {status}:\n{log}"))
    }

    fn luxid(&self) -> SandboxDaemon {
        self.daemon("luxid", "socket/luxid.sock")
            .unwrap_or_else(|(status, log)| panic!("luxid exited with {status}:\n{log}"))
    }

    /// A lock owner: this test process, holding a livelock in the root.
    fn owner(&self, id: u64) -> Owner {
        let path = self.root().join(format!("livelocks/job_{id:06}_1"));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.view(&path))
            .expect("create the livelock");
        file.try_lock().expect("lock the livelock");
        Owner {
            _livelock: file,
            wire: json!([id, path, std::process::id()]),
        }
    }

    /// The names of files in the root's `relative` directory.
    fn names(&self, relative: &str) -> BTreeSet<String> {
        file_names(&self.view_of(relative))
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.holder_stdin = None;
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

struct Owner {
    _livelock: File,
    wire: Value,
}

/// A daemon running inside a [`Sandbox`]; killed when dropped.
struct SandboxDaemon {
    name: &'static str,
    child: Option<Child>,
    log_path: PathBuf,
    socket: PathBuf,
}

impl SandboxDaemon {
    fn start(
        sandbox: &Sandbox,
        name: &'static str,
        socket: &str,
    ) -> Result<SandboxDaemon, (ExitStatus, String)> {
        let binary = match name {
            "wconfd" => env!("CARGO_BIN_EXE_wconfd"),
            _ => env!("CARGO_BIN_EXE_luxid"),
        };
        let log_path = sandbox.logs.path().join(format!(
            "{name}.{}.log",
            fs::read_dir(sandbox.logs.path()).expect("logs").count()
        ));
        let child = sandbox
            .command(binary)
            .arg("--root")
            .arg(sandbox.root())
            .env("WARDEN_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log_path).expect("the log file"))
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {name}: {error}"));
        let mut daemon = SandboxDaemon {
            name,
            child: Some(child),
            log_path,
            socket: sandbox.view_of(socket),
        };
        let pid = daemon.pid();
        let deadline = Instant::now() + DEADLINE;
        loop {
            let child = daemon.child.as_mut().expect("started");
            if let Some(status) = child.try_wait().expect("try_wait") {
                daemon.child = None;
                return Err((status, daemon.log()));
            }
            // nsenter executes the daemon in its own process: the peer of
            // the socket is the child.
            if let Ok(stream) = UnixStream::connect(&daemon.socket)
                && warden::sys::peer_credentials(&stream).is_ok_and(|peer| peer.pid == pid)
            {
                return Ok(daemon);
            }
            assert!(
                Instant::now() < deadline,
                "{name} not ready within {DEADLINE:?}:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log_path).unwrap_or_default()).into_owned()
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// Waits for the daemon to exit by itself.
    fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        wait_for_exit(&mut child, DEADLINE)
    }

    /// SIGTERM; it must exit with status 0.
    fn stop(&mut self) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM).expect("SIGTERM");
        let status = self.wait_exit();
        assert!(
            status.success(),
            "{} stopped with {status}:\n{}",
            self.name,
            self.log()
        );
    }
}

impl Drop for SandboxDaemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The names of the locks `owner` holds, as wconfd lists them.
fn held(client: &mut Client, owner: &Owner) -> BTreeSet<String> {
    client
        .ok("listLocks", json!([owner.wire]))
        .as_array()
        .expect("a list")
        .iter()
        .map(|lock| lock[0].as_str().expect("a lock name").to_owned())
        .collect()
}

fn write_config(
    client: &mut Client,
    owner: &Owner,
    cluster_name: &str,
) -> Result<Value, (String, Value)> {
    let mut config = client.ok("readConfig", json!([]));
    config["cluster"] = json!({"cluster_name": cluster_name});
    client
        .call("writeConfig", json!([owner.wire, config]))
        .map(|_| client.ok("readConfig", json!([])))
}

fn assert_mentions(what: &str, text: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            text.contains(part),
            "{what} does not mention {part:?}:\n{text}"
        );
    }
}

/// Lock changes by `locker` on a full disk, each taking
/// [`LOCKS_PER_CHANGE`] new locks (named to sort after every lock held
/// before, as the lock order wants), until wconfd stops answering: the one
/// whose record needs the journal to grow. Each acknowledged change is
/// added to `locks`; returns how many were acknowledged, or `None` if
/// wconfd never stopped.
fn lock_changes_until_the_journal_must_grow(
    client: &mut Client,
    locker: &Owner,
    locks: &mut BTreeSet<String>,
) -> Option<usize> {
    for change in 0..LOCK_CHANGES_ON_A_FULL_DISK_MAX {
        let names: Vec<String> = (0..LOCKS_PER_CHANGE)
            .map(|index| format!("node/p{change:04}-{index:04}"))
            .collect();
        let request: Vec<Value> = names
            .iter()
            .map(|name| json!([name, "exclusive"]))
            .collect();
        match client.try_call("tryUpdateLocks", json!([locker.wire, request])) {
            Ok(Ok(blockers)) => {
                assert_eq!(blockers, json!([]));
                locks.extend(names);
            }
            Ok(Err(failure)) => panic!("tryUpdateLocks answered {failure:?}"),
            Err(_) => return Some(change),
        }
    }
    None
}

#[test]
fn wconfd_on_a_full_disk_refuses_config_writes_and_stops_on_a_lock_change() {
    // The journal takes 1 MiB from the start; once space returns, it must
    // have room to grow by another.
    let sandbox = Sandbox::new(4 * MIB, None);
    let mut wconfd = sandbox.wconfd();
    let mut client = wconfd.client();
    let owner = sandbox.owner(1);
    let locker = sandbox.owner(2);
    client.ok("lockConfig", json!([owner.wire, false]));
    let mut acknowledged = write_config(&mut client, &owner, "before").expect("writeConfig");
    client.ok(
        "tryUpdateLocks",
        json!([locker.wire, [["node/n0000", "exclusive"]]]),
    );
    let mut locks = held(&mut client, &locker);

    // A configuration that cannot be written: a clear error, nothing
    // changes, wconfd serves on; once space returns, writes resume.
    sandbox.inject(Fault::Full, "");
    let (class, args) = write_config(&mut client, &owner, "during").expect_err("a full disk");
    assert_eq!(class, "GenericError");
    assert_mentions(
        "the error",
        &args[0].to_string(),
        &["config.data", Fault::Full.text()],
    );
    assert_eq!(client.ok("readConfig", json!([])), acknowledged);
    assert!(
        !sandbox.names("").iter().any(|name| name.ends_with(".tmp")),
        "a temp file was left on the full disk"
    );
    sandbox.lift(Fault::Full, "");
    acknowledged = write_config(&mut client, &owner, "after").expect("space returned");

    // Lock changes on the full disk: the journal's preallocated space takes
    // them, each acknowledged change durable, until the journal must grow;
    // that change stops wconfd (D8, D37), unanswered.
    sandbox.inject(Fault::Full, "");
    let acknowledged_on_a_full_disk =
        lock_changes_until_the_journal_must_grow(&mut client, &locker, &mut locks).unwrap_or_else(
            || {
                panic!(
                    "{LOCK_CHANGES_ON_A_FULL_DISK_MAX} lock changes on a full disk were all \
                     acknowledged"
                )
            },
        );
    assert!(
        acknowledged_on_a_full_disk > 0,
        "no lock change went into the journal's preallocated space"
    );
    let status = wconfd.wait_exit();
    assert!(!status.success(), "wconfd exited with {status}");
    assert_mentions(
        "wconfd's log",
        &wconfd.log(),
        &[
            "could not be made durable",
            "locks.journal",
            Fault::Full.text(),
        ],
    );

    // A restart once space returned: exactly what was acknowledged.
    sandbox.lift(Fault::Full, "");
    let wconfd = sandbox.wconfd();
    let mut client = wconfd.client();
    assert_eq!(held(&mut client, &locker), locks);
    assert_eq!(client.ok("readConfig", json!([])), acknowledged);
    client.ok(
        "tryUpdateLocks",
        json!([locker.wire, [["node/n0000", "release"]]]),
    );
    // A change larger than the refused one, which did not fit, with locks
    // after every lock held: the journal grows now.
    let request: Vec<Value> = (0..LOCKS_PER_CHANGE)
        .map(|index| json!([format!("node/q-after-restart-{index:04}"), "exclusive"]))
        .collect();
    assert_eq!(
        client.ok("tryUpdateLocks", json!([locker.wire, request])),
        json!([])
    );
    let journal_bytes = fs::metadata(sandbox.view_of("locks.journal"))
        .expect("the journal")
        .len();
    assert!(
        journal_bytes >= 2 * MIB,
        "the journal did not grow: {journal_bytes} bytes"
    );
    write_config(&mut client, &owner, "restarted").expect("writeConfig after the restart");
}

#[test]
fn wconfd_on_a_read_only_root_refuses_config_writes_and_start_up() {
    let sandbox = Sandbox::new(8 * MIB, None);
    let mut wconfd = sandbox.wconfd();
    let mut client = wconfd.client();
    let owner = sandbox.owner(1);
    let locker = sandbox.owner(2);
    client.ok("lockConfig", json!([owner.wire, false]));
    let acknowledged = write_config(&mut client, &owner, "before").expect("writeConfig");
    client.ok(
        "tryUpdateLocks",
        json!([locker.wire, [["node/n0", "exclusive"]]]),
    );

    sandbox.inject(Fault::ReadOnly, "");
    let (class, args) = write_config(&mut client, &owner, "during").expect_err("read-only");
    assert_eq!(class, "GenericError");
    assert_mentions(
        "the error",
        &args[0].to_string(),
        &["config.data", Fault::ReadOnly.text()],
    );
    assert_eq!(client.ok("readConfig", json!([])), acknowledged);
    // The journal was opened before: its writes still go through.
    client.ok(
        "tryUpdateLocks",
        json!([locker.wire, [["node/n1", "exclusive"]]]),
    );
    let locks = held(&mut client, &locker);
    wconfd.stop();

    let (status, log) = sandbox
        .daemon("wconfd", "socket/wconfd.sock")
        .err()
        .expect("wconfd started on a read-only root");
    assert!(!status.success(), "wconfd exited with {status}");
    assert_mentions(
        "wconfd's log",
        &log,
        &[
            &sandbox.root().display().to_string(),
            Fault::ReadOnly.text(),
        ],
    );

    sandbox.lift(Fault::ReadOnly, "");
    let wconfd = sandbox.wconfd();
    let mut client = wconfd.client();
    assert_eq!(held(&mut client, &locker), locks);
    assert_eq!(client.ok("readConfig", json!([])), acknowledged);
    write_config(&mut client, &owner, "after").expect("writeConfig once writable");
}

fn exec(argv: &[&str]) -> Value {
    json!({"OP_ID": "OP_EXEC", "argv": argv})
}

fn submit(client: &mut Client) -> Result<Value, (String, Value)> {
    client.call(
        "SubmitJob",
        json!([[{"OP_ID": "OP_TEST_DELAY", "duration": 0.01}]]),
    )
}

fn query(client: &mut Client, id: u64, fields: &[&str]) -> Vec<Value> {
    let rows = client.ok("QueryJobs", json!([[id], fields]));
    rows[0].as_array().expect("a row").clone()
}

fn wait_status(luxid: &SandboxDaemon, id: u64, wanted: &[&str]) -> String {
    let mut status = String::new();
    wait_until(&format!("job {id} is one of {wanted:?}"), DEADLINE, || {
        status = query(&mut luxid.client(), id, &["status"])[0]
            .as_str()
            .unwrap_or("(none)")
            .to_owned();
        wanted.contains(&status.as_str())
    });
    status
}

/// luxid with its queue on a tmpfs of its own (wconfd's journal is on
/// the root's, so its locks are not part of this fault): submissions are
/// refused with the reason, a runner that cannot record its job makes the
/// job end `error` saying so once the disk takes writes again, service
/// resumes without a restart, and a restart finds exactly what was
/// acknowledged.
fn luxid_with_a_faulty_queue(fault: Fault) {
    let sandbox = Sandbox::new(64 * MIB, Some(MIB));
    let _wconfd = sandbox.wconfd();
    let mut luxid = sandbox.luxid();
    let mut client = luxid.client();
    let before = submit(&mut client)
        .expect("SubmitJob")
        .as_u64()
        .expect("an id");
    assert_eq!(
        wait_status(&luxid, before, &["success", "error"]),
        "success"
    );

    // A job whose program prints a line when the test says so.
    let fifo = sandbox.root().join("fifo");
    nix::unistd::mkfifo(&sandbox.view(&fifo), Mode::S_IRUSR | Mode::S_IWUSR).expect("mkfifo");
    let script = format!("read -r line < {}; echo \"$line\"", fifo.display());
    let running = client
        .ok("SubmitJob", json!([[exec(&["sh", "-c", &script])]]))
        .as_u64()
        .expect("an id");
    wait_status(&luxid, running, &["running"]);

    sandbox.inject(fault, "queue");
    let (class, args) = submit(&mut client).expect_err("a faulty queue");
    assert_eq!(class, "GenericError");
    assert_mentions(
        "the error",
        &args[0].to_string(),
        &["cannot write the job queue", fault.text()],
    );
    // The refused job could start at once: its runner was started while
    // the commit was tried, got no word, and left the job alone.
    wait_until("the refused job's runner leaves it alone", DEADLINE, || {
        luxid.log().contains("luxid did not confirm the job")
    });
    assert!(
        !sandbox
            .names("queue")
            .iter()
            .any(|name| name.ends_with(".tmp")),
        "temp files left in the queue: {:?}",
        sandbox.names("queue")
    );
    assert_eq!(
        query(&mut luxid.client(), before, &["status"]),
        [json!("success")]
    );

    // The program prints: its runner cannot write the job file and exits;
    // luxid cannot write the job's end either, and keeps trying.
    let deadline = Instant::now() + DEADLINE;
    let mut writer = loop {
        match OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(sandbox.view(&fifo))
        {
            Ok(writer) => break writer,
            Err(error) if error.raw_os_error() == Some(Errno::ENXIO as i32) => {
                assert!(
                    Instant::now() < deadline,
                    "the program never opened the fifo"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(error) => panic!("open the fifo: {error}"),
        }
    };
    writer.write_all(b"hello\n").expect("write to the fifo");
    drop(writer);
    wait_until(
        "luxid cannot record the dead runner's job",
        DEADLINE,
        || luxid.log().contains("cannot record the death of a job"),
    );
    assert_mentions(
        "luxid's log",
        &luxid.log(),
        &["cannot write the job file", fault.text()],
    );
    assert_eq!(
        query(&mut luxid.client(), running, &["status"]),
        [json!("running")]
    );

    sandbox.lift(fault, "queue");
    assert_eq!(
        wait_status(&luxid, running, &["success", "error", "canceled"]),
        "error"
    );
    let result = query(&mut luxid.client(), running, &["opresult"])[0].to_string();
    assert_mentions(
        "the job's result",
        &result,
        &[
            &format!("detected death of job {running}"),
            "could not write the job file",
        ],
    );
    let mut client = luxid.client();
    let after = submit(&mut client)
        .expect("SubmitJob once writable")
        .as_u64()
        .expect("an id");
    assert_eq!(wait_status(&luxid, after, &["success", "error"]), "success");

    // A restart: exactly the acknowledged jobs, the refused one nowhere.
    luxid.stop();
    let mut luxid = sandbox.luxid();
    let mut client = luxid.client();
    let rows = client.ok(
        "QueryJobs",
        json!([[before, running, running + 1, after], ["id", "status"]]),
    );
    assert_eq!(
        rows,
        json!([
            [before, "success"],
            [running, "error"],
            [running + 1, null],
            [after, "success"]
        ])
    );
    let jobs: Vec<String> = sandbox
        .names("queue")
        .into_iter()
        .filter(|name| name.starts_with("job-"))
        .collect();
    assert_eq!(jobs, [before, running, after].map(|id| format!("job-{id}")));
    luxid.stop();

    // Start-up on the faulty queue: refused naming the file when it is
    // read-only; served (and submissions refused) when it is full.
    sandbox.inject(fault, "queue");
    match fault {
        Fault::ReadOnly => {
            let (status, log) = sandbox
                .daemon("luxid", "socket/luxid.sock")
                .err()
                .expect("luxid started on a read-only queue");
            assert!(!status.success(), "luxid exited with {status}");
            assert_mentions("luxid's log", &log, &["queue/lock", fault.text()]);
        }
        Fault::Full => {
            let luxid = sandbox.luxid();
            let mut client = luxid.client();
            assert_eq!(query(&mut client, after, &["status"]), [json!("success")]);
            let (_, args) = submit(&mut client).expect_err("a full queue");
            assert_mentions("the error", &args[0].to_string(), &[fault.text()]);
        }
    }
}

#[test]
fn luxid_with_a_full_queue_refuses_submissions_and_ends_a_stuck_job_when_space_returns() {
    luxid_with_a_faulty_queue(Fault::Full);
}

#[test]
fn luxid_with_a_read_only_queue_refuses_submissions_and_ends_a_stuck_job_once_writable() {
    luxid_with_a_faulty_queue(Fault::ReadOnly);
}

/// Both daemons on one root that fills up: a submission is refused, the
/// lock change that needs the journal to grow stops wconfd (D37), luxid
/// serves on without it; once space
/// returns a restarted wconfd has exactly the acknowledged locks, and
/// luxid, never restarted, runs new jobs against it.
#[test]
fn both_daemons_on_one_full_root_refuse_what_needs_the_disk_and_resume() {
    let sandbox = Sandbox::new(4 * MIB, None);
    let mut wconfd = sandbox.wconfd();
    let luxid = sandbox.luxid();
    let mut client = luxid.client();
    let before = submit(&mut client)
        .expect("SubmitJob")
        .as_u64()
        .expect("an id");
    assert_eq!(
        wait_status(&luxid, before, &["success", "error"]),
        "success"
    );
    let locker = sandbox.owner(1);
    let mut locks = BTreeSet::new();

    sandbox.inject(Fault::Full, "");
    let (class, args) = submit(&mut client).expect_err("a full root");
    assert_eq!(class, "GenericError");
    assert_mentions("the error", &args[0].to_string(), &[Fault::Full.text()]);
    let acknowledged_on_a_full_disk =
        lock_changes_until_the_journal_must_grow(&mut wconfd.client(), &locker, &mut locks)
            .expect("every lock change on a full disk was acknowledged");
    assert!(
        acknowledged_on_a_full_disk > 0,
        "no lock change went into the journal's preallocated space"
    );
    assert!(!wconfd.wait_exit().success());
    assert_mentions(
        "wconfd's log",
        &wconfd.log(),
        &["locks.journal", Fault::Full.text()],
    );
    let mut client = luxid.client();
    assert_eq!(query(&mut client, before, &["status"]), [json!("success")]);

    sandbox.lift(Fault::Full, "");
    let wconfd = sandbox.wconfd();
    assert_eq!(held(&mut wconfd.client(), &locker), locks);
    let after = submit(&mut client)
        .expect("SubmitJob once space returned")
        .as_u64()
        .expect("an id");
    assert_eq!(
        wait_status(&luxid, after, &["success", "error"]),
        "success",
        "{}",
        luxid.log()
    );
}

/// A runner that cannot create its livelock (`livelocks/` read-only):
/// its job ends `error` saying so, and once the directory is writable
/// again jobs run, without a restart.
#[test]
fn a_runner_without_a_livelock_fails_its_job_saying_so() {
    let sandbox = Sandbox::new(64 * MIB, None);
    let _wconfd = sandbox.wconfd();
    let luxid = sandbox.luxid();
    let mut client = luxid.client();
    sandbox.inject(Fault::ReadOnly, "livelocks");
    let id = submit(&mut client)
        .expect("SubmitJob")
        .as_u64()
        .expect("an id");
    assert_eq!(wait_status(&luxid, id, &["success", "error"]), "error");
    let result = query(&mut client, id, &["opresult"])[0].to_string();
    assert_mentions(
        "the job's result",
        &result,
        &[
            &format!("detected death of job {id}"),
            "could not create its livelock",
        ],
    );
    assert_mentions(
        "luxid's log",
        &luxid.log(),
        &["livelock", Fault::ReadOnly.text()],
    );
    sandbox.lift(Fault::ReadOnly, "livelocks");
    let id = submit(&mut client)
        .expect("SubmitJob")
        .as_u64()
        .expect("an id");
    assert_eq!(wait_status(&luxid, id, &["success", "error"]), "success");
}
