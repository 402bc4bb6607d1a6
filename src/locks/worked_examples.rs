//! The worked examples of LOCKS.md ("Worked examples", 1 to 11), the
//! consequences it names, and the other operations, as unit tests of
//! [`LockManager`].
//!
//! Every mutating step goes through [`Locks`], which runs
//! `check_invariants` and checks that the listings agree with each other
//! after it. Owners J1..J5 are job owners; listings are rendered compactly
//! (`"instance/a [J1 x, J2 s]"`, `"0 J2 [instance/a, exclusive]"`) so each
//! expected state reads like the example it comes from.

use std::sync::Arc;

use super::allocation::OwnerRef;
use super::{
    Entry, Level, LockError, LockManager, LockName, Mode, Owner, Priority, SavedPending,
    SavedState, Update,
};

/// The empty answer, for comparisons with `Vec<String>`.
const NONE: [&str; 0] = [];

/// Job owner `J<n>`: `[n, "/root/livelocks/job_<n>_1", 100 + n]`.
fn job(n: u64) -> Owner {
    let pid = 100 + u32::try_from(n).expect("test job ids are small");
    Owner::job(n, format!("/root/livelocks/job_{n:06}_1"), pid)
}

/// `"J<n>"` for the owners of these tests; anything else is a test bug or an
/// owner the manager made up (e.g. a wrong livelock or pid).
fn name(owner: &Owner) -> String {
    (1..=5)
        .find(|&n| *owner == job(n))
        .map(|n| format!("J{n}"))
        .unwrap_or_else(|| panic!("unknown owner {owner}"))
}

fn names(owners: &[OwnerRef]) -> Vec<String> {
    owners.iter().map(|owner| name(owner)).collect()
}

fn lock(text: &str) -> LockName {
    LockName::parse(text).expect("valid lock name")
}

fn x(text: &str) -> Entry {
    Entry::exclusive(lock(text))
}

fn s(text: &str) -> Entry {
    Entry::shared(lock(text))
}

fn rel(text: &str) -> Entry {
    Entry::release(lock(text))
}

fn tag(mode: Mode) -> &'static str {
    match mode {
        Mode::Shared => "s",
        Mode::Exclusive => "x",
    }
}

/// Asserts an update was applied or blocked: its blockers and notified
/// owners, by name, in the order given.
#[track_caller]
fn expect_update(result: Result<Update, LockError>, blockers: &[&str], notify: &[&str]) {
    let update = result.unwrap_or_else(|error| panic!("unexpected error: {error}"));
    assert_eq!(names(&update.blockers), blockers, "blockers");
    assert_eq!(names(&update.notify), notify, "notified owners");
}

/// Asserts an update failed and returns the error.
#[track_caller]
fn expect_error(result: Result<Update, LockError>) -> LockError {
    match result {
        Ok(update) => panic!(
            "expected an error, got blockers {:?} notify {:?}",
            names(&update.blockers),
            names(&update.notify)
        ),
        Err(error) => error,
    }
}

#[track_caller]
fn expect_pending_error(result: Result<Update, LockError>) {
    let error = expect_error(result);
    assert_eq!(error, LockError::PendingRequest);
    assert_eq!(
        error.to_string(),
        "cannot update locks while having pending requests"
    );
}

#[track_caller]
fn expect_order_violation(result: Result<Update, LockError>, requested: &str, highest: &str) {
    let error = expect_error(result);
    assert_eq!(
        error,
        LockError::OrderViolation {
            requested: lock(requested),
            highest: lock(highest),
        }
    );
    assert!(error.to_string().starts_with("Order violation"), "{error}");
}

/// A lock manager whose every change is followed by its invariant checks.
struct Locks {
    manager: LockManager,
}

impl Locks {
    fn new() -> Locks {
        let locks = Locks {
            manager: LockManager::new(),
        };
        locks.check();
        locks
    }

    fn check(&self) {
        self.manager.check_invariants();
        check_listings_agree(&self.manager);
    }

    fn try_update(&mut self, owner: &Owner, request: &[Entry]) -> Result<Update, LockError> {
        let result = self.manager.try_update(owner, request);
        self.check();
        result
    }

    fn waiting(
        &mut self,
        owner: &Owner,
        priority: Priority,
        request: &[Entry],
    ) -> Result<Update, LockError> {
        let result = self.manager.update_waiting(owner, priority, request);
        self.check();
        result
    }

    fn free(&mut self, owner: &Owner) -> Vec<String> {
        let notify = self.manager.free_locks(owner);
        self.check();
        names(&notify)
    }

    fn free_level(&mut self, owner: &Owner, level: Level) -> Vec<String> {
        let notify = self.manager.free_locks_level(owner, level);
        self.check();
        names(&notify)
    }

    fn downgrade(&mut self, owner: &Owner, level: Level) -> Vec<String> {
        let notify = self.manager.downgrade_locks_level(owner, level);
        self.check();
        names(&notify)
    }

    fn intersect(&mut self, owner: &Owner, keep: &[&str]) -> Vec<String> {
        let keep: Vec<LockName> = keep.iter().map(|text| lock(text)).collect();
        let notify = self.manager.intersect_locks(owner, &keep);
        self.check();
        names(&notify)
    }

    fn union(&mut self, owner: &Owner, wanted: &[(&str, Mode)]) -> Vec<String> {
        let wanted = wanted_locks(wanted);
        let acquired = self.manager.opportunistic_union(owner, &wanted);
        self.check();
        acquired.iter().map(LockName::to_string).collect()
    }

    fn guarded(&mut self, count: usize, owner: &Owner, wanted: &[(&str, Mode)]) -> Vec<String> {
        let wanted = wanted_locks(wanted);
        let acquired = self
            .manager
            .guarded_opportunistic_union(count, owner, &wanted);
        self.check();
        acquired.iter().map(LockName::to_string).collect()
    }

    /// `listLocks`: `"<lock> <x|s>"` in lock order.
    fn held(&self, owner: &Owner) -> Vec<String> {
        self.manager
            .list_locks(owner)
            .iter()
            .map(|(lock, mode)| format!("{lock} {}", tag(*mode)))
            .collect()
    }

    /// `listAllLocks`.
    fn all_locks(&self) -> Vec<String> {
        self.manager
            .list_all_locks()
            .iter()
            .map(LockName::to_string)
            .collect()
    }

