//! [`EventLog`]: the segment files, the events in memory, reading and
//! retention.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Event, EventLine};
use crate::jobs::Timestamp;
use crate::limits::{EVENTS_SEGMENT_EVENTS, EVENTS_TAIL_BYTES};

/// What is kept: at least the last `events`, and at least everything of
/// the last `age_secs` seconds; whole segments go once both allow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    pub events: u64,
    pub age_secs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: {what}", path.display())]
    Damaged { path: PathBuf, what: String },
    /// The position is older than what is kept: the first kept event.
    #[error("events before {first_retained} are no longer kept")]
    Expired { first_retained: u64 },
    /// The position is past the last event.
    #[error("event {since} does not exist yet (the last is {last})")]
    Future { since: u64, last: u64 },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> EventsError + '_ {
    move |source| EventsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// One segment file: events `first..=last` (`last` < `first` while it is
/// empty).
#[derive(Debug)]
struct Segment {
    first: u64,
    last: u64,
    path: PathBuf,
}

impl Segment {
    fn count(&self) -> u64 {
        (self.last + 1).saturating_sub(self.first)
    }
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.events")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".events")?;
    (digits.len() == 20 && digits.bytes().all(|byte| byte.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A daemon's event sequence.
#[derive(Debug)]
pub struct EventLog {
    dir: PathBuf,
    kept: Kept,
    /// Oldest first; the last one is appended to.
    segments: Vec<Segment>,
    /// The last segment, open for appending.
    file: Option<File>,
    /// A segment was removed since the last [`EventLog::sync`]: the
    /// directory needs a sync too.
    dir_dirty: bool,
    /// The newest events, at most `memory_max`, oldest first, their
    /// seqs consecutive (so the ring is indexed by seq).
    memory: VecDeque<EventLine>,
    memory_max: usize,
    /// Events appended but not yet written.
    pending: Vec<EventLine>,
    last_seq: u64,
    /// The last event known durable: readers see nothing after it, so no
    /// one ever sees an event a crash of the machine could take back.
    readable: u64,
    /// Bytes written to the last segment, and of those the bytes known
    /// durable (what was written after them is rewritten after a failed
    /// sync: the kernel may have dropped it and would not say so again).
    file_len: u64,
    readable_len: u64,
    /// Events a segment holds before the next begins.
    segment_events: u64,
}

impl EventLog {
    /// Opens (or creates) the sequence in `dir`. A torn last line of the
    /// last segment (a write cut short) is cut off; any other damage, or a
    /// gap between segments, is an error naming the file.
    pub fn open(dir: &Path, kept: Kept, memory_max: usize) -> Result<EventLog, EventsError> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let mut firsts = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_error(dir))? {
            let entry = entry.map_err(io_error(dir))?;
            let name = entry.file_name();
            if let Some(first) = name.to_str().and_then(parse_segment_name) {
                firsts.push(first);
            }
        }
        firsts.sort_unstable();
        let mut log = EventLog {
            dir: dir.to_owned(),
            kept,
            segments: Vec::new(),
            file: None,
            dir_dirty: false,
            memory: VecDeque::new(),
            memory_max: memory_max.max(1),
            pending: Vec::new(),
            last_seq: 0,
            readable: 0,
            file_len: 0,
            readable_len: 0,
            segment_events: EVENTS_SEGMENT_EVENTS,
        };
        for (index, first) in firsts.iter().enumerate() {
            let path = dir.join(segment_name(*first));
            let last = match firsts.get(index + 1) {
                Some(next) => {
                    if next <= first {
                        return Err(EventsError::Damaged {
                            path,
                            what: "segments overlap".to_owned(),
                        });
                    }
                    check_first_line(&path, *first)?;
                    let last = last_event(&path)?.seq;
                    if last + 1 != *next {
                        return Err(EventsError::Damaged {
                            path,
                            what: format!(
                                "a gap: it ends at event {last}, and {} begins at {next}",
                                segment_name(*next)
                            ),
                        });
                    }
                    last
                }
                None => log.load_last_segment(&path, *first)?,
            };
            if index > 0 && log.last_seq + 1 != *first {
                return Err(EventsError::Damaged {
                    path,
                    what: format!("a gap: the segment before ends at {}", log.last_seq),
                });
            }
            log.last_seq = last;
            log.segments.push(Segment {
                first: *first,
                last,
                path,
            });
        }
        if let Some(segment) = log.segments.last() {
            let file = OpenOptions::new()
                .append(true)
                .open(&segment.path)
                .map_err(io_error(&segment.path))?;
            // What an earlier process wrote may not have reached the disk.
            file.sync_data().map_err(io_error(&segment.path))?;
            log.file_len = file.metadata().map_err(io_error(&segment.path))?.len();
            log.readable_len = log.file_len;
            log.file = Some(file);
        }
        log.readable = log.last_seq;
        Ok(log)
    }

    /// Reads the last segment whole: its events into memory, a torn last
    /// line cut off; its last seq.
    fn load_last_segment(&mut self, path: &Path, first: u64) -> Result<u64, EventsError> {
        let bytes = fs::read(path).map_err(io_error(path))?;
        let mut expected = first;
        let mut good_len = 0;
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let Some(end) = rest.iter().position(|byte| *byte == b'\n') else {
                break; // no newline: torn
            };
            let line = &rest[..end];
            let event = match EventLine::parse(line) {
                Ok(event) => event,
                // A bad last line is a torn write; a bad line before good
                // ones is damage.
                Err(_) if end + 1 == rest.len() => break,
                Err(what) => {
                    return Err(EventsError::Damaged {
                        path: path.to_owned(),
                        what: format!("event {expected}: {what}"),
                    });
                }
            };
            if event.seq() != expected {
                return Err(EventsError::Damaged {
                    path: path.to_owned(),
                    what: format!("event {} where {expected} was due", event.seq()),
                });
            }
            self.remember(event);
            expected += 1;
            good_len += end + 1;
            rest = &rest[end + 1..];
        }
        if good_len < bytes.len() {
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io_error(path))?;
            file.set_len(good_len as u64).map_err(io_error(path))?;
            file.sync_data().map_err(io_error(path))?;
            tracing::warn!(
                path = %path.display(),
                cut = bytes.len() - good_len,
                "cut a torn last event off"
            );
        }
        Ok(expected - 1)
    }

    fn remember(&mut self, event: EventLine) {
        debug_assert!(
            self.memory
                .back()
                .is_none_or(|last| last.seq() + 1 == event.seq())
        );
        if self.memory.len() == self.memory_max {
            self.memory.pop_front();
        }
        self.memory.push_back(event);
    }

    /// Segments of `events` events (tests: small ones).
    #[cfg(test)]
    fn with_segments_of(mut self, events: u64) -> EventLog {
        self.segment_events = events;
        self
    }

    /// The last event's seq (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The last event readers may see: the last known durable.
    pub fn readable_last(&self) -> u64 {
        self.readable
    }

    /// Written events are durable up to `seq`, the first `len` bytes of
    /// the last segment (a [`Syncer`]'s report of a [`sync_handle`]).
    ///
    /// [`Syncer`]: super::Syncer
    /// [`sync_handle`]: EventLog::sync_handle
    pub fn mark_synced(&mut self, seq: u64, len: u64) {
        debug_assert!(seq <= self.last_seq);
        if seq > self.readable {
            self.readable = seq;
            self.readable_len = len;
        }
    }

    /// After a failed sync: cuts the last segment back to what is known
    /// durable and queues the events after it to be written again (from
    /// memory), so the next write and sync say them whole.
    pub fn rewrite_unsynced(&mut self) -> Result<(), EventsError> {
        let (Some(file), Some(segment)) = (&self.file, self.segments.last_mut()) else {
            return Ok(());
        };
        let from = self.readable + 1;
        let oldest = self.memory.front().map_or(u64::MAX, EventLine::seq);
        if from <= self.last_seq && oldest > from {
            return Err(EventsError::Damaged {
                path: segment.path.clone(),
                what: format!("events from {from} are no longer in memory to be written again"),
            });
        }
        file.set_len(self.readable_len)
            .map_err(io_error(&segment.path))?;
        self.file_len = self.readable_len;
        segment.last = self.readable.max(segment.first - 1);
        self.pending = self.memory_from(from).cloned().collect();
        Ok(())
    }

    /// Whether written events wait for a sync.
    pub fn unsynced(&self) -> bool {
        self.readable < self.last_seq - self.pending.len() as u64
    }

    /// What a [`Syncer`] syncs: the file appended to, and the last event
    /// written to it.
    ///
    /// [`Syncer`]: super::Syncer
    pub fn sync_handle(&self) -> Result<Option<(File, u64, u64)>, EventsError> {
        match (&self.file, self.segments.last()) {
            (Some(file), Some(segment)) => {
                let file = file.try_clone().map_err(io_error(&segment.path))?;
                Ok(Some((file, segment.last, self.file_len)))
            }
            _ => Ok(None),
        }
    }

    /// The first event kept (one past the last while none is): the
    /// first segment's, or before any is written the first appended.
    pub fn first_retained(&self) -> u64 {
        match (self.segments.first(), self.pending.first()) {
            (Some(segment), _) => segment.first,
            (None, Some(pending)) => pending.seq(),
            (None, None) => self.last_seq + 1,
        }
    }

    /// The events in memory from `seq` on (none if it is not there).
    fn memory_from(&self, seq: u64) -> impl Iterator<Item = &EventLine> {
        let skip = self.memory.front().map_or(usize::MAX, |oldest| {
            usize::try_from(seq.saturating_sub(oldest.seq())).unwrap_or(usize::MAX)
        });
        self.memory.range(skip.min(self.memory.len())..)
    }

    /// Appends an event whose fields `fields` serialises as a JSON object
    /// (written by the next [`EventLog::write_pending`]); its seq.
    pub fn append(&mut self, kind: &str, fields: &impl Serialize, ts: Timestamp) -> u64 {
        self.last_seq += 1;
        let line = EventLine::encode(self.last_seq, ts, kind, fields);
        self.pending.push(line.clone());
        self.remember(line);
        self.last_seq
    }

    /// Whether any segment file exists yet.
    pub fn has_segments(&self) -> bool {
        !self.segments.is_empty()
    }

    /// Whether appended events wait to be written.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The lines of the appended events not yet written after event
    /// `seq`, in order.
    pub fn pending_after(&self, seq: u64) -> impl Iterator<Item = &[u8]> {
        self.pending
            .iter()
            .skip_while(move |line| line.seq() <= seq)
            .map(EventLine::bytes)
    }

    /// When the oldest appended event not yet written was made.
    pub fn oldest_pending_ts(&self) -> Option<Timestamp> {
        self.pending.first().map(EventLine::ts)
    }

    /// How many appended events are not yet written.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Every appended event is durable elsewhere (wconfd's journal holds
    /// them), so readable now, written to the files or not.
    pub fn mark_all_durable(&mut self) {
        self.readable = self.last_seq;
    }

    /// Events of another copy (wconfd's journal) the sequence lacks: those
    /// after its last are appended, written and synced; the copy must go
    /// on from it without a gap.
    pub fn catch_up(&mut self, events: &[Event]) -> Result<usize, EventsError> {
        let missing: Vec<&Event> = events
            .iter()
            .filter(|event| event.seq > self.last_seq)
            .collect();
        let Some(first) = missing.first() else {
            return Ok(0);
        };
        if first.seq != self.last_seq + 1 {
            return Err(EventsError::Damaged {
                path: self.dir.clone(),
                what: format!(
                    "the sequence ends at event {}, its other copy goes on from {}",
                    self.last_seq, first.seq
                ),
            });
        }
        for event in &missing {
            self.last_seq = event.seq;
            let line = event.line();
            self.pending.push(line.clone());
            self.remember(line);
        }
        self.write_pending()?;
        self.sync()?;
        Ok(missing.len())
    }

    /// Writes the appended events, starting a new segment where the
    /// current one is full. Visible to a reader of the files, and safe
    /// from a kill of the process, once this returns; [`EventLog::sync`]
    /// makes them safe from a crash of the machine.
    pub fn write_pending(&mut self) -> Result<(), EventsError> {
        while let Some(first) = self.pending.first().map(EventLine::seq) {
            let full = self
                .segments
                .last()
                .is_none_or(|segment| segment.count() >= self.segment_events);
            if full {
                self.start_segment(first)?;
            }
            let (Some(file), Some(segment)) = (self.file.as_mut(), self.segments.last_mut()) else {
                unreachable!("a segment is started before its first line");
            };
            let room = (self.segment_events - segment.count()) as usize;
            let take = room.min(self.pending.len());
            let mut batch = Vec::new();
            for line in &self.pending[..take] {
                batch.extend_from_slice(line.bytes());
                batch.push(b'\n');
            }
            if let Err(error) = file.write_all(&batch) {
                // No piece of the batch may stay: the same lines are
                // written again later, after what is there.
                let _ = file.set_len(self.file_len);
                return Err(io_error(&segment.path)(error));
            }
            self.file_len += batch.len() as u64;
            segment.last = self.pending[take - 1].seq();
            self.pending.drain(..take);
        }
        Ok(())
    }

    fn start_segment(&mut self, first: u64) -> Result<(), EventsError> {
        if let (Some(file), Some(segment)) = (&self.file, self.segments.last()) {
            // The full one is synced before the next begins: what is not
            // yet durable is only ever in the last segment.
            file.sync_data().map_err(io_error(&segment.path))?;
            self.readable = segment.last;
        }
        self.file_len = 0;
        self.readable_len = 0;
        let path = self.dir.join(segment_name(first));
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(io_error(&path))?;
        self.file = Some(file);
        self.segments.push(Segment {
            first,
            last: first - 1,
            path,
        });
        // Once a segment, not once a sync: a sync in the background then
        // needs only the file.
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error(&self.dir))
    }

    /// Syncs what was written (and the directory after a removal), on the
    /// caller's thread.
    pub fn sync(&mut self) -> Result<(), EventsError> {
        if let (Some(file), Some(segment)) = (&self.file, self.segments.last()) {
            file.sync_data().map_err(io_error(&segment.path))?;
            self.readable = segment.last;
            self.readable_len = self.file_len;
        }
        if self.dir_dirty {
            File::open(&self.dir)
                .and_then(|dir| dir.sync_all())
                .map_err(io_error(&self.dir))?;
            self.dir_dirty = false;
        }
        Ok(())
    }

    /// Up to `max` events after `since` whose type starts with one of
    /// `types` (none: all), and the position to ask from next (the last
    /// event looked at, taken or not). `None`: from now on. What memory
    /// holds costs what it returns; older events are read from the files.
    pub fn read_after(
        &self,
        since: Option<u64>,
        types: Option<&[String]>,
        max: usize,
    ) -> Result<(Vec<EventLine>, u64), EventsError> {
        let last = self.readable;
        let Some(since) = since else {
            return Ok((Vec::new(), last));
        };
        if since > last {
            return Err(EventsError::Future { since, last });
        }
        let first_retained = self.first_retained();
        if since + 1 < first_retained {
            return Err(EventsError::Expired { first_retained });
        }
        let mut found = Vec::new();
        let mut next = since;
        let in_memory = self
            .memory
            .front()
            .is_some_and(|oldest| oldest.seq() <= since + 1);
        if in_memory || since == last {
            for event in self.memory_from(since + 1) {
                if found.len() == max || event.seq() > last {
                    break;
                }
                next = event.seq();
                if event.is_of(types) {
                    found.push(event.clone());
                }
            }
            return Ok((found, next));
        }
        for segment in self.segments.iter().filter(|segment| segment.last > since) {
            let bytes = fs::read(&segment.path).map_err(io_error(&segment.path))?;
            for line in bytes.split(|byte| *byte == b'\n') {
                if line.is_empty() {
                    continue;
                }
                let event = EventLine::parse(line).map_err(|what| EventsError::Damaged {
                    path: segment.path.clone(),
                    what,
                })?;
                if event.seq() <= since {
                    continue;
                }
                if found.len() == max || event.seq() > segment.last.min(last) {
                    return Ok((found, next));
                }
                next = event.seq();
                if event.is_of(types) {
                    found.push(event);
                }
            }
        }
        Ok((found, next))
    }

    /// Removes the oldest segments that nothing kept needs any more
    /// (never the one appended to); the number removed.
    pub fn trim(&mut self, now_secs: u64) -> Result<usize, EventsError> {
        let mut removed = 0;
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            let after = self.last_seq - oldest.last;
            if after < self.kept.events {
                break;
            }
            let last_secs = last_event(&oldest.path)?.ts.0;
            if last_secs + self.kept.age_secs > now_secs {
                break;
            }
            fs::remove_file(&oldest.path).map_err(io_error(&oldest.path))?;
            self.segments.remove(0);
            self.dir_dirty = true;
            removed += 1;
        }
        Ok(removed)
    }
}

