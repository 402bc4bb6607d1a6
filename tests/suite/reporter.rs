//! The reporter (EVENTS.md "Metrics", "Hooks") as real processes over real
//! sockets: `warden reporter` beside a real wconfd and luxid on a temp root,
//! a statsd receiver in the test (a UDP socket recording each packet with
//! the kernel's arrival time and its source port), a real Prometheus server
//! scraping `/metrics`, hooks that are shell scripts, and `kill -9`.
//!
//! - [`statsd_reports_every_gauge_at_zero_then_the_last_values_at_most_once_a_second`]:
//!   packets of at most 512 bytes, nodepool's names, the zeros first, a
//!   burst of 1,000 jobs, the last value of every gauge equal to the final
//!   figures, counters' deltas adding up, no name sent twice within an
//!   interval.
//! - [`election`]: three reporters, the elected one killed five times,
//!   run by two tests:
//!   [`a_standby_reporter_takes_over_within_100ms_from_the_saved_state`]
//!   (the takeover times, printed, their median asserted; the new leader
//!   resumes from `reporter/state.json`; the standbys send nothing) and
//!   [`reporters_taking_over_keep_an_interval_between_their_statsd_packets`]
//!   (a second between the last packet of one leader and the first of the
//!   next).
//! - [`prometheus_scrapes_the_reporter_and_agrees_with_warden`]: a real
//!   `prometheus` (see tests/prometheus/setup.sh) and `promtool check
//!   metrics`.
//! - [`hook_crash`]: a `job.finished` hook, the reporter killed in the
//!   middle, run by two tests:
//!   [`hooks_run_at_least_once_for_every_event_across_a_crash`] (every
//!   event's hook ran with the event on stdin and its environment) and
//!   [`hooks_that_ended_before_a_crash_do_not_run_again`].
//! - [`watch_events_refuses_bad_cursors_and_arguments_and_keeps_serving`]:
//!   both daemons' `WatchEvents`/`watchEvents` over the raw framing.
//!
//! Every process is owned by a guard that kills it when the test ends,
//! panics included. Waits poll with a deadline; the only sleeps are the
//! observation windows of the once-per-interval rule and the varying
//! tenures between kills.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::daemon::{Client, DEADLINE, OwnerProcess, Root, Wconfd, timing_guard, try_update};
use crate::luxid::{Cluster, Luxid};

/// How long something that need not be fast may take on a loaded 2-core
/// machine (a thousand jobs to run, Prometheus to start and scrape).
const SLOW: Duration = Duration::from_secs(180);

/// `[metrics] interval_ms` of the tests.
const INTERVAL_MS: u64 = 1000;

/// The least gap the once-per-interval rule allows between two sends of
/// one name, or between two reporters' packets: the interval less the
/// noise of scheduling.
const GAP_MIN_SECONDS: f64 = 0.95;

/// EVENTS.md "Metrics": the next waiter takes over within this.
const TAKEOVER_MAX: Duration = Duration::from_millis(100);

/// `limits::STATSD_PACKET_BYTES_MAX`, as the spec says it.
const PACKET_BYTES_MAX: usize = 512;

/// The seven job statuses, the six worker states (EVENTS.md).
const STATUSES: [&str; 7] = [
    "queued",
    "waiting",
    "canceling",
    "running",
    "canceled",
    "success",
    "error",
];
const WORKER_STATES: [&str; 6] = [
    "MAINTENANCE",
    "IDLE",
    "RUNNING",
    "FAILED",
    "PREPARE",
    "BUSY",
];
const MODES: [&str; 2] = ["shared", "exclusive"];

/// The election lock.
const REPORTER_LOCK: &str = "service/reporter";

fn levels() -> Vec<&'static str> {
    warden::locks::Level::ALL
        .iter()
        .map(|level| level.as_str())
        .collect()
}

fn exec(argv: &[&str]) -> Value {
    json!({"OP_ID": "OP_EXEC", "argv": argv})
}

fn delay(seconds: f64) -> Value {
    json!({"OP_ID": "OP_TEST_DELAY", "duration": seconds, "on_master": true})
}

fn wall_secs(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64()
}

/// Polls `condition` every `every` until it holds; fails after `within`
/// with `what` and whatever `context` says then.
fn poll(
    what: &str,
    within: Duration,
    every: Duration,
    mut condition: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "not within {within:?}: {what}\n{}",
            context()
        );
        std::thread::sleep(every);
    }
}

/// A TCP port nobody listens on now (bound and let go).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a free port")
        .port()
}

fn serial() -> u64 {
    static SERIAL: AtomicU64 = AtomicU64::new(1);
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

// ----- processes -----

/// A child process with its output in a log file; SIGKILLed and reaped
/// when dropped.
struct Process {
    name: String,
    child: Option<Child>,
    pid: u32,
    log_path: PathBuf,
}

impl Process {
    fn spawn(name: &str, command: &mut Command, log_dir: &Path) -> Process {
        let log_path = log_dir.join(format!("{name}.{}.log", serial()));
        let log = File::create(&log_path).expect("create a log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {name}: {error}"));
        Process {
            name: name.to_owned(),
            pid: child.id(),
            child: Some(child),
            log_path,
        }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log_path).unwrap_or_default()).into_owned()
    }

    /// SIGKILL and reap.
    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .unwrap_or_else(|error| panic!("SIGKILL {}: {error}", self.name));
            child.wait().expect("reap it");
        }
    }

    /// Fails the test if the process exited.
    fn assert_running(&mut self) {
        let child = self.child.as_mut().expect("not killed");
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("{} exited with {status}:\n{}", self.name, self.log());
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `warden reporter --root ROOT`.
fn start_reporter(root: &Root) -> Process {
    Process::spawn(
        "reporter",
        Command::new(env!("CARGO_BIN_EXE_warden"))
            .arg("--root")
            .arg(root.path())
            .arg("reporter")
            .env("WARDEN_LOG", "debug"),
        &root.path(),
    )
}

/// wconfd and luxid on `root` with `toml` as its `warden.toml`.
fn cluster_on(root: &Root, toml: &str) -> Cluster {
    fs::write(root.path().join("warden.toml"), toml).expect("write warden.toml");
    let wconfd = Wconfd::restart_on(root);
    let luxid = Luxid::start_on(root);
    Cluster { wconfd, luxid }
}

/// Submits `jobs` (lists of opcodes) in one `SubmitManyJobs`; their ids.
fn submit_many(cluster: &Cluster, jobs: Vec<Value>) -> Vec<u64> {
    let count = jobs.len();
    let results = cluster.client().ok("SubmitManyJobs", json!([jobs]));
    let ids: Vec<u64> = results
        .as_array()
        .expect("a result per job")
        .iter()
        .map(|result| {
            assert_eq!(result[0], json!(true), "a job refused: {result}");
            result[1].as_u64().expect("a job id")
        })
        .collect();
    assert_eq!(ids.len(), count);
    ids
}

/// Every job's status, by QueryJobs.
fn job_statuses(root: &Root) -> Vec<String> {
    let rows = Client::connect(&Luxid::socket(root)).ok("QueryJobs", json!([null, ["status"]]));
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|row| row[0].as_str().expect("a status").to_owned())
        .collect()
}

/// Jobs by status, every status present.
fn job_counts(root: &Root) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = STATUSES.iter().map(|s| (s.to_string(), 0)).collect();
    for status in job_statuses(root) {
        *counts.entry(status).or_default() += 1;
    }
    counts
}

fn wait_all_final(root: &Root, within: Duration) {
    poll(
        "every job is final",
        within,
        Duration::from_millis(100),
        || {
            job_statuses(root)
                .iter()
                .all(|status| matches!(status.as_str(), "success" | "error" | "canceled"))
        },
        || format!("{:?}", job_counts(root)),
    );
}

/// The last event number of luxid and of wconfd.
fn last_seqs(root: &Root) -> [u64; 2] {
    let last = |socket: &Path, method: &str| {
        let answer = Client::connect(socket).ok(method, json!([null, null, 0]));
        answer["next"].as_u64().expect("next")
    };
    [
        last(&Luxid::socket(root), "WatchEvents"),
        last(&root.socket(), "watchEvents"),
    ]
}

fn read_positions(status: &Value) -> [u64; 2] {
    let of = |daemon: &str| {
        status["reporter"]["read"][daemon]
            .as_u64()
            .expect("a read position")
    };
    [of("luxid"), of("wconfd")]
}

/// Waits until the reporter serving `listen` has read every event of both
/// daemons; answers its `/status.json` then.
fn wait_caught_up(root: &Root, listen: &str) -> Value {
    let mut status = Value::Null;
    poll(
        "the reporter has read every event",
        SLOW,
        Duration::from_millis(20),
        || {
            let Some(now) = status_json(listen) else {
                return false;
            };
            status = now;
            read_positions(&status) == last_seqs(root)
        },
        || {
            format!(
                "reporter: {:?}, daemons: {:?}",
                status_json(listen).map(|status| status["reporter"].clone()),
                last_seqs(root)
            )
        },
    );
    status
}

