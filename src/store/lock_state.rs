//! The durable lock state: a snapshot (`locks.data`) plus a journal of the
//! operations since (`locks.journal`).
//!
//! Each operation that changed the state becomes one journal record; the
//! records of one event-loop turn go to the disk in one write (group
//! commit), so a request costs a small write, never a rewrite of the table.
//! When the journal outgrows its limit, a new snapshot records the whole
//! state with the last sequence number it contains, and the journal starts
//! over from its beginning. Loading reads the snapshot, then replays the
//! records after its sequence number through the same
//! [`LockManager::apply`] that answered them.
//!
//! The journal file (format version [`FORMAT_VERSION`]):
//! - a header block of [`JOURNAL_HEADER_BYTES`]: magic, format version,
//!   checksum;
//! - records, back to back: `[crc32 u32][length u32][seq u64][first_seq
//!   u64][JSON object]` (little endian; the checksum covers everything
//!   after it). `seq` numbers the operations without gaps; `first_seq` is
//!   the `seq` of the first record of the same write;
//! - after the last record, zeros (at least one record header's worth):
//!   the end. The file is zero-filled ahead of the records, grown
//!   [`JOURNAL_GROWTH_BYTES`] at a time, and reused from its beginning
//!   after each snapshot, so a write overwrites zeros or records of an
//!   earlier round and never changes the file's size: a sync commits no
//!   file system metadata.
//!
//! Where the file system offers direct I/O, the journal is written with
//! `O_DIRECT | O_DSYNC` in blocks of its alignment (the block holding the
//! end of the previous write is written again with the same bytes), one
//! write per turn and no separate sync. Elsewhere (tmpfs, older kernels)
//! the same bytes are written through the page cache and synced with
//! `sync_data`. The format is the same either way.
//!
//! Reading: from the first record on, sequence numbers must follow each
//! other (records already in the snapshot are skipped). The journal ends at
//! the first record that does not read back, or at a record with a lower
//! sequence number (left from an earlier round). A crash can only leave its
//! last write unfinished, in any order of its blocks, and that write was
//! never acknowledged (replies wait for it). So beyond the end, a whole
//! record of the current round (sequence number above the last one read)
//! must come from that same write, which `first_seq` tells: one written by
//! a *later* write than the missing record means the journal was damaged
//! after it was written, and loading stops with an error naming the file
//! (the file is left as it was). Otherwise the pieces of the unfinished
//! write are zeroed before anything new is written, so none of them can
//! ever be read as part of the journal. Damage within the last write, or
//! reaching into it from the end of the write before, leaves no whole
//! record of a later write behind it: it reads as that write torn, which
//! a crash can leave too, and is cut (DECISIONS D36).

use crate::limits::JOURNAL_RECORD_BYTES_MAX;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::ser::{Serialize, SerializeMap, SerializeTuple, Serializer};
use serde_json::{Value, json};

use super::{StoreError, atomic_write, crc32};
use crate::locks::{
    Deadlocks, Death, Entry, Fairness, Grant, Ident, Level, LockManager, LockName, LockOp,
    LockPolicy, Mode, Owner, SavedExtensions, SavedPending, SavedState,
};
use crate::protocol::wconfd::{
    decode_entry, decode_lock, decode_lock_mode, decode_owner, encode_death, encode_entry,
    encode_lock_modes, encode_owner,
};
use crate::protocol::workers::{
    decode_caps, decode_groups, decode_request, decode_saved_worker, decode_strings, encode_caps,
    encode_request, encode_saved_worker,
};
use crate::sys;
use crate::workers::{Registry, SavedRegistry, WorkerOp};

use crate::paths::{LOCK_JOURNAL_FILE as JOURNAL_FILE, LOCK_SNAPSHOT_FILE as SNAPSHOT_FILE};

/// Version of both files' format; a file of another version is refused
/// (DECISIONS D28: no migration before the first release). Version 1 was
/// a journal appended to and synced with `fdatasync`, sequence numbers in
/// the JSON.
pub const FORMAT_VERSION: u64 = 2;

/// The journal's first bytes.
const JOURNAL_MAGIC: &[u8; 8] = b"wardenLJ";

/// The header block: the largest direct I/O alignment used, so writes of
/// records never touch it.
pub const JOURNAL_HEADER_BYTES: usize = 4096;

/// Bytes before each record's JSON: checksum, length, `seq`, `first_seq`.
pub const RECORD_HEADER_BYTES: usize = 24;

/// Zero-filled space added to the journal file at a time: a write that
/// extends the file commits metadata too, so it is paid once per this
/// many bytes of records, not per write; small enough that a new root
/// costs little disk.
pub const JOURNAL_GROWTH_BYTES: u64 = 1024 * 1024;

/// How the journal reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalIo {
    /// `O_DIRECT | O_DSYNC`, in writes aligned to `alignment` bytes.
    Direct { alignment: usize },
    /// Through the page cache, then `sync_data`: for file systems without
    /// direct I/O.
    Buffered,
}

impl std::fmt::Display for JournalIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalIo::Direct { alignment } => {
                write!(
                    f,
                    "direct I/O (O_DIRECT | O_DSYNC, {alignment}-byte blocks)"
                )
            }
            JournalIo::Buffered => write!(f, "buffered writes and fdatasync"),
        }
    }
}

pub struct LockStore {
    snapshot_path: PathBuf,
    journal_path: PathBuf,
    /// Record writes: opened for direct I/O when `io` says so.
    journal: File,
    /// The same file through the page cache, to grow it.
    plain: File,
    io: JournalIo,
    /// File offset of the next record (the end of the journal).
    end: u64,
    /// Size of the journal file, zero-filled or older records beyond `end`.
    file_bytes: u64,
    /// The bytes of the journal from the block boundary at or before
    /// `end` up to `end`, as on disk: direct I/O writes that block again.
    tail: Vec<u8>,
    next_seq: u64,
    /// Records of the current turn, not yet written.
    unwritten: Vec<u8>,
    /// The `seq` of the first record in `unwritten`.
    unwritten_first_seq: u64,
    /// Memory for aligned writes, reused.
    buffer: Vec<u8>,
}

/// What loading found, for the log.
#[derive(Debug, Default, PartialEq)]
pub struct LoadReport {
    pub snapshot_seq: u64,
    pub replayed: usize,
    /// Bytes of an unfinished last write that were zeroed (0: none).
    pub torn_bytes: u64,
    /// The events the journal holds (the turns since the snapshot), in
    /// order: the event sequence gets those it lacks.
    pub events: Vec<crate::events::Event>,
}

impl LockStore {
    /// Opens (creating if needed) the lock state in `dir` and rebuilds the
    /// manager from it; the journal is written with direct I/O where the
    /// file system offers it.
    pub fn open(dir: &Path) -> Result<(LockStore, LockManager, Registry, LoadReport), StoreError> {
        LockStore::open_with(dir, true, 0)
    }

    /// As [`LockStore::open`]; with `direct_allowed` false the journal is
    /// written through the page cache whatever the file system offers (the
    /// path file systems without direct I/O take). `quarantine_after` is
    /// the worker registry's setting, which its replay follows.
    pub fn open_with(
        dir: &Path,
        direct_allowed: bool,
        quarantine_after: usize,
    ) -> Result<(LockStore, LockManager, Registry, LoadReport), StoreError> {
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        let (mut manager, mut workers, snapshot_seq) =
            load_snapshot(&snapshot_path, quarantine_after)?;
        let fresh = match fs::metadata(&journal_path) {
            Ok(metadata) => metadata.len() == 0,
            Err(error) if error.kind() == io::ErrorKind::NotFound => true,
            Err(error) => return Err(StoreError::io(&journal_path)(error)),
        };
        if fresh {
            // Created whole or not at all: a crash cannot leave a journal
            // without its header.
            let mut bytes = journal_header();
            bytes.resize(JOURNAL_HEADER_BYTES + JOURNAL_GROWTH_BYTES as usize, 0);
            atomic_write(&journal_path, &bytes).map_err(StoreError::io(&journal_path))?;
        }
        let bytes = fs::read(&journal_path).map_err(StoreError::io(&journal_path))?;
        check_journal_header(&bytes)
            .map_err(|reason| StoreError::damaged(&journal_path, reason))?;
        let replay = replay(&bytes, snapshot_seq, &mut manager, &mut workers)
            .map_err(|reason| StoreError::damaged(&journal_path, reason))?;
        let (journal, plain, io) =
            open_journal(&journal_path, direct_allowed).map_err(StoreError::io(&journal_path))?;
        let mut store = LockStore {
            snapshot_path,
            journal_path,
            journal,
            plain,
            io,
            end: replay.end as u64,
            file_bytes: bytes.len() as u64,
            tail: Vec::new(),
            next_seq: replay.last_seq + 1,
            unwritten: Vec::new(),
            unwritten_first_seq: 0,
            buffer: Vec::new(),
        };
        store.tail = bytes[store.block_start(store.end) as usize..replay.end].to_vec();
        let mut report = LoadReport {
            snapshot_seq,
            replayed: replay.replayed,
            torn_bytes: 0,
            events: replay.events,
        };
        if let Some(torn_end) = replay.torn_end {
            // Zero what the unfinished write left, so that no piece of it
            // can follow a record written from now on.
            let torn_bytes = torn_end.min(bytes.len()) - replay.end;
            store
                .write_at_end(&[], torn_bytes)
                .map_err(StoreError::io(&store.journal_path))?;
            report.torn_bytes = torn_bytes as u64;
        }
        if replay.replayed == 0 {
            // Everything read is in the snapshot: start the round over
            // (records of this round follow it without a gap).
            store.end = JOURNAL_HEADER_BYTES as u64;
            store.tail.clear();
        }
        Ok((store, manager, workers, report))
    }

