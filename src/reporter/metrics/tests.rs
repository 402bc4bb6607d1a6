use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

use super::*;
use crate::events::Event;

fn ts(at: f64) -> Timestamp {
    let us = (at * 1e6).round() as u64;
    Timestamp(us / 1_000_000, us % 1_000_000)
}

fn stamp(at: f64) -> Value {
    let ts = ts(at);
    json!([ts.0, ts.1])
}

/// Feeds events to a [`Metrics`], checking the invariants after each.
struct Feed {
    metrics: Metrics,
    seq: [u64; 2],
}

impl Feed {
    fn new() -> Feed {
        Feed {
            metrics: Metrics::new(),
            seq: [0; 2],
        }
    }

    fn send(&mut self, source: Source, at: f64, kind: &str, fields: Value) {
        let Value::Object(fields) = fields else {
            panic!("fields are an object: {fields}");
        };
        self.seq[source.index()] += 1;
        let event = Event {
            seq: self.seq[source.index()],
            ts: ts(at),
            kind: kind.to_owned(),
            fields,
        };
        self.metrics.apply(source, &event.line());
        self.metrics.check_invariants();
    }

    fn luxid(&mut self, at: f64, kind: &str, fields: Value) {
        self.send(Source::Luxid, at, kind, fields);
    }

    fn wconfd(&mut self, at: f64, kind: &str, fields: Value) {
        self.send(Source::Wconfd, at, kind, fields);
    }

    fn submit(&mut self, at: f64, id: u64) {
        let fields =
            json!({"id": id, "priority": 0, "summary": ["TEST_DELAY"], "received": stamp(at)});
        self.luxid(at, "job.submitted", fields);
    }

    fn status(&mut self, at: f64, id: u64, old: &str, new: &str) {
        let fields = json!({"id": id, "old": old, "new": new, "opcode": 0});
        self.luxid(at, "job.status", fields);
    }

    fn finish(
        &mut self,
        at: f64,
        id: u64,
        status: &str,
        times: [Option<f64>; 3],
        opcodes: &[&str],
    ) {
        let [received, start, end] = times.map(|time| time.map_or(Value::Null, stamp));
        let fields = json!({"id": id, "status": status, "received": received, "start": start,
                            "end": end, "opcodes": opcodes});
        self.luxid(at, "job.finished", fields);
    }

    fn grant(&mut self, at: f64, owner: &str, entries: &[(&str, &str)], via: &str) {
        let fields = json!({"owner": owner, "entries": entries, "via": via});
        self.wconfd(at, "lock.granted", fields);
    }

    fn release(&mut self, at: f64, owner: &str, entries: &[(&str, &str)]) {
        self.wconfd(
            at,
            "lock.released",
            json!({"owner": owner, "entries": entries}),
        );
    }

    fn wait(&mut self, at: f64, owner: &str, lock: &str) {
        let fields = json!({"owner": owner, "priority": 0, "request": [[lock, "exclusive"]],
                            "blockers": ["other"]});
        self.wconfd(at, "lock.waiting", fields);
    }

    fn worker(&mut self, at: f64, uuid: &str, old: Option<&str>, new: &str, groups: &[&str]) {
        let fields = json!({"uuid": uuid, "old": old, "new": new, "holder": null,
                            "reason": null, "groups": groups});
        self.wconfd(at, &format!("worker.{}", new.to_ascii_lowercase()), fields);
    }

    fn json(&self, now: f64) -> Value {
        self.metrics.to_json(now)
    }
}

fn gauge<'a>(json: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(&json["gauges"], |value, key| &value[*key])
}

fn counter<'a>(json: &'a Value, path: &[&str]) -> &'a Value {
    path.iter()
        .fold(&json["counters"], |value, key| &value[*key])
}

// A small parser of the text format: every line a comment or a sample.

/// `(label, value)` pairs in their order.
type Labels = Vec<(String, String)>;

#[derive(Debug)]
struct Parsed {
    /// Family name → (kind, help).
    families: BTreeMap<String, (String, String)>,
    /// (sample name, labels, value), in order.
    samples: Vec<(String, Labels, f64)>,
}

fn is_snake(name: &str) -> bool {
    !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn parse_labels(text: &str) -> (Labels, &str) {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after);
        }
        let (name, after) = rest.split_once("=\"").expect("label=\"");
        assert!(is_snake(name), "label name {name:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().expect("a closed label value") {
                (_, '\\') => match chars.next().expect("an escape").1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    other => panic!("escape \\{other}"),
                },
                (index, '"') => break index + 1,
                (_, '\n') => panic!("a raw newline in a label value"),
                (_, c) => value.push(c),
            }
        };
        labels.push((name.to_owned(), value));
        rest = &after[end..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn parse_value(text: &str) -> f64 {
    match text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => text.parse().unwrap_or_else(|_| panic!("value {text:?}")),
    }
}

fn parse_prometheus(text: &str) -> Parsed {
    assert!(text.ends_with('\n'), "the last line ends");
    let mut parsed = Parsed {
        families: BTreeMap::new(),
        samples: Vec::new(),
    };
    let mut helps = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("# HELP name text");
            assert!(!help.trim().is_empty(), "{name}: help text");
            assert!(
                helps.insert(name.to_owned(), help.to_owned()).is_none(),
                "{name}: HELP twice"
            );
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(is_snake(name), "family name {name:?}");
            assert!(["gauge", "counter", "histogram"].contains(&kind), "{kind}");
            assert_eq!(
                kind == "counter",
                name.ends_with("_total"),
                "{name}: _total is for counters"
            );
            let help = helps.get(name).unwrap_or_else(|| panic!("{name}: no HELP"));
            let family = (kind.to_owned(), help.clone());
            assert!(
                parsed.families.insert(name.to_owned(), family).is_none(),
                "{name}: twice"
            );
            current = Some((name.to_owned(), kind.to_owned()));
        } else {
            assert!(!line.starts_with('#'), "unknown comment {line:?}");
            let end = line.find(['{', ' ']).expect("name then labels or value");
            let name = &line[..end];
            let (labels, rest) = match line[end..].strip_prefix('{') {
                Some(rest) => parse_labels(rest),
                None => (Vec::new(), &line[end..]),
            };
            let value = parse_value(rest.strip_prefix(' ').expect("a space before the value"));
            let (family, kind) = current.as_ref().expect("a sample after its TYPE");
            let base = if kind == "histogram" {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .expect("a histogram's sample ends _bucket, _sum or _count")
            } else {
                name
            };
            assert_eq!(base, family, "sample {name} under its family");
            assert_eq!(
                name.ends_with("_bucket"),
                labels.iter().any(|(label, _)| label == "le")
            );
            parsed.samples.push((name.to_owned(), labels, value));
        }
    }
    assert_eq!(helps.len(), parsed.families.len(), "a TYPE for every HELP");
    // Histograms: cumulative buckets ending +Inf, equal to _count.
    for (name, (kind, _)) in &parsed.families {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        let mut counts = BTreeMap::new();
        for (sample, labels, value) in &parsed.samples {
            let others: Vec<_> = labels
                .iter()
                .filter(|(label, _)| label != "le")
                .cloned()
                .collect();
            if *sample == format!("{name}_bucket") {
                let le = &labels
                    .iter()
                    .find(|(label, _)| label == "le")
                    .expect("le")
                    .1;
                series
                    .entry(others)
                    .or_default()
                    .push((parse_value(le), *value));
            } else if *sample == format!("{name}_count") {
                counts.insert(others, *value);
            }
        }
        assert!(!series.is_empty(), "{name}: buckets");
        for (labels, buckets) in &series {
            assert!(
                buckets
                    .windows(2)
                    .all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1)
            );
            let last = buckets.last().expect("a bucket");
            assert_eq!(last.0, f64::INFINITY, "{name}: +Inf last");
            assert_eq!(
                Some(&last.1),
                counts.get(labels),
                "{name}{labels:?}: +Inf is _count"
            );
        }
    }
    parsed
}

