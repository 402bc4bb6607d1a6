//! Scheduling end to end (SCHEDULING.md): ad-hoc rate limits held by a
//! real luxid with real runners, and `warden exec --rate-limit`.

use std::process::Command;

use serde_json::{Value, json};

use crate::luxid::Cluster;

/// A delay of `seconds` with one reason entry `text`.
fn delay_with_reason(seconds: f64, text: &str) -> Value {
    json!([{"OP_ID": "OP_TEST_DELAY", "duration": seconds, "on_master": true,
            "reason": [["test:client", text, 1_700_000_000_000_000_000u64]]}])
}

fn seconds(stamp: &Value) -> f64 {
    stamp[0].as_f64().expect("secs") + stamp[1].as_f64().expect("usecs") / 1e6
}

/// The most of `ids` that ran at the same time, from their timestamps.
fn most_at_once(cluster: &Cluster, ids: &[u64]) -> usize {
    let mut edges = Vec::new();
    for &id in ids {
        let row = cluster.query(id, &["start_ts", "end_ts"]);
        edges.push((seconds(&row[0]), 1i32));
        edges.push((seconds(&row[1]), -1i32));
    }
    // An end and a start at the same instant: the end first.
    edges.sort_by(|a, b| a.partial_cmp(b).expect("times are numbers"));
    let (mut running, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        running += step;
        most = most.max(running);
    }
    most as usize
}

#[test]
fn a_rate_limit_reason_holds_its_bucket_to_n_and_other_jobs_run_beside_it() {
    let cluster = Cluster::start();
    let burst: Vec<u64> = (0..6)
        .map(|_| cluster.submit(delay_with_reason(0.3, "rate-limit:2:burst")))
        .collect();
    // Another n is another bucket; a text that only looks like a rate
    // limit is a plain reason.
    let other: Vec<u64> = (0..2)
        .map(|_| cluster.submit(delay_with_reason(0.3, "rate-limit:3:burst")))
        .collect();
    let plain: Vec<u64> = (0..3)
        .map(|_| cluster.submit(delay_with_reason(0.3, "rate-limit:x:burst")))
        .collect();
    for &id in burst.iter().chain(&other).chain(&plain) {
        assert_eq!(cluster.wait_final(id), "success", "job {id}");
    }
    assert_eq!(
        most_at_once(&cluster, &burst),
        2,
        "the bucket's limit, reached"
    );
    assert_eq!(
        most_at_once(&cluster, &other),
        2,
        "its own bucket, not held by the first"
    );
    assert_eq!(
        most_at_once(&cluster, &plain),
        3,
        "a plain reason limits nothing"
    );
}

#[test]
fn warden_exec_rate_limit_adds_the_reason_and_refuses_a_bad_one() {
    let cluster = Cluster::start();
    let warden = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_warden"))
            .arg("--root")
            .arg(cluster.root().path())
            .args(args)
            .output()
            .expect("run warden")
    };
    let ids: Vec<u64> = (0..3)
        .map(|_| {
            let output = warden(&["exec", "--rate-limit", "1:solo", "--", "/bin/sleep", "0.2"]);
            assert!(output.status.success(), "{output:?}");
            let text = String::from_utf8_lossy(&output.stdout);
            text.split_whitespace()
                .find_map(|word| word.parse().ok())
                .unwrap_or_else(|| panic!("a job id in {text:?}"))
        })
        .collect();
    for &id in &ids {
        assert_eq!(cluster.wait_final(id), "success", "job {id}");
    }
    assert_eq!(most_at_once(&cluster, &ids), 1);
    let reason = &cluster.query(ids[0], &["ops"])[0][0]["reason"][0];
    assert_eq!(reason[1], "rate-limit:1:solo", "{reason}");
    for bad in ["0:x", "x:y", "3", "-1:x"] {
        let output = warden(&["exec", "--rate-limit", bad, "--", "/bin/true"]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "--rate-limit {bad}: {output:?}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--rate-limit"), "{stderr}");
    }
}
