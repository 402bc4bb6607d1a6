//! `warden events`: both daemons' event sequences, merged by time, one
//! line an event (a JSON object a line with `--json`); with `--follow`,
//! held `WatchEvents` on both, each event printed [`FOLLOW_REORDER`] after
//! its time, in time order.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use serde_json::Value;

use super::output::{Output, utc_time};
use super::{CliError, CliResult, connect};
use crate::client::{Client, ClientError, Daemon};
use crate::events::EventLine;
use crate::jobs::Timestamp;
use crate::protocol::events::WatchEvents;

/// Without `--since`: this many of each daemon's last events first.
const TAIL_EVENTS: u64 = 20;

/// How long one held call of `--follow` waits.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(60);

/// With `--follow`, an event is printed this long after its time (or after
/// it came, if its time is later), so that an earlier event of the other
/// daemon still on its way is printed before it: the two sequences come
/// merged by time as long as each daemon answers within this.
const FOLLOW_REORDER: Duration = Duration::from_millis(100);

#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    /// Events after N (both daemons), or after luxid:N / wconfd:N (repeatable) [default: the last 20 of each]
    #[arg(long, value_name = "N")]
    since: Vec<String>,
    /// Only events whose type starts with T (repeatable): job., lock.granted, worker., ...
    #[arg(long = "type", value_name = "T")]
    types: Vec<String>,
    /// Go on printing events as they happen, until interrupted
    #[arg(long)]
    follow: bool,
}

const DAEMONS: [Daemon; 2] = [Daemon::Luxid, Daemon::Wconfd];

/// Where to start in each daemon's sequence (`None`: the tail).
fn starts(since: &[String]) -> CliResult<[Option<u64>; 2]> {
    let mut starts = [None, None];
    for spec in since {
        let (which, number) = match spec.split_once(':') {
            Some((name, number)) => {
                let index = DAEMONS
                    .iter()
                    .position(|daemon| daemon.name() == name)
                    .ok_or_else(|| {
                        CliError::usage(format!(
                            "--since {spec}: {name:?} is neither luxid nor wconfd"
                        ))
                    })?;
                (Some(index), number)
            }
            None => (None, spec.as_str()),
        };
        let number: u64 = number.parse().map_err(|_| {
            CliError::usage(format!("--since {spec}: {number:?} is not an event number"))
        })?;
        match which {
            Some(index) => starts[index] = Some(number),
            None => starts = [Some(number), Some(number)],
        }
    }
    Ok(starts)
}