fn sample(parsed: &Parsed, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    parsed
        .samples
        .iter()
        .find_map(|(each, each_labels, value)| {
            let same = each == name
                && each_labels.len() == labels.len()
                && each_labels
                    .iter()
                    .zip(labels)
                    .all(|((a, b), (c, d))| a == c && b == d);
            same.then_some(*value)
        })
}

/// The lines of some packets, each packet checked: at most 512 bytes of
/// whole, well-formed lines.
fn lines(packets: &[Vec<u8>]) -> Vec<String> {
    let mut all = Vec::new();
    for packet in packets {
        assert!(
            packet.len() <= STATSD_PACKET_BYTES_MAX,
            "{} bytes",
            packet.len()
        );
        assert!(!packet.is_empty());
        let text = std::str::from_utf8(packet).expect("UTF-8");
        for line in text.split('\n') {
            let (name, rest) = line.split_once(':').expect("name:value|type");
            let (value, kind) = rest.split_once('|').expect("value|type");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')),
                "{name}"
            );
            assert!(["g", "c", "ms"].contains(&kind), "{line}");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(value >= 0.0, "{line}");
            all.push(line.to_owned());
        }
    }
    all
}

/// The value of a statsd gauge among `lines`, the last if several.
fn gauge_line<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines.iter().rev().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.strip_suffix("|g"))
    })
}

#[test]
fn every_known_gauge_starts_at_zero() {
    let metrics = Metrics::new();
    metrics.check_invariants();
    let json = metrics.to_json(1000.0);
    for status in Status::ALL {
        assert_eq!(gauge(&json, &["jobs", status.name()]), 0, "{status:?}");
    }
    for level in Level::ALL {
        for mode in ["shared", "exclusive"] {
            assert_eq!(gauge(&json, &["locks_held", level.as_str(), mode]), 0);
        }
    }
    for state in State::ALL {
        assert_eq!(gauge(&json, &["workers", state.wire()]), 0);
    }
    for name in ["slots_used", "slots_max", "owners_waiting"] {
        assert_eq!(gauge(&json, &[name]), 0, "{name}");
    }
    assert_eq!(gauge(&json, &["oldest_queued_job_age_seconds"]), 0.0);
    assert_eq!(gauge(&json, &["workers_by_group"]), &json!({}));
    assert_eq!(
        counter(&json, &["events_read_total"]),
        &json!({"luxid": 0, "wconfd": 0})
    );
    assert_eq!(json["histograms"]["job_run_seconds"]["count"], 0);
    assert_eq!(
        json["histograms"]["lock_hold_seconds"]["node-res"]["buckets"]["+Inf"],
        0
    );

    let parsed = parse_prometheus(&metrics.prometheus_text(1000.0));
    for status in Status::ALL {
        assert_eq!(
            sample(&parsed, "warden_jobs", &[("status", status.name())]),
            Some(0.0)
        );
    }
    for level in Level::ALL {
        for mode in ["shared", "exclusive"] {
            let labels = [("level", level.as_str()), ("mode", mode)];
            assert_eq!(sample(&parsed, "warden_locks_held", &labels), Some(0.0));
        }
        let labels = [("level", level.as_str()), ("le", "+Inf")];
        assert_eq!(
            sample(&parsed, "warden_lock_hold_seconds_bucket", &labels),
            Some(0.0)
        );
    }
    for state in State::ALL {
        assert_eq!(
            sample(&parsed, "warden_workers", &[("state", state.wire())]),
            Some(0.0)
        );
    }
    for status in ["success", "error", "canceled"] {
        let labels = [("status", status)];
        assert_eq!(
            sample(&parsed, "warden_jobs_finished_total", &labels),
            Some(0.0)
        );
    }
    // No group yet: the by-group family is left out, not empty.
    assert!(!parsed.families.contains_key("warden_workers_by_group"));

    let mut statsd = Statsd::new("warden", 1.0);
    let sent = lines(&statsd.due(&metrics, 1000.0));
    assert_eq!(
        sent.len(),
        7 + 2 + 1 + 2 * Level::ALL.len() + 2 + 6,
        "every gauge, no counter: {sent:?}"
    );
    for name in [
        "warden.jobs.running",
        "warden.jobs.canceling",
        "warden.slots.used",
        "warden.slots.max",
        "warden.jobs.oldest_queued_age",
        "warden.locks.held.node.exclusive",
        "warden.locks.held.node-res.shared",
        "warden.owners.waiting",
        "warden.owners.longest_wait",
        "warden.workers.IDLE",
        "warden.workers.MAINTENANCE",
    ] {
        assert_eq!(gauge_line(&sent, name), Some("0"), "{name}");
    }
}

#[test]
fn jobs_are_counted_through_their_life() {
    let mut feed = Feed::new();
    feed.luxid(
        99.0,
        "queue.started",
        json!({"max_running_jobs": 20, "drained": false}),
    );
    feed.submit(100.0, 1);
    feed.submit(110.0, 2);
    feed.submit(111.0, 3);
    let json = feed.json(130.0);
    assert_eq!(gauge(&json, &["jobs", "queued"]), 3);
    assert_eq!(gauge(&json, &["slots_max"]), 20);
    assert_eq!(gauge(&json, &["oldest_queued_job_age_seconds"]), 30.0);

    feed.status(100.5, 1, "queued", "waiting");
    feed.status(101.0, 1, "waiting", "running");
    feed.status(112.0, 2, "queued", "running");
    let json = feed.json(130.0);
    assert_eq!(gauge(&json, &["jobs", "queued"]), 1);
    assert_eq!(gauge(&json, &["jobs", "waiting"]), 0);
    assert_eq!(gauge(&json, &["jobs", "running"]), 2);
    assert_eq!(gauge(&json, &["slots_used"]), 2);
    assert_eq!(gauge(&json, &["oldest_queued_job_age_seconds"]), 19.0);
    // Observed when the job leaves `queued`, once.
    let delay = &json["histograms"]["job_queue_delay_seconds"];
    assert_eq!(delay["count"], 2);
    assert_eq!(delay["sum"], 2.5);
    assert_eq!(delay["buckets"]["1"], 1);
    assert_eq!(delay["buckets"]["5"], 2);

    feed.status(115.0, 1, "running", "success");
    let times = [Some(100.0), Some(100.5), Some(115.0)];
    feed.finish(115.0, 1, "success", times, &["success", "success"]);
    feed.status(116.0, 3, "queued", "canceled");
    feed.finish(
        116.0,
        3,
        "canceled",
        [Some(111.0), None, Some(116.0)],
        &["canceled"],
    );
    let json = feed.json(130.0);
    assert_eq!(gauge(&json, &["jobs", "success"]), 1);
    assert_eq!(gauge(&json, &["jobs", "canceled"]), 1);
    assert_eq!(gauge(&json, &["jobs", "queued"]), 0);
    assert_eq!(gauge(&json, &["oldest_queued_job_age_seconds"]), 0.0);
    assert_eq!(counter(&json, &["jobs_finished_total", "success"]), 1);
    assert_eq!(counter(&json, &["jobs_finished_total", "canceled"]), 1);
    assert_eq!(counter(&json, &["jobs_finished_total", "error"]), 0);
    assert_eq!(counter(&json, &["opcodes_total", "success"]), 2);
    assert_eq!(counter(&json, &["opcodes_total", "canceled"]), 1);
    // A job canceled while queued never started: no queue delay, no run.
    assert_eq!(json["histograms"]["job_queue_delay_seconds"]["count"], 2);
    let run = &json["histograms"]["job_run_seconds"];
    assert_eq!(run["count"], 1);
    assert_eq!(run["sum"], 14.5);
    assert_eq!(counter(&json, &["events_read_total", "luxid"]), 11);
}