    /// `listAllLocksOwners`: `"<lock> [<owner> <x|s>, ...]"`.
    fn table(&self) -> Vec<String> {
        self.manager
            .list_all_locks_owners()
            .iter()
            .map(|(lock, holders)| {
                let holders: Vec<String> = holders
                    .iter()
                    .map(|(owner, mode)| format!("{} {}", name(owner), tag(*mode)))
                    .collect();
                format!("{lock} [{}]", holders.join(", "))
            })
            .collect()
    }

    /// The pending listing: `"<prio> <owner> <entry> <entry>..."`.
    fn pending(&self) -> Vec<String> {
        self.manager
            .list_pending()
            .iter()
            .map(|pending| {
                let request: Vec<String> = pending.request.iter().map(Entry::to_string).collect();
                format!(
                    "{} {} {}",
                    pending.priority,
                    name(&pending.owner),
                    request.join(" ")
                )
            })
            .collect()
    }

    fn is_pending(&self, owner: &Owner) -> bool {
        self.manager.has_pending_request(owner)
    }

    fn owners(&self) -> Vec<String> {
        names(&self.manager.owners())
    }
}

fn wanted_locks(wanted: &[(&str, Mode)]) -> Vec<(LockName, Mode)> {
    wanted
        .iter()
        .map(|(text, mode)| (lock(text), *mode))
        .collect()
}

/// The listings agree with each other: listAllLocks is the lock column of
/// listAllLocksOwners; every row's holders hold that lock in that mode by
/// listLocks, and every holding of listLocks is in its row; a held member's
/// group is listed; the pending listing is in (priority, owner) order and
/// agrees with hasPendingRequest; `owners` is everyone holding or waiting.
fn check_listings_agree(manager: &LockManager) {
    let all_locks = manager.list_all_locks();
    let table = manager.list_all_locks_owners();
    let table_locks: Vec<LockName> = table.iter().map(|(lock, _)| lock.clone()).collect();
    assert_eq!(all_locks, table_locks, "listAllLocks vs listAllLocksOwners");
    assert!(
        all_locks.windows(2).all(|pair| pair[0] < pair[1]),
        "lock order"
    );

    let owners = manager.owners();
    assert!(
        owners.windows(2).all(|pair| pair[0] < pair[1]),
        "owner order"
    );
    let mut holders: Vec<OwnerRef> = Vec::new();
    for (lock, row) in &table {
        assert!(
            row.windows(2).all(|pair| pair[0].0 < pair[1].0),
            "holders of {lock} in owner order"
        );
        if row.iter().any(|(_, mode)| *mode == Mode::Exclusive) {
            assert_eq!(row.len(), 1, "an exclusive holder of {lock} is alone");
        }
        for (owner, mode) in row {
            assert!(
                manager.list_locks(owner).contains(&(lock.clone(), *mode)),
                "{owner} listed on {lock} but not holding it {mode}"
            );
            holders.push(Arc::clone(owner));
        }
    }
    holders.sort();
    holders.dedup();
    for owner in &holders {
        assert!(
            owners.contains(owner),
            "holder {owner} missing from owners()"
        );
        let held = manager.list_locks(owner);
        assert!(!held.is_empty());
        assert!(
            held.windows(2).all(|pair| pair[0].0 < pair[1].0),
            "listLocks order"
        );
        for (lock, mode) in &held {
            let row = table
                .iter()
                .find(|(listed, _)| listed == lock)
                .unwrap_or_else(|| panic!("{lock} held by {owner} but not listed"));
            assert!(row.1.contains(&(Arc::clone(owner), *mode)));
            if let Some(group) = lock.group() {
                assert!(all_locks.contains(&group), "group of {lock} not listed");
            }
        }
    }

    let pending = manager.list_pending();
    assert!(
        pending
            .windows(2)
            .all(|pair| (pair[0].priority, &pair[0].owner) < (pair[1].priority, &pair[1].owner)),
        "pending listing in (priority, owner) order"
    );
    for request in &pending {
        assert!(manager.has_pending_request(&request.owner));
    }
    let mut expected_owners = holders;
    expected_owners.extend(pending.iter().map(|request| Arc::clone(&request.owner)));
    expected_owners.sort();
    expected_owners.dedup();
    assert_eq!(
        owners, expected_owners,
        "owners() is everyone holding or waiting"
    );
    for owner in &owners {
        let waiting = pending.iter().any(|request| request.owner == *owner);
        assert_eq!(manager.has_pending_request(owner), waiting, "{owner}");
    }
}

// ---------------------------------------------------------------------------
// Worked examples 1 to 11.

#[test]
fn example_01_two_jobs_share_the_bgl() {
    let mut locks = Locks::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));

    expect_update(locks.try_update(&j1, &[s("cluster/BGL")]), &[], &[]);
    expect_update(locks.try_update(&j2, &[s("cluster/BGL")]), &[], &[]);
    assert_eq!(locks.held(&j1), ["cluster/BGL s"]);
    assert_eq!(locks.held(&j2), ["cluster/BGL s"]);
    assert_eq!(locks.all_locks(), ["cluster/[lockset]", "cluster/BGL"]);
    assert_eq!(
        locks.table(),
        ["cluster/[lockset] []", "cluster/BGL [J1 s, J2 s]"]
    );
    assert_eq!(locks.owners(), ["J1", "J2"]);

    // Exclusive is blocked by both shared holders, sorted; on the group by
    // both indirect owners. try_update never queues.
    expect_update(
        locks.try_update(&j3, &[x("cluster/BGL")]),
        &["J1", "J2"],
        &[],
    );
    expect_update(
        locks.try_update(&j3, &[x("cluster/[lockset]")]),
        &["J1", "J2"],
        &[],
    );
    assert_eq!(locks.held(&j3), NONE);
    assert!(!locks.is_pending(&j3));
    assert_eq!(locks.pending(), NONE);

    // The group shared is compatible with shared members.
    expect_update(locks.try_update(&j3, &[s("cluster/[lockset]")]), &[], &[]);
    assert_eq!(
        locks.table(),
        ["cluster/[lockset] [J3 s]", "cluster/BGL [J1 s, J2 s]"]
    );
    // Upgrading the BGL is now blocked by J2 (holder) and J3 (group holder).
    expect_update(
        locks.try_update(&j1, &[x("cluster/BGL")]),
        &["J2", "J3"],
        &[],
    );
    assert_eq!(locks.held(&j1), ["cluster/BGL s"]);
}

