//! Every wconfd method over the wire, with exact answers: the worked
//! examples of LOCKS.md, the listings, the lock operations, `awaitLocks`,
//! the config half, and the error classes and texts. Owners are real
//! processes holding their livelocks ([`OwnerProcess`]).

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::daemon::{
    Client, OwnerProcess, Wconfd, list_locks, pending, request, status, try_update, update_waiting,
};

/// wconfd on a fresh root, a client, and jobs 1..=`jobs` (J1 is `jobs[0]`).
fn start(jobs: u64) -> (Wconfd, Client, Vec<OwnerProcess>) {
    let wconfd = Wconfd::start();
    let client = wconfd.client();
    let owners = (1..=jobs)
        .map(|id| OwnerProcess::spawn(&wconfd.livelock_dir(), id))
        .collect();
    (wconfd, client, owners)
}

/// The wire form of a list of owners.
fn owners(list: &[&OwnerProcess]) -> Value {
    Value::Array(list.iter().map(|owner| owner.owner()).collect())
}

/// The whole lock table must be this (`listAllLocksOwners`).
fn assert_table(client: &mut Client, expected: Value) {
    assert_eq!(client.ok("listAllLocksOwners", json!([])), expected);
}

// ----- echo and the empty state -----

#[test]
fn echo_answers_its_argument() {
    let (_wconfd, mut client, _) = start(0);
    assert_eq!(client.ok("echo", json!(["hello"])), json!("hello"));
    // Control characters (the ETX among them) are escaped in the answer.
    let odd = "h\u{e9} \u{1F600} \u{3} \n \"";
    assert_eq!(client.ok("echo", json!([odd])), json!(odd));
    // `version` is accepted and ignored; the answer never carries one.
    client
        .send_raw(b"{\"method\": \"echo\", \"args\": [\"v\"], \"version\": 3000000}\n\x03")
        .expect("send");
    assert_eq!(client.read_response().expect("answer"), Ok(json!("v")));
}

#[test]
fn a_fresh_root_has_no_locks_and_no_waiters() {
    let (_wconfd, mut client, jobs) = start(1);
    assert_eq!(client.ok("listAllLocks", json!([])), json!([]));
    assert_table(&mut client, json!([]));
    assert_eq!(status(&mut client), json!([[], []]));
    assert_eq!(list_locks(&mut client, &jobs[0]), json!([]));
    assert!(!pending(&mut client, &jobs[0]));
}

// ----- the worked examples of LOCKS.md -----

#[test]
fn example_1_two_owners_share_the_bgl() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("cluster/BGL", "shared")]),
        json!([])
    );
    assert_eq!(
        try_update(&mut client, j2, &[("cluster/BGL", "shared")]),
        json!([])
    );
    assert_table(
        &mut client,
        json!([
            ["cluster/[lockset]", []],
            [
                "cluster/BGL",
                [[j1.owner(), "shared"], [j2.owner(), "shared"]]
            ]
        ]),
    );
}

#[test]
fn example_2_a_held_member_blocks_its_group() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("instance/a", "exclusive")]),
        json!([])
    );
    for mode in ["shared", "exclusive"] {
        assert_eq!(
            try_update(&mut client, j2, &[("instance/[lockset]", mode)]),
            owners(&[j1])
        );
    }
    assert_eq!(list_locks(&mut client, j2), json!([]));
}

#[test]
fn example_3_acquiring_below_the_highest_held_lock_is_an_order_violation() {
    let (_wconfd, mut client, jobs) = start(1);
    let j1 = &jobs[0];
    let held = [
        ("cluster/BGL", "shared"),
        ("instance/a", "exclusive"),
        ("node/n1", "exclusive"),
    ];
    assert_eq!(try_update(&mut client, j1, &held), json!([]));
    let (class, text) = client.fails(
        "tryUpdateLocks",
        json!([j1.owner(), request(&[("instance/b", "exclusive")])]),
    );
    assert_eq!(class, "GenericError");
    assert!(text.starts_with("Order violation"), "{text}");
    assert!(
        text.contains("instance/b") && text.contains("node/n1"),
        "{text}"
    );
    assert_eq!(list_locks(&mut client, j1), request(&held));
}

#[test]
fn example_4_members_under_a_shared_and_an_exclusive_group() {
    let (_wconfd, mut client, jobs) = start(1);
    let j1 = &jobs[0];
    assert_eq!(
        try_update(&mut client, j1, &[("instance/[lockset]", "shared")]),
        json!([])
    );
    let (class, text) = client.fails(
        "tryUpdateLocks",
        json!([j1.owner(), request(&[("instance/a", "exclusive")])]),
    );
    assert_eq!(class, "GenericError");
    assert!(text.starts_with("Order violation"), "{text}");
    assert!(text.contains("instance/a"), "{text}");

    assert_eq!(client.ok("freeLocks", json!([j1.owner()])), json!([]));
    assert_eq!(
        try_update(
            &mut client,
            j1,
            &[
                ("instance/[lockset]", "exclusive"),
                ("node/n1", "exclusive")
            ]
        ),
        json!([])
    );
    // Below node/n1, but under the exclusively held group.
    assert_eq!(
        try_update(&mut client, j1, &[("instance/z", "shared")]),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[
            ("instance/[lockset]", "exclusive"),
            ("instance/z", "shared"),
            ("node/n1", "exclusive")
        ])
    );
}

#[test]
fn example_5_the_order_check_uses_the_holdings_before_the_request() {
    let (_wconfd, mut client, jobs) = start(1);
    let j1 = &jobs[0];
    assert_eq!(
        try_update(&mut client, j1, &[("node/n1", "exclusive")]),
        json!([])
    );
    let (class, text) = client.fails(
        "tryUpdateLocks",
        json!([
            j1.owner(),
            request(&[("node/n1", "release"), ("instance/a", "exclusive")])
        ]),
    );
    assert_eq!(class, "GenericError");
    assert!(text.starts_with("Order violation"), "{text}");
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("node/n1", "exclusive")])
    );
    // In two calls it works.
    assert_eq!(
        try_update(&mut client, j1, &[("node/n1", "release")]),
        json!([])
    );
    assert_eq!(
        try_update(&mut client, j1, &[("instance/a", "exclusive")]),
        json!([])
    );
}