#[test]
fn an_archived_job_leaves_the_gauge() {
    let mut feed = Feed::new();
    feed.submit(100.0, 1);
    feed.status(101.0, 1, "queued", "running");
    feed.status(102.0, 1, "running", "error");
    feed.finish(
        102.0,
        1,
        "error",
        [Some(100.0), Some(101.0), Some(102.0)],
        &["error"],
    );
    assert_eq!(gauge(&feed.json(103.0), &["jobs", "error"]), 1);
    feed.luxid(104.0, "job.archived", json!({"id": 1}));
    let json = feed.json(105.0);
    assert_eq!(gauge(&json, &["jobs", "error"]), 0);
    assert_eq!(
        counter(&json, &["jobs_finished_total", "error"]),
        1,
        "counters stay"
    );
    // Archived again, or never known: nothing to take away.
    feed.luxid(106.0, "job.archived", json!({"id": 1}));
    feed.luxid(106.0, "job.archived", json!({"id": 77}));
    assert!(
        Status::ALL
            .iter()
            .all(|status| gauge(&feed.json(107.0), &["jobs", status.name()]) == 0)
    );
}

#[test]
fn a_job_seen_first_after_its_submission_is_counted_from_its_later_events() {
    let mut feed = Feed::new();
    // The reporter began reading after job 5's submission.
    feed.status(200.0, 5, "waiting", "running");
    let json = feed.json(201.0);
    assert_eq!(gauge(&json, &["jobs", "running"]), 1);
    assert_eq!(gauge(&json, &["slots_used"]), 1);
    assert_eq!(json["histograms"]["job_queue_delay_seconds"]["count"], 0);
    feed.status(210.0, 5, "running", "success");
    feed.finish(
        210.0,
        5,
        "success",
        [Some(190.0), Some(195.0), Some(210.0)],
        &["success"],
    );
    let json = feed.json(211.0);
    assert_eq!(gauge(&json, &["jobs", "running"]), 0);
    assert_eq!(gauge(&json, &["jobs", "success"]), 1);
    // The delay from job.finished's timestamps, as it was not seen before.
    assert_eq!(json["histograms"]["job_queue_delay_seconds"]["sum"], 5.0);
    assert_eq!(json["histograms"]["job_run_seconds"]["sum"], 15.0);
    // A job known only by its end.
    feed.finish(220.0, 6, "error", [None, None, None], &["error"]);
    assert_eq!(gauge(&feed.json(221.0), &["jobs", "error"]), 1);
}

#[test]
fn locks_are_counted_by_level_and_mode_and_a_mode_change_moves_the_count() {
    let mut feed = Feed::new();
    feed.grant(
        10.0,
        "7",
        &[("node/n1", "shared"), ("cluster/BGL", "shared")],
        "direct",
    );
    feed.grant(10.5, "8", &[("node/n1", "shared")], "direct");
    let json = feed.json(11.0);
    assert_eq!(gauge(&json, &["locks_held", "node", "shared"]), 2);
    assert_eq!(gauge(&json, &["locks_held", "cluster", "shared"]), 1);
    // A mode change: the same lock, now exclusive.
    feed.release(11.0, "8", &[("node/n1", "shared")]);
    feed.grant(12.0, "7", &[("node/n1", "exclusive")], "direct");
    let json = feed.json(12.0);
    assert_eq!(gauge(&json, &["locks_held", "node", "shared"]), 0);
    assert_eq!(gauge(&json, &["locks_held", "node", "exclusive"]), 1);
    // Granted again in the mode it has: no change.
    feed.grant(12.5, "7", &[("node/n1", "exclusive")], "direct");
    assert_eq!(
        gauge(&feed.json(13.0), &["locks_held", "node", "exclusive"]),
        1
    );
    feed.release(
        14.0,
        "7",
        &[("node/n1", "exclusive"), ("cluster/BGL", "shared")],
    );
    let json = feed.json(15.0);
    assert_eq!(gauge(&json, &["locks_held", "node", "exclusive"]), 0);
    assert_eq!(gauge(&json, &["locks_held", "cluster", "shared"]), 0);
    assert_eq!(counter(&json, &["lock_grants_total", "direct"]), 4);
    // Held from the first grant to the release, whatever the mode did.
    let node = &json["histograms"]["lock_hold_seconds"]["node"];
    assert_eq!(node["count"], 2);
    assert_eq!(node["sum"], 0.5 + 4.0);
    assert_eq!(
        json["histograms"]["lock_hold_seconds"]["cluster"]["sum"],
        4.0
    );
    assert!(
        feed.metrics.owners.is_empty(),
        "owners with nothing are forgotten"
    );

    // Names that do not parse are left out, the rest of the entries count.
    let entries = [
        ("bogus/x", "shared"),
        ("node/", "shared"),
        ("node/n2", "odd"),
        ("node-res/n2", "shared"),
    ];
    feed.grant(16.0, "9", &entries, "direct");
    let json = feed.json(16.0);
    assert_eq!(gauge(&json, &["locks_held", "node-res", "shared"]), 1);
    assert_eq!(gauge(&json, &["locks_held", "node", "shared"]), 0);
    // A release of what is not held (or of an owner never seen).
    feed.release(17.0, "9", &[("node/n7", "shared")]);
    feed.release(17.0, "nobody", &[("node/n1", "shared")]);
    assert_eq!(
        gauge(&feed.json(17.0), &["locks_held", "node-res", "shared"]),
        1
    );
}

#[test]
fn waits_end_with_a_grant_a_withdrawal_or_a_death() {
    let mut feed = Feed::new();
    feed.wait(200.0, "a", "node/n1");
    feed.wait(205.0, "b", "node/n1");
    let json = feed.json(210.0);
    assert_eq!(gauge(&json, &["owners_waiting"]), 2);
    assert_eq!(gauge(&json, &["longest_wait_seconds"]), 10.0);
    // A replaced request: still waiting since the first.
    feed.wait(206.0, "a", "node/n2");
    assert_eq!(gauge(&feed.json(210.0), &["longest_wait_seconds"]), 10.0);
    // A direct grant does not end a wait.
    feed.grant(207.0, "a", &[("instance/i1", "shared")], "direct");
    assert_eq!(gauge(&feed.json(210.0), &["owners_waiting"]), 2);

    feed.grant(212.0, "a", &[("node/n1", "exclusive")], "waiting");
    let json = feed.json(215.0);
    assert_eq!(gauge(&json, &["owners_waiting"]), 1);
    assert_eq!(gauge(&json, &["longest_wait_seconds"]), 10.0);
    assert_eq!(json["histograms"]["lock_wait_seconds"]["count"], 1);
    assert_eq!(json["histograms"]["lock_wait_seconds"]["sum"], 12.0);
    assert_eq!(counter(&json, &["lock_grants_total", "waiting"]), 1);

    feed.wconfd(216.0, "lock.withdrawn", json!({"owner": "b"}));
    let json = feed.json(217.0);
    assert_eq!(gauge(&json, &["owners_waiting"]), 0);
    assert_eq!(gauge(&json, &["longest_wait_seconds"]), 0.0);
    assert_eq!(
        json["histograms"]["lock_wait_seconds"]["count"], 1,
        "no grant, no wait"
    );

    // A dead owner: its wait ends at once, its locks with lock.released.
    feed.wait(220.0, "a", "cluster/BGL");
    feed.wait(221.0, "c", "node/n1");
    feed.grant(222.0, "c", &[("node/n1", "shared")], "await");
    assert_eq!(
        counter(&feed.json(222.0), &["lock_grants_total", "await"]),
        1
    );
    let held = [("instance/i1", "shared"), ("node/n1", "exclusive")];
    let fields = json!({"owner": "a", "held": held, "waited": [["cluster/BGL", "exclusive"]]});
    feed.wconfd(230.0, "owner.dead", fields);
    let json = feed.json(231.0);
    assert_eq!(counter(&json, &["owner_deaths_total"]), 1);
    assert_eq!(gauge(&json, &["owners_waiting"]), 0);
    assert_eq!(gauge(&json, &["locks_held", "node", "exclusive"]), 1);
    feed.release(230.0, "a", &held);
    let json = feed.json(231.0);
    assert_eq!(gauge(&json, &["locks_held", "node", "exclusive"]), 0);
    assert_eq!(gauge(&json, &["locks_held", "instance", "shared"]), 0);
    assert_eq!(gauge(&json, &["locks_held", "node", "shared"]), 1, "c's");
    assert_eq!(json["histograms"]["lock_wait_seconds"]["count"], 2);
}

