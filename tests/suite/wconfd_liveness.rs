//! wconfd and living processes: waiters notified by SIGHUP (and not when
//! `awaitLocks` delivers the grant), owners killed with SIGKILL freed at
//! once, POSIX-locked livelocks, the lock state across a clean stop and a
//! kill -9 (with the journal written with direct I/O, and on a file system
//! without it), owners that died while wconfd was down, one wconfd per
//! root, and a crash loop of kills and restarts under client load.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::daemon::{
    Client, DEADLINE, OwnerProcess, Root, Wconfd, elapsed_between, list_locks, pending, request,
    status, timing_guard, try_update, update_waiting, wait_until,
};

/// The SIGKILL-to-grant target of LIVENESS.md "Targets".
const DEATH_TO_GRANT_MAX: Duration = Duration::from_millis(50);

fn spawn(wconfd: &Wconfd, ids: std::ops::RangeInclusive<u64>) -> Vec<OwnerProcess> {
    ids.map(|id| OwnerProcess::spawn(&wconfd.livelock_dir(), id))
        .collect()
}

// ----- waiting and notification -----

#[test]
fn a_waiter_is_notified_by_sighup_after_its_grant() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=2);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("instance/a", "exclusive")]),
        json!([])
    );
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("instance/a", "exclusive")]),
        json!([jobs[0].owner()])
    );
    assert_eq!(jobs[1].hups(), 0, "no signal while it waits");

    assert_eq!(client.ok("freeLocks", json!([jobs[0].owner()])), json!([]));
    jobs[1].wait_for_hups(1, DEADLINE);
    // The signal came after the grant: the state already shows it.
    let mut other = wconfd.client();
    assert!(!pending(&mut other, &jobs[1]));
    assert_eq!(
        list_locks(&mut other, &jobs[1]),
        request(&[("instance/a", "exclusive")])
    );
    assert_eq!(jobs[1].hups(), 1, "exactly one signal");
    assert_eq!(jobs[0].hups(), 0);
}

#[test]
fn a_grant_delivered_by_await_locks_sends_no_sighup() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=2);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("node/n1", "exclusive")]),
        json!([])
    );
    let mut waiter = wconfd.client();
    waiter
        .send(
            "awaitLocks",
            json!([
                jobs[1].owner(),
                0,
                request(&[("node/n1", "shared")]),
                10_000
            ]),
        )
        .expect("send");
    wait_until("J2 waits", DEADLINE, || pending(&mut client, &jobs[1]));
    assert_eq!(client.ok("freeLocks", json!([jobs[0].owner()])), json!([]));
    assert_eq!(waiter.read_response().expect("answer"), Ok(json!([])));
    // Every signal wconfd sent before answering has been handled by now.
    assert_eq!(jobs[1].hups(), 0);
}

#[test]
fn an_await_whose_connection_closed_is_notified_by_sighup() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=2);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("node/n1", "exclusive")]),
        json!([])
    );
    let mut waiter = wconfd.client();
    waiter
        .send(
            "awaitLocks",
            json!([
                jobs[1].owner(),
                0,
                request(&[("node/n1", "exclusive")]),
                10_000
            ]),
        )
        .expect("send");
    wait_until("J2 waits", DEADLINE, || pending(&mut client, &jobs[1]));
    let descriptors = wconfd.descriptors();
    drop(waiter);
    wait_until("wconfd closes the waiter's connection", DEADLINE, || {
        wconfd.descriptors() < descriptors
    });
    // The request stays pending without its connection.
    assert!(pending(&mut client, &jobs[1]));
    assert_eq!(client.ok("freeLocks", json!([jobs[0].owner()])), json!([]));
    jobs[1].wait_for_hups(1, DEADLINE);
    assert_eq!(
        list_locks(&mut client, &jobs[1]),
        request(&[("node/n1", "exclusive")])
    );
    assert_eq!(jobs[1].hups(), 1);
}