    /// Adds an operation that changed the lock state to the current turn.
    pub fn record(&mut self, op: &LockOp) {
        self.push_record(&RecordJson(op));
    }

    /// Adds an operation with the events it made (their lines, newline
    /// ended) in the same record, so that a torn write keeps both or
    /// neither; loading hands the events back.
    pub fn record_with_events<'a>(&mut self, op: &LockOp, events: impl Iterator<Item = &'a [u8]>) {
        self.push_json(|buffer| {
            serde_json::to_writer(&mut *buffer, &RecordJson(op)).expect("JSON to a Vec");
            with_events(buffer, events);
        });
    }

    /// Adds a call of the worker registry (made at `now`) to the current
    /// turn, with the events it made.
    pub fn record_worker<'a>(
        &mut self,
        op: &WorkerOp,
        now: f64,
        events: impl Iterator<Item = &'a [u8]>,
    ) {
        self.push_json(|buffer| {
            serde_json::to_writer(&mut *buffer, &encode_worker_op(op, now)).expect("JSON to a Vec");
            with_events(buffer, events);
        });
    }

    /// Adds events of no recorded operation (`config.written`) as a record
    /// of their own, `{"op": "events", "events": [...]}`.
    pub fn record_events<'a>(&mut self, events: impl Iterator<Item = &'a [u8]>) {
        self.push_json(|buffer| {
            buffer.extend_from_slice(b"{\"op\":\"events\"}");
            with_events(buffer, events);
        });
    }

    fn push_record(&mut self, record: &impl Serialize) {
        self.push_json(|buffer| {
            serde_json::to_writer(buffer, record).expect("JSON to a Vec cannot fail")
        });
    }

    /// Adds a record whose JSON `write` appends.
    fn push_json(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        if self.unwritten.is_empty() {
            self.unwritten_first_seq = self.next_seq;
        }
        let start = self.unwritten.len();
        // The header with the length left blank, then the JSON straight
        // after it, then the length.
        self.unwritten.extend_from_slice(&[0; 8]);
        self.unwritten
            .extend_from_slice(&self.next_seq.to_le_bytes());
        self.unwritten
            .extend_from_slice(&self.unwritten_first_seq.to_le_bytes());
        write(&mut self.unwritten);
        let length = self.unwritten.len() - start - RECORD_HEADER_BYTES;
        let length = u32::try_from(length).expect("a record is far below 4 GiB");
        self.unwritten[start + 4..start + 8].copy_from_slice(&length.to_le_bytes());
        let checksum = crc32(&self.unwritten[start + 4..]);
        self.unwritten[start..start + 4].copy_from_slice(&checksum.to_le_bytes());
        self.next_seq += 1;
    }

    pub fn has_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// Makes the records of this turn durable: one write (with direct I/O)
    /// or one write and one `sync_data`. A failure leaves the state in
    /// memory ahead of the disk; the caller must not reveal it (and must
    /// not retry as if it had worked).
    pub fn commit(&mut self) -> io::Result<()> {
        if self.unwritten.is_empty() {
            return Ok(());
        }
        let records = std::mem::take(&mut self.unwritten);
        self.write_at_end(&records, RECORD_HEADER_BYTES)?;
        self.unwritten = records;
        self.unwritten.clear();
        Ok(())
    }

    /// Writes `records` at the end of the journal followed by `zeros` zero
    /// bytes, durably, and moves the end past the records. With direct I/O
    /// the write starts at the block holding the end (written again as it
    /// is) and is padded with zeros to a whole block.
    fn write_at_end(&mut self, records: &[u8], zeros: usize) -> io::Result<()> {
        let start = self.block_start(self.end);
        debug_assert_eq!(start + self.tail.len() as u64, self.end);
        let content = self.tail.len() + records.len() + zeros;
        let alignment = self.alignment();
        let total = content.div_ceil(alignment) * alignment;
        self.grow_to(start + total as u64)?;
        let buffer = aligned_zeroed(&mut self.buffer, total, alignment);
        buffer[..self.tail.len()].copy_from_slice(&self.tail);
        buffer[self.tail.len()..self.tail.len() + records.len()].copy_from_slice(records);
        self.journal.write_all_at(buffer, start)?;
        if self.io == JournalIo::Buffered {
            self.journal.sync_data()?;
        }
        let new_end = self.end + records.len() as u64;
        let new_start = new_end - new_end % alignment as u64;
        let kept = (new_start - start) as usize..(new_end - start) as usize;
        self.tail.clear();
        self.tail.extend_from_slice(&buffer[kept]);
        self.end = new_end;
        Ok(())
    }

    /// Extends the zero-filled journal file to at least `bytes`, through
    /// the page cache (the file's size need not be aligned), durably.
    fn grow_to(&mut self, bytes: u64) -> io::Result<()> {
        if bytes <= self.file_bytes {
            return Ok(());
        }
        let target = bytes.div_ceil(JOURNAL_GROWTH_BYTES) * JOURNAL_GROWTH_BYTES;
        let zeros = vec![0u8; JOURNAL_GROWTH_BYTES as usize];
        while self.file_bytes < target {
            let chunk = (target - self.file_bytes).min(JOURNAL_GROWTH_BYTES) as usize;
            self.plain.write_all_at(&zeros[..chunk], self.file_bytes)?;
            self.file_bytes += chunk as u64;
        }
        self.plain.sync_data()
    }

    fn alignment(&self) -> usize {
        match self.io {
            JournalIo::Direct { alignment } => alignment,
            JournalIo::Buffered => 1,
        }
    }

    /// The offset of the block holding `offset`, as writes are aligned.
    fn block_start(&self, offset: u64) -> u64 {
        offset - offset % self.alignment() as u64
    }

    /// Bytes of records in the journal's current round.
    pub fn journal_bytes(&self) -> u64 {
        self.end - JOURNAL_HEADER_BYTES as u64
    }

    pub fn journal_io(&self) -> JournalIo {
        self.io
    }

    /// Writes a snapshot of `manager` (which must be the state after every
    /// committed record) and starts the journal over. The journal itself is
    /// not touched: the next write goes to its beginning, and until then
    /// its records all read as already in the snapshot.
    pub fn write_snapshot(&mut self, manager: &LockManager, workers: &Registry) -> io::Result<()> {
        assert!(
            self.unwritten.is_empty(),
            "a snapshot is taken only between turns"
        );
        let last_seq = self.next_seq - 1;
        let bytes = encode_snapshot(
            &manager.saved(),
            &manager.saved_extensions(),
            &workers.saved(),
            last_seq,
        );
        atomic_write(&self.snapshot_path, &bytes)?;
        self.end = JOURNAL_HEADER_BYTES as u64;
        self.tail.clear();
        Ok(())
    }

    pub fn snapshot_path(&self) -> &Path {
        &self.snapshot_path
    }

    pub fn journal_path(&self) -> &Path {
        &self.journal_path
    }
}