#[test]
fn example_6_only_the_highest_held_lock_may_be_upgraded() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    let held = [("cluster/BGL", "shared"), ("instance/a", "shared")];
    assert_eq!(try_update(&mut client, j1, &held), json!([]));
    assert_eq!(
        try_update(&mut client, j2, &[("instance/a", "shared")]),
        json!([])
    );
    // Allowed, blocked only by the other holder of instance/a.
    assert_eq!(
        try_update(&mut client, j1, &[("instance/a", "exclusive")]),
        owners(&[j2])
    );
    let (class, text) = client.fails(
        "tryUpdateLocks",
        json!([j1.owner(), request(&[("cluster/BGL", "exclusive")])]),
    );
    assert_eq!(class, "GenericError");
    assert!(text.starts_with("Order violation"), "{text}");
    assert_eq!(client.ok("freeLocks", json!([j2.owner()])), json!([]));
    assert_eq!(
        try_update(&mut client, j1, &[("instance/a", "exclusive")]),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("cluster/BGL", "shared"), ("instance/a", "exclusive")])
    );
}

#[test]
fn example_7_waiters_are_granted_by_priority_and_notified() {
    let (_wconfd, mut client, mut jobs) = start(3);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("instance/a", "exclusive")]),
        json!([])
    );
    let blockers = owners(&[&jobs[0]]);
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("instance/a", "exclusive")]),
        blockers
    );
    assert_eq!(
        update_waiting(&mut client, &jobs[2], -10, &[("instance/a", "shared")]),
        blockers
    );
    assert!(pending(&mut client, &jobs[1]) && pending(&mut client, &jobs[2]));

    assert_eq!(client.ok("freeLocks", json!([jobs[0].owner()])), json!([]));
    // J3 (more urgent) is granted and told; J2 now waits behind J3.
    jobs[2].wait_for_hups(1, crate::daemon::DEADLINE);
    assert_eq!(
        list_locks(&mut client, &jobs[2]),
        request(&[("instance/a", "shared")])
    );
    assert!(!pending(&mut client, &jobs[2]));
    assert!(pending(&mut client, &jobs[1]));
    assert_eq!(jobs[1].hups(), 0, "only J3 is notified");
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("instance/a", "exclusive")]),
        owners(&[&jobs[2]]),
        "J2 is blocked by J3 now"
    );

    assert_eq!(
        try_update(&mut client, &jobs[2], &[("instance/a", "release")]),
        json!([])
    );
    jobs[1].wait_for_hups(1, crate::daemon::DEADLINE);
    assert_eq!(
        list_locks(&mut client, &jobs[1]),
        request(&[("instance/a", "exclusive")])
    );
    assert!(!pending(&mut client, &jobs[1]));
    assert_eq!(jobs[1].hups(), 1);
    assert_eq!(jobs[2].hups(), 1);
    assert_eq!(jobs[0].hups(), 0);
}

#[test]
fn example_8_a_compatible_request_is_granted_while_others_wait() {
    let (_wconfd, mut client, jobs) = start(4);
    let (j2, j3, j4) = (&jobs[1], &jobs[2], &jobs[3]);
    assert_eq!(
        try_update(&mut client, j3, &[("instance/a", "shared")]),
        json!([])
    );
    assert_eq!(
        update_waiting(&mut client, j2, 0, &[("instance/a", "exclusive")]),
        owners(&[j3])
    );
    assert_eq!(
        try_update(&mut client, j4, &[("instance/a", "shared")]),
        json!([])
    );
    assert_table(
        &mut client,
        json!([
            ["instance/[lockset]", []],
            [
                "instance/a",
                [[j3.owner(), "shared"], [j4.owner(), "shared"]]
            ]
        ]),
    );
    assert!(pending(&mut client, j2));
}

#[test]
fn example_9_a_pending_owner_cannot_update_and_loses_its_request_when_freeing() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(
            &mut client,
            j1,
            &[("instance/a", "exclusive"), ("node/n1", "exclusive")]
        ),
        json!([])
    );
    assert_eq!(
        try_update(&mut client, j2, &[("instance/b", "shared")]),
        json!([])
    );
    let wanted = [("instance/b", "shared"), ("node/n1", "exclusive")];
    let make_pending = |client: &mut Client| {
        assert_eq!(update_waiting(client, j2, 0, &wanted), owners(&[j1]));
        assert!(pending(client, j2));
    };
    make_pending(&mut client);

    let expected_error = (
        "GenericError".to_owned(),
        "cannot update locks while having pending requests".to_owned(),
    );
    assert_eq!(
        client.fails(
            "tryUpdateLocks",
            json!([j2.owner(), request(&[("node/n2", "shared")])])
        ),
        expected_error
    );
    assert_eq!(
        client.fails(
            "updateLocksWaiting",
            json!([j2.owner(), 0, request(&[("node/n1", "shared")])])
        ),
        expected_error
    );
    // The same request again: its current blockers, no change.
    let before = status(&mut client);
    assert_eq!(update_waiting(&mut client, j2, 0, &wanted), owners(&[j1]));
    assert_eq!(status(&mut client), before);

    assert_eq!(
        client.ok("freeLocksLevel", json!([j2.owner(), "node"])),
        json!([])
    );
    assert!(!pending(&mut client, j2));
    assert_eq!(
        list_locks(&mut client, j2),
        request(&[("instance/b", "shared")])
    );
    make_pending(&mut client);
    assert_eq!(
        client.ok("intersectLocks", json!([j2.owner(), ["instance/b"]])),
        json!([])
    );
    assert!(!pending(&mut client, j2));
    assert_eq!(
        list_locks(&mut client, j2),
        request(&[("instance/b", "shared")])
    );
    make_pending(&mut client);
    assert_eq!(client.ok("freeLocks", json!([j2.owner()])), json!([]));
    assert!(!pending(&mut client, j2));
    assert_eq!(list_locks(&mut client, j2), json!([]));
    assert_eq!(status(&mut client)[1], json!([]));
}

