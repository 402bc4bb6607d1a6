use super::*;
use serde_json::{Map, Value, json};

const KEEP_ALL: Kept = Kept {
    events: u64::MAX,
    age_secs: u64::MAX / 2,
};

fn fields(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// Appends `count` events alternating `job.status` and `lock.granted`,
/// stamped `secs`, written and synced.
fn fill(log: &mut EventLog, count: u64, secs: u64) {
    for index in 0..count {
        let kind = if index % 2 == 0 {
            "job.status"
        } else {
            "lock.granted"
        };
        log.append(kind, &json!({"n": index}), Timestamp(secs, 0));
    }
    log.write_pending().expect("written");
    log.sync().expect("synced");
}

/// A closed sequence of `count` events in segments of `segments_of`.
fn written(count: u64, segments_of: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log = EventLog::open(dir.path(), KEEP_ALL, 100)
        .expect("opened")
        .with_segments_of(segments_of);
    fill(&mut log, count, 100);
    dir
}

fn seqs(events: &[EventLine]) -> Vec<u64> {
    events.iter().map(EventLine::seq).collect()
}

#[test]
fn an_event_line_round_trips_and_bad_lines_are_named() {
    let event = Event {
        seq: 7,
        ts: Timestamp(1796000000, 25),
        kind: "job.finished".to_owned(),
        fields: fields(json!({"id": 3, "status": "success"})),
    };
    let line = event.encode();
    assert_eq!(line.last(), Some(&b'\n'));
    assert_eq!(Event::decode(&line[..line.len() - 1]), Ok(event.clone()));
    let text = String::from_utf8(line).expect("text");
    // Built from the fields' own serialisation, no fields or a non-object
    // alike.
    let bare = EventLine::encode(1, Timestamp(2, 3), "queue.started", &Map::new());
    assert_eq!(
        bare.bytes(),
        br#"{"seq":1,"ts":[2,3],"type":"queue.started"}"#
    );
    assert!(bare.is_of(Some(&["queue.".to_owned()])));
    let odd = EventLine::encode(1, Timestamp(2, 3), "x", &5);
    assert_eq!(odd.bytes(), br#"{"seq":1,"ts":[2,3],"type":"x","value":5}"#);
    assert_eq!(event.line().decode(), Ok(event.clone()));
    assert!(text.starts_with("{\"seq\":7,\"ts\":[1796000000,25],\"type\":\"job.finished\""));
    for (bad, why) in [
        (&b"nope"[..], "not JSON"),
        (b"[1]", "expected an event object"),
        (b"{\"ts\":[1,2],\"type\":\"x\"}", "no seq"),
        (b"{\"seq\":1,\"ts\":[1],\"type\":\"x\"}", "ts"),
        (b"{\"seq\":1,\"ts\":[1,2]}", "no type"),
    ] {
        let error = Event::decode(bad).expect_err("refused");
        assert!(error.contains(why), "{error}");
    }
    let prefixes = ["job.".to_owned(), "worker.".to_owned()];
    assert!(event.is_of(Some(&prefixes)));
    assert!(event.is_of(None));
    assert!(!event.is_of(Some(&["lock.".to_owned()])));
}

#[test]
fn the_sequence_goes_on_across_reopening_and_segments_without_a_gap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log = EventLog::open(dir.path(), KEEP_ALL, 1000)
        .expect("opened")
        .with_segments_of(10);
    assert_eq!((log.last_seq(), log.first_retained()), (0, 1));
    fill(&mut log, 25, 100);
    log.sync().expect("synced");
    let names: Vec<String> = {
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .expect("listed")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8")
            })
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names,
        [segment_name(1), segment_name(11), segment_name(21)],
        "three segments of at most ten"
    );
    drop(log);
    let mut log = EventLog::open(dir.path(), KEEP_ALL, 1000)
        .expect("reopened")
        .with_segments_of(10);
    assert_eq!(log.last_seq(), 25);
    assert_eq!(log.append("job.status", &Map::new(), Timestamp(101, 0)), 26);
    log.write_pending().expect("written");
    // Not yet durable: not yet seen.
    assert_eq!(log.readable_last(), 25);
    assert!(log.unsynced());
    let (events, next) = log.read_after(Some(0), None, 100).expect("read");
    assert_eq!(next, 25);
    assert_eq!(events.len(), 25);
    assert!(matches!(
        log.read_after(Some(26), None, 100),
        Err(EventsError::Future {
            since: 26,
            last: 25
        })
    ));
    let (file, last, len) = log.sync_handle().expect("a handle").expect("a file");
    assert_eq!(last, 26);
    file.sync_data().expect("synced");
    log.mark_synced(last, len);
    assert!(!log.unsynced());
    let (events, next) = log.read_after(Some(0), None, 100).expect("read");
    assert_eq!(seqs(&events), (1..=26).collect::<Vec<u64>>());
    assert_eq!(next, 26);
}

