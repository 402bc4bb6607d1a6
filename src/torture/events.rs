//! The event sequences and the reporter under the chaos: two reporters
//! (one elected, one standing by) run a hook on every `job.finished`, the
//! chaos kills the elected one now and then, and at the end:
//! - each daemon's sequence is numbered 1, 2, 3, ... without a gap;
//! - every job's events tell its life once and in order (submitted, each
//!   step of its path from the last one, finished with its final status,
//!   archived last), and agree with the job's final status;
//! - the hook ran at least once for every `job.finished`, with that event
//!   on its stdin.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Shared;
use crate::client::{Client, Daemon};
use crate::events::{Event, EventLine};
use crate::jobs::{PathStep, Status};

/// Where the hook leaves one file per event it ran for.
pub const HOOK_RECORDS_DIR: &str = "hook-records";

/// The hook: its stdin into `hook-records/<seq>`, whole or not at all.
const HOOK_SCRIPT: &str = "#!/bin/sh\n\
    dir=\"$(dirname \"$0\")/hook-records\"\n\
    mkdir -p \"$dir\"\n\
    tmp=\"$dir/.$WARDEN_EVENT_SEQ.$$\"\n\
    cat > \"$tmp\" && mv \"$tmp\" \"$dir/$WARDEN_EVENT_SEQ\"\n";

/// The settings the harness adds for the reporter: no endpoint (runs
/// share the machine), the hook on every job's end.
pub fn settings(root: &Path) -> Result<String, String> {
    let script = root.join("hook.sh");
    fs::write(&script, HOOK_SCRIPT).map_err(|error| format!("cannot write the hook: {error}"))?;
    let mut permissions = fs::metadata(&script)
        .map_err(|error| format!("cannot stat the hook: {error}"))?
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    fs::set_permissions(&script, permissions)
        .map_err(|error| format!("cannot make the hook executable: {error}"))?;
    Ok(format!(
        "[metrics]\nlisten = \"\"\n[hooks]\n\"job.finished\" = [{:?}]\n",
        script.display().to_string()
    ))
}

/// The reporters of a run: `warden reporter` processes.
pub struct Reporters {
    binary: PathBuf,
    root: PathBuf,
    running: Vec<Child>,
}

impl Reporters {
    pub fn new(binary: &Path, root: &Path) -> Reporters {
        Reporters {
            binary: binary.to_owned(),
            root: root.to_owned(),
            running: Vec::new(),
        }
    }

    /// Starts reporters until `count` run.
    pub fn keep(&mut self, count: usize, shared: &Shared) {
        self.reap(shared);
        while self.running.len() < count {
            let log: File = match OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.root.join("reporter.log"))
            {
                Ok(log) => log,
                Err(error) => {
                    return shared.violation(format!("cannot open reporter.log: {error}"));
                }
            };
            let spawned = {
                let _spawn = super::processes::spawn_guard();
                Command::new(&self.binary)
                    .arg("reporter")
                    .arg("--root")
                    .arg(&self.root)
                    .env("WARDEN_LOG", "info")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .process_group(0)
                    .spawn()
            };
            match spawned {
                Ok(child) => {
                    shared
                        .figures
                        .reporter_starts
                        .fetch_add(1, Ordering::Relaxed);
                    self.running.push(child);
                }
                Err(error) => {
                    return shared.violation(format!("cannot start a reporter: {error}"));
                }
            }
        }
    }

    /// Reporters that exited on their own are gone from the list (a
    /// reporter deposed or failing is the log's business: the election
    /// goes on).
    pub fn reap(&mut self, shared: &Shared) {
        let mut gone = shared
            .reporters_gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.running.retain_mut(|child| {
            let running = matches!(child.try_wait(), Ok(None));
            if !running {
                gone.insert(child.id());
            }
            running
        });
    }

    /// SIGKILL to the elected one (the holder of `service/reporter`), if
    /// it is one of these.
    pub fn kill_elected(&mut self, shared: &Shared) {
        let Some(pid) = elected(shared) else {
            return;
        };
        if let Some(index) = self.running.iter().position(|child| child.id() == pid) {
            // Recorded before the signal: its death may be told at once.
            shared
                .reporters_gone
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(pid);
            let mut child = self.running.remove(index);
            let _ = child.kill();
            let _ = child.wait();
            shared
                .figures
                .reporter_kills
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// SIGTERM to all, each reaped (SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        super::processes::terminate(self.running.drain(..), grace);
    }
}

