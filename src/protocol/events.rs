//! The wire form of reading an event sequence (EVENTS.md, "Reading it"):
//! the arguments of luxid's `WatchEvents` and wconfd's `watchEvents`, the
//! answer and the errors. Shared by both daemons.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Args, WireError};
use crate::events::watch::Answer;
use crate::events::{EventLine, EventsError};
use crate::limits::{
    WAIT_FOR_CHANGE_SECONDS_MAX, WATCH_EVENTS_TYPE_BYTES_MAX, WATCH_EVENTS_TYPES_MAX,
};

/// `[since_seq or null, types or null, timeout_s]`.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchEvents {
    /// `None`: from now on.
    pub since: Option<u64>,
    /// Type prefixes; `None`: every type.
    pub types: Option<Vec<String>>,
    /// At most 89 s, as `WaitForJobChange`.
    pub timeout: Duration,
}

impl WatchEvents {
    /// Decodes the three arguments (the caller checked their count).
    pub fn decode(args: &Args) -> Result<WatchEvents, WireError> {
        let since = match args.get(0) {
            Value::Null => None,
            value => Some(
                value
                    .as_u64()
                    .ok_or_else(|| args.bad(0, "is neither an event number nor null"))?,
            ),
        };
        let types = match args.get(1) {
            Value::Null => None,
            Value::Array(types) => {
                if types.len() > WATCH_EVENTS_TYPES_MAX {
                    return Err(args.bad(
                        1,
                        format!(
                            "names {} types (at most {WATCH_EVENTS_TYPES_MAX})",
                            types.len()
                        ),
                    ));
                }
                let types = types
                    .iter()
                    .map(|prefix| match prefix.as_str() {
                        Some(prefix) if prefix.len() <= WATCH_EVENTS_TYPE_BYTES_MAX => {
                            Ok(prefix.to_owned())
                        }
                        Some(_) => Err(args.bad(
                            1,
                            format!("holds a type longer than {WATCH_EVENTS_TYPE_BYTES_MAX} bytes"),
                        )),
                        None => Err(args.bad(1, "holds something not a type prefix")),
                    })
                    .collect::<Result<_, _>>()?;
                Some(types)
            }
            _ => return Err(args.bad(1, "is neither a list of type prefixes nor null")),
        };
        let seconds = args
            .get(2)
            .as_f64()
            .filter(|seconds| *seconds >= 0.0)
            .ok_or_else(|| args.bad(2, "is not a timeout in seconds"))?
            .min(WAIT_FOR_CHANGE_SECONDS_MAX);
        Ok(WatchEvents {
            since,
            types,
            timeout: Duration::from_secs_f64(seconds),
        })
    }

    pub fn encode(&self) -> Vec<Value> {
        vec![
            json!(self.since),
            json!(self.types),
            json!(self.timeout.as_secs_f64()),
        ]
    }
}

/// `{"events": [...], "next": n}`, encoded: the events' stored lines
/// spliced in as they are.
pub fn encode_answer(events: &[EventLine], next: u64) -> Vec<u8> {
    let bytes = events
        .iter()
        .map(|event| event.bytes().len() + 1)
        .sum::<usize>();
    let mut answer = Vec::with_capacity(bytes + 40);
    answer.extend_from_slice(b"{\"events\":[");
    for (index, event) in events.iter().enumerate() {
        if index > 0 {
            answer.push(b',');
        }
        answer.extend_from_slice(event.bytes());
    }
    answer.extend_from_slice(format!("],\"next\":{next}}}").as_bytes());
    answer
}

/// A daemon's reply to a watch: the answer encoded, or its error.
pub fn encode_reply(answer: Answer) -> Result<Vec<u8>, WireError> {
    match answer {
        Ok((events, next)) => Ok(encode_answer(&events, next)),
        Err(error) => Err(wire_error(&error)),
    }
}