#[test]
fn a_grant_read_with_the_close_of_its_await_is_notified_by_sighup() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let jobs = spawn(&wconfd, 1..=2);
    let wanted = request(&[("node/n1", "exclusive")]);
    for round in 1..=10 {
        assert_eq!(
            try_update(&mut client, &jobs[0], &[("node/n1", "exclusive")]),
            json!([])
        );
        let mut waiter = wconfd.client();
        waiter
            .send("awaitLocks", json!([jobs[1].owner(), 0, wanted, 10_000]))
            .expect("send");
        wait_until("J2 waits", DEADLINE, || pending(&mut client, &jobs[1]));
        // wconfd stopped: the release arrives first, then the end of the
        // waiter's connection; wconfd reads both in one turn. (Shut down,
        // not just closed: a process another test forks at that moment
        // holds the socket open until it execs.)
        wconfd.pause();
        client
            .send("freeLocks", json!([jobs[0].owner()]))
            .expect("send");
        waiter
            .stream()
            .shutdown(std::net::Shutdown::Both)
            .expect("shut down the waiter's connection");
        drop(waiter);
        wconfd.resume();
        assert_eq!(client.read_response().expect("answer"), Ok(json!([])));
        assert_eq!(list_locks(&mut client, &jobs[1]), wanted, "J2 was granted");
        jobs[1].wait_for_hups(round, DEADLINE);
        assert_eq!(client.ok("freeLocks", json!([jobs[1].owner()])), json!([]));
    }
}

// ----- death -----

#[test]
fn a_killed_holder_is_freed_and_its_waiters_granted_within_50_ms() {
    // Taken before J3's awaitLocks goes out: waiting for the guard later
    // (the crash harness holds it for many seconds) could outlast the
    // await's timeout, which would then answer the blockers.
    let _timing = timing_guard();
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=3);
    assert_eq!(
        try_update(
            &mut client,
            &jobs[0],
            &[("instance/a", "exclusive"), ("node/n1", "shared")]
        ),
        json!([])
    );
    // J2 waits the Ganeti way (SIGHUP), J3 through awaitLocks.
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("instance/a", "exclusive")]),
        json!([jobs[0].owner()])
    );
    let mut waiter = wconfd.client();
    waiter
        .send(
            "awaitLocks",
            json!([
                jobs[2].owner(),
                0,
                request(&[("node/n1", "exclusive")]),
                10_000
            ]),
        )
        .expect("send");
    wait_until("J3 waits", DEADLINE, || pending(&mut client, &jobs[2]));
    let livelock = jobs[0].path().to_owned();
    assert!(livelock.exists());

    let killed_at = SystemTime::now();
    let killed = Instant::now();
    jobs[0].kill9();
    assert_eq!(waiter.read_response().expect("answer"), Ok(json!([])));
    let awaited = killed.elapsed();
    let hup = jobs[1].wait_for_hups(1, DEADLINE)[0];
    let signalled = elapsed_between(killed_at, hup);
    eprintln!("kill -9 to SIGHUP: {signalled:?}; kill -9 to awaitLocks answer: {awaited:?}");
    assert!(
        signalled < DEATH_TO_GRANT_MAX,
        "J2 was told after {signalled:?}"
    );
    assert!(
        awaited < DEATH_TO_GRANT_MAX,
        "J3's await answered after {awaited:?}"
    );

    assert!(!pending(&mut client, &jobs[1]));
    assert_eq!(list_locks(&mut client, &jobs[0]), json!([]));
    assert_eq!(
        client.ok("listAllLocksOwners", json!([])),
        json!([
            ["instance/[lockset]", []],
            ["instance/a", [[jobs[1].owner(), "exclusive"]]],
            ["node/[lockset]", []],
            ["node/n1", [[jobs[2].owner(), "exclusive"]]]
        ])
    );
    assert_eq!(jobs[2].hups(), 0, "the await delivered J3's grant");
    // A freed dead owner's livelock goes at once (design/DECISIONS.md D12).
    assert!(!livelock.exists(), "the dead owner's livelock was left");
}