#[test]
fn example_10_opportunistic_unions_take_what_is_free() {
    let (_wconfd, mut client, jobs) = start(5);
    let (j1, j5) = (&jobs[0], &jobs[4]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/n2", "exclusive")]),
        json!([])
    );
    let wanted = json!([
        ["node/n1", "exclusive"],
        ["node/n2", "exclusive"],
        ["node/n3", "exclusive"]
    ]);
    assert_eq!(
        client.ok(
            "guardedOpportunisticLockUnion",
            json!([3, j5.owner(), wanted])
        ),
        json!([])
    );
    assert_eq!(list_locks(&mut client, j5), json!([]));

    let mut acquired: Vec<String> =
        serde_json::from_value(client.ok("opportunisticLockUnion", json!([j5.owner(), wanted])))
            .expect("a list of locks");
    acquired.sort();
    assert_eq!(acquired, ["node/n1", "node/n3"]);
    assert_eq!(
        list_locks(&mut client, j5),
        request(&[("node/n1", "exclusive"), ("node/n3", "exclusive")])
    );
    assert_eq!(
        client.ok(
            "guardedOpportunisticLockUnion",
            json!([3, j5.owner(), wanted])
        ),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, j5),
        request(&[("node/n1", "exclusive"), ("node/n3", "exclusive")])
    );
}

#[test]
fn example_11_repeating_a_granted_update_changes_nothing_and_notifies_nobody() {
    let (_wconfd, mut client, mut jobs) = start(2);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("instance/a", "exclusive")]),
        json!([])
    );
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("instance/a", "shared")]),
        owners(&[&jobs[0]])
    );
    let before = status(&mut client);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("instance/a", "exclusive")]),
        json!([])
    );
    assert_eq!(status(&mut client), before);
    assert_eq!(jobs[0].hups(), 0);
    assert_eq!(jobs[1].hups(), 0);
}

// ----- listings -----

#[test]
fn listings_have_ganetis_shapes() {
    let (_wconfd, mut client, jobs) = start(3);
    let (j1, j2, j3) = (&jobs[0], &jobs[1], &jobs[2]);
    assert_eq!(
        try_update(
            &mut client,
            j2,
            &[("cluster/BGL", "shared"), ("node/n1", "shared")]
        ),
        json!([])
    );
    assert_eq!(
        try_update(
            &mut client,
            j1,
            &[
                ("node/n1", "shared"),
                ("cluster/BGL", "shared"),
                ("instance/a", "exclusive"),
                ("cluster/config", "shared"),
            ]
        ),
        json!([])
    );
    // Sent out of lock order; listed exactly as sent.
    let waiting = [("instance/b", "shared"), ("instance/a", "shared")];
    assert_eq!(update_waiting(&mut client, j3, 5, &waiting), owners(&[j1]));

    assert_eq!(
        list_locks(&mut client, j1),
        request(&[
            ("cluster/BGL", "shared"),
            ("instance/a", "exclusive"),
            ("node/n1", "shared"),
            ("cluster/config", "shared"),
        ])
    );
    assert_eq!(
        client.ok("listAllLocks", json!([])),
        json!([
            "cluster/[lockset]",
            "cluster/BGL",
            "instance/[lockset]",
            "instance/a",
            "node/[lockset]",
            "node/n1",
            "cluster/config"
        ])
    );
    let table = json!([
        ["cluster/[lockset]", []],
        [
            "cluster/BGL",
            [[j1.owner(), "shared"], [j2.owner(), "shared"]]
        ],
        ["instance/[lockset]", []],
        ["instance/a", [[j1.owner(), "exclusive"]]],
        ["node/[lockset]", []],
        ["node/n1", [[j1.owner(), "shared"], [j2.owner(), "shared"]]],
        ["cluster/config", [[j1.owner(), "shared"]]]
    ]);
    assert_table(&mut client, table.clone());
    assert_eq!(
        status(&mut client),
        json!([table, [[5, j3.owner(), request(&waiting)]]])
    );
}

#[test]
fn named_owners_sort_before_jobs_and_jobs_by_number() {
    let wconfd = Wconfd::start();
    let mut client = wconfd.client();
    let j10 = OwnerProcess::spawn(&wconfd.livelock_dir(), 10);
    let j9 = OwnerProcess::spawn(&wconfd.livelock_dir(), 9);
    // A named owner on J9's livelock and pid: a different owner.
    let master = json!(["master", j9.path(), j9.pid()]);
    for owner in [j10.owner(), master.clone(), j9.owner()] {
        assert_eq!(
            client.ok(
                "tryUpdateLocks",
                json!([owner, request(&[("node/n1", "shared")])])
            ),
            json!([])
        );
    }
    assert_eq!(
        try_update(
            &mut client,
            &OwnerProcess::spawn(&wconfd.livelock_dir(), 1),
            &[("node/n1", "exclusive")]
        ),
        json!([master, j9.owner(), j10.owner()])
    );
}

// ----- lock operations -----

#[test]
fn try_update_locks_is_all_or_nothing() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j2, &[("node/b", "shared")]),
        json!([])
    );
    assert_eq!(
        try_update(
            &mut client,
            j1,
            &[("node/a", "exclusive"), ("node/b", "exclusive")]
        ),
        owners(&[j2])
    );
    assert_eq!(list_locks(&mut client, j1), json!([]));
    assert!(!pending(&mut client, j1), "a blocked try is not queued");
    // Acquire and release in one request, identical duplicates, empty and
    // pure-release requests.
    assert_eq!(
        try_update(
            &mut client,
            j1,
            &[
                ("node/a", "exclusive"),
                ("node/a", "exclusive"),
                ("node/c", "shared")
            ]
        ),
        json!([])
    );
    assert_eq!(
        try_update(
            &mut client,
            j1,
            &[("node/a", "release"), ("node/d", "exclusive")]
        ),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("node/c", "shared"), ("node/d", "exclusive")])
    );
    assert_eq!(try_update(&mut client, j1, &[]), json!([]));
    assert_eq!(
        try_update(&mut client, j1, &[("node/zz", "release")]),
        json!([])
    );
    // The same lock twice with different modes.
    let (class, text) = client.fails(
        "tryUpdateLocks",
        json!([
            j1.owner(),
            request(&[("node/e", "shared"), ("node/e", "exclusive")])
        ]),
    );
    assert_eq!(class, "GenericError");
    assert!(text.contains("node/e"), "{text}");
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("node/c", "shared"), ("node/d", "exclusive")])
    );
}

