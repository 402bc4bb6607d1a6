//! The durable lock state: a snapshot (`locks.data`) plus a journal of the
//! operations since (`locks.journal`).
//!
//! Each operation that changed the state is appended to the journal as one
//! record, `[length u32 LE][crc32 u32 LE][JSON]`, carrying a sequence
//! number; the records of one event-loop turn share one `sync_data` (group
//! commit), so a request costs one small append, never a rewrite of the
//! table. When the journal outgrows its limit, a new snapshot records the
//! whole state with the last sequence number it contains, and the journal
//! starts over. Loading reads the snapshot, then replays the records after
//! its sequence number through the same [`LockManager::apply`] that
//! answered them.
//!
//! A crash can tear only the last record (it was never acknowledged: replies
//! wait for the sync), so a short or checksum-failing record at the end is
//! cut off. Anything else that does not read back is damage: loading stops
//! with an error naming the file.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::{StoreError, atomic_write, crc32, sync_dir};
use crate::locks::{Level, LockManager, LockOp, Owner, SavedPending, SavedState};
use crate::protocol::wconfd::{
    decode_entry, decode_lock, decode_lock_mode, decode_owner, encode_entry, encode_lock_modes,
    encode_locks, encode_owner,
};

pub const SNAPSHOT_FILE: &str = "locks.data";
pub const JOURNAL_FILE: &str = "locks.journal";

/// Version of both files' format; a file of another version is refused.
const FORMAT_VERSION: u64 = 1;

/// Bytes before each record's JSON: its length and its checksum.
const RECORD_HEADER_BYTES: usize = 8;

/// Largest journal record accepted when reading; a longer length field is
/// damage (requests are bounded far below this by the frame limit).
const RECORD_BYTES_MAX: usize = 1 << 30;

pub struct LockStore {
    snapshot_path: PathBuf,
    journal_path: PathBuf,
    journal: File,
    /// Bytes of the journal written so far (the offset of the next record).
    journal_bytes: u64,
    next_seq: u64,
    /// Records of the current turn, not yet written.
    unwritten: Vec<u8>,
}

/// What loading found, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub snapshot_seq: u64,
    pub replayed: usize,
    /// Bytes of a torn last record that were cut off.
    pub torn_bytes: u64,
}

