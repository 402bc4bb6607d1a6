//! The event sequences of both daemons (EVENTS.md): what each change
//! says, `WatchEvents`/`watchEvents` held until events arrive, and the
//! sequences across kills: luxid says what it missed from the job files,
//! wconfd what its files lack from its journal, nothing twice, no gap.

use std::fs;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::daemon::{
    Client, DEADLINE, OwnerProcess, Wconfd, try_update, update_waiting, wait_until,
};
use crate::luxid::{Cluster, Luxid};

/// Every event of a daemon after `since`, read without waiting.
fn events_after(client: &mut Client, method: &str, since: u64) -> Vec<Value> {
    let mut all = Vec::new();
    let mut since = since;
    loop {
        let answer = client.ok(method, json!([since, null, 0]));
        let events = answer["events"].as_array().expect("events").clone();
        let next = answer["next"].as_u64().expect("next");
        all.extend(events);
        if next == since {
            return all;
        }
        since = next;
    }
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|event| event["type"].as_str().expect("a type").to_owned())
        .collect()
}

/// The seqs are 1, 2, 3, ... in order.
fn assert_numbered(events: &[Value]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event["seq"].as_u64(),
            Some(index as u64 + 1),
            "event {index} of {events:#?}"
        );
    }
}

fn exec_job(program: &str) -> Value {
    json!([{"OP_ID": "OP_EXEC", "argv": [program]}])
}

/// One job's `job.*` events, each as `type:old>new`.
fn job_story(events: &[Value], id: u64) -> Vec<String> {
    events
        .iter()
        .filter(|event| event["id"].as_u64() == Some(id))
        .map(|event| match event["type"].as_str().unwrap() {
            "job.status" => format!(
                "status:{}>{}",
                event["old"].as_str().unwrap(),
                event["new"].as_str().unwrap()
            ),
            kind => kind.to_owned(),
        })
        .collect()
}

#[test]
fn a_job_says_every_step_once_and_a_held_watch_wakes_on_it() {
    let cluster = Cluster::start();
    let mut watcher = cluster.client();
    // Held from now on: answered by the submission's event.
    watcher
        .send("WatchEvents", json!([null, ["job."], 30]))
        .expect("send");
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    let id = cluster.submit(exec_job("/bin/true"));
    let answer = watcher.read_response().expect("an answer").expect("events");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the held watch took {:?}",
        started.elapsed()
    );
    assert_eq!(answer["events"][0]["type"], "job.submitted");
    assert_eq!(answer["events"][0]["id"], id);
    assert_eq!(cluster.wait_final(id), "success");
    let mut client = cluster.client();
    wait_until("the job's end is told", DEADLINE, || {
        job_story(&events_after(&mut client, "WatchEvents", 0), id)
            .contains(&"job.finished".to_owned())
    });
    let events = events_after(&mut client, "WatchEvents", 0);
    assert_numbered(&events);
    assert_eq!(events[0]["type"], "queue.started");
    assert_eq!(
        job_story(&events, id),
        [
            "job.submitted",
            "status:queued>waiting",
            "status:waiting>running",
            "status:running>success",
            "job.finished"
        ]
    );
    let finished = events
        .iter()
        .find(|event| event["type"] == "job.finished")
        .unwrap();
    assert_eq!(finished["status"], "success");
    assert_eq!(finished["opcodes"], json!(["success"]));
    // Type prefixes choose; a zero timeout answers at once.
    let answer = client.ok("WatchEvents", json!([0, ["job.fin", "queue."], 0]));
    assert_eq!(
        kinds(answer["events"].as_array().unwrap()),
        ["queue.started", "job.finished"]
    );
    // Archiving and the drain flag are events too.
    client.ok("ArchiveJob", json!([id]));
    client.ok("SetDrainFlag", json!([true]));
    // luxid's events are readable once synced, a moment after the reply.
    let last = events.last().unwrap()["seq"].as_u64().unwrap();
    let mut later = Vec::new();
    wait_until("both are told", DEADLINE, || {
        later = events_after(&mut client, "WatchEvents", last);
        later.len() >= 2
    });
    assert_eq!(kinds(&later), ["job.archived", "queue.drain"]);
    assert_eq!(later[1]["drained"], true);
}

