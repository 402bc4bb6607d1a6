//! The lock extensions over the wire: fencing tokens (across kill -9 of
//! wconfd), "previous holder died", `checkFence`, `whatIfLocks`, fifo
//! fairness against a stream of shared requests (and Ganeti's mode
//! starving the same request), and a conversion deadlock refused with its
//! cycle. Owners are real processes holding their livelocks.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::daemon::{Client, OwnerProcess, Wconfd, request, try_update, wait_until};

fn fenced_await(client: &mut Client, owner: &OwnerProcess, entries: &[(&str, &str)]) -> Value {
    client.ok(
        "awaitLocks",
        json!([owner.owner(), 0, request(entries), 5000, {"fence": true}]),
    )
}

fn token_of(answer: &Value) -> u64 {
    answer["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token in {answer}"))
}

#[test]
fn tokens_increase_per_grant_and_across_a_kill_of_wconfd() {
    let mut wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let j2 = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    let first = fenced_await(
        &mut client,
        &j1,
        &[("cluster/BGL", "shared"), ("instance/a", "exclusive")],
    );
    assert_eq!(first["blockers"], json!([]));
    assert_eq!(first["died"], json!([]));
    let t1 = token_of(&first);
    // The same request again is no new grant: the same token.
    let again = fenced_await(
        &mut client,
        &j1,
        &[("cluster/BGL", "shared"), ("instance/a", "exclusive")],
    );
    assert_eq!(token_of(&again), t1);
    let second = fenced_await(&mut client, &j2, &[("instance/b", "exclusive")]);
    let t2 = token_of(&second);
    assert!(t2 > t1, "{t2} after {t1}");
    // A Ganeti client's answer is unchanged: blockers only.
    assert_eq!(
        client.ok(
            "awaitLocks",
            json!([j2.owner(), 0, request(&[("instance/b", "exclusive")]), 0])
        ),
        json!([])
    );
    // The listing with tokens; without, Ganeti's form.
    let table = client.ok("listAllLocksOwners", json!([{"tokens": true}]));
    let row = table
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row[0] == "instance/a")
        .expect("instance/a listed")
        .clone();
    assert_eq!(row[1], json!([[j1.owner(), "exclusive", {"token": t1}]]));
    assert!(
        client.ok("listAllLocksOwners", json!([]))[0][1]
            .as_array()
            .expect("holders")
            .iter()
            .all(|holder| holder.as_array().expect("pair").len() == 2)
    );
    assert_eq!(
        client.ok("checkFence", json!([j1.owner(), "instance/a", t1])),
        json!(true)
    );
    assert_eq!(
        client.ok("checkFence", json!([j2.owner(), "instance/a", t1])),
        json!(false)
    );
    wconfd.kill9();
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    // Held grants keep their tokens; the next grant is past every one.
    assert_eq!(
        client.ok("checkFence", json!([j1.owner(), "instance/a", t1])),
        json!(true)
    );
    let third = fenced_await(&mut client, &j2, &[("instance/c", "exclusive")]);
    assert!(token_of(&third) > t2);
    // Released: the token is no longer current.
    client.ok("freeLocks", json!([j1.owner()]));
    assert_eq!(
        client.ok("checkFence", json!([j1.owner(), "instance/a", t1])),
        json!(false)
    );
}