#[test]
fn example_02_group_blocked_by_a_member_holder() {
    let mut locks = Locks::new();
    let (j1, j2) = (job(1), job(2));

    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    assert_eq!(locks.all_locks(), ["instance/[lockset]", "instance/a"]);
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J1 x]"]
    );

    expect_update(
        locks.try_update(&j2, &[s("instance/[lockset]")]),
        &["J1"],
        &[],
    );
    expect_update(
        locks.try_update(&j2, &[x("instance/[lockset]")]),
        &["J1"],
        &[],
    );
    assert_eq!(locks.held(&j2), NONE);
    assert!(!locks.is_pending(&j2));
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J1 x]"]
    );

    // Another member is free.
    expect_update(locks.try_update(&j2, &[x("instance/b")]), &[], &[]);
    assert_eq!(
        locks.table(),
        [
            "instance/[lockset] []",
            "instance/a [J1 x]",
            "instance/b [J2 x]"
        ]
    );
}

#[test]
fn example_03_member_below_the_highest_held_lock_is_an_order_violation() {
    let mut locks = Locks::new();
    let j1 = job(1);

    expect_update(
        locks.try_update(&j1, &[s("cluster/BGL"), x("instance/a"), x("node/n1")]),
        &[],
        &[],
    );
    let table = [
        "cluster/[lockset] []",
        "cluster/BGL [J1 s]",
        "instance/[lockset] []",
        "instance/a [J1 x]",
        "node/[lockset] []",
        "node/n1 [J1 x]",
    ];
    assert_eq!(locks.table(), table);

    expect_order_violation(
        locks.try_update(&j1, &[x("instance/b")]),
        "instance/b",
        "node/n1",
    );
    expect_order_violation(
        locks.try_update(&j1, &[s("instance/b")]),
        "instance/b",
        "node/n1",
    );
    assert_eq!(
        locks.held(&j1),
        ["cluster/BGL s", "instance/a x", "node/n1 x"]
    );
    assert_eq!(locks.table(), table);

    // Locks above the highest one are fine.
    expect_update(locks.try_update(&j1, &[x("node/n2")]), &[], &[]);
    assert_eq!(
        locks.held(&j1),
        ["cluster/BGL s", "instance/a x", "node/n1 x", "node/n2 x"]
    );
}

#[test]
fn example_04_member_under_group() {
    // Shared group: a member exclusively is an error.
    let mut locks = Locks::new();
    let j1 = job(1);
    expect_update(locks.try_update(&j1, &[s("instance/[lockset]")]), &[], &[]);
    let error = expect_error(locks.try_update(&j1, &[x("instance/a")]));
    assert_eq!(
        error,
        LockError::MemberUnderSharedGroup {
            requested: lock("instance/a"),
            group: lock("instance/[lockset]"),
        }
    );
    assert!(error.to_string().starts_with("Order violation"), "{error}");
    assert_eq!(locks.held(&j1), ["instance/[lockset] s"]);
    assert_eq!(locks.table(), ["instance/[lockset] [J1 s]"]);

    // Exclusive group and node/n1: a member below node/n1 is allowed and
    // granted.
    let mut locks = Locks::new();
    expect_update(
        locks.try_update(&j1, &[x("instance/[lockset]"), x("node/n1")]),
        &[],
        &[],
    );
    expect_update(locks.try_update(&j1, &[s("instance/z")]), &[], &[]);
    assert_eq!(
        locks.held(&j1),
        ["instance/[lockset] x", "instance/z s", "node/n1 x"]
    );
    assert_eq!(
        locks.all_locks(),
        [
            "instance/[lockset]",
            "instance/z",
            "node/[lockset]",
            "node/n1"
        ]
    );
    assert_eq!(
        locks.table(),
        [
            "instance/[lockset] [J1 x]",
            "instance/z [J1 s]",
            "node/[lockset] []",
            "node/n1 [J1 x]"
        ]
    );
    // Exclusively, too.
    expect_update(locks.try_update(&j1, &[x("instance/y")]), &[], &[]);
    assert_eq!(
        locks.held(&j1),
        [
            "instance/[lockset] x",
            "instance/y x",
            "instance/z s",
            "node/n1 x"
        ]
    );
}

#[test]
fn example_05_release_and_lower_lock_in_one_request_is_an_order_violation() {
    let mut locks = Locks::new();
    let j1 = job(1);
    expect_update(locks.try_update(&j1, &[x("node/n1")]), &[], &[]);

    expect_order_violation(
        locks.try_update(&j1, &[rel("node/n1"), x("instance/a")]),
        "instance/a",
        "node/n1",
    );
    assert_eq!(locks.held(&j1), ["node/n1 x"]);
    assert_eq!(locks.table(), ["node/[lockset] []", "node/n1 [J1 x]"]);

    // In two calls it works.
    expect_update(locks.try_update(&j1, &[rel("node/n1")]), &[], &[]);
    assert_eq!(locks.held(&j1), NONE);
    assert_eq!(locks.table(), NONE);
    assert_eq!(locks.owners(), NONE);
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    assert_eq!(locks.held(&j1), ["instance/a x"]);
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J1 x]"]
    );
}

#[test]
fn example_06_upgrade_the_highest_lock_but_not_a_lower_one() {
    let mut locks = Locks::new();
    let (j1, j2) = (job(1), job(2));
    expect_update(
        locks.try_update(&j1, &[s("cluster/BGL"), s("instance/a")]),
        &[],
        &[],
    );
    expect_update(locks.try_update(&j2, &[s("instance/a")]), &[], &[]);

    // Allowed, blocked only by the other holder of instance/a.
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &["J2"], &[]);
    expect_order_violation(
        locks.try_update(&j1, &[x("cluster/BGL")]),
        "cluster/BGL",
        "instance/a",
    );
    assert_eq!(locks.held(&j1), ["cluster/BGL s", "instance/a s"]);
    assert_eq!(
        locks.table(),
        [
            "cluster/[lockset] []",
            "cluster/BGL [J1 s]",
            "instance/[lockset] []",
            "instance/a [J1 s, J2 s]"
        ]
    );

    assert_eq!(locks.free(&j2), NONE);
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    assert_eq!(locks.held(&j1), ["cluster/BGL s", "instance/a x"]);
    expect_order_violation(
        locks.try_update(&j1, &[x("cluster/BGL")]),
        "cluster/BGL",
        "instance/a",
    );
    assert_eq!(
        locks.table(),
        [
            "cluster/[lockset] []",
            "cluster/BGL [J1 s]",
            "instance/[lockset] []",
            "instance/a [J1 x]"
        ]
    );
}

