//! [`Watches`]: the held `WatchEvents` of a daemon, answered from its
//! [`EventLog`] as events become readable. Both daemons use it; the
//! connection layer holds the replies and their deadlines.

use std::collections::BTreeMap;

use super::{EventLine, EventLog, EventsError};
use crate::limits::WATCH_EVENTS_MAX;
use crate::protocol::events::WatchEvents;

/// An answer: the events and the position to ask from next.
pub type Answer = Result<(Vec<EventLine>, u64), EventsError>;

struct Held {
    since: u64,
    types: Option<Vec<String>>,
}

pub struct Watches<C> {
    held: BTreeMap<C, Held>,
    /// The readable end the held ones were last checked against.
    checked: u64,
}

impl<C: Ord + Copy> Default for Watches<C> {
    fn default() -> Self {
        Watches {
            held: BTreeMap::new(),
            checked: 0,
        }
    }
}

impl<C: Ord + Copy> Watches<C> {
    /// The answer now (events there, an error, or a zero timeout), or
    /// `None`: held until events arrive.
    pub fn watch(&mut self, conn: C, request: &WatchEvents, log: &EventLog) -> Option<Answer> {
        let since = request.since.unwrap_or(log.readable_last());
        let types = request.types.as_deref();
        match log.read_after(Some(since), types, WATCH_EVENTS_MAX) {
            Ok((events, next)) if events.is_empty() && !request.timeout.is_zero() => {
                // `next` may have passed events of other types.
                self.held.insert(
                    conn,
                    Held {
                        since: next,
                        types: request.types.clone(),
                    },
                );
                None
            }
            answer => Some(answer),
        }
    }

    /// The held watches that have events now, with their answers.
    pub fn ready(&mut self, log: &EventLog) -> Vec<(C, Answer)> {
        if log.readable_last() == self.checked {
            return Vec::new();
        }
        self.checked = log.readable_last();
        let mut answers = Vec::new();
        self.held.retain(|conn, held| {
            match log.read_after(Some(held.since), held.types.as_deref(), WATCH_EVENTS_MAX) {
                Ok((events, next)) if events.is_empty() => {
                    held.since = next;
                    true
                }
                answer => {
                    answers.push((*conn, answer));
                    false
                }
            }
        });
        answers
    }

    /// A held watch's deadline passed: its empty answer, if it is one.
    pub fn expire(&mut self, conn: C) -> Option<Answer> {
        self.held
            .remove(&conn)
            .map(|held| Ok((Vec::new(), held.since)))
    }

    /// The connection went away.
    pub fn drop_watch(&mut self, conn: C) {
        self.held.remove(&conn);
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}