#[test]
fn check_fence_refuses_bad_tokens_clearly() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let granted = fenced_await(&mut client, &j1, &[("node/n1", "exclusive")]);
    let token = token_of(&granted);
    let (class, text) = client.fails("checkFence", json!([j1.owner(), "node/n1", token + 5]));
    assert_eq!(class, "GenericError");
    assert!(text.contains("never issued"), "{text}");
    for bad in [json!(-1), json!("7"), json!(1.5), json!(null)] {
        let (class, text) = client.fails("checkFence", json!([j1.owner(), "node/n1", bad]));
        assert_eq!(class, "GenericError");
        assert!(text.contains("argument 3"), "{text}");
    }
    let (_, text) = client.fails("checkFence", json!([j1.owner(), "nolevel/x", token]));
    assert!(text.contains("nolevel/x"), "{text}");
    // Unknown owner or lock, token 0: not current.
    let stranger = OwnerProcess::spawn(&wconfd.livelock_dir(), 9);
    assert_eq!(
        client.ok("checkFence", json!([stranger.owner(), "node/n1", token])),
        json!(false)
    );
    assert_eq!(
        client.ok("checkFence", json!([j1.owner(), "node/n2", token])),
        json!(false)
    );
    assert_eq!(
        client.ok("checkFence", json!([j1.owner(), "node/n1", 0])),
        json!(false)
    );
    // Options of awaitLocks and listAllLocksOwners are checked.
    let (_, text) = client.fails(
        "awaitLocks",
        json!([j1.owner(), 0, request(&[("node/n1", "exclusive")]), 0, {"fenced": true}]),
    );
    assert!(text.contains("unknown option"), "{text}");
    let (_, text) = client.fails("listAllLocksOwners", json!([{"tokens": 1}]));
    assert!(text.contains("not a boolean"), "{text}");
}

#[test]
fn the_next_holder_is_told_its_predecessor_died_and_not_after_a_release() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let j2 = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    let j3 = OwnerProcess::spawn(&wconfd.livelock_dir(), 3);
    let t1 = token_of(&fenced_await(
        &mut client,
        &j1,
        &[("instance/a", "exclusive")],
    ));
    // J2 waits; J1 dies; wconfd frees it and J2's grant is told.
    client.send(
        "awaitLocks",
        json!([j2.owner(), 0, request(&[("instance/a", "exclusive")]), 10_000, {"fence": true}]),
    )
    .expect("send");
    std::thread::sleep(Duration::from_millis(50));
    j1.kill9();
    let granted = client.read_response().expect("answer").expect("granted");
    assert_eq!(granted["blockers"], json!([]));
    assert_eq!(
        granted["died"],
        json!([{"lock": "instance/a", "owner": j1.owner(), "token": t1}])
    );
    let table = client.ok("listAllLocksOwners", json!([{"tokens": true}]));
    let holder = table
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row[0] == "instance/a")
        .expect("listed")[1][0]
        .clone();
    assert_eq!(holder[2]["died"][0]["owner"], j1.owner());
    // J2 releases: J3 is told nothing.
    client.ok("freeLocks", json!([j2.owner()]));
    let third = fenced_await(&mut client, &j3, &[("instance/a", "exclusive")]);
    assert_eq!(third["died"], json!([]));
}

#[test]
fn an_await_timing_out_after_its_owner_was_freed_as_dead_is_not_read_as_a_grant() {
    // Found by the crash harness: an owner's exit and its await's timeout
    // handled in one turn, the exit first, answered the timed-out await
    // with the blockers of a fresh request: `[]`, which reads as granted.
    let wconfd = Wconfd::start_with_settings("[wconfd]\ndeath_check_interval_ms = 600000\n");
    let mut client = wconfd.client();
    let holder = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    try_update(&mut client, &holder, &[("instance/a", "exclusive")]);
    let wanted = request(&[("instance/a", "exclusive")]);
    let mut awaits = Vec::new();
    for (job, options) in [(2, json!({"fence": true})), (3, json!({}))] {
        let owner = OwnerProcess::spawn(&wconfd.livelock_dir(), job);
        let mut waiter = wconfd.client();
        waiter
            .send(
                "awaitLocks",
                json!([owner.owner(), 0, wanted, 300, options]),
            )
            .expect("send");
        wait_until("the await is held", Duration::from_secs(10), || {
            client.ok("hasPendingRequest", json!([owner.owner()])) == json!(true)
        });
        awaits.push((owner, waiter));
    }
    // Both exits and both timeouts are there when wconfd runs again.
    wconfd.pause();
    let mut waiters = Vec::new();
    for (owner, waiter) in awaits {
        drop(owner);
        waiters.push(waiter);
    }
    std::thread::sleep(Duration::from_millis(500));
    wconfd.resume();
    for mut waiter in waiters {
        let answer = waiter.read_response().expect("an answer");
        let failure = answer.expect_err("a dropped request is no grant");
        assert!(
            format!("{failure:?}").contains("the pending request was dropped"),
            "{failure:?}"
        );
    }
    assert_eq!(
        client.ok("listLocks", json!([holder.owner()])),
        json!([["instance/a", "exclusive"]])
    );
}