#[test]
fn workers_are_counted_by_state_and_by_group() {
    let mut feed = Feed::new();
    feed.worker(1.0, "w1", None, "MAINTENANCE", &["g1"]);
    feed.worker(1.0, "w2", None, "MAINTENANCE", &["g1", "g2"]);
    feed.worker(2.0, "w1", Some("MAINTENANCE"), "IDLE", &["g1"]);
    feed.worker(2.0, "w2", Some("MAINTENANCE"), "IDLE", &["g1", "g2"]);
    feed.worker(3.0, "w2", Some("IDLE"), "RUNNING", &["g1", "g2"]);
    let json = feed.json(4.0);
    assert_eq!(gauge(&json, &["workers", "IDLE"]), 1);
    assert_eq!(gauge(&json, &["workers", "RUNNING"]), 1);
    assert_eq!(gauge(&json, &["workers", "MAINTENANCE"]), 0);
    assert_eq!(gauge(&json, &["workers_by_group", "g1", "IDLE"]), 1);
    assert_eq!(gauge(&json, &["workers_by_group", "g1", "RUNNING"]), 1);
    assert_eq!(gauge(&json, &["workers_by_group", "g2", "RUNNING"]), 1);
    assert_eq!(gauge(&json, &["workers_by_group", "g2", "FAILED"]), 0);

    // worker.groups: the same state, other groups.
    let fields = json!({"uuid": "w2", "old": "RUNNING", "new": "RUNNING", "holder": 4,
                        "reason": null, "groups": ["g2", "g3", "g3"]});
    feed.wconfd(5.0, "worker.groups", fields);
    let json = feed.json(5.0);
    assert_eq!(gauge(&json, &["workers_by_group", "g1", "RUNNING"]), 0);
    assert_eq!(
        gauge(&json, &["workers_by_group", "g3", "RUNNING"]),
        1,
        "a group once"
    );
    let fields = json!({"uuid": "w1", "old": "IDLE", "new": null, "holder": null,
                        "reason": null, "groups": ["g1"]});
    feed.wconfd(6.0, "worker.deregistered", fields);
    let json = feed.json(6.0);
    assert_eq!(gauge(&json, &["workers", "IDLE"]), 0);
    // A group keeps its zeros once seen.
    let g1: BTreeMap<String, Value> = State::ALL
        .iter()
        .map(|s| (s.wire().to_owned(), json!(0)))
        .collect();
    assert_eq!(gauge(&json, &["workers_by_group", "g1"]), &json!(g1));
    let parsed = parse_prometheus(&feed.metrics.prometheus_text(6.0));
    let labels = [("group", "g1"), ("state", "BUSY")];
    assert_eq!(
        sample(&parsed, "warden_workers_by_group", &labels),
        Some(0.0)
    );
}

#[test]
fn groups_past_the_limit_are_not_counted_by_group() {
    let mut feed = Feed::new();
    let groups: Vec<String> = (0..=GROUPS_TRACKED_MAX)
        .map(|index| format!("g{index:05}"))
        .collect();
    for (index, chunk) in groups.chunks(WORKER_GROUPS_MAX).enumerate() {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        feed.worker(1.0, &format!("w{index}"), None, "IDLE", &chunk);
    }
    let json = feed.json(2.0);
    let by_group = gauge(&json, &["workers_by_group"])
        .as_object()
        .expect("groups");
    assert_eq!(by_group.len(), GROUPS_TRACKED_MAX);
    assert!(!by_group.contains_key(&groups[GROUPS_TRACKED_MAX]));
    assert_eq!(
        gauge(&json, &["workers", "IDLE"]),
        groups.len().div_ceil(WORKER_GROUPS_MAX)
    );
}

#[test]
fn malformed_and_unknown_events_are_only_read() {
    let mut feed = Feed::new();
    let luxid = [
        ("job.submitted", json!({"id": "one"})),
        (
            "job.status",
            json!({"id": 1, "old": "queued", "new": "bogus"}),
        ),
        ("job.status", json!({"id": -1, "new": "running"})),
        ("job.finished", json!({"id": 1, "status": null})),
        ("job.archived", json!({})),
        ("queue.started", json!({"max_running_jobs": "many"})),
        ("job.priority", json!({"id": 1, "old": 0, "new": -5})),
        ("queue.drain", json!({"drained": true})),
        (
            "lock.granted",
            json!({"owner": "x", "entries": [["node/n1", "shared"]], "via": "direct"}),
        ),
        ("job.unknown", json!({"id": 1})),
    ];
    for (kind, fields) in luxid {
        feed.luxid(1.0, kind, fields);
    }
    let wconfd = [
        (
            "lock.granted",
            json!({"owner": 3, "entries": [["node/n1", "shared"]]}),
        ),
        ("lock.granted", json!({"owner": "x", "entries": "node/n1"})),
        (
            "lock.granted",
            json!({"owner": "x", "entries": [[1, 2], [], "node/n1", null]}),
        ),
        ("lock.released", json!({"owner": "x"})),
        ("lock.waiting", json!({"priority": 0})),
        ("lock.withdrawn", json!({"owner": ["x"]})),
        ("owner.dead", json!({"held": []})),
        ("worker.idle", json!({"new": "IDLE"})),
        ("worker.bogus", json!({"uuid": "w", "new": null})),
        ("worker.", json!({"uuid": "w"})),
        ("worker.deregistered", json!({"uuid": "never"})),
        ("config.written", json!({"serial_no": 4})),
        ("config.lock_violation", json!({"kinds": {"node": -1}})),
        ("config.lock_violation", json!({"kinds": [1, 2, 3]})),
        ("config.lock_violation", json!({"count": 2})),
        ("job.submitted", json!({"id": 1, "received": [1, 0]})),
        ("", json!({})),
    ];
    for (kind, fields) in wconfd {
        feed.wconfd(1.0, kind, fields);
    }
    let json = feed.json(2.0);
    assert_eq!(
        counter(&json, &["events_read_total"]),
        &json!({"luxid": 10, "wconfd": 17})
    );
    assert_eq!(json, {
        let mut fresh = Feed::new();
        fresh.metrics.counters.events_read = [10, 17];
        fresh.json(2.0)
    });
}