/// A zeroed slice of `len` bytes of `storage` whose address is a multiple
/// of `alignment` (direct I/O needs aligned memory).
fn aligned_zeroed(storage: &mut Vec<u8>, len: usize, alignment: usize) -> &mut [u8] {
    if storage.len() < len + alignment {
        *storage = vec![0; (len + alignment).next_power_of_two()];
    }
    let offset = storage.as_ptr().align_offset(alignment);
    assert!(offset < alignment, "a byte address can always be aligned");
    let slice = &mut storage[offset..offset + len];
    slice.fill(0);
    slice
}

/// Opens the journal twice: for writing records (with direct I/O when
/// the file system offers it with an alignment the header block covers and
/// a first aligned write, of the header as it is, succeeds; else through
/// the page cache) and through the page cache (to grow the file).
fn open_journal(path: &Path, direct_allowed: bool) -> io::Result<(File, File, JournalIo)> {
    let open = || OpenOptions::new().read(true).write(true).open(path);
    let plain = open()?;
    let buffered =
        || -> io::Result<(File, File, JournalIo)> { Ok((open()?, open()?, JournalIo::Buffered)) };
    if !direct_allowed {
        return buffered();
    }
    let alignment = match sys::direct_io_alignment(&plain) {
        Ok(Some(alignment)) if alignment.is_power_of_two() && alignment <= JOURNAL_HEADER_BYTES => {
            alignment
        }
        Ok(_) => return buffered(),
        Err(error) => {
            tracing::debug!(%error, "cannot ask the file system about direct I/O");
            return buffered();
        }
    };
    let is_refusal = |error: &io::Error| error.raw_os_error() == Some(nix::libc::EINVAL);
    let direct = match sys::open_direct_dsync(path) {
        Ok(direct) => direct,
        Err(error) if is_refusal(&error) => return buffered(),
        Err(error) => return Err(error),
    };
    let mut storage = Vec::new();
    let header = aligned_zeroed(&mut storage, JOURNAL_HEADER_BYTES, alignment);
    let written = journal_header();
    header[..written.len()].copy_from_slice(&written);
    match direct.write_all_at(header, 0) {
        Ok(()) => Ok((direct, plain, JournalIo::Direct { alignment })),
        Err(error) if is_refusal(&error) => buffered(),
        Err(error) => Err(error),
    }
}

/// The header's meaningful bytes: magic, version, checksum of both.
fn journal_header() -> Vec<u8> {
    let mut header = Vec::with_capacity(JOURNAL_HEADER_BYTES);
    header.extend_from_slice(JOURNAL_MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let checksum = crc32(&header);
    header.extend_from_slice(&checksum.to_le_bytes());
    header
}

fn check_journal_header(bytes: &[u8]) -> Result<(), String> {
    let meaningful = JOURNAL_MAGIC.len() + 8 + 4;
    if bytes.len() < JOURNAL_HEADER_BYTES || &bytes[..JOURNAL_MAGIC.len()] != JOURNAL_MAGIC {
        return Err(format!(
            "not a lock journal of format version {FORMAT_VERSION} (an older warden's \
             format, or damaged); this warden reads only version {FORMAT_VERSION}"
        ));
    }
    let version = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let checksum = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if crc32(&bytes[..16]) != checksum {
        return Err("the journal header's checksum does not match".to_owned());
    }
    if version != FORMAT_VERSION {
        return Err(format!(
            "journal format version {version} is not the supported {FORMAT_VERSION}"
        ));
    }
    if bytes[meaningful..JOURNAL_HEADER_BYTES]
        .iter()
        .any(|byte| *byte != 0)
    {
        return Err("the journal header block holds stray bytes".to_owned());
    }
    Ok(())
}

/// A record that reads back whole.
struct Record<'a> {
    seq: u64,
    first_seq: u64,
    payload: &'a [u8],
    /// Bytes of the record, header included.
    bytes: usize,
}

/// The record at `offset`, if one reads back whole there.
fn parse_record(bytes: &[u8], offset: usize) -> Option<Record<'_>> {
    let header = bytes.get(offset..offset.checked_add(RECORD_HEADER_BYTES)?)?;
    let length = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
    if length == 0 || length > JOURNAL_RECORD_BYTES_MAX {
        return None;
    }
    let end = offset + RECORD_HEADER_BYTES + length;
    let whole = bytes.get(offset..end)?;
    // The JSON is an object: a cheap test before the checksum, which
    // matters when looking for records among arbitrary bytes.
    if whole[RECORD_HEADER_BYTES] != b'{' || whole[whole.len() - 1] != b'}' {
        return None;
    }
    let checksum = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    if crc32(&whole[4..]) != checksum {
        return None;
    }
    Some(Record {
        seq: u64::from_le_bytes(header[8..16].try_into().expect("8 bytes")),
        first_seq: u64::from_le_bytes(header[16..24].try_into().expect("8 bytes")),
        payload: &whole[RECORD_HEADER_BYTES..],
        bytes: RECORD_HEADER_BYTES + length,
    })
}

/// What replaying the journal found.
struct Replay {
    /// Offset just past the last record read: where the journal ends.
    end: usize,
    /// The last sequence number in the state (the snapshot's if no record
    /// was replayed).
    last_seq: u64,
    replayed: usize,
    /// Set when an unfinished write left bytes beyond the end: they must be
    /// zeroed up to here.
    torn_end: Option<usize>,
    events: Vec<crate::events::Event>,
}

/// Replays the records of `bytes` (a whole journal file) after
/// `snapshot_seq` into `manager`; see the module documentation for the
/// rules. An error says what is damaged, and where.
fn replay(
    bytes: &[u8],
    snapshot_seq: u64,
    manager: &mut LockManager,
    workers: &mut Registry,
) -> Result<Replay, String> {
    let mut offset = JOURNAL_HEADER_BYTES;
    let mut previous: Option<u64> = None;
    let mut last_seq = snapshot_seq;
    let mut replayed = 0;
    let mut events = Vec::new();
    while let Some(record) = parse_record(bytes, offset) {
        let expected = previous.map_or(snapshot_seq + 1, |seq| seq + 1);
        let follows = match previous {
            None => record.seq <= expected,
            Some(_) => record.seq == expected,
        };
        if !follows {
            if previous.is_some_and(|seq| record.seq <= seq) {
                break; // a record of an earlier round: the end
            }
            return Err(format!(
                "record at byte {offset}: sequence number {} where {expected} was due",
                record.seq
            ));
        }
        if record.seq > snapshot_seq {
            let (op, mut carried) = decode_record(record.payload)
                .map_err(|reason| format!("record at byte {offset}: {reason}"))?;
            events.append(&mut carried);
            match op {
                Journaled::Lock(op) => {
                    manager.apply(&op);
                }
                Journaled::Worker(op, now) => {
                    // Journaled only once accepted, so it is accepted again.
                    let _ = workers.apply(&op, now);
                }
                Journaled::Events => {}
            }
            last_seq = record.seq;
            replayed += 1;
        }
        previous = Some(record.seq);
        offset += record.bytes;
    }
    let end = offset;
    // Beyond the end, only the pieces of one unfinished write may hold
    // records of this round. A record's JSON starts with `{`: only the
    // places before one are looked at.
    let mut torn_end: Option<usize> = None;
    let mut from = end + RECORD_HEADER_BYTES;
    while let Some(found) = bytes
        .get(from..)
        .and_then(|rest| rest.iter().position(|byte| *byte == b'{'))
    {
        let brace = from + found;
        let at = brace - RECORD_HEADER_BYTES;
        if let Some(record) = parse_record(bytes, at)
            && record.seq > last_seq
        {
            if record.first_seq > last_seq + 1 {
                return Err(format!(
                    "the record at byte {end} does not read back, yet record {} at byte \
                     {at} was written after it (by a later write)",
                    record.seq
                ));
            }
            torn_end = torn_end.max(Some(at + record.bytes));
        }
        from = brace + 1;
    }
    let end_marker = &bytes[end..(end + RECORD_HEADER_BYTES).min(bytes.len())];
    if end_marker.iter().any(|byte| *byte != 0) {
        torn_end = Some(torn_end.unwrap_or(0).max(end + RECORD_HEADER_BYTES));
    }
    Ok(Replay {
        end,
        last_seq,
        replayed,
        torn_end,
        events,
    })
}