#[test]
fn a_fenced_await_granted_then_freed_as_a_death_in_the_same_turn_answers_its_token() {
    // No periodic death check: the only one is the freeLocks below.
    let wconfd = Wconfd::start_with_settings("[wconfd]\ndeath_check_interval_ms = 600000\n");
    let mut client = wconfd.client();
    let mut waiter = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    // Job 2's livelock file does not exist (dead once probed) while its
    // pid, this process, lives on: no exit frees it before the turn below.
    let j2 = json!([
        2,
        wconfd.livelock_dir().join("job_000002_gone"),
        std::process::id()
    ]);
    let t1 = token_of(&fenced_await(
        &mut client,
        &j1,
        &[("instance/a", "exclusive")],
    ));
    waiter
        .send(
            "awaitLocks",
            json!([j2, 0, request(&[("instance/a", "exclusive")]), 10_000, {"fence": true}]),
        )
        .expect("send");
    wait_until("job 2 waits", Duration::from_secs(10), || {
        client.ok("hasPendingRequest", json!([j2])) == json!(true)
    });
    // One write, one turn: job 1's release grants job 2's await, then a
    // freeLocks of job 2 (its livelock dead) frees that grant as a death.
    let mut frames = Vec::new();
    for (method, args) in [
        (
            "tryUpdateLocks",
            json!([j1.owner(), request(&[("instance/a", "release")])]),
        ),
        ("freeLocks", json!([j2])),
    ] {
        frames.extend(serde_json::to_vec(&json!({"method": method, "args": args})).expect("JSON"));
        frames.extend_from_slice(b"\n\x03");
    }
    client.send_raw(&frames).expect("send");
    for _ in 0..2 {
        client.read_response().expect("answer").expect("done");
    }
    // The grant was made, with its token, before the death freed it.
    let granted = waiter.read_response().expect("answer").expect("granted");
    assert_eq!(granted["blockers"], json!([]));
    let t2 = token_of(&granted);
    assert!(t2 > t1, "{t2} after {t1}");
    let j3 = OwnerProcess::spawn(&wconfd.livelock_dir(), 3);
    let third = fenced_await(&mut client, &j3, &[("instance/a", "exclusive")]);
    assert_eq!(
        third["died"],
        json!([{"lock": "instance/a", "owner": j2, "token": t2}])
    );
}

