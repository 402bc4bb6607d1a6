//! The chaos thread's actions and every check of a run.
//!
//! After each start of wconfd (the clients held off by the gate):
//! - every lock client owner alive holds exactly what was acknowledged to
//!   it (a pending request may have been granted since);
//! - every owner killed before holds nothing and waits for nothing (the
//!   start-up pass frees dead owners before the socket is bound);
//! - the lock table has no conflicting holders;
//! - the configuration is the config client's last acknowledged write or
//!   a later one whose answer was lost (see [`super::config_client`]).
//!
//! After each kill of luxid: `queue/serial` names at least every id luxid
//! acknowledged (it is written with each commit, before the replies).
//!
//! After each start of luxid: every acknowledged job exists; a job that is
//! `waiting`, `running` or `canceling` has a live runner (its livelock is
//! held), or becomes final promptly.
//!
//! At the end, once the clients stopped and freed their locks and every
//! job ended: no job non-final, no runner left, every `error` explained
//! (by a runner the chaos killed, a failed dependency, a preceding
//! opcode), dependants started only after their dependencies ended, no two
//! conflicting lock intervals overlap (lock clients' and jobs' opcodes'),
//! every job `ArchiveJob` archived in the archive and not in the queue, no
//! priority request left, the configuration as above, the lock table
//! empty, and no stale livelock file left but those the stale-age rule
//! allows (D12).
//!
//! Also at the end, for timeouts and retries: each opcode's attempt
//! entries are numbered 1, 2, ... of `max + 1` and agree with how it
//! ended; a runner's death with `on_death` ends a job only once its
//! attempts ran out; a job whose cancel luxid took goes on with at most
//! the attempt in progress (unless luxid was killed before it ended); a
//! program run past its `timeout` ends by it; a lock wait past its
//! `lock_timeout` ran nothing; a job canceled by its `start_by` never
//! started, and one that started did so by its `start_by`.
//!
//! Fencing tokens and deaths (see [`super::fences`]): every listing with
//! tokens (before each chaos action, after each start of wconfd, the lock
//! clients' own) records its tokens and deaths; after a start of wconfd
//! each live lock owner's locks show the tokens answered before the
//! crash; at the end every death told names an owner that really ended
//! holding that lock (`check_deaths`).
//!
//! The worker client's farm is checked after each start of wconfd and at
//! the end (what was acknowledged stands), and at the end no board was
//! held by two jobs' programs at once and each handover of a board with a
//! prepare passed through one (see [`worker_clients`]).

use crate::limits::TORTURE_DEATH_MARK_TIMEOUT;
use std::collections::BTreeMap;
use std::fs;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::client::{Client, Daemon};
use crate::limits::LIVELOCK_STALE_AGE_MIN;
use crate::liveness;
use crate::locks::Mode;
use crate::protocol::wconfd::WconfdRequest;
use crate::queue;
use crate::scheduling::rate_limit::{Bucket, buckets_of};

use super::history::{self, Interval, now_us};
use super::job_clients::{
    FAILING, FILTER_UUID, FLAKY, FilterChange, HELD_REASON, PROGRAM_VAR, RUNNER_KILLER, SLOW,
    STUBBORN,
};
use super::lock_clients::parse_listing;
use super::processes::{self, DaemonProcess, OwnerFate};
use super::rng::Rng;
use super::{Shared, worker_clients};
use crate::workers::NO_WORKER_MATCHES;

/// Conflicting interval pairs reported at most.
const CONFLICTS_REPORTED_MAX: usize = 10;

/// The two daemons of a run.
pub struct Daemons {
    pub wconfd: DaemonProcess,
    pub luxid: DaemonProcess,
    pub reporters: super::events::Reporters,
}

impl Daemons {
    pub fn start_wconfd(&mut self, shared: &Shared) -> Result<(), String> {
        let result = self.wconfd.start();
        shared.figures.wconfd_starts.fetch_add(1, Ordering::Relaxed);
        if let Err(message) = &result {
            shared.violation(format!("wconfd did not start again: {message}"));
        }
        result
    }

    pub fn start_luxid(&mut self, shared: &Shared) -> Result<(), String> {
        let result = self.luxid.start();
        shared.figures.luxid_starts.fetch_add(1, Ordering::Relaxed);
        if let Err(message) = &result {
            shared.violation(format!("luxid did not start again: {message}"));
        }
        result
    }

    /// A daemon that exited on its own is a violation.
    fn check_alive(&mut self, shared: &Shared) {
        for daemon in [&mut self.wconfd, &mut self.luxid] {
            if let Some(status) = daemon.exited() {
                shared.violation(format!(
                    "{} exited on its own with {status}; its log ends:\n{}",
                    daemon.name,
                    daemon.log_tail()
                ));
            }
        }
    }
}

fn wconfd(shared: &Shared) -> Result<Client, String> {
    Client::connect(&shared.root, Daemon::Wconfd, 1 << 24).map_err(|error| error.to_string())
}

fn luxid(shared: &Shared) -> Result<Client, String> {
    Client::connect(&shared.root, Daemon::Luxid, 1 << 24).map_err(|error| error.to_string())
}