/// Example 7 up to J1's freeLocks: J3 holds instance/a shared, J2 waits for
/// it exclusively (filed under J3).
fn example_07_after_j1_frees() -> Locks {
    let mut locks = Locks::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));

    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);

    expect_update(locks.waiting(&j2, 0, &[x("instance/a")]), &["J1"], &[]);
    assert!(locks.is_pending(&j2));
    assert_eq!(locks.pending(), ["0 J2 [instance/a, exclusive]"]);

    expect_update(locks.waiting(&j3, -10, &[s("instance/a")]), &["J1"], &[]);
    assert!(locks.is_pending(&j3));
    assert!(!locks.is_pending(&j1));
    assert_eq!(
        locks.pending(),
        [
            "-10 J3 [instance/a, shared]",
            "0 J2 [instance/a, exclusive]"
        ]
    );
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J1 x]"]
    );
    assert_eq!(locks.owners(), ["J1", "J2", "J3"]);

    // J3 is more urgent: granted shared; J2 retried, now blocked by J3.
    assert_eq!(locks.free(&j1), ["J3"]);
    assert!(!locks.is_pending(&j3));
    assert!(locks.is_pending(&j2));
    assert_eq!(locks.held(&j1), NONE);
    assert_eq!(locks.held(&j2), NONE);
    assert_eq!(locks.held(&j3), ["instance/a s"]);
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J3 s]"]
    );
    assert_eq!(locks.pending(), ["0 J2 [instance/a, exclusive]"]);
    assert_eq!(locks.owners(), ["J2", "J3"]);
    locks
}

#[test]
fn example_07_waiters_granted_by_priority_and_notified() {
    let mut locks = example_07_after_j1_frees();
    let (j2, j3) = (job(2), job(3));

    // J2 is filed under J3, its new blocker.
    let saved = locks.manager.saved();
    assert_eq!(
        saved.pending,
        [SavedPending {
            priority: 0,
            owner: j2.clone(),
            request: vec![x("instance/a")],
            filed_under: j3.clone(),
        }]
    );

    expect_update(locks.try_update(&j3, &[rel("instance/a")]), &[], &["J2"]);
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.held(&j2), ["instance/a x"]);
    assert_eq!(locks.held(&j3), NONE);
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J2 x]"]
    );
    assert_eq!(locks.pending(), NONE);
    assert_eq!(locks.owners(), ["J2"]);
}

#[test]
fn example_08_compatible_request_granted_at_once_despite_waiters() {
    let mut locks = example_07_after_j1_frees();
    let (j2, j3, j4) = (job(2), job(3), job(4));

    expect_update(locks.try_update(&j4, &[s("instance/a")]), &[], &[]);
    assert_eq!(locks.held(&j4), ["instance/a s"]);
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J3 s, J4 s]"]
    );
    assert!(locks.is_pending(&j2));
    assert_eq!(locks.pending(), ["0 J2 [instance/a, exclusive]"]);

    // J3 leaves: J2 is still blocked, by J4 now; nobody is notified.
    expect_update(locks.try_update(&j3, &[rel("instance/a")]), &[], &[]);
    assert!(locks.is_pending(&j2));
    assert_eq!(locks.manager.saved().pending[0].filed_under, j4);
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J4 s]"]
    );

    // J4 leaves: J2 granted.
    assert_eq!(locks.free(&j4), ["J2"]);
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.held(&j2), ["instance/a x"]);
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J2 x]"]
    );
    assert_eq!(locks.pending(), NONE);
}

#[test]
fn example_09_pending_owner_cannot_update_and_loses_the_request() {
    let mut locks = Locks::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    expect_update(locks.try_update(&j2, &[s("cluster/BGL")]), &[], &[]);

    // Sent out of lock order on purpose: listed exactly as sent.
    let request = [s("instance/b"), x("instance/a")];
    expect_update(locks.waiting(&j2, 0, &request), &["J1"], &[]);
    let pending = ["0 J2 [instance/b, shared] [instance/a, exclusive]"];
    assert_eq!(locks.pending(), pending);
    assert!(locks.is_pending(&j2));

    // Any other update is the pending error, even an already satisfied one.
    expect_pending_error(locks.try_update(&j2, &[s("node/n1")]));
    expect_pending_error(locks.try_update(&j2, &[s("cluster/BGL")]));
    expect_pending_error(locks.try_update(&j2, &request));
    expect_pending_error(locks.waiting(&j2, 0, &[x("instance/a"), s("instance/b")]));
    expect_pending_error(locks.waiting(&j2, 0, &[s("instance/b")]));
    assert_eq!(locks.pending(), pending);
    assert_eq!(locks.held(&j2), ["cluster/BGL s"]);

    // The same request again: current blockers, no change, original
    // priority kept.
    expect_update(locks.waiting(&j2, -20, &request), &["J1"], &[]);
    assert_eq!(locks.pending(), pending);
    expect_update(locks.try_update(&j3, &[x("instance/b")]), &[], &[]);
    expect_update(locks.waiting(&j2, 0, &request), &["J1", "J3"], &[]);
    assert_eq!(locks.pending(), pending);
    assert_eq!(locks.held(&j2), ["cluster/BGL s"]);

    // With a pending request, opportunistic union acquires nothing.
    assert_eq!(locks.union(&j2, &[("node/n1", Mode::Exclusive)]), NONE);
    assert_eq!(locks.held(&j2), ["cluster/BGL s"]);
    assert!(locks.is_pending(&j2));

    // freeLocksLevel drops the pending request, even for an unrelated level.
    assert_eq!(locks.free_level(&j2, Level::Node), NONE);
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.pending(), NONE);
    assert_eq!(locks.held(&j2), ["cluster/BGL s"]);

    // intersectLocks drops it.
    expect_update(locks.waiting(&j2, 3, &[x("instance/a")]), &["J1"], &[]);
    assert_eq!(locks.pending(), ["3 J2 [instance/a, exclusive]"]);
    assert_eq!(locks.intersect(&j2, &["cluster/BGL"]), NONE);
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.pending(), NONE);
    assert_eq!(locks.held(&j2), ["cluster/BGL s"]);

    // downGradeLocksLevel drops it.
    expect_update(locks.waiting(&j2, 3, &[x("instance/a")]), &["J1"], &[]);
    assert_eq!(locks.downgrade(&j2, Level::Cluster), NONE);
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.held(&j2), ["cluster/BGL s"]);

    // freeLocks drops it together with every lock.
    expect_update(locks.waiting(&j2, 3, &[x("instance/a")]), &["J1"], &[]);
    assert_eq!(locks.free(&j2), NONE);
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.held(&j2), NONE);
    assert_eq!(locks.pending(), NONE);
    assert_eq!(locks.owners(), ["J1", "J3"]);

    // Errors are never queued.
    expect_update(locks.try_update(&j2, &[x("node/n1")]), &[], &[]);
    expect_order_violation(
        locks.waiting(&j2, 0, &[x("instance/a")]),
        "instance/a",
        "node/n1",
    );
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.pending(), NONE);
    assert_eq!(
        locks.table(),
        [
            "instance/[lockset] []",
            "instance/a [J1 x]",
            "instance/b [J3 x]",
            "node/[lockset] []",
            "node/n1 [J2 x]"
        ]
    );
}

