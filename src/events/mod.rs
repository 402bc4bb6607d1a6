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

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
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

/// An event as a daemon keeps and sends it: its line, encoded once when
/// it is appended, shared by the memory ring, the pending writes and every
/// answer that carries it (an answer splices lines; nothing is parsed or
/// encoded again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLine {
    seq: u64,
    /// The line without its newline.
    bytes: Arc<[u8]>,
    /// Where the type's text is in it.
    kind_at: u16,
    kind_len: u16,
}

impl EventLine {
    /// Encodes an event: `seq`, `ts` and `type` first, then the fields,
    /// which `fields` serialises as a JSON object (anything else is kept
    /// as a field named `value`).
    pub fn encode(seq: u64, ts: Timestamp, kind: &str, fields: &impl Serialize) -> EventLine {
        use std::io::Write;
        let mut bytes = Vec::with_capacity(128);
        write!(
            bytes,
            "{{\"seq\":{seq},\"ts\":[{},{}],\"type\":",
            ts.0, ts.1
        )
        .expect("writing to a Vec cannot fail");
        let kind_at = bytes.len() + 1;
        serde_json::to_writer(&mut bytes, kind).expect("writing JSON to a Vec cannot fail");
        let kind_len = bytes.len() - 1 - kind_at;
        let fields_at = bytes.len();
        serde_json::to_writer(&mut bytes, fields).expect("fields serialise");
        match bytes[fields_at..] {
            [b'{', b'}'] => {
                bytes.truncate(fields_at);
                bytes.push(b'}');
            }
            [b'{', ..] => bytes[fields_at] = b',',
            _ => {
                let value = bytes.split_off(fields_at);
                bytes.extend_from_slice(b",\"value\":");
                bytes.extend_from_slice(&value);
                bytes.push(b'}');
            }
        }
        EventLine {
            seq,
            bytes: bytes.into(),
            // Types are short dotted names; a longer one is matched by
            // its first 64 KiB.
            kind_at: u16::try_from(kind_at).unwrap_or(u16::MAX),
            kind_len: u16::try_from(kind_len).unwrap_or(0),
        }
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The line, without its newline.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The type as written in the line (JSON-escaped, which a dotted name
    /// never needs).
    fn kind(&self) -> &[u8] {
        let at = usize::from(self.kind_at);
        self.bytes
            .get(at..at + usize::from(self.kind_len))
            .unwrap_or_default()
    }

    /// Whether the event's type starts with one of `types` (none: all).
    pub fn is_of(&self, types: Option<&[String]>) -> bool {
        types.is_none_or(|types| {
            types
                .iter()
                .any(|prefix| self.kind().starts_with(prefix.as_bytes()))
        })
    }

    /// The event decoded.
    pub fn decode(&self) -> Result<Event, String> {
        Event::decode(&self.bytes)
    }
}

impl Event {
    /// The event's line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let mut line = self.line().bytes().to_vec();
        line.push(b'\n');
        line
    }

    /// The event as a daemon keeps it.
    pub fn line(&self) -> EventLine {
        EventLine::encode(self.seq, self.ts, &self.kind, &self.fields)
    }

    /// An event from its line (without the newline); the error says what
    /// is wrong with it.
    pub fn decode(line: &[u8]) -> Result<Event, String> {
        serde_json::from_slice(line).map_err(|error| match error.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("not JSON: {error}")
            }
            _ => error.to_string(),
        })
    }

    /// An event from its JSON object (as an answer carries it).
    pub fn from_value(value: Value) -> Result<Event, String> {
        serde_json::from_value(value).map_err(|error| error.to_string())
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

/// Read straight from the JSON (an answer of thousands of events builds no
/// tree of values for the envelope of each): `seq`, `ts` and `type` taken
/// out, every other member a field, in order.
impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Event, D::Error> {
        deserializer.deserialize_map(EventVisitor)
    }
}

struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = Event;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("an event object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
        let (mut seq, mut ts, mut kind) = (None, None, None);
        let mut fields = Map::new();
        while let Some(name) = map.next_key::<Cow<'de, str>>()? {
            match &*name {
                "seq" => {
                    let value: Value = map.next_value()?;
                    seq = Some(
                        value
                            .as_u64()
                            .ok_or_else(|| A::Error::custom("seq is not a number"))?,
                    );
                }
                "ts" => {
                    let value: Value = map.next_value()?;
                    let parts = value.as_array().filter(|parts| parts.len() == 2);
                    let secs_usecs =
                        parts.and_then(|parts| Some((parts[0].as_u64()?, parts[1].as_u64()?)));
                    let (secs, usecs) =
                        secs_usecs.ok_or_else(|| A::Error::custom("ts is not [secs, usecs]"))?;
                    ts = Some(Timestamp(secs, usecs));
                }
                "type" => match map.next_value::<Value>()? {
                    Value::String(text) => kind = Some(text),
                    _ => return Err(A::Error::custom("type is not text")),
                },
                _ => {
                    let value = map.next_value()?;
                    fields.insert(name.into_owned(), value);
                }
            }
        }
        Ok(Event {
            seq: seq.ok_or_else(|| A::Error::custom("no seq"))?,
            ts: ts.ok_or_else(|| A::Error::custom("ts is not [secs, usecs]"))?,
            kind: kind.ok_or_else(|| A::Error::custom("no type"))?,
            fields,
        })
    }
}