/// One action of the chaos thread, after a random pause.
pub fn chaos_step(rng: &mut Rng, shared: &Shared, daemons: &mut Daemons) {
    std::thread::sleep(Duration::from_millis(rng.between(20, 400)));
    daemons.check_alive(shared);
    if shared.failed() {
        return;
    }
    // wconfd's own table never shows conflicting holders; its tokens and
    // deaths are recorded.
    if let Ok(mut client) = wconfd(shared)
        && let Ok(table) = client.wconfd(&WconfdRequest::ListAllLocksOwners { tokens: true })
    {
        shared.figures.table_checks.fetch_add(1, Ordering::Relaxed);
        check_table(shared, &table);
        shared.observe_tokens(&table);
    }
    // Now and then the elected reporter dies; another takes over.
    if rng.below(20) == 0 {
        daemons.reporters.kill_elected(shared);
    }
    daemons.reporters.keep(super::REPORTERS, shared);
    let downtime = Duration::from_millis(rng.below(300));
    match rng.below(100) {
        0..=14 => {
            daemons.wconfd.kill9();
            shared.figures.wconfd_kills.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(downtime);
            if daemons.start_wconfd(shared).is_ok() {
                after_wconfd_start(shared);
            }
        }
        15..=29 => {
            note_luxid_kill(shared);
            daemons.luxid.kill9();
            shared.figures.luxid_kills.fetch_add(1, Ordering::Relaxed);
            check_serial_file(shared);
            std::thread::sleep(downtime);
            if daemons.start_luxid(shared).is_ok() {
                after_luxid_start(shared);
            }
        }
        30..=34 => {
            // Both, wconfd first; luxid needs wconfd to start.
            note_luxid_kill(shared);
            daemons.luxid.kill9();
            check_serial_file(shared);
            daemons.wconfd.kill9();
            shared.figures.luxid_kills.fetch_add(1, Ordering::Relaxed);
            shared.figures.wconfd_kills.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(downtime);
            if daemons.start_wconfd(shared).is_ok() {
                after_wconfd_start(shared);
                if daemons.start_luxid(shared).is_ok() {
                    after_luxid_start(shared);
                }
            }
        }
        35..=69 => {
            let running = processes::runners(&shared.binaries.runner, &shared.root);
            if running.is_empty() {
                return;
            }
            let runner = *rng.pick(&running);
            if processes::kill_runner(&shared.binaries.runner, &shared.root, runner) {
                shared
                    .runners_killed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(runner.job);
                shared.figures.runner_kills.fetch_add(1, Ordering::Relaxed);
            }
        }
        _ => {
            let alive: Vec<_> = shared
                .owners
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|owner| owner.fate() == OwnerFate::Alive)
                .cloned()
                .collect();
            if alive.is_empty() {
                return;
            }
            if rng.pick(&alive).kill9() {
                shared.figures.owner_kills.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn note_luxid_kill(shared: &Shared) {
    shared
        .luxid_kills
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(now_us());
}

/// The checks after a start of wconfd, with the lock clients held off.
pub fn after_wconfd_start(shared: &Shared) {
    let _gate = shared.gate.write().unwrap_or_else(PoisonError::into_inner);
    shared
        .figures
        .restart_checks
        .fetch_add(1, Ordering::Relaxed);
    let mut client = match wconfd(shared) {
        Ok(client) => client,
        Err(error) => return shared.violation(format!("wconfd answers no more: {error}")),
    };
    let mut call = |request: WconfdRequest| -> Option<Value> {
        match client.wconfd(&request) {
            Ok(value) => Some(value),
            Err(error) => {
                shared.violation(format!(
                    "after a wconfd start, {} failed: {error}",
                    request.method()
                ));
                None
            }
        }
    };
    let mut listed_owners = Vec::new();
    for (index, model) in shared.models.iter().enumerate() {
        let model = model.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(owner) = &model.owner else { continue };
        if owner.fate() != OwnerFate::Alive || model.unsure.is_some() {
            continue;
        }
        let Some(listed) = call(WconfdRequest::ListLocks {
            owner: owner.owner(),
        }) else {
            return;
        };
        let listed = parse_listing(&listed);
        if model.pending.is_none() {
            // Its holdings cannot change while the gate is held.
            listed_owners.push((owner.wire().to_string(), listed.clone()));
        }
        let expected = Some(model.expected_listing());
        let granted_since = model.listing_with_pending();
        if listed != expected && listed != granted_since {
            shared.violation(format!(
                "after a wconfd start, lock client {index}'s owner {} holds {listed:?}, \
                 but {expected:?} was acknowledged (pending: {:?})",
                owner.ident, model.pending
            ));
        }
        if model.pending.is_some() && listed == expected {
            let pending = call(WconfdRequest::HasPendingRequest {
                owner: owner.owner(),
            });
            // Granted between the two calls (a blocker's death freed
            // it, say): the listing has it now.
            let granted_meanwhile = pending != Some(Value::Bool(true))
                && call(WconfdRequest::ListLocks {
                    owner: owner.owner(),
                })
                .map(|listed| parse_listing(&listed))
                    == Some(granted_since);
            if pending != Some(Value::Bool(true)) && !granted_meanwhile {
                shared.violation(format!(
                    "after a wconfd start, lock client {index}'s owner {} lost its \
                     acknowledged pending request",
                    owner.ident
                ));
            }
        }
    }
    let owners = shared
        .owners
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for owner in owners {
        if !matches!(owner.fate(), OwnerFate::Killed { .. }) {
            continue;
        }
        let listed = call(WconfdRequest::ListLocks {
            owner: owner.owner(),
        });
        let pending = call(WconfdRequest::HasPendingRequest {
            owner: owner.owner(),
        });
        if listed != Some(json!([])) || pending != Some(Value::Bool(false)) {
            shared.violation(format!(
                "after a wconfd start, owner {} killed before it still holds {listed:?} \
                 (pending: {pending:?})",
                owner.ident
            ));
        }
    }
    if let Some(config) = call(WconfdRequest::ReadConfig) {
        check_config(shared, &config, "after a wconfd start");
    }
    if let Some(table) = call(WconfdRequest::ListAllLocksOwners { tokens: true }) {
        check_table(shared, &table);
        shared.observe_tokens(&table);
        // Every token acknowledged before the crash is the one listed now.
        for (index, model) in shared.models.iter().enumerate() {
            let mut model = model.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(message) = super::lock_clients::check_tokens(shared, &mut model, &table) {
                shared.violation(format!(
                    "after a wconfd start, lock client {index}: {message}"
                ));
            }
        }
        // The two listings agree for the lock clients' owners (runners
        // change theirs meanwhile).
        let mut by_owner: BTreeMap<String, Vec<(String, Mode)>> = BTreeMap::new();
        for row in table.as_array().into_iter().flatten() {
            let lock = row[0].as_str().unwrap_or_default();
            for holder in row[1].as_array().into_iter().flatten() {
                let mode = match holder[1].as_str() {
                    Some("exclusive") => Mode::Exclusive,
                    _ => Mode::Shared,
                };
                by_owner
                    .entry(holder[0].to_string())
                    .or_default()
                    .push((lock.to_owned(), mode));
            }
        }
        for (name, listed) in &listed_owners {
            let mut rows = by_owner.get(name).cloned().unwrap_or_default();
            rows.sort();
            if listed.as_ref() != Some(&rows) {
                shared.violation(format!(
                    "after a wconfd start, listLocks of {name} answers {listed:?} but \
                     listAllLocksOwners shows {rows:?}"
                ));
            }
        }
    }
    check_farm(shared, &mut client, "after a wconfd start");
}

/// A configuration read is one the config client's writes allow.
fn check_config(shared: &Shared, config: &Value, when: &str) {
    shared.figures.config_checks.fetch_add(1, Ordering::Relaxed);
    let checked = shared
        .config
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .check(config);
    if let Err(message) = checked {
        shared.violation(format!("{when}, {message}"));
    }
}

/// No two owners in wconfd's table hold conflicting locks.
fn check_table(shared: &Shared, table: &Value) {
    let mut holdings = Vec::new();
    for row in table.as_array().into_iter().flatten() {
        let lock = row[0].as_str().unwrap_or_default();
        for holder in row[1].as_array().into_iter().flatten() {
            let mode = match holder[1].as_str() {
                Some("exclusive") => Mode::Exclusive,
                _ => Mode::Shared,
            };
            holdings.push(Interval {
                owner: holder[0].to_string(),
                lock: lock.to_owned(),
                mode,
                start_us: 0,
                end_us: 1,
                ended: "listed",
            });
        }
    }
    let found = history::conflicts(&holdings, CONFLICTS_REPORTED_MAX);
    if !found.is_empty() {
        shared.violation(format!(
            "wconfd's lock table has conflicting holders: {found:?}"
        ));
    }
}

/// After a kill of luxid: the serial file names at least the highest id
/// acknowledged. Every id a client recorded was answered before the kill,
/// and luxid answers a submission only once the commit that wrote the
/// serial returned; a client that has not yet recorded its last answer
/// only lowers the bound.
fn check_serial_file(shared: &Shared) {
    let high = shared.serials().high();
    if high == 0 {
        return;
    }
    let path = shared
        .root
        .join(crate::paths::QUEUE_DIR)
        .join(crate::paths::SERIAL_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => match text.trim_end().parse::<u64>() {
            Ok(serial) if serial >= high => {}
            Ok(serial) => shared.violation(format!(
                "{} names {serial} after a kill of luxid, yet job {high} was acknowledged",
                path.display()
            )),
            Err(_) => shared.violation(format!(
                "{} is not a job id after a kill of luxid: {text:?}",
                path.display()
            )),
        },
        Err(error) => shared.violation(format!(
            "cannot read {} after a kill of luxid (job {high} was acknowledged): {error}",
            path.display()
        )),
    }
}

/// The checks after a start of luxid.
pub fn after_luxid_start(shared: &Shared) {
    shared
        .figures
        .restart_checks
        .fetch_add(1, Ordering::Relaxed);
    check_filter_kept(shared);
    let ids: Vec<u64> = shared.serials().ids().collect();
    if let Err(message) = check_jobs_sensible(shared, &ids) {
        shared.violation(message);
    }
}

/// Every job of `ids` exists; a started, unfinished one has a live runner
/// or is marked final within [`TORTURE_DEATH_MARK_TIMEOUT`].
fn check_jobs_sensible(shared: &Shared, ids: &[u64]) -> Result<(), String> {
    let mut client = luxid(shared)?;
    let mut suspects = Vec::new();
    for chunk in ids.chunks(500) {
        let rows = client
            .query_jobs(Some(chunk), &["id", "status", "received_ts"])
            .map_err(|error| format!("QueryJobs failed: {error}"))?;
        for (id, row) in chunk.iter().zip(&rows) {
            let status = row[1].as_str().unwrap_or("(unknown)");
            match status {
                "success" | "error" | "canceled" | "queued" => {}
                "waiting" | "running" | "canceling" => {
                    let secs = row[2][0].as_u64().unwrap_or(0);
                    let livelock = shared
                        .livelock_dir
                        .join(liveness::job_livelock_name(*id, secs));
                    if liveness::is_dead(&livelock) {
                        suspects.push(*id);
                    }
                }
                _ => {
                    return Err(format!(
                        "acknowledged job {id} is lost: luxid answers {row}"
                    ));
                }
            }
        }
    }
    for id in suspects {
        let deadline = Instant::now() + TORTURE_DEATH_MARK_TIMEOUT;
        loop {
            let rows = client
                .query_jobs(Some(&[id]), &["status"])
                .map_err(|error| format!("QueryJobs failed: {error}"))?;
            let status = rows
                .first()
                .and_then(|row| row[0].as_str())
                .unwrap_or("(unknown)")
                .to_owned();
            if matches!(status.as_str(), "success" | "error" | "canceled") {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "job {id} is still '{status}' {TORTURE_DEATH_MARK_TIMEOUT:?} after its runner was \
                     found dead"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

fn timestamp_us(value: &Value) -> Option<u64> {
    Some(value.get(0)?.as_u64()? * 1_000_000 + value.get(1)?.as_u64()?)
}

/// The locks an opcode takes besides the BGL (as submitted).
fn opcode_locks(op: &Value) -> Vec<(String, Mode)> {
    match op["OP_ID"].as_str() {
        Some("OP_EXEC") => op["locks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|entry| {
                let mode = if entry[1] == "exclusive" {
                    Mode::Exclusive
                } else {
                    Mode::Shared
                };
                (entry[0].as_str().unwrap_or_default().to_owned(), mode)
            })
            .collect(),
        // Whatever `no_locks` says, as in Ganeti 3.0.
        Some("OP_TEST_DELAY") => op["on_nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|node| {
                (
                    format!("node/{}", node.as_str().unwrap_or_default()),
                    Mode::Exclusive,
                )
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether no board is in PREPARE or RUNNING and every job of the queue
/// is final.
fn farm_quiet(shared: &Shared) -> Result<bool, String> {
    let listing = wconfd(shared).and_then(|mut client| {
        worker_clients::list_farm(&mut client).map_err(|error| error.to_string())
    })?;
    let busy = listing["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|worker| matches!(worker["state"].as_str(), Some("PREPARE" | "RUNNING")));
    let rows = luxid(shared).and_then(|mut client| {
        client
            .query_jobs(None, &["status"])
            .map_err(|error| error.to_string())
    })?;
    let unfinished = rows
        .iter()
        .any(|row| !matches!(row[0].as_str(), Some("success" | "error" | "canceled")));
    Ok(!busy && !unfinished)
}

/// The farm wconfd lists is what the worker client was acknowledged.
fn check_farm(shared: &Shared, client: &mut Client, when: &str) {
    match worker_clients::list_farm(client) {
        Ok(listing) => {
            shared.figures.farm_checks.fetch_add(1, Ordering::Relaxed);
            let farm = shared.farm.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(message) = farm.check(&listing) {
                shared.violation(format!("{when}, {message}"));
            }
        }
        Err(error) => shared.violation(format!("{when}, listWorkers failed: {error}")),
    }
}

/// No board was held by two jobs' programs at once, and every handover
/// of a board with a prepare passed through one (see
/// [`worker_clients`]). Killed programs end with their job, looked up
/// here for every job a record names (some were never acknowledged).
fn check_holds(shared: &Shared) {
    let (holds, prepares) =
        worker_clients::read_records(&shared.root.join(worker_clients::RECORDS_DIR));
    let mut ids: Vec<u64> = holds.iter().map(|hold| hold.job).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut ends = BTreeMap::new();
    let mut client = match luxid(shared) {
        Ok(client) => client,
        Err(error) => return shared.violation(format!("luxid answers no more: {error}")),
    };
    for chunk in ids.chunks(500) {
        match client.query_jobs(Some(chunk), &["end_ts"]) {
            Ok(rows) => {
                for (id, row) in chunk.iter().zip(&rows) {
                    if let Some(end_us) = timestamp_us(&row[0]) {
                        ends.insert(*id, end_us);
                    }
                }
            }
            Err(error) => return shared.violation(format!("QueryJobs failed: {error}")),
        }
    }
    shared
        .figures
        .holds_checked
        .store(holds.len() as u64, Ordering::Relaxed);
    let prepared = worker_clients::prepared_boards();
    let found = worker_clients::overlaps(&holds, &ends).and_then(|mut found| {
        let handovers = worker_clients::unprepared_handovers(&holds, &ends, &prepares, &prepared)?;
        found.extend(handovers);
        Ok(found)
    });
    let handovers = holds
        .iter()
        .flat_map(|hold| hold.uuids.iter())
        .filter(|uuid| prepared.contains(&uuid.as_str()))
        .count();
    shared
        .figures
        .handovers_checked
        .store(handovers as u64, Ordering::Relaxed);
    match found {
        Ok(found) => {
            for message in found.into_iter().take(CONFLICTS_REPORTED_MAX) {
                shared.violation(message);
            }
        }
        Err(message) => shared.violation(message),
    }
}

/// Settles the run and checks its end (see the module documentation).
pub fn final_checks(shared: &Shared, daemons: &mut Daemons, settle: Duration) {
    let ids: Vec<u64> = shared.serials().ids().collect();
    // Every job ends: the jobs the harness's rule holds once it is gone.
    let deadline = Instant::now() + settle;
    delete_filter(shared, deadline);
    let fields = [
        "id",
        "status",
        "ops",
        "opstatus",
        "opresult",
        "start_ts",
        "end_ts",
        "opexec",
        "opend",
        "received_ts",
        "oplog",
        "opstart",
    ];
    let rows: BTreeMap<u64, Value> = loop {
        let mut client = match luxid(shared) {
            Ok(client) => client,
            Err(error) => return shared.violation(format!("luxid answers no more: {error}")),
        };
        let mut rows = BTreeMap::new();
        for chunk in ids.chunks(500) {
            match client.query_jobs(Some(chunk), &fields) {
                Ok(answer) => {
                    for (id, row) in chunk.iter().zip(&answer) {
                        rows.insert(*id, row.clone());
                    }
                }
                Err(error) => return shared.violation(format!("QueryJobs failed: {error}")),
            }
        }
        let unfinished: Vec<u64> = rows
            .iter()
            .filter(|(_, row)| !matches!(row[1].as_str(), Some("success" | "error" | "canceled")))
            .map(|(id, _)| *id)
            .collect();
        if unfinished.is_empty() {
            break rows;
        }
        if Instant::now() >= deadline {
            let shown: Vec<String> = unfinished
                .iter()
                .take(10)
                .map(|id| format!("{id}: {}", rows[id][1]))
                .collect();
            return shared.violation(format!(
                "{} jobs not final {settle:?} after the chaos ended: {}",
                unfinished.len(),
                shown.join(", ")
            ));
        }
        daemons.check_alive(shared);
        if shared.failed() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The farm's own jobs (prepares) end too: no board in PREPARE or
    // RUNNING, and every job of the queue final.
    loop {
        match farm_quiet(shared) {
            Ok(true) => break,
            Ok(false) if Instant::now() < deadline => {}
            Ok(false) => {
                return shared.violation(format!(
                    "the farm is not quiet {settle:?} after the chaos ended (a board in \
                     PREPARE or RUNNING, or a job of the queue not final)"
                ));
            }
            Err(error) => return shared.violation(error),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    shared
        .figures
        .jobs_checked
        .store(rows.len() as u64, Ordering::Relaxed);
    // No runner is left once every job is final (give them a moment to
    // free their locks and exit).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes::runners(&shared.binaries.runner, &shared.root).is_empty() {
        if Instant::now() >= deadline {
            let left = processes::runners(&shared.binaries.runner, &shared.root);
            return shared.violation(format!("runners left after every job ended: {left:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check_outcomes(shared, &rows);
    check_queue_files(shared);
    check_intervals(shared, &rows);
    check_rate_limits(shared, &rows);
    check_held_jobs(shared, &rows);
    check_unique_keys(shared, &rows);
    check_attempts(shared, &rows);
    check_exec_timeouts(shared, &rows);
    check_lock_timeouts(shared, &rows);
    check_start_by(shared, &rows);
    check_holds(shared);
    check_deaths(shared, &rows, daemons);
    match wconfd(shared) {
        Ok(mut client) => check_farm(shared, &mut client, "at the end"),
        Err(error) => shared.violation(format!("wconfd answers no more: {error}")),
    }
    match wconfd(shared)
        .and_then(|mut client| client.read_config().map_err(|error| error.to_string()))
    {
        Ok(config) => check_config(shared, &config, "at the end"),
        Err(error) => shared.violation(format!("readConfig at the end failed: {error}")),
    }
    let finals: BTreeMap<u64, String> = rows
        .iter()
        .filter_map(|(id, row)| row[1].as_str().map(|status| (*id, status.to_owned())))
        .collect();
    super::events::final_checks(shared, &finals, settle);
    // The reporters go: their election lock is freed as they die.
    daemons.reporters.stop(Duration::from_secs(10));
    let swept = SystemTime::now();
    check_lock_table_empty(shared);
    check_livelocks(shared, swept);
}

/// Every death told (to a lock client's fenced grant, on a holding in a
/// listing, in a job's `why` entry) follows a real death of that owner
/// holding that lock (D66): a lock client's owner killed by the chaos
/// (before the death was first seen, holding the lock with that token as
/// far as its client knows), a job whose runner was killed or ended
/// without freeing its locks, a reporter that was killed or exited. A
/// config client's owner frees its locks before it ends, so it never dies
/// holding one.
fn check_deaths(shared: &Shared, rows: &BTreeMap<u64, Value>, daemons: &mut Daemons) {
    // The deaths the jobs' runners were told of, with their grants' fences.
    for (id, row) in rows {
        let ops = row[2].as_array().cloned().unwrap_or_default();
        for (index, log) in row[10].as_array().into_iter().flatten().enumerate() {
            for entry in log.as_array().into_iter().flatten() {
                let Some(died) = entry[3]["previous_holder_died"].as_array() else {
                    continue;
                };
                let told_to = format!("job {id}'s opcode {index}");
                let (Some(fence), Some(seen_us)) =
                    (entry[3]["fence"].as_u64(), timestamp_us(&entry[1]))
                else {
                    shared.violation(format!("{told_to} has a malformed why entry {entry}"));
                    continue;
                };
                let mut locks = vec!["cluster/BGL".to_owned()];
                locks.extend(
                    ops.get(index)
                        .map(opcode_locks)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(lock, _)| lock),
                );
                let mut errors = Vec::new();
                {
                    let mut fences = shared.fences();
                    errors.extend(fences.seen(fence, &id.to_string()).err());
                    for death in died {
                        errors.extend(fences.told(death, seen_us, &told_to, (fence, &locks)).err());
                    }
                }
                for error in errors {
                    shared.violation(format!("{told_to}'s why entry: {error}"));
                }
            }
        }
    }
    if let Ok(mut client) = wconfd(shared)
        && let Ok(table) = client.wconfd(&WconfdRequest::ListAllLocksOwners { tokens: true })
    {
        shared.observe_tokens(&table);
    }
    daemons.reporters.reap(shared);
    let reporters_gone = shared
        .reporters_gone
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let runners_killed = shared
        .runners_killed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    // Runners that ended unable to free their job's locks (wconfd away):
    // their owner is dead with them.
    let log = fs::read_to_string(daemons.luxid.log_path()).unwrap_or_default();
    let logged = |what: &str| -> std::collections::BTreeSet<u64> {
        log.lines()
            .filter(|line| line.contains(what))
            .filter_map(|line| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix("job=")?.parse().ok())
            })
            .collect()
    };
    let left_locks = logged("cannot free the job's locks");
    // A board's prepare job that luxid canceled (with kill) because a
    // newer state of the board won: not one of the harness's jobs.
    let prepares_canceled = logged("canceling the prepare job");
    let jobs = shared.jobs().clone();
    let owners: BTreeMap<String, std::sync::Arc<processes::OwnerProcess>> = shared
        .owners
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|owner| (owner.ident.clone(), std::sync::Arc::clone(owner)))
        .collect();
    let told: Vec<(super::fences::Death, super::fences::Told)> =
        shared.fences().told_deaths().cloned().collect();
    shared
        .figures
        .tokens_seen
        .store(shared.fences().tokens() as u64, Ordering::Relaxed);
    shared
        .figures
        .deaths_told
        .store(told.len() as u64, Ordering::Relaxed);
    // The opcodes of the jobs told dead: those checked above, and the
    // others (a submission whose answer was lost, a board's prepare) from
    // luxid.
    let mut ops_of: BTreeMap<u64, Vec<Value>> = rows
        .iter()
        .map(|(id, row)| (*id, row[2].as_array().cloned().unwrap_or_default()))
        .collect();
    let others: Vec<u64> = told
        .iter()
        .filter_map(|(death, _)| death.owner[0].as_u64())
        .filter(|id| !ops_of.contains_key(id))
        .collect::<std::collections::BTreeSet<u64>>()
        .into_iter()
        .collect();
    if !others.is_empty() {
        let answer = luxid(shared).and_then(|mut client| {
            client
                .query_jobs(Some(&others), &["ops"])
                .map_err(|error| error.to_string())
        });
        match answer {
            Ok(answer) => {
                for (id, row) in others.iter().zip(answer) {
                    ops_of.insert(*id, row[0].as_array().cloned().unwrap_or_default());
                }
            }
            Err(error) => return shared.violation(format!("QueryJobs failed: {error}")),
        }
    }
    for (death, told) in &told {
        let ident = &death.owner[0];
        let explained = if let Some(id) = ident.as_u64() {
            let ops = ops_of.get(&id).cloned().unwrap_or_default();
            let job = jobs.get(&id);
            let died = runners_killed.contains(&id)
                || job.is_some_and(|job| job.kill_asked)
                // wconfd ends a job whose board failed or went into
                // maintenance with `kill`.
                || ops.iter().any(|op| op["workers"].is_object())
                || ops.iter().any(|op| program_kind(op) == Some(RUNNER_KILLER))
                || left_locks.contains(&id)
                || (job.is_none() && prepares_canceled.contains(&id));
            // (Of a job luxid still knows.)
            let held = ops.is_empty()
                || death.lock == "cluster/BGL"
                || ops
                    .iter()
                    .any(|op| opcode_locks(op).iter().any(|(lock, _)| *lock == death.lock));
            if !died {
                Err(format!(
                    "job {id}'s runner was neither killed nor did it end holding its locks"
                ))
            } else if !held {
                Err(format!("job {id} never asked for {}", death.lock))
            } else {
                Ok(())
            }
        } else if ident.as_str() == Some(crate::reporter::REPORTER_IDENT) {
            let pid = death.owner[2].as_u64().unwrap_or_default() as u32;
            if reporters_gone.contains(&pid) {
                Ok(())
            } else {
                Err(format!("reporter {pid} was neither killed nor did it exit"))
            }
        } else if let Some(owner) = ident.as_str().and_then(|name| owners.get(name)) {
            shared
                .figures
                .deaths_of_lock_owners
                .fetch_add(1, Ordering::Relaxed);
            if owner.wire() != death.owner {
                Err(format!(
                    "the owner is not lock client owner {} ({})",
                    owner.ident,
                    owner.wire()
                ))
            } else if let OwnerFate::Killed { .. } = owner.fate() {
                match shared.fences().dead(&death.owner) {
                    Some(dead) => super::fences::check_against(death, told, dead),
                    None => Err(format!(
                        "{} was killed but its client never found it dead",
                        owner.ident
                    )),
                }
            } else {
                Err(format!(
                    "{} never died ({}); it ended after freeing its locks",
                    owner.ident,
                    owner.describe()
                ))
            }
        } else {
            Err(
                "no owner the harness killed or let die (a config client's owner frees \
                 its lock before it ends)"
                    .to_owned(),
            )
        };
        if let Err(message) = explained {
            shared.violation(format!(
                "{} was told that {} died holding {} with token {} (first seen at {} µs), \
                 but {message}",
                told.told_to, death.owner, death.lock, death.token, told.first_seen_us
            ));
        }
    }
}

/// Every final status is explained.
fn check_outcomes(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    let killed = shared
        .runners_killed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let jobs = shared.jobs().clone();
    for (id, row) in rows {
        let status = row[1].as_str().unwrap_or_default();
        let results = row[4].as_array().cloned().unwrap_or_default();
        let ops = row[2].as_array().cloned().unwrap_or_default();
        // Each error message with the opcode it is the result of.
        let messages: Vec<(String, &Value)> = results
            .iter()
            .zip(&ops)
            .filter_map(|(result, op)| result[1][0].as_str().map(|text| (text.to_owned(), op)))
            .collect();
        // Its death, and the deaths it may not retry, are its own doing.
        let kills_its_runner = ops.iter().any(|op| program_kind(op) == Some(RUNNER_KILLER));
        let not_started = results
            .iter()
            .any(|result| result.as_str().is_some_and(is_not_started_by));
        let job = jobs.get(id);
        let depends = job.map(|job| job.depends.clone()).unwrap_or_default();
        let cancel_asked = job.is_some_and(|job| job.cancel_asked);
        let board = job.and_then(|job| job.workers);
        let kill_asked = job.is_some_and(|job| job.kill_asked);
        let dependency_canceled = depends.iter().any(|dependency| {
            rows.get(dependency).and_then(|row| row[1].as_str()) == Some("canceled")
        });
        if job.is_some_and(|job| job.dequeued) && status != "canceled" {
            shared.violation(format!(
                "job {id} was dequeued by CancelJob but ended '{status}'"
            ));
        }
        for dependency in &depends {
            // A dependant starts only once its dependency ended.
            let (Some(started), Some(ended)) = (
                timestamp_us(&row[5]),
                rows.get(dependency).and_then(|row| timestamp_us(&row[6])),
            ) else {
                continue;
            };
            if started < ended {
                shared.violation(format!(
                    "job {id} started before job {dependency}, which it depends on, ended"
                ));
            }
        }
        match status {
            "success" => {}
            "error" => {
                for (message, op) in &messages {
                    let kind = program_kind(op);
                    let explained = if message == "Preceding opcode failed" {
                        true
                    } else if message.starts_with("lock wait timed out after ") {
                        op["lock_timeout"].is_number()
                    } else if is_program_failure(op, message) {
                        // Run past its timeout, or failing as it was made to.
                        match kind {
                            Some(SLOW | STUBBORN) => message.contains(" timed out after "),
                            Some(FLAKY | FAILING) => message.contains(" exited with code "),
                            _ => false,
                        }
                    } else if kills_its_runner && message.starts_with("detected death of job") {
                        true
                    } else if board.is_some() && message.starts_with("worker ") {
                        // Failed or taken into maintenance with `kill`
                        // by the worker client while the job held it.
                        message.contains(" failed: torture fail ")
                            || message.ends_with(" was put in MAINTENANCE")
                    } else if message.ends_with(NO_WORKER_MATCHES) {
                        // The transient board went while the job waited.
                        board == Some("c")
                    } else if board.is_some() && message.starts_with("detected death of job") {
                        // Told to end by wconfd (a board failed) and
                        // killed, then luxid was killed before it wrote the
                        // end: the reason is lost with it (RELIABILITY.md).
                        true
                    } else if message.starts_with("detected death of job") {
                        killed.contains(id) || kill_asked
                    } else if message.starts_with("Dependency job") {
                        message.contains("finished with status")
                            && depends.iter().any(|dependency| {
                                rows.get(dependency).and_then(|row| row[1].as_str())
                                    != Some("success")
                            })
                    } else {
                        false
                    };
                    if !explained {
                        shared.violation(format!(
                            "job {id} ended in error for no reason the harness caused: \
                             {message:?} (results {})",
                            Value::Array(results.clone())
                        ));
                        return;
                    }
                }
            }
            "canceled" if cancel_asked || dependency_canceled => {}
            // Its `start_by` passed (checked in `check_start_by`).
            "canceled" if not_started && ops[0]["start_by"].is_number() => {}
            other => shared.violation(format!(
                "job {id} ended '{other}' though nothing canceled it: {}",
                Value::Array(results.clone())
            )),
        }
    }
}

/// Every job `ArchiveJob` archived has its file in the archive, not in
/// the queue; no priority request is left for a job (all are final).
fn check_queue_files(shared: &Shared) {
    let queue_dir = shared.root.join(crate::paths::QUEUE_DIR);
    let archived: Vec<u64> = shared
        .jobs()
        .iter()
        .filter(|(_, job)| job.archived)
        .map(|(id, _)| *id)
        .collect();
    for id in archived {
        if queue::job_path(&queue_dir, id).exists()
            || !queue::archived_job_path(&queue_dir, id).exists()
        {
            return shared.violation(format!(
                "job {id} was archived, yet its file is not (only) in the archive"
            ));
        }
    }
    let left: Vec<String> = fs::read_dir(&queue_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.ends_with(".priority"))
        .collect();
    if !left.is_empty() {
        shared.violation(format!(
            "priority requests left behind with every job final: {left:?}"
        ));
    }
}

/// No two conflicting intervals overlap: the lock clients' and those of
/// the jobs' successful opcodes (`[exec, end]`, inside the time the runner
/// held the opcode's locks).
/// No ad-hoc rate-limit bucket ever had more jobs running than its limit,
/// by the jobs' own start and end times (within luxid's view of them as
/// running, so never more than luxid let run).
fn check_rate_limits(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    let mut edges: BTreeMap<Bucket, Vec<(u64, i64, u64)>> = BTreeMap::new();
    for (id, row) in rows {
        let (Some(start_us), Some(end_us)) = (timestamp_us(&row[5]), timestamp_us(&row[6])) else {
            continue;
        };
        let runs = runs_of(row, start_us, end_us);
        let ops = row[2].as_array().cloned().unwrap_or_default();
        let reasons: Vec<&str> = ops
            .iter()
            .filter_map(|op| op["reason"].as_array())
            .flatten()
            .filter_map(|entry| entry[1].as_str())
            .collect();
        for bucket in buckets_of(reasons) {
            let bucket_edges = edges.entry(bucket).or_default();
            // At one instant an end comes before a start.
            for &(start_us, end_us) in &runs {
                bucket_edges.push((start_us, 1, *id));
                bucket_edges.push((end_us, -1, *id));
            }
        }
    }
    for (bucket, mut bucket_edges) in edges {
        bucket_edges.sort_unstable_by_key(|&(at, step, id)| (at, step, id));
        let mut running: Vec<u64> = Vec::new();
        for (at, step, id) in bucket_edges {
            if step < 0 {
                running.retain(|&other| other != id);
                continue;
            }
            running.push(id);
            if running.len() as u64 > bucket.limit {
                return shared.violation(format!(
                    "rate-limit bucket {:?} (limit {}) had {} jobs running at {at} µs: {running:?}",
                    bucket.name,
                    bucket.limit,
                    running.len()
                ));
            }
        }
    }
}

/// The harness's rule as luxid has it after a start is what the last
/// acknowledged change made it (a rule change is durable before it is
/// acknowledged); after a change whose answer was lost, either is right.
fn check_filter_kept(shared: &Shared) {
    // Held through the query: no change comes in between.
    let changes = shared.filter.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(last) = changes.last().filter(|last| last.acked_us.is_some()) else {
        return;
    };
    let present = match luxid(shared).and_then(|mut client| {
        client
            .request(&crate::protocol::Request {
                method: "QueryFilters".to_owned(),
                args: vec![json!([FILTER_UUID]), json!(["uuid"])],
            })
            .map_err(|error| error.to_string())
    }) {
        Ok(rows) => rows.as_array().is_some_and(|rows| !rows.is_empty()),
        Err(error) => {
            return shared.violation(format!("QueryFilters after a start failed: {error}"));
        }
    };
    if present != last.present {
        shared.violation(format!(
            "after luxid started, the harness's filter rule is {} though its last \
             acknowledged change {} it",
            if present { "there" } else { "gone" },
            if last.present { "added" } else { "deleted" }
        ));
    }
}

/// Deletes the harness's rule for good (trying until luxid answers or
/// `deadline`), so that the jobs it holds can end.
fn delete_filter(shared: &Shared, deadline: Instant) {
    loop {
        if let Ok(mut client) = luxid(shared) {
            let request = crate::protocol::Request {
                method: "DeleteFilter".to_owned(),
                args: vec![json!(FILTER_UUID)],
            };
            let sent_us = now_us();
            let answer = client.request(&request);
            let done = match &answer {
                Ok(_) => true,
                Err(crate::client::ClientError::Failed { args, .. }) => args
                    .first()
                    .and_then(Value::as_str)
                    .is_some_and(|text| text.contains("does not exist")),
                Err(_) => false,
            };
            if done {
                shared
                    .filter
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(FilterChange {
                        present: false,
                        sent_us,
                        acked_us: Some(now_us()),
                    });
                return;
            }
        }
        if Instant::now() >= deadline {
            return shared
                .violation("the harness's filter rule could not be deleted at the end".to_owned());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How long after a `PAUSE` was acknowledged a held job's own start time
/// may still show: luxid chose it before the rule, and its runner wrote
/// the time later (a loaded machine, a restart of luxid in between).
const HELD_START_MARGIN_US: u64 = 2_000_000;

/// No job with the held reason started while the harness's `PAUSE` rule
/// surely existed: from its acknowledged addition (plus the margin) to the
/// sending of the next change.
fn check_held_jobs(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    let changes = shared
        .filter
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let surely_present: Vec<(u64, u64)> = changes
        .iter()
        .enumerate()
        .filter(|(_, change)| change.present)
        .filter_map(|(index, change)| {
            let from = change.acked_us? + HELD_START_MARGIN_US;
            let until = changes.get(index + 1).map_or(u64::MAX, |next| next.sent_us);
            (from < until).then_some((from, until))
        })
        .collect();
    for (id, row) in rows {
        let held = row[2]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|op| op["reason"].as_array())
            .flatten()
            .any(|entry| entry[1] == HELD_REASON);
        if !held {
            continue;
        }
        shared
            .figures
            .held_jobs_checked
            .fetch_add(1, Ordering::Relaxed);
        let Some(start_us) = timestamp_us(&row[5]) else {
            continue;
        };
        if let Some((from, until)) = surely_present
            .iter()
            .find(|(from, until)| *from <= start_us && start_us < *until)
        {
            return shared.violation(format!(
                "job {id} started at {start_us} µs while the PAUSE rule holding it surely \
                 applied ({from} to {until} µs)"
            ));
        }
    }
}

/// No two jobs with the same unique key were unfinished at once: each is
/// received only after the one before it ended.
fn check_unique_keys(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    let mut by_key: BTreeMap<String, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for (id, row) in rows {
        let Some(key) = row[2][0]["unique_key"].as_str() else {
            continue;
        };
        let (Some(received_us), Some(end_us)) = (timestamp_us(&row[9]), timestamp_us(&row[6]))
        else {
            continue;
        };
        by_key
            .entry(key.to_owned())
            .or_default()
            .push((received_us, end_us, *id));
    }
    for (key, mut jobs) in by_key {
        jobs.sort_unstable();
        shared
            .figures
            .unique_keys_checked
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        for pair in jobs.windows(2) {
            let ((_, end_us, before), (received_us, _, after)) = (pair[0], pair[1]);
            if received_us < end_us {
                return shared.violation(format!(
                    "jobs {before} and {after} with unique key {key} were both unfinished: \
                     {after} was received at {received_us} µs, before {before} ended at {end_us} µs"
                ));
            }
        }
    }
}

fn check_intervals(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    let mut intervals = shared.intervals().clone();
    let mut from_jobs = 0u64;
    for (id, row) in rows {
        let ops = row[2].as_array().cloned().unwrap_or_default();
        for (index, op) in ops.iter().enumerate() {
            if row[3][index] != "success" {
                continue;
            }
            let (Some(mut start_us), Some(end_us)) =
                (timestamp_us(&row[7][index]), timestamp_us(&row[8][index]))
            else {
                continue;
            };
            // Run again after its runner's death: `exec` is the first
            // run's, and its locks were freed in between; the last run
            // held them by its first attempt's end.
            let attempts = attempts_of(&row[10][index]).unwrap_or_default();
            if let Some(last_death) = attempts.iter().rposition(|a| is_death(&a.reason)) {
                match attempts.get(last_death + 1) {
                    Some(attempt) => start_us = attempt.at_us,
                    None => continue,
                }
            }
            let mut locks = vec![("cluster/BGL".to_owned(), Mode::Shared)];
            locks.extend(opcode_locks(op));
            for (lock, mode) in locks {
                from_jobs += 1;
                intervals.push(Interval {
                    owner: format!("job {id}"),
                    lock,
                    mode,
                    start_us,
                    end_us,
                    ended: "opcode end",
                });
            }
        }
    }
    shared
        .figures
        .intervals_checked
        .store(intervals.len() as u64, Ordering::Relaxed);
    shared
        .figures
        .job_intervals
        .store(from_jobs, Ordering::Relaxed);
    let found = history::conflicts(&intervals, CONFLICTS_REPORTED_MAX);
    for (a, b) in found {
        shared.violation(format!(
            "conflicting locks held at once: {} held {} {:?} over [{}, {}) µs (end: {}) and {} \
             held {} {:?} over [{}, {}) µs (end: {})",
            a.owner,
            a.lock,
            a.mode,
            a.start_us,
            a.end_us,
            a.ended,
            b.owner,
            b.lock,
            b.mode,
            b.start_us,
            b.end_us,
            b.ended
        ));
    }
}

/// Once every client freed its locks and every runner is gone, after a
/// death check, wconfd holds nothing for anyone.
fn check_lock_table_empty(shared: &Shared) {
    let mut client = match wconfd(shared) {
        Ok(client) => client,
        Err(error) => return shared.violation(format!("wconfd answers no more: {error}")),
    };
    let result = client
        .wconfd(&WconfdRequest::CleanupLocks)
        .and_then(|_| client.wconfd(&WconfdRequest::ListLocksWaitingStatus));
    match result {
        Ok(status) if status == json!([[], []]) => {}
        Ok(status) => shared.violation(format!(
            "locks or waiters left after every owner ended: {status}"
        )),
        Err(error) => shared.violation(format!("listLocksWaitingStatus failed: {error}")),
    }
}

/// The job whose runner a livelock file is of (`job_<id>_<stamp>`).
fn job_of_livelock(name: &str) -> Option<u64> {
    name.strip_prefix("job_")?.split('_').next()?.parse().ok()
}

/// Whether job `id`'s file (in the queue or the archive) names a
/// livelock; a job without a file counts as naming one.
fn job_named_a_livelock(shared: &Shared, id: u64) -> bool {
    let queue_dir = shared.root.join(crate::paths::QUEUE_DIR);
    [
        queue::job_path(&queue_dir, id),
        queue::archived_job_path(&queue_dir, id),
    ]
    .iter()
    .find_map(|path| queue::read_job_file(path).ok().flatten())
    .is_none_or(|job| job.livelock.is_some())
}

/// No livelock file of a dead process is left, but those the stale-age
/// rule (D12) keeps for now: files younger than the stale age that no
/// daemon had a reason to remove (a killed daemon's own; a lock owner
/// wconfd did not know for sure).
///
/// Ages are taken at `swept`, a moment before wconfd's last sweep began.
fn check_livelocks(shared: &Shared, swept: SystemTime) {
    let killed_known: BTreeMap<String, bool> = shared
        .owners_killed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(owner, known)| (owner.ident.clone(), *known))
        .collect();
    let Ok(entries) = std::fs::read_dir(&shared.livelock_dir) else {
        return shared.violation("cannot read the livelock directory".to_owned());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let daemon = name.starts_with("wconf-daemon_")
            || name.starts_with("luxi-daemon_")
            || name.starts_with("reporter_");
        if !liveness::is_dead(&path) {
            if !daemon {
                shared.violation(format!("livelock {name} is still held after the end"));
            }
            continue;
        }
        let age = entry
            .metadata()
            .and_then(|metadata| metadata.modified())
            .ok()
            .and_then(|modified| swept.duration_since(modified).ok())
            .unwrap_or_default();
        let job = job_of_livelock(&name);
        // A runner killed before it named its livelock in the job file
        // (a prepare job canceled as it started) left a file no daemon
        // can know as the job's: the stale-age sweep takes it (D12).
        let unnamed = job.is_some_and(|id| !job_named_a_livelock(shared, id));
        let allowed = age < LIVELOCK_STALE_AGE_MIN
            && (daemon || unnamed || killed_known.get(&name) == Some(&false));
        if allowed {
            shared
                .figures
                .young_livelocks
                .fetch_add(1, Ordering::Relaxed);
        } else {
            let killed = job.is_some_and(|id| {
                shared
                    .runners_killed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains(&id)
            });
            shared.violation(format!(
                "stale livelock {name} (dead, {age:?} old) was not removed{}",
                if killed {
                    " (its runner was killed)"
                } else {
                    ""
                }
            ));
        }
    }
}

/// What the harness's program of an `OP_EXEC` does (`job_clients`).
fn program_kind(op: &Value) -> Option<&str> {
    op["env"][PROGRAM_VAR].as_str()
}

/// An opcode result's reason that is its program's own ending: exit,
/// signal, timeout, or a failure to start it.
fn is_program_failure(op: &Value, reason: &str) -> bool {
    let program = op["argv"][0].as_str().unwrap_or_default();
    op["OP_ID"] == "OP_EXEC"
        && (reason.starts_with(&format!("{program} ")) || reason.starts_with("cannot start "))
}

fn is_not_started_by(result: &str) -> bool {
    result.starts_with("Job canceled: not started by ")
}

/// The reason luxid gives an attempt it counted for a runner's death.
fn is_death(reason: &str) -> bool {
    reason.starts_with("its runner ")
}

/// One `"attempt"` entry of an opcode's log.
#[derive(Debug)]
struct Attempt {
    at_us: u64,
    number: u64,
    of: u64,
    reason: String,
}

/// The attempt entries of one opcode's log, in log order.
fn attempts_of(log: &Value) -> Result<Vec<Attempt>, String> {
    let mut attempts = Vec::new();
    for entry in log.as_array().into_iter().flatten() {
        if entry[2] != crate::jobs::LOG_ATTEMPT {
            continue;
        }
        let parsed = entry[3].as_str().and_then(|text| {
            let (numbers, reason) = text.strip_prefix("Attempt ")?.split_once(": ")?;
            let (number, of) = numbers.split_once(" of ")?;
            Some(Attempt {
                at_us: timestamp_us(&entry[1])?,
                number: number.parse().ok()?,
                of: of.parse().ok()?,
                reason: reason.to_owned(),
            })
        });
        attempts.push(parsed.ok_or_else(|| format!("a malformed attempt entry {entry}"))?);
    }
    Ok(attempts)
}

/// Whether a failed attempt's ending is one `retry.on` retries: any
/// failure when null, else only a listed exit code (never a timeout or a
/// signal).
fn retry_covers(retry: &Value, details: &Value) -> bool {
    match retry["on"].as_array() {
        None => true,
        Some(codes) => details["exit_code"]
            .as_u64()
            .is_some_and(|code| codes.iter().any(|listed| listed.as_u64() == Some(code))),
    }
}

/// Whether luxid was killed between `from_us` and `until_us`.
fn luxid_killed_within(shared: &Shared, from_us: u64, until_us: u64) -> bool {
    shared
        .luxid_kills
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .any(|&at| from_us <= at && at <= until_us)
}

/// Every opcode's attempt entries (SCHEDULING.md "Retries", D59, D62):
/// - only an opcode with a `retry` has any; they are numbered 1, 2, ...
///   in log order, with no gap or repeat, each "of" `max + 1`, at most
///   that many, whether its runners or luxid (for a death) logged them;
/// - an opcode that succeeded succeeded on its last attempt; one that
///   failed by its program's own ending failed so on its last attempt,
///   after all its attempts or on an ending `retry.on` does not retry;
///   one that never ran (a preceding opcode or a dependency failed) has
///   none;
/// - a runner's death ends a job whose current opcode retries deaths only
///   once its attempts ran out (unless a cancel or kill was asked: luxid
///   does not retry those);
/// - once luxid took a cancel of the job, at most the attempt then in
///   progress ends after it and no death is counted, unless luxid was
///   killed before the job ended (the next one does not know of the
///   cancel, D62).
fn check_attempts(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    let jobs = shared.jobs().clone();
    for (id, row) in rows {
        let ops = row[2].as_array().cloned().unwrap_or_default();
        let job = jobs.get(id);
        let board = job.is_some_and(|job| job.workers.is_some());
        let cancel_asked = job.is_some_and(|job| job.cancel_asked);
        let mut all_attempts = Vec::new();
        let mut retried = false;
        for (index, op) in ops.iter().enumerate() {
            let wrong = |what: String| format!("job {id}, opcode {index}: {what}");
            let attempts = match attempts_of(&row[10][index]) {
                Ok(attempts) => attempts,
                Err(message) => return shared.violation(wrong(message)),
            };
            let retry = &op["retry"];
            if retry.is_null() {
                if !attempts.is_empty() {
                    return shared.violation(wrong(format!(
                        "attempt entries for an opcode without a retry: {attempts:?}"
                    )));
                }
                continue;
            }
            retried = true;
            let figures = &shared.figures;
            figures.retry_ops_checked.fetch_add(1, Ordering::Relaxed);
            if retry["on_death"] == true {
                figures.on_death_ops_checked.fetch_add(1, Ordering::Relaxed);
            }
            figures
                .attempts_checked
                .fetch_add(attempts.len() as u64, Ordering::Relaxed);
            let deaths = attempts.iter().filter(|a| is_death(&a.reason)).count();
            figures
                .death_attempts
                .fetch_add(deaths as u64, Ordering::Relaxed);
            let allowed = retry["max"].as_u64().unwrap_or(0) + 1;
            let numbered = attempts
                .iter()
                .enumerate()
                .all(|(at, attempt)| attempt.number == at as u64 + 1 && attempt.of == allowed);
            if !numbered || attempts.len() as u64 > allowed {
                return shared.violation(wrong(format!(
                    "attempts not numbered 1 to at most {allowed} in order: {attempts:?}"
                )));
            }
            let program = op["argv"][0].as_str().unwrap_or_default();
            let last = attempts.last().map(|attempt| attempt.reason.as_str());
            let result = &row[4][index];
            let reason = result[1][0].as_str().unwrap_or_default();
            match row[3][index].as_str().unwrap_or_default() {
                "success" => {
                    if last != Some(format!("{program} exited with code 0").as_str()) {
                        return shared.violation(wrong(format!(
                            "succeeded, yet its last attempt did not: {attempts:?}"
                        )));
                    }
                    if attempts.len() > 1 {
                        figures.retried_to_success.fetch_add(1, Ordering::Relaxed);
                    }
                }
                "error" if is_program_failure(op, reason) => {
                    let details = &result[1][1];
                    if last != Some(reason) {
                        return shared.violation(wrong(format!(
                            "failed with {reason:?}, not its last attempt's ending: {attempts:?}"
                        )));
                    }
                    if (attempts.len() as u64) < allowed && retry_covers(retry, details) {
                        return shared.violation(wrong(format!(
                            "failed with {reason:?} ({details}) after {} of {allowed} attempts, \
                             though its retry {retry} covers that ending",
                            attempts.len()
                        )));
                    }
                }
                "error" if reason.starts_with("detected death of job") => {
                    let current = (0..index).all(|before| row[3][before] == "success");
                    if retry["on_death"] == true
                        && current
                        && !board
                        && !cancel_asked
                        && (attempts.len() as u64) < allowed
                    {
                        return shared.violation(wrong(format!(
                            "its runner's death ended it with {} of {allowed} attempts made, \
                             though it retries deaths: {attempts:?}",
                            attempts.len()
                        )));
                    }
                }
                "error"
                    if (reason == "Preceding opcode failed"
                        || reason.starts_with("Dependency job"))
                        && !attempts.is_empty() =>
                {
                    return shared.violation(wrong(format!(
                        "never ran ({reason:?}), yet has attempts: {attempts:?}"
                    )));
                }
                _ => {}
            }
            all_attempts.extend(attempts);
        }
        let Some(taken_us) = job.and_then(|job| job.cancel_taken_us) else {
            continue;
        };
        let end_us = timestamp_us(&row[6]).unwrap_or(u64::MAX);
        if !retried || luxid_killed_within(shared, taken_us, end_us) {
            continue;
        }
        shared
            .figures
            .canceled_attempts_checked
            .fetch_add(1, Ordering::Relaxed);
        let after: Vec<&Attempt> = all_attempts
            .iter()
            .filter(|attempt| attempt.at_us > taken_us)
            .collect();
        if after.len() > 1 || after.iter().any(|attempt| is_death(&attempt.reason)) {
            return shared.violation(format!(
                "job {id} went on with attempts after luxid took its cancel at {taken_us} µs \
                 (and was not killed before the job ended): {after:?}"
            ));
        }
    }
}

/// An `OP_EXEC` whose program runs past its `timeout` never succeeds;
/// when it fails by its program's ending, that is the timeout's: SIGTERM
/// at least the timeout after its start, or SIGKILL at least the grace
/// after that; every attempt of it its runner logged timed out too.
fn check_exec_timeouts(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    // The durations are measured with the runner's monotonic clock and
    // printed rounded.
    const SLACK_S: f64 = 0.001;
    for (id, row) in rows {
        for (index, op) in row[2].as_array().into_iter().flatten().enumerate() {
            let kind = program_kind(op);
            if !matches!(kind, Some(SLOW | STUBBORN)) {
                continue;
            }
            let wrong = |what: String| format!("job {id}, opcode {index} ({op}): {what}");
            let status = row[3][index].as_str().unwrap_or_default();
            let result = &row[4][index];
            if status == "success" {
                return shared.violation(wrong(format!(
                    "ran past its timeout, yet succeeded: {result}"
                )));
            }
            let attempts = attempts_of(&row[10][index]).unwrap_or_default();
            if let Some(attempt) = attempts
                .iter()
                .find(|a| !is_death(&a.reason) && !a.reason.contains(" timed out after "))
            {
                return shared.violation(wrong(format!(
                    "an attempt ended other than by its timeout: {attempt:?}"
                )));
            }
            let reason = result[1][0].as_str().unwrap_or_default();
            if status != "error" || !is_program_failure(op, reason) {
                continue;
            }
            shared
                .figures
                .exec_timeouts_checked
                .fetch_add(1, Ordering::Relaxed);
            let details = &result[1][1];
            let duration = details["duration"].as_f64().unwrap_or(0.0);
            let timeout = op["timeout"].as_f64().unwrap_or(0.0);
            let grace = op["kill_grace"].as_f64().unwrap_or(0.0);
            // SIGKILL comes only after the grace; a stubborn program
            // signalled before its shell ignored SIGTERM ends on SIGTERM.
            let least = match details["signal"].as_u64() {
                Some(15) => Some(timeout),
                Some(9) => Some(timeout + grace),
                _ => None,
            };
            let timed_out =
                reason.contains(" timed out after ") && reason.ends_with(" and was killed");
            if !timed_out || least.is_none_or(|least| duration < least - SLACK_S) {
                return shared.violation(wrong(format!(
                    "did not end as its timeout ends it (SIGTERM after the timeout, or \
                     SIGKILL after the grace too): {result}"
                )));
            }
        }
    }
}

/// An opcode failed by its `lock_timeout` never ran its program, and
/// waited at least that long (from its start, which comes before its
/// first lock request); its blockers are a list.
fn check_lock_timeouts(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    // The deadline is kept on the monotonic clock, the times on the wall
    // clock, which may be slewed against it.
    const SLACK_US: u64 = 1_000;
    for (id, row) in rows {
        for (index, op) in row[2].as_array().into_iter().flatten().enumerate() {
            let result = &row[4][index];
            let reason = result[1][0].as_str().unwrap_or_default();
            if !reason.starts_with("lock wait timed out after ") {
                continue;
            }
            shared
                .figures
                .lock_timeouts_checked
                .fetch_add(1, Ordering::Relaxed);
            let wrong = |what: String| format!("job {id}, opcode {index} ({op}): {what}");
            let lock_timeout_us = (op["lock_timeout"].as_f64().unwrap_or(f64::MAX) * 1e6) as u64;
            let waited_us = timestamp_us(&row[11][index])
                .zip(timestamp_us(&row[8][index]))
                .map(|(start, end)| end.saturating_sub(start));
            if !row[7][index].is_null() {
                return shared.violation(wrong(format!(
                    "its lock wait timed out, yet it ran: {result}"
                )));
            }
            if waited_us.is_none_or(|waited| waited + SLACK_US < lock_timeout_us) {
                return shared.violation(wrong(format!(
                    "its lock wait timed out after {waited_us:?} µs, before its lock_timeout"
                )));
            }
            if !result[1][1]["blockers"].is_array() {
                return shared.violation(wrong(format!("no list of blockers: {result}")));
            }
        }
    }
}

/// How long after its `start_by` a job's own start time may still show:
/// luxid started it in time, and its runner wrote the time later (as
/// [`HELD_START_MARGIN_US`]).
const START_BY_MARGIN_US: u64 = 2_000_000;
/// How far a cancel by `start_by` may come before it by the wall clock:
/// luxid reads its deadlines on the monotonic clock (D61).
const START_BY_EARLY_US: u64 = 250_000;

/// A job canceled by its `start_by` never started (no start time, no
/// opcode run, no attempt), and was canceled only once its `start_by`
/// passed; a job that started did so by its `start_by`. A job queued
/// again after its runner's death started in time and is not canceled
/// by the deadline (D62).
fn check_start_by(shared: &Shared, rows: &BTreeMap<u64, Value>) {
    for (id, row) in rows {
        let Some(start_by) = row[2][0]["start_by"].as_f64() else {
            continue;
        };
        shared
            .figures
            .start_by_checked
            .fetch_add(1, Ordering::Relaxed);
        let start_by_us = (start_by * 1e6) as u64;
        let results = row[4].as_array().cloned().unwrap_or_default();
        let canceled = results
            .iter()
            .any(|result| result.as_str().is_some_and(is_not_started_by));
        if !canceled {
            // A start after a death luxid counted is a later run's (its
            // first runner died before writing one): the first start is
            // not known.
            let first_run = |start_us: u64| {
                (0..results.len()).all(|index| {
                    attempts_of(&row[10][index])
                        .unwrap_or_default()
                        .iter()
                        .all(|a| !is_death(&a.reason) || a.at_us > start_us)
                })
            };
            if let Some(start_us) = timestamp_us(&row[5])
                && start_us > start_by_us + START_BY_MARGIN_US
                && first_run(start_us)
            {
                return shared.violation(format!(
                    "job {id} started at {start_us} µs, after its start_by {start_by} \
                     (and the margin)"
                ));
            }
            continue;
        }
        shared
            .figures
            .start_by_canceled
            .fetch_add(1, Ordering::Relaxed);
        let ran = !row[5].is_null()
            || (0..results.len()).any(|index| {
                !row[11][index].is_null()
                    || !row[7][index].is_null()
                    || row[3][index] != "canceled"
                    || attempts_of(&row[10][index]).map_or(true, |a| !a.is_empty())
            });
        if ran {
            return shared.violation(format!(
                "job {id} was canceled as not started by {start_by}, yet it started: \
                 start {}, opcodes {} started {} ran {}",
                row[5], row[3], row[11], row[7]
            ));
        }
        if timestamp_us(&row[6]).is_none_or(|end_us| end_us + START_BY_EARLY_US < start_by_us) {
            return shared.violation(format!(
                "job {id} was canceled at {} before its start_by {start_by}",
                row[6]
            ));
        }
    }
}

/// The times a job ran, each within luxid's view of it as running: from
/// `start_us` (its start as its first runner to write one wrote it) to
/// `end_us`, but for a job queued again after its runner's death
/// (`on_death`) the run that wrote the start until the next death luxid
/// counted, and the last run from its first attempt's end (the others
/// are left out).
fn runs_of(row: &Value, start_us: u64, end_us: u64) -> Vec<(u64, u64)> {
    // Log serials grow across the opcodes: this is log order.
    let attempts: Vec<Attempt> = row[10]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|log| attempts_of(log).unwrap_or_default())
        .collect();
    let Some(last_death) = attempts.iter().rposition(|a| is_death(&a.reason)) else {
        return vec![(start_us, end_us)];
    };
    let mut runs = Vec::new();
    // A death is counted after all its run wrote.
    let death_after_start = attempts
        .iter()
        .find(|a| is_death(&a.reason) && a.at_us > start_us);
    match death_after_start {
        Some(death) => runs.push((start_us, death.at_us)),
        None => return vec![(start_us, end_us)],
    }
    if let Some(attempt) = attempts.get(last_death + 1) {
        runs.push((attempt.at_us, end_us));
    }
    runs
}
