//! Workers in the crash harness (WORKERS.md): a worker client thread
//! that registers a small board farm on wconfd and churns it (fails
//! boards, takes them into maintenance, with and without `kill`, lets
//! them in again, changes groups, registers and deregisters a transient
//! board), while the job clients submit jobs asking for boards and the
//! chaos kills everything.
//!
//! What the programs saw is the evidence. A holder job's program appends
//! `start <µs> <WARDEN_WORKERS>` to its own record file when it begins and
//! `end <µs>` when it is done; a prepare program appends `start` and
//! `end` the same way. A killed program has no `end`: its job's end
//! stamp stands in (luxid ends a job whose runner died only once its
//! livelock is free, that is once every process of the job is gone, and
//! releases the workers after that). Each record is therefore inside the
//! time wconfd had the worker allocated to the job, and the checks are:
//! - no worker is held by two jobs at once ([`overlaps`]);
//! - between two holders of a worker with a `prepare`, a prepare of that
//!   worker ran to its end ([`unprepared_handovers`]);
//! - what wconfd acknowledged to the client stands after every start of
//!   wconfd and at the end: registrations, deregistrations, the state a
//!   `setWorkerFail` or maintenance call left, groups ([`FarmModel`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{Client, ClientError, Daemon};
use crate::protocol::wconfd::WconfdRequest;
use crate::workers::{Filter, Page, Sort};

use super::rng::Rng;
use super::{Connection, Shared};

/// Where the programs' records go, under the root.
pub const RECORDS_DIR: &str = "worker-records";
/// While this file exists (under the records directory), the flaky
/// board's prepare fails about one time in three.
const FLAKY_FILE: &str = "flaky";

/// A board of the farm: uuid, `board` cap, and how it is prepared.
struct Board {
    uuid: &'static str,
    kind: &'static str,
    prepare: Prepare,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Prepare {
    None,
    Succeeds,
    /// Fails now and then while the chaos runs.
    Flaky,
}

/// The boards always registered (never deregistered).
const FARM: [Board; 4] = [
    Board {
        uuid: "w0",
        kind: "a",
        prepare: Prepare::Succeeds,
    },
    Board {
        uuid: "w1",
        kind: "a",
        prepare: Prepare::Flaky,
    },
    Board {
        uuid: "w2",
        kind: "b",
        prepare: Prepare::Succeeds,
    },
    Board {
        uuid: "w3",
        kind: "b",
        prepare: Prepare::None,
    },
];
/// The board registered and deregistered as the client goes; the only
/// one of kind `c`, so jobs asking for it may be refused at submit or end
/// `error` when it goes.
const TRANSIENT: Board = Board {
    uuid: "wx",
    kind: "c",
    prepare: Prepare::None,
};
/// The group of every board (jobs asking by group ask for it).
pub const GROUP: &str = "farm";

/// What a job of the job clients asks for, and its first opcode.
pub fn worker_job(rng: &mut Rng, records: &Path) -> (Value, &'static str) {
    let (request, kind) = match rng.below(10) {
        0..=3 => (json!({"caps": {"board": "a"}}), "a"),
        4..=6 => (json!({"caps": {"board": "b"}}), "b"),
        7..=8 => (json!({"groups": [GROUP], "count": 2}), "any two"),
        _ => (json!({"caps": {"board": "c"}}), "c"),
    };
    let sleep = format!("0.0{}", rng.between(1, 6));
    let script = "f=\"$0/hold.$WARDEN_JOB_ID.$$\"; \
                  printf 'start %s %s\\n' \"$(date +%s%6N)\" \"$WARDEN_WORKERS\" >> \"$f\"; \
                  sleep \"$1\"; printf 'end %s\\n' \"$(date +%s%6N)\" >> \"$f\"";
    let op = json!({
        "OP_ID": "OP_EXEC",
        "argv": ["/bin/sh", "-c", script, records.to_string_lossy(), sleep],
        "workers": request,
    });
    (op, kind)
}

/// A board's `prepare` argv.
fn prepare_argv(board: &Board, records: &Path) -> Option<Vec<String>> {
    let fails = match board.prepare {
        Prepare::None => return None,
        Prepare::Succeeds => "",
        Prepare::Flaky => {
            "if [ -e \"$0/flaky\" ]; then case $(date +%N) in *[0-2]) \
             echo 'flashing failed' >&2; exit 1;; esac; fi; "
        }
    };
    let script = format!(
        "f=\"$0/prepare.$WARDEN_WORKER_UUID.$$\"; \
         printf 'start %s\\n' \"$(date +%s%6N)\" >> \"$f\"; sleep 0.02; {fails}\
         printf 'end %s\\n' \"$(date +%s%6N)\" >> \"$f\""
    );
    Some(vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        script,
        records.to_string_lossy().into_owned(),
    ])
}