#[test]
fn stale_livelock_files_are_removed_only_when_old_and_dead() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let dir = wconfd.livelock_dir();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let make_old = |path: &std::path::Path| {
        std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open")
            .set_modified(an_hour_ago)
            .expect("set the modification time");
    };
    // Created, not yet locked (Ganeti's clients lock a moment later).
    let young = dir.join("job_000001_1");
    std::fs::write(&young, b"").expect("create");
    let old = dir.join("job_000002_1");
    std::fs::write(&old, b"").expect("create");
    make_old(&old);
    // Old, but alive; and alive with a lock held.
    let alive = OwnerProcess::spawn(&dir, 3);
    make_old(alive.path());
    let holder = OwnerProcess::spawn_posix(&dir, 4);
    make_old(holder.path());
    assert_eq!(
        try_update(&mut client, &holder, &[("node/n1", "shared")]),
        json!([])
    );
    assert_eq!(client.ok("cleanupLocks", json!([])), json!([]));
    assert!(young.exists(), "a young livelock file was removed");
    assert!(!old.exists(), "an old dead livelock file was kept");
    assert!(alive.path().exists() && holder.path().exists());
    assert_eq!(
        list_locks(&mut client, &holder),
        request(&[("node/n1", "shared")])
    );
}

#[test]
fn a_killed_waiter_loses_its_pending_request() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=3);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("node/n1", "exclusive")]),
        json!([])
    );
    for job in &jobs[1..] {
        assert_eq!(
            update_waiting(&mut client, job, 0, &[("node/n1", "exclusive")]),
            json!([jobs[0].owner()])
        );
    }
    jobs[1].kill9();
    wait_until("J2's request is dropped", DEADLINE, || {
        status(&mut client)[1]
            == json!([[0, jobs[2].owner(), request(&[("node/n1", "exclusive")])]])
    });
    assert_eq!(client.ok("freeLocks", json!([jobs[0].owner()])), json!([]));
    jobs[2].wait_for_hups(1, DEADLINE);
    assert_eq!(
        status(&mut client),
        json!([
            [
                ["node/[lockset]", []],
                ["node/n1", [[jobs[2].owner(), "exclusive"]]]
            ],
            []
        ])
    );
}

#[test]
fn an_owner_that_exits_without_freeing_is_freed() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=2);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("node/n1", "exclusive")]),
        json!([])
    );
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("node/n1", "exclusive")]),
        json!([jobs[0].owner()])
    );
    let j1 = jobs.remove(0);
    let j1_owner = j1.owner();
    j1.exit();
    jobs[0].wait_for_hups(1, DEADLINE);
    assert_eq!(client.ok("listLocks", json!([j1_owner])), json!([]));
    assert_eq!(
        list_locks(&mut client, &jobs[0]),
        request(&[("node/n1", "exclusive")])
    );
}

#[test]
fn a_posix_locked_livelock_is_alive_until_its_process_dies() {
    let wconfd = Wconfd::start_with_settings("[wconfd]\ndeath_check_interval_ms = 20\n");
    let mut client = wconfd.client();
    let mut ganeti = OwnerProcess::spawn_posix(&wconfd.livelock_dir(), 1);
    // A canary whose livelock is gone while its process lives: only the
    // periodic check (or cleanupLocks) frees it.
    let canary = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    assert_eq!(
        try_update(&mut client, &ganeti, &[("node/n1", "exclusive")]),
        json!([])
    );
    assert_eq!(
        try_update(&mut client, &canary, &[("node/n2", "exclusive")]),
        json!([])
    );
    std::fs::remove_file(canary.path()).expect("remove the canary's livelock");
    wait_until("a periodic check frees the canary", DEADLINE, || {
        list_locks(&mut client, &canary) == json!([])
    });
    assert_eq!(client.ok("cleanupLocks", json!([])), json!([]));
    assert_eq!(
        list_locks(&mut client, &ganeti),
        request(&[("node/n1", "exclusive")]),
        "a POSIX write lock keeps its owner alive"
    );
    ganeti.kill9();
    wait_until("the dead POSIX owner is freed", DEADLINE, || {
        list_locks(&mut client, &ganeti) == json!([])
    });
    assert_eq!(client.ok("listAllLocks", json!([])), json!([]));
}

