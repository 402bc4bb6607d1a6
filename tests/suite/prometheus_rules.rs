//! The alert rules shipped with warden (`src/reporter/alerts.yml`) checked
//! by Prometheus's own `promtool`: `promtool check rules` (the file is a
//! valid Prometheus 2.x rule file, every expression parses) and `promtool
//! test rules src/reporter/alerts_test.yml` (the alerts fire, and only
//! when they should, on synthetic series).
//!
//! Where promtool is: the directory `WARDEN_PROMETHEUS_BIN` names (CI sets
//! it from `tests/prometheus/setup.sh`'s output), else PATH. If neither has
//! it, the tests fail and say to run setup.sh.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The rule file and its unit tests.
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/reporter/alerts.yml");
const RULES_TEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/reporter/alerts_test.yml");

/// Longest a promtool run may take (it takes well under a second).
const PROMTOOL_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn alert_rules_pass_promtool_check() {
    let output = promtool(&["check", "rules", RULES]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("SUCCESS"),
        "promtool check rules said no SUCCESS:\n{text}"
    );
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let output = promtool(&["test", "rules", RULES_TEST]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("SUCCESS"),
        "promtool test rules said no SUCCESS:\n{text}"
    );
}

/// Runs promtool with `args`; fails the test with its output unless it
/// exits 0 within [`PROMTOOL_TIMEOUT`].
fn promtool(args: &[&str]) -> Output {
    let path = promtool_path();
    let mut child = Command::new(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {}: {error}", path.display()));
    // Its output is a few lines, far below a pipe's buffer: it never blocks
    // on a full pipe while we poll for its end.
    let deadline = Instant::now() + PROMTOOL_TIMEOUT;
    while child.try_wait().expect("wait for promtool").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("collect promtool's output");
            panic!(
                "{} {args:?} ran longer than {PROMTOOL_TIMEOUT:?}:\n{}{}",
                path.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("collect promtool's output");
    assert!(
        output.status.success(),
        "{} {args:?} failed ({}):\n{}{}",
        path.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// promtool's path; fails the test with what to do if there is none.
fn promtool_path() -> PathBuf {
    let is_program = |path: &Path| path.is_file();
    if let Some(dir) = std::env::var_os("WARDEN_PROMETHEUS_BIN") {
        let path = Path::new(&dir).join("promtool");
        assert!(
            is_program(&path),
            "WARDEN_PROMETHEUS_BIN={} holds no promtool: run `bash tests/prometheus/setup.sh` \
             and set it to the directory it prints",
            Path::new(&dir).display()
        );
        return path;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("promtool"))
            .find(|path| is_program(path))
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "promtool was not found: WARDEN_PROMETHEUS_BIN is unset and PATH has no promtool. \
             Run `bash tests/prometheus/setup.sh` (as root: it installs Debian's prometheus \
             package, without starting its service) and set WARDEN_PROMETHEUS_BIN to the \
             directory it prints"
        )
    })
}
