//! Damaged state files other than the lock state (see
//! `damaged_lock_state`): `config.data`, the queue's `serial` and
//! `version`, job files and archived job files. A daemon either refuses
//! to start and names the file (leaving it as it was), or, for a single
//! job file, skips exactly that job with a logged error naming the file;
//! never does it start silently with less (D36).

use std::fs;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::daemon::{OwnerProcess, Root, Wconfd};
use crate::luxid::{Cluster, Luxid};

fn garbage(length: usize) -> Vec<u8> {
    (0..length).map(|index| (index * 131 + 7) as u8).collect()
}

/// The four kinds of damage of one file's acknowledged `bytes`, the last
/// one, `impossible`, given by the caller (valid syntax, impossible
/// content).
fn damages(bytes: &[u8], impossible: &[u8]) -> [(&'static str, Vec<u8>); 4] {
    [
        ("emptied", Vec::new()),
        ("cut in half", bytes[..bytes.len() / 2].to_vec()),
        ("overwritten with garbage", garbage(bytes.len().max(16))),
        ("impossible", impossible.to_vec()),
    ]
}

/// `start` must fail, its log naming `path`, which must be left as it was.
fn assert_refused<T>(
    case: &str,
    path: &PathBuf,
    start: impl FnOnce() -> Result<T, (std::process::ExitStatus, String)>,
) {
    let before = fs::read(path).expect("the damaged file");
    let Err((status, log)) = start() else {
        panic!("{case}: the daemon started");
    };
    assert!(!status.success(), "{case}: exited with {status}");
    assert!(
        log.contains(&path.display().to_string()),
        "{case}: the error does not name {}:\n{log}",
        path.display()
    );
    assert_eq!(
        fs::read(path).expect("the file"),
        before,
        "{case}: the file was changed"
    );
}

#[test]
fn a_damaged_config_stops_wconfd_naming_the_file() {
    let root = Root::new();
    let mut wconfd = Wconfd::restart_on(&root);
    let owner = OwnerProcess::spawn(&root.livelock_dir(), 1);
    let mut client = wconfd.client();
    let mut config = client.ok("lockConfig", json!([owner.owner(), false]));
    config["cluster"] = json!({"cluster_name": "c1"});
    client.ok("writeConfig", json!([owner.owner(), config]));
    let acknowledged = client.ok("readConfig", json!([]));
    wconfd.stop();

    let path = root.path().join("config.data");
    let good = fs::read(&path).expect("config.data");
    let mut impossible: Value = serde_json::from_slice(&good).expect("JSON");
    impossible["nodes"] = json!(["not", "an", "object"]);
    let impossible = serde_json::to_vec(&impossible).expect("JSON");
    for (case, bytes) in damages(&good, &impossible) {
        fs::write(&path, bytes).expect("damage");
        assert_refused(&format!("config.data {case}"), &path, || {
            Wconfd::try_start_on(&root)
        });
    }
    fs::write(&path, good).expect("restore");
    let wconfd = Wconfd::restart_on(&root);
    assert_eq!(wconfd.client().ok("readConfig", json!([])), acknowledged);
}

fn delay() -> Value {
    json!([{"OP_ID": "OP_TEST_DELAY", "duration": 0.01}])
}

/// A cluster with `count` finished jobs; luxid stopped.
fn finished_jobs(count: u64) -> Cluster {
    let mut cluster = Cluster::start();
    for expected in 1..=count {
        let id = cluster.submit(delay());
        assert_eq!(id, expected);
        assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
    }
    cluster.luxid.stop();
    cluster
}

fn queue_path(cluster: &Cluster, name: &str) -> PathBuf {
    cluster.root().path().join("queue").join(name)
}

#[test]
fn a_damaged_serial_or_version_stops_luxid_naming_the_file() {
    let mut cluster = finished_jobs(2);
    let root = cluster.root().clone();
    for (name, impossible) in [("serial", &b"-3\n"[..]), ("version", &b"99\n"[..])] {
        let path = queue_path(&cluster, name);
        let good = fs::read(&path).expect("the file");
        for (case, bytes) in damages(&good, impossible) {
            if case == "cut in half" && !bytes.is_empty() {
                // "2\n" cut is "2": still a valid serial, checked below.
                continue;
            }
            fs::write(&path, bytes).expect("damage");
            assert_refused(&format!("queue/{name} {case}"), &path, || {
                Luxid::try_start_on(&root).map(|_| ())
            });
        }
        fs::write(&path, good).expect("restore");
    }

    // A serial behind the queue (cut short, lost, or never synced) cannot
    // be told from a good one: ids still never go back behind a job file
    // or the archive.
    cluster.luxid = Luxid::start_on(&root);
    assert_eq!(cluster.client().ok("ArchiveJob", json!([2])), json!(true));
    cluster.luxid.stop();
    for serial in [&b"1\n"[..], b"0\n"] {
        fs::write(queue_path(&cluster, "serial"), serial).expect("an old serial");
        cluster.luxid = Luxid::start_on(&root);
        let id = cluster.submit(delay());
        assert!(id > 2, "job id {id} handed out again");
        assert_eq!(cluster.wait_final(id), "success");
        cluster.luxid.stop();
    }
}

#[test]
fn a_damaged_job_file_is_skipped_naming_it_and_its_id_is_never_reused() {
    let mut cluster = finished_jobs(6);
    let root = cluster.root().clone();
    let good: Vec<Vec<u8>> = (1..=6)
        .map(|id| fs::read(queue_path(&cluster, &format!("job-{id}"))).expect("a job file"))
        .collect();
    // Job 4's file holds job 5: a job under another job's name.
    let damaged = damages(&good[0], &good[4]);
    for (index, (_, bytes)) in damaged.iter().enumerate() {
        fs::write(queue_path(&cluster, &format!("job-{}", index + 1)), bytes).expect("damage");
    }
    cluster.luxid = Luxid::start_on(&root);
    let log = cluster.luxid.log();
    for (index, (case, _)) in damaged.iter().enumerate() {
        let path = queue_path(&cluster, &format!("job-{}", index + 1));
        assert!(
            log.lines().any(|line| line.contains("skipped a job file")
                && line.contains(&path.display().to_string())),
            "job file {case} not named in an error:\n{log}"
        );
    }
    let mut client = cluster.client();
    let rows = client.ok("QueryJobs", json!([[1, 2, 3, 4, 5, 6], ["id", "status"]]));
    assert_eq!(
        rows,
        json!([
            [1, null],
            [2, null],
            [3, null],
            [4, null],
            [5, "success"],
            [6, "success"]
        ])
    );
    // The damaged files stay for an operator to look at.
    for (index, (case, bytes)) in damaged.iter().enumerate() {
        let path = queue_path(&cluster, &format!("job-{}", index + 1));
        assert_eq!(&fs::read(&path).expect("still there"), bytes, "{case}");
    }

    // An archived job file damaged: answered as unknown, logged by name.
    assert_eq!(client.ok("ArchiveJob", json!([6])), json!(true));
    let archived = queue_path(&cluster, "archive/0/job-6");
    fs::write(&archived, garbage(40)).expect("damage the archived job");
    let row = client.ok("QueryJobs", json!([[6], ["id", "status", "archived"]]));
    assert_eq!(row, json!([[6, null, null]]));
    assert!(
        cluster
            .luxid
            .log()
            .lines()
            .any(|line| line.contains("archived job file")
                && line.contains(&archived.display().to_string())),
        "the archived job file is not named:\n{}",
        cluster.luxid.log()
    );

    // A new job takes a new id, even with the serial lost.
    cluster.luxid.stop();
    fs::remove_file(queue_path(&cluster, "serial")).expect("lose the serial");
    cluster.luxid = Luxid::start_on(&root);
    let id = cluster.submit(delay());
    assert_eq!(id, 7);
    assert_eq!(cluster.wait_final(id), "success", "{}", cluster.logs());
}