// ----- restarts -----

/// Locks, groups, the config lock and waiters of several priorities.
fn build_state(client: &mut Client, jobs: &[OwnerProcess]) {
    let entries: [&[(&str, &str)]; 3] = [
        &[("cluster/BGL", "shared"), ("instance/a", "exclusive")],
        &[
            ("cluster/BGL", "shared"),
            ("node/[lockset]", "shared"),
            ("node/n1", "shared"),
        ],
        &[
            ("node-res/r1", "exclusive"),
            ("cluster/config", "exclusive"),
        ],
    ];
    for (job, entries) in jobs.iter().zip(entries) {
        assert_eq!(try_update(client, job, entries), json!([]));
    }
    assert_eq!(
        update_waiting(client, &jobs[3], 3, &[("instance/a", "shared")]),
        json!([jobs[0].owner()])
    );
    assert_eq!(
        update_waiting(
            client,
            &jobs[4],
            -2,
            &[("node/n2", "exclusive"), ("node/n1", "exclusive")]
        ),
        json!([jobs[1].owner()])
    );
}

fn the_state_survives(root: &Root, stop: impl FnOnce(&mut Wconfd)) -> Wconfd {
    let mut wconfd = Wconfd::restart_on(root);
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=5);
    build_state(&mut client, &jobs);
    let before = status(&mut client);
    assert_eq!(before[1].as_array().map(Vec::len), Some(2), "{before}");
    stop(&mut wconfd);
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    assert_eq!(status(&mut client), before);
    // The waiters work on: J1 frees, J4 is granted and told.
    assert_eq!(client.ok("freeLocks", json!([jobs[0].owner()])), json!([]));
    jobs[3].wait_for_hups(1, DEADLINE);
    assert_eq!(
        list_locks(&mut client, &jobs[3]),
        request(&[("instance/a", "shared")])
    );
    assert!(pending(&mut client, &jobs[4]));
    assert_eq!(jobs[4].hups(), 0);
    // The restarted daemon watches the owners' processes again: J2 killed,
    // J5 (waiting behind it) is granted at once.
    let _timing = timing_guard();
    let killed_at = SystemTime::now();
    jobs[1].kill9();
    let signalled = elapsed_between(killed_at, jobs[4].wait_for_hups(1, DEADLINE)[0]);
    assert!(
        signalled < DEATH_TO_GRANT_MAX,
        "J5 was told after {signalled:?}"
    );
    assert_eq!(
        list_locks(&mut client, &jobs[4]),
        request(&[("node/n1", "exclusive"), ("node/n2", "exclusive")])
    );
    wconfd
}

#[test]
fn the_lock_state_survives_a_clean_stop() {
    the_state_survives(&Root::new(), Wconfd::stop);
}

#[test]
fn the_lock_state_survives_kill_9() {
    let root = Root::new();
    let wconfd = the_state_survives(&root, Wconfd::kill9);
    // The temp dir's file system says whether it offers direct I/O; the
    // journal uses it exactly then.
    let probe = std::fs::File::open(root.path().join("locks.journal")).expect("the journal");
    let direct = warden::sys::direct_io_alignment(&probe)
        .expect("statx")
        .is_some_and(|alignment| alignment <= 4096);
    let log = wconfd.log();
    let expected = if direct {
        "direct I/O"
    } else {
        "buffered writes"
    };
    assert!(log.contains(expected), "not {expected}:\n{log}");
}