#[test]
fn update_locks_waiting_keeps_the_first_priority_and_answers_current_blockers() {
    let (_wconfd, mut client, jobs) = start(3);
    let (j1, j2, j3) = (&jobs[0], &jobs[1], &jobs[2]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/a", "exclusive")]),
        json!([])
    );
    assert_eq!(
        try_update(&mut client, j3, &[("node/b", "shared")]),
        json!([])
    );
    let wanted = [("node/b", "exclusive"), ("node/a", "exclusive")];
    assert_eq!(
        update_waiting(&mut client, j2, 3, &wanted),
        owners(&[j1, j3])
    );
    // The identical request with another priority: nothing changes.
    assert_eq!(
        update_waiting(&mut client, j2, -20, &wanted),
        owners(&[j1, j3])
    );
    assert_eq!(
        status(&mut client)[1],
        json!([[3, j2.owner(), request(&wanted)]])
    );
    // A granted request needs no waiting; an unblocked one is not queued.
    assert_eq!(client.ok("freeLocks", json!([j1.owner()])), json!([]));
    assert!(pending(&mut client, j2));
    assert_eq!(update_waiting(&mut client, j2, 3, &wanted), owners(&[j3]));
    assert_eq!(
        update_waiting(&mut client, j1, 0, &[("node/c", "shared")]),
        json!([])
    );
    assert!(!pending(&mut client, j1));
    assert_eq!(client.ok("freeLocks", json!([j3.owner()])), json!([]));
    assert!(!pending(&mut client, j2));
    assert_eq!(
        list_locks(&mut client, j2),
        request(&[("node/a", "exclusive"), ("node/b", "exclusive")])
    );
}

#[test]
fn free_locks_level_frees_one_level_and_cluster_keeps_the_config_lock() {
    let (_wconfd, mut client, jobs) = start(1);
    let j1 = &jobs[0];
    let all = [
        ("cluster/BGL", "shared"),
        ("instance/[lockset]", "shared"),
        ("instance/a", "shared"),
        ("node/n1", "exclusive"),
        ("node-res/n1", "exclusive"),
        ("cluster/config", "exclusive"),
    ];
    assert_eq!(try_update(&mut client, j1, &all), json!([]));
    assert_eq!(
        client.ok("freeLocksLevel", json!([j1.owner(), "instance"])),
        json!([])
    );
    assert_eq!(
        client.ok("freeLocksLevel", json!([j1.owner(), "cluster"])),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[
            ("node/n1", "exclusive"),
            ("node-res/n1", "exclusive"),
            ("cluster/config", "exclusive"),
        ])
    );
    assert_eq!(
        client.ok("freeLocksLevel", json!([j1.owner(), "config"])),
        json!([])
    );
    assert_eq!(
        client.ok("freeLocksLevel", json!([j1.owner(), "network"])),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("node/n1", "exclusive"), ("node-res/n1", "exclusive")])
    );
}

#[test]
fn down_grade_locks_level_shares_a_level_and_grants_shared_waiters() {
    let (_wconfd, mut client, mut jobs) = start(2);
    assert_eq!(
        try_update(
            &mut client,
            &jobs[0],
            &[
                ("instance/a", "exclusive"),
                ("node/n1", "exclusive"),
                ("node/n2", "shared")
            ]
        ),
        json!([])
    );
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("node/n1", "shared")]),
        owners(&[&jobs[0]])
    );
    assert_eq!(
        client.ok("downGradeLocksLevel", json!([jobs[0].owner(), "node"])),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, &jobs[0]),
        request(&[
            ("instance/a", "exclusive"),
            ("node/n1", "shared"),
            ("node/n2", "shared")
        ])
    );
    jobs[1].wait_for_hups(1, crate::daemon::DEADLINE);
    assert_eq!(
        list_locks(&mut client, &jobs[1]),
        request(&[("node/n1", "shared")])
    );
    assert_eq!(jobs[0].hups(), 0);
}

#[test]
fn intersect_locks_keeps_only_the_listed_locks() {
    let (_wconfd, mut client, jobs) = start(1);
    let j1 = &jobs[0];
    assert_eq!(
        try_update(
            &mut client,
            j1,
            &[
                ("cluster/BGL", "shared"),
                ("instance/a", "exclusive"),
                ("node/n1", "shared")
            ]
        ),
        json!([])
    );
    assert_eq!(
        client.ok(
            "intersectLocks",
            json!([j1.owner(), ["node/n1", "cluster/BGL", "node/n9"]])
        ),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("cluster/BGL", "shared"), ("node/n1", "shared")])
    );
    assert_eq!(
        client.ok("intersectLocks", json!([j1.owner(), []])),
        json!([])
    );
    assert_eq!(list_locks(&mut client, j1), json!([]));
}

#[test]
fn opportunistic_union_never_lowers_a_lock_and_takes_nothing_while_pending() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/a", "exclusive")]),
        json!([])
    );
    assert_eq!(
        client.ok(
            "opportunisticLockUnion",
            json!([j1.owner(), [["node/a", "shared"], ["node/b", "shared"]]])
        ),
        json!(["node/b"])
    );
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("node/a", "exclusive"), ("node/b", "shared")])
    );
    assert_eq!(
        update_waiting(&mut client, j2, 0, &[("node/a", "shared")]),
        owners(&[j1])
    );
    assert_eq!(
        client.ok(
            "opportunisticLockUnion",
            json!([j2.owner(), [["node/c", "exclusive"]]])
        ),
        json!([])
    );
    assert_eq!(
        client.ok(
            "guardedOpportunisticLockUnion",
            json!([0, j2.owner(), [["node/c", "exclusive"]]])
        ),
        json!([])
    );
    assert_eq!(list_locks(&mut client, j2), json!([]));
    assert!(pending(&mut client, j2));
}

