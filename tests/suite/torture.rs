//! A short sweep of the crash harness (`bin/torture.rs`): a few fixed
//! seeds, each a few seconds of kills and restarts of wconfd, luxid, job
//! runners and lock owners under client load, then the harness's final
//! checks. Any violation fails the test with the harness's report (its
//! seed and the command that replays it). Longer runs: `torture --long`.

use std::process::Command;
use std::time::Instant;

use crate::daemon::timing_guard;

/// Seeds of the sweep: fixed, so that CI runs the same schedules.
const SEEDS: [u64; 3] = [1, 2, 3];
/// Seconds of chaos per seed: three seeds stay well under a minute on a
/// 2-vCPU machine, settling included.
const SECONDS_PER_SEED: u64 = 6;

#[test]
fn a_short_sweep_of_the_crash_harness_finds_no_violation() {
    // The heaviest test of the suite: never beside one that times things.
    let _timing = timing_guard();
    for seed in SEEDS {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_torture"))
            .args(["--seed", &seed.to_string()])
            .args(["--duration", &SECONDS_PER_SEED.to_string()])
            .output()
            .expect("run the torture binary");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "seed {seed}: {}\n{stdout}\n{stderr}",
            output.status
        );
        assert!(stdout.contains("no violation"), "{stdout}");
        eprintln!("torture seed {seed}: {:?}\n{stdout}", started.elapsed());
    }
}