#[test]
fn config_lock_violations_are_counted_by_kind() {
    let mut feed = Feed::new();
    let zeros = json!({"instance": 0, "nodegroup": 0, "node": 0});
    assert_eq!(
        counter(&feed.json(0.0), &["config_lock_violations_total"]),
        &zeros
    );
    let kinds = |instance: u64, nodegroup: u64, node: u64| {
        json!({"owner": "7", "refused": false, "count": instance + nodegroup + node,
               "kinds": {"instance": instance, "nodegroup": nodegroup, "node": node},
               "violations": []})
    };
    feed.wconfd(1.0, "config.lock_violation", kinds(2, 0, 1));
    feed.wconfd(2.0, "config.lock_violation", kinds(0, 1, 12));
    // A kind left out counts none.
    feed.wconfd(
        3.0,
        "config.lock_violation",
        json!({"owner": "8", "refused": true, "count": 1, "kinds": {"instance": 1}}),
    );
    let json = feed.json(4.0);
    assert_eq!(
        counter(&json, &["config_lock_violations_total"]),
        &json!({"instance": 3, "nodegroup": 1, "node": 13})
    );
    let parsed = parse_prometheus(&feed.metrics.prometheus_text(4.0));
    assert_eq!(
        parsed.families["warden_config_lock_violations_total"].0,
        "counter"
    );
    for (kind, count) in [("instance", 3.0), ("nodegroup", 1.0), ("node", 13.0)] {
        assert_eq!(
            sample(
                &parsed,
                "warden_config_lock_violations_total",
                &[("kind", kind)]
            ),
            Some(count)
        );
    }
    let sent = lines(&Statsd::new("warden", 1.0).due(&feed.metrics, 4.0));
    assert!(
        sent.contains(&"warden.config.lock_violations.node:13|c".to_owned()),
        "{sent:?}"
    );
    // The kinds are the configuration check's, in its order.
    let kinds: Vec<&str> = crate::store::config_check::EntityKind::ALL
        .iter()
        .map(|kind| kind.as_str())
        .collect();
    assert_eq!(kinds, ENTITY_KINDS);
    // Saved and restored; a state saved before the counter restores zeros.
    let saved = feed.metrics.save();
    let restored = Metrics::restore(&saved).expect("restores");
    assert_eq!(restored.to_json(4.0), json);
    let mut older = saved.clone();
    older["counters"]
        .as_object_mut()
        .expect("counters")
        .remove("config_lock_violations");
    let restored = Metrics::restore(&older).expect("restores");
    assert_eq!(
        counter(&restored.to_json(4.0), &["config_lock_violations_total"]),
        &zeros
    );
}

#[test]
fn hook_runs_and_failures_are_counted() {
    let mut metrics = Metrics::new();
    metrics.hook_ran(true);
    metrics.hook_ran(false);
    metrics.hook_ran(false);
    let json = metrics.to_json(0.0);
    assert_eq!(counter(&json, &["hook_runs_total"]), 3);
    assert_eq!(counter(&json, &["hook_failures_total"]), 2);
    let parsed = parse_prometheus(&metrics.prometheus_text(0.0));
    assert_eq!(sample(&parsed, "warden_hook_runs_total", &[]), Some(3.0));
    assert_eq!(
        sample(&parsed, "warden_hook_failures_total", &[]),
        Some(2.0)
    );
}

/// A feed that has seen a bit of everything.
fn busy_feed() -> Feed {
    let mut feed = Feed::new();
    feed.luxid(
        99.0,
        "queue.started",
        json!({"max_running_jobs": 4, "drained": false}),
    );
    for id in 1..=6 {
        feed.submit(100.0 + id as f64, id);
    }
    feed.status(108.0, 1, "queued", "running");
    feed.status(109.0, 2, "queued", "waiting");
    feed.status(120.0, 1, "running", "success");
    feed.finish(
        120.0,
        1,
        "success",
        [Some(101.0), Some(108.0), Some(120.0)],
        &["success"],
    );
    feed.luxid(121.0, "job.archived", json!({"id": 1}));
    feed.status(122.0, 9, "running", "canceling");
    feed.grant(
        110.0,
        "2",
        &[("node/n1", "exclusive"), ("cluster/BGL", "shared")],
        "direct",
    );
    feed.wait(111.0, "3", "node/n1");
    feed.wait(112.0, "4", "node/n1");
    feed.grant(113.0, "5", &[("network/net0", "shared")], "direct");
    feed.release(118.0, "5", &[("network/net0", "shared")]);
    feed.worker(
        90.0,
        "w1",
        None,
        "IDLE",
        &["farm \"a\"", "back\\slash", "new\nline"],
    );
    feed.worker(91.0, "w2", None, "MAINTENANCE", &["farm.b"]);
    feed.worker(
        92.0,
        "w1",
        Some("IDLE"),
        "RUNNING",
        &["farm \"a\"", "back\\slash", "new\nline"],
    );
    feed.metrics.hook_ran(false);
    feed
}