impl LockStore {
    /// Opens (creating if needed) the lock state in `dir` and rebuilds the
    /// manager from it.
    pub fn open(dir: &Path) -> Result<(LockStore, LockManager, LoadReport), StoreError> {
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        let (mut manager, snapshot_seq) = load_snapshot(&snapshot_path)?;
        let journal_existed = journal_path.exists();
        let journal = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&journal_path)
            .map_err(StoreError::io(&journal_path))?;
        if !journal_existed {
            sync_dir(dir).map_err(StoreError::io(dir))?;
        }
        let bytes = fs::read(&journal_path).map_err(StoreError::io(&journal_path))?;
        let mut report = LoadReport {
            snapshot_seq,
            ..LoadReport::default()
        };
        let mut last_seq = snapshot_seq;
        let mut offset = 0usize;
        while offset < bytes.len() {
            let record = match read_record(&bytes[offset..]) {
                RecordRead::Whole { payload, length } => {
                    offset += length;
                    payload
                }
                RecordRead::Torn => {
                    report.torn_bytes = (bytes.len() - offset) as u64;
                    journal
                        .set_len(offset as u64)
                        .and_then(|()| journal.sync_all())
                        .map_err(StoreError::io(&journal_path))?;
                    break;
                }
                RecordRead::Damaged(reason) => {
                    return Err(StoreError::damaged(
                        &journal_path,
                        format!("record at byte {offset}: {reason}"),
                    ));
                }
            };
            let damaged = |reason: String| {
                StoreError::damaged(&journal_path, format!("record at byte {offset}: {reason}"))
            };
            let (seq, op) = decode_record(record).map_err(damaged)?;
            if seq <= snapshot_seq {
                // Already in the snapshot: it was written after this record
                // and the journal was not cut yet when the daemon stopped.
                continue;
            }
            if seq != last_seq + 1 {
                return Err(damaged(format!("sequence number {seq} follows {last_seq}")));
            }
            manager.apply(&op);
            last_seq = seq;
            report.replayed += 1;
        }
        let journal_bytes = journal
            .metadata()
            .map_err(StoreError::io(&journal_path))?
            .len();
        let store = LockStore {
            snapshot_path,
            journal_path,
            journal,
            journal_bytes,
            next_seq: last_seq + 1,
            unwritten: Vec::new(),
        };
        Ok((store, manager, report))
    }

    /// Adds an operation that changed the state to the current turn.
    pub fn record(&mut self, op: &LockOp) {
        let mut payload = encode_op(op);
        payload.insert("seq".to_owned(), json!(self.next_seq));
        self.next_seq += 1;
        let payload =
            serde_json::to_vec(&Value::Object(payload)).expect("JSON to a Vec cannot fail");
        let length = u32::try_from(payload.len()).expect("a record is far below 4 GiB");
        self.unwritten.extend_from_slice(&length.to_le_bytes());
        self.unwritten
            .extend_from_slice(&crc32(&payload).to_le_bytes());
        self.unwritten.extend_from_slice(&payload);
    }

    pub fn has_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// Makes the records of this turn durable: one write, one `sync_data`.
    /// A failure leaves the state in memory ahead of the disk; the caller
    /// must not reveal it (and must not retry as if it had worked).
    pub fn commit(&mut self) -> io::Result<()> {
        self.write()?;
        self.journal.sync_data()
    }

    /// Writes the records of this turn to the journal without waiting for
    /// the disk; answers whether there were any. They are durable once a
    /// `sync_data` of the journal (for example through `sync_handle`) that
    /// started after this write has returned.
    pub fn write(&mut self) -> io::Result<bool> {
        if self.unwritten.is_empty() {
            return Ok(false);
        }
        self.journal
            .write_all_at(&self.unwritten, self.journal_bytes)?;
        self.journal_bytes += self.unwritten.len() as u64;
        self.unwritten.clear();
        Ok(true)
    }

    /// Another handle on the journal file, for syncing it on another
    /// thread while the event loop goes on.
    pub fn sync_handle(&self) -> io::Result<File> {
        self.journal.try_clone()
    }

    pub fn journal_bytes(&self) -> u64 {
        self.journal_bytes
    }

    /// Writes a snapshot of `manager` (which must be the state after every
    /// committed record) and empties the journal.
    pub fn write_snapshot(&mut self, manager: &LockManager) -> io::Result<()> {
        assert!(
            self.unwritten.is_empty(),
            "a snapshot is taken only between turns"
        );
        let last_seq = self.next_seq - 1;
        let bytes = encode_snapshot(&manager.saved(), last_seq);
        atomic_write(&self.snapshot_path, &bytes)?;
        self.journal.set_len(0)?;
        self.journal.sync_all()?;
        self.journal_bytes = 0;
        Ok(())
    }

    pub fn snapshot_path(&self) -> &Path {
        &self.snapshot_path
    }

    pub fn journal_path(&self) -> &Path {
        &self.journal_path
    }
}

enum RecordRead<'a> {
    Whole { payload: &'a [u8], length: usize },
    Torn,
    Damaged(String),
}

fn read_record(bytes: &[u8]) -> RecordRead<'_> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return RecordRead::Torn;
    }
    let length = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let checksum = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if length > RECORD_BYTES_MAX {
        return RecordRead::Damaged(format!("length {length} is impossible"));
    }
    let end = RECORD_HEADER_BYTES + length;
    if bytes.len() < end {
        // A torn write shortens only the last record; a whole record
        // behind this one means its length field is what is damaged.
        if holds_whole_record(&bytes[RECORD_HEADER_BYTES..]) {
            return RecordRead::Damaged(format!(
                "length {length} runs past the end of the file, but whole records follow"
            ));
        }
        return RecordRead::Torn;
    }
    let payload = &bytes[RECORD_HEADER_BYTES..end];
    if crc32(payload) != checksum {
        // Only the last record can be torn; one followed by more is damage.
        if bytes.len() == end {
            return RecordRead::Torn;
        }
        return RecordRead::Damaged("checksum mismatch".to_owned());
    }
    RecordRead::Whole {
        payload,
        length: end,
    }
}