#[test]
fn guarded_opportunistic_union_takes_all_it_can_when_enough() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/n2", "shared")]),
        json!([])
    );
    let wanted = json!([
        ["node/n3", "shared"],
        ["node/n2", "exclusive"],
        ["node/n1", "shared"]
    ]);
    assert_eq!(
        client.ok(
            "guardedOpportunisticLockUnion",
            json!([2, j2.owner(), wanted])
        ),
        json!(["node/n1", "node/n3"])
    );
    assert_eq!(
        list_locks(&mut client, j2),
        request(&[("node/n1", "shared"), ("node/n3", "shared")])
    );
}

#[test]
fn cleanup_locks_frees_owners_whose_livelock_is_gone() {
    let (_wconfd, mut client, jobs) = start(3);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("node/n1", "exclusive")]),
        json!([])
    );
    assert_eq!(
        try_update(&mut client, &jobs[2], &[("node/n2", "shared")]),
        json!([])
    );
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 0, &[("node/n1", "exclusive")]),
        owners(&[&jobs[0]])
    );
    // J1's process lives on, but its livelock is gone: it counts as dead.
    std::fs::remove_file(jobs[0].path()).expect("remove J1's livelock");
    assert_eq!(client.ok("cleanupLocks", json!([])), json!([]));
    assert_eq!(list_locks(&mut client, &jobs[0]), json!([]));
    jobs[1].wait_for_hups(1, crate::daemon::DEADLINE);
    assert_table(
        &mut client,
        json!([
            ["node/[lockset]", []],
            ["node/n1", [[jobs[1].owner(), "exclusive"]]],
            ["node/n2", [[jobs[2].owner(), "shared"]]]
        ]),
    );
    assert_eq!(client.ok("cleanupLocks", json!([])), json!([]));
    assert_eq!(status(&mut client)[1], json!([]));
}

// ----- awaitLocks -----

#[test]
fn await_locks_granted_at_once_answers_empty() {
    let (_wconfd, mut client, jobs) = start(1);
    assert_eq!(
        client.ok(
            "awaitLocks",
            json!([
                jobs[0].owner(),
                0,
                request(&[("node/n1", "exclusive")]),
                5000
            ])
        ),
        json!([])
    );
    assert_eq!(
        list_locks(&mut client, &jobs[0]),
        request(&[("node/n1", "exclusive")])
    );
}

#[test]
fn await_locks_times_out_with_its_blockers_and_stays_pending() {
    let (_wconfd, mut client, jobs) = start(3);
    let (j1, j2, j3) = (&jobs[0], &jobs[1], &jobs[2]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/n1", "shared")]),
        json!([])
    );
    assert_eq!(
        try_update(&mut client, j3, &[("node/n1", "shared")]),
        json!([])
    );
    let wanted = request(&[("node/n1", "exclusive")]);
    let started = Instant::now();
    assert_eq!(
        client.ok("awaitLocks", json!([j2.owner(), 4, wanted, 200])),
        owners(&[j1, j3])
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(pending(&mut client, j2));
    assert_eq!(status(&mut client)[1], json!([[4, j2.owner(), wanted]]));
    // Timeout 0 answers at once; the blockers are the current ones.
    assert_eq!(client.ok("freeLocks", json!([j1.owner()])), json!([]));
    assert_eq!(
        client.ok("awaitLocks", json!([j2.owner(), 4, wanted, 0])),
        owners(&[j3])
    );
    assert!(pending(&mut client, j2));
}

#[test]
fn await_locks_is_answered_within_milliseconds_of_the_release() {
    let (wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("instance/a", "exclusive")]),
        json!([])
    );
    let mut waiter = wconfd.client();
    waiter
        .send(
            "awaitLocks",
            json!([
                j2.owner(),
                0,
                request(&[("instance/a", "exclusive")]),
                10_000
            ]),
        )
        .expect("send");
    crate::daemon::wait_until("J2 waits", crate::daemon::DEADLINE, || {
        pending(&mut client, j2)
    });
    let _timing = crate::daemon::timing_guard();
    let released = Instant::now();
    assert_eq!(client.ok("freeLocks", json!([j1.owner()])), json!([]));
    assert_eq!(waiter.read_response().expect("answer"), Ok(json!([])));
    let latency = released.elapsed();
    assert!(
        latency < Duration::from_millis(100),
        "granted after {latency:?}"
    );
    assert_eq!(
        list_locks(&mut client, j2),
        request(&[("instance/a", "exclusive")])
    );
}

#[test]
fn await_locks_holds_later_requests_of_its_connection() {
    let (wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/n1", "exclusive")]),
        json!([])
    );
    let mut waiter = wconfd.client();
    waiter
        .send(
            "awaitLocks",
            json!([j2.owner(), 0, request(&[("node/n1", "exclusive")]), 10_000]),
        )
        .expect("send");
    waiter.send("echo", json!(["after"])).expect("send");
    crate::daemon::wait_until("J2 waits", crate::daemon::DEADLINE, || {
        pending(&mut client, j2)
    });
    // Other connections are served meanwhile.
    assert_eq!(client.ok("echo", json!(["other"])), json!("other"));
    // Freeing the waiter drops its request: the await is answered with an
    // error, then the echo.
    assert_eq!(client.ok("freeLocks", json!([j2.owner()])), json!([]));
    let (class, _) = waiter
        .read_response()
        .expect("answer")
        .expect_err("the dropped await fails");
    assert_eq!(class, "GenericError");
    assert_eq!(waiter.read_response().expect("answer"), Ok(json!("after")));
}

/// Requests are consumed from the socket only once answered, except when
/// no answer is coming soon: behind a held await, more than the socket
/// buffers hold is taken in (up to the frame limit), so the client can
/// finish sending before it reads.
#[test]
fn requests_pipelined_behind_a_held_await_do_not_block_their_sender() {
    let (wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/n1", "exclusive")]),
        json!([])
    );
    let mut waiter = wconfd.client();
    waiter
        .send(
            "awaitLocks",
            json!([j2.owner(), 0, request(&[("node/n1", "exclusive")]), 10_000]),
        )
        .expect("send");
    crate::daemon::wait_until("J2 waits", crate::daemon::DEADLINE, || {
        pending(&mut client, j2)
    });
    // 2 MB in 40 requests: far more than a Unix socket buffers. The sends
    // time out (and fail) if the daemon stops taking bytes in.
    let text = |i: usize| format!("{i:02}{}", "y".repeat(50_000));
    for i in 0..40 {
        waiter
            .send("echo", json!([text(i)]))
            .expect("send behind the await");
    }
    assert_eq!(client.ok("freeLocks", json!([j1.owner()])), json!([]));
    assert_eq!(waiter.read_response().expect("answer"), Ok(json!([])));
    for i in 0..40 {
        assert_eq!(waiter.read_response().expect("answer"), Ok(json!(text(i))));
    }
    assert_eq!(
        list_locks(&mut client, j2),
        request(&[("node/n1", "exclusive")])
    );
}