fn register_request(board: &Board, records: &Path) -> WconfdRequest {
    WconfdRequest::RegisterWorker {
        caps: [
            ("UUID".to_owned(), board.uuid.to_owned()),
            ("board".to_owned(), board.kind.to_owned()),
        ]
        .into(),
        groups: Some([GROUP.to_owned()].into()),
        address: Some(format!("{}.farm:5555", board.uuid)),
        prepare: prepare_argv(board, records),
    }
}

// ----- what the client was acknowledged -----

/// What the last acknowledged call says a board's state must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Not registered (never, or deregistered).
    Absent,
    /// Registered new, or a maintenance call: MAINTENANCE, or BUSY while
    /// a holder runs.
    Maintenance,
    /// `setWorkerFail`: FAILED until the client says otherwise.
    Failed,
    /// Let in (`setWorkerState(IDLE)` from MAINTENANCE, or registered
    /// again while FAILED): PREPARE, IDLE, RUNNING, or FAILED by a failed
    /// prepare.
    InService,
}

/// A board as the client knows it.
#[derive(Clone, Debug)]
pub struct BoardModel {
    pub expected: Expected,
    pub groups: Vec<String>,
    /// An answer was lost since the last call that decides the state.
    pub unsure: bool,
    /// ... since the last call that decides the groups (a groups change
    /// does not decide the state, nor a state change the groups).
    pub groups_unsure: bool,
}

/// The farm as wconfd acknowledged it to the client.
#[derive(Debug, Default)]
pub struct FarmModel {
    pub boards: BTreeMap<&'static str, BoardModel>,
}

impl FarmModel {
    /// Checks a `listWorkers` answer against what was acknowledged; an
    /// error says what differs.
    pub fn check(&self, listing: &Value) -> Result<(), String> {
        let listed: BTreeMap<&str, &Value> = listing["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|worker| Some((worker["uuid"].as_str()?, worker)))
            .collect();
        for (uuid, model) in &self.boards {
            let worker = listed.get(uuid);
            if !model.groups_unsure
                && let Some(worker) = worker
            {
                let groups: Vec<String> = worker["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|group| group.as_str().map(str::to_owned))
                    .collect();
                if groups != model.groups {
                    return Err(format!(
                        "worker {uuid} has groups {groups:?} but {:?} was acknowledged",
                        model.groups
                    ));
                }
            }
            if model.unsure {
                continue;
            }
            let state = worker.and_then(|worker| worker["state"].as_str());
            let fits = match model.expected {
                Expected::Absent => worker.is_none(),
                Expected::Maintenance => matches!(state, Some("MAINTENANCE" | "BUSY")),
                Expected::Failed => state == Some("FAILED"),
                Expected::InService => match state {
                    Some("PREPARE" | "IDLE" | "RUNNING") => true,
                    Some("FAILED") => worker
                        .and_then(|worker| worker["fail_reason"].as_str())
                        .is_some_and(|reason| reason.starts_with("prepare failed")),
                    _ => false,
                },
            };
            if !fits {
                return Err(format!(
                    "worker {uuid} is {} but the client was acknowledged {:?}",
                    worker.map_or("not registered".to_owned(), |worker| worker.to_string()),
                    model.expected
                ));
            }
        }
        Ok(())
    }
}

// ----- the programs' records -----

/// One program's run on a worker, `[start_us, end_us]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub start_us: u64,
    /// None: the program was killed before its end.
    pub end_us: Option<u64>,
}

/// A holder job's program run, with the uuids it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub job: u64,
    pub uuids: Vec<String>,
    pub run: Run,
}

