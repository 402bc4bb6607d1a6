//! Damaged lock state (`locks.data`, the snapshot, and `locks.journal`):
//! wconfd refuses to start naming the file, or starts with exactly the
//! acknowledged state; it never starts with less (D36).
//!
//! The damage is made through what holds for any format: a file emptied,
//! cut in half, overwritten with garbage, garbage over the middle of the
//! journal with whole records after it, garbage appended. One case knows
//! the snapshot's layout (the impossible state, two exclusive holders of
//! one lock, is written by editing its JSON) and is marked so.

use std::fs;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::daemon::{Client, OwnerProcess, Root, Wconfd, request, status};

const SNAPSHOT: &str = "locks.data";
const JOURNAL: &str = "locks.journal";

/// Lock changes after the snapshot: the journal the damage goes into.
const CHANGES_AFTER_SNAPSHOT: usize = 20;

/// Churn rounds allowed to make wconfd write its first snapshot.
const CHURN_ROUNDS_MAX: usize = 200;

/// A root whose lock state is a snapshot plus a journal, with holders,
/// a shared holder and a waiting request; wconfd stopped.
struct Damaged {
    root: Root,
    /// Owners alive for the whole test (wconfd frees dead ones).
    owners: Vec<OwnerProcess>,
    /// `listLocksWaitingStatus` as acknowledged before the stop.
    acknowledged: Value,
    snapshot: Vec<u8>,
    journal: Vec<u8>,
}