/// Whether a whole record (its length within `bytes`, its checksum right)
/// starts anywhere in `bytes`. Payloads are JSON objects, so only offsets
/// whose payload starts with `{` are checksummed.
fn holds_whole_record(bytes: &[u8]) -> bool {
    (0..bytes.len().saturating_sub(RECORD_HEADER_BYTES)).any(|start| {
        let header = &bytes[start..start + RECORD_HEADER_BYTES];
        let length = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let checksum = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let payload_start = start + RECORD_HEADER_BYTES;
        length > 0
            && length <= bytes.len() - payload_start
            && bytes[payload_start] == b'{'
            && crc32(&bytes[payload_start..payload_start + length]) == checksum
    })
}

fn load_snapshot(path: &Path) -> Result<(LockManager, u64), StoreError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Ok((LockManager::new(), 0));
        }
        Err(error) => return Err(StoreError::io(path)(error)),
    };
    let (saved, seq) =
        decode_snapshot(&bytes).map_err(|reason| StoreError::damaged(path, reason))?;
    let manager = LockManager::restore(&saved)
        .map_err(|error| StoreError::damaged(path, format!("impossible lock state: {error}")))?;
    Ok((manager, seq))
}

fn encode_snapshot(saved: &SavedState, last_seq: u64) -> Vec<u8> {
    let holdings: Vec<Value> = saved
        .holdings
        .iter()
        .map(|(owner, locks)| json!([encode_owner(owner), encode_lock_modes(locks)]))
        .collect();
    let pending: Vec<Value> = saved
        .pending
        .iter()
        .map(|waiter| {
            let request: Vec<Value> = waiter.request.iter().map(encode_entry).collect();
            json!([
                waiter.priority,
                encode_owner(&waiter.owner),
                request,
                encode_owner(&waiter.filed_under)
            ])
        })
        .collect();
    let document = json!({
        "version": FORMAT_VERSION,
        "last_seq": last_seq,
        "holdings": holdings,
        "pending": pending,
    });
    serde_json::to_vec(&document).expect("JSON to a Vec cannot fail")
}

fn decode_snapshot(bytes: &[u8]) -> Result<(SavedState, u64), String> {
    let document: Value =
        serde_json::from_slice(bytes).map_err(|error| format!("not valid JSON: {error}"))?;
    let version = document.get("version").and_then(Value::as_u64);
    if version != Some(FORMAT_VERSION) {
        return Err(format!(
            "format version {} is not the supported {FORMAT_VERSION}",
            document.get("version").unwrap_or(&Value::Null)
        ));
    }
    let last_seq = document
        .get("last_seq")
        .and_then(Value::as_u64)
        .ok_or("no last_seq")?;
    let list = |field: &str| -> Result<&Vec<Value>, String> {
        document
            .get(field)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("no list '{field}'"))
    };
    let mut saved = SavedState::default();
    for (index, item) in list("holdings")?.iter().enumerate() {
        let at = |what: String| format!("holdings[{index}] {what}");
        let Some([owner, locks]) = item.as_array().map(Vec::as_slice) else {
            return Err(at("is not [owner, locks]".to_owned()));
        };
        let owner = decode_owner(owner).map_err(|what| at(format!("owner {what}")))?;
        let locks = locks
            .as_array()
            .ok_or_else(|| at("locks is not a list".to_owned()))?
            .iter()
            .map(decode_lock_mode)
            .collect::<Result<Vec<_>, _>>()
            .map_err(at)?;
        saved.holdings.push((owner, locks));
    }
    for (index, item) in list("pending")?.iter().enumerate() {
        let at = |what: String| format!("pending[{index}] {what}");
        let Some([priority, owner, request, filed_under]) = item.as_array().map(Vec::as_slice)
        else {
            return Err(at(
                "is not [priority, owner, request, filed_under]".to_owned()
            ));
        };
        saved.pending.push(SavedPending {
            priority: priority
                .as_i64()
                .ok_or_else(|| at("priority is not an integer".to_owned()))?,
            owner: decode_owner(owner).map_err(|what| at(format!("owner {what}")))?,
            request: request
                .as_array()
                .ok_or_else(|| at("request is not a list".to_owned()))?
                .iter()
                .map(decode_entry)
                .collect::<Result<Vec<_>, _>>()
                .map_err(at)?,
            filed_under: decode_owner(filed_under)
                .map_err(|what| at(format!("filed_under {what}")))?,
        });
    }
    Ok((saved, last_seq))
}