#[test]
fn old_positions_are_read_from_the_files_alike() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log = EventLog::open(dir.path(), KEEP_ALL, 5)
        .expect("opened")
        .with_segments_of(10);
    fill(&mut log, 30, 100);
    let jobs = ["job.".to_owned()];
    // From memory (the last five) and from the files, the same answers.
    let (recent, next) = log.read_after(Some(27), Some(&jobs), 100).expect("read");
    assert_eq!((seqs(&recent), next), (vec![29], 30));
    let (old, next) = log.read_after(Some(2), Some(&jobs), 4).expect("read");
    assert_eq!(seqs(&old), [3, 5, 7, 9]);
    assert_eq!(next, 9, "the next read goes on after the last looked at");
    let (all, next) = log.read_after(Some(0), None, 100).expect("read");
    assert_eq!(seqs(&all), (1..=30).collect::<Vec<u64>>());
    assert_eq!(next, 30);
    assert_eq!(all[28].decode().expect("decoded").fields["n"], json!(28));
    // A position of none is "from now"; none yet after the last.
    assert_eq!(log.read_after(None, None, 10).expect("read"), (vec![], 30));
    assert_eq!(
        log.read_after(Some(30), None, 10).expect("read"),
        (vec![], 30)
    );
    assert!(matches!(
        log.read_after(Some(31), None, 10),
        Err(EventsError::Future {
            since: 31,
            last: 30
        })
    ));
}

#[test]
fn whole_segments_go_once_both_the_count_and_the_age_allow() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kept = Kept {
        events: 12,
        age_secs: 3600,
    };
    let mut log = EventLog::open(dir.path(), kept, 100)
        .expect("opened")
        .with_segments_of(10);
    fill(&mut log, 10, 1000);
    fill(&mut log, 10, 2000);
    fill(&mut log, 10, 9000);
    // Young: nothing goes.
    assert_eq!(log.trim(1000 + 3599).expect("trimmed"), 0);
    // Old enough: the first goes (20 after it, over 12); the second would
    // leave 10, under 12.
    assert_eq!(log.trim(20_000).expect("trimmed"), 1);
    assert_eq!(log.first_retained(), 11);
    assert!(matches!(
        log.read_after(Some(5), None, 10),
        Err(EventsError::Expired { first_retained: 11 })
    ));
    let (events, _) = log.read_after(Some(10), None, 3).expect("read");
    assert_eq!(seqs(&events), [11, 12, 13]);
    // The segment appended to never goes.
    let tiny_dir = tempfile::tempdir().expect("temp dir");
    let mut tiny = EventLog::open(
        tiny_dir.path(),
        Kept {
            events: 0,
            age_secs: 0,
        },
        10,
    )
    .expect("opened");
    fill(&mut tiny, 3, 1);
    assert_eq!(tiny.trim(1_000_000).expect("trimmed"), 0);
}