#[test]
fn the_prometheus_text_parses_and_escapes_label_values() {
    let feed = busy_feed();
    let text = feed.metrics.prometheus_text(130.0);
    let parsed = parse_prometheus(&text);
    for spec in &FAMILIES {
        assert_eq!(parsed.families[spec.prom].1, spec.help, "{}", spec.prom);
        assert_eq!(parsed.families[spec.prom].0, spec.kind.as_str());
    }
    assert_eq!(
        sample(&parsed, "warden_jobs", &[("status", "queued")]),
        Some(4.0)
    );
    assert_eq!(
        sample(&parsed, "warden_jobs", &[("status", "canceling")]),
        Some(1.0)
    );
    assert_eq!(sample(&parsed, "warden_slots_used", &[]), Some(2.0));
    assert_eq!(sample(&parsed, "warden_slots_max", &[]), Some(4.0));
    assert_eq!(
        sample(&parsed, "warden_oldest_queued_job_age_seconds", &[]),
        Some(27.0)
    );
    assert_eq!(sample(&parsed, "warden_owners_waiting", &[]), Some(2.0));
    assert_eq!(
        sample(&parsed, "warden_longest_wait_seconds", &[]),
        Some(19.0)
    );
    let labels = [("level", "node"), ("mode", "exclusive")];
    assert_eq!(sample(&parsed, "warden_locks_held", &labels), Some(1.0));
    for group in ["farm \"a\"", "back\\slash", "new\nline"] {
        let labels = [("group", group), ("state", "RUNNING")];
        assert_eq!(
            sample(&parsed, "warden_workers_by_group", &labels),
            Some(1.0),
            "{group:?}"
        );
    }
    assert!(text.contains(r#"group="farm \"a\"""#) && text.contains(r#"group="new\nline""#));
    let labels = [("le", "10")];
    assert_eq!(
        sample(&parsed, "warden_job_queue_delay_seconds_bucket", &labels),
        Some(2.0)
    );
    assert_eq!(
        sample(&parsed, "warden_job_queue_delay_seconds_sum", &[]),
        Some(14.0)
    );
    let labels = [("level", "network"), ("le", "1")];
    assert_eq!(
        sample(&parsed, "warden_lock_hold_seconds_bucket", &labels),
        Some(0.0)
    );
    let labels = [("level", "network"), ("le", "5")];
    assert_eq!(
        sample(&parsed, "warden_lock_hold_seconds_bucket", &labels),
        Some(1.0)
    );
    assert_eq!(
        sample(&parsed, "warden_events_read_total", &[("daemon", "wconfd")]),
        Some(8.0)
    );

    // The caller's own gauges come last, as gauges.
    let extra = [(
        "warden_reporter_leader",
        "Whether this reporter reports.",
        1.0,
    )];
    let text = feed.metrics.prometheus_text_with(130.0, &extra);
    let parsed = parse_prometheus(&text);
    assert_eq!(parsed.families["warden_reporter_leader"].0, "gauge");
    assert!(text.ends_with("warden_reporter_leader 1\n"), "{text}");
}

#[test]
#[should_panic(expected = "repeats a family")]
fn an_extra_gauge_may_not_repeat_a_family() {
    Metrics::new().prometheus_text_with(0.0, &[("warden_jobs", "Jobs.", 1.0)]);
}

#[test]
fn the_json_has_the_documented_shape() {
    let json = busy_feed().json(130.0);
    let keys = |section: &str| -> Vec<String> {
        json[section]
            .as_object()
            .expect("a section")
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(
        keys("gauges"),
        [
            "jobs",
            "slots_used",
            "slots_max",
            "oldest_queued_job_age_seconds",
            "locks_held",
            "owners_waiting",
            "longest_wait_seconds",
            "workers",
            "workers_by_group"
        ]
    );
    assert_eq!(
        keys("counters"),
        [
            "jobs_finished_total",
            "opcodes_total",
            "lock_grants_total",
            "owner_deaths_total",
            "lock_deadlocks_refused_total",
            "config_lock_violations_total",
            "hook_runs_total",
            "hook_failures_total",
            "events_read_total"
        ]
    );
    assert_eq!(
        keys("histograms"),
        [
            "job_queue_delay_seconds",
            "job_run_seconds",
            "lock_wait_seconds",
            "lock_hold_seconds"
        ]
    );
    let run = &json["histograms"]["job_run_seconds"];
    assert_eq!(run["count"], 1);
    assert_eq!(run["sum"], 12.0);
    let buckets = run["buckets"].as_object().expect("buckets");
    assert_eq!(buckets.len(), BUCKET_BOUNDS_SECONDS.len() + 1);
    assert_eq!(
        (
            buckets["10"].clone(),
            buckets["30"].clone(),
            buckets["+Inf"].clone()
        ),
        (json!(0), json!(1), json!(1))
    );
    assert_eq!(
        gauge(&json, &["workers_by_group", "farm.b", "MAINTENANCE"]),
        1
    );
    assert_eq!(
        json["histograms"]["lock_hold_seconds"]["network"]["count"],
        1
    );
}

#[test]
fn save_and_restore_round_trip() {
    let mut feed = busy_feed();
    let saved = feed.metrics.save();
    let restored = Metrics::restore(&saved).expect("restores");
    restored.check_invariants();
    assert_eq!(restored.save(), saved);
    assert_eq!(
        restored.prometheus_text(130.0),
        feed.metrics.prometheus_text(130.0)
    );
    assert_eq!(restored.to_json(130.0), feed.json(130.0));
    // Both go on alike: the tracking state came along.
    let mut twin = Feed {
        metrics: restored.clone(),
        seq: feed.seq,
    };
    for each in [&mut feed, &mut twin] {
        each.status(131.0, 3, "queued", "running");
        each.grant(132.0, "3", &[("node/n1", "exclusive")], "waiting");
        each.release(
            133.0,
            "2",
            &[("node/n1", "exclusive"), ("cluster/BGL", "shared")],
        );
        each.worker(134.0, "w1", Some("RUNNING"), "IDLE", &["farm.b"]);
        each.luxid(135.0, "job.archived", json!({"id": 9}));
    }
    assert_eq!(twin.metrics.save(), feed.metrics.save());
    assert_eq!(twin.json(140.0), feed.json(140.0));
    // The fresh state too.
    let fresh = Metrics::new().save();
    assert_eq!(Metrics::restore(&fresh).expect("restores").save(), fresh);
    // Compact: a thousand queued jobs in well under 64 KiB.
    let mut many = Feed::new();
    for id in 1..=1000 {
        many.submit(1_800_000_000.0 + id as f64, id);
    }
    let bytes = serde_json::to_vec(&many.metrics.save())
        .expect("JSON")
        .len();
    assert!(bytes < 40 * 1000, "{bytes} bytes");
}

#[test]
fn a_damaged_save_is_an_error_that_says_what() {
    let saved = busy_feed().metrics.save();
    let damage = |path: &[&str], value: Value| {
        let mut damaged = saved.clone();
        let (last, parents) = path.split_last().expect("a path");
        let slot = parents
            .iter()
            .fold(&mut damaged, |value, key| match key.parse::<usize>() {
                Ok(index) => &mut value[index],
                Err(_) => &mut value[*key],
            });
        match last.parse::<usize>() {
            Ok(index) => slot[index] = value,
            Err(_) => slot[*last] = value,
        }
        Metrics::restore(&damaged).expect_err("damaged")
    };
    assert!(damage(&["version"], json!(2)).contains("version 2"));
    assert!(damage(&["jobs", "1"], saved["jobs"][0].clone()).contains("twice"));
    assert!(damage(&["jobs", "0", "1"], json!("done")).contains("job"));
    assert!(damage(&["owners", "0", "2", "0", "0"], json!("bogus/x")).contains("lock"));
    assert!(damage(&["owners", "0", "2"], json!([])).contains("neither holds nor waits"));
    assert!(damage(&["workers", "0", "2"], json!(["unknown"])).contains("not tracked"));
    assert!(damage(&["groups", "1"], saved["groups"][0].clone()).contains("twice"));
    assert!(damage(&["counters", "lock_grants"], json!([1])).contains("lock_grants"));
    assert!(
        damage(&["counters", "config_lock_violations"], json!([1, -1, 0]))
            .contains("config_lock_violations")
    );
    assert!(damage(&["counters", "opcodes"], json!({"fine": 1})).contains("fine"));
    assert!(damage(&["histograms", "lock_wait"], json!([1.0, [1, 2]])).contains("lock_wait"));
    assert!(damage(&["histograms", "job_run", "0"], json!(-1.0)).contains("job_run"));
    assert!(damage(&["slots_max"], Value::Null).contains("slots_max"));
    assert!(Metrics::restore(&json!([])).is_err());
}

#[test]
fn a_burst_of_changes_is_coalesced_and_ends_with_its_last_value() {
    let mut feed = Feed::new();
    let mut statsd = Statsd::new("warden", 1.0);
    let start = 1000.0;
    let mut sends: BTreeMap<String, Vec<(f64, String)>> = BTreeMap::new();
    let mut record = |lines: Vec<String>, at: f64| {
        for line in lines {
            if let Some((name, value)) = line
                .strip_suffix("|g")
                .and_then(|line| line.split_once(':'))
            {
                sends
                    .entry(name.to_owned())
                    .or_default()
                    .push((at, value.to_owned()));
            }
        }
    };
    record(lines(&statsd.due(&feed.metrics, start)), start);
    // 1,000 changes within one second, a call after each.
    for id in 1..=1000 {
        let at = start + 0.0005 + (id - 1) as f64 * 0.000_999;
        feed.submit(at, id);
        feed.status(at, id, "queued", "running");
        let sent = lines(&statsd.due(&feed.metrics, at));
        assert!(
            gauge_line(&sent, "warden.jobs.running").is_none(),
            "within the interval"
        );
        record(sent, at);
    }
    let sent = lines(&statsd.due(&feed.metrics, start + 1.0));
    assert_eq!(gauge_line(&sent, "warden.jobs.running"), Some("1000"));
    assert_eq!(gauge_line(&sent, "warden.slots.used"), Some("1000"));
    assert!(
        gauge_line(&sent, "warden.jobs.queued").is_none(),
        "unchanged: 0 then, 0 now"
    );
    record(sent, start + 1.0);
    // Changes go on for two more seconds, calls every millisecond, then stop.
    let mut id = 1000;
    for step in 1..=4000 {
        let at = start + 1.0 + step as f64 * 0.001;
        if step <= 2000 {
            id += 1;
            feed.submit(at, id);
            feed.status(at, id, "queued", "running");
        }
        record(lines(&statsd.due(&feed.metrics, at)), at);
    }
    for (name, times) in &sends {
        for pair in times.windows(2) {
            assert!(
                pair[1].0 - pair[0].0 >= 1.0 - 1e-9,
                "{name} twice within a second: {times:?}"
            );
        }
    }
    let running = &sends["warden.jobs.running"];
    assert_eq!(
        running.last().map(|(_, value)| value.as_str()),
        Some("3000"),
        "{running:?}"
    );
    assert_eq!(running.len(), 4, "0, 1000, then once a second: {running:?}");
}

#[test]
fn an_unchanged_gauge_is_sent_again_every_ten_intervals() {
    let metrics = Metrics::new();
    let mut statsd = Statsd::new("warden", 0.5);
    assert!(!statsd.due(&metrics, 100.0).is_empty());
    for step in 1..10 {
        assert!(
            statsd.due(&metrics, 100.0 + step as f64 * 0.5).is_empty(),
            "step {step}"
        );
    }
    let sent = lines(&statsd.due(&metrics, 105.0));
    assert_eq!(gauge_line(&sent, "warden.jobs.queued"), Some("0"));
    // A clock set back does not silence the gauges.
    assert!(!statsd.due(&metrics, 50.0).is_empty());
}

#[test]
fn packets_hold_whole_lines_within_512_bytes() {
    let mut feed = Feed::new();
    let groups: Vec<String> = (0..300)
        .map(|index| format!("a-rather-long-group-name-of-some-farm-{index:03}"))
        .collect();
    for (index, chunk) in groups.chunks(50).enumerate() {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        feed.worker(1.0, &format!("w{index}"), None, "IDLE", &chunk);
    }
    let long = "x".repeat(STATSD_PACKET_BYTES_MAX);
    feed.worker(1.0, "w-long", None, "IDLE", &[long.as_str()]);
    let mut statsd = Statsd::new("warden.prod", 1.0);
    let packets = statsd.due(&feed.metrics, 2.0);
    assert!(packets.len() > 100, "{} packets", packets.len());
    let sent = lines(&packets);
    assert_eq!(
        sent.len(),
        18 + 2 * Level::ALL.len() + 300 * 6 + 1,
        "gauges and the events-read counter"
    );
    assert_eq!(
        statsd.dropped_lines(),
        6,
        "the long group's lines alone exceed a packet"
    );
    let name = "warden.prod.workers.group.a-rather-long-group-name-of-some-farm-299.IDLE";
    assert_eq!(gauge_line(&sent, name), Some("1"));
    // Packets are filled: none but the last could have taken the next line.
    for pair in packets.windows(2) {
        let next = pair[1].split(|byte| *byte == b'\n').next().expect("a line");
        assert!(pair[0].len() + 1 + next.len() > STATSD_PACKET_BYTES_MAX);
    }
}

#[test]
fn statsd_names_are_sanitised() {
    let mut feed = Feed::new();
    feed.worker(1.0, "w1", None, "IDLE", &["a.b c:d|e\né"]);
    let mut statsd = Statsd::new("my prefix..x", 1.0);
    let sent = lines(&statsd.due(&feed.metrics, 2.0));
    assert_eq!(
        gauge_line(&sent, "my_prefix.x.workers.group.a_b_c_d_e__.IDLE"),
        Some("1")
    );
    assert_eq!(
        gauge_line(&sent, "my_prefix.x.locks.held.node-res.shared"),
        Some("0")
    );
    let mut bare = Statsd::new("", 1.0);
    let sent = lines(&bare.due(&feed.metrics, 2.0));
    assert_eq!(gauge_line(&sent, "workers.IDLE"), Some("1"));
}

#[test]
fn counters_go_as_deltas_and_timers_as_each_observation() {
    let mut feed = Feed::new();
    let mut statsd = Statsd::new("warden", 1.0);
    feed.submit(100.0, 1);
    feed.status(100.25, 1, "queued", "running");
    let sent = lines(&statsd.due(&feed.metrics, 101.0));
    assert!(
        sent.contains(&"warden.events.read.luxid:2|c".to_owned()),
        "{sent:?}"
    );
    assert!(
        sent.contains(&"warden.jobs.queue_delay:250|ms".to_owned()),
        "{sent:?}"
    );
    feed.status(101.5, 1, "running", "success");
    feed.finish(
        101.5,
        1,
        "success",
        [Some(100.0), Some(100.25), Some(101.5)],
        &["success"],
    );
    feed.grant(101.5, "1", &[("node-res/n1", "shared")], "direct");
    feed.release(101.5015, "1", &[("node-res/n1", "shared")]);
    // Within the interval: counters and timers wait.
    let sent = lines(&statsd.due(&feed.metrics, 101.6));
    assert!(sent.iter().all(|line| line.ends_with("|g")), "{sent:?}");
    let sent = lines(&statsd.due(&feed.metrics, 102.0));
    let mut expected = vec![
        "warden.jobs.finished.success:1|c",
        "warden.opcodes.success:1|c",
        "warden.locks.grants.direct:1|c",
        "warden.events.read.luxid:2|c",
        "warden.events.read.wconfd:2|c",
        "warden.jobs.run_time:1250|ms",
        "warden.locks.hold.node-res:1.5|ms",
    ];
    let mut counters_and_timers: Vec<&str> = sent
        .iter()
        .filter(|line| !line.ends_with("|g"))
        .map(String::as_str)
        .collect();
    counters_and_timers.sort_unstable();
    expected.sort_unstable();
    assert_eq!(counters_and_timers, expected);
    assert!(
        lines(&statsd.due(&feed.metrics, 103.0))
            .iter()
            .all(|line| line.ends_with("|g"))
    );

    // More observations between two sends than are kept: the oldest drop.
    for index in 0..OBSERVATIONS_KEPT_MAX + 50 {
        let at = 104.0 + index as f64 * 1e-5;
        feed.grant(at, "2", &[("node/n1", "exclusive")], "direct");
        feed.release(at, "2", &[("node/n1", "exclusive")]);
    }
    let sent = lines(&statsd.due(&feed.metrics, 105.0));
    let timers = sent.iter().filter(|line| line.ends_with("|ms")).count();
    assert_eq!(timers, OBSERVATIONS_KEPT_MAX);
    assert_eq!(statsd.dropped_observations(), 50);
    let grants = format!(
        "warden.locks.grants.direct:{}|c",
        OBSERVATIONS_KEPT_MAX + 50
    );
    assert!(sent.contains(&grants), "counters never drop");
}

#[test]
fn a_resumed_sender_sends_only_what_came_after() {
    let mut feed = busy_feed();
    let mut statsd = Statsd::resume("warden", 1.0, &feed.metrics);
    let sent = lines(&statsd.due(&feed.metrics, 130.0));
    assert!(
        sent.iter().all(|line| line.ends_with("|g")),
        "gauges only: {sent:?}"
    );
    assert_eq!(gauge_line(&sent, "warden.jobs.queued"), Some("4"));
    feed.release(131.0, "2", &[("cluster/BGL", "shared")]);
    let sent = lines(&statsd.due(&feed.metrics, 131.0));
    let rest: Vec<&String> = sent.iter().filter(|line| !line.ends_with("|g")).collect();
    assert_eq!(
        rest,
        [
            "warden.events.read.wconfd:1|c",
            "warden.locks.hold.cluster:21000|ms"
        ]
    );
}

// A property test against a naive model of what the gauges count.

#[derive(Clone, Debug)]
enum Step {
    Submit(u64),
    Status(u64, usize),
    Finish(u64, usize),
    Archive(u64),
    Grant(usize, usize, usize, usize),
    Release(usize, usize),
    Wait(usize),
    Withdraw(usize),
    Dead(usize),
    Worker(usize, usize, Vec<usize>),
    Deregister(usize),
    Garbage(usize),
}

const OWNERS: [&str; 3] = ["1", "2", "svc"];
const LOCKS: [&str; 5] = [
    "cluster/BGL",
    "node/n1",
    "node/n2",
    "node-res/n1",
    "cluster/config",
];
const GROUPS: [&str; 3] = ["g1", "g2", "g3"];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1..6u64).prop_map(Step::Submit),
        (1..6u64, 0..7usize).prop_map(|(id, status)| Step::Status(id, status)),
        (1..6u64, 4..7usize).prop_map(|(id, status)| Step::Finish(id, status)),
        (1..6u64).prop_map(Step::Archive),
        (0..3usize, 0..5usize, 0..2usize, 0..3usize)
            .prop_map(|(o, l, m, v)| Step::Grant(o, l, m, v)),
        (0..3usize, 0..5usize).prop_map(|(owner, lock)| Step::Release(owner, lock)),
        (0..3usize).prop_map(Step::Wait),
        (0..3usize).prop_map(Step::Withdraw),
        (0..3usize).prop_map(Step::Dead),
        (0..3usize, 0..6usize, prop::collection::vec(0..3usize, 0..3))
            .prop_map(|(uuid, state, groups)| Step::Worker(uuid, state, groups)),
        (0..3usize).prop_map(Step::Deregister),
        (0..6usize).prop_map(Step::Garbage),
    ]
}

