//! The job's log as the runner writes it: serials, the cap on the job's log
//! bytes with its truncation entries, and the cutting of a program's output
//! into lines. Pure: no I/O, timestamps are passed in.

use serde_json::Value;

use crate::jobs::{Job, LOG_MESSAGE, LogEntry, QueuedOpcode, Timestamp};

pub use crate::limits::OUTPUT_LINE_BYTES_MAX;

/// The log of one job: hands out serials (per job, from 1, strictly
/// increasing across its opcodes) and keeps the messages of the whole job
/// within `bytes_max`.
///
/// Once an entry does not fit, it and every later ordinary entry of the job
/// are dropped (the log stays a prefix of what happened); when the opcode
/// that dropped entries ends, one truncation entry saying how much was
/// dropped is appended to it. Truncation entries and control entries
/// ([`JobLog::append_always`], the `delay-test` socket path a client needs
/// to go on) are kept beyond the cap: there are at most a few per opcode.
#[derive(Clone, Debug, PartialEq)]
pub struct JobLog {
    next_serial: u64,
    message_bytes: usize,
    bytes_max: usize,
    /// Set by the first entry that did not fit.
    capped: bool,
    /// Dropped since the last truncation entry.
    dropped_entries: u64,
    dropped_bytes: u64,
}

impl JobLog {
    /// The log of `job` as it is (normally empty), capped at `bytes_max`.
    pub fn new(job: &Job, bytes_max: usize) -> JobLog {
        let message_bytes = job
            .ops
            .iter()
            .flat_map(|op| op.log.iter())
            .map(|entry| message_bytes(&entry.3))
            .sum();
        JobLog {
            next_serial: job.last_log_serial() + 1,
            message_bytes,
            bytes_max,
            capped: message_bytes > bytes_max,
            dropped_entries: 0,
            dropped_bytes: 0,
        }
    }

    /// Appends an entry to `op` if it fits under the cap; otherwise counts
    /// it as dropped. Answers whether it was appended.
    pub fn append(
        &mut self,
        op: &mut QueuedOpcode,
        kind: &str,
        message: Value,
        now: Timestamp,
    ) -> bool {
        let bytes = message_bytes(&message);
        if self.capped || self.message_bytes.saturating_add(bytes) > self.bytes_max {
            self.capped = true;
            self.dropped_entries += 1;
            self.dropped_bytes = self.dropped_bytes.saturating_add(bytes as u64);
            return false;
        }
        self.message_bytes += bytes;
        self.push(op, kind, message, now);
        true
    }

    /// Appends an entry to `op` whatever the cap says (for the few entries
    /// a client needs to go on).
    pub fn append_always(
        &mut self,
        op: &mut QueuedOpcode,
        kind: &str,
        message: Value,
        now: Timestamp,
    ) {
        self.message_bytes = self.message_bytes.saturating_add(message_bytes(&message));
        self.push(op, kind, message, now);
    }

    /// At the end of an opcode: if entries were dropped since the last
    /// truncation entry, appends one to `op` saying how many.
    pub fn finish_opcode(&mut self, op: &mut QueuedOpcode, now: Timestamp) {
        if self.dropped_entries == 0 {
            return;
        }
        let text = format!(
            "Log truncated: {} entries ({} bytes) dropped; a job's log is limited to {} bytes",
            self.dropped_entries, self.dropped_bytes, self.bytes_max
        );
        self.dropped_entries = 0;
        self.dropped_bytes = 0;
        self.push(op, LOG_MESSAGE, Value::String(text), now);
    }

    fn push(&mut self, op: &mut QueuedOpcode, kind: &str, message: Value, now: Timestamp) {
        op.log
            .push(LogEntry(self.next_serial, now, kind.to_owned(), message));
        self.next_serial += 1;
    }
}

/// What an entry's message counts against the cap: a text its bytes, any
/// other value the bytes of its JSON.
fn message_bytes(message: &Value) -> usize {
    match message {
        Value::String(text) => text.len(),
        other => other.to_string().len(),
    }
}