fn load_snapshot(
    path: &Path,
    quarantine_after: usize,
) -> Result<(LockManager, Registry, u64), StoreError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Ok((
                LockManager::new(),
                Registry::with_quarantine_after(quarantine_after),
                0,
            ));
        }
        Err(error) => return Err(StoreError::io(path)(error)),
    };
    let (saved, extensions, saved_workers, seq) =
        decode_snapshot(&bytes).map_err(|reason| StoreError::damaged(path, reason))?;
    let manager = LockManager::restore_with(&saved, &extensions)
        .map_err(|error| StoreError::damaged(path, format!("impossible lock state: {error}")))?;
    let workers = Registry::restore(saved_workers, quarantine_after).map_err(|error| {
        StoreError::damaged(path, format!("impossible worker registry: {error}"))
    })?;
    Ok((manager, workers, seq))
}

fn encode_snapshot(
    saved: &SavedState,
    extensions: &SavedExtensions,
    workers: &SavedRegistry,
    last_seq: u64,
) -> Vec<u8> {
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
    let worker_list: Vec<Value> = workers.workers.iter().map(encode_saved_worker).collect();
    let waiters: Vec<Value> = workers
        .waiters
        .iter()
        .map(|(job, priority, request)| json!([job, priority, encode_request(request)]))
        .collect();
    let condemned: Vec<Value> = workers
        .condemned
        .iter()
        .map(|(job, reason)| json!([job, reason]))
        .collect();
    let draining: Vec<Value> = workers
        .draining
        .iter()
        .map(|(uuid, job)| json!([uuid, job]))
        .collect();
    let document = json!({
        "version": FORMAT_VERSION,
        "last_seq": last_seq,
        "holdings": holdings,
        "pending": pending,
        "workers": worker_list,
        "worker_waiters": waiters,
        "condemned_jobs": condemned,
        "draining_workers": draining,
        "prepare_seq_high": workers.prepare_seq_high,
        "lock_policy": encode_policy(&extensions.policy),
        "last_token": extensions.grants.last_token,
        "grants": extensions.grants.grants.iter().map(|(owner, lock, grant)| json!([
            encode_owner(owner),
            lock.to_string(),
            grant.token,
            grant.died.iter().map(encode_death).collect::<Vec<_>>(),
        ])).collect::<Vec<_>>(),
        "death_marks": extensions.grants.marks.iter().map(encode_death).collect::<Vec<_>>(),
        "arrivals": extensions.arrivals.iter()
            .map(|(owner, order)| json!([encode_owner(owner), order]))
            .collect::<Vec<_>>(),
        "next_arrival": extensions.next_arrival,
    });
    serde_json::to_vec(&document).expect("JSON to a Vec cannot fail")
}

fn encode_policy(policy: &LockPolicy) -> Value {
    json!({"fairness": policy.fairness.as_str(), "deadlocks": policy.deadlocks.as_str()})
}

fn decode_policy(value: &Value) -> Result<LockPolicy, String> {
    let text = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("no string field '{name}'"))
    };
    Ok(LockPolicy {
        fairness: Fairness::parse(text("fairness")?).ok_or("unknown fairness")?,
        deadlocks: Deadlocks::parse(text("deadlocks")?).ok_or("unknown deadlocks")?,
    })
}

fn decode_death(value: &Value) -> Result<Death, String> {
    let field = |name: &str| value.get(name).ok_or_else(|| format!("no field '{name}'"));
    Ok(Death {
        lock: decode_lock(field("lock")?)?,
        owner: decode_owner(field("owner")?).map_err(|what| format!("owner {what}"))?,
        token: field("token")?.as_u64().ok_or("token is not a number")?,
    })
}

/// The extensions' part of a snapshot; every field may be absent (a state
/// from before them).
fn decode_extensions(document: &Value) -> Result<SavedExtensions, String> {
    let list = |field: &str| -> Result<&[Value], String> {
        match document.get(field) {
            None => Ok(&[]),
            Some(value) => value
                .as_array()
                .map(Vec::as_slice)
                .ok_or_else(|| format!("'{field}' is not a list")),
        }
    };
    let number = |field: &str| -> Result<u64, String> {
        match document.get(field) {
            None => Ok(0),
            Some(value) => value
                .as_u64()
                .ok_or_else(|| format!("'{field}' is not a number")),
        }
    };
    let mut extensions = SavedExtensions {
        policy: match document.get("lock_policy") {
            None => LockPolicy::default(),
            Some(policy) => decode_policy(policy).map_err(|what| format!("lock_policy: {what}"))?,
        },
        next_arrival: number("next_arrival")?,
        ..SavedExtensions::default()
    };
    extensions.grants.last_token = number("last_token")?;
    for (index, item) in list("grants")?.iter().enumerate() {
        let at = |what: String| format!("grants[{index}] {what}");
        let Some([owner, lock, token, died]) = item.as_array().map(Vec::as_slice) else {
            return Err(at("is not [owner, lock, token, died]".to_owned()));
        };
        let died = died
            .as_array()
            .ok_or_else(|| at("died is not a list".to_owned()))?
            .iter()
            .map(decode_death)
            .collect::<Result<Vec<_>, _>>()
            .map_err(at)?;
        extensions.grants.grants.push((
            decode_owner(owner).map_err(|what| at(format!("owner {what}")))?,
            decode_lock(lock).map_err(at)?,
            Grant {
                token: token
                    .as_u64()
                    .ok_or_else(|| at("token is not a number".to_owned()))?,
                died,
            },
        ));
    }
    for (index, item) in list("death_marks")?.iter().enumerate() {
        extensions
            .grants
            .marks
            .push(decode_death(item).map_err(|what| format!("death_marks[{index}] {what}"))?);
    }
    for (index, item) in list("arrivals")?.iter().enumerate() {
        let at = |what: String| format!("arrivals[{index}] {what}");
        let Some([owner, order]) = item.as_array().map(Vec::as_slice) else {
            return Err(at("is not [owner, arrival]".to_owned()));
        };
        extensions.arrivals.push((
            decode_owner(owner).map_err(|what| at(format!("owner {what}")))?,
            order
                .as_u64()
                .ok_or_else(|| at("arrival is not a number".to_owned()))?,
        ));
    }
    Ok(extensions)
}

type DecodedSnapshot = (SavedState, SavedExtensions, SavedRegistry, u64);

fn decode_snapshot(bytes: &[u8]) -> Result<DecodedSnapshot, String> {
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
    // The worker registry's lists may be absent (a state from before it).
    let optional_list = |field: &str| -> Result<&[Value], String> {
        match document.get(field) {
            None => Ok(&[]),
            Some(value) => value
                .as_array()
                .map(Vec::as_slice)
                .ok_or_else(|| format!("'{field}' is not a list")),
        }
    };
    let mut workers = SavedRegistry::default();
    for (index, item) in optional_list("workers")?.iter().enumerate() {
        workers
            .workers
            .push(decode_saved_worker(item).map_err(|what| format!("workers[{index}] {what}"))?);
    }
    for (index, item) in optional_list("worker_waiters")?.iter().enumerate() {
        let at = |what: String| format!("worker_waiters[{index}] {what}");
        let Some([job, priority, request]) = item.as_array().map(Vec::as_slice) else {
            return Err(at("is not [job, priority, request]".to_owned()));
        };
        workers.waiters.push((
            job.as_u64()
                .ok_or_else(|| at("job is not a job id".to_owned()))?,
            priority
                .as_i64()
                .ok_or_else(|| at("priority is not an integer".to_owned()))?,
            decode_request(request).map_err(at)?,
        ));
    }
    for (index, item) in optional_list("condemned_jobs")?.iter().enumerate() {
        let at = |what: &str| format!("condemned_jobs[{index}] {what}");
        let Some([job, reason]) = item.as_array().map(Vec::as_slice) else {
            return Err(at("is not [job, reason]"));
        };
        workers.condemned.push((
            job.as_u64().ok_or_else(|| at("job is not a job id"))?,
            reason
                .as_str()
                .ok_or_else(|| at("reason is not a string"))?
                .to_owned(),
        ));
    }
    for (index, item) in optional_list("draining_workers")?.iter().enumerate() {
        let at = |what: &str| format!("draining_workers[{index}] {what}");
        let Some([uuid, job]) = item.as_array().map(Vec::as_slice) else {
            return Err(at("is not [uuid, job]"));
        };
        workers.draining.push((
            uuid.as_str()
                .ok_or_else(|| at("uuid is not a string"))?
                .to_owned(),
            job.as_u64().ok_or_else(|| at("job is not a job id"))?,
        ));
    }
    workers.prepare_seq_high = match document.get("prepare_seq_high") {
        None => 0,
        Some(high) => high.as_u64().ok_or("prepare_seq_high is not a number")?,
    };
    let extensions = decode_extensions(&document)?;
    Ok((saved, extensions, workers, last_seq))
}