/// tmpfs offers no direct I/O: the journal takes the buffered path, with
/// the same guarantees.
#[test]
fn the_lock_state_survives_kill_9_without_direct_io() {
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "this test needs a tmpfs at /dev/shm");
    let root = Root::new_in(shm);
    let wconfd = the_state_survives(&root, Wconfd::kill9);
    let log = wconfd.log();
    assert!(log.contains("buffered writes"), "{log}");
}

#[test]
fn owners_that_died_while_wconfd_was_down_are_freed_before_it_serves() {
    let mut wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut jobs = spawn(&wconfd, 1..=5);
    build_state(&mut client, &jobs);
    wconfd.kill9();
    // J1 holds what J4 waits for; J5 waits.
    jobs[0].kill9();
    jobs[4].kill9();
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    let first = status(&mut client);
    let table = json!([
        ["cluster/[lockset]", []],
        ["cluster/BGL", [[jobs[1].owner(), "shared"]]],
        ["instance/[lockset]", []],
        ["instance/a", [[jobs[3].owner(), "shared"]]],
        ["node/[lockset]", [[jobs[1].owner(), "shared"]]],
        ["node/n1", [[jobs[1].owner(), "shared"]]],
        ["node-res/[lockset]", []],
        ["node-res/r1", [[jobs[2].owner(), "exclusive"]]],
        ["cluster/config", [[jobs[2].owner(), "exclusive"]]]
    ]);
    assert_eq!(first, json!([table, []]));
    // J4 was granted during recovery, and told.
    jobs[3].wait_for_hups(1, DEADLINE);
    assert_eq!(jobs[3].hups(), 1);
}

#[test]
fn a_second_wconfd_on_the_same_root_refuses_to_start() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let jobs = spawn(&wconfd, 1..=1);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("node/n1", "exclusive")]),
        json!([])
    );
    let before = status(&mut client);
    let (status_code, log) = match Wconfd::try_start_on(wconfd.root()) {
        Ok(_) => panic!("a second wconfd started on the same root"),
        Err(refused) => refused,
    };
    assert!(!status_code.success(), "{status_code}");
    assert!(
        log.contains("another wconfd is running"),
        "the refusal does not say why:\n{log}"
    );
    assert_eq!(client.ok("echo", json!(["still"])), json!("still"));
    assert_eq!(
        wconfd.client().ok("listLocksWaitingStatus", json!([])),
        before
    );
}

// ----- crash loop -----

/// What one churning client knows it holds.
struct Model {
    owner: Value,
    /// Lock name to mode, as acknowledged.
    held: BTreeMap<String, String>,
    /// An update was sent and its answer lost: `held` may be before or
    /// after it, until the client resynchronises.
    unsure: Option<BTreeMap<String, String>>,
}

impl Model {
    fn listing(held: &BTreeMap<String, String>) -> Value {
        // Lock order for the names used here: cluster/BGL, then node/*
        // by name.
        let mut locks: Vec<(&String, &String)> = held.iter().collect();
        locks.sort_by_key(|(lock, _)| (!lock.starts_with("cluster/"), lock.to_string()));
        Value::Array(
            locks
                .into_iter()
                .map(|(lock, mode)| json!([lock, mode]))
                .collect(),
        )
    }
}

struct Loop {
    socket: PathBuf,
    /// Bumped (and announced) once the restarted daemon was checked.
    generation: Mutex<u64>,
    restarted: Condvar,
    /// Clients hold it shared for each request; the checker exclusively.
    gate: RwLock<()>,
    stopping: AtomicBool,
    acknowledged: AtomicU64,
    /// Updates whose answer was lost to a kill.
    lost: AtomicU64,
    /// Lost answers whose update had been applied (durable, then killed).
    applied_unanswered: AtomicU64,
}