/// Reads a record file: each `start` line begins a run (the rest of the
/// line returned with it), the `end` after it ends that run. A file holds
/// several runs when a pid came round again (the files are named by pid).
fn read_runs(text: &str) -> Vec<(Run, String)> {
    let mut runs: Vec<(Run, String)> = Vec::new();
    for line in text.lines() {
        let mut words = line.splitn(3, ' ');
        match (words.next(), words.next().and_then(|at| at.parse().ok())) {
            (Some("start"), Some(at)) => runs.push((
                Run {
                    start_us: at,
                    end_us: None,
                },
                words.next().unwrap_or_default().to_owned(),
            )),
            (Some("end"), Some(at)) => {
                if let Some((run, _)) = runs.last_mut() {
                    run.end_us = Some(at);
                }
            }
            _ => {}
        }
    }
    runs
}

/// Every holder run and every prepare run (by uuid) recorded under
/// `dir`.
pub fn read_records(dir: &Path) -> (Vec<Hold>, BTreeMap<String, Vec<Run>>) {
    let mut holds = Vec::new();
    let mut prepares: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let parts: Vec<&str> = name.split('.').collect();
        for (run, rest) in read_runs(&text) {
            match parts.as_slice() {
                ["hold", job, _pid] => {
                    let Ok(job) = job.parse() else { continue };
                    let workers: Value = serde_json::from_str(&rest).unwrap_or(Value::Null);
                    let uuids = workers
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|worker| worker["uuid"].as_str().map(str::to_owned))
                        .collect();
                    holds.push(Hold { job, uuids, run });
                }
                ["prepare", uuid, _pid] => {
                    prepares.entry((*uuid).to_owned()).or_default().push(run)
                }
                _ => {}
            }
        }
    }
    (holds, prepares)
}

/// Each worker's holds as `(start µs, end µs, job)`, by start.
type HoldsByWorker = BTreeMap<String, Vec<(u64, u64, u64)>>;

/// A holder's interval on one worker: its run, a killed one ending at
/// its job's end (`ends`: job -> end µs).
fn hold_intervals(holds: &[Hold], ends: &BTreeMap<u64, u64>) -> Result<HoldsByWorker, String> {
    let mut by_worker = HoldsByWorker::new();
    for hold in holds {
        let end_us = match hold.run.end_us {
            Some(end_us) => end_us,
            None => *ends.get(&hold.job).ok_or_else(|| {
                format!(
                    "job {}'s program on {:?} was killed, yet the job has no end",
                    hold.job, hold.uuids
                )
            })?,
        };
        if hold.uuids.is_empty() {
            return Err(format!("job {}'s program was given no workers", hold.job));
        }
        for uuid in &hold.uuids {
            by_worker
                .entry(uuid.clone())
                .or_default()
                .push((hold.run.start_us, end_us, hold.job));
        }
    }
    for intervals in by_worker.values_mut() {
        intervals.sort_unstable();
    }
    Ok(by_worker)
}

/// Pairs of jobs whose programs held one worker at the same time.
pub fn overlaps(holds: &[Hold], ends: &BTreeMap<u64, u64>) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    for (uuid, intervals) in hold_intervals(holds, ends)? {
        for pair in intervals.windows(2) {
            let ((a_start, a_end, a_job), (b_start, b_end, b_job)) = (pair[0], pair[1]);
            if a_job != b_job && b_start < a_end {
                found.push(format!(
                    "worker {uuid} was held by job {a_job} over [{a_start}, {a_end}] µs and \
                     by job {b_job} over [{b_start}, {b_end}] µs"
                ));
            }
        }
    }
    Ok(found)
}

/// Handovers of a worker with a `prepare` (in `prepared`) from one job
/// to the next without a prepare of it run to its end in between.
pub fn unprepared_handovers(
    holds: &[Hold],
    ends: &BTreeMap<u64, u64>,
    prepares: &BTreeMap<String, Vec<Run>>,
    prepared: &[&str],
) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    for (uuid, intervals) in hold_intervals(holds, ends)? {
        if !prepared.contains(&uuid.as_str()) {
            continue;
        }
        let runs = prepares.get(&uuid).map(Vec::as_slice).unwrap_or_default();
        for pair in intervals.windows(2) {
            let ((_, a_end, a_job), (b_start, _, b_job)) = (pair[0], pair[1]);
            let between = runs.iter().any(|run| {
                run.start_us >= a_end && run.end_us.is_some_and(|end_us| end_us <= b_start)
            });
            if !between {
                found.push(format!(
                    "worker {uuid} went from job {a_job} (done at {a_end} µs) to job {b_job} \
                     (at {b_start} µs) without a prepare in between"
                ));
            }
        }
    }
    Ok(found)
}