/// A journal record's JSON object, written straight from the operation:
/// `op` (the RPC's name), `owner` and the operation's arguments, in the
/// wire forms of PROTOCOL.md "2. Values on the wire" (`decode_record` reads
/// it back).
struct RecordJson<'a>(&'a LockOp);

impl Serialize for RecordJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        let op = self.0;
        map.serialize_entry("op", op_name(op))?;
        match op {
            LockOp::TryUpdate { owner, request } => {
                map.serialize_entry("owner", &OwnerJson(owner))?;
                map.serialize_entry("request", &EntriesJson(request))?;
            }
            LockOp::UpdateWaiting {
                owner,
                priority,
                request,
            } => {
                map.serialize_entry("owner", &OwnerJson(owner))?;
                map.serialize_entry("priority", priority)?;
                map.serialize_entry("request", &EntriesJson(request))?;
            }
            LockOp::FreeLocks { owner } | LockOp::FreeDead { owner } => {
                map.serialize_entry("owner", &OwnerJson(owner))?
            }
            LockOp::SetPolicy { policy } => {
                map.serialize_entry("fairness", policy.fairness.as_str())?;
                map.serialize_entry("deadlocks", policy.deadlocks.as_str())?;
            }
            LockOp::FreeLocksLevel { owner, level }
            | LockOp::DowngradeLocksLevel { owner, level } => {
                map.serialize_entry("owner", &OwnerJson(owner))?;
                map.serialize_entry("level", level.as_str())?;
            }
            LockOp::IntersectLocks { owner, keep } => {
                map.serialize_entry("owner", &OwnerJson(owner))?;
                map.serialize_entry("locks", &LocksJson(keep))?;
            }
            LockOp::OpportunisticUnion { owner, wanted } => {
                map.serialize_entry("owner", &OwnerJson(owner))?;
                map.serialize_entry("wanted", &LockModesJson(wanted))?;
            }
            LockOp::GuardedOpportunisticUnion {
                count,
                owner,
                wanted,
            } => {
                map.serialize_entry("count", count)?;
                map.serialize_entry("owner", &OwnerJson(owner))?;
                map.serialize_entry("wanted", &LockModesJson(wanted))?;
            }
        }
        map.end()
    }
}

fn op_name(op: &LockOp) -> &'static str {
    match op {
        LockOp::TryUpdate { .. } => "tryUpdateLocks",
        LockOp::UpdateWaiting { .. } => "updateLocksWaiting",
        LockOp::FreeLocks { .. } => "freeLocks",
        LockOp::FreeDead { .. } => "freeDead",
        LockOp::SetPolicy { .. } => "setLockPolicy",
        LockOp::FreeLocksLevel { .. } => "freeLocksLevel",
        LockOp::DowngradeLocksLevel { .. } => "downGradeLocksLevel",
        LockOp::IntersectLocks { .. } => "intersectLocks",
        LockOp::OpportunisticUnion { .. } => "opportunisticLockUnion",
        LockOp::GuardedOpportunisticUnion { .. } => "guardedOpportunisticLockUnion",
    }
}

/// `[ident, livelock, pid]`, as `encode_owner`.
struct OwnerJson<'a>(&'a Owner);

impl Serialize for OwnerJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let owner = self.0;
        let mut tuple = serializer.serialize_tuple(3)?;
        match &owner.ident {
            Ident::Name(name) => tuple.serialize_element(name)?,
            Ident::Job(id) => tuple.serialize_element(id)?,
        }
        tuple.serialize_element(&owner.livelock)?;
        tuple.serialize_element(&owner.pid)?;
        tuple.end()
    }
}

/// A lock name as its string, written without making the string.
struct LockJson<'a>(&'a LockName);

impl Serialize for LockJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self.0)
    }
}

/// `[[lock, action], ...]`, as `encode_entry`.
struct EntriesJson<'a>(&'a [Entry]);

impl Serialize for EntriesJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .iter()
                .map(|entry| (LockJson(&entry.lock), entry.action.as_str())),
        )
    }
}

/// `[lock, ...]`, as `encode_locks`.
struct LocksJson<'a>(&'a [LockName]);

impl Serialize for LocksJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(LockJson))
    }
}

/// `[[lock, mode], ...]`, as `encode_lock_modes`.
struct LockModesJson<'a>(&'a [(LockName, Mode)]);

impl Serialize for LockModesJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .iter()
                .map(|(lock, mode)| (LockJson(lock), mode.as_str())),
        )
    }
}

/// A journal record: a lock operation, or a call of the worker registry
/// with the time it was made.
enum Journaled {
    Lock(LockOp),
    Worker(WorkerOp, f64),
    /// Events of no operation.
    Events,
}

/// Adds `,"events":[...]` to the record JSON at the end of `buffer` (one
/// that ends in `}`), if there are events.
fn with_events<'a>(buffer: &mut Vec<u8>, events: impl Iterator<Item = &'a [u8]>) {
    let mut events = events.peekable();
    if events.peek().is_none() {
        return;
    }
    debug_assert_eq!(buffer.last(), Some(&b'}'));
    buffer.pop();
    buffer.extend_from_slice(b",\"events\":[");
    for (index, line) in events.enumerate() {
        if index > 0 {
            buffer.push(b',');
        }
        buffer.extend_from_slice(line.strip_suffix(b"\n").unwrap_or(line));
    }
    buffer.extend_from_slice(b"]}");
}

/// The events a record carries (none: an empty list).
fn record_events(value: &Value) -> Result<Vec<crate::events::Event>, String> {
    let Some(events) = value.get("events") else {
        return Ok(Vec::new());
    };
    events
        .as_array()
        .ok_or("events is not a list")?
        .iter()
        .map(|event| crate::events::Event::from_value(event.clone()))
        .collect::<Result<_, _>>()
        .map_err(|what| format!("an event: {what}"))
}

/// A worker call's record: `op` (the wconfd method), `now`, and the
/// call's arguments in their wire forms.
fn encode_worker_op(op: &WorkerOp, now: f64) -> Value {
    let mut record = match op {
        WorkerOp::Register {
            caps,
            groups,
            address,
            prepare,
        } => json!({"op": "registerWorker", "caps": encode_caps(caps), "groups": groups,
                    "address": address, "prepare": prepare}),
        WorkerOp::Deregister { uuid } => json!({"op": "deregisterWorker", "uuid": uuid}),
        WorkerOp::SetState { uuid, state, kill } => {
            json!({"op": "setWorkerState", "uuid": uuid, "state": state, "kill": kill})
        }
        WorkerOp::SetFail { uuid, reason } => {
            json!({"op": "setWorkerFail", "uuid": uuid, "reason": reason})
        }
        WorkerOp::SetGroups { uuid, groups } => {
            json!({"op": "setWorkerGroups", "uuid": uuid, "groups": groups})
        }
        WorkerOp::Request {
            job,
            priority,
            request,
        } => json!({"op": "requestWorkers", "job": job, "priority": priority,
                    "request": encode_request(request)}),
        WorkerOp::Release { job, status } => {
            json!({"op": "releaseWorkers", "job": job, "status": status})
        }
        WorkerOp::Prepared { uuid, seq, outcome } => {
            let (status, reason) = match outcome {
                Ok(()) => ("success", ""),
                Err(reason) => ("error", reason.as_str()),
            };
            json!({"op": "workerPrepared", "uuid": uuid, "seq": seq, "status": status,
                   "reason": reason})
        }
    };
    record["now"] = json!(now);
    record
}