impl Loop {
    /// Waits until the generation is past `failed`; None when stopping.
    fn wait_past(&self, failed: u64) -> Option<u64> {
        let deadline = Instant::now() + DEADLINE;
        let mut generation = self.generation.lock().expect("not poisoned");
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return None;
            }
            if *generation > failed {
                return Some(*generation);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no restart within {DEADLINE:?}");
            generation = self
                .restarted
                .wait_timeout(generation, left)
                .expect("not poisoned")
                .0;
        }
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One client: acquire the BGL and its own node, sometimes the contended
/// node, release, again; reconnect after each restart.
fn churn(shared: &Loop, model: &Mutex<Model>, index: usize) {
    let own = format!("node/c{index}");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1));
    let mut connection: Option<(Client, u64)> = None;
    let mut failed = 0;
    loop {
        let (client, generation) = match &mut connection {
            Some(open) => open,
            None => {
                let Some(generation) = shared.wait_past(failed) else {
                    return;
                };
                connection.insert((Client::connect(&shared.socket), generation))
            }
        };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let _gate = shared.gate.read().expect("not poisoned");
        let mut model = model.lock().expect("not poisoned");
        if let Some(after) = model.unsure.take() {
            let owner = model.owner.clone();
            match client.try_call("listLocks", json!([owner])) {
                Ok(answer) => {
                    let listed = answer.expect("listLocks succeeds");
                    let before = Model::listing(&model.held);
                    if listed == before {
                    } else if listed == Model::listing(&after) {
                        model.held = after;
                        shared.applied_unanswered.fetch_add(1, Ordering::SeqCst);
                    } else {
                        panic!(
                            "client {index}: an unanswered update was half applied: \
                             holds {listed}, before {before}, after {}",
                            Model::listing(&after)
                        );
                    }
                }
                Err(_) => {
                    model.unsure = Some(after);
                    failed = *generation;
                    connection = None;
                }
            }
            continue;
        }
        let held = &model.held;
        let entries: Vec<(String, &str)> = if held.is_empty() {
            vec![
                ("cluster/BGL".to_owned(), "shared"),
                (own.clone(), "exclusive"),
            ]
        } else if held.contains_key("node/shared") {
            vec![("node/shared".to_owned(), "release")]
        } else if rng.below(3) > 0 {
            let mode = if rng.below(2) == 0 {
                "shared"
            } else {
                "exclusive"
            };
            vec![("node/shared".to_owned(), mode)]
        } else {
            vec![
                ("cluster/BGL".to_owned(), "release"),
                (own.clone(), "release"),
            ]
        };
        let mut after = held.clone();
        for (lock, action) in &entries {
            match *action {
                "release" => after.remove(lock),
                mode => after.insert(lock.clone(), mode.to_owned()),
            };
        }
        let wire: Vec<Value> = entries
            .iter()
            .map(|(lock, action)| json!([lock, action]))
            .collect();
        let owner = model.owner.clone();
        match client.try_call("tryUpdateLocks", json!([owner, wire])) {
            Ok(answer) => {
                let blockers = answer.unwrap_or_else(|failure| {
                    panic!("client {index}: {entries:?} failed: {failure:?}")
                });
                if blockers == json!([]) {
                    model.held = after;
                } else {
                    assert!(
                        entries[0].0 == "node/shared",
                        "client {index}: only node/shared is contended, yet {entries:?} is blocked by {blockers}"
                    );
                }
                shared.acknowledged.fetch_add(1, Ordering::SeqCst);
            }
            Err(_) => {
                shared.lost.fetch_add(1, Ordering::SeqCst);
                model.unsure = Some(after);
                failed = *generation;
                connection = None;
            }
        }
    }
}