// ----- the client -----

/// The client's thread: churn the farm until told to stop, then let every
/// board in again so that every waiting job can end.
pub fn run(shared: &Shared) {
    let records = shared.root.join(RECORDS_DIR);
    let mut client = WorkerClient {
        shared,
        records,
        rng: Rng::stream(shared.seed, 4000),
        connection: Connection::new(Daemon::Wconfd),
        fails: 0,
    };
    client.register_farm();
    while !shared.stopping() {
        std::thread::sleep(Duration::from_millis(client.rng.between(20, 120)));
        client.step();
    }
    client.settle();
}

struct WorkerClient<'a> {
    shared: &'a Shared,
    records: PathBuf,
    rng: Rng,
    connection: Connection,
    fails: u64,
}

/// How a call ended.
enum Called {
    Answer(Value),
    /// Refused, with the refusal's text.
    Refused(String),
    /// The connection (and the answer) was lost.
    Lost,
}

impl WorkerClient<'_> {
    fn farm(&self) -> MutexGuard<'_, FarmModel> {
        self.shared
            .farm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn call(&mut self, request: &WconfdRequest) -> Called {
        let Some(client) = self.connection.get(self.shared) else {
            return Called::Lost;
        };
        match client.wconfd(request) {
            Ok(answer) => Called::Answer(answer),
            Err(ClientError::Failed { args, .. }) => {
                let text = args
                    .iter()
                    .map(|arg| arg.as_str().map_or(arg.to_string(), str::to_owned))
                    .collect::<Vec<String>>()
                    .join(" ");
                Called::Refused(text)
            }
            Err(_) => {
                self.connection.lose();
                Called::Lost
            }
        }
    }

    /// A state-changing call for `uuid` with the gate held: the model
    /// becomes `then` if acknowledged, unsure if the answer is lost; a
    /// refusal is checked by `refusal_ok` (given the model before).
    fn change(
        &mut self,
        uuid: &'static str,
        request: WconfdRequest,
        then: impl FnOnce(&mut BoardModel),
        refusal_ok: impl FnOnce(&BoardModel, &str) -> bool,
    ) -> bool {
        let shared = self.shared;
        let _gate = shared.gate.read().unwrap_or_else(PoisonError::into_inner);
        // A registration decides both.
        let (state, groups) = match &request {
            WconfdRequest::SetWorkerGroups { .. } => (false, true),
            WconfdRequest::RegisterWorker { .. } => (true, true),
            _ => (true, false),
        };
        let called = self.call(&request);
        let mut farm = self.farm();
        let model = farm.boards.get_mut(uuid).expect("a board of the farm");
        match called {
            Called::Answer(_) => {
                then(model);
                model.unsure &= !state;
                model.groups_unsure &= !groups;
                shared
                    .figures
                    .worker_changes
                    .fetch_add(1, Ordering::Relaxed);
                true
            }
            Called::Refused(text) => {
                if !model.unsure && !refusal_ok(model, &text) {
                    shared.violation(format!(
                        "wconfd refused the worker client's {} of {uuid} ({:?} acknowledged): \
                         {text}",
                        request.method(),
                        model.expected
                    ));
                }
                false
            }
            Called::Lost => {
                model.unsure |= state;
                model.groups_unsure |= groups;
                shared
                    .figures
                    .worker_answers_lost
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Registers the farm until acknowledged, and lets every board in.
    fn register_farm(&mut self) {
        // Without the records the holds check would have nothing to see.
        if let Err(error) = std::fs::create_dir_all(&self.records)
            .and_then(|()| std::fs::write(self.records.join(FLAKY_FILE), b""))
        {
            return self
                .shared
                .violation(format!("cannot make {}: {error}", self.records.display()));
        }
        {
            let mut farm = self.farm();
            for board in FARM.iter().chain([&TRANSIENT]) {
                farm.boards.insert(
                    board.uuid,
                    BoardModel {
                        expected: Expected::Absent,
                        groups: vec![GROUP.to_owned()],
                        unsure: false,
                        groups_unsure: false,
                    },
                );
            }
        }
        for board in &FARM {
            let records = self.records.clone();
            while !self.shared.stopping() {
                let request = register_request(board, &records);
                // Registered again unchanged, a board keeps its state.
                let first = self.farm().boards[board.uuid].expected == Expected::Absent;
                if self.change(
                    board.uuid,
                    request,
                    |model| {
                        if first {
                            model.expected = Expected::Maintenance;
                        }
                        model.groups = vec![GROUP.to_owned()];
                    },
                    |_, _| false,
                ) {
                    break;
                }
            }
            self.let_in(board.uuid);
        }
        // Jobs may ask for boards from now on.
        self.shared.farm_ready.store(true, Ordering::SeqCst);
    }

    /// `setWorkerState(IDLE)` until acknowledged (it is refused unless the
    /// board is in MAINTENANCE or PREPARE).
    fn let_in(&mut self, uuid: &'static str) {
        while !self.shared.stopping() {
            let request = WconfdRequest::SetWorkerState {
                uuid: uuid.to_owned(),
                state: "IDLE".to_owned(),
                kill: false,
            };
            if self.change(
                uuid,
                request,
                |model| model.expected = Expected::InService,
                |_, _| true,
            ) {
                return;
            }
        }
    }

    /// The board's state now, from `getWorkerInfo` (None: not known).
    fn state_of(&mut self, uuid: &str) -> Option<String> {
        match self.call(&WconfdRequest::GetWorkerInfo {
            uuid: uuid.to_owned(),
        }) {
            Called::Answer(worker) => worker["state"].as_str().map(str::to_owned),
            Called::Refused(text) if text.contains("Worker not found") => Some("ABSENT".to_owned()),
            _ => None,
        }
    }

    /// One random action on the farm.
    fn step(&mut self) {
        if self.rng.percent(12) {
            return self.churn_transient();
        }
        let board = self.rng.pick(&FARM);
        let uuid = board.uuid;
        match self.rng.below(100) {
            0..=24 => {
                self.fails += 1;
                let reason = format!("torture fail {}", self.fails);
                let request = WconfdRequest::SetWorkerFail {
                    uuid: uuid.to_owned(),
                    reason,
                };
                let failed = self.change(
                    uuid,
                    request,
                    |model| model.expected = Expected::Failed,
                    |model, text| {
                        model.expected == Expected::Maintenance
                            && text.contains("forbidden to set FAIL state")
                    },
                );
                // Back at once, half the time: the killed holder may still
                // run when the board is let in again (D51).
                if failed && self.rng.percent(50) {
                    self.take_out(uuid);
                    self.let_in(uuid);
                }
            }
            25..=44 => {
                let kill = self.rng.percent(40);
                let request = WconfdRequest::SetWorkerState {
                    uuid: uuid.to_owned(),
                    state: "MAINTENANCE".to_owned(),
                    kill,
                };
                self.change(
                    uuid,
                    request,
                    |model| model.expected = Expected::Maintenance,
                    |_, _| false,
                );
            }
            45..=89 => self.bring_back(board),
            _ => {
                let mut groups = vec![GROUP.to_owned()];
                if self.rng.percent(50) {
                    groups.push("lab".to_owned());
                }
                groups.sort();
                let request = WconfdRequest::SetWorkerGroups {
                    uuid: uuid.to_owned(),
                    groups: groups.iter().cloned().collect(),
                };
                self.change(uuid, request, |model| model.groups = groups, |_, _| false);
            }
        }
    }

    /// Lets a board out of MAINTENANCE or FAILED again, as its state now
    /// asks.
    fn bring_back(&mut self, board: &Board) {
        let uuid = board.uuid;
        match self.state_of(uuid).as_deref() {
            Some("MAINTENANCE") => self.let_in(uuid),
            Some("FAILED") if self.rng.percent(50) => self.register_again(board),
            Some("FAILED") => {
                self.take_out(uuid);
            }
            _ => {}
        }
    }

    fn take_out(&mut self, uuid: &'static str) -> bool {
        let request = WconfdRequest::SetWorkerState {
            uuid: uuid.to_owned(),
            state: "MAINTENANCE".to_owned(),
            kill: false,
        };
        self.change(
            uuid,
            request,
            |model| model.expected = Expected::Maintenance,
            |_, _| false,
        )
    }

    /// Registers the transient board and lets it in, or takes it out and
    /// deregisters it.
    fn churn_transient(&mut self) {
        let uuid = TRANSIENT.uuid;
        let expected = self.farm().boards[uuid].expected;
        if expected == Expected::Absent {
            let request = register_request(&TRANSIENT, &self.records);
            if self.change(
                uuid,
                request,
                |model| model.expected = Expected::Maintenance,
                |_, _| false,
            ) {
                self.let_in(uuid);
            }
            return;
        }
        let request = WconfdRequest::SetWorkerState {
            uuid: uuid.to_owned(),
            state: "MAINTENANCE".to_owned(),
            kill: self.rng.percent(50),
        };
        if !self.change(
            uuid,
            request,
            |model| model.expected = Expected::Maintenance,
            |_, _| false,
        ) {
            return;
        }
        // Still BUSY while its holder runs: refused then.
        let request = WconfdRequest::DeregisterWorker {
            uuid: uuid.to_owned(),
        };
        self.change(
            uuid,
            request,
            |model| model.expected = Expected::Absent,
            |_, text| text.contains("not in FAIL or MAINTENANCE"),
        );
    }

    /// Once the chaos ended: prepares stop failing, and every board is let
    /// in again (a BUSY one once its holder ended) so that every job
    /// waiting for one can run.
    fn settle(&mut self) {
        let _ = std::fs::remove_file(self.records.join(FLAKY_FILE));
        let deadline = Instant::now() + Duration::from_secs(30);
        let boards: Vec<&Board> = FARM.iter().chain([&TRANSIENT]).collect();
        loop {
            let mut settled = true;
            for board in &boards {
                let state = self.state_of(board.uuid);
                match state.as_deref() {
                    Some("PREPARE" | "IDLE" | "RUNNING" | "ABSENT") => {}
                    Some("MAINTENANCE") => {
                        settled = false;
                        self.let_in_once(board.uuid);
                    }
                    Some("FAILED") => {
                        settled = false;
                        self.register_again(board);
                    }
                    _ => settled = false,
                }
            }
            if settled {
                return;
            }
            if Instant::now() >= deadline {
                let mut states = String::new();
                for board in &boards {
                    let _ = write!(states, " {}={:?}", board.uuid, self.state_of(board.uuid));
                }
                return self.shared.violation(format!(
                    "the farm did not come back into service after the chaos:{states}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A FAILED board registered again unchanged: prepared, back in
    /// service; its groups are the registration's again.
    fn register_again(&mut self, board: &Board) {
        let request = register_request(board, &self.records);
        self.change(
            board.uuid,
            request,
            |model| {
                model.expected = Expected::InService;
                model.groups = vec![GROUP.to_owned()];
            },
            |_, _| false,
        );
    }

    fn let_in_once(&mut self, uuid: &'static str) {
        let request = WconfdRequest::SetWorkerState {
            uuid: uuid.to_owned(),
            state: "IDLE".to_owned(),
            kill: false,
        };
        self.change(
            uuid,
            request,
            |model| model.expected = Expected::InService,
            |_, _| true,
        );
    }
}

/// The farm's listing, for the checks.
pub fn list_farm(client: &mut Client) -> Result<Value, ClientError> {
    client.wconfd(&WconfdRequest::ListWorkers {
        filter: Filter::default(),
        sort: Sort::default(),
        page: Page::default(),
    })
}

/// The boards whose handovers must pass through a prepare.
pub fn prepared_boards() -> Vec<&'static str> {
    FARM.iter()
        .filter(|board| board.prepare != Prepare::None)
        .map(|board| board.uuid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(job: u64, uuids: &[&str], start_us: u64, end_us: Option<u64>) -> Hold {
        Hold {
            job,
            uuids: uuids.iter().map(|uuid| uuid.to_string()).collect(),
            run: Run { start_us, end_us },
        }
    }

    #[test]
    fn records_are_read_with_their_workers() {
        let (run, rest) = read_runs("start 10 [{\"uuid\":\"w0\"}]\nend 20\n")
            .pop()
            .expect("has a start");
        assert_eq!(
            run,
            Run {
                start_us: 10,
                end_us: Some(20)
            }
        );
        assert_eq!(rest, "[{\"uuid\":\"w0\"}]");
        assert_eq!(read_runs("end 20\n"), []);
        let (killed, _) = read_runs("start 10\n").pop().expect("has a start");
        assert_eq!(killed.end_us, None);
        // A pid that came round again: two runs in one file, each kept.
        let runs: Vec<Run> = read_runs("start 10\nend 20\nstart 500\nend 520\n")
            .into_iter()
            .map(|(run, _)| run)
            .collect();
        assert_eq!(
            runs,
            [
                Run {
                    start_us: 10,
                    end_us: Some(20)
                },
                Run {
                    start_us: 500,
                    end_us: Some(520)
                }
            ]
        );
    }

    #[test]
    fn two_jobs_on_one_worker_at_once_are_found_killed_ones_up_to_their_job_s_end() {
        let ends: BTreeMap<u64, u64> = [(1, 50), (2, 90), (3, 200)].into();
        let holds = vec![
            hold(1, &["w0"], 10, None),
            hold(2, &["w0", "w1"], 60, Some(80)),
            hold(3, &["w1"], 85, Some(100)),
        ];
        assert_eq!(overlaps(&holds, &ends), Ok(vec![]));
        let late = vec![hold(1, &["w0"], 10, None), hold(2, &["w0"], 40, Some(45))];
        let found = overlaps(&late, &ends).expect("every job ended");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("job 1") && found[0].contains("job 2"));
        let no_end = vec![hold(4, &["w0"], 10, None)];
        assert!(overlaps(&no_end, &ends).is_err());
    }

    #[test]
    fn a_handover_needs_a_whole_prepare_in_between() {
        let ends = BTreeMap::new();
        let holds = vec![
            hold(1, &["w0"], 10, Some(20)),
            hold(2, &["w0"], 40, Some(50)),
        ];
        let run = |start_us, end_us| Run { start_us, end_us };
        let check = |runs: Vec<Run>| {
            let prepares: BTreeMap<String, Vec<Run>> = [("w0".to_owned(), runs)].into();
            unprepared_handovers(&holds, &ends, &prepares, &["w0"]).expect("no killed runs")
        };
        assert!(check(vec![run(22, Some(30))]).is_empty());
        assert_eq!(check(vec![]).len(), 1);
        assert_eq!(check(vec![run(22, None)]).len(), 1, "a killed prepare");
        assert_eq!(check(vec![run(15, Some(30))]).len(), 1, "begun too early");
        assert_eq!(check(vec![run(22, Some(45))]).len(), 1, "ended too late");
        let prepares = BTreeMap::new();
        let unprepared = unprepared_handovers(&holds, &ends, &prepares, &["w3"]);
        assert_eq!(unprepared, Ok(vec![]), "a board without prepare");
    }

    #[test]
    fn the_model_accepts_what_each_acknowledged_call_allows() {
        let board = |expected| BoardModel {
            expected,
            groups: vec![GROUP.to_owned()],
            unsure: false,
            groups_unsure: false,
        };
        let listing = |state: &str, reason: Value| {
            json!({"workers": [{"uuid": "w0", "state": state, "groups": [GROUP],
                                "fail_reason": reason}]})
        };
        let cases = [
            (Expected::Maintenance, "BUSY", Value::Null, true),
            (Expected::Maintenance, "IDLE", Value::Null, false),
            (Expected::Failed, "FAILED", json!("torture fail 1"), true),
            (Expected::Failed, "MAINTENANCE", Value::Null, false),
            (Expected::InService, "RUNNING", Value::Null, true),
            (
                Expected::InService,
                "FAILED",
                json!("prepare failed: flashing failed"),
                true,
            ),
            (
                Expected::InService,
                "FAILED",
                json!("torture fail 2"),
                false,
            ),
            (Expected::Absent, "IDLE", Value::Null, false),
        ];
        for (expected, state, reason, fits) in cases {
            let model = FarmModel {
                boards: [("w0", board(expected))].into(),
            };
            let checked = model.check(&listing(state, reason.clone()));
            assert_eq!(checked.is_ok(), fits, "{expected:?} {state} {reason}");
        }
        let absent = FarmModel {
            boards: [("w0", board(Expected::Absent))].into(),
        };
        assert!(absent.check(&json!({"workers": []})).is_ok());
        let mut other_groups = board(Expected::InService);
        other_groups.groups.push("lab".to_owned());
        let model = FarmModel {
            boards: [("w0", other_groups)].into(),
        };
        assert!(model.check(&listing("IDLE", Value::Null)).is_err());
    }
}