const N123: [(&str, Mode); 3] = [
    ("node/n1", Mode::Exclusive),
    ("node/n2", Mode::Exclusive),
    ("node/n3", Mode::Exclusive),
];

#[test]
fn example_10_opportunistic_union_and_its_guarded_form() {
    let (j1, j5) = (job(1), job(5));

    let mut locks = Locks::new();
    expect_update(locks.try_update(&j1, &[x("node/n2")]), &[], &[]);
    assert_eq!(locks.union(&j5, &N123), ["node/n1", "node/n3"]);
    assert_eq!(locks.held(&j5), ["node/n1 x", "node/n3 x"]);
    assert_eq!(
        locks.table(),
        [
            "node/[lockset] []",
            "node/n1 [J5 x]",
            "node/n2 [J1 x]",
            "node/n3 [J5 x]"
        ]
    );
    // Nothing new to take: the guarded form answers [] and changes nothing.
    assert_eq!(locks.guarded(1, &j5, &N123), NONE);
    assert_eq!(locks.held(&j5), ["node/n1 x", "node/n3 x"]);

    let mut locks = Locks::new();
    expect_update(locks.try_update(&j1, &[x("node/n2")]), &[], &[]);
    assert_eq!(locks.guarded(3, &j5, &N123), NONE);
    assert_eq!(locks.held(&j5), NONE);
    assert_eq!(locks.table(), ["node/[lockset] []", "node/n2 [J1 x]"]);
    assert_eq!(locks.owners(), ["J1"]);
    assert_eq!(locks.guarded(2, &j5, &N123), ["node/n1", "node/n3"]);
    assert_eq!(locks.held(&j5), ["node/n1 x", "node/n3 x"]);
}

#[test]
fn example_11_repeated_request_is_a_no_op_that_notifies_nobody() {
    let mut locks = Locks::new();
    let (j1, j2) = (job(1), job(2));
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    expect_update(locks.waiting(&j2, 0, &[s("instance/a")]), &["J1"], &[]);
    let table = ["instance/[lockset] []", "instance/a [J1 x]"];
    let pending = ["0 J2 [instance/a, shared]"];

    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    assert_eq!(locks.held(&j1), ["instance/a x"]);
    assert_eq!(locks.table(), table);
    assert_eq!(locks.pending(), pending);
    assert!(locks.is_pending(&j2));

    expect_update(locks.waiting(&j1, 5, &[x("instance/a")]), &[], &[]);
    assert!(!locks.is_pending(&j1));
    assert_eq!(locks.table(), table);
    assert_eq!(locks.pending(), pending);
}

// ---------------------------------------------------------------------------
// "Consequences worth testing" and tryUpdateLocks steps.

#[test]
fn upgrading_the_highest_held_lock_is_allowed_a_lower_one_is_not() {
    let mut locks = Locks::new();
    let j1 = job(1);
    expect_update(
        locks.try_update(&j1, &[s("instance/a"), s("node/n1")]),
        &[],
        &[],
    );
    expect_order_violation(
        locks.try_update(&j1, &[x("instance/a")]),
        "instance/a",
        "node/n1",
    );
    assert_eq!(locks.held(&j1), ["instance/a s", "node/n1 s"]);
    expect_update(locks.try_update(&j1, &[x("node/n1")]), &[], &[]);
    assert_eq!(locks.held(&j1), ["instance/a s", "node/n1 x"]);
    // Downgrading a lower lock is allowed: it is held.
    expect_update(
        locks.try_update(&j1, &[x("node/n1"), s("instance/a")]),
        &[],
        &[],
    );
    assert_eq!(locks.held(&j1), ["instance/a s", "node/n1 x"]);
}

#[test]
fn release_and_take_a_lower_lock_needs_two_calls() {
    let mut locks = Locks::new();
    let j1 = job(1);
    expect_update(locks.try_update(&j1, &[x("cluster/config")]), &[], &[]);
    expect_order_violation(
        locks.try_update(&j1, &[s("cluster/BGL"), rel("cluster/config")]),
        "cluster/BGL",
        "cluster/config",
    );
    assert_eq!(locks.held(&j1), ["cluster/config x"]);
    assert_eq!(locks.table(), ["cluster/config [J1 x]"]);

    expect_update(locks.try_update(&j1, &[rel("cluster/config")]), &[], &[]);
    expect_update(locks.try_update(&j1, &[s("cluster/BGL")]), &[], &[]);
    assert_eq!(locks.held(&j1), ["cluster/BGL s"]);
}