impl Drop for Reporters {
    fn drop(&mut self) {
        for child in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The pid of the holder of `service/reporter`, if wconfd answers and one
/// holds it.
fn elected(shared: &Shared) -> Option<u32> {
    let mut client = Client::connect(&shared.root, Daemon::Wconfd, 1 << 24).ok()?;
    let table = client.list_all_locks_owners().ok()?;
    table.as_array()?.iter().find_map(|entry| {
        (entry[0].as_str() == Some(crate::reporter::REPORTER_LOCK))
            .then(|| entry[1][0][0][2].as_u64().map(|pid| pid as u32))
            .flatten()
    })
}

/// Every event of a daemon, from the first.
fn all_events(shared: &Shared, daemon: Daemon) -> Result<Vec<Event>, String> {
    let mut client =
        Client::connect(&shared.root, daemon, 1 << 24).map_err(|error| error.to_string())?;
    let (events, _) = client
        .events_after(0, None)
        .map_err(|error| format!("{}'s events: {error}", daemon.name()))?;
    events.iter().map(EventLine::decode).collect()
}

/// The checks at the end (every job final, the daemons up): the
/// sequences, then the hooks (waiting for the elected reporter to catch
/// up).
pub fn final_checks(shared: &Shared, finals: &BTreeMap<u64, String>, settle: Duration) {
    let luxid = match all_events(shared, Daemon::Luxid) {
        Ok(events) => events,
        Err(error) => return shared.violation(error),
    };
    let wconfd = match all_events(shared, Daemon::Wconfd) {
        Ok(events) => events,
        Err(error) => return shared.violation(error),
    };
    for (daemon, events) in [("luxid", &luxid), ("wconfd", &wconfd)] {
        check_numbered(shared, daemon, events);
    }
    shared
        .figures
        .events_checked
        .store((luxid.len() + wconfd.len()) as u64, Ordering::Relaxed);
    check_job_stories(shared, &luxid, finals);
    check_hooks(shared, &luxid, settle);
}

fn check_numbered(shared: &Shared, daemon: &str, events: &[Event]) {
    for (index, event) in events.iter().enumerate() {
        if event.seq != index as u64 + 1 {
            return shared.violation(format!(
                "{daemon}'s sequence: event {} where {} was due (a gap or a repeat)",
                event.seq,
                index + 1
            ));
        }
    }
}

#[derive(Default)]
struct Told {
    submitted: bool,
    status: Option<String>,
    last_key: Option<(usize, u8)>,
    finished: Option<String>,
    archived: bool,
}

/// Each job's story is told once, in order, and ends as the job did.
fn check_job_stories(shared: &Shared, events: &[Event], finals: &BTreeMap<u64, String>) {
    let mut told: BTreeMap<u64, Told> = BTreeMap::new();
    for event in events {
        let Some(id) = event.fields.get("id").and_then(Value::as_u64) else {
            continue;
        };
        let text = |name: &str| {
            event
                .fields
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let job = told.entry(id).or_default();
        let wrong = |what: &str| format!("job {id}, event {}: {what}", event.seq);
        if job.archived {
            return shared.violation(wrong("an event after its archiving"));
        }
        match event.kind.as_str() {
            "job.submitted" if job.submitted => return shared.violation(wrong("submitted twice")),
            "job.submitted" => job.submitted = true,
            "job.status" => {
                if !job.submitted || job.finished.is_some() {
                    return shared.violation(wrong("a step outside its life"));
                }
                let old = job.status.clone().unwrap_or_else(|| "queued".to_owned());
                if text("old") != old {
                    return shared.violation(wrong(&format!(
                        "from {} where the last step said {old}",
                        text("old")
                    )));
                }
                let Some(status) = Status::parse(&text("new")) else {
                    return shared.violation(wrong("an unknown status"));
                };
                let opcode = event
                    .fields
                    .get("opcode")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                let key = PathStep {
                    opcode: opcode as usize,
                    status,
                }
                .key();
                if job.last_key >= Some(key) {
                    return shared.violation(wrong("a step back or a step again"));
                }
                job.last_key = Some(key);
                job.status = Some(text("new"));
            }
            "job.finished" => {
                if !job.submitted || job.finished.is_some() {
                    return shared.violation(wrong("finished twice or before its submission"));
                }
                if Some(text("status")) != job.status {
                    return shared.violation(wrong("finished other than its last step"));
                }
                job.finished = Some(text("status"));
            }
            "job.archived" if job.finished.is_none() => {
                return shared.violation(wrong("archived unfinished"));
            }
            "job.archived" => job.archived = true,
            _ => {}
        }
    }
    for (id, status) in finals {
        match told.get(id) {
            Some(job) if job.finished.as_deref() == Some(status.as_str()) => {}
            Some(job) => {
                return shared.violation(format!(
                    "job {id} ended {status}, its events say {:?}",
                    job.finished
                ));
            }
            None => return shared.violation(format!("job {id} is in no event")),
        }
    }
    shared
        .figures
        .stories_checked
        .store(finals.len() as u64, Ordering::Relaxed);
}

/// A hook output for every `job.finished`, holding that event.
fn check_hooks(shared: &Shared, events: &[Event], settle: Duration) {
    let dir = shared.root.join(HOOK_RECORDS_DIR);
    let finished: Vec<&Event> = events
        .iter()
        .filter(|event| event.kind == "job.finished")
        .collect();
    let deadline = Instant::now() + settle;
    let missing = loop {
        let missing: Vec<u64> = finished
            .iter()
            .filter(|event| !dir.join(event.seq.to_string()).is_file())
            .map(|event| event.seq)
            .collect();
        if missing.is_empty() || Instant::now() >= deadline {
            break missing;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !missing.is_empty() {
        let shown: Vec<String> = missing.iter().take(10).map(u64::to_string).collect();
        return shared.violation(format!(
            "{} job.finished events without a hook run {settle:?} after the end: {}",
            missing.len(),
            shown.join(", ")
        ));
    }
    for event in finished {
        let path = dir.join(event.seq.to_string());
        let line = fs::read(&path).unwrap_or_default();
        let given = Event::decode(line.strip_suffix(b"\n").unwrap_or(&line));
        if given.as_ref().ok() != Some(event) {
            return shared.violation(format!(
                "the hook of event {} was given {:?}",
                event.seq,
                String::from_utf8_lossy(&line)
            ));
        }
    }
    shared
        .figures
        .hooks_checked
        .store(dir_count(&dir), Ordering::Relaxed);
}

fn dir_count(dir: &Path) -> u64 {
    fs::read_dir(dir).map_or(0, |entries| entries.count() as u64)
}