/// Replies carry no ids: on one connection they leave in the order of the
/// requests, an `awaitLocks` that times out in the same turn included. Sent
/// in one write, so that wconfd reads them in one turn.
#[test]
fn pipelined_replies_leave_in_request_order() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/n1", "exclusive")]),
        json!([])
    );
    let mut frames = Vec::new();
    for (method, args) in [
        ("echo", json!(["one"])),
        (
            "awaitLocks",
            json!([j2.owner(), 0, request(&[("node/n1", "exclusive")]), 1]),
        ),
        ("echo", json!(["two"])),
        ("hasPendingRequest", json!([j2.owner()])),
    ] {
        frames.extend(serde_json::to_vec(&json!({"method": method, "args": args})).unwrap());
        frames.push(0x03);
    }
    client.send_raw(&frames).expect("send");
    assert_eq!(client.read_response().expect("answer"), Ok(json!("one")));
    let blockers = client.read_response().expect("answer").expect("blockers");
    assert_eq!(blockers, json!([j1.owner()]));
    assert_eq!(client.read_response().expect("answer"), Ok(json!("two")));
    assert_eq!(client.read_response().expect("answer"), Ok(json!(true)));
}

#[test]
fn a_re_sent_await_replaces_the_held_one() {
    let (wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    assert_eq!(
        try_update(&mut client, j1, &[("node/n1", "exclusive")]),
        json!([])
    );
    let wanted = request(&[("node/n1", "exclusive")]);
    let mut first = wconfd.client();
    first
        .send("awaitLocks", json!([j2.owner(), 0, wanted, 10_000]))
        .expect("send");
    crate::daemon::wait_until("J2 waits", crate::daemon::DEADLINE, || {
        pending(&mut client, j2)
    });
    // A client that reconnected asks again: the old await is answered
    // with the blockers, the new one is held.
    let mut second = wconfd.client();
    second
        .send("awaitLocks", json!([j2.owner(), 0, wanted, 10_000]))
        .expect("send");
    assert_eq!(first.read_response().expect("answer"), Ok(owners(&[j1])));
    // A different request while pending is an error; the held await stays.
    let (class, text) = client.fails(
        "awaitLocks",
        json!([j2.owner(), 0, request(&[("node/n1", "shared")]), 10_000]),
    );
    assert_eq!(class, "GenericError");
    assert_eq!(text, "cannot update locks while having pending requests");
    assert_eq!(client.ok("freeLocks", json!([j1.owner()])), json!([]));
    assert_eq!(second.read_response().expect("answer"), Ok(json!([])));
    assert_eq!(list_locks(&mut client, j2), wanted);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    let mut batch = Vec::new();
    let mut expected = Vec::new();
    for i in 0..50 {
        let lock = format!("node/p{i:02}");
        let steps = [
            (
                json!({"method": "echo", "args": [format!("e{i}")]}),
                json!(format!("e{i}")),
            ),
            (
                json!({"method": "tryUpdateLocks", "args": [j1.owner(), [[lock, "exclusive"]]]}),
                json!([]),
            ),
            (
                json!({"method": "tryUpdateLocks", "args": [j2.owner(), [[lock, "shared"]]]}),
                owners(&[j1]),
            ),
        ];
        for (request, answer) in steps {
            batch.extend(serde_json::to_vec(&request).expect("JSON"));
            batch.push(0x03);
            expected.push(answer);
        }
    }
    client.send_raw(&batch).expect("send the batch");
    for answer in expected {
        assert_eq!(client.read_response().expect("answer"), Ok(answer));
    }
    assert_eq!(
        list_locks(&mut client, j1).as_array().map(Vec::len),
        Some(50)
    );
}

#[test]
fn member_names_sort_by_bytes() {
    let (_wconfd, mut client, jobs) = start(1);
    let names = [
        "node/\u{fc}",
        "node/a",
        "node/Z",
        "node/a b",
        "node/a/b",
        "node/[lockset]x",
    ];
    let entries: Vec<(&str, &str)> = names.iter().map(|name| (*name, "shared")).collect();
    assert_eq!(try_update(&mut client, &jobs[0], &entries), json!([]));
    let mut sorted = names;
    sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let expected: Vec<(&str, &str)> = sorted.iter().map(|name| (*name, "shared")).collect();
    assert_eq!(list_locks(&mut client, &jobs[0]), request(&expected));
}

// ----- signals and the socket -----

#[test]
fn the_socket_is_private_to_the_group_and_removed_on_sigint() {
    use std::os::unix::fs::PermissionsExt;
    let (mut wconfd, mut client, _) = start(0);
    let socket = wconfd.root().socket();
    let mode = std::fs::metadata(&socket)
        .expect("the socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "socket mode {mode:o}");
    assert_eq!(client.ok("echo", json!(["x"])), json!("x"));
    let pid = nix::unistd::Pid::from_raw(wconfd.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    assert!(client.closed_by_daemon());
    crate::daemon::wait_until("wconfd exits", crate::daemon::DEADLINE, || {
        !wconfd.is_running()
    });
    assert!(!socket.exists(), "the socket was left behind");
    // A clean start after that.
    let wconfd = Wconfd::restart_on(wconfd.root());
    assert_eq!(wconfd.client().ok("echo", json!(["y"])), json!("y"));
}

#[test]
fn the_socket_is_0660_as_soon_as_it_accepts() {
    // A socket made wider and narrowed afterwards would be so for
    // microseconds; strace, where it can trace, widens that to 300 ms by
    // delaying every chmod of the daemon.
    let root = crate::daemon::Root::new();
    let strace = std::path::Path::new("/usr/bin/strace");
    let (mode, traced) = socket_mode_once_accepting(&root, strace.exists().then_some(strace))
        .map(|mode| (mode, true))
        .unwrap_or_else(|| {
            let mode = socket_mode_once_accepting(&root, None).expect("wconfd started");
            (mode, false)
        });
    assert_eq!(
        mode & 0o777,
        0o660,
        "socket mode {mode:o} once it accepts (chmod delayed by strace: {traced})"
    );
}

/// Starts wconfd (under `strace` delaying its chmods, if given), connects
/// as soon as it accepts, and answers the socket's mode then; None if it
/// ended before accepting (strace may not be allowed to trace).
fn socket_mode_once_accepting(
    root: &crate::daemon::Root,
    strace: Option<&std::path::Path>,
) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mut command = match strace {
        Some(strace) => {
            let mut command = std::process::Command::new(strace);
            command
                .args(["-f", "-o", "/dev/null", "-e", "trace=chmod,fchmodat"])
                .args(["-e", "inject=chmod,fchmodat:delay_enter=300000"])
                .arg(env!("CARGO_BIN_EXE_wconfd"));
            command
        }
        None => std::process::Command::new(env!("CARGO_BIN_EXE_wconfd")),
    };
    let mut child = KillTree(
        command
            .arg("--root")
            .arg(root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn wconfd"),
    );
    let mut accepted = false;
    crate::daemon::wait_until("wconfd accepts or ends", crate::daemon::DEADLINE, || {
        accepted = std::os::unix::net::UnixStream::connect(root.socket()).is_ok();
        accepted || child.0.try_wait().expect("try_wait").is_some()
    });
    let mode = std::fs::metadata(root.socket()).map(|metadata| metadata.permissions().mode());
    accepted.then_some(mode.ok()).flatten()
}

/// A process and its children, killed when dropped: killing strace alone
/// would leave the traced wconfd running.
struct KillTree(std::process::Child);

impl Drop for KillTree {
    fn drop(&mut self) {
        let pid = self.0.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children.split_whitespace() {
            if let Ok(child) = child.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn sigusr2_dumps_the_lock_table_and_waiters_to_the_log() {
    let (wconfd, mut client, jobs) = start(2);
    assert_eq!(
        try_update(&mut client, &jobs[0], &[("instance/dumped", "exclusive")]),
        json!([])
    );
    assert_eq!(
        update_waiting(&mut client, &jobs[1], 7, &[("instance/dumped", "shared")]),
        owners(&[&jobs[0]])
    );
    let pid = nix::unistd::Pid::from_raw(wconfd.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2).expect("SIGUSR2");
    crate::daemon::wait_until("the dump is logged", crate::daemon::DEADLINE, || {
        let log = wconfd.log();
        log.contains("lock instance/dumped") && log.contains("priority 7")
    });
    assert_eq!(client.ok("echo", json!(["after"])), json!("after"));
}

// ----- the config half -----

fn config_path(wconfd: &Wconfd) -> std::path::PathBuf {
    wconfd.root().path().join("config.data")
}

#[test]
fn a_fresh_root_has_a_minimal_valid_config() {
    let (wconfd, mut client, _) = start(0);
    let config = client.ok("readConfig", json!([]));
    assert_eq!(config["serial_no"], json!(1));
    assert!(config["mtime"].is_number(), "{config}");
    assert_eq!(client.ok("verifyConfig", json!([])), json!([]));
    assert_eq!(client.ok("flushConfig", json!([])), json!([]));
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(config_path(&wconfd)).expect("config.data"))
            .expect("JSON");
    assert_eq!(on_disk, config);
}

#[test]
fn lock_config_answers_the_config_or_null_when_busy() {
    let (_wconfd, mut client, jobs) = start(3);
    let (j1, j2, j3) = (&jobs[0], &jobs[1], &jobs[2]);
    let config = client.ok("readConfig", json!([]));
    assert_eq!(client.ok("lockConfig", json!([j1.owner(), false])), config);
    assert_eq!(
        client.ok("lockConfig", json!([j2.owner(), true])),
        Value::Null
    );
    assert_eq!(
        client.ok("lockConfig", json!([j2.owner(), false])),
        Value::Null
    );
    // Already held (exclusively covers shared too).
    assert_eq!(client.ok("lockConfig", json!([j1.owner(), false])), config);
    assert_eq!(client.ok("lockConfig", json!([j1.owner(), true])), config);
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("cluster/config", "exclusive")])
    );
    assert_eq!(client.ok("unlockConfig", json!([j1.owner()])), json!([]));
    assert_eq!(list_locks(&mut client, j1), json!([]));
    assert_eq!(client.ok("lockConfig", json!([j2.owner(), true])), config);
    assert_eq!(client.ok("lockConfig", json!([j3.owner(), true])), config);
    assert_eq!(
        client.ok("lockConfig", json!([j1.owner(), false])),
        Value::Null
    );
    assert_table(
        &mut client,
        json!([[
            "cluster/config",
            [[j2.owner(), "shared"], [j3.owner(), "shared"]]
        ]]),
    );
}

#[test]
fn write_config_needs_the_exclusive_config_lock_and_bumps_the_serial() {
    let (wconfd, mut client, jobs) = start(2);
    let (j1, j2) = (&jobs[0], &jobs[1]);
    let original = client.ok("readConfig", json!([]));
    let mut changed = original.clone();
    changed["cluster"] = json!({"cluster_name": "c1"});
    // The client's serial is not trusted: the stored one goes up by one.
    changed["serial_no"] = json!(41);

    for holder in [None, Some(true)] {
        if let Some(shared) = holder {
            assert_eq!(
                client.ok("lockConfig", json!([j1.owner(), shared])),
                original
            );
        }
        let (class, _) = client.fails("writeConfig", json!([j1.owner(), changed]));
        assert_eq!(class, "GenericError");
        assert_eq!(client.ok("readConfig", json!([])), original);
    }
    assert_eq!(client.ok("unlockConfig", json!([j1.owner()])), json!([]));
    assert_eq!(
        client.ok("lockConfig", json!([j1.owner(), false])),
        original
    );
    let (class, _) = client.fails("writeConfig", json!([j2.owner(), changed]));
    assert_eq!(class, "GenericError");

    let inode_before = std::fs::metadata(config_path(&wconfd))
        .expect("config.data")
        .ino();
    assert_eq!(
        client.ok("writeConfig", json!([j1.owner(), changed])),
        json!([])
    );
    let written = client.ok("readConfig", json!([]));
    assert_eq!(written["serial_no"], json!(2));
    assert!(
        written["mtime"].as_f64() > original["mtime"].as_f64(),
        "{written}"
    );
    assert_eq!(written["cluster"], json!({"cluster_name": "c1"}));
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(config_path(&wconfd)).expect("config.data"))
            .expect("JSON");
    assert_eq!(on_disk, written);
    let inode_after = std::fs::metadata(config_path(&wconfd))
        .expect("config.data")
        .ino();
    assert_ne!(
        inode_before, inode_after,
        "config.data is replaced, not rewritten"
    );

    // The same content again (whatever serial it carries) changes nothing.
    assert_eq!(
        client.ok("writeConfig", json!([j1.owner(), changed])),
        json!([])
    );
    assert_eq!(client.ok("readConfig", json!([])), written);
    assert_eq!(
        std::fs::metadata(config_path(&wconfd))
            .expect("config.data")
            .ino(),
        inode_after
    );
    // The lock is still held after writeConfig.
    assert_eq!(
        list_locks(&mut client, j1),
        request(&[("cluster/config", "exclusive")])
    );
}

#[test]
fn write_config_and_unlock_writes_and_releases_once() {
    let (_wconfd, mut client, jobs) = start(1);
    let j1 = &jobs[0];
    let original = client.ok("readConfig", json!([]));
    let mut changed = original.clone();
    changed["nodes"] = json!({"n1": {"name": "n1"}});
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([j1.owner(), changed])),
        json!(false)
    );
    assert_eq!(client.ok("readConfig", json!([])), original);
    assert_eq!(
        client.ok("lockConfig", json!([j1.owner(), false])),
        original
    );
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([j1.owner(), changed])),
        json!(true)
    );
    assert_eq!(list_locks(&mut client, j1), json!([]));
    let written = client.ok("readConfig", json!([]));
    assert_eq!(written["serial_no"], json!(2));
    assert_eq!(written["nodes"], json!({"n1": {"name": "n1"}}));
    // A retried call: the lock is gone, nothing is written.
    let mut again = written.clone();
    again["nodes"] = json!({});
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([j1.owner(), again])),
        json!(false)
    );
    assert_eq!(client.ok("readConfig", json!([])), written);
}