#[test]
fn members_of_a_held_group_may_be_taken_in_any_order() {
    let mut locks = Locks::new();
    let (j1, j2) = (job(1), job(2));

    expect_update(locks.try_update(&j1, &[x("instance/[lockset]")]), &[], &[]);
    expect_update(locks.try_update(&j1, &[x("instance/c")]), &[], &[]);
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    expect_update(locks.try_update(&j1, &[s("instance/b")]), &[], &[]);
    assert_eq!(
        locks.held(&j1),
        [
            "instance/[lockset] x",
            "instance/a x",
            "instance/b s",
            "instance/c x"
        ]
    );

    // Shared group: shared members in any order; exclusive ones never.
    expect_update(locks.try_update(&j2, &[s("node/[lockset]")]), &[], &[]);
    expect_update(locks.try_update(&j2, &[s("node/c")]), &[], &[]);
    expect_update(locks.try_update(&j2, &[s("node/a")]), &[], &[]);
    let error = expect_error(locks.try_update(&j2, &[x("node/d")]));
    assert_eq!(
        error,
        LockError::MemberUnderSharedGroup {
            requested: lock("node/d"),
            group: lock("node/[lockset]"),
        }
    );
    assert_eq!(
        locks.held(&j2),
        ["node/[lockset] s", "node/a s", "node/c s"]
    );
    assert_eq!(
        locks.table(),
        [
            "instance/[lockset] [J1 x]",
            "instance/a [J1 x]",
            "instance/b [J1 s]",
            "instance/c [J1 x]",
            "node/[lockset] [J2 s]",
            "node/a [J2 s]",
            "node/c [J2 s]"
        ]
    );
}

#[test]
fn satisfied_request_answers_empty_even_below_the_highest_lock_and_notifies_nobody() {
    let mut locks = Locks::new();
    let (j1, j2) = (job(1), job(2));
    expect_update(
        locks.try_update(&j1, &[s("cluster/BGL"), x("node/n1")]),
        &[],
        &[],
    );
    expect_update(locks.waiting(&j2, 0, &[s("node/n1")]), &["J1"], &[]);
    let table = [
        "cluster/[lockset] []",
        "cluster/BGL [J1 s]",
        "node/[lockset] []",
        "node/n1 [J1 x]",
    ];
    let pending = ["0 J2 [node/n1, shared]"];

    // Held locks in the held modes, and releases of unheld locks.
    for request in [
        vec![s("cluster/BGL")],
        vec![x("node/n1"), s("cluster/BGL")],
        vec![rel("instance/a")],
        vec![rel("instance/zz"), s("cluster/BGL"), rel("cluster/config")],
        vec![],
    ] {
        expect_update(locks.try_update(&j1, &request), &[], &[]);
        expect_update(locks.waiting(&j1, 0, &request), &[], &[]);
        assert!(!locks.is_pending(&j1));
        assert_eq!(locks.table(), table);
        assert_eq!(locks.pending(), pending);
    }
    // An owner holding nothing: releases are satisfied.
    expect_update(locks.try_update(&job(3), &[rel("node/n1")]), &[], &[]);
    assert_eq!(locks.table(), table);
    assert_eq!(locks.owners(), ["J1", "J2"]);
}

#[test]
fn identical_duplicates_are_fine_different_modes_are_inconsistent() {
    let mut locks = Locks::new();
    let j1 = job(1);
    expect_update(
        locks.try_update(&j1, &[x("instance/a"), x("instance/a")]),
        &[],
        &[],
    );
    assert_eq!(locks.held(&j1), ["instance/a x"]);

    for (request, bad) in [
        (vec![s("instance/b"), x("instance/b")], "instance/b"),
        (vec![x("node/n1"), rel("node/n1")], "node/n1"),
        (
            vec![s("node/n2"), x("node/n3"), s("node/n2"), rel("node/n2")],
            "node/n2",
        ),
        (vec![rel("instance/a"), x("instance/a")], "instance/a"),
    ] {
        let error = expect_error(locks.try_update(&j1, &request));
        assert_eq!(error, LockError::Inconsistent(lock(bad)));
        assert!(error.to_string().contains(bad), "{error}");
        let error = expect_error(locks.waiting(&j1, 0, &request));
        assert_eq!(error, LockError::Inconsistent(lock(bad)));
        assert!(!locks.is_pending(&j1));
        assert_eq!(locks.held(&j1), ["instance/a x"]);
    }
}

// ---------------------------------------------------------------------------
// Waiting requests.

#[test]
fn identical_resend_keeps_the_original_priority() {
    let mut locks = Locks::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    expect_update(locks.waiting(&j2, 0, &[x("instance/a")]), &["J1"], &[]);
    expect_update(locks.waiting(&j3, -5, &[x("instance/a")]), &["J1"], &[]);

    // J2 re-sends at a more urgent priority: nothing changes.
    expect_update(locks.waiting(&j2, -10, &[x("instance/a")]), &["J1"], &[]);
    assert_eq!(
        locks.pending(),
        [
            "-5 J3 [instance/a, exclusive]",
            "0 J2 [instance/a, exclusive]"
        ]
    );
    // A different request is the pending error.
    expect_pending_error(locks.waiting(&j2, -10, &[s("instance/a")]));
    expect_pending_error(locks.waiting(&j2, 0, &[x("instance/a"), x("instance/a")]));

    // J3 (priority -5) goes first.
    assert_eq!(locks.free(&j1), ["J3"]);
    assert_eq!(locks.held(&j3), ["instance/a x"]);
    assert_eq!(locks.pending(), ["0 J2 [instance/a, exclusive]"]);
    expect_update(locks.waiting(&j2, 7, &[x("instance/a")]), &["J3"], &[]);
    assert_eq!(locks.pending(), ["0 J2 [instance/a, exclusive]"]);
    assert_eq!(locks.free(&j3), ["J2"]);
    assert_eq!(locks.held(&j2), ["instance/a x"]);
}