fn decode_worker_op(op_name: &str, value: &Value) -> Result<Option<WorkerOp>, String> {
    let field = |name: &str| value.get(name).ok_or_else(|| format!("no field '{name}'"));
    let text = |name: &str| -> Result<String, String> {
        field(name)?
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{name} is not a string"))
    };
    let number = |name: &str| -> Result<u64, String> {
        field(name)?
            .as_u64()
            .ok_or_else(|| format!("{name} is not a number"))
    };
    let optional = |name: &str| -> Option<&Value> { value.get(name).filter(|v| !v.is_null()) };
    Ok(Some(match op_name {
        "registerWorker" => WorkerOp::Register {
            caps: decode_caps(field("caps")?)?,
            groups: optional("groups").map(decode_groups).transpose()?,
            address: optional("address")
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or("address is not a string")
                })
                .transpose()?,
            prepare: optional("prepare")
                .map(|v| decode_strings(v, "arguments"))
                .transpose()?,
        },
        "deregisterWorker" => WorkerOp::Deregister {
            uuid: text("uuid")?,
        },
        "setWorkerState" => WorkerOp::SetState {
            uuid: text("uuid")?,
            state: text("state")?,
            kill: field("kill")?.as_bool().ok_or("kill is not a boolean")?,
        },
        "setWorkerFail" => WorkerOp::SetFail {
            uuid: text("uuid")?,
            reason: text("reason")?,
        },
        "setWorkerGroups" => WorkerOp::SetGroups {
            uuid: text("uuid")?,
            groups: decode_groups(field("groups")?)?,
        },
        "requestWorkers" => WorkerOp::Request {
            job: number("job")?,
            priority: field("priority")?
                .as_i64()
                .ok_or("priority is not an integer")?,
            request: decode_request(field("request")?)?,
        },
        "releaseWorkers" => WorkerOp::Release {
            job: number("job")?,
            status: text("status")?,
        },
        "workerPrepared" => WorkerOp::Prepared {
            uuid: text("uuid")?,
            seq: number("seq")?,
            outcome: match text("status")?.as_str() {
                "success" => Ok(()),
                _ => Err(text("reason")?),
            },
        },
        _ => return Ok(None),
    }))
}

/// A record: what it journals and the events it carries.
fn decode_record(payload: &[u8]) -> Result<(Journaled, Vec<crate::events::Event>), String> {
    let value: Value =
        serde_json::from_slice(payload).map_err(|error| format!("not valid JSON: {error}"))?;
    let events = record_events(&value)?;
    let op_name = value
        .get("op")
        .and_then(Value::as_str)
        .ok_or("no string field 'op'")?;
    if op_name == "events" {
        return Ok((Journaled::Events, events));
    }
    if let Some(op) = decode_worker_op(op_name, &value)? {
        let now = value
            .get("now")
            .and_then(Value::as_f64)
            .ok_or("now is not a number")?;
        return Ok((Journaled::Worker(op, now), events));
    }
    decode_lock_record(&value).map(|op| (Journaled::Lock(op), events))
}