#[test]
fn a_conversion_deadlock_is_refused_with_its_cycle_and_changes_nothing() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let j2 = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    for owner in [&j1, &j2] {
        assert_eq!(
            try_update(&mut client, owner, &[("instance/a", "shared")]),
            json!([])
        );
    }
    let upgrade = request(&[("instance/a", "exclusive")]);
    assert_eq!(
        client.ok("updateLocksWaiting", json!([j1.owner(), 0, upgrade])),
        json!([j2.owner()])
    );
    let before = client.ok("listLocksWaitingStatus", json!([]));
    let what_if = client.ok("whatIfLocks", json!([j2.owner(), upgrade]));
    assert_eq!(what_if["granted"], json!(false));
    assert!(
        what_if["error"]
            .as_str()
            .expect("error")
            .starts_with("Deadlock")
    );
    match client.call("updateLocksWaiting", json!([j2.owner(), 0, upgrade])) {
        Ok(answer) => panic!("the cycle was not refused: {answer}"),
        Err((class, args)) => {
            assert_eq!(class, "GenericError");
            let text = args[0].as_str().expect("text");
            assert!(text.starts_with("Deadlock"), "{text}");
            assert!(text.contains("instance/a shared"), "{text}");
            let cycle = &args[1]["cycle"];
            assert_eq!(cycle[0]["owner"], j1.owner());
            assert_eq!(cycle[0]["holds"], json!([["instance/a", "shared"]]));
            assert_eq!(cycle[1]["owner"], j2.owner());
        }
    }
    assert_eq!(client.ok("listLocksWaitingStatus", json!([])), before);
    let events = client.ok("watchEvents", json!([0, ["lock.deadlock"], 0]));
    let refused = &events["events"][0];
    assert_eq!(refused["type"], "lock.deadlock", "{events}");
    assert_eq!(refused["owner"], "2", "{events}");
    assert_eq!(refused["request"], upgrade, "{events}");
    assert_eq!(refused["cycle"][0]["owner"], "1", "{events}");
    assert_eq!(
        refused["cycle"][0]["holds"],
        json!([["instance/a", "shared"]]),
        "{events}"
    );
    assert_eq!(refused["cycle"][1]["owner"], "2", "{events}");
    // Off: it waits, as in Ganeti.
    let wconfd = Wconfd::start_with_settings("[wconfd]\ndeadlock_check = \"off\"\n");
    let mut client = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let j2 = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    for owner in [&j1, &j2] {
        try_update(&mut client, owner, &[("instance/a", "shared")]);
    }
    client.ok("updateLocksWaiting", json!([j1.owner(), 0, upgrade]));
    assert_eq!(
        client.ok("updateLocksWaiting", json!([j2.owner(), 0, upgrade])),
        json!([j1.owner()])
    );
}

#[test]
fn what_if_names_blockers_and_where_it_would_queue_changing_nothing() {
    let wconfd = Wconfd::start_with_settings("[wconfd]\nfairness = \"fifo\"\n");
    let mut client = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let j2 = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    let j3 = OwnerProcess::spawn(&wconfd.livelock_dir(), 3);
    try_update(&mut client, &j1, &[("node/n1", "shared")]);
    let group = request(&[("node/[lockset]", "exclusive")]);
    client.ok("updateLocksWaiting", json!([j2.owner(), 0, group]));
    let before = client.ok("listLocksWaitingStatus", json!([]));
    let asked = request(&[("node/n2", "shared")]);
    let what_if = client.ok("whatIfLocks", json!([j3.owner(), asked, 0]));
    assert_eq!(what_if["granted"], json!(false));
    assert_eq!(what_if["blockers"], json!([j2.owner()]));
    assert_eq!(what_if["filed_under"], j2.owner());
    assert_eq!(what_if["ahead"][0]["owner"], j2.owner());
    assert_eq!(client.ok("listLocksWaitingStatus", json!([])), before);
    let free = client.ok(
        "whatIfLocks",
        json!([j3.owner(), request(&[("instance/x", "exclusive")])]),
    );
    assert_eq!(free["granted"], json!(true));
}