#[test]
fn blocked_request_is_filed_under_its_smallest_blocker_and_refiled() {
    let mut locks = Locks::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));
    expect_update(locks.try_update(&j2, &[s("instance/a")]), &[], &[]);
    expect_update(locks.try_update(&j1, &[s("instance/a")]), &[], &[]);
    expect_update(
        locks.waiting(&j3, 4, &[x("instance/a")]),
        &["J1", "J2"],
        &[],
    );
    assert_eq!(
        locks.manager.saved(),
        SavedState {
            holdings: vec![
                (j1.clone(), vec![(lock("instance/a"), Mode::Shared)]),
                (j2.clone(), vec![(lock("instance/a"), Mode::Shared)]),
            ],
            pending: vec![SavedPending {
                priority: 4,
                owner: j3.clone(),
                request: vec![x("instance/a")],
                filed_under: j1.clone(),
            }],
        }
    );

    // J2 leaving does not retry it (filed under J1) and notifies nobody.
    assert_eq!(locks.free(&j2), NONE);
    assert!(locks.is_pending(&j3));
    expect_update(locks.try_update(&j2, &[s("instance/a")]), &[], &[]);

    assert_eq!(locks.free(&j1), NONE);
    assert!(locks.is_pending(&j3));
    assert_eq!(locks.manager.saved().pending[0].filed_under, j2);
    assert_eq!(locks.free(&j2), ["J3"]);
    assert_eq!(locks.held(&j3), ["instance/a x"]);
    assert_eq!(locks.pending(), NONE);
}

#[test]
fn waiters_granted_together_are_notified_in_grant_order() {
    let mut locks = Locks::new();
    let (j1, j2, j3, j4) = (job(1), job(2), job(3), job(4));
    expect_update(locks.try_update(&j1, &[x("instance/a")]), &[], &[]);
    expect_update(locks.waiting(&j2, 0, &[s("instance/a")]), &["J1"], &[]);
    expect_update(locks.waiting(&j3, -5, &[s("instance/a")]), &["J1"], &[]);
    expect_update(locks.waiting(&j4, 10, &[x("instance/a")]), &["J1"], &[]);

    // J3 and J2 are granted (priority order); J4 stays, blocked by both.
    expect_update(
        locks.try_update(&j1, &[rel("instance/a")]),
        &[],
        &["J3", "J2"],
    );
    assert_eq!(
        locks.table(),
        ["instance/[lockset] []", "instance/a [J2 s, J3 s]"]
    );
    assert_eq!(locks.pending(), ["10 J4 [instance/a, exclusive]"]);
    assert_eq!(locks.manager.saved().pending[0].filed_under, j2);
}

#[test]
fn freeing_an_owner_with_only_a_pending_request() {
    let mut locks = Locks::new();
    let (j1, j2) = (job(1), job(2));
    expect_update(locks.try_update(&j1, &[x("node/n1")]), &[], &[]);
    expect_update(locks.waiting(&j2, 0, &[s("node/n1")]), &["J1"], &[]);
    assert_eq!(locks.owners(), ["J1", "J2"]);

    // The dead-owner release of J2.
    assert_eq!(locks.free(&j2), NONE);
    assert!(!locks.is_pending(&j2));
    assert_eq!(locks.pending(), NONE);
    assert_eq!(locks.owners(), ["J1"]);
    assert_eq!(locks.table(), ["node/[lockset] []", "node/n1 [J1 x]"]);

    // Nobody is waiting any more.
    assert_eq!(locks.free(&j1), NONE);
    assert_eq!(locks.held(&j2), NONE);
    assert_eq!(locks.all_locks(), NONE);
    assert_eq!(locks.owners(), NONE);
    assert_eq!(locks.manager.saved(), SavedState::default());
}

// ---------------------------------------------------------------------------
// Other operations.

#[test]
fn free_locks_level_cluster_keeps_cluster_config() {
    let mut locks = Locks::new();
    let (j1, j2, j3) = (job(1), job(2), job(3));
    expect_update(
        locks.try_update(&j1, &[x("cluster/BGL"), x("cluster/config")]),
        &[],
        &[],
    );
    expect_update(locks.waiting(&j2, 0, &[s("cluster/config")]), &["J1"], &[]);
    expect_update(locks.waiting(&j3, 0, &[s("cluster/BGL")]), &["J1"], &[]);
    assert_eq!(
        locks.table(),
        [
            "cluster/[lockset] []",
            "cluster/BGL [J1 x]",
            "cluster/config [J1 x]"
        ]
    );

    assert_eq!(locks.free_level(&j1, Level::Cluster), ["J3"]);
    assert_eq!(locks.held(&j1), ["cluster/config x"]);
    assert!(locks.is_pending(&j2));
    assert_eq!(
        locks.table(),
        [
            "cluster/[lockset] []",
            "cluster/BGL [J3 s]",
            "cluster/config [J1 x]"
        ]
    );

    assert_eq!(locks.free_level(&j1, Level::Config), ["J2"]);
    assert_eq!(locks.held(&j1), NONE);
    assert_eq!(locks.held(&j2), ["cluster/config s"]);
    assert_eq!(locks.pending(), NONE);

    // Level cluster includes its group lock.
    let mut locks = Locks::new();
    expect_update(
        locks.try_update(
            &j1,
            &[x("cluster/[lockset]"), s("cluster/BGL"), s("node/n1")],
        ),
        &[],
        &[],
    );
    assert_eq!(locks.free_level(&j1, Level::Cluster), NONE);
    assert_eq!(locks.held(&j1), ["node/n1 s"]);
    assert_eq!(locks.table(), ["node/[lockset] []", "node/n1 [J1 s]"]);
}