/// `reporter/state.json`, if there is one.
fn saved_state(root: &Root) -> Option<Value> {
    let bytes = fs::read(root.path().join(warden::paths::REPORTER_STATE_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

// ----- wconfd's view of the election -----

/// The pid of the holder of `service/reporter`.
fn leader_pid(wconfd: &mut Client) -> Option<u32> {
    let owners = wconfd.ok("listAllLocksOwners", json!([]));
    let row = owners
        .as_array()?
        .iter()
        .find(|row| row[0] == json!(REPORTER_LOCK))?;
    let holder = row[1].as_array()?.first()?;
    holder[0][2].as_u64().map(|pid| pid as u32)
}

/// The pids waiting for `service/reporter`.
fn standby_pids(wconfd: &mut Client) -> BTreeSet<u32> {
    let waiters = wconfd.ok("listWaiters", json!([]));
    waiters
        .as_array()
        .expect("a list of waiters")
        .iter()
        .filter(|waiter| waiter["request"] == json!([[REPORTER_LOCK, "exclusive"]]))
        .map(|waiter| waiter["owner"][2].as_u64().expect("a pid") as u32)
        .collect()
}

/// Locks held by level and mode, as wconfd lists them.
fn locks_held(wconfd: &mut Client) -> BTreeMap<(String, String), u64> {
    let mut held = BTreeMap::new();
    for level in levels() {
        for mode in MODES {
            held.insert((level.to_owned(), mode.to_owned()), 0);
        }
    }
    let owners = wconfd.ok("listAllLocksOwners", json!([]));
    for row in owners.as_array().expect("rows") {
        let lock = row[0].as_str().expect("a lock name");
        let level = warden::locks::LockName::parse(lock)
            .unwrap_or_else(|error| panic!("{lock}: {error:?}"))
            .level()
            .as_str();
        for holder in row[1].as_array().expect("holders") {
            let mode = holder[1].as_str().expect("a mode").to_owned();
            *held.entry((level.to_owned(), mode)).or_default() += 1;
        }
    }
    held
}

// ----- HTTP -----

struct Response {
    status: u16,
    body: String,
}

/// One `GET` over HTTP/1.1 (`Connection: close`), chunked bodies decoded.
fn http_get(address: &str, target: &str) -> io::Result<Response> {
    let socket: SocketAddr = address.parse().expect("an ip:port");
    let mut stream = TcpStream::connect_timeout(&socket, DEADLINE)?;
    stream.set_read_timeout(Some(DEADLINE))?;
    stream.set_write_timeout(Some(DEADLINE))?;
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {address}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let end = raw
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of the head"))?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut body = raw[end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    if headers
        .get("transfer-encoding")
        .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"))
    {
        body = dechunk(&body).ok_or_else(|| bad("a bad chunked body"))?;
    } else if let Some(length) = headers.get("content-length") {
        let length: usize = length.parse().map_err(|_| bad("a bad Content-Length"))?;
        if body.len() < length {
            return Err(bad("a body shorter than its Content-Length"));
        }
        body.truncate(length);
    }
    let body = String::from_utf8(body).map_err(|_| bad("a body not UTF-8"))?;
    Ok(Response { status, body })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = data.windows(2).position(|window| window == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// The reporter's `/status.json`, if something answers 200 on `listen`.
fn status_json(listen: &str) -> Option<Value> {
    let response = http_get(listen, "/status.json").ok()?;
    if response.status != 200 {
        return None;
    }
    Some(serde_json::from_str(&response.body).expect("/status.json is JSON"))
}

/// The samples of `/metrics` of one family: label text (`status="success"`)
/// to value.
fn prometheus_samples(text: &str, family: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            (name == family).then(|| (labels.to_owned(), value.parse().expect("a number")))
        })
        .collect()
}

/// `text` for a URL's query string.
fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

// ----- statsd -----

#[derive(Clone, Debug)]
struct Packet {
    /// When the kernel received it, seconds since the epoch.
    at: f64,
    /// Its source port: one per reporter (each binds its own socket).
    port: u16,
    payload: Vec<u8>,
}

/// The receiving socket, in Python: its socket module reads
/// `SO_TIMESTAMPNS`, the kernel's arrival time of each packet (std cannot,
/// and the suite has no unsafe code). A thread's own clock read after
/// `recv` lags the arrival by up to 0.2 s on a busy 2-core machine, which
/// would pass for reports sent too often. Prints `port N`, then one line
/// per packet: arrival, source port, recvmsg flags, payload in hex.
const RECEIVER_SCRIPT: &str = r#"
import socket, struct, sys
SO_TIMESTAMPNS, SO_RCVBUFFORCE, SO_RCVBUF = 35, 33, 8
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
for option in (SO_RCVBUFFORCE, SO_RCVBUF):
    try:
        s.setsockopt(socket.SOL_SOCKET, option, 16 << 20)
        break
    except OSError:
        pass
s.bind(("127.0.0.1", 0))
out = sys.stdout
out.write("port %d\n" % s.getsockname()[1])
out.flush()
while True:
    data, ancillary, flags, address = s.recvmsg(65536, socket.CMSG_SPACE(16))
    at = "none"
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanos = struct.unpack("qq", value[:16])
            at = "%d.%09d" % (seconds, nanos)
    out.write("%s %d %d %s\n" % (at, address[1], flags, data.hex()))
    out.flush()
"#;

/// A statsd server that records every packet: the receiving process
/// ([`RECEIVER_SCRIPT`]) and a thread of the test reading what it got.
struct StatsdReceiver {
    address: SocketAddr,
    packets: Arc<Mutex<Vec<Packet>>>,
    child: Child,
    thread: Option<JoinHandle<()>>,
}

impl StatsdReceiver {
    fn start() -> StatsdReceiver {
        let python = if Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3"
        } else {
            "python3"
        };
        let mut child = Command::new(python)
            .args(["-S", "-c", RECEIVER_SCRIPT])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the statsd receiver (python3)");
        let stdout = child.stdout.take().expect("piped");
        let packets = Arc::new(Mutex::new(Vec::new()));
        let (port_sender, port) = std::sync::mpsc::channel();
        let thread = {
            let packets = Arc::clone(&packets);
            std::thread::spawn(move || {
                let mut lines = io::BufRead::lines(io::BufReader::new(stdout));
                let first = lines.next().and_then(Result::ok).unwrap_or_default();
                let _ = port_sender.send(first);
                for line in lines {
                    let Ok(line) = line else { break };
                    let packet = parse_received(&line)
                        .unwrap_or_else(|| panic!("statsd receiver said {line:?}"));
                    packets
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(packet);
                }
            })
        };
        let first = port.recv_timeout(DEADLINE).unwrap_or_default();
        let port: u16 = first
            .strip_prefix("port ")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("the statsd receiver did not start: {first:?}"));
        StatsdReceiver {
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            packets,
            child,
            thread: Some(thread),
        }
    }

    /// Every packet so far, in arrival order.
    fn packets(&self) -> Vec<Packet> {
        self.packets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for StatsdReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `ARRIVAL PORT FLAGS HEX` of [`RECEIVER_SCRIPT`].
fn parse_received(line: &str) -> Option<Packet> {
    let mut fields = line.split(' ');
    let at: f64 = fields.next()?.parse().ok()?;
    let port: u16 = fields.next()?.parse().ok()?;
    let flags: u32 = fields.next()?.parse().ok()?;
    // MSG_TRUNC: more than the receiver's 64 KiB; a statsd packet never is.
    assert_eq!(flags & 0x20, 0, "a truncated packet");
    let hex = fields.next()?;
    let payload = (0..hex.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(hex.get(index..index + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(Packet { at, port, payload })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
    Timer,
}

#[derive(Clone, Debug)]
struct Line {
    name: String,
    value: f64,
    text: String,
    kind: Kind,
    /// The packet's arrival time.
    at: f64,
}

/// Every line of every packet, checked: at most 512 bytes a packet, each
/// line `name:value|g`, `|c` or `|ms` with a name statsd takes and a
/// non-negative number.
fn lines_of(packets: &[Packet]) -> Vec<Line> {
    let mut lines = Vec::new();
    for packet in packets {
        assert!(
            packet.payload.len() <= PACKET_BYTES_MAX,
            "a packet of {} bytes (at most {PACKET_BYTES_MAX})",
            packet.payload.len()
        );
        let text = std::str::from_utf8(&packet.payload).expect("a packet is text");
        for line in text.split('\n') {
            let parsed = (|| {
                let (name, rest) = line.split_once(':')?;
                let (value, kind) = rest.split_once('|')?;
                let kind = match kind {
                    "g" => Kind::Gauge,
                    "c" => Kind::Counter,
                    "ms" => Kind::Timer,
                    _ => return None,
                };
                let name_ok = !name.is_empty()
                    && name.split('.').all(|part| {
                        !part.is_empty()
                            && part
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    });
                let number_ok = !value.is_empty()
                    && value.chars().all(|c| c.is_ascii_digit() || c == '.')
                    && (kind != Kind::Counter || value.chars().all(|c| c.is_ascii_digit()));
                let value: f64 = value.parse().ok()?;
                (name_ok && number_ok).then(|| Line {
                    name: name.to_owned(),
                    value,
                    text: rest.split('|').next().expect("split").to_owned(),
                    kind,
                    at: packet.at,
                })
            })();
            lines.push(parsed.unwrap_or_else(|| {
                panic!("not a statsd line `name:value|g|c|ms`: {line:?} in {text:?}")
            }));
        }
    }
    lines
}

/// Every gauge of a known name (EVENTS.md: all seven job statuses, every
/// lock level in both modes, all six worker states, and the plain ones).
fn known_gauges() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = [
        "warden.slots.used",
        "warden.slots.max",
        "warden.jobs.oldest_queued_age",
        "warden.owners.waiting",
        "warden.owners.longest_wait",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    names.extend(
        STATUSES
            .iter()
            .map(|status| format!("warden.jobs.{status}")),
    );
    for level in levels() {
        for mode in MODES {
            names.insert(format!("warden.locks.held.{level}.{mode}"));
        }
    }
    names.extend(
        WORKER_STATES
            .iter()
            .map(|state| format!("warden.workers.{state}")),
    );
    names
}

/// Whether `name` is one of EVENTS.md's statsd names of its kind.
fn is_known_name(kind: Kind, name: &str) -> bool {
    let Some(rest) = name.strip_prefix("warden.") else {
        return false;
    };
    let one_of = |text: &&str, set: &[&str]| set.contains(text);
    let levels = levels();
    match kind {
        Kind::Gauge => {
            known_gauges().contains(name)
                || rest
                    .strip_prefix("workers.group.")
                    .and_then(|tail| tail.rsplit_once('.'))
                    .is_some_and(|(group, state)| {
                        !group.is_empty() && one_of(&state, &WORKER_STATES)
                    })
        }
        Kind::Counter => {
            let parts: Vec<&str> = rest.split('.').collect();
            match parts.as_slice() {
                ["jobs", "finished", status] => one_of(status, &["canceled", "success", "error"]),
                ["opcodes", status] => one_of(status, &STATUSES),
                ["locks", "grants", via] => one_of(via, &["direct", "waiting", "await"]),
                ["owners", "deaths"]
                | ["locks", "deadlocks_refused"]
                | ["hooks", "runs"]
                | ["hooks", "failures"] => true,
                ["config", "lock_violations", kind] => {
                    one_of(kind, &["instance", "nodegroup", "node"])
                }
                ["events", "read", daemon] => one_of(daemon, &["luxid", "wconfd"]),
                _ => false,
            }
        }
        Kind::Timer => {
            let parts: Vec<&str> = rest.split('.').collect();
            match parts.as_slice() {
                ["jobs", "queue_delay"] | ["jobs", "run_time"] | ["locks", "wait"] => true,
                ["locks", "hold", level] => levels.contains(level),
                _ => false,
            }
        }
    }
}

/// A counter's total in `/status.json` for its statsd name.
fn status_counter(status: &Value, name: &str) -> u64 {
    let counters = &status["metrics"]["counters"];
    let rest = name.strip_prefix("warden.").expect("a warden name");
    let parts: Vec<&str> = rest.split('.').collect();
    let value = match parts.as_slice() {
        ["jobs", "finished", status] => &counters["jobs_finished_total"][status],
        ["opcodes", status] => &counters["opcodes_total"][status],
        ["locks", "grants", via] => &counters["lock_grants_total"][via],
        ["owners", "deaths"] => &counters["owner_deaths_total"],
        ["locks", "deadlocks_refused"] => &counters["lock_deadlocks_refused_total"],
        ["config", "lock_violations", kind] => &counters["config_lock_violations_total"][kind],
        ["hooks", "runs"] => &counters["hook_runs_total"],
        ["hooks", "failures"] => &counters["hook_failures_total"],
        ["events", "read", daemon] => &counters["events_read_total"][daemon],
        _ => panic!("no counter {name}"),
    };
    value
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} in /status.json: {counters}"))
}

/// A gauge's figure in `/status.json` for its statsd name.
fn status_gauge(status: &Value, name: &str) -> f64 {
    let gauges = &status["metrics"]["gauges"];
    let rest = name.strip_prefix("warden.").expect("a warden name");
    let parts: Vec<&str> = rest.split('.').collect();
    let value = match parts.as_slice() {
        ["slots", "used"] => &gauges["slots_used"],
        ["slots", "max"] => &gauges["slots_max"],
        ["jobs", "oldest_queued_age"] => &gauges["oldest_queued_job_age_seconds"],
        ["owners", "waiting"] => &gauges["owners_waiting"],
        ["owners", "longest_wait"] => &gauges["longest_wait_seconds"],
        ["jobs", status] => &gauges["jobs"][status],
        ["locks", "held", level, mode] => &gauges["locks_held"][level][mode],
        ["workers", state] => &gauges["workers"][state],
        _ => panic!("no gauge {name}"),
    };
    value
        .as_f64()
        .unwrap_or_else(|| panic!("no {name} in /status.json: {gauges}"))
}

/// The once-per-interval rule: no gauge or counter name in two packets
/// less than [`GAP_MIN_SECONDS`] apart (nor twice in one).
fn assert_once_per_interval(lines: &[Line]) {
    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for line in lines.iter().filter(|line| line.kind != Kind::Timer) {
        times.entry(&line.name).or_default().push(line.at);
    }
    let mut violations = Vec::new();
    for (name, mut at) in times {
        at.sort_by(f64::total_cmp);
        for pair in at.windows(2) {
            if pair[1] - pair[0] < GAP_MIN_SECONDS {
                violations.push(format!(
                    "{name} at {:.3} and {:.3} ({:.3} s apart)",
                    pair[0],
                    pair[1],
                    pair[1] - pair[0]
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "names sent twice within an interval ({INTERVAL_MS} ms):\n{}",
        violations.join("\n")
    );
}

fn metrics_settings(listen: &str, statsd: Option<SocketAddr>) -> String {
    let mut toml = format!("[metrics]\nlisten = \"{listen}\"\ninterval_ms = {INTERVAL_MS}\n");
    if let Some(statsd) = statsd {
        toml.push_str(&format!("statsd = \"{statsd}\"\n"));
    }
    toml
}

// ----- 1. statsd -----

#[test]
fn statsd_reports_every_gauge_at_zero_then_the_last_values_at_most_once_a_second() {
    // The heaviest test here: not beside the takeover timing.
    let _guard = timing_guard();
    let receiver = StatsdReceiver::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let root = Root::new();
    let max_running_jobs = 20;
    let cluster = cluster_on(
        &root,
        &format!(
            "[luxid]\nmax_running_jobs = {max_running_jobs}\n{}",
            metrics_settings(&listen, Some(receiver.address))
        ),
    );
    let mut reporter = start_reporter(&root);

    // The first report: every known gauge, at zero.
    poll(
        "the first statsd packet",
        DEADLINE,
        Duration::from_millis(5),
        || !receiver.packets().is_empty(),
        || reporter.log(),
    );
    // A report is sent at once; the next is an interval later.
    std::thread::sleep(Duration::from_millis(INTERVAL_MS / 2));
    let packets = receiver.packets();
    let first_at = packets[0].at;
    let first: Vec<Packet> = packets
        .iter()
        .filter(|packet| packet.at - first_at < 0.5)
        .cloned()
        .collect();
    let first_gauges: BTreeMap<String, String> = lines_of(&first)
        .into_iter()
        .filter(|line| line.kind == Kind::Gauge)
        .map(|line| (line.name, line.text))
        .collect();
    for name in known_gauges() {
        // The reporter's own election lock may already be counted: it
        // sends its first report an interval after its election.
        // So may the queue's slots maximum (luxid's first event). Every
        // gauge is there; the empty ones at 0.
        let expected =
            if name == "warden.locks.held.service.exclusive" || name == "warden.slots.max" {
                assert!(first_gauges.contains_key(&name), "{name} left out");
                first_gauges.get(&name).map(String::as_str)
            } else {
                Some("0")
            };
        assert_eq!(
            first_gauges.get(&name).map(String::as_str),
            expected,
            "the first report has {name} at 0; it has {first_gauges:?}"
        );
    }

    // The burst: 1,000 jobs (800 succeed, 200 fail) in one submission.
    let jobs: Vec<Value> = (0..1000)
        .map(|index| {
            let program = if index % 5 == 4 {
                "/bin/false"
            } else {
                "/bin/true"
            };
            json!([exec(&[program])])
        })
        .collect();
    let started = Instant::now();
    let ids = submit_many(&cluster, jobs);
    let submitted_in = started.elapsed();
    wait_all_final(&root, SLOW);
    println!(
        "statsd: 1,000 jobs submitted in {submitted_in:?} (1,000 job.submitted events), \
         all final after {:?}",
        started.elapsed()
    );
    let counts = job_counts(&root);
    assert_eq!(counts["success"], 800, "{counts:?}");
    assert_eq!(counts["error"], 200, "{counts:?}");
    assert_eq!(ids.len(), 1000);

    // Caught up, then an interval and more: every last value is out.
    let caught_up = wait_caught_up(&root, &listen);
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS));
    reporter.assert_running();
    let packets = receiver.packets();
    let lines = lines_of(&packets);
    let ports: BTreeSet<u16> = packets.iter().map(|packet| packet.port).collect();
    assert_eq!(ports.len(), 1, "one reporter, one source port: {ports:?}");
    for line in &lines {
        assert!(
            is_known_name(line.kind, &line.name),
            "not a statsd name of EVENTS.md: {} ({:?})",
            line.name,
            line.kind
        );
    }
    let mut last: BTreeMap<&str, &Line> = BTreeMap::new();
    for line in lines.iter().filter(|line| line.kind == Kind::Gauge) {
        last.insert(&line.name, line);
    }

    // The final figures, from the daemons.
    let mut wconfd = cluster.wconfd_client();
    let held = locks_held(&mut wconfd);
    let waiting = wconfd
        .ok("listWaiters", json!([]))
        .as_array()
        .expect("waiters")
        .len() as f64;
    let mut expected: BTreeMap<String, f64> = BTreeMap::new();
    for (status, count) in &counts {
        expected.insert(format!("warden.jobs.{status}"), *count as f64);
    }
    let used = counts["waiting"] + counts["running"] + counts["canceling"];
    expected.insert("warden.slots.used".into(), used as f64);
    expected.insert("warden.slots.max".into(), f64::from(max_running_jobs));
    expected.insert("warden.jobs.oldest_queued_age".into(), 0.0);
    expected.insert("warden.owners.waiting".into(), waiting);
    expected.insert("warden.owners.longest_wait".into(), 0.0);
    for ((level, mode), count) in &held {
        expected.insert(format!("warden.locks.held.{level}.{mode}"), *count as f64);
    }
    for state in WORKER_STATES {
        expected.insert(format!("warden.workers.{state}"), 0.0);
    }
    assert_eq!(
        held[&("service".to_owned(), "exclusive".to_owned())],
        1,
        "the reporter holds its lock"
    );
    let status_now = status_json(&listen).expect("/status.json answers");
    let mut wrong = Vec::new();
    for (name, value) in &expected {
        let seen = last.get(name.as_str()).map(|line| line.value);
        let reported = status_gauge(&status_now, name);
        if seen != Some(*value) || reported != *value {
            wrong.push(format!(
                "{name}: expected {value}, last sent {seen:?}, /status.json {reported}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the last values sent are not the final figures:\n{}",
        wrong.join("\n")
    );
    // The burst was seen as it happened, not only its end.
    let busiest = lines
        .iter()
        .filter(|line| line.name == "warden.slots.used")
        .map(|line| line.value)
        .fold(0.0, f64::max);
    assert!(busiest > 0.0, "slots.used was never reported above 0");

    // Counters: their deltas add up to the totals.
    let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
    for line in lines.iter().filter(|line| line.kind == Kind::Counter) {
        *sums.entry(&line.name).or_default() += line.value as u64;
    }
    assert_eq!(sums.get("warden.jobs.finished.success"), Some(&800));
    assert_eq!(sums.get("warden.jobs.finished.error"), Some(&200));
    for (name, sum) in &sums {
        assert_eq!(
            *sum,
            status_counter(&status_now, name),
            "the deltas sent of {name} add up to its total"
        );
    }
    // Timers: one line per observation.
    let timer_lines = |name: &str| {
        lines
            .iter()
            .filter(|line| line.kind == Kind::Timer && line.name == name)
            .count() as u64
    };
    let histograms = &caught_up["metrics"]["histograms"];
    assert_eq!(timer_lines("warden.jobs.run_time"), 1000);
    assert_eq!(
        timer_lines("warden.jobs.queue_delay"),
        histograms["job_queue_delay_seconds"]["count"]
            .as_u64()
            .expect("a count")
    );

    assert_once_per_interval(&lines);
    println!(
        "statsd: {} packets, {} lines, largest packet {} bytes",
        packets.len(),
        lines.len(),
        packets.iter().map(|p| p.payload.len()).max().unwrap_or(0)
    );
}

// ----- 2. election -----

/// Jobs submitted one after another until stopped.
struct JobStream {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl JobStream {
    fn start(socket: PathBuf, every: Duration) -> JobStream {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut client = Client::connect(&socket);
                let mut submitted = 0;
                while !stop.load(Ordering::Relaxed) {
                    client.ok("SubmitJob", json!([[exec(&["/bin/true"])]]));
                    submitted += 1;
                    std::thread::sleep(every);
                }
                submitted
            })
        };
        JobStream {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("running");
        thread.join().expect("the job stream did not fail")
    }
}

impl Drop for JobStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a reporter figures of the jobs, from its `/status.json`.
fn job_figures(status: &Value) -> Value {
    let metrics = &status["metrics"];
    json!({
        "jobs": metrics["gauges"]["jobs"],
        "jobs_finished_total": metrics["counters"]["jobs_finished_total"],
        "opcodes_total": metrics["counters"]["opcodes_total"],
        "job_run_seconds count": metrics["histograms"]["job_run_seconds"]["count"],
        "job_queue_delay_seconds count": metrics["histograms"]["job_queue_delay_seconds"]["count"],
    })
}

/// The positions a reporter's log says it was elected with.
fn elected_positions(log: &str) -> Option<[u64; 2]> {
    let line = log
        .lines()
        .find(|line| line.contains("elected: reporting from the saved positions"))?;
    let field = |name: &str| -> Option<u64> {
        let start = line.find(&format!(" {name}="))? + name.len() + 2;
        let digits: String = line[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    Some([field("luxid")?, field("wconfd")?])
}

fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// One leader's time in office, for the statsd checks.
struct Tenure {
    pid: u32,
    /// `elected_at` of its `/status.json`.
    from: f64,
    /// When the test killed it (`INFINITY`: still leading).
    to: f64,
}

/// Takeovers measured.
const ROUNDS: usize = 5;

/// What [`election`] saw.
struct Election {
    /// From each kill until wconfd granted the lock to another.
    granted_after: Vec<Duration>,
    /// From each kill until the new leader's `elected_at`.
    reporting_after: Vec<Duration>,
    tenures: Vec<Tenure>,
    /// Every statsd packet, by arrival.
    packets: Vec<Packet>,
    /// `statsd_sent_at` of `reporter/state.json` just before each kill.
    saved_sent_at: Vec<f64>,
}

/// Three reporters on one root and a statsd receiver; the elected one is
/// killed [`ROUNDS`] times (a new standby started after each takeover),
/// the last four times while jobs keep changing the figures. Checks on
/// the way that the new leader resumed from the saved state (the first
/// takeover, jobs done and saved before it) and, at the end, that the
/// figures are still the queue's.
fn election() -> Election {
    let receiver = StatsdReceiver::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let root = Root::new();
    let cluster = cluster_on(&root, &metrics_settings(&listen, Some(receiver.address)));
    let mut reporters: Vec<Process> = (0..3).map(|_| start_reporter(&root)).collect();
    let mut wconfd = cluster.wconfd_client();
    let logs = |reporters: &[Process]| {
        reporters
            .iter()
            .map(|reporter| format!("--- reporter {}:\n{}", reporter.pid, reporter.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let settled = |wconfd: &mut Client, reporters: &[Process]| {
        let pids: BTreeSet<u32> = reporters.iter().map(|reporter| reporter.pid).collect();
        let Some(leader) = leader_pid(wconfd) else {
            return false;
        };
        let mut standbys = standby_pids(wconfd);
        standbys.insert(leader);
        standbys == pids
    };
    poll(
        "one reporter elected, the two others waiting",
        DEADLINE,
        Duration::from_millis(5),
        || settled(&mut wconfd, &reporters),
        || logs(&reporters),
    );
    let mut leader = leader_pid(&mut wconfd).expect("elected");
    let mut first_status = Value::Null;
    poll(
        "the elected reporter serves /status.json",
        DEADLINE,
        Duration::from_millis(5),
        || {
            first_status = status_json(&listen).unwrap_or(Value::Null);
            first_status["reporter"]["pid"] == json!(leader)
                && first_status["reporter"]["elected_at"].is_f64()
        },
        || logs(&reporters),
    );
    let mut tenures = vec![Tenure {
        pid: leader,
        from: first_status["reporter"]["elected_at"]
            .as_f64()
            .expect("elected_at"),
        to: f64::INFINITY,
    }];

    // Jobs before the first kill, their figures saved.
    let mut jobs: Vec<Value> = vec![json!([exec(&["/bin/true"])]); 20];
    jobs.extend(vec![json!([exec(&["/bin/false"])]); 10]);
    submit_many(&cluster, jobs);
    wait_all_final(&root, SLOW);
    let before = wait_caught_up(&root, &listen);
    let positions = read_positions(&before);
    poll(
        "the elected reporter saved its position",
        SLOW,
        Duration::from_millis(20),
        || {
            saved_state(&root).is_some_and(|saved| {
                let read = |daemon: &str| saved["read"][daemon].as_u64().unwrap_or(0);
                read("luxid") == positions[0] && read("wconfd") >= positions[1]
            })
        },
        || format!("{:?}", saved_state(&root)),
    );
    let figures_before = job_figures(&before);
    assert_eq!(before["metrics"]["gauges"]["jobs"]["success"], json!(20));
    assert_eq!(before["metrics"]["gauges"]["jobs"]["error"], json!(10));

    let mut granted_after = Vec::new();
    let mut reporting_after = Vec::new();
    let mut saved_sent_at = Vec::new();
    let mut stream = None;
    for round in 0..ROUNDS {
        if round == 1 {
            // From now on the figures change all the time: every
            // interval has something to send.
            stream = Some(JobStream::start(
                Luxid::socket(&root),
                Duration::from_millis(150),
            ));
        }
        let index = reporters
            .iter()
            .position(|reporter| reporter.pid == leader)
            .expect("the leader is one of ours");
        saved_sent_at.push(
            saved_state(&root)
                .and_then(|saved| saved["statsd_sent_at"].as_f64())
                .unwrap_or(0.0),
        );
        let killed_wall = SystemTime::now();
        let killed = Instant::now();
        reporters[index].kill9();
        let mut new_leader = None;
        poll(
            "another reporter holds service/reporter",
            DEADLINE,
            Duration::from_millis(2),
            || {
                new_leader = leader_pid(&mut wconfd).filter(|pid| *pid != leader);
                new_leader.is_some()
            },
            || logs(&reporters),
        );
        let granted = killed.elapsed();
        let new_leader = new_leader.expect("just found");
        let mut status = Value::Null;
        poll(
            "the new leader serves /status.json",
            DEADLINE,
            Duration::from_millis(2),
            || {
                status = status_json(&listen).unwrap_or(Value::Null);
                status["reporter"]["pid"] == json!(new_leader)
                    && status["reporter"]["elected_at"].is_f64()
            },
            || logs(&reporters),
        );
        let elected_at = status["reporter"]["elected_at"]
            .as_f64()
            .expect("elected_at");
        let reporting = Duration::from_secs_f64((elected_at - wall_secs(killed_wall)).max(0.0));
        println!(
            "takeover {}: pid {leader} killed; pid {new_leader} granted service/reporter \
             after {:.1} ms, elected (reporting) after {:.1} ms",
            round + 1,
            granted.as_secs_f64() * 1e3,
            reporting.as_secs_f64() * 1e3
        );
        granted_after.push(granted);
        reporting_after.push(reporting);
        tenures.last_mut().expect("a tenure").to = wall_secs(killed_wall);
        tenures.push(Tenure {
            pid: new_leader,
            from: elected_at,
            to: f64::INFINITY,
        });
        let killed_reporter = reporters.remove(index);
        assert!(
            !killed_reporter.log().contains("panicked"),
            "{}",
            killed_reporter.log()
        );
        leader = new_leader;

        if round == 0 {
            // It resumed from the saved state: its first answer already
            // has the figures, and its log names the saved positions.
            assert_eq!(
                job_figures(&status),
                figures_before,
                "the new leader's first figures are the old one's"
            );
            let new_index = reporters
                .iter()
                .position(|reporter| reporter.pid == new_leader)
                .expect("ours");
            let elected_from = elected_positions(&reporters[new_index].log());
            assert!(
                elected_from
                    .is_some_and(|[luxid, wconfd]| luxid == positions[0] && wconfd >= positions[1]),
                "the new leader started from the saved positions ({positions:?}), \
                 not {elected_from:?}:\n{}",
                reporters[new_index].log()
            );
            let after = wait_caught_up(&root, &listen);
            assert_eq!(job_figures(&after), figures_before);
            let metrics = http_get(&listen, "/metrics").expect("/metrics answers");
            assert_eq!(metrics.status, 200);
            let jobs = prometheus_samples(&metrics.body, "warden_jobs");
            for status in STATUSES {
                assert_eq!(
                    jobs.get(&format!("status=\"{status}\"")).copied(),
                    figures_before["jobs"][status].as_f64(),
                    "warden_jobs{{status=\"{status}\"}} on the new leader:\n{}",
                    metrics.body
                );
            }
            assert_eq!(
                prometheus_samples(&metrics.body, "warden_reporter_leader").get(""),
                Some(&1.0)
            );
        }

        // A new standby, waiting before the next kill; the new leader
        // reports for a while (a varying while: kills at every phase of
        // its sends).
        reporters.push(start_reporter(&root));
        poll(
            "the new leader elected, two others waiting",
            DEADLINE,
            Duration::from_millis(5),
            || settled(&mut wconfd, &reporters),
            || logs(&reporters),
        );
        assert_eq!(leader_pid(&mut wconfd), Some(leader));
        std::thread::sleep(Duration::from_millis(1300 + 170 * round as u64));
    }
    let streamed = stream.expect("started").stop();

    // After five takeovers the figures are still the queue's: nothing
    // counted twice, nothing lost.
    wait_all_final(&root, SLOW);
    let last = wait_caught_up(&root, &listen);
    let counts = job_counts(&root);
    assert_eq!(counts["success"], 20 + streamed, "{counts:?}");
    for status in STATUSES {
        assert_eq!(
            last["metrics"]["gauges"]["jobs"][status],
            json!(counts[status]),
            "jobs {status}: {}",
            last["metrics"]["gauges"]
        );
    }
    assert_eq!(
        last["metrics"]["counters"]["jobs_finished_total"]["success"],
        json!(counts["success"])
    );
    assert_eq!(
        last["metrics"]["counters"]["owner_deaths_total"],
        json!(ROUNDS)
    );
    std::thread::sleep(Duration::from_millis(INTERVAL_MS + 500));

    let mut packets = receiver.packets();
    packets.sort_by(|a, b| a.at.total_cmp(&b.at));
    Election {
        granted_after,
        reporting_after,
        tenures,
        packets,
        saved_sent_at,
    }
}

/// The packets of each tenure, by source port: each port is one
/// reporter's socket; it belongs to the tenure its first packet came in
/// (a leader sends only after its `elected_at`), and must end with it
/// (give or take the receiver's wake-up). Fails if a tenure has packets
/// from two ports: a standby sent.
fn packets_by_tenure(election: &Election) -> Vec<Vec<&Packet>> {
    let tenures = &election.tenures;
    let lag = 0.05;
    let mut ports: BTreeMap<u16, (f64, f64)> = BTreeMap::new();
    for packet in &election.packets {
        let range = ports.entry(packet.port).or_insert((packet.at, packet.at));
        range.1 = packet.at;
    }
    let mut port_tenure: BTreeMap<u16, usize> = BTreeMap::new();
    for (port, (first, last)) in &ports {
        let tenure = tenures
            .iter()
            .rposition(|tenure| tenure.from <= *first)
            .unwrap_or_else(|| {
                panic!("a packet at {first:.3} from port {port} before any reporter was elected")
            });
        assert!(
            *last <= tenures[tenure].to + lag,
            "port {port} sent at {last:.3}, after pid {} (which it began with) was killed at {:.3}",
            tenures[tenure].pid,
            tenures[tenure].to
        );
        port_tenure.insert(*port, tenure);
    }
    let mut by_tenure: Vec<Vec<&Packet>> = tenures.iter().map(|_| Vec::new()).collect();
    for packet in &election.packets {
        by_tenure[port_tenure[&packet.port]].push(packet);
    }
    for (tenure, packets) in tenures.iter().zip(&by_tenure) {
        let ports: BTreeSet<u16> = packets.iter().map(|packet| packet.port).collect();
        assert!(
            ports.len() <= 1,
            "while pid {} led, packets came from ports {ports:?}: a standby sent\n{}",
            tenure.pid,
            history(tenures, &by_tenure)
        );
        // A new leader waits one interval before its first send (its
        // predecessor may have sent just before dying).
        assert!(
            !packets.is_empty() || tenure.to - tenure.from < 1.5,
            "pid {} sent nothing while it led",
            tenure.pid
        );
    }
    by_tenure
}

/// Who led when, and the bursts of packets each sent.
fn history(tenures: &[Tenure], by_tenure: &[Vec<&Packet>]) -> String {
    let mut text = String::new();
    for (tenure, packets) in tenures.iter().zip(by_tenure) {
        text.push_str(&format!(
            "pid {} led from {:.3} to {:.3}:\n",
            tenure.pid, tenure.from, tenure.to
        ));
        let mut runs: Vec<(u16, f64, f64, usize)> = Vec::new();
        for packet in packets {
            match runs.last_mut() {
                Some(run) if run.0 == packet.port && packet.at - run.2 < 0.2 => {
                    run.2 = packet.at;
                    run.3 += 1;
                }
                _ => runs.push((packet.port, packet.at, packet.at, 1)),
            }
        }
        for (port, first, last, count) in runs {
            text.push_str(&format!(
                "  port {port}: {count} packets {first:.3}..{last:.3}\n"
            ));
        }
    }
    text
}

#[test]
fn a_standby_reporter_takes_over_within_100ms_from_the_saved_state() {
    // A latency is measured: not beside the other heavy tests.
    let _guard = timing_guard();
    let election = election();
    // One sender at a time, the elected one: the standbys send nothing.
    packets_by_tenure(&election);
    let (granted_after, reporting_after) = (&election.granted_after, &election.reporting_after);
    let show = |values: &[Duration]| {
        values
            .iter()
            .map(|value| format!("{:.1} ms", value.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "takeovers: granted after {} (median {:.1} ms); reporting after {} (median {:.1} ms)",
        show(granted_after),
        median(granted_after).as_secs_f64() * 1e3,
        show(reporting_after),
        median(reporting_after).as_secs_f64() * 1e3
    );
    assert!(
        median(granted_after) < TAKEOVER_MAX,
        "the median grant after a kill {:?} is not under {TAKEOVER_MAX:?}: {}",
        median(granted_after),
        show(granted_after)
    );
    assert!(
        median(reporting_after) < TAKEOVER_MAX,
        "the median takeover after a kill {:?} is not under {TAKEOVER_MAX:?}: {}",
        median(reporting_after),
        show(reporting_after)
    );
}

/// EVENTS.md: "at most one statsd report per second per gauge", across a
/// takeover too: the new leader's first packet comes at least an interval
/// after the old one's last.
#[test]
fn reporters_taking_over_keep_an_interval_between_their_statsd_packets() {
    let _guard = timing_guard();
    let election = election();
    let by_tenure = packets_by_tenure(&election);
    let mut gaps = Vec::new();
    for (index, pair) in by_tenure.windows(2).enumerate() {
        let (Some(old_last), Some(new_first)) = (pair[0].last(), pair[1].first()) else {
            continue;
        };
        let saved = election.saved_sent_at[index];
        println!(
            "takeover {}: the old leader's last packet at {:.3}, its saved statsd_sent_at {:.3} \
             ({:+.3} s); the new leader's first packet {:.3} s after the old one's last",
            index + 1,
            old_last.at,
            saved,
            saved - old_last.at,
            new_first.at - old_last.at
        );
        gaps.push(new_first.at - old_last.at);
    }
    for gap in &gaps {
        assert!(
            *gap >= GAP_MIN_SECONDS,
            "two reporters' packets {gap:.3} s apart (at least {GAP_MIN_SECONDS} s): gaps \
             {gaps:.3?}\n{}",
            history(&election.tenures, &by_tenure)
        );
    }
    assert_once_per_interval(&lines_of(&election.packets));
}

// ----- 3. Prometheus -----

/// `prometheus` or `promtool`: from the directory `WARDEN_PROMETHEUS_BIN`
/// names, else PATH; fails the test with what to do if neither has it.
fn prometheus_tool(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("WARDEN_PROMETHEUS_BIN") {
        let path = Path::new(&dir).join(name);
        assert!(
            path.is_file(),
            "WARDEN_PROMETHEUS_BIN={} holds no {name}: run `bash tests/prometheus/setup.sh` \
             and set it to the directory it prints",
            Path::new(&dir).display()
        );
        return path;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "{name} was not found: WARDEN_PROMETHEUS_BIN is unset and PATH has no {name}. \
                 Run `bash tests/prometheus/setup.sh` (as root: it installs Debian's prometheus \
                 package, without starting its service) and set WARDEN_PROMETHEUS_BIN to the \
                 directory it prints"
            )
        })
}

/// `promtool check metrics` with `text` on stdin: its exit status and
/// output.
fn promtool_check_metrics(text: &str) -> (std::process::ExitStatus, String) {
    let path = prometheus_tool("promtool");
    let mut child = Command::new(&path)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("start {}: {error}", path.display()));
    let mut stdin = child.stdin.take().expect("piped");
    let text = text.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait for promtool").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("promtool's output");
    writer
        .join()
        .expect("the writer")
        .expect("promtool read the metrics");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, said)
}

/// A PromQL instant query: the result vector.
fn prometheus_query(address: &str, query: &str) -> Vec<Value> {
    let response = http_get(
        address,
        &format!("/api/v1/query?query={}", url_encoded(query)),
    )
    .expect("Prometheus answers a query");
    assert_eq!(response.status, 200, "{query}: {}", response.body);
    let answer: Value = serde_json::from_str(&response.body).expect("JSON");
    assert_eq!(answer["status"], json!("success"), "{query}: {answer}");
    assert_eq!(answer["data"]["resultType"], json!("vector"), "{answer}");
    answer["data"]["result"]
        .as_array()
        .expect("a result")
        .clone()
}

/// The single value of an instant query.
fn prometheus_value(address: &str, query: &str) -> f64 {
    let result = prometheus_query(address, query);
    assert_eq!(result.len(), 1, "{query}: one series, not {result:?}");
    result[0]["value"][1]
        .as_str()
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{query}: not a value: {result:?}"))
}

#[test]
fn prometheus_scrapes_the_reporter_and_agrees_with_warden() {
    let prometheus_bin = prometheus_tool("prometheus");
    let root = Root::new();
    let listen = format!("127.0.0.1:{}", free_port());
    let cluster = cluster_on(&root, &metrics_settings(&listen, None));
    let mut reporter = start_reporter(&root);

    // Some jobs succeed, some fail.
    let mut jobs = vec![json!([exec(&["/bin/true"])]); 6];
    jobs.extend(vec![json!([exec(&["/bin/sh", "-c", "exit 3"])]); 3]);
    submit_many(&cluster, jobs);
    wait_all_final(&root, SLOW);
    let counts = job_counts(&root);
    assert_eq!((counts["success"], counts["error"]), (6, 3), "{counts:?}");
    // `warden list --json` says the same.
    let list = Command::new(env!("CARGO_BIN_EXE_warden"))
        .arg("--root")
        .arg(root.path())
        .args(["--json", "list"])
        .output()
        .expect("run warden list");
    assert!(list.status.success(), "{list:?}");
    let listed: Value = serde_json::from_slice(&list.stdout).expect("JSON");
    let listed_success = listed
        .as_array()
        .expect("a list of jobs")
        .iter()
        .filter(|job| job["status"] == json!("success"))
        .count() as u64;
    assert_eq!(listed_success, counts["success"]);
    let status = wait_caught_up(&root, &listen);
    assert_eq!(status["metrics"]["gauges"]["jobs"]["success"], json!(6));
    assert_eq!(status["metrics"]["gauges"]["jobs"]["error"], json!(3));

    // promtool takes the exposition as it is.
    let metrics = http_get(&listen, "/metrics").expect("/metrics answers");
    assert_eq!(metrics.status, 200);
    let (exit, said) = promtool_check_metrics(&metrics.body);
    assert!(
        exit.success() && said.trim().is_empty(),
        "promtool check metrics: {exit}:\n{said}\n--- /metrics:\n{}",
        metrics.body
    );

    // A real Prometheus scraping it every second.
    let web = format!("127.0.0.1:{}", free_port());
    let dir = root.path().join("prometheus");
    fs::create_dir_all(&dir).expect("a directory for Prometheus");
    let config = dir.join("prometheus.yml");
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: warden\n    scrape_interval: 1s\n    \
             scrape_timeout: 1s\n    static_configs:\n      - targets: ['{listen}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let mut prometheus = Process::spawn(
        "prometheus",
        Command::new(&prometheus_bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .current_dir(&dir),
        &dir,
    );
    let prometheus_log = prometheus.log_path.clone();
    let read_log =
        || String::from_utf8_lossy(&fs::read(&prometheus_log).unwrap_or_default()).into_owned();
    poll(
        "Prometheus is ready",
        SLOW,
        Duration::from_millis(50),
        || {
            prometheus.assert_running();
            http_get(&web, "/-/ready").is_ok_and(|response| response.status == 200)
        },
        read_log,
    );
    let targets = || -> Value {
        http_get(&web, "/api/v1/targets")
            .ok()
            .and_then(|response| serde_json::from_str(&response.body).ok())
            .unwrap_or(Value::Null)
    };
    poll(
        "Prometheus reports the warden target up",
        SLOW,
        Duration::from_millis(100),
        || {
            targets()["data"]["activeTargets"]
                .as_array()
                .is_some_and(|active| {
                    active.iter().any(|target| {
                        target["labels"]["job"] == json!("warden")
                            && target["health"] == json!("up")
                            && target["lastError"] == json!("")
                    })
                })
        },
        || format!("{}\n{}", targets(), read_log()),
    );
    let scraped = prometheus_value(&web, "warden_jobs{status=\"success\"}");
    assert_eq!(scraped, counts["success"] as f64);
    assert_eq!(
        Some(scraped),
        status_json(&listen).expect("/status.json")["metrics"]["gauges"]["jobs"]["success"]
            .as_f64()
    );
    assert_eq!(
        prometheus_value(&web, "warden_jobs{status=\"error\"}"),
        counts["error"] as f64
    );
    // Every status has its series, zeros included.
    let all = prometheus_query(&web, "warden_jobs");
    let by_status: BTreeMap<String, f64> = all
        .iter()
        .map(|series| {
            (
                series["metric"]["status"]
                    .as_str()
                    .expect("a status")
                    .to_owned(),
                series["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .expect("a value"),
            )
        })
        .collect();
    let expected: BTreeMap<String, f64> = counts
        .iter()
        .map(|(status, count)| (status.clone(), *count as f64))
        .collect();
    assert_eq!(by_status, expected);
    assert_eq!(
        prometheus_value(&web, "warden_jobs_finished_total{status=\"error\"}"),
        3.0
    );
    assert_eq!(prometheus_value(&web, "warden_reporter_leader"), 1.0);
    assert_eq!(prometheus_value(&web, "up{job=\"warden\"}"), 1.0);
    reporter.assert_running();
    prometheus.kill9();
}

// ----- 4. hooks -----

/// A hook that keeps what it got: its environment, then its stdin, each
/// moved into place whole (`hook.SEQ.PID` is the last to appear).
fn hook_script(dir: &Path) -> String {
    format!(
        "#!/bin/sh\nset -e\ndir='{}'\ntmp=\"$dir/.tmp.$WARDEN_EVENT_SEQ.$$\"\n\
         env > \"$tmp.env\"\nmv \"$tmp.env\" \"$dir/env.$WARDEN_EVENT_SEQ.$$\"\n\
         cat > \"$tmp\"\nmv \"$tmp\" \"$dir/hook.$WARDEN_EVENT_SEQ.$$\"\n",
        dir.display()
    )
}

/// The hook runs done: `(seq, pid)` of each `hook.SEQ.PID`.
fn hook_runs(dir: &Path) -> Vec<(u64, String)> {
    let mut runs: Vec<(u64, String)> = fs::read_dir(dir)
        .expect("the hook directory")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let (seq, pid) = name.strip_prefix("hook.")?.split_once('.')?;
            Some((seq.parse().ok()?, pid.to_owned()))
        })
        .collect();
    runs.sort();
    runs
}

/// Jobs of [`hook_crash`].
const HOOK_JOBS: usize = 20;

/// What [`hook_crash`] left.
struct HookCrash {
    /// Keeps the hook outputs.
    _root: Root,
    hooks: PathBuf,
    /// The job.finished events, by seq.
    events: BTreeMap<u64, Value>,
    /// The first reporter's `hooks_done` of luxid just before the kill
    /// (its `/status.json`), and that of `reporter/state.json`.
    done_at_kill: u64,
    saved_at_kill: u64,
    /// The second reporter's `/status.json` at the end.
    status: Value,
    log: String,
}

/// A `job.finished` hook on 20 jobs; the reporter killed with SIGKILL
/// when a few hooks ran, another started; answers once every event had
/// its hook and the second reporter's hooks are all done.
fn hook_crash() -> HookCrash {
    const JOBS: usize = HOOK_JOBS;
    let root = Root::new();
    let hooks = root.path().join("hooks");
    fs::create_dir_all(&hooks).expect("a hook directory");
    let script = root.path().join("hook.sh");
    fs::write(&script, hook_script(&hooks)).expect("write the hook");
    let listen = format!("127.0.0.1:{}", free_port());
    let cluster = cluster_on(
        &root,
        &format!(
            "[luxid]\nmax_running_jobs = 2\n{}\n[hooks]\n\"job.finished\" = [\"/bin/sh\", \"{}\"]\n",
            metrics_settings(&listen, None),
            script.display()
        ),
    );
    let mut wconfd = cluster.wconfd_client();
    let mut first = start_reporter(&root);
    poll(
        "the reporter is elected",
        DEADLINE,
        Duration::from_millis(5),
        || leader_pid(&mut wconfd) == Some(first.pid),
        || first.log(),
    );

    // Two at a time, 0.3 s each: three seconds of jobs finishing.
    submit_many(&cluster, vec![json!([delay(0.3)]); JOBS]);
    poll(
        "a few hooks ran",
        SLOW,
        Duration::from_millis(1),
        || hook_runs(&hooks).len() >= 6,
        || first.log(),
    );
    let done_at_kill = status_json(&listen)
        .and_then(|status| status["reporter"]["hooks_done"]["luxid"].as_u64())
        .expect("the reporter's hooks_done");
    let saved_at_kill = saved_state(&root)
        .and_then(|saved| saved["hooks_done"]["luxid"].as_u64())
        .unwrap_or(0);
    first.kill9();
    let final_at_kill = job_statuses(&root)
        .iter()
        .filter(|status| status.as_str() == "success")
        .count();
    let runs_at_kill = hook_runs(&hooks).len();
    println!(
        "hooks: reporter killed after {runs_at_kill} hook runs, {final_at_kill}/{JOBS} jobs done"
    );
    assert!(
        final_at_kill < JOBS,
        "the kill came after every job had ended"
    );
    let mut second = start_reporter(&root);
    wait_all_final(&root, SLOW);

    // Every job.finished event has its hook run.
    let answer =
        Client::connect(&Luxid::socket(&root)).ok("WatchEvents", json!([0, ["job.finished"], 0]));
    let events: BTreeMap<u64, Value> = answer["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| (event["seq"].as_u64().expect("a seq"), event.clone()))
        .collect();
    assert_eq!(events.len(), JOBS, "one job.finished per job: {answer}");
    poll(
        "every job.finished event has had its hook",
        SLOW,
        Duration::from_millis(20),
        || {
            let done: BTreeSet<u64> = hook_runs(&hooks).into_iter().map(|(seq, _)| seq).collect();
            events.keys().all(|seq| done.contains(seq))
        },
        || format!("runs {:?}\n{}", hook_runs(&hooks), second.log()),
    );
    let status = poll_hooks_idle(&listen, &second);
    second.assert_running();

    HookCrash {
        _root: root.clone(),
        hooks,
        events,
        done_at_kill,
        saved_at_kill,
        status,
        log: second.log(),
    }
}

/// The runs of each event.
fn runs_per_event(crash: &HookCrash) -> BTreeMap<u64, usize> {
    let mut per_seq: BTreeMap<u64, usize> = BTreeMap::new();
    for (seq, _) in hook_runs(&crash.hooks) {
        *per_seq.entry(seq).or_default() += 1;
    }
    per_seq
}

#[test]
fn hooks_run_at_least_once_for_every_event_across_a_crash() {
    let crash = hook_crash();
    let (hooks, events, status) = (&crash.hooks, &crash.events, &crash.status);
    let runs = hook_runs(hooks);
    for (seq, pid) in &runs {
        let event = events
            .get(seq)
            .unwrap_or_else(|| panic!("a hook ran for event {seq}, not a job.finished"));
        let stdin = fs::read_to_string(hooks.join(format!("hook.{seq}.{pid}"))).expect("stdin");
        assert!(stdin.ends_with('\n'), "the event line ends with a newline");
        let got: Value = serde_json::from_str(&stdin).expect("the hook's stdin is JSON");
        assert_eq!(&got, event, "the hook's stdin is its event");
        assert_eq!(got["id"], event["id"]);
        assert_eq!(got["type"], json!("job.finished"));
        let env = fs::read_to_string(hooks.join(format!("env.{seq}.{pid}"))).expect("env");
        let env: BTreeSet<&str> = env.lines().collect();
        for wanted in [
            "WARDEN_EVENT_TYPE=job.finished".to_owned(),
            format!("WARDEN_EVENT_SEQ={seq}"),
            "WARDEN_EVENT_SOURCE=luxid".to_owned(),
        ] {
            assert!(env.contains(wanted.as_str()), "no {wanted} in {env:?}");
        }
        assert!(
            !env.iter().any(|line| line.starts_with("WARDEN_LOG=")),
            "the reporter's own environment leaked into the hook: {env:?}"
        );
    }
    let repeated: Vec<(u64, usize)> = runs_per_event(&crash)
        .iter()
        .filter(|(_, count)| **count > 1)
        .map(|(seq, count)| (*seq, *count))
        .collect();
    println!(
        "hooks: {} runs for {} events; repeated after the crash: {repeated:?}",
        runs.len(),
        events.len()
    );
    assert_eq!(
        status["metrics"]["counters"]["hook_failures_total"],
        json!(0),
        "{}",
        crash.log
    );
}

/// EVENTS.md "Hooks": "a restart neither skips nor (except the hook that
/// was running) repeats an event": no event whose runs had all ended
/// before the crash (at or below the reporter's `hooks_done` then) runs
/// again.
#[test]
fn hooks_that_ended_before_a_crash_do_not_run_again() {
    let crash = hook_crash();
    let repeated: Vec<(u64, usize)> = runs_per_event(&crash)
        .into_iter()
        .filter(|(seq, count)| *seq <= crash.done_at_kill && *count > 1)
        .collect();
    println!(
        "hooks: done through seq {} at the kill ({} saved in reporter/state.json); \
         repeated of those: {repeated:?}",
        crash.done_at_kill, crash.saved_at_kill
    );
    assert!(
        repeated.is_empty(),
        "events whose hooks had ended before the crash ran again: {repeated:?} \
         (done through {} at the kill, {} saved)",
        crash.done_at_kill,
        crash.saved_at_kill
    );
}

/// Waits until the reporter on `listen` has no hook running or pending;
/// its `/status.json` then.
fn poll_hooks_idle(listen: &str, reporter: &Process) -> Value {
    let mut status = Value::Null;
    poll(
        "the reporter's hooks are all done",
        SLOW,
        Duration::from_millis(20),
        || {
            status = status_json(listen).unwrap_or(Value::Null);
            status["reporter"]["pid"] == json!(reporter.pid)
                && status["reporter"]["hooks_running"] == json!(0)
                && status["reporter"]["hooks_pending"] == json!(0)
        },
        || format!("{:?}\n{}", status_json(listen), reporter.log()),
    );
    status
}

// ----- 5. bad input -----

/// One daemon's event watch over the raw framing.
struct Watcher<'a> {
    daemon: &'a str,
    socket: PathBuf,
    method: &'a str,
}

impl Watcher<'_> {
    fn client(&self) -> Client {
        Client::connect(&self.socket)
    }

    fn last(&self, client: &mut Client) -> u64 {
        let answer = client.ok(self.method, json!([null, null, 0]));
        assert_eq!(answer["events"], json!([]), "{answer}");
        answer["next"].as_u64().expect("next")
    }

    /// Every refusal of bad arguments, on one connection that keeps
    /// serving.
    fn check(&self) {
        let (daemon, method) = (self.daemon, self.method);
        let mut client = self.client();
        let last = self.last(&mut client);

        // A cursor in the future: EventsFuture with the last event,
        // at once even with a timeout.
        for since in [json!(last + 1), json!(last + 1000), json!(u64::MAX)] {
            let asked = Instant::now();
            let failure = client.call(method, json!([since, null, 5]));
            assert_eq!(
                failure,
                Err(("EventsFuture".to_owned(), json!([last]))),
                "{daemon} {method} from {since}"
            );
            assert!(
                asked.elapsed() < Duration::from_secs(4),
                "a future cursor is refused at once, not after the timeout"
            );
        }
        // The last itself is no error (nothing after it yet).
        assert_eq!(
            client.ok(method, json!([last, null, 0])),
            json!({"events": [], "next": last})
        );

        let many: Vec<String> = (0..65).map(|index| format!("type{index}.")).collect();
        let sixty_four: Vec<String> = many[..64].to_vec();
        let long = "x".repeat(200);
        let longest = "x".repeat(128);
        let bad: Vec<(Value, &str)> = vec![
            (json!([-1, null, 0]), "argument 1"),
            (json!([1.5, null, 0]), "argument 1"),
            (json!(["5", null, 0]), "argument 1"),
            (json!([true, null, 0]), "argument 1"),
            (json!([{}, null, 0]), "argument 1"),
            (json!([[1], null, 0]), "argument 1"),
            (json!([0, "job.", 0]), "argument 2"),
            (json!([0, 7, 0]), "argument 2"),
            (json!([0, {"job.": 1}, 0]), "argument 2"),
            (json!([0, [3], 0]), "argument 2"),
            (json!([0, [null], 0]), "argument 2"),
            (json!([0, ["job.", ["lock."]], 0]), "argument 2"),
            (json!([0, many, 0]), "argument 2"),
            (json!([0, [long], 0]), "argument 2"),
            (json!([0, null, -1]), "argument 3"),
            (json!([0, null, -0.001]), "argument 3"),
            (json!([0, null, "1"]), "argument 3"),
            (json!([0, null, null]), "argument 3"),
            (json!([0, null, true]), "argument 3"),
            (json!([0, null, [1]]), "argument 3"),
            (json!([]), "takes 3 arguments"),
            (json!([0]), "takes 3 arguments"),
            (json!([0, null]), "takes 3 arguments"),
            (json!([0, null, 0, 0]), "takes 3 arguments"),
        ];
        for (args, names) in &bad {
            let (class, message) = client.fails(method, args.clone());
            assert_eq!(class, "GenericError", "{daemon} {method} {args}: {message}");
            assert!(
                message.contains(names) && message.contains(method),
                "{daemon} {method} {args}: the message {message:?} names {names:?} and {method}"
            );
            // The same connection still serves.
            assert_eq!(self.last(&mut client), last, "{daemon} after {args}");
        }
        let (_, message) = client.fails(method, json!([0, many, 0]));
        assert!(message.contains("64"), "the limit is named: {message}");
        let (_, message) = client.fails(method, json!([0, [long], 0]));
        assert!(message.contains("128"), "the limit is named: {message}");

        // At the limits: accepted. A huge timeout is capped, and with
        // events there it answers at once.
        for types in [json!(sixty_four), json!([longest]), json!([]), json!([""])] {
            let answer = client.ok(method, json!([last, types, 0]));
            assert_eq!(answer["next"], json!(last), "{answer}");
        }
        if last > 0 {
            let answer = client.ok(method, json!([0, null, 1e300]));
            assert_eq!(answer["events"][0]["seq"], json!(1), "{answer}");
        }

        // Raw frames: args not a list, not JSON, not an object.
        for frame in [
            format!("{{\"method\":\"{method}\",\"args\":\"x\"}}\n\x03"),
            format!("{{\"method\":\"{method}\",\"args\":{{\"since\":0}}}}\n\x03"),
            format!("{{\"method\":\"{method}\",\"args\":[0,null,1e999]}}\n\x03"),
            format!("{{\"method\":\"{method}\",\"args\":[0,null,0]\n\x03"),
            "[1,2,3]\n\x03".to_owned(),
        ] {
            let mut raw = self.client();
            raw.send_raw(frame.as_bytes()).expect("send a raw frame");
            match raw.read_response() {
                Ok(Err((class, args))) => {
                    assert_eq!(class, "GenericError", "{daemon} {frame:?}: {args}")
                }
                Ok(Ok(value)) => panic!("{daemon} answered {frame:?} with {value}"),
                // Closing on an unparsable frame is fine too.
                Err(error) => assert!(
                    matches!(
                        error.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                    ),
                    "{daemon} {frame:?}: {error}"
                ),
            }
        }
        assert_eq!(self.last(&mut client), last, "{daemon} still serves");
    }
}

#[test]
fn watch_events_refuses_bad_cursors_and_arguments_and_keeps_serving() {
    let cluster = Cluster::start();
    let root = cluster.root().clone();
    let luxid = Watcher {
        daemon: "luxid",
        socket: Luxid::socket(&root),
        method: "WatchEvents",
    };
    let wconfd = Watcher {
        daemon: "wconfd",
        socket: root.socket(),
        method: "watchEvents",
    };
    // One lock event, so that wconfd has a sequence to read too.
    let owner = OwnerProcess::spawn(&cluster.wconfd.livelock_dir(), 4242);
    let mut locks = cluster.wconfd_client();
    assert_eq!(
        try_update(&mut locks, &owner, &[("node/n1", "exclusive")]),
        json!([])
    );
    luxid.check();
    wconfd.check();

    // Both still serve a held watch, answered by the next event.
    let mut held_luxid = luxid.client();
    let luxid_last = luxid.last(&mut held_luxid);
    held_luxid
        .send("WatchEvents", json!([luxid_last, ["job."], 30]))
        .expect("send a held watch");
    let mut held_wconfd = wconfd.client();
    let wconfd_last = wconfd.last(&mut held_wconfd);
    held_wconfd
        .send("watchEvents", json!([wconfd_last, ["lock."], 30]))
        .expect("send a held watch");
    assert_eq!(
        try_update(&mut locks, &owner, &[("node/n1", "release")]),
        json!([])
    );
    let answer = held_wconfd
        .read_response()
        .expect("wconfd answers the held watch")
        .expect("events");
    assert_eq!(
        answer["events"][0]["type"],
        json!("lock.released"),
        "{answer}"
    );
    assert_eq!(answer["events"][0]["seq"], json!(wconfd_last + 1));
    let id = cluster.submit(json!([exec(&["/bin/true"])]));
    let answer = held_luxid
        .read_response()
        .expect("luxid answers the held watch")
        .expect("events");
    assert_eq!(
        answer["events"][0]["type"],
        json!("job.submitted"),
        "{answer}"
    );
    assert_eq!(answer["events"][0]["id"], json!(id));
    assert_eq!(answer["events"][0]["seq"], json!(luxid_last + 1));
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
}