/// Every client sure of its holdings holds exactly that, and no exclusive
/// holder shares its lock.
fn check_after_restart(client: &mut Client, models: &[Arc<Mutex<Model>>]) {
    for (index, model) in models.iter().enumerate() {
        let model = model.lock().expect("not poisoned");
        let listed = client.ok("listLocks", json!([model.owner]));
        match &model.unsure {
            None => assert_eq!(
                listed,
                Model::listing(&model.held),
                "client {index}: acknowledged locks were lost or invented"
            ),
            Some(after) => assert!(
                listed == Model::listing(&model.held) || listed == Model::listing(after),
                "client {index}: an unanswered update was half applied: {listed}"
            ),
        }
    }
    let table = client.ok("listAllLocksOwners", json!([]));
    for row in table.as_array().expect("a table") {
        let holders = row[1].as_array().expect("holders");
        if holders.iter().any(|holder| holder[1] == "exclusive") {
            assert_eq!(holders.len(), 1, "an exclusive holder is not alone: {row}");
        }
    }
}

#[test]
fn acknowledged_locks_survive_a_crash_loop_under_load() {
    const CLIENTS: usize = 4;
    const RESTARTS: usize = 25;
    const OPS_PER_ROUND: u64 = 250;
    let _timing = timing_guard();
    let started = Instant::now();
    // Small snapshots: kills land before, during and after them too.
    let mut wconfd = Wconfd::start_with_settings("[wconfd]\nsnapshot_journal_bytes_max = 65536\n");
    let owners: Vec<OwnerProcess> = (0..CLIENTS)
        .map(|index| OwnerProcess::spawn(&wconfd.livelock_dir(), 100 + index as u64))
        .collect();
    let models: Vec<Arc<Mutex<Model>>> = owners
        .iter()
        .map(|owner| {
            Arc::new(Mutex::new(Model {
                owner: owner.owner(),
                held: BTreeMap::new(),
                unsure: None,
            }))
        })
        .collect();
    let shared = Arc::new(Loop {
        socket: wconfd.root().socket(),
        generation: Mutex::new(1),
        restarted: Condvar::new(),
        gate: RwLock::new(()),
        stopping: AtomicBool::new(false),
        acknowledged: AtomicU64::new(0),
        lost: AtomicU64::new(0),
        applied_unanswered: AtomicU64::new(0),
    });
    let threads: Vec<_> = models
        .iter()
        .enumerate()
        .map(|(index, model)| {
            let (shared, model) = (Arc::clone(&shared), Arc::clone(model));
            std::thread::spawn(move || churn(&shared, &model, index))
        })
        .collect();

    for _ in 0..RESTARTS {
        let from = shared.acknowledged.load(Ordering::SeqCst);
        wait_until("the clients make progress", DEADLINE, || {
            shared.acknowledged.load(Ordering::SeqCst) >= from + OPS_PER_ROUND
                || threads.iter().any(|thread| thread.is_finished())
        });
        assert!(
            !threads.iter().any(|thread| thread.is_finished()),
            "a client failed"
        );
        wconfd.kill9();
        wconfd = Wconfd::restart_on(wconfd.root());
        {
            let _gate = shared.gate.write().expect("not poisoned");
            check_after_restart(&mut wconfd.client(), &models);
        }
        *shared.generation.lock().expect("not poisoned") += 1;
        shared.restarted.notify_all();
    }
    shared.stopping.store(true, Ordering::SeqCst);
    shared.restarted.notify_all();
    for thread in threads {
        thread.join().expect("a client failed");
    }
    wconfd.stop();
    let wconfd = Wconfd::restart_on(wconfd.root());
    check_after_restart(&mut wconfd.client(), &models);
    assert!(
        wconfd.root().path().join("locks.data").exists(),
        "the journal never grew into a snapshot"
    );
    eprintln!(
        "crash loop: {RESTARTS} kills, {} acknowledged updates, {} answers lost \
         ({} of them applied), {:?}",
        shared.acknowledged.load(Ordering::SeqCst),
        shared.lost.load(Ordering::SeqCst),
        shared.applied_unanswered.load(Ordering::SeqCst),
        started.elapsed()
    );
    drop(owners);
}
