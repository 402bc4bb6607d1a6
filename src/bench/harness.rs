//! What the daemon benches share: a scratch directory for their roots, a
//! lean client of either daemon's socket (requests built by the typed
//! request enums and encoded once, replies checked without a copy), and
//! the fsync probe that gives every figure its floor.

use std::cell::Cell;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Result, WithContext as _, fail, percentile};
use crate::protocol::{ETX, Request};

/// Longest wait for any one reply: a hung daemon fails the bench instead
/// of hanging it (and CI).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between attempts to connect to a starting daemon, and between
/// looks at a stopping one: small against the restart targets.
pub const POLL_PAUSE: Duration = Duration::from_micros(200);

/// The scratch directory of one bench process, holding a root per run;
/// removed when dropped.
pub struct Workspace {
    pub dir: PathBuf,
    /// Numbers the run directories.
    next_run: Cell<u64>,
}

impl Workspace {
    /// `<parent>/<program>-<pid>`, spelled canonically (as the daemons
    /// spell their root, and so the livelock paths of owners and jobs).
    pub fn create(parent: &Path, program: &str) -> Result<Workspace> {
        let dir = parent.join(format!("{program}-{}", std::process::id()));
        fs::create_dir_all(&dir).context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .context(|| format!("cannot resolve {}", dir.display()))?;
        if dir.to_str().is_none() {
            return fail(format!(
                "{} is not UTF-8, which owners on the wire need",
                dir.display()
            ));
        }
        Ok(Workspace {
            dir,
            next_run: Cell::new(1),
        })
    }

    /// The directory of the next run (`run-1`, `run-2`, ...), not yet
    /// created.
    pub fn next_run_dir(&self) -> PathBuf {
        let run = self.next_run.replace(self.next_run.get() + 1);
        self.dir.join(format!("run-{run}"))
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A request frame as Ganeti's client sends it: JSON, a newline, ETX.
/// Benches encode their requests once and send the bytes many times.
pub fn frame(request: &Request) -> Vec<u8> {
    let mut frame = serde_json::to_vec(&json!({"method": request.method, "args": request.args}))
        .expect("a JSON value always serializes");
    frame.push(b'\n');
    frame.push(ETX);
    frame
}

/// One connection to a daemon; requests are answered in order.
pub struct Client {
    stream: BufReader<UnixStream>,
    reply: Vec<u8>,
    /// The daemon, for error messages.
    peer: &'static str,
}

impl Client {
    pub fn new(stream: UnixStream, peer: &'static str) -> Result<Client> {
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .context(|| "cannot set a reply timeout".to_owned())?;
        Ok(Client {
            stream: BufReader::new(stream),
            reply: Vec::new(),
            peer,
        })
    }

    /// Sends an encoded request ([`frame`]).
    pub fn send(&mut self, frame: &[u8]) -> Result<()> {
        self.stream
            .get_mut()
            .write_all(frame)
            .context(|| format!("cannot send to {}", self.peer))
    }

    /// The next reply, without its ETX.
    pub fn receive(&mut self) -> Result<&[u8]> {
        self.reply.clear();
        self.stream
            .read_until(ETX, &mut self.reply)
            .context(|| format!("no reply from {}", self.peer))?;
        if self.reply.pop() != Some(ETX) {
            return fail(format!("{} closed the connection", self.peer));
        }
        Ok(&self.reply)
    }

    /// Sends an encoded request and reads its reply.
    pub fn call(&mut self, frame: &[u8]) -> Result<&[u8]> {
        self.send(frame)?;
        self.receive()
    }

    /// Sends a request and answers its result (an error reply is an
    /// error).
    pub fn result(&mut self, request: &Request) -> Result<Value> {
        let peer = self.peer;
        let reply = self.call(&frame(request))?;
        result_of(peer, reply)
    }
}

/// The result of a successful reply of `peer`; an error reply is an
/// error.
pub fn result_of(peer: &str, reply: &[u8]) -> Result<Value> {
    let text = || String::from_utf8_lossy(reply).into_owned();
    let mut response: Value = serde_json::from_slice(reply)
        .context(|| format!("{peer}'s reply is not JSON: {}", text()))?;
    let success = response.get("success").and_then(Value::as_bool);
    match (success, response.get_mut("result")) {
        (Some(true), Some(result)) => Ok(result.take()),
        (Some(false), Some(error)) => fail(format!("{peer} answered {error}")),
        _ => fail(format!("{peer}'s reply is not a response: {}", text())),
    }
}

/// Median seconds to append a record of `record_bytes` to a file in `dir`
/// and `sync_data` it, over at most `count_max` appends or (after the
/// first) `time_max`: the floor under every reply that reveals a change.
pub fn fsync_cost(
    dir: &Path,
    record_bytes: usize,
    count_max: usize,
    time_max: Duration,
) -> Result<f64> {
    let path = dir.join("fsync-probe");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .context(|| format!("cannot open {}", path.display()))?;
    let record = vec![b'x'; record_bytes];
    let mut samples = Vec::with_capacity(count_max);
    let started = Instant::now();
    while samples.len() < count_max && (samples.is_empty() || started.elapsed() < time_max) {
        let written = Instant::now();
        file.write_all(&record)
            .and_then(|()| file.sync_data())
            .context(|| format!("cannot append to and sync {}", path.display()))?;
        samples.push(written.elapsed().as_secs_f64());
    }
    drop(file);
    fs::remove_file(&path).context(|| format!("cannot remove {}", path.display()))?;
    samples.sort_by(f64::total_cmp);
    Ok(percentile(&samples, 0.50))
}