fn decode_lock_record(value: &Value) -> Result<LockOp, String> {
    let field = |name: &str| value.get(name).ok_or_else(|| format!("no field '{name}'"));
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
        "freeDead" => LockOp::FreeDead { owner: owner()? },
        "setLockPolicy" => LockOp::SetPolicy {
            policy: decode_policy(value)?,
        },
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
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::wconfd::encode_locks;
    use serde_json::Map;

    /// The record's JSON built as a `Value`: what `RecordJson` must write
    /// byte for byte.
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
            LockOp::FreeDead { owner } => json!({
                "op": "freeDead",
                "owner": encode_owner(owner),
            }),
            LockOp::SetPolicy { policy } => json!({
                "op": "setLockPolicy",
                "fairness": policy.fairness.as_str(),
                "deadlocks": policy.deadlocks.as_str(),
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

    /// Both ways to the disk: direct I/O where the temp dir's file system
    /// offers it, and the buffered path of file systems without it.
    const MODES: [bool; 2] = [true, false];

    fn open(dir: &Path, direct: bool) -> (LockStore, LockManager, LoadReport) {
        let (store, manager, _, report) = LockStore::open_with(dir, direct, 0).expect("open");
        (store, manager, report)
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

    /// An operation that always changes the state: owner `i` takes or
    /// drops a node of its own.
    fn toggle(i: u64, take: bool) -> LockOp {
        let lock = node(&format!("t{}", i % 97));
        LockOp::TryUpdate {
            owner: job(1000 + i % 97),
            request: vec![if take {
                Entry::exclusive(lock)
            } else {
                Entry::release(lock)
            }],
        }
    }

    /// An operation that changes the state once: a new owner takes a node
    /// of its own.
    fn fresh(k: u64) -> LockOp {
        LockOp::TryUpdate {
            owner: job(50_000 + k),
            request: vec![Entry::exclusive(node(&format!("fresh{k}")))],
        }
    }

    /// Records are written straight from the operation, byte for byte as
    /// the same JSON built as a `Value`, and read back as the operation;
    /// names that JSON must escape included.
    /// Worker calls journaled beside lock operations replay to the same
    /// registry, before and after a snapshot.
    #[test]
    fn worker_calls_replay_from_the_journal_and_the_snapshot() {
        use crate::workers::{Request, WorkerOp};
        use std::collections::{BTreeMap, BTreeSet};
        for direct in MODES {
            let scratch = tempfile::tempdir().expect("a scratch dir");
            let dir = scratch.path();
            let (mut store, mut manager, mut workers, _) =
                LockStore::open_with(dir, direct, 2).expect("open");
            let caps = |uuid: &str| BTreeMap::from([("UUID".to_owned(), uuid.to_owned())]);
            let ops = [
                WorkerOp::Register {
                    caps: caps("b1"),
                    groups: Some(BTreeSet::from(["lab".to_owned()])),
                    address: Some("10.0.0.1:22".to_owned()),
                    prepare: Some(vec!["/bin/reset".to_owned()]),
                },
                WorkerOp::Register {
                    caps: caps("b2"),
                    groups: None,
                    address: None,
                    prepare: None,
                },
                WorkerOp::SetState {
                    uuid: "b2".to_owned(),
                    state: "IDLE".to_owned(),
                    kill: false,
                },
                WorkerOp::Request {
                    job: 4,
                    priority: -3,
                    request: Request::new(BTreeSet::new(), BTreeMap::new(), Some(2)).expect("ok"),
                },
                WorkerOp::SetState {
                    uuid: "b1".to_owned(),
                    state: "IDLE".to_owned(),
                    kill: false,
                },
                WorkerOp::Prepared {
                    uuid: "b1".to_owned(),
                    seq: 1,
                    outcome: Ok(()),
                },
                WorkerOp::SetFail {
                    uuid: "b2".to_owned(),
                    reason: "smoke".to_owned(),
                },
            ];
            for (index, op) in ops.iter().enumerate() {
                workers.apply(op, index as f64).expect("accepted");
                store.record_worker(op, index as f64, std::iter::empty());
                run(&mut store, &mut manager, sample_ops()[0].clone());
            }
            store.commit().expect("commit");
            let (_, _, replayed, _) = LockStore::open_with(dir, direct, 2).expect("reopen");
            assert_eq!(replayed, workers);
            store.write_snapshot(&manager, &workers).expect("snapshot");
            let (_, _, restored, report) = LockStore::open_with(dir, direct, 2).expect("reopen");
            assert_eq!(report.replayed, 0);
            assert_eq!(restored, workers);
            restored.check_invariants();
            assert_eq!(restored.condemned().count(), 1, "job 4 is told to end");
        }
    }

    #[test]
    fn records_are_written_as_their_json_and_read_back() {
        let odd = Owner::named("wc\"fd\u{7}é", "/r/livelocks/\\odd\n", 7);
        let mut ops = sample_ops();
        ops.push(LockOp::TryUpdate {
            owner: odd.clone(),
            request: vec![Entry::shared(node("n\"1\u{1}ü"))],
        });
        ops.push(LockOp::IntersectLocks {
            owner: odd,
            keep: vec![LockName::Bgl, node("x")],
        });
        for op in ops {
            let written = serde_json::to_vec(&RecordJson(&op)).expect("JSON");
            let built = serde_json::to_vec(&Value::Object(encode_op(&op))).expect("JSON");
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&built)
            );
            match decode_record(&written).expect("decodes").0 {
                Journaled::Lock(decoded) => assert_eq!(decoded, op),
                Journaled::Worker(..) | Journaled::Events => {
                    panic!("a lock record read as something else")
                }
            }
        }
    }

    #[test]
    fn a_reopened_store_has_the_same_state_on_either_path() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, report) = open(dir.path(), direct);
            assert_eq!(report, LoadReport::default());
            for op in sample_ops() {
                run(&mut store, &mut manager, op);
                store.commit().expect("commit");
            }
            drop(store);
            let (_, reopened, report) = open(dir.path(), direct);
            assert!(report.replayed > 0);
            assert_eq!(report.torn_bytes, 0);
            assert_eq!(reopened.saved(), manager.saved());
            reopened.check_invariants();
            // The bytes are the same on both paths: the other one reads them.
            let (_, other, _) = open(dir.path(), !direct);
            assert_eq!(other.saved(), manager.saved());
        }
    }

    #[test]
    fn direct_io_is_used_exactly_where_the_file_system_offers_it() {
        let mut dirs = vec![tempfile::tempdir().expect("temp dir")];
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            dirs.push(tempfile::tempdir_in(shm).expect("a dir in /dev/shm"));
        }
        for dir in dirs {
            let (store, _, _) = open(dir.path(), true);
            let offered =
                sys::direct_io_alignment(&File::open(store.journal_path()).expect("open"))
                    .expect("statx");
            match offered {
                Some(alignment) if alignment <= JOURNAL_HEADER_BYTES => {
                    assert_eq!(store.journal_io(), JournalIo::Direct { alignment })
                }
                _ => assert_eq!(store.journal_io(), JournalIo::Buffered),
            }
            let (store, _, _) = open(dir.path(), false);
            assert_eq!(store.journal_io(), JournalIo::Buffered);
        }
    }

    #[test]
    fn snapshots_restart_the_journal_and_keep_the_state() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            let ops = sample_ops();
            for op in &ops[..4] {
                run(&mut store, &mut manager, op.clone());
            }
            store.commit().expect("commit");
            store
                .write_snapshot(&manager, &Registry::new())
                .expect("snapshot");
            assert_eq!(store.journal_bytes(), 0);
            for op in &ops[4..] {
                run(&mut store, &mut manager, op.clone());
            }
            store.commit().expect("commit");
            drop(store);
            let (_, reopened, report) = open(dir.path(), direct);
            assert!(report.snapshot_seq > 0);
            assert_eq!(reopened.saved(), manager.saved());
        }
    }

    #[test]
    fn a_crash_between_the_snapshot_and_the_next_write_loses_nothing() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            for op in sample_ops() {
                run(&mut store, &mut manager, op);
            }
            store.commit().expect("commit");
            store
                .write_snapshot(&manager, &Registry::new())
                .expect("snapshot");
            // Killed here: the journal still holds the whole last round.
            drop(store);
            let (mut store, mut reopened, report) = open(dir.path(), direct);
            assert_eq!(report.replayed, 0);
            assert_eq!(report.torn_bytes, 0);
            assert_eq!(reopened.saved(), manager.saved());
            // The new round starts at the beginning, after the old one's
            // records, and reads back without them.
            assert_eq!(store.journal_bytes(), 0);
            let op = fresh(1);
            run(&mut store, &mut reopened, op.clone());
            store.commit().expect("commit");
            manager.apply(&op);
            drop(store);
            let (_, reopened, report) = open(dir.path(), direct);
            assert_eq!(report.replayed, 1);
            assert_eq!(reopened.saved(), manager.saved());
        }
    }

    /// Writes `batch` as one turn, then checks every torn image of that
    /// write ([`check_torn_write`]).
    fn write_torn_and_check(
        dir: &Path,
        direct: bool,
        mut store: LockStore,
        manager: &mut LockManager,
        batch: &[LockOp],
    ) {
        let states = prefix_states(manager, batch);
        let before = fs::read(store.journal_path()).expect("journal");
        for op in batch {
            run(&mut store, manager, op.clone());
        }
        store.commit().expect("commit");
        let after = fs::read(store.journal_path()).expect("journal");
        drop(store);
        check_torn_write(dir, direct, &before, &after, &states);
    }

    /// Every image of the write that turned `before` into `after`
    /// (512-byte sectors each old or new, in the patterns a crash can
    /// leave) must load as the state before the write plus some prefix of
    /// its operations; and the store must go on from there with no piece
    /// of the unfinished write ever read back.
    fn check_torn_write(
        dir: &Path,
        direct: bool,
        before: &[u8],
        after: &[u8],
        states: &[SavedState],
    ) {
        const SECTOR: usize = 512;
        assert_eq!(before.len(), after.len());
        let changed: Vec<usize> = (0..before.len() / SECTOR)
            .filter(|sector| {
                let range = sector * SECTOR..(sector + 1) * SECTOR;
                before[range.clone()] != after[range]
            })
            .collect();
        assert!(!changed.is_empty());
        let mut patterns: Vec<Vec<bool>> = vec![vec![false; changed.len()]];
        for index in 0..changed.len() {
            let mut only = vec![false; changed.len()];
            only[index] = true;
            patterns.push(only);
            let mut all_but = vec![true; changed.len()];
            all_but[index] = false;
            patterns.push(all_but);
        }
        let journal = dir.join(JOURNAL_FILE);
        for pattern in patterns {
            let mut image = before.to_vec();
            for (sector, new) in changed.iter().zip(&pattern) {
                if *new {
                    let range = sector * SECTOR..(sector + 1) * SECTOR;
                    image[range.clone()].copy_from_slice(&after[range]);
                }
            }
            fs::write(&journal, &image).expect("torn image");
            let (mut store, mut manager, _, _) = LockStore::open_with(dir, direct, 0)
                .unwrap_or_else(|error| panic!("pattern {pattern:?}: {error}"));
            let loaded = manager.saved();
            assert!(
                states.contains(&loaded),
                "pattern {pattern:?}: a state that is no prefix of the write"
            );
            manager.check_invariants();
            // Going on: what follows must read back exactly.
            run(&mut store, &mut manager, fresh(1));
            store.commit().expect("commit");
            let expected = manager.saved();
            drop(store);
            let (_, reopened, _, report) = LockStore::open_with(dir, direct, 0).expect("reopen");
            assert_eq!(reopened.saved(), expected, "pattern {pattern:?}");
            assert_eq!(report.torn_bytes, 0, "pattern {pattern:?}");
        }
    }

    /// The states after each prefix of `ops` applied to `manager`.
    fn prefix_states(manager: &LockManager, ops: &[LockOp]) -> Vec<SavedState> {
        let mut manager = LockManager::restore(&manager.saved()).expect("a valid state");
        let mut states = vec![manager.saved()];
        for op in ops {
            manager.apply(op);
            states.push(manager.saved());
        }
        states
    }

    #[test]
    fn a_torn_last_write_is_cleared_and_the_acknowledged_rest_kept() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            let ops = sample_ops();
            run(&mut store, &mut manager, ops[0].clone());
            store.commit().expect("commit");
            // One turn of several records, over more than one sector.
            let batch: Vec<LockOp> = (0..12).map(|i| toggle(i, true)).collect();
            write_torn_and_check(dir.path(), direct, store, &mut manager, &batch);
        }
    }

    #[test]
    fn garbage_after_the_last_record_is_a_torn_write() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            for op in sample_ops() {
                run(&mut store, &mut manager, op);
                store.commit().expect("commit");
            }
            let end = store.end as usize;
            let journal = store.journal_path().to_owned();
            drop(store);
            let mut bytes = fs::read(&journal).expect("journal");
            let mut state = 0x2545_F491_4F6C_DD1Du64;
            for byte in &mut bytes[end..end + 700] {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *byte = state as u8;
            }
            fs::write(&journal, &bytes).expect("garbage");
            let (mut store, mut reopened, report) = open(dir.path(), direct);
            assert_eq!(reopened.saved(), manager.saved());
            assert!(
                report.torn_bytes >= RECORD_HEADER_BYTES as u64,
                "{report:?}"
            );
            let op = fresh(3);
            run(&mut store, &mut reopened, op.clone());
            store.commit().expect("commit");
            manager.apply(&op);
            drop(store);
            let (_, reopened, report) = open(dir.path(), direct);
            assert_eq!(reopened.saved(), manager.saved());
            assert_eq!(report.torn_bytes, 0);
        }
    }

    #[test]
    fn a_crash_during_the_first_write_of_a_round_is_a_torn_write() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            for i in 0..40 {
                run(&mut store, &mut manager, toggle(i, true));
                store.commit().expect("commit");
            }
            store
                .write_snapshot(&manager, &Registry::new())
                .expect("snapshot");
            // The new round's first write lands on the old round's records.
            let batch: Vec<LockOp> = (0..12).map(|i| toggle(i, false)).collect();
            write_torn_and_check(dir.path(), direct, store, &mut manager, &batch);
        }
    }

    #[test]
    fn a_damaged_record_followed_by_later_writes_is_refused() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            for op in sample_ops() {
                run(&mut store, &mut manager, op);
                store.commit().expect("commit");
            }
            let journal = store.journal_path().to_owned();
            drop(store);
            let good = fs::read(&journal).expect("journal");
            let first = parse_record(&good, JOURNAL_HEADER_BYTES).expect("a first record");
            let second = JOURNAL_HEADER_BYTES + first.bytes;
            // A flipped bit in the JSON, the sequence number or the length
            // of the second record: later writes follow it.
            for at in [second + RECORD_HEADER_BYTES + 3, second + 9, second + 5] {
                let mut bytes = good.clone();
                bytes[at] ^= 0x04;
                fs::write(&journal, &bytes).expect("damage");
                let error = LockStore::open_with(dir.path(), direct, 0)
                    .err()
                    .expect("a damaged journal");
                assert!(error.to_string().contains(JOURNAL_FILE), "{error}");
                assert!(error.to_string().contains("written after it"), "{error}");
                assert_eq!(fs::read(&journal).expect("kept"), bytes, "left as found");
            }
        }
    }

    /// A byte damaged anywhere before the last write, in writes of several
    /// records: refused and the file left as found, whichever record of
    /// its write it hits (the records of its write after it are no torn
    /// write: later writes follow). One damaged in the last write reads as
    /// that write torn, which a crash can leave too: a prefix of it is
    /// kept. One after the last record changes nothing.
    #[test]
    fn damage_before_the_last_write_is_refused_wherever_it_is() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut store, mut manager, _) = open(dir.path(), false);
        let mut last_states = Vec::new();
        let mut last_start = 0;
        for write in 0..4 {
            let batch: Vec<LockOp> = (0..3).map(|i| toggle(write * 3 + i, true)).collect();
            last_states = prefix_states(&manager, &batch);
            last_start = store.end as usize;
            for op in batch {
                run(&mut store, &mut manager, op);
            }
            store.commit().expect("commit");
        }
        let end = store.end as usize;
        let journal = store.journal_path().to_owned();
        drop(store);
        let good = fs::read(&journal).expect("journal");
        for at in JOURNAL_HEADER_BYTES..end + RECORD_HEADER_BYTES {
            let mut bytes = good.clone();
            bytes[at] ^= 0xFF;
            fs::write(&journal, &bytes).expect("damage");
            let opened = LockStore::open_with(dir.path(), false, 0);
            if at < last_start {
                let error = opened
                    .err()
                    .unwrap_or_else(|| panic!("damage at byte {at} was not noticed"));
                assert!(error.to_string().contains(JOURNAL_FILE), "{error}");
                assert!(
                    fs::read(&journal).expect("kept") == bytes,
                    "damage at byte {at}: the journal was changed"
                );
            } else {
                let (_, loaded, _, _) =
                    opened.unwrap_or_else(|error| panic!("damage at byte {at}: {error}"));
                if at < end {
                    assert!(
                        last_states.contains(&loaded.saved()),
                        "damage at byte {at}: no prefix of the last write"
                    );
                } else {
                    assert_eq!(loaded.saved(), manager.saved(), "damage at byte {at}");
                }
            }
        }
    }

    #[test]
    fn a_journal_ahead_of_its_snapshot_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut store, mut manager, _) = open(dir.path(), true);
        for op in sample_ops() {
            run(&mut store, &mut manager, op);
        }
        store.commit().expect("commit");
        store
            .write_snapshot(&manager, &Registry::new())
            .expect("snapshot");
        run(&mut store, &mut manager, fresh(1));
        store.commit().expect("commit");
        let snapshot = store.snapshot_path().to_owned();
        drop(store);
        // Without its snapshot, the round starts past sequence number 1.
        fs::remove_file(&snapshot).expect("remove the snapshot");
        let error = LockStore::open(dir.path()).err().expect("a gap");
        assert!(error.to_string().contains(JOURNAL_FILE), "{error}");
        assert!(error.to_string().contains("where 1 was due"), "{error}");
    }

    #[test]
    fn files_of_the_old_format_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = dir.path().join(JOURNAL_FILE);
        // Version 1: records appended from the first byte, `seq` in the JSON.
        let payload = br#"{"op":"freeLocks","owner":[1,"/r/livelocks/a",1],"seq":1}"#;
        let mut old = Vec::new();
        old.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        old.extend_from_slice(&crc32(payload).to_le_bytes());
        old.extend_from_slice(payload);
        fs::write(&journal, &old).expect("an old journal");
        let error = LockStore::open(dir.path()).err().expect("an old journal");
        assert!(error.to_string().contains(JOURNAL_FILE), "{error}");
        assert!(error.to_string().contains("format version 2"), "{error}");
        assert_eq!(fs::read(&journal).expect("kept"), old);
        fs::remove_file(&journal).expect("remove");
        let snapshot = dir.path().join(SNAPSHOT_FILE);
        let old = br#"{"version": 1, "last_seq": 0, "holdings": [], "pending": []}"#;
        fs::write(&snapshot, old).expect("an old snapshot");
        let error = LockStore::open(dir.path()).err().expect("an old snapshot");
        assert!(error.to_string().contains(SNAPSHOT_FILE), "{error}");
        assert!(
            error
                .to_string()
                .contains("format version 1 is not the supported 2"),
            "{error}"
        );
        assert_eq!(fs::read(&snapshot).expect("kept"), old);
    }

    #[test]
    fn the_journal_grows_zero_filled_and_old_rounds_are_never_replayed() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            let journal = store.journal_path().to_owned();
            let initial = fs::metadata(&journal).expect("journal").len();
            assert_eq!(
                initial,
                JOURNAL_HEADER_BYTES as u64 + JOURNAL_GROWTH_BYTES,
                "created zero-filled"
            );
            // More than one growth step of records, in a few big turns.
            let mut i = 0;
            while store.journal_bytes() < JOURNAL_GROWTH_BYTES + 1000 {
                for _ in 0..2000 {
                    run(&mut store, &mut manager, toggle(i, i / 97 % 2 == 0));
                    i += 1;
                }
                store.commit().expect("commit");
            }
            let grown = fs::metadata(&journal).expect("journal").len();
            assert!(
                grown > initial && grown % JOURNAL_GROWTH_BYTES == 0,
                "{grown}"
            );
            store
                .write_snapshot(&manager, &Registry::new())
                .expect("snapshot");
            for k in 0..3 {
                run(&mut store, &mut manager, fresh(k));
                store.commit().expect("commit");
            }
            drop(store);
            assert_eq!(fs::metadata(&journal).expect("journal").len(), grown);
            let (_, reopened, report) = open(dir.path(), direct);
            assert_eq!(report.replayed, 3);
            assert_eq!(report.torn_bytes, 0);
            assert_eq!(reopened.saved(), manager.saved());
        }
    }

    #[test]
    fn a_journal_cut_at_any_size_grows_again() {
        for direct in MODES {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut store, mut manager, _) = open(dir.path(), direct);
            for op in sample_ops() {
                run(&mut store, &mut manager, op);
            }
            store.commit().expect("commit");
            let end = store.end;
            let journal = store.journal_path().to_owned();
            drop(store);
            // As a crash in the middle of growing it could leave it: a size
            // no block boundary, just past the records.
            let file = OpenOptions::new().write(true).open(&journal).expect("open");
            file.set_len(end + 37).expect("cut");
            drop(file);
            let (mut store, mut reopened, _) = open(dir.path(), direct);
            assert_eq!(reopened.saved(), manager.saved());
            let op = fresh(1);
            run(&mut store, &mut reopened, op.clone());
            store.commit().expect("commit");
            manager.apply(&op);
            drop(store);
            let length = fs::metadata(&journal).expect("journal").len();
            assert_eq!(length % JOURNAL_GROWTH_BYTES, 0, "{length}");
            let (_, reopened, report) = open(dir.path(), direct);
            assert_eq!(reopened.saved(), manager.saved());
            assert_eq!(report.torn_bytes, 0);
        }
    }

    #[test]
    fn a_damaged_snapshot_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let snapshot_path = dir.path().join(SNAPSHOT_FILE);
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
            "version": FORMAT_VERSION, "last_seq": 0, "pending": [],
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

    #[test]
    fn a_damaged_journal_header_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(open(dir.path(), true));
        let journal = dir.path().join(JOURNAL_FILE);
        let good = fs::read(&journal).expect("journal");
        for (at, expected) in [
            (9, "checksum"),
            (100, "stray bytes"),
            (0, "format version 2"),
        ] {
            let mut bytes = good.clone();
            bytes[at] ^= 0x01;
            fs::write(&journal, &bytes).expect("damage");
            let error = LockStore::open(dir.path()).err().expect("damaged header");
            assert!(error.to_string().contains(JOURNAL_FILE), "{error}");
            assert!(error.to_string().contains(expected), "{error}");
        }
    }
}