#[derive(Default)]
struct Model {
    jobs: BTreeMap<u64, Status>,
    locks: BTreeMap<(usize, usize), Mode>,
    waiting: BTreeSet<usize>,
    workers: BTreeMap<usize, (State, BTreeSet<usize>)>,
    groups: BTreeSet<usize>,
}

fn drive(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut feed = Feed::new();
    let mut model = Model::default();
    for (index, step) in steps.iter().enumerate() {
        let at = 1000.0 + index as f64;
        match step {
            Step::Submit(id) => {
                feed.submit(at, *id);
                model.jobs.entry(*id).or_insert(Status::Queued);
            }
            Step::Status(id, status) => {
                let new = Status::ALL[*status];
                let old = model.jobs.get(id).map_or("queued", |old| old.name());
                feed.status(at, *id, old, new.name());
                model.jobs.insert(*id, new);
            }
            Step::Finish(id, status) => {
                let status = Status::ALL[*status];
                feed.finish(
                    at,
                    *id,
                    status.name(),
                    [Some(at - 2.0), Some(at - 1.0), Some(at)],
                    &[status.name()],
                );
                model.jobs.insert(*id, status);
            }
            Step::Archive(id) => {
                feed.luxid(at, "job.archived", json!({"id": id}));
                model.jobs.remove(id);
            }
            Step::Grant(owner, lock, mode, via) => {
                let mode = MODES[*mode];
                feed.grant(
                    at,
                    OWNERS[*owner],
                    &[(LOCKS[*lock], mode.as_str())],
                    VIAS[*via],
                );
                model.locks.insert((*owner, *lock), mode);
                if *via > 0 {
                    model.waiting.remove(owner);
                }
            }
            Step::Release(owner, lock) => {
                feed.release(at, OWNERS[*owner], &[(LOCKS[*lock], "shared")]);
                model.locks.remove(&(*owner, *lock));
            }
            Step::Wait(owner) => {
                feed.wait(at, OWNERS[*owner], LOCKS[0]);
                model.waiting.insert(*owner);
            }
            Step::Withdraw(owner) => {
                feed.wconfd(at, "lock.withdrawn", json!({"owner": OWNERS[*owner]}));
                model.waiting.remove(owner);
            }
            Step::Dead(owner) => {
                feed.wconfd(
                    at,
                    "owner.dead",
                    json!({"owner": OWNERS[*owner], "held": [], "waited": null}),
                );
                model.waiting.remove(owner);
            }
            Step::Worker(uuid, state, groups) => {
                let state = State::ALL[*state];
                let names: Vec<&str> = groups.iter().map(|group| GROUPS[*group]).collect();
                let old = model.workers.get(uuid).map(|(old, _)| old.wire());
                feed.worker(at, &format!("w{uuid}"), old, state.wire(), &names);
                model.groups.extend(groups);
                model
                    .workers
                    .insert(*uuid, (state, groups.iter().copied().collect()));
            }
            Step::Deregister(uuid) => {
                let fields = json!({"uuid": format!("w{uuid}"), "new": null, "groups": []});
                feed.wconfd(at, "worker.deregistered", fields);
                model.workers.remove(uuid);
            }
            Step::Garbage(which) => {
                let garbage = [
                    ("job.status", json!({"id": 1, "new": "later"})),
                    ("job.finished", json!({"id": 2})),
                    (
                        "lock.granted",
                        json!({"owner": "1", "entries": [["node", "shared"]]}),
                    ),
                    ("lock.released", json!({"owner": "2", "entries": 5})),
                    ("worker.idle", json!({"uuid": null})),
                    ("queue.started", json!({})),
                ];
                let (kind, fields) = garbage[*which].clone();
                let source = if kind.starts_with("lock") || kind.starts_with("worker") {
                    Source::Wconfd
                } else {
                    Source::Luxid
                };
                feed.send(source, at, kind, fields);
            }
        }
        let json = feed.json(at);
        let at_step = format!("step {index}: {step:?}");
        for status in Status::ALL {
            let expected = model.jobs.values().filter(|each| **each == status).count();
            prop_assert_eq!(
                gauge(&json, &["jobs", status.name()]),
                expected,
                "{}",
                &at_step
            );
        }
        let used = model
            .jobs
            .values()
            .filter(|status| {
                matches!(
                    status,
                    Status::Waiting | Status::Running | Status::Canceling
                )
            })
            .count();
        prop_assert_eq!(gauge(&json, &["slots_used"]), used, "{}", &at_step);
        for level in Level::ALL {
            for mode in MODES {
                let expected = model
                    .locks
                    .iter()
                    .filter(|((_, lock), each)| {
                        LockName::parse(LOCKS[*lock]).expect("a lock").level() == level
                            && **each == mode
                    })
                    .count();
                let held = gauge(&json, &["locks_held", level.as_str(), mode.as_str()]);
                prop_assert_eq!(held, expected, "{} {} {}", &at_step, level, mode);
            }
        }
        prop_assert_eq!(
            gauge(&json, &["owners_waiting"]),
            model.waiting.len(),
            "{}",
            &at_step
        );
        for state in State::ALL {
            let expected = model
                .workers
                .values()
                .filter(|(each, _)| *each == state)
                .count();
            prop_assert_eq!(
                gauge(&json, &["workers", state.wire()]),
                expected,
                "{}",
                &at_step
            );
            for group in &model.groups {
                let expected = model
                    .workers
                    .values()
                    .filter(|(each, groups)| *each == state && groups.contains(group))
                    .count();
                let by_group = gauge(&json, &["workers_by_group", GROUPS[*group], state.wire()]);
                prop_assert_eq!(by_group, expected, "{}", &at_step);
            }
        }
        let groups = gauge(&json, &["workers_by_group"])
            .as_object()
            .map_or(0, Map::len);
        prop_assert_eq!(groups, model.groups.len(), "{}", &at_step);
    }
    let saved = feed.metrics.save();
    let restored = Metrics::restore(&saved).map_err(TestCaseError::fail)?;
    restored.check_invariants();
    prop_assert_eq!(restored.save(), saved);
    let now = 1000.0 + steps.len() as f64;
    prop_assert_eq!(
        restored.prometheus_text(now),
        feed.metrics.prometheus_text(now)
    );
    parse_prometheus(&feed.metrics.prometheus_text(now));
    Ok(())
}