/// A segment's first line names the seq its file name says.
fn check_first_line(path: &Path, first: u64) -> Result<(), EventsError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let mut head = vec![0u8; EVENTS_TAIL_BYTES];
    let read = file.read(&mut head).map_err(io_error(path))?;
    let line = head[..read]
        .split(|byte| *byte == b'\n')
        .next()
        .unwrap_or_default();
    match Event::decode(line) {
        Ok(event) if event.seq == first => Ok(()),
        Ok(event) => Err(EventsError::Damaged {
            path: path.to_owned(),
            what: format!("begins with event {} where {first} was due", event.seq),
        }),
        Err(what) => Err(EventsError::Damaged {
            path: path.to_owned(),
            what: format!("its first event: {what}"),
        }),
    }
}

/// A full segment's last event (from its file's tail).
fn last_event(path: &Path) -> Result<Event, EventsError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let len = file.metadata().map_err(io_error(path))?.len();
    let from = len.saturating_sub(EVENTS_TAIL_BYTES as u64);
    file.seek(SeekFrom::Start(from)).map_err(io_error(path))?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).map_err(io_error(path))?;
    let line = tail
        .split(|byte| *byte == b'\n')
        .rfind(|line| !line.is_empty())
        .unwrap_or_default();
    Event::decode(line).map_err(|what| EventsError::Damaged {
        path: path.to_owned(),
        what: format!("its last event: {what}"),
    })
}

#[cfg(test)]
mod tests;