#[test]
fn an_existing_config_loads_and_round_trips_in_its_key_order() {
    let root = crate::daemon::Root::new();
    let text = r#"{"zeta":1,"version":3000000,"cluster":{"b":1,"a":{"y":[1,2],"x":null}},"nodes":{},"serial_no":17,"mtime":1700000000.25,"alpha":"kept"}"#;
    std::fs::write(root.path().join("config.data"), text).expect("write config.data");
    let wconfd = Wconfd::restart_on(&root);
    let mut client = wconfd.client();
    client.send("readConfig", json!([])).expect("send");
    let frame = client.read_frame().expect("answer");
    let expected = format!("{{\"success\":true,\"result\":{text}}}");
    assert_eq!(String::from_utf8_lossy(&frame), expected);
    assert_eq!(client.ok("verifyConfig", json!([])), json!([]));
    // A write keeps the order; only serial_no and mtime change.
    let jobs = [OwnerProcess::spawn(&wconfd.livelock_dir(), 1)];
    let mut config = client.ok("lockConfig", json!([jobs[0].owner(), false]));
    config["alpha"] = json!("changed");
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([jobs[0].owner(), config])),
        json!(true)
    );
    let written: Value = serde_json::from_slice(
        &std::fs::read(root.path().join("config.data")).expect("config.data"),
    )
    .expect("JSON");
    let keys: Vec<&String> = written.as_object().expect("an object").keys().collect();
    assert_eq!(
        keys,
        [
            "zeta",
            "version",
            "cluster",
            "nodes",
            "serial_no",
            "mtime",
            "alpha"
        ]
    );
    assert_eq!(written["serial_no"], json!(18));
    assert_eq!(written["alpha"], json!("changed"));
}