fn encode_op(op: &LockOp) -> Map<String, Value> {
    let value = match op {
        LockOp::TryUpdate { owner, request } => json!({
            "op": "tryUpdateLocks",
            "owner": encode_owner(owner),
            "request": request.iter().map(encode_entry).collect::<Vec<_>>(),
        }),
        LockOp::UpdateWaiting {
            owner,
            priority,
            request,
        } => json!({
            "op": "updateLocksWaiting",
            "owner": encode_owner(owner),
            "priority": priority,
            "request": request.iter().map(encode_entry).collect::<Vec<_>>(),
        }),
        LockOp::FreeLocks { owner } => json!({
            "op": "freeLocks",
            "owner": encode_owner(owner),
        }),
        LockOp::FreeLocksLevel { owner, level } => json!({
            "op": "freeLocksLevel",
            "owner": encode_owner(owner),
            "level": level.as_str(),
        }),
        LockOp::DowngradeLocksLevel { owner, level } => json!({
            "op": "downGradeLocksLevel",
            "owner": encode_owner(owner),
            "level": level.as_str(),
        }),
        LockOp::IntersectLocks { owner, keep } => json!({
            "op": "intersectLocks",
            "owner": encode_owner(owner),
            "locks": encode_locks(keep),
        }),
        LockOp::OpportunisticUnion { owner, wanted } => json!({
            "op": "opportunisticLockUnion",
            "owner": encode_owner(owner),
            "wanted": encode_lock_modes(wanted),
        }),
        LockOp::GuardedOpportunisticUnion {
            count,
            owner,
            wanted,
        } => json!({
            "op": "guardedOpportunisticLockUnion",
            "count": count,
            "owner": encode_owner(owner),
            "wanted": encode_lock_modes(wanted),
        }),
    };
    match value {
        Value::Object(fields) => fields,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

fn decode_record(payload: &[u8]) -> Result<(u64, LockOp), String> {
    let value: Value =
        serde_json::from_slice(payload).map_err(|error| format!("not valid JSON: {error}"))?;
    let field = |name: &str| value.get(name).ok_or_else(|| format!("no field '{name}'"));
    let seq = field("seq")?.as_u64().ok_or("seq is not a number")?;
    let owner = || -> Result<Owner, String> {
        decode_owner(field("owner")?).map_err(|what| format!("owner {what}"))
    };
    let list = |name: &str| -> Result<&Vec<Value>, String> {
        field(name)?
            .as_array()
            .ok_or_else(|| format!("{name} is not a list"))
    };
    let level = || -> Result<Level, String> {
        let text = field("level")?.as_str().ok_or("level is not a string")?;
        Level::parse(text).map_err(|error| error.to_string())
    };
    let op_name = field("op")?.as_str().ok_or("op is not a string")?;
    let op = match op_name {
        "tryUpdateLocks" => LockOp::TryUpdate {
            owner: owner()?,
            request: list("request")?
                .iter()
                .map(decode_entry)
                .collect::<Result<_, _>>()?,
        },
        "updateLocksWaiting" => LockOp::UpdateWaiting {
            owner: owner()?,
            priority: field("priority")?
                .as_i64()
                .ok_or("priority is not an integer")?,
            request: list("request")?
                .iter()
                .map(decode_entry)
                .collect::<Result<_, _>>()?,
        },
        "freeLocks" => LockOp::FreeLocks { owner: owner()? },
        "freeLocksLevel" => LockOp::FreeLocksLevel {
            owner: owner()?,
            level: level()?,
        },
        "downGradeLocksLevel" => LockOp::DowngradeLocksLevel {
            owner: owner()?,
            level: level()?,
        },
        "intersectLocks" => LockOp::IntersectLocks {
            owner: owner()?,
            keep: list("locks")?
                .iter()
                .map(decode_lock)
                .collect::<Result<_, _>>()?,
        },
        "opportunisticLockUnion" => LockOp::OpportunisticUnion {
            owner: owner()?,
            wanted: list("wanted")?
                .iter()
                .map(decode_lock_mode)
                .collect::<Result<_, _>>()?,
        },
        "guardedOpportunisticLockUnion" => LockOp::GuardedOpportunisticUnion {
            count: field("count")?
                .as_u64()
                .and_then(|count| usize::try_from(count).ok())
                .ok_or("count is not a number")?,
            owner: owner()?,
            wanted: list("wanted")?
                .iter()
                .map(decode_lock_mode)
                .collect::<Result<_, _>>()?,
        },
        other => return Err(format!("unknown operation '{other}'")),
    };
    Ok((seq, op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::{Entry, LockName, Mode};

    fn job(id: u64) -> Owner {
        Owner::job(id, format!("/r/livelocks/job_{id:06}_1"), 100 + id as u32)
    }

    fn node(name: &str) -> LockName {
        LockName::parse(&format!("node/{name}")).expect("valid")
    }

    fn run(store: &mut LockStore, manager: &mut LockManager, op: LockOp) {
        let before = manager.changes();
        manager.apply(&op);
        if manager.changes() != before {
            store.record(&op);
        }
    }

    fn sample_ops() -> Vec<LockOp> {
        vec![
            LockOp::TryUpdate {
                owner: job(1),
                request: vec![Entry::shared(LockName::Bgl), Entry::exclusive(node("a"))],
            },
            LockOp::UpdateWaiting {
                owner: job(2),
                priority: -3,
                request: vec![Entry::exclusive(node("a"))],
            },
            LockOp::UpdateWaiting {
                owner: job(3),
                priority: 0,
                request: vec![Entry::shared(node("a"))],
            },
            LockOp::OpportunisticUnion {
                owner: job(4),
                wanted: vec![(node("b"), Mode::Exclusive), (node("a"), Mode::Shared)],
            },
            LockOp::IntersectLocks {
                owner: job(4),
                keep: vec![node("b")],
            },
            LockOp::GuardedOpportunisticUnion {
                count: 1,
                owner: job(5),
                wanted: vec![(node("c"), Mode::Exclusive)],
            },
            LockOp::DowngradeLocksLevel {
                owner: job(5),
                level: Level::Node,
            },
            LockOp::FreeLocksLevel {
                owner: job(1),
                level: Level::Cluster,
            },
            LockOp::FreeLocks { owner: job(1) },
        ]
    }

    #[test]
    fn a_reopened_store_has_the_same_state() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut store, mut manager, report) = LockStore::open(dir.path()).expect("open");
        assert_eq!(report, LoadReport::default());
        for op in sample_ops() {
            run(&mut store, &mut manager, op);
            store.commit().expect("commit");
        }
        drop(store);
        let (_, reopened, report) = LockStore::open(dir.path()).expect("reopen");
        assert!(report.replayed > 0);
        assert_eq!(reopened.saved(), manager.saved());
        reopened.check_invariants();
    }

    #[test]
    fn snapshots_cut_the_journal_and_keep_the_state() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut store, mut manager, _) = LockStore::open(dir.path()).expect("open");
        let ops = sample_ops();
        for op in &ops[..4] {
            run(&mut store, &mut manager, op.clone());
        }
        store.commit().expect("commit");
        store.write_snapshot(&manager).expect("snapshot");
        assert_eq!(store.journal_bytes(), 0);
        for op in &ops[4..] {
            run(&mut store, &mut manager, op.clone());
        }
        store.commit().expect("commit");
        drop(store);
        let (_, reopened, report) = LockStore::open(dir.path()).expect("reopen");
        assert!(report.snapshot_seq > 0);
        assert_eq!(reopened.saved(), manager.saved());
    }

    #[test]
    fn records_already_in_the_snapshot_are_not_replayed_twice() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut store, mut manager, _) = LockStore::open(dir.path()).expect("open");
        for op in sample_ops() {
            run(&mut store, &mut manager, op);
        }
        store.commit().expect("commit");
        // A crash between writing the snapshot and cutting the journal.
        let journal = fs::read(store.journal_path()).expect("journal");
        store.write_snapshot(&manager).expect("snapshot");
        fs::write(store.journal_path(), &journal).expect("restore journal");
        drop(store);
        let (_, reopened, report) = LockStore::open(dir.path()).expect("reopen");
        assert_eq!(report.replayed, 0);
        assert_eq!(reopened.saved(), manager.saved());
    }

    #[test]
    fn a_torn_last_record_is_cut_off_and_the_rest_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut store, mut manager, _) = LockStore::open(dir.path()).expect("open");
        let ops = sample_ops();
        run(&mut store, &mut manager, ops[0].clone());
        store.commit().expect("commit");
        let expected = manager.saved();
        let whole = store.journal_bytes();
        run(&mut store, &mut manager, ops[1].clone());
        store.commit().expect("commit");
        let journal_path = store.journal_path().to_owned();
        drop(store);
        let full = fs::read(&journal_path).expect("journal");
        for cut in [whole as usize + 3, full.len() - 1] {
            fs::write(&journal_path, &full[..cut]).expect("tear");
            let (store, reopened, report) = LockStore::open(dir.path()).expect("reopen");
            assert_eq!(reopened.saved(), expected);
            assert_eq!(report.torn_bytes, (cut - whole as usize) as u64);
            assert_eq!(store.journal_bytes(), whole);
        }
    }

    #[test]
    fn damage_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut store, mut manager, _) = LockStore::open(dir.path()).expect("open");
        for op in sample_ops() {
            run(&mut store, &mut manager, op);
        }
        store.commit().expect("commit");
        let journal_path = store.journal_path().to_owned();
        let snapshot_path = store.snapshot_path().to_owned();
        drop(store);
        let mut journal = fs::read(&journal_path).expect("journal");
        journal[RECORD_HEADER_BYTES + 2] ^= 0x20;
        fs::write(&journal_path, &journal).expect("damage");
        let error = LockStore::open(dir.path()).err().expect("damaged journal");
        assert!(error.to_string().contains(JOURNAL_FILE), "{error}");
        assert!(error.to_string().contains("checksum"), "{error}");

        fs::write(&journal_path, b"").expect("empty journal");
        for (bytes, expected) in [
            (&b""[..], "not valid JSON"),
            (&b"{\"version\": 9}"[..], "format version"),
            (&b"garbage"[..], "not valid JSON"),
        ] {
            fs::write(&snapshot_path, bytes).expect("damage");
            let error = LockStore::open(dir.path()).err().expect("damaged snapshot");
            assert!(error.to_string().contains(SNAPSHOT_FILE), "{error}");
            assert!(error.to_string().contains(expected), "{error}");
        }
        let two_exclusive = json!({
            "version": 1, "last_seq": 0, "pending": [],
            "holdings": [
                [[1, "/l/a", 1], [["node/a", "exclusive"]]],
                [[2, "/l/b", 2], [["node/a", "exclusive"]]],
            ],
        });
        fs::write(&snapshot_path, two_exclusive.to_string()).expect("impossible");
        let error = LockStore::open(dir.path()).err().expect("impossible state");
        assert!(
            error.to_string().contains("impossible lock state"),
            "{error}"
        );
    }
}
