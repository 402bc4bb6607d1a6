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
///
/// Readers get the same: a client takes an answer apart into lines
/// ([`EventLine::from_json`]) and whoever needs an event's fields parses
/// the ones it needs ([`EventLine::fields`]), borrowing from the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLine {
    seq: u64,
    ts: Timestamp,
    /// The line without its newline.
    bytes: Arc<[u8]>,
    /// Where the type's text is in it.
    kind_at: u16,
    kind_len: u16,
}

/// A scratch buffer grown past this by a big event is let go.
const SCRATCH_KEPT_BYTES: usize = 64 * 1024;

impl EventLine {
    /// Encodes an event: `seq`, `ts` and `type` first, then the fields,
    /// which `fields` serialises as a JSON object (anything else is kept
    /// as a field named `value`).
    pub fn encode(seq: u64, ts: Timestamp, kind: &str, fields: &impl Serialize) -> EventLine {
        use std::io::Write;
        thread_local! {
            /// Where lines are encoded before their one allocation.
            static SCRATCH: std::cell::RefCell<Vec<u8>> =
                std::cell::RefCell::new(Vec::with_capacity(512));
        }
        SCRATCH.with_borrow_mut(|bytes| {
            bytes.clear();
            write!(
                bytes,
                "{{\"seq\":{seq},\"ts\":[{},{}],\"type\":",
                ts.0, ts.1
            )
            .expect("writing to a Vec cannot fail");
            let kind_at = bytes.len() + 1;
            serde_json::to_writer(&mut *bytes, kind).expect("writing JSON to a Vec cannot fail");
            let kind_len = bytes.len() - 1 - kind_at;
            let fields_at = bytes.len();
            serde_json::to_writer(&mut *bytes, fields).expect("fields serialise");
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
            let line = EventLine::of_parts(seq, ts, Arc::from(&bytes[..]), kind_at, kind_len);
            if bytes.capacity() > SCRATCH_KEPT_BYTES {
                *bytes = Vec::with_capacity(512);
            }
            line
        })
    }

    fn of_parts(
        seq: u64,
        ts: Timestamp,
        bytes: Arc<[u8]>,
        kind_at: usize,
        kind_len: usize,
    ) -> EventLine {
        EventLine {
            seq,
            ts,
            bytes,
            // Types are short dotted names; a longer one is matched by
            // its first 64 KiB.
            kind_at: u16::try_from(kind_at).unwrap_or(u16::MAX),
            kind_len: u16::try_from(kind_len).unwrap_or(0),
        }
    }

    /// An event as an answer carries it. A line the daemons wrote starts
    /// `{"seq":n,"ts":[s,u],"type":"..."` and is kept as it is (the JSON
    /// parser has checked the rest); any other form of an event is decoded
    /// and encoded again in that form.
    pub fn from_json(raw: &serde_json::value::RawValue) -> Result<EventLine, String> {
        let bytes = raw.get().as_bytes();
        match canonical_head(bytes) {
            Some((seq, ts, kind_at, kind_len)) => Ok(EventLine::of_parts(
                seq,
                ts,
                bytes.into(),
                kind_at,
                kind_len,
            )),
            None => Ok(Event::decode(bytes)?.line()),
        }
    }