#[test]
fn a_torn_last_line_is_cut_off_and_its_number_is_given_again() {
    let dir = written(3, EVENTS_SEGMENT_EVENTS);
    let path = dir.path().join(segment_name(1));
    let mut file = OpenOptions::new().append(true).open(&path).expect("open");
    file.write_all(b"{\"seq\":4,\"ts\":[1").expect("torn write");
    drop(file);
    let mut log = EventLog::open(dir.path(), KEEP_ALL, 100).expect("repaired");
    assert_eq!(log.last_seq(), 3);
    assert_eq!(log.append("job.status", &Map::new(), Timestamp(1, 0)), 4);
    log.write_pending().expect("written");
    drop(log);
    let log = EventLog::open(dir.path(), KEEP_ALL, 100).expect("reopened");
    assert_eq!(log.last_seq(), 4);
    let (events, _) = log.read_after(Some(0), None, 10).expect("read");
    assert_eq!(seqs(&events), [1, 2, 3, 4]);
}

#[test]
fn damage_and_gaps_are_refused_naming_the_file() {
    // A bad line before good ones.
    let dir = written(3, EVENTS_SEGMENT_EVENTS);
    let path = dir.path().join(segment_name(1));
    let text = fs::read_to_string(&path).expect("read");
    fs::write(&path, text.replacen("\"type\"", "\"tpye\"", 1)).expect("damaged");
    let error = EventLog::open(dir.path(), KEEP_ALL, 100).expect_err("refused");
    assert!(error.to_string().contains("event 1: no type"), "{error}");

    // A number out of order.
    let dir = written(3, EVENTS_SEGMENT_EVENTS);
    let path = dir.path().join(segment_name(1));
    let text = fs::read_to_string(&path).expect("read");
    fs::write(&path, text.replacen("\"seq\":2", "\"seq\":5", 1)).expect("damaged");
    let error = EventLog::open(dir.path(), KEEP_ALL, 100).expect_err("refused");
    assert!(
        error.to_string().contains("event 5 where 2 was due"),
        "{error}"
    );

    // A segment missing between two.
    let dir = written(6, 2);
    fs::remove_file(dir.path().join(segment_name(3))).expect("removed");
    let error = EventLog::open(dir.path(), KEEP_ALL, 100).expect_err("refused");
    let text = error.to_string();
    assert!(
        text.contains("a gap") && text.contains(&segment_name(5)),
        "{text}"
    );

    // A segment whose first event is not the one its name says.
    let dir = written(4, 2);
    fs::rename(
        dir.path().join(segment_name(1)),
        dir.path().join(segment_name(0)),
    )
    .expect("renamed");
    let error = EventLog::open(dir.path(), KEEP_ALL, 100).expect_err("refused");
    assert!(error.to_string().contains("where 0 was due"), "{error}");
}

#[test]
fn a_fresh_sequence_keeps_its_first_event_before_any_file_is_written() {
    // wconfd's events are durable in its journal before the files are
    // written: the first is readable (and not expired) at once.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log = EventLog::open(dir.path(), KEEP_ALL, 100).expect("opened");
    assert_eq!(log.first_retained(), 1);
    log.append("lock.granted", &json!({"n": 1}), Timestamp(1, 0));
    log.mark_all_durable();
    assert_eq!(log.first_retained(), 1);
    let (events, next) = log.read_after(Some(0), None, 10).expect("read");
    assert_eq!((seqs(&events), next), (vec![1], 1));
    log.write_pending().expect("written");
    assert_eq!(log.first_retained(), 1);
    let (events, _) = log.read_after(Some(0), None, 10).expect("read");
    assert_eq!(seqs(&events), [1]);
}

#[test]
fn memory_answers_cost_what_they_return() {
    // The ring is indexed by seq: every position in it answers its own
    // events, however full it is.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log = EventLog::open(dir.path(), KEEP_ALL, 50).expect("opened");
    fill(&mut log, 120, 100);
    for since in 70..=120 {
        let (events, next) = log.read_after(Some(since), None, 3).expect("read");
        let want: Vec<u64> = (since + 1..=120).take(3).collect();
        assert_eq!(seqs(&events), want, "after {since}");
        assert_eq!(next, want.last().copied().unwrap_or(since));
    }
}