/// The answer as a client reads it (from its bytes: the events are lines
/// of them).
#[derive(Debug, serde::Deserialize)]
pub struct WatchAnswer {
    pub events: Vec<EventLine>,
    pub next: u64,
}

/// The answer decoded from its value: the events and the next position.
pub fn decode_answer(value: Value) -> Result<(Vec<EventLine>, u64), String> {
    let bytes = serde_json::to_vec(&value).expect("a value serialises");
    let answer: WatchAnswer =
        serde_json::from_slice(&bytes).map_err(|error| format!("not an answer: {error}"))?;
    Ok((answer.events, answer.next))
}

/// `EventsExpired [first_retained]`, `EventsFuture [last]`, or a
/// `GenericError` naming what the daemon could not read.
pub fn wire_error(error: &EventsError) -> WireError {
    match error {
        EventsError::Expired { first_retained } => WireError {
            class: "EventsExpired",
            args: vec![json!(first_retained)],
        },
        EventsError::Future { last, .. } => WireError {
            class: "EventsFuture",
            args: vec![json!(last)],
        },
        other => WireError::generic(format!("cannot read the events: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;
    use crate::protocol::Args;

    fn decode(args: Value) -> Result<WatchEvents, String> {
        let args = args.as_array().unwrap().clone();
        let args = Args::exactly("WatchEvents", &args, 3).map_err(|e| format!("{e:?}"))?;
        WatchEvents::decode(&args).map_err(|error| error.args[0].to_string())
    }

    #[test]
    fn an_answer_splices_the_lines_and_decodes_back() {
        let events: Vec<Event> = (1..=3)
            .map(|seq| Event {
                seq,
                ts: crate::jobs::Timestamp(10, seq),
                kind: "job.status".to_owned(),
                fields: json!({"id": seq, "old": "queued"})
                    .as_object()
                    .cloned()
                    .unwrap(),
            })
            .collect();
        let lines: Vec<EventLine> = events.iter().map(Event::line).collect();
        let answer: Value = serde_json::from_slice(&encode_answer(&lines, 9)).unwrap();
        assert_eq!(answer["next"], json!(9));
        assert_eq!(decode_answer(answer).unwrap(), (lines, 9));
        let empty: Value = serde_json::from_slice(&encode_answer(&[], 4)).unwrap();
        assert_eq!(empty, json!({"events": [], "next": 4}));
        assert!(decode_answer(json!({"next": 1})).is_err());
        assert!(decode_answer(json!({"events": [{"seq": 1}], "next": 1})).is_err());
    }

    #[test]
    fn arguments_are_checked_and_capped() {
        assert_eq!(
            decode(json!([5, ["job."], 1000])).unwrap(),
            WatchEvents {
                since: Some(5),
                types: Some(vec!["job.".to_owned()]),
                timeout: Duration::from_secs(89),
            }
        );
        assert_eq!(decode(json!([null, null, 0.5])).unwrap().since, None);
        for (args, says) in [
            (
                json!([-1, null, 1]),
                "argument 1 is neither an event number",
            ),
            (
                json!(["5", null, 1]),
                "argument 1 is neither an event number",
            ),
            (json!([1, "job.", 1]), "argument 2 is neither a list"),
            (json!([1, [3], 1]), "argument 2 holds something not a type"),
            (json!([1, null, -1]), "argument 3 is not a timeout"),
            (json!([1, null, "1"]), "argument 3 is not a timeout"),
        ] {
            let error = decode(args.clone()).unwrap_err();
            assert!(error.contains(says), "{args}: {error}");
        }
        let many: Vec<String> = (0..=WATCH_EVENTS_TYPES_MAX)
            .map(|i| i.to_string())
            .collect();
        assert!(decode(json!([1, many, 1])).unwrap_err().contains("at most"));
        let long = "x".repeat(WATCH_EVENTS_TYPE_BYTES_MAX + 1);
        assert!(
            decode(json!([1, [long], 1]))
                .unwrap_err()
                .contains("longer")
        );
    }
}