#[test]
fn the_gauges_follow_a_naive_model() {
    let config = ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    // A fixed seed, so that a run is repeatable; `WARDEN_PROPTEST_RANDOM=1`
    // explores fresh cases instead.
    let mut runner = if std::env::var_os("WARDEN_PROPTEST_RANDOM").is_some() {
        TestRunner::new(config)
    } else {
        TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &[0x3c; 32]),
        )
    };
    let result = runner.run(&prop::collection::vec(step(), 1..80), |steps| drive(&steps));
    if let Err(error) = result {
        panic!("{error}");
    }
}

#[test]
fn grants_and_releases_read_escaped_names_and_extra_parts() {
    let mut feed = Feed::new();
    // Escapes make the parser hand over owned text, not borrowed.
    let owner = "job \"7\"\n";
    feed.grant(1.0, owner, &[("node/n\u{e9}\\1", "exclusive")], "waiting");
    feed.wconfd(
        1.0,
        "lock.granted",
        json!({"owner": owner, "entries": [["node/n2", "shared", "extra"]],
               "via": 5, "more": {"a": [1]}}),
    );
    let json = feed.json(2.0);
    assert_eq!(gauge(&json, &["locks_held", "node", "exclusive"]), 1);
    assert_eq!(gauge(&json, &["locks_held", "node", "shared"]), 1);
    assert_eq!(
        counter(&json, &["lock_grants_total"]),
        &json!({"direct": 0, "waiting": 1, "await": 0})
    );
    feed.release(
        3.0,
        owner,
        &[("node/n\u{e9}\\1", "exclusive"), ("node/n2", "shared")],
    );
    let json = feed.json(3.0);
    assert_eq!(gauge(&json, &["locks_held", "node", "exclusive"]), 0);
    assert_eq!(gauge(&json, &["locks_held", "node", "shared"]), 0);
    assert!(feed.metrics.owners.is_empty());
}
