//! Damaged lock state (`locks.data`, the snapshot, and `locks.journal`):
//! wconfd refuses to start naming the file, or starts with exactly the
//! acknowledged state; it never starts with less (D36). The one thing
//! that cannot be told from a crash is damage within the journal's last
//! write: it reads as that write torn, and is cut (D28, D36).
//!
//! Most damage is made through what holds for any format: a file emptied,
//! cut in half, overwritten with garbage. Two kinds of damage know a
//! layout and are marked so: the impossible state (two exclusive holders
//! of one lock) is written by editing the snapshot's JSON, and garbage
//! goes inside the records of one write of the journal, with the records
//! of later writes after it, which takes finding the records of the
//! journal's format 2 (a header block, then `[crc32 u32][length u32][seq
//! u64][first_seq u64][JSON]` back to back in a zero-filled file).

use std::fs;
use std::path::PathBuf;

use serde_json::{Value, json};

use warden::locks::SavedState;
use warden::store::lock_state::{JOURNAL_HEADER_BYTES, LockStore, RECORD_HEADER_BYTES};

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

/// A record of the journal's current round, as format 2 lays it out.
#[derive(Debug)]
struct JournalRecord {
    offset: usize,
    /// Bytes of the record, header included.
    bytes: usize,
    /// The sequence number of the first record of the same write.
    first_seq: u64,
}

impl JournalRecord {
    fn end(&self) -> usize {
        self.offset + self.bytes
    }
}