    /// An event from a line of a segment file (without its newline), as
    /// [`EventLine::from_json`]; the error says what is wrong with it.
    pub fn parse(line: &[u8]) -> Result<EventLine, String> {
        let raw: &serde_json::value::RawValue =
            serde_json::from_slice(line).map_err(|error| format!("not JSON: {error}"))?;
        EventLine::from_json(raw)
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn ts(&self) -> Timestamp {
        self.ts
    }

    /// The type, `""` if it is not plain text (a type with escapes, which
    /// no daemon writes, is still matched by [`EventLine::is_of`]).
    pub fn kind_str(&self) -> &str {
        std::str::from_utf8(self.kind()).unwrap_or_default()
    }

    /// The fields `T` takes from the line (it may borrow from it);
    /// `seq`, `ts` and `type` are members too, which `T` may ignore.
    pub fn fields<'a, T: Deserialize<'a>>(&'a self) -> Result<T, String> {
        serde_json::from_slice(&self.bytes).map_err(|error| error.to_string())
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

/// `seq`, `ts` and where the type is, if `line` starts the way
/// [`EventLine::encode`] writes it.
fn canonical_head(line: &[u8]) -> Option<(u64, Timestamp, usize, usize)> {
    fn number(rest: &[u8]) -> Option<(u64, &[u8])> {
        let digits = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
        if digits == 0 || digits > 19 {
            return None;
        }
        let value = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
        Some((value, &rest[digits..]))
    }
    let rest = line.strip_prefix(b"{\"seq\":")?;
    let (seq, rest) = number(rest)?;
    let (secs, rest) = number(rest.strip_prefix(b",\"ts\":[")?)?;
    let (usecs, rest) = number(rest.strip_prefix(b",")?)?;
    let rest = rest.strip_prefix(b"],\"type\":\"")?;
    let kind_len = rest.iter().position(|&byte| byte == b'"')?;
    if rest[..kind_len].contains(&b'\\') || !matches!(rest.get(kind_len + 1), Some(b',' | b'}')) {
        return None;
    }
    Some((
        seq,
        Timestamp(secs, usecs),
        line.len() - rest.len(),
        kind_len,
    ))
}

/// Read as the line it is in the answer (borrowing the answer's bytes, so
/// only from a deserializer over a slice or a string).
impl<'de> Deserialize<'de> for EventLine {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<EventLine, D::Error> {
        let raw = <&'de serde_json::value::RawValue>::deserialize(deserializer)?;
        EventLine::from_json(raw).map_err(D::Error::custom)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(text: &str) -> Result<EventLine, String> {
        let raw: &serde_json::value::RawValue = serde_json::from_str(text).expect("JSON");
        EventLine::from_json(raw)
    }

    #[test]
    fn a_line_as_the_daemons_write_it_is_kept_as_it_is() {
        let fields = json!({"owner": "o", "entries": [["node/n1", "shared"]]});
        let line = EventLine::encode(7, Timestamp(5, 6), "lock.granted", &fields);
        let text = std::str::from_utf8(line.bytes()).unwrap();
        let read = read(text).unwrap();
        assert_eq!(read, line);
        assert_eq!(
            (read.seq(), read.ts(), read.kind_str()),
            (7, Timestamp(5, 6), "lock.granted")
        );
        let empty = EventLine::encode(1, Timestamp(1, 2), "queue.drain", &json!({}));
        assert_eq!(read_bytes(&empty), empty);
    }

    fn read_bytes(line: &EventLine) -> EventLine {
        read(std::str::from_utf8(line.bytes()).unwrap()).unwrap()
    }

    #[test]
    fn any_other_form_of_an_event_is_written_again_in_the_daemons_form() {
        let expected = EventLine::encode(3, Timestamp(1, 2), "job.status", &json!({"id": 4}));
        for text in [
            r#"{"type": "job.status", "id": 4, "ts": [1, 2], "seq": 3}"#,
            r#"{ "seq":3,"ts":[1,2],"type":"job.status","id":4}"#,
            r#"{"seq":3,"ts":[1,2],"type":"job\u002estatus","id":4}"#,
        ] {
            assert_eq!(read(text).unwrap(), expected, "{text}");
        }
        for bad in [
            r#"{"ts":[1,2],"type":"job.status"}"#,
            r#"{"seq":3,"ts":[1],"type":"job.status"}"#,
            r#"{"seq":-3,"ts":[1,2],"type":"job.status"}"#,
            r#"{"seq":99999999999999999999,"ts":[1,2],"type":"x"}"#,
            r#"{"seq":3,"ts":[1,2],"type":7}"#,
            r#"[1]"#,
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fields_borrow_from_the_line() {
        #[derive(Deserialize)]
        struct Owner<'a> {
            owner: &'a str,
        }
        let line = EventLine::encode(1, Timestamp(1, 0), "lock.released", &json!({"owner": "o1"}));
        assert_eq!(line.fields::<Owner>().unwrap().owner, "o1");
        assert!(line.fields::<Vec<u8>>().is_err());
    }
}