impl Damaged {
    fn new() -> Damaged {
        let root = Root::new();
        fs::write(
            root.path().join("warden.toml"),
            "[wconfd]\nsnapshot_journal_bytes_max = 65536\n",
        )
        .expect("write warden.toml");
        let mut wconfd = Wconfd::restart_on(&root);
        let mut client = wconfd.client();
        let owners: Vec<OwnerProcess> = (1..=6)
            .map(|id| OwnerProcess::spawn(&root.livelock_dir(), id))
            .collect();
        let [a, b, waiter, churner, late, _unused] = &owners[..] else {
            unreachable!("six owners")
        };
        let call = |client: &mut Client, method: &str, args: Value| client.ok(method, args);
        call(
            &mut client,
            "tryUpdateLocks",
            json!([a.owner(), request(&[("node/a", "exclusive")])]),
        );
        call(
            &mut client,
            "tryUpdateLocks",
            json!([b.owner(), request(&[("node/b", "shared")])]),
        );
        let blockers = call(
            &mut client,
            "updateLocksWaiting",
            json!([waiter.owner(), 0, request(&[("node/a", "exclusive")])]),
        );
        assert_ne!(blockers, json!([]), "the waiter waits");
        // Large requests until wconfd writes a snapshot.
        let names: Vec<String> = (0..100).map(|index| format!("node/c{index:03}")).collect();
        let big: Vec<(&str, &str)> = names
            .iter()
            .map(|name| (name.as_str(), "exclusive"))
            .collect();
        let mut rounds = 0;
        while !root.path().join(SNAPSHOT).exists() {
            rounds += 1;
            assert!(
                rounds <= CHURN_ROUNDS_MAX,
                "no snapshot after {CHURN_ROUNDS_MAX} rounds"
            );
            call(
                &mut client,
                "tryUpdateLocks",
                json!([churner.owner(), request(&big)]),
            );
            call(&mut client, "freeLocks", json!([churner.owner()]));
        }
        for index in 0..CHANGES_AFTER_SNAPSHOT {
            let name = format!("node/z{index:02}");
            call(
                &mut client,
                "tryUpdateLocks",
                json!([late.owner(), request(&[(&name, "exclusive")])]),
            );
        }
        let acknowledged = status(&mut client);
        wconfd.stop();
        let read = |name: &str| fs::read(root.path().join(name)).expect("the lock state");
        let (snapshot, journal) = (read(SNAPSHOT), read(JOURNAL));
        assert!(
            !journal.is_empty(),
            "changes after the snapshot are in the journal"
        );
        Damaged {
            root,
            owners,
            acknowledged,
            snapshot,
            journal,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// Puts the acknowledged files back, then `name` with `bytes`.
    fn damage(&self, name: &str, bytes: &[u8]) {
        fs::write(self.path(SNAPSHOT), &self.snapshot).expect("restore");
        fs::write(self.path(JOURNAL), &self.journal).expect("restore");
        fs::write(self.path(name), bytes).expect("damage");
    }

    /// wconfd must refuse to start, naming `name`, and leave it as it was.
    fn assert_refused(&self, case: &str, name: &str) {
        let before = fs::read(self.path(name)).expect("the damaged file");
        let (status, log) = Wconfd::try_start_on(&self.root)
            .err()
            .unwrap_or_else(|| panic!("{case}: wconfd started"));
        assert!(!status.success(), "{case}: wconfd exited with {status}");
        assert!(
            log.contains(&self.path(name).display().to_string()),
            "{case}: the error does not name {name}:\n{log}"
        );
        assert_eq!(
            fs::read(self.path(name)).expect("the damaged file"),
            before,
            "{case}: {name} was changed"
        );
    }

    /// wconfd starts with exactly the acknowledged state.
    fn assert_acknowledged(&self, case: &str) {
        let mut wconfd = Wconfd::restart_on(&self.root);
        assert_eq!(status(&mut wconfd.client()), self.acknowledged, "{case}");
        wconfd.stop();
    }
}

/// Overwrites `bytes[at..]` with `garbage`.
fn overwritten(bytes: &[u8], at: usize, garbage: &[u8]) -> Vec<u8> {
    let mut damaged = bytes.to_vec();
    damaged[at..at + garbage.len()].copy_from_slice(garbage);
    damaged
}

fn garbage(length: usize) -> Vec<u8> {
    (0..length).map(|index| (index * 131 + 7) as u8).collect()
}

#[test]
fn damaged_lock_state_stops_wconfd_naming_the_file() {
    let state = Damaged::new();
    state.assert_acknowledged("undamaged");

    let half = state.snapshot.len() / 2;
    for (case, bytes) in [
        ("snapshot emptied", Vec::new()),
        ("snapshot cut in half", state.snapshot[..half].to_vec()),
        (
            "snapshot overwritten with garbage",
            garbage(state.snapshot.len()),
        ),
        (
            "snapshot with garbage in its middle",
            overwritten(&state.snapshot, half, &[0xFF; 16]),
        ),
    ] {
        state.damage(SNAPSHOT, &bytes);
        state.assert_refused(case, SNAPSHOT);
    }

    // Knows the snapshot's layout: a second exclusive holder of a lock.
    let mut snapshot: Value = serde_json::from_slice(&state.snapshot).expect("JSON");
    let holdings = snapshot["holdings"].as_array_mut().expect("holdings");
    let first = holdings[0][1].clone();
    holdings.push(json!([state.owners[5].owner(), first]));
    state.damage(SNAPSHOT, &serde_json::to_vec(&snapshot).expect("JSON"));
    state.assert_refused("two exclusive holders", SNAPSHOT);

    let third = state.journal.len() / 3;
    state.damage(JOURNAL, &overwritten(&state.journal, third, &[0xFF; 16]));
    state.assert_refused("journal with garbage before whole records", JOURNAL);
    state.damage(JOURNAL, &garbage(state.journal.len()));
    state.assert_refused("journal overwritten with garbage", JOURNAL);

    // Garbage after the last record: refused, or cut off as a torn write;
    // never less than what was acknowledged.
    let mut appended = state.journal.clone();
    appended.extend_from_slice(&garbage(13));
    state.damage(JOURNAL, &appended);
    match Wconfd::try_start_on(&state.root) {
        Ok(mut wconfd) => {
            assert_eq!(status(&mut wconfd.client()), state.acknowledged);
            wconfd.stop();
        }
        Err((status, log)) => {
            assert!(!status.success());
            assert!(log.contains(JOURNAL), "{log}");
        }
    }

    state.damage(JOURNAL, &state.journal);
    state.assert_acknowledged("restored");
}

/// Every 4-byte overwrite in the first third of the journal (headers and
/// payloads alike, with two patterns: all ones, and a plausible length of
/// 1 MiB) is refused naming the journal: whole records follow each one.
/// Run on the store itself, not the daemon: about 1,800 cases.
#[test]
fn garbage_anywhere_before_whole_journal_records_is_refused() {
    let state = Damaged::new();
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let dir = scratch.path();
    fs::write(dir.join(SNAPSHOT), &state.snapshot).expect("copy");
    let mut cases = 0;
    for at in 0..state.journal.len() / 3 {
        for pattern in [[0xFF; 4], [0x00, 0x00, 0x10, 0x00]] {
            let damaged = overwritten(&state.journal, at, &pattern);
            if damaged == state.journal {
                continue;
            }
            fs::write(dir.join(JOURNAL), &damaged).expect("damage");
            let refused = warden::store::lock_state::LockStore::open(dir)
                .err()
                .unwrap_or_else(|| panic!("garbage {pattern:?} at byte {at} was not noticed"));
            assert!(
                refused
                    .to_string()
                    .contains(&dir.join(JOURNAL).display().to_string()),
                "{refused}"
            );
            cases += 1;
        }
    }
    assert!(cases > 1000, "only {cases} cases");
}