pub fn events(root: &Path, output: &Output, args: &EventsArgs) -> CliResult {
    let types = (!args.types.is_empty()).then(|| args.types.clone());
    let starts = starts(&args.since)?;
    let mut sources = Vec::new();
    let mut down = Vec::new();
    for (daemon, start) in DAEMONS.into_iter().zip(starts) {
        match connect(root, daemon) {
            Ok(client) => sources.push((daemon, client, start)),
            Err(error) => down.push(error),
        }
    }
    if sources.is_empty() {
        return Err(down.remove(0));
    }
    for error in &down {
        output.note(&format!("warden: {}", error.message));
    }
    // What is there now, from each, merged by time.
    let mut found: Vec<(Daemon, EventLine)> = Vec::new();
    let mut positions = Vec::new();
    for (daemon, client, start) in &mut sources {
        let since = match start {
            Some(since) => *since,
            None => {
                let (_, last) = client.watch_events(&watch(None, &None, Duration::ZERO))?;
                last.saturating_sub(TAIL_EVENTS)
            }
        };
        let (events, next) = client
            .events_after(since, types.as_deref())
            .map_err(|error| named(*daemon, error))?;
        found.extend(events.into_iter().map(|event| (*daemon, event)));
        positions.push(next);
    }
    found.sort_by_key(|(daemon, event)| (event.ts(), daemon.name(), event.seq()));
    for (daemon, event) in &found {
        print_event(output, *daemon, event);
    }
    if !args.follow {
        return Ok(());
    }
    let (sender, receiver) = mpsc::channel();
    for ((daemon, client, _), next) in sources.into_iter().zip(positions) {
        let sender = sender.clone();
        let types = types.clone();
        std::thread::spawn(move || follow(daemon, client, next, &types, &sender));
    }
    drop(sender);
    let mut merge = FollowMerge::default();
    loop {
        let now = Timestamp::now();
        for (daemon, event) in merge.take_due(now) {
            print_event(output, daemon, &event);
        }
        let message = match merge.next_due() {
            Some(due) => receiver.recv_timeout(seconds(due).saturating_sub(seconds(now))),
            None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let end = match message {
            Ok(Ok((daemon, event))) => {
                merge.hold(daemon, event, Timestamp::now());
                continue;
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(Err(error)) => Err(error),
            Err(RecvTimeoutError::Disconnected) => Ok(()),
        };
        for (daemon, event) in merge.take_all() {
            print_event(output, daemon, &event);
        }
        return end;
    }
}

/// The events `--follow` holds until they are due ([`FOLLOW_REORDER`]
/// after their time, or after they came if their time is later), in
/// (due, daemon, seq) order.
#[derive(Default)]
struct FollowMerge {
    held: BTreeMap<(Timestamp, &'static str, u64), (Daemon, EventLine)>,
}

impl FollowMerge {
    fn hold(&mut self, daemon: Daemon, event: EventLine, now: Timestamp) {
        let due = plus(event.ts().min(now), FOLLOW_REORDER);
        self.held
            .insert((due, daemon.name(), event.seq()), (daemon, event));
    }

    fn next_due(&self) -> Option<Timestamp> {
        self.held.first_key_value().map(|(key, _)| key.0)
    }

    /// The events due at `now`, in order.
    fn take_due(&mut self, now: Timestamp) -> Vec<(Daemon, EventLine)> {
        let mut due = Vec::new();
        while let Some(entry) = self.held.first_entry()
            && entry.key().0 <= now
        {
            due.push(entry.remove());
        }
        due
    }

    /// Every event held, in order (at the end).
    fn take_all(&mut self) -> Vec<(Daemon, EventLine)> {
        std::mem::take(&mut self.held).into_values().collect()
    }
}

fn seconds(ts: Timestamp) -> Duration {
    Duration::from_secs(ts.0) + Duration::from_micros(ts.1)
}

fn plus(ts: Timestamp, by: Duration) -> Timestamp {
    let sum = seconds(ts) + by;
    Timestamp(sum.as_secs(), u64::from(sum.subsec_micros()))
}

fn watch(since: Option<u64>, types: &Option<Vec<String>>, timeout: Duration) -> WatchEvents {
    WatchEvents {
        since,
        types: types.clone(),
        timeout,
    }
}

/// Every event after `since` there is now; the position after them.
fn follow(
    daemon: Daemon,
    mut client: Client,
    mut since: u64,
    types: &Option<Vec<String>>,
    sender: &mpsc::Sender<CliResult<(Daemon, EventLine)>>,
) {
    loop {
        match client.watch_events(&watch(Some(since), types, FOLLOW_TIMEOUT)) {
            Ok((events, next)) => {
                since = next;
                for event in events {
                    if sender.send(Ok((daemon, event))).is_err() {
                        return;
                    }
                }
            }
            Err(error) => {
                let _ = sender.send(Err(named(daemon, error)));
                return;
            }
        }
    }
}

/// A daemon's refusal, saying which daemon and what "expired" means.
fn named(daemon: Daemon, error: ClientError) -> CliError {
    if let ClientError::Failed { class, args, .. } = &error {
        let number = args.first().and_then(Value::as_u64).unwrap_or(0);
        match class.as_str() {
            "EventsExpired" => {
                return CliError::refused(format!(
                    "{}: events before {number} are no longer kept (ask --since {}:{})",
                    daemon.name(),
                    daemon.name(),
                    number.saturating_sub(1)
                ));
            }
            "EventsFuture" => {
                return CliError::refused(format!(
                    "{}: there is no such event yet (the last is {number})",
                    daemon.name()
                ));
            }
            _ => {}
        }
    }
    CliError::from(error)
}

fn print_event(output: &Output, daemon: Daemon, line: &EventLine) {
    if output.json {
        let mut value: Value = serde_json::from_slice(line.bytes()).expect("an event is JSON");
        value["daemon"] = Value::from(daemon.name());
        output.json_value(&value, true);
        return;
    }
    let Ok(event) = line.decode() else {
        output.line(&String::from_utf8_lossy(line.bytes()));
        return;
    };
    let seconds = event.ts.0 as f64 + event.ts.1 as f64 / 1e6;
    let fields: Vec<String> = event
        .fields
        .iter()
        .map(|(name, value)| match value {
            Value::String(text) => format!("{name}={text}"),
            other => format!("{name}={other}"),
        })
        .collect();
    output.line(&format!(
        "{}  {:<6} {:>8}  {:<18} {}",
        utc_time(seconds),
        daemon.name(),
        event.seq,
        event.kind,
        fields.join(" ")
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, at_ms: u64) -> EventLine {
        let ts = Timestamp(1_000 + at_ms / 1_000, (at_ms % 1_000) * 1_000);
        EventLine::encode(seq, ts, "job.status", &serde_json::json!({}))
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp(1_000 + ms / 1_000, (ms % 1_000) * 1_000)
    }

    fn names(events: Vec<(Daemon, EventLine)>) -> Vec<String> {
        events
            .into_iter()
            .map(|(daemon, event)| format!("{} {}", daemon.name(), event.seq()))
            .collect()
    }

    #[test]
    fn follow_prints_by_time_what_came_out_of_order() {
        let mut merge = FollowMerge::default();
        // wconfd's event of 50 ms comes at 60 ms, luxid's earlier one (40
        // ms) only at 80 ms; a luxid event dated later than it came is due
        // by when it came.
        merge.hold(Daemon::Wconfd, event(7, 50), at(60));
        merge.hold(Daemon::Luxid, event(3, 40), at(80));
        merge.hold(Daemon::Luxid, event(4, 900), at(85));
        assert!(merge.take_due(at(139)).is_empty());
        assert_eq!(names(merge.take_due(at(150))), ["luxid 3", "wconfd 7"]);
        assert_eq!(merge.next_due(), Some(at(185)));
        assert_eq!(names(merge.take_due(at(185))), ["luxid 4"]);
        merge.hold(Daemon::Wconfd, event(8, 200), at(201));
        assert_eq!(names(merge.take_all()), ["wconfd 8"]);
        assert_eq!(merge.next_due(), None);
    }
}