/// Cuts a byte stream into lines: the newline is stripped, the bytes are
/// read as UTF-8 with invalid sequences replaced, and a line longer than
/// [`OUTPUT_LINE_BYTES_MAX`] is cut into pieces of that size.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    pub fn new() -> LineSplitter {
        LineSplitter::default()
    }

    /// Adds `bytes`; each complete line goes to `line`.
    pub fn push(&mut self, mut bytes: &[u8], line: &mut impl FnMut(String)) {
        while !bytes.is_empty() {
            let room = OUTPUT_LINE_BYTES_MAX - self.pending.len();
            let window = &bytes[..bytes.len().min(room)];
            match window.iter().position(|&byte| byte == b'\n') {
                Some(end) => {
                    self.pending.extend_from_slice(&window[..end]);
                    line(self.take());
                    bytes = &bytes[end + 1..];
                }
                None => {
                    self.pending.extend_from_slice(window);
                    bytes = &bytes[window.len()..];
                    if self.pending.len() == OUTPUT_LINE_BYTES_MAX {
                        line(self.take());
                    }
                }
            }
        }
    }

    /// At the end of the stream: the last line if it had no newline.
    pub fn finish(&mut self, line: &mut impl FnMut(String)) {
        if !self.pending.is_empty() {
            line(self.take());
        }
    }

    fn take(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(ops: usize) -> Job {
        Job {
            id: 1,
            ops: (0..ops)
                .map(|_| QueuedOpcode::new(json!({"OP_ID": "OP_EXEC", "argv": ["x"]}), 0))
                .collect(),
            received_timestamp: None,
            start_timestamp: None,
            end_timestamp: None,
            livelock: None,
            process_id: None,
            workers: Vec::new(),
        }
    }

    const NOW: Timestamp = Timestamp(7, 8);

    fn serials(job: &Job) -> Vec<u64> {
        job.ops
            .iter()
            .flat_map(|op| op.log.iter().map(LogEntry::serial))
            .collect()
    }

    #[test]
    fn serials_start_at_one_and_increase_across_opcodes() {
        let mut job = job(2);
        let mut log = JobLog::new(&job, 1024);
        assert!(log.append(&mut job.ops[0], LOG_MESSAGE, json!("a"), NOW));
        assert!(log.append(&mut job.ops[0], LOG_MESSAGE, json!("b"), NOW));
        log.append_always(&mut job.ops[1], "delay-test", json!(["/s"]), NOW);
        assert!(log.append(&mut job.ops[1], LOG_MESSAGE, json!("c"), NOW));
        assert_eq!(serials(&job), [1, 2, 3, 4]);
        assert_eq!(
            job.ops[1].log[0],
            LogEntry(3, NOW, "delay-test".into(), json!(["/s"]))
        );
        // A log resumed from a job file goes on after its last serial.
        let mut resumed = JobLog::new(&job, 1024);
        assert!(resumed.append(&mut job.ops[1], LOG_MESSAGE, json!("d"), NOW));
        assert_eq!(job.last_log_serial(), 5);
    }

    #[test]
    fn the_cap_drops_everything_after_the_first_entry_that_does_not_fit() {
        let mut job = job(2);
        let mut log = JobLog::new(&job, 10);
        assert!(log.append(&mut job.ops[0], LOG_MESSAGE, json!("12345"), NOW));
        assert!(!log.append(&mut job.ops[0], LOG_MESSAGE, json!("123456"), NOW));
        // It would fit, but the log must stay a prefix.
        assert!(!log.append(&mut job.ops[0], LOG_MESSAGE, json!("1"), NOW));
        log.finish_opcode(&mut job.ops[0], NOW);
        assert_eq!(job.ops[0].log.len(), 2);
        let truncation = job.ops[0].log[1].3.as_str().unwrap().to_owned();
        assert!(
            truncation.starts_with("Log truncated: 2 entries (7 bytes) dropped"),
            "{truncation}"
        );
        assert!(truncation.contains("10 bytes"), "{truncation}");
        // The next opcode: its drops get their own entry; nothing dropped,
        // no entry.
        log.finish_opcode(&mut job.ops[1], NOW);
        assert!(job.ops[1].log.is_empty());
        assert!(!log.append(&mut job.ops[1], LOG_MESSAGE, json!("x"), NOW));
        log.finish_opcode(&mut job.ops[1], NOW);
        assert_eq!(job.ops[1].log.len(), 1);
        assert_eq!(serials(&job), [1, 2, 3]);
    }

    #[test]
    fn an_entry_exactly_at_the_cap_fits() {
        let mut job = job(1);
        let mut log = JobLog::new(&job, 4);
        assert!(log.append(&mut job.ops[0], LOG_MESSAGE, json!("1234"), NOW));
        assert!(log.append(&mut job.ops[0], LOG_MESSAGE, json!(""), NOW));
        assert!(!log.append(&mut job.ops[0], LOG_MESSAGE, json!("5"), NOW));
    }

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut splitter = LineSplitter::new();
        let mut lines = Vec::new();
        for chunk in chunks {
            splitter.push(chunk, &mut |line| lines.push(line));
        }
        splitter.finish(&mut |line| lines.push(line));
        lines
    }

    #[test]
    fn lines_are_split_whatever_the_chunks() {
        let expected = ["one", "", "two", "three"];
        assert_eq!(split(&[b"one\n\ntwo\nthree"]), expected);
        assert_eq!(split(&[b"o", b"ne\n", b"\nt", b"wo\nthr", b"ee"]), expected);
        assert_eq!(split(&[b"one\n\ntwo\nthree\n"]), expected);
        assert!(split(&[]).is_empty());
    }

    #[test]
    fn invalid_utf8_is_replaced_not_refused() {
        assert_eq!(split(&[b"a\xffb\n"]), ["a\u{fffd}b"]);
    }

    #[test]
    fn overlong_lines_are_cut() {
        let long = vec![b'x'; OUTPUT_LINE_BYTES_MAX * 2 + 3];
        let mut input = long.clone();
        input.extend_from_slice(b"\nend\n");
        let lines = split(&[&input[..10], &input[10..]]);
        let lengths: Vec<usize> = lines.iter().map(String::len).collect();
        assert_eq!(
            lengths,
            [OUTPUT_LINE_BYTES_MAX, OUTPUT_LINE_BYTES_MAX, 3, 3]
        );
        assert_eq!(lines[3], "end");
    }
}