/// The records of the journal's current round: from the header block on,
/// while the sequence numbers follow each other (zeros, or a record of an
/// earlier round, end it). Knows format 2.
fn current_round(journal: &[u8]) -> Vec<JournalRecord> {
    let u32_at = |at: usize| u32::from_le_bytes(journal[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(journal[at..at + 8].try_into().expect("8 bytes"));
    let mut records: Vec<JournalRecord> = Vec::new();
    let mut offset = JOURNAL_HEADER_BYTES;
    let mut previous: Option<u64> = None;
    while offset + RECORD_HEADER_BYTES <= journal.len() {
        let length = u32_at(offset + 4) as usize;
        let seq = u64_at(offset + 8);
        if length == 0 || previous.is_some_and(|previous| seq != previous + 1) {
            break;
        }
        records.push(JournalRecord {
            offset,
            bytes: RECORD_HEADER_BYTES + length,
            first_seq: u64_at(offset + 16),
        });
        previous = Some(seq);
        offset += RECORD_HEADER_BYTES + length;
    }
    records
}

/// Where the journal's last write starts: the offset of its first record.
fn last_write_start(records: &[JournalRecord]) -> usize {
    let last = records.last().expect("records in the journal");
    records
        .iter()
        .find(|record| record.first_seq == last.first_seq)
        .expect("the last record at least")
        .offset
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

    // Knows the journal's layout: garbage in the middle of a record of an
    // earlier write, acknowledged writes after it.
    let records = current_round(&state.journal);
    let middle = &records[records.len() / 2];
    assert!(
        middle.end() <= last_write_start(&records),
        "later writes follow the damaged record: {records:?}"
    );
    state.damage(
        JOURNAL,
        &overwritten(
            &state.journal,
            middle.offset + middle.bytes / 2,
            &[0xFF; 16],
        ),
    );
    state.assert_refused("journal with garbage before whole records", JOURNAL);
    state.damage(JOURNAL, &garbage(state.journal.len()));
    state.assert_refused("journal overwritten with garbage", JOURNAL);

    // Garbage right after the last record (over the zeros that end the
    // journal) and appended to the file: refused, or cut off as a torn
    // write; never less than what was acknowledged.
    let end = records.last().expect("records").end();
    let mut appended = state.journal.clone();
    appended.extend_from_slice(&garbage(13));
    for (case, bytes) in [
        (
            "garbage after the last record",
            overwritten(&state.journal, end, &garbage(13)),
        ),
        ("garbage appended", appended),
    ] {
        state.damage(JOURNAL, &bytes);
        match Wconfd::try_start_on(&state.root) {
            Ok(mut wconfd) => {
                assert_eq!(status(&mut wconfd.client()), state.acknowledged, "{case}");
                wconfd.stop();
            }
            Err((status, log)) => {
                assert!(!status.success(), "{case}");
                assert!(log.contains(JOURNAL), "{case}: {log}");
            }
        }
    }

    state.damage(JOURNAL, &state.journal);
    state.assert_acknowledged("restored");
}

/// Every 4-byte overwrite of the journal before its last write (header
/// bytes, record headers and payloads alike, all ones; over record headers
/// also a plausible length of 1 MiB) is refused naming the journal, which
/// is left as it was: the records of later writes follow each one. An
/// overwrite in the last write reads as that write torn: the state after
/// some prefix of it (the acknowledged state or less by that write, the
/// one thing a crash cannot be told from); one after it changes nothing.
/// Run on the store itself, not the daemon: about 3,700 cases. Knows the
/// journal's layout.
#[test]
fn garbage_anywhere_before_the_last_journal_write_is_refused() {
    let state = Damaged::new();
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let dir = scratch.path();
    let journal_path = dir.join(JOURNAL);
    fs::write(dir.join(SNAPSHOT), &state.snapshot).expect("copy");
    let load = |bytes: &[u8]| -> Result<SavedState, String> {
        fs::write(&journal_path, bytes).expect("write the journal");
        LockStore::open(dir)
            .map(|(_, manager, _, _)| manager.saved())
            .map_err(|error| error.to_string())
    };
    let records = current_round(&state.journal);
    let last_write = last_write_start(&records);
    let end = records.last().expect("records").end();
    assert!(
        records.len() >= CHANGES_AFTER_SNAPSHOT,
        "the changes after the snapshot are in the current round: {records:?}"
    );
    // The states a torn last write may leave: after each prefix of it.
    let acknowledged = load(&state.journal).expect("the undamaged journal");
    let torn_from = |from: usize| {
        let mut torn = state.journal.clone();
        torn[from..end].fill(0);
        load(&torn).expect("a journal with a write cut")
    };
    let mut torn_states = vec![acknowledged.clone()];
    for record in records.iter().filter(|record| record.offset >= last_write) {
        torn_states.push(torn_from(record.offset));
    }
    assert!(
        !torn_states[1..].contains(&acknowledged),
        "the last write changed the state"
    );
    // Garbage over the boundary between the last write and the one before
    // leaves no whole record of a later write behind the damage: it reads
    // as the earlier write torn (D36), whose record was acknowledged.
    let previous_record = records
        .iter()
        .rfind(|record| record.offset < last_write)
        .expect("a write before the last");
    let mut boundary_states = torn_states.clone();
    boundary_states.push(torn_from(previous_record.offset));

    let mut cases = 0;
    let offsets = (0..64).chain(JOURNAL_HEADER_BYTES..end + 2 * RECORD_HEADER_BYTES);
    for at in offsets {
        let in_a_header = at < JOURNAL_HEADER_BYTES
            || records
                .iter()
                .any(|record| (record.offset..record.offset + RECORD_HEADER_BYTES).contains(&at));
        let patterns: &[[u8; 4]] = if in_a_header {
            &[[0xFF; 4], [0x00, 0x00, 0x10, 0x00]]
        } else {
            &[[0xFF; 4]]
        };
        for pattern in patterns {
            let damaged = overwritten(&state.journal, at, pattern);
            if damaged == state.journal {
                continue;
            }
            cases += 1;
            let loaded = load(&damaged);
            if at + pattern.len() <= last_write {
                let refused = loaded.err().unwrap_or_else(|| {
                    panic!(
                        "garbage {pattern:?} at byte {at}, before the last write, was not noticed"
                    )
                });
                assert!(
                    refused.contains(&journal_path.display().to_string()),
                    "{refused}"
                );
                assert!(
                    fs::read(&journal_path).expect("the journal") == damaged,
                    "garbage {pattern:?} at byte {at}: the refused journal was changed"
                );
            } else if at < end {
                let loaded = loaded.unwrap_or_else(|error| {
                    panic!("garbage {pattern:?} at byte {at}, in the last write: {error}")
                });
                let possible = if at < last_write {
                    &boundary_states
                } else {
                    &torn_states
                };
                assert!(
                    possible.contains(&loaded),
                    "garbage {pattern:?} at byte {at}, in the last write, left a state \
                     no crash could"
                );
            } else {
                assert_eq!(
                    loaded.as_ref(),
                    Ok(&acknowledged),
                    "garbage {pattern:?} at byte {at}, after the last record"
                );
            }
        }
    }
    assert!(cases > 1000, "only {cases} cases");
}