#[test]
fn the_config_survives_a_restart() {
    let (mut wconfd, mut client, jobs) = start(1);
    let mut changed = client.ok("readConfig", json!([]));
    changed["instances"] = json!({"i1": {"name": "i1"}});
    changed["unknown_to_wconfd"] = json!([1, "two"]);
    assert!(
        client
            .ok("lockConfig", json!([jobs[0].owner(), false]))
            .is_object()
    );
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([jobs[0].owner(), changed])),
        json!(true)
    );
    let written = client.ok("readConfig", json!([]));
    wconfd.stop();
    let wconfd = Wconfd::restart_on(wconfd.root());
    assert_eq!(wconfd.client().ok("readConfig", json!([])), written);
}

#[test]
fn a_config_that_fails_verification_is_never_written() {
    let (mut wconfd, mut client, jobs) = start(1);
    let j1 = &jobs[0];
    let original = client.ok("readConfig", json!([]));
    let mut bad = original.clone();
    bad["nodes"] = json!([]);
    bad["cluster"] = json!("c1");
    assert_eq!(
        client.ok("lockConfig", json!([j1.owner(), false])),
        original
    );
    // Written, it would stop the next start-up: refused as Ganeti's
    // verification error, nothing written.
    let refused = Err((
        "ConfigVerifyError".to_owned(),
        json!([
            "Validation failed",
            ["cluster is not an object", "nodes is not an object"]
        ]),
    ));
    assert_eq!(
        client.call("writeConfig", json!([j1.owner(), bad])),
        refused
    );
    assert_eq!(
        client.call("writeConfigAndUnlock", json!([j1.owner(), bad])),
        refused
    );
    assert_eq!(client.ok("readConfig", json!([])), original);
    assert_eq!(client.ok("verifyConfig", json!([])), json!([]));
    wconfd.stop();
    let wconfd = Wconfd::restart_on(wconfd.root());
    assert_eq!(wconfd.client().ok("readConfig", json!([])), original);
}