#[test]
fn downgrade_locks_level_makes_the_level_shared() {
    let mut locks = Locks::new();
    let (j1, j2, j3, j4) = (job(1), job(2), job(3), job(4));
    expect_update(locks.try_update(&j4, &[x("node/n9")]), &[], &[]);
    expect_update(
        locks.try_update(&j1, &[x("instance/a"), x("instance/b"), x("node/n1")]),
        &[],
        &[],
    );
    expect_update(locks.waiting(&j2, 0, &[s("instance/a")]), &["J1"], &[]);
    expect_update(locks.waiting(&j3, 0, &[s("node/n1")]), &["J1"], &[]);
    expect_update(locks.waiting(&j1, 0, &[x("node/n9")]), &["J4"], &[]);
    assert!(locks.is_pending(&j1));

    assert_eq!(locks.downgrade(&j1, Level::Instance), ["J2"]);
    assert!(!locks.is_pending(&j1));
    assert!(locks.is_pending(&j3));
    assert_eq!(
        locks.held(&j1),
        ["instance/a s", "instance/b s", "node/n1 x"]
    );
    assert_eq!(locks.held(&j2), ["instance/a s"]);
    assert_eq!(locks.pending(), ["0 J3 [node/n1, shared]"]);
    assert_eq!(
        locks.table(),
        [
            "instance/[lockset] []",
            "instance/a [J1 s, J2 s]",
            "instance/b [J1 s]",
            "node/[lockset] []",
            "node/n1 [J1 x]",
            "node/n9 [J4 x]"
        ]
    );

    assert_eq!(locks.downgrade(&j1, Level::Node), ["J3"]);
    assert_eq!(
        locks.held(&j1),
        ["instance/a s", "instance/b s", "node/n1 s"]
    );
    // Already shared: nothing changes.
    assert_eq!(locks.downgrade(&j1, Level::Node), NONE);
    assert_eq!(locks.pending(), NONE);
}

#[test]
fn intersect_locks_keeps_only_the_listed_locks() {
    let mut locks = Locks::new();
    let (j1, j2) = (job(1), job(2));
    expect_update(
        locks.try_update(&j1, &[x("instance/a"), x("instance/b"), s("node/n1")]),
        &[],
        &[],
    );
    expect_update(locks.waiting(&j2, 0, &[s("instance/a")]), &["J1"], &[]);

    assert_eq!(
        locks.intersect(&j1, &["instance/b", "node/n1", "node/n9"]),
        ["J2"]
    );
    assert_eq!(locks.held(&j1), ["instance/b x", "node/n1 s"]);
    assert_eq!(locks.held(&j2), ["instance/a s"]);
    assert_eq!(locks.pending(), NONE);
    assert_eq!(
        locks.table(),
        [
            "instance/[lockset] []",
            "instance/a [J2 s]",
            "instance/b [J1 x]",
            "node/[lockset] []",
            "node/n1 [J1 s]"
        ]
    );

    assert_eq!(locks.intersect(&j1, &[]), NONE);
    assert_eq!(locks.held(&j1), NONE);
    assert_eq!(locks.owners(), ["J2"]);
}

#[test]
fn opportunistic_union_skips_held_locks_and_never_lowers_one() {
    let mut locks = Locks::new();
    let (j1, j5) = (job(1), job(5));
    expect_update(locks.try_update(&j1, &[x("node/n4")]), &[], &[]);
    expect_update(locks.try_update(&j5, &[x("node/n1")]), &[], &[]);

    // n1 held exclusively: not lowered, not reported. n0 is below n1: an
    // order violation, silently skipped. n4 is blocked. n2 is taken.
    assert_eq!(
        locks.union(
            &j5,
            &[
                ("node/n4", Mode::Shared),
                ("node/n1", Mode::Shared),
                ("node/n2", Mode::Shared),
                ("node/n0", Mode::Exclusive),
            ]
        ),
        ["node/n2"]
    );
    assert_eq!(locks.held(&j5), ["node/n1 x", "node/n2 s"]);

    // Already satisfied: nothing new.
    assert_eq!(
        locks.union(
            &j5,
            &[("node/n1", Mode::Exclusive), ("node/n2", Mode::Shared)]
        ),
        NONE
    );
    // Held shared, asked exclusive: upgraded and reported.
    assert_eq!(
        locks.union(&j5, &[("node/n2", Mode::Exclusive)]),
        ["node/n2"]
    );
    assert_eq!(locks.held(&j5), ["node/n1 x", "node/n2 x"]);

    // Sorted by lock order before trying: a lower lock listed last is
    // still acquired first.
    let mut locks = Locks::new();
    assert_eq!(
        locks.union(
            &j5,
            &[("node/n2", Mode::Exclusive), ("instance/a", Mode::Shared)]
        ),
        ["instance/a", "node/n2"]
    );
    assert_eq!(locks.held(&j5), ["instance/a s", "node/n2 x"]);
}

// ---------------------------------------------------------------------------
// Saved state.

#[track_caller]
fn assert_same_state(left: &Locks, right: &Locks) {
    assert_eq!(left.all_locks(), right.all_locks());
    assert_eq!(left.table(), right.table());
    assert_eq!(left.pending(), right.pending());
    assert_eq!(left.owners(), right.owners());
    for n in 1..=5 {
        let owner = job(n);
        assert_eq!(left.held(&owner), right.held(&owner));
        assert_eq!(left.is_pending(&owner), right.is_pending(&owner));
    }
    assert_eq!(left.manager.saved(), right.manager.saved());
}

fn restored(locks: &Locks) -> Locks {
    let saved = locks.manager.saved();
    let manager = LockManager::restore(&saved).expect("a saved state restores");
    let copy = Locks { manager };
    copy.check();
    assert_eq!(copy.manager.saved(), saved);
    copy
}

#[test]
fn example_07_state_survives_save_and_restore() {
    let (j2, j3, j4) = (job(2), job(3), job(4));

    // In the middle: J3 holds instance/a shared, J2 waits behind it.
    let mut original = example_07_after_j1_frees();
    let mut copy = restored(&original);
    assert_same_state(&original, &copy);
    assert_eq!(copy.pending(), ["0 J2 [instance/a, exclusive]"]);
    for locks in [&mut original, &mut copy] {
        expect_pending_error(locks.try_update(&j2, &[s("node/n1")]));
        expect_update(locks.waiting(&j2, 9, &[x("instance/a")]), &["J3"], &[]);
        expect_update(locks.try_update(&j3, &[rel("instance/a")]), &[], &["J2"]);
    }
    assert_same_state(&original, &copy);

    // At the end: J2 holds instance/a exclusively, nobody waits.
    let mut copy = restored(&original);
    assert_same_state(&original, &copy);
    assert_eq!(copy.table(), ["instance/[lockset] []", "instance/a [J2 x]"]);
    for locks in [&mut original, &mut copy] {
        expect_update(locks.waiting(&j4, 1, &[s("instance/a")]), &["J2"], &[]);
        assert_eq!(locks.free(&j2), ["J4"]);
    }
    assert_same_state(&original, &copy);
    assert_eq!(copy.table(), ["instance/[lockset] []", "instance/a [J4 s]"]);
}