#[test]
fn a_held_watch_times_out_empty_and_bad_cursors_are_refused() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let started = Instant::now();
    let answer = client.ok("WatchEvents", json!([null, ["nothing."], 0.3]));
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(answer["events"], json!([]));
    let last = answer["next"].as_u64().unwrap();
    let (class, _) = client.fails("WatchEvents", json!([last + 5, null, 0]));
    assert_eq!(class, "EventsFuture");
    for (args, says) in [
        (json!([-1, null, 0]), "argument 1"),
        (json!([0, "job.", 0]), "argument 2"),
        (json!([0, null, "soon"]), "argument 3"),
        (json!([0, null]), "takes 3 arguments"),
    ] {
        let (class, message) = client.fails("WatchEvents", args.clone());
        assert_eq!(class, "GenericError", "{args}");
        assert!(message.contains(says), "{args}: {message}");
    }
    // The daemon serves on.
    assert!(client.ok("WatchEvents", json!([0, null, 0]))["events"].is_array());
    let mut wconfd = cluster.wconfd_client();
    let (class, _) = wconfd.fails("watchEvents", json!([1_000_000, null, 0]));
    assert_eq!(class, "EventsFuture");
}

#[test]
fn luxid_says_after_a_kill_what_its_jobs_did_meanwhile() {
    let mut cluster = Cluster::start();
    let id = cluster.submit(json!([{"OP_ID": "OP_EXEC", "argv": ["/bin/sleep", "1"]}]));
    wait_until("the job runs", DEADLINE, || cluster.status(id) == "running");
    cluster.luxid.kill9();
    // The job ends while luxid is down.
    std::thread::sleep(Duration::from_millis(1500));
    cluster.luxid = Luxid::start_on(cluster.root());
    assert_eq!(cluster.wait_final(id), "success");
    let mut client = cluster.client();
    let mut events = Vec::new();
    wait_until("the end is told", DEADLINE, || {
        events = events_after(&mut client, "WatchEvents", 0);
        job_story(&events, id).contains(&"job.finished".to_owned())
    });
    assert_numbered(&events);
    assert_eq!(
        job_story(&events, id),
        [
            "job.submitted",
            "status:queued>waiting",
            "status:waiting>running",
            "status:running>success",
            "job.finished"
        ],
        "{events:#?}"
    );
    assert_eq!(
        kinds(&events)
            .iter()
            .filter(|kind| *kind == "queue.started")
            .count(),
        2
    );
}

#[test]
fn wconfd_tells_grants_waits_releases_deaths_and_config_writes() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let mut holder = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    let waiter = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    try_update(&mut client, &holder, &[("node/n1", "exclusive")]);
    update_waiting(&mut client, &waiter, 0, &[("node/n1", "shared")]);
    holder.kill9();
    wait_until("the waiter gets the lock", DEADLINE, || {
        kinds(&events_after(&mut client, "watchEvents", 0)).contains(&"owner.dead".to_owned())
            && client.ok("listLocks", json!([waiter.owner()])) != json!([])
    });
    client.ok("lockConfig", json!([waiter.owner(), false]));
    let mut config = client.ok("readConfig", json!([]));
    config["cluster"]["cluster_name"] = json!("events.example.com");
    client.ok("writeConfig", json!([waiter.owner(), config]));
    let events = events_after(&mut client, "watchEvents", 0);
    assert_numbered(&events);
    let told: Vec<String> = events
        .iter()
        .map(|event| {
            format!(
                "{} {}{}",
                event["type"].as_str().unwrap(),
                event["owner"].as_str().unwrap_or(""),
                event
                    .get("via")
                    .map(|via| format!(" {}", via.as_str().unwrap()))
                    .unwrap_or_default()
            )
        })
        .collect();
    let expected = [
        "lock.granted 1 direct",
        "lock.waiting 2",
        "owner.dead 1",
        "lock.released 1",
        "lock.granted 2 waiting",
        "lock.granted 2 direct",
        "config.written ",
    ];
    assert_eq!(told, expected, "{events:#?}");
    assert_eq!(events[0]["entries"], json!([["node/n1", "exclusive"]]));
    assert_eq!(events[1]["blockers"], json!(["1"]));
    assert_eq!(events[2]["held"], json!([["node/n1", "exclusive"]]));
    assert_eq!(events[4]["entries"], json!([["node/n1", "shared"]]));
    assert!(events[6]["serial_no"].as_u64().unwrap() > 0);
}

