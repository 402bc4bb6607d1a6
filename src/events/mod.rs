//! The event sequence of a daemon (design/DECISIONS.md, D53):
//! every state change it makes, numbered 1, 2, 3, ... without gaps and
//! never reused, kept on disk in segment files and read back by type
//! prefix from any retained position.
//!
//! This module is the sequence itself, shared by both daemons: an
//! [`EventLog`] appends events (the daemon writes them in its commit,
//! before its replies), keeps the newest in memory for held watches,
//! reads older ones from the segment files, trims whole segments past the
//! retention, and on opening repairs a torn last line (a write cut by a
//! kill) and refuses a sequence with a gap.
//!
//! On disk: `<dir>/<first seq, 20 digits>.events`, one JSON object a
//! line: `{"seq": n, "ts": [secs, usecs], "type": "...", ...fields}`.

mod log;
pub mod notify;
mod syncer;
pub mod watch;

pub use log::{EventLog, EventsError, Kept};
pub use syncer::Syncer;
pub use watch::Watches;

use serde_json::{Map, Value};

use crate::jobs::Timestamp;

/// One event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub seq: u64,
    pub ts: Timestamp,
    /// Dotted, from its source: `job.status`, `lock.granted`, ...
    pub kind: String,
    /// The event's own fields (never `seq`, `ts` or `type`).
    pub fields: Map<String, Value>,
}

impl Event {
    /// The event's line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let mut object = Map::with_capacity(self.fields.len() + 3);
        object.insert("seq".to_owned(), Value::from(self.seq));
        object.insert(
            "ts".to_owned(),
            Value::from(vec![Value::from(self.ts.0), Value::from(self.ts.1)]),
        );
        object.insert("type".to_owned(), Value::from(self.kind.clone()));
        for (name, value) in &self.fields {
            object.insert(name.clone(), value.clone());
        }
        let mut line = serde_json::to_vec(&Value::Object(object)).expect("JSON to a Vec");
        line.push(b'\n');
        line
    }

    /// An event from its line (without the newline); the error says what
    /// is wrong with it.
    pub fn decode(line: &[u8]) -> Result<Event, String> {
        let value: Value =
            serde_json::from_slice(line).map_err(|error| format!("not JSON: {error}"))?;
        let Value::Object(mut object) = value else {
            return Err("not an object".to_owned());
        };
        let seq = object
            .shift_remove("seq")
            .and_then(|seq| seq.as_u64())
            .ok_or("no seq")?;
        let ts = match object.shift_remove("ts") {
            Some(Value::Array(parts)) if parts.len() == 2 => {
                match (parts[0].as_u64(), parts[1].as_u64()) {
                    (Some(secs), Some(usecs)) => Timestamp(secs, usecs),
                    _ => return Err("ts is not [secs, usecs]".to_owned()),
                }
            }
            _ => return Err("ts is not [secs, usecs]".to_owned()),
        };
        let kind = match object.shift_remove("type") {
            Some(Value::String(kind)) => kind,
            _ => return Err("no type".to_owned()),
        };
        Ok(Event {
            seq,
            ts,
            kind,
            fields: object,
        })
    }

    /// Whether the event's type starts with one of `types` (none: all).
    pub fn is_of(&self, types: Option<&[String]>) -> bool {
        types.is_none_or(|types| {
            types
                .iter()
                .any(|prefix| self.kind.starts_with(prefix.as_str()))
        })
    }
}