/// 8 clients loop shared `node/n<i>` requests (each held `HOLD`); one
/// client asks `node/[lockset]` exclusively. Answers how long it waited,
/// or `None` if not granted within `limit`.
fn exclusive_wait_under_shared_stream(settings: &str, limit: Duration) -> Option<Duration> {
    const HOLD: Duration = Duration::from_millis(200);
    let wconfd = Wconfd::start_with_settings(settings);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut streams = Vec::new();
    for i in 0..8u64 {
        let owner = OwnerProcess::spawn(&wconfd.livelock_dir(), 100 + i);
        let mut client = wconfd.client();
        let stop = std::sync::Arc::clone(&stop);
        // Staggered so that some member is always held.
        std::thread::sleep(HOLD / 8);
        streams.push(std::thread::spawn(move || {
            let lock = format!("node/n{i}");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let answer = client.ok(
                    "awaitLocks",
                    json!([owner.owner(), 0, [[lock, "shared"]], 2000]),
                );
                if answer == json!([]) {
                    std::thread::sleep(HOLD);
                }
                client.ok("freeLocks", json!([owner.owner()]));
            }
            drop(owner);
        }));
    }
    std::thread::sleep(HOLD * 2);
    let exclusive = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let mut client = wconfd.client();
    let started = Instant::now();
    let mut waited = None;
    while started.elapsed() < limit {
        let left = limit.saturating_sub(started.elapsed()).as_millis() as u64;
        let answer = client.ok(
            "awaitLocks",
            json!([
                exclusive.owner(),
                0,
                [["node/[lockset]", "exclusive"]],
                left.max(1)
            ]),
        );
        if answer == json!([]) {
            waited = Some(started.elapsed());
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    client.ok("freeLocks", json!([exclusive.owner()]));
    for stream in streams {
        stream.join().expect("stream thread");
    }
    waited
}

#[test]
fn fifo_grants_an_exclusive_group_request_within_two_holds_and_ganeti_mode_starves_it() {
    let _guard = crate::daemon::timing_guard();
    // Bound: the holds granted before it queued end within one hold (200
    // ms); 2 holds leave room for a loaded machine's scheduling.
    let fifo = exclusive_wait_under_shared_stream(
        "[wconfd]\nfairness = \"fifo\"\n",
        Duration::from_secs(5),
    )
    .expect("fifo grants the exclusive request");
    assert!(
        fifo <= Duration::from_millis(400),
        "fifo took {fifo:?}, over 2 holds"
    );
    let ganeti = exclusive_wait_under_shared_stream("", Duration::from_secs(2));
    assert_eq!(
        ganeti, None,
        "Ganeti's mode let the exclusive request through"
    );
}

#[test]
fn a_policy_change_at_restart_judges_the_waiters_again() {
    let mut wconfd = Wconfd::start_with_settings("[wconfd]\nfairness = \"fifo\"\n");
    let mut client = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let j2 = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    let j3 = OwnerProcess::spawn(&wconfd.livelock_dir(), 3);
    try_update(&mut client, &j1, &[("node/n1", "shared")]);
    client.ok(
        "updateLocksWaiting",
        json!([j2.owner(), 0, request(&[("node/[lockset]", "exclusive")])]),
    );
    // Queued behind J2 only.
    assert_eq!(
        client.ok(
            "updateLocksWaiting",
            json!([j3.owner(), 0, request(&[("node/n2", "shared")])])
        ),
        json!([j2.owner()])
    );
    wconfd.stop();
    std::fs::write(
        wconfd.root().path().join("warden.toml"),
        "[wconfd]\nfairness = \"ganeti\"\n",
    )
    .expect("settings");
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    wait_until(
        "J3 granted under Ganeti's fairness",
        Duration::from_secs(5),
        || {
            !client
                .ok("hasPendingRequest", json!([j3.owner()]))
                .as_bool()
                .expect("bool")
        },
    );
    assert_eq!(
        client.ok("listLocks", json!([j3.owner()])),
        json!([["node/n2", "shared"]])
    );
}

#[test]
fn the_cli_shows_tokens_and_a_deadlock_left_waiting_with_deadlock_check_off() {
    let wconfd = Wconfd::start_with_settings("[wconfd]\ndeadlock_check = \"off\"\n");
    let mut client = wconfd.client();
    let owners: Vec<OwnerProcess> = (1..=4)
        .map(|job| OwnerProcess::spawn(&wconfd.livelock_dir(), job))
        .collect();
    let [j1, j2, j3, j4] = [&owners[0], &owners[1], &owners[2], &owners[3]];
    // A plain wait (j4 behind j3) and, apart from it, a conversion deadlock
    // (j1 and j2 share instance/a and both ask for it exclusively).
    try_update(&mut client, j3, &[("node/n1", "exclusive")]);
    client.ok(
        "updateLocksWaiting",
        json!([j4.owner(), 0, request(&[("node/n1", "exclusive")])]),
    );
    for owner in [j1, j2] {
        try_update(&mut client, owner, &[("instance/a", "shared")]);
    }
    let upgrade = request(&[("instance/a", "exclusive")]);
    client.ok("updateLocksWaiting", json!([j1.owner(), 0, upgrade]));
    client.ok("updateLocksWaiting", json!([j2.owner(), 0, upgrade]));

    let waiters = client.ok("listWaiters", json!([]));
    let j1_waits = waiters
        .as_array()
        .expect("waiters")
        .iter()
        .find(|waiter| waiter["owner"] == j1.owner())
        .unwrap_or_else(|| panic!("j1 waits: {waiters}"));
    let token = j1_waits["holds"][0][2].as_u64().expect("a token");
    assert_eq!(j1_waits["holds"], json!([["instance/a", "shared", token]]));
    assert_eq!(j1_waits["holds_count"], json!(1));
    assert!(
        client.ok("checkFence", json!([j1.owner(), "instance/a", token])) == json!(true),
        "the token listWaiters shows is the current grant"
    );

    let root = wconfd.root().path();
    let tree = crate::cli::json_of(&root, &["locks", "--tree"]);
    let ident = |owner: &OwnerProcess| owner.owner()[0].clone();
    assert_eq!(
        tree["cycles"],
        json!([[
            {"ident": ident(j1), "livelock": j1.owner()[1], "pid": j1.owner()[2]},
            {"ident": ident(j2), "livelock": j2.owner()[1], "pid": j2.owner()[2]}
        ]]),
        "{tree}"
    );
    let roots: Vec<&Value> = tree["tree"]
        .as_array()
        .expect("tree")
        .iter()
        .map(|root| &root["owner"]["ident"])
        .collect();
    assert_eq!(
        roots,
        [&ident(j3), &ident(j1)],
        "the knot is shown too: {tree}"
    );
    let human = crate::cli::stdout(&crate::cli::expect(&root, &["locks", "--tree"], 0));
    assert!(
        human.contains("deadlock: job 1 (pid") && human.contains("waits for job 2 (pid"),
        "{human}"
    );
    let table = crate::cli::json_of(&root, &["locks"]);
    let held = table["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .find(|lock| lock["lock"] == "node/n1")
        .unwrap_or_else(|| panic!("node/n1 is held: {table}"));
    assert!(
        held["owners"][0]["token"]
            .as_u64()
            .is_some_and(|token| token > 0),
        "{table}"
    );
    let human = crate::cli::stdout(&crate::cli::expect(&root, &["locks"], 0));
    assert!(human.contains("TOKEN"), "{human}");
}

#[test]
fn a_fifo_await_timing_out_behind_a_waiter_names_the_waiter_not_a_grant() {
    let wconfd = Wconfd::start_with_settings("[wconfd]\nfairness = \"fifo\"\n");
    let mut client = wconfd.client();
    let j1 = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let j2 = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    let j3 = OwnerProcess::spawn(&wconfd.livelock_dir(), 3);
    try_update(&mut client, &j1, &[("node/n1", "shared")]);
    let group = request(&[("node/[lockset]", "exclusive")]);
    client.ok("updateLocksWaiting", json!([j2.owner(), 0, group]));
    // Job 3 holds nothing: it queues behind job 2, whom no holder of
    // node/n2 is in the way of. Its await times out still waiting.
    let member = request(&[("node/n2", "shared")]);
    let answer = client.ok("awaitLocks", json!([j3.owner(), 0, member, 200]));
    assert_eq!(answer, json!([j2.owner()]));
    let fenced = client.ok(
        "awaitLocks",
        json!([j3.owner(), 0, member, 200, {"fence": true}]),
    );
    assert_eq!(fenced, json!({"blockers": [j2.owner()]}));
    assert_eq!(
        client.ok("hasPendingRequest", json!([j3.owner()])),
        json!(true)
    );
    assert_eq!(client.ok("listLocks", json!([j3.owner()])), json!([]));
}