#[test]
fn wconfd_gets_back_from_its_journal_what_its_event_files_lost() {
    let mut wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let owners: Vec<OwnerProcess> = (1..=5)
        .map(|id| OwnerProcess::spawn(&wconfd.livelock_dir(), id))
        .collect();
    for (index, owner) in owners.iter().enumerate() {
        try_update(
            &mut client,
            owner,
            &[(&format!("node/n{index}"), "exclusive")],
        );
    }
    let before = events_after(&mut client, "watchEvents", 0);
    assert_eq!(before.len(), 5);
    wconfd.kill9();
    // A crash of the machine took the last two lines the files had (they
    // were never synced), or the files never had them (they are written
    // in batches): the journal still holds them.
    let dir = wconfd.root().path().join("events/wconfd");
    let segment = fs::read_dir(&dir)
        .expect("the segments")
        .map(|entry| entry.expect("an entry").path())
        .max();
    if let Some(segment) = segment {
        let text = fs::read_to_string(&segment).expect("the segment");
        let kept: Vec<&str> = text.lines().take(3).collect();
        fs::write(&segment, format!("{}\n", kept.join("\n"))).expect("cut");
    }
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    let after = events_after(&mut client, "watchEvents", 0);
    assert_eq!(after, before, "the same events, the same numbers");
    // And on from there without a gap.
    let owner = OwnerProcess::spawn(&wconfd.livelock_dir(), 9);
    try_update(&mut client, &owner, &[("node/n9", "shared")]);
    let all = events_after(&mut client, "watchEvents", 0);
    assert_numbered(&all);
    assert_eq!(all.len(), 6);
}

#[test]
fn a_cursor_older_than_what_is_kept_is_expired_and_names_the_first_kept() {
    // A sequence whose first kept event is 1001 (the ones before went with
    // the retention).
    let root = crate::daemon::Root::new();
    let dir = root.path().join("events/wconfd");
    fs::create_dir_all(&dir).expect("the events directory");
    let lines: String = (1001..=1003)
        .map(|seq| {
            format!(
                "{}\n",
                json!({"seq": seq, "ts": [1_796_000_000, 0], "type": "config.written", "serial_no": seq})
            )
        })
        .collect();
    fs::write(dir.join(format!("{:020}.events", 1001)), lines).expect("a segment");
    let wconfd = Wconfd::restart_on(&root);
    let mut client = wconfd.client();
    let (class, message) = client.fails("watchEvents", json!([5, null, 0]));
    assert_eq!(class, "EventsExpired", "{message}");
    let answer = client.call("watchEvents", json!([5, null, 0]));
    assert_eq!(answer, Err(("EventsExpired".to_owned(), json!([1001]))));
    // From just before the first kept: everything kept, and on without a
    // gap.
    let owner = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    try_update(&mut client, &owner, &[("node/n1", "shared")]);
    let events = events_after(&mut client, "watchEvents", 1000);
    let seqs: Vec<u64> = events
        .iter()
        .map(|event| event["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1001, 1002, 1003, 1004]);
    assert_eq!(events[3]["type"], "lock.granted");
}

/// The files are written in batches, and a snapshot (which cuts the
/// journal) writes what waits first: events made after a snapshot and
/// before the next batch are still in the journal for a start after
/// kill -9, numbered on without a gap.
#[test]
fn events_made_between_a_snapshot_and_the_next_batch_survive_kill_9() {
    let mut wconfd = Wconfd::start_with_settings("[wconfd]\nsnapshot_journal_bytes_max = 65536\n");
    let mut client = wconfd.client();
    let owner = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    // Enough updates for several snapshots (each record is a few hundred
    // bytes), ending with a few after the last.
    for round in 0..600 {
        let lock = format!("node/n{round}");
        try_update(&mut client, &owner, &[(&lock, "exclusive")]);
        try_update(&mut client, &owner, &[(&lock, "release")]);
    }
    let before = events_after(&mut client, "watchEvents", 0);
    assert_eq!(before.len(), 1_200);
    wconfd.kill9();
    let wconfd = Wconfd::restart_on(wconfd.root());
    let mut client = wconfd.client();
    let after = events_after(&mut client, "watchEvents", 0);
    assert_eq!(after, before, "the same events, the same numbers");
    assert_numbered(&after);
}
