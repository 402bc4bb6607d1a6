//! Tests of the hook runner with real processes: `/bin/sh -c` scripts that
//! record what they got in a temporary directory, passed to them as `$0`
//! (their environment holds only what the runner gives).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::events::Event;
use crate::jobs::Timestamp;

/// Longest any test waits for its hooks.
const DEADLINE: Duration = Duration::from_secs(30);

/// A timeout no test's hook comes near unless it means to.
const LONG: Duration = Duration::from_secs(20);

fn event(seq: u64, kind: &str) -> Event {
    Event {
        seq,
        ts: Timestamp(1_700_000_000, 250_000),
        kind: kind.to_owned(),
        fields: json!({"id": seq, "status": "success"})
            .as_object()
            .cloned()
            .expect("an object"),
    }
}

/// `/bin/sh -c script dir args...`: the script sees `dir` as `$0`.
fn sh(script: &str, dir: &Path, args: &[&str]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        dir.display().to_string(),
    ];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    argv
}

fn hooks(pairs: &[(&str, Vec<String>)], timeout: Duration, retry_pause: Duration) -> Hooks {
    let map: BTreeMap<String, Vec<String>> = pairs
        .iter()
        .map(|(prefix, argv)| ((*prefix).to_owned(), argv.clone()))
        .collect();
    Hooks::new(&map, timeout, retry_pause)
}

/// Polls, sleeping until each wakeup, until `done` says so; every outcome
/// so far. Panics past [`DEADLINE`].
fn poll_until(
    hooks: &mut Hooks,
    mut done: impl FnMut(&Hooks, &[HookOutcome]) -> bool,
) -> Vec<HookOutcome> {
    let deadline = Instant::now() + DEADLINE;
    let mut outcomes = Vec::new();
    loop {
        outcomes.extend(hooks.poll(Instant::now()));
        hooks.check_invariants();
        assert!(hooks.running() <= HOOKS_RUNNING_MAX);
        if done(hooks, &outcomes) {
            return outcomes;
        }
        assert!(
            Instant::now() < deadline,
            "hooks not done after {DEADLINE:?}; outcomes so far: {outcomes:#?}"
        );
        // Never more than a reap interval: some conditions are files.
        let now = Instant::now();
        let wakeup = hooks
            .next_wakeup()
            .unwrap_or(now + HOOK_REAP_INTERVAL)
            .min(now + HOOK_REAP_INTERVAL);
        if wakeup > now {
            thread::sleep(wakeup - now);
        }
    }
}

/// Polls until nothing is pending.
fn run_until_idle(hooks: &mut Hooks) -> Vec<HookOutcome> {
    poll_until(hooks, |hooks, _| hooks.pending() == 0)
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Nanosecond timestamps a script wrote with `date +%s%N`, one a line.
fn times(path: impl AsRef<Path>) -> Vec<u128> {
    read(path)
        .lines()
        .map(|line| line.trim().parse().expect("a date +%s%N"))
        .collect()
}

/// Whether the process `pid` is gone (or a zombie nobody reaps: its
/// parent was killed and our PID 1 may not reap orphans).
fn gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn assert_all_gone(pids: &[u32]) {
    let deadline = Instant::now() + DEADLINE;
    for &pid in pids {
        while !gone(pid) {
            assert!(Instant::now() < deadline, "process {pid} still runs");
            thread::sleep(Duration::from_millis(10));
        }
    }
}

fn pids(path: impl AsRef<Path>) -> Vec<u32> {
    read(path)
        .lines()
        .map(|line| line.trim().parse().expect("a pid"))
        .collect()
}

#[test]
fn stdin_environment_and_output_are_delivered() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#"name="$0/$WARDEN_EVENT_SOURCE.$WARDEN_EVENT_SEQ"
        cat > "$name.in" && env > "$name.env" && pwd > "$name.pwd"
        echo out; echo err >&2"#;
    let argv = sh(script, dir.path(), &[]);
    let mut hooks = hooks(
        &[("job.finished", argv.clone()), ("lock.", argv)],
        LONG,
        Duration::ZERO,
    );
    let finished = event(7, "job.finished");
    let granted = event(3, "lock.granted");
    hooks.offer(Source::Luxid, &finished.line());
    hooks.offer(Source::Wconfd, &granted.line());
    assert_eq!(hooks.pending(), 2);
    let outcomes = run_until_idle(&mut hooks);

    assert_eq!(outcomes.len(), 2, "{outcomes:#?}");
    for outcome in &outcomes {
        assert_eq!(outcome.result, HookResult::Succeeded, "{outcome:#?}");
        assert_eq!(outcome.attempt, 1);
        assert_eq!(outcome.stdout, b"out\n");
        assert_eq!(outcome.stderr, b"err\n");
    }
    for (source, event) in [("luxid", &finished), ("wconfd", &granted)] {
        let file = |suffix: &str| dir.path().join(format!("{source}.{}.{suffix}", event.seq));
        assert_eq!(fs::read(file("in")).expect("stdin written"), event.encode());
        assert_eq!(read(file("pwd")), "/\n");
        let environment: BTreeMap<String, String> = read(file("env"))
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        assert_eq!(environment["WARDEN_EVENT_TYPE"], event.kind);
        assert_eq!(environment["WARDEN_EVENT_SEQ"], event.seq.to_string());
        assert_eq!(environment["WARDEN_EVENT_SOURCE"], source);
        for kept in KEPT_ENVIRONMENT {
            assert_eq!(
                environment.get(kept).map(String::as_str),
                std::env::var(kept).ok().as_deref(),
                "{kept}"
            );
        }
        // Only those, and what the shell adds itself; none of cargo's.
        let shells = ["PWD", "SHLVL", "OLDPWD", "_"];
        for name in environment.keys() {
            assert!(
                name.starts_with("WARDEN_EVENT_")
                    || KEPT_ENVIRONMENT.contains(&name.as_str())
                    || shells.contains(&name.as_str()),
                "the hook got {name}: {environment:?}"
            );
        }
    }
    assert_eq!(hooks.done_through(Source::Luxid), 7);
    assert_eq!(hooks.done_through(Source::Wconfd), 3);
    assert_eq!(hooks.next_wakeup(), None);
}

#[test]
fn at_most_four_run_at_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#"date +%s%N > "$0/start.$WARDEN_EVENT_SEQ"
        sleep 0.3
        date +%s%N > "$0/end.$WARDEN_EVENT_SEQ""#;
    let mut hooks = hooks(
        &[("job.", sh(script, dir.path(), &[]))],
        LONG,
        Duration::ZERO,
    );
    let events = 10;
    for seq in 1..=events {
        hooks.offer(Source::Luxid, &event(seq, "job.status").line());
    }
    assert!(hooks.poll(Instant::now()).is_empty());
    assert_eq!(hooks.running(), HOOKS_RUNNING_MAX);
    assert_eq!(hooks.pending(), 10);
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 10);
    assert!(outcomes.iter().all(|o| o.result == HookResult::Succeeded));

    let runs: Vec<(u128, u128)> = (1..=events)
        .map(|seq| {
            let start = times(dir.path().join(format!("start.{seq}")))[0];
            let end = times(dir.path().join(format!("end.{seq}")))[0];
            (start, end)
        })
        .collect();
    for &(start, _) in &runs {
        let at_once = runs
            .iter()
            .filter(|&&(other_start, other_end)| other_start <= start && start <= other_end)
            .count();
        assert!(
            at_once <= HOOKS_RUNNING_MAX,
            "{at_once} ran at once: {runs:?}"
        );
    }
    assert_eq!(hooks.done_through(Source::Luxid), events);
}

#[test]
fn a_timeout_kills_the_hook_and_its_children() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#"echo $$ >> "$0/shells"
        sleep 1000 &
        echo $! >> "$0/children"
        sleep 1000"#;
    let timeout = Duration::from_millis(500);
    let mut hooks = hooks(
        &[("job.", sh(script, dir.path(), &[]))],
        timeout,
        Duration::from_millis(10),
    );
    hooks.offer(Source::Luxid, &event(1, "job.submitted").line());
    let started = Instant::now();
    let outcomes = run_until_idle(&mut hooks);
    assert!(started.elapsed() >= timeout * 4);

    let results: Vec<&HookResult> = outcomes.iter().map(|o| &o.result).collect();
    assert_eq!(results.len(), 4, "{outcomes:#?}");
    for result in &results[..3] {
        assert!(
            matches!(result, HookResult::Failed { failure: HookFailure::TimedOut(t), .. } if *t == timeout),
            "{result:?}"
        );
    }
    assert_eq!(
        results[3],
        &HookResult::GaveUp {
            failure: HookFailure::TimedOut(timeout)
        }
    );
    // Each attempt wrote its pids well before its timeout.
    let mut all = pids(dir.path().join("shells"));
    all.extend(pids(dir.path().join("children")));
    assert!(!all.is_empty());
    assert_all_gone(&all);
    assert_eq!(hooks.done_through(Source::Luxid), 1);
}

#[test]
fn processes_left_behind_by_a_hook_are_killed_when_it_exits() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#"sleep 1000 &
        echo $! > "$0/child"
        exit 0"#;
    let mut hooks = hooks(
        &[("job.", sh(script, dir.path(), &[]))],
        LONG,
        Duration::ZERO,
    );
    hooks.offer(Source::Luxid, &event(1, "job.submitted").line());
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].result, HookResult::Succeeded);
    assert_all_gone(&pids(dir.path().join("child")));
}

#[test]
fn failures_are_retried_with_doubling_pauses_then_given_up() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#"date +%s%N >> "$0/attempts"; echo nope >&2; exit 3"#;
    let pause = Duration::from_millis(100);
    let mut hooks = hooks(&[("job.", sh(script, dir.path(), &[]))], LONG, pause);
    hooks.offer(Source::Luxid, &event(4, "job.finished").line());
    let outcomes = poll_until(&mut hooks, |hooks, outcomes| {
        // The run is unfinished until it is given up.
        let given_up = outcomes
            .iter()
            .any(|o| matches!(o.result, HookResult::GaveUp { .. }));
        let done = hooks.done_through(Source::Luxid);
        assert_eq!(done, if given_up { 4 } else { 3 });
        hooks.pending() == 0
    });

    let attempts: Vec<u32> = outcomes.iter().map(|o| o.attempt).collect();
    assert_eq!(attempts, [1, 2, 3, 4]);
    assert_eq!(HOOK_RETRIES, 3);
    for outcome in &outcomes[..3] {
        assert!(
            matches!(
                outcome.result,
                HookResult::Failed {
                    failure: HookFailure::Exited(3),
                    ..
                }
            ),
            "{outcome:?}"
        );
        assert_eq!(outcome.stderr, b"nope\n");
    }
    assert_eq!(
        outcomes[3].result,
        HookResult::GaveUp {
            failure: HookFailure::Exited(3)
        }
    );
    let starts = times(dir.path().join("attempts"));
    assert_eq!(starts.len(), 4, "exactly four attempts: {starts:?}");
    for (index, pair) in starts.windows(2).enumerate() {
        let gap = Duration::from_nanos(u64::try_from(pair[1] - pair[0]).expect("a gap"));
        let expected = pause * (1 << index);
        assert!(gap >= expected, "pause {index}: {gap:?} < {expected:?}");
    }
}

#[test]
fn a_hook_that_cannot_start_is_retried_then_given_up() {
    let mut hooks = hooks(
        &[("job.", vec!["/nonexistent/warden-hook".to_owned()])],
        LONG,
        Duration::ZERO,
    );
    hooks.offer(Source::Luxid, &event(1, "job.finished").line());
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 4, "{outcomes:#?}");
    assert!(
        outcomes.iter().all(|o| matches!(
            &o.result,
            HookResult::Failed {
                failure: HookFailure::NotStarted(_),
                ..
            } | HookResult::GaveUp {
                failure: HookFailure::NotStarted(_)
            }
        )),
        "{outcomes:#?}"
    );
    assert!(matches!(outcomes[3].result, HookResult::GaveUp { .. }));
    assert_eq!(hooks.done_through(Source::Luxid), 1);
}

#[test]
fn done_through_stays_behind_a_running_hook() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#"while [ ! -e "$0/go.$WARDEN_EVENT_SEQ" ]; do sleep 0.02; done"#;
    let mut hooks = hooks(
        &[("job.", sh(script, dir.path(), &[]))],
        LONG,
        Duration::ZERO,
    );
    assert_eq!(hooks.done_through(Source::Luxid), 0);
    fs::write(dir.path().join("go.3"), "").expect("go.3");
    hooks.offer(Source::Luxid, &event(1, "job.submitted").line());
    hooks.offer(Source::Luxid, &event(2, "queue.drain").line());
    hooks.offer(Source::Luxid, &event(3, "job.status").line());
    // An event no hook wants is done at once, and the other source's
    // position is its own.
    hooks.offer(Source::Wconfd, &event(5, "lock.granted").line());
    assert_eq!(hooks.done_through(Source::Wconfd), 5);
    assert_eq!(hooks.done_through(Source::Luxid), 0);

    let outcomes = poll_until(&mut hooks, |_, outcomes| !outcomes.is_empty());
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].seq, 3);
    assert_eq!(hooks.pending(), 1);
    assert_eq!(hooks.done_through(Source::Luxid), 0);

    hooks.offer(Source::Luxid, &event(4, "queue.drain").line());
    assert_eq!(hooks.done_through(Source::Luxid), 0);
    fs::write(dir.path().join("go.1"), "").expect("go.1");
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].seq, 1);
    assert_eq!(hooks.done_through(Source::Luxid), 4);
    assert_eq!(hooks.done_through(Source::Wconfd), 5);
}

#[test]
fn hooks_match_by_type_prefix() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#": > "$0/$1.$WARDEN_EVENT_SEQ""#;
    let mut hooks = hooks(
        &[
            ("job.", sh(script, dir.path(), &["job"])),
            ("job.finished", sh(script, dir.path(), &["finished"])),
            ("lock.granted", sh(script, dir.path(), &["granted"])),
        ],
        LONG,
        Duration::ZERO,
    );
    let kinds = [
        "job.finished",
        "job.status",
        "jobs.status",
        "job",
        "lock.granted",
        "lock.released",
        "worker.idle",
    ];
    for (seq, kind) in (1..).zip(kinds) {
        hooks.offer(Source::Luxid, &event(seq, kind).line());
    }
    let outcomes = run_until_idle(&mut hooks);
    assert!(outcomes.iter().all(|o| o.result == HookResult::Succeeded));
    let ran: BTreeSet<String> = fs::read_dir(dir.path())
        .expect("the directory")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .into_string()
                .expect("UTF-8")
        })
        .collect();
    let expected: BTreeSet<String> = ["job.1", "finished.1", "job.2", "granted.5"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(ran, expected);
    let by_hook: BTreeSet<(String, u64)> =
        outcomes.iter().map(|o| (o.hook.clone(), o.seq)).collect();
    let expected: BTreeSet<(String, u64)> = [
        ("job.", 1),
        ("job.finished", 1),
        ("job.", 2),
        ("lock.granted", 5),
    ]
    .into_iter()
    .map(|(hook, seq)| (hook.to_owned(), seq))
    .collect();
    assert_eq!(by_hook, expected);
    assert_eq!(hooks.done_through(Source::Luxid), 7);
}

#[test]
fn an_event_matching_two_hooks_runs_both() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fast = r#"cat > "$0/fast.in""#;
    let slow = r#"cat > "$0/slow.in"; while [ ! -e "$0/go" ]; do sleep 0.02; done"#;
    let mut hooks = hooks(
        &[
            ("job.", sh(slow, dir.path(), &[])),
            ("job.finished", sh(fast, dir.path(), &[])),
        ],
        LONG,
        Duration::ZERO,
    );
    let finished = event(1, "job.finished");
    hooks.offer(Source::Luxid, &finished.line());
    assert_eq!(hooks.pending(), 2);
    let outcomes = poll_until(&mut hooks, |_, outcomes| !outcomes.is_empty());
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].hook, "job.finished");
    // Done only once both have run.
    assert_eq!(hooks.done_through(Source::Luxid), 0);
    fs::write(dir.path().join("go"), "").expect("go");
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].hook, "job.");
    assert_eq!(hooks.done_through(Source::Luxid), 1);
    for name in ["fast.in", "slow.in"] {
        assert_eq!(
            fs::read(dir.path().join(name)).expect("stdin"),
            finished.encode()
        );
    }
}

#[test]
fn stop_kills_the_running_hooks_and_forgets_the_rest() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = r#"echo $$ > "$0/pid.$WARDEN_EVENT_SEQ"
        if [ -e "$0/hold" ]; then exec sleep 1000; fi
        : > "$0/ran.$WARDEN_EVENT_SEQ""#;
    let mut hooks = hooks(
        &[("job.", sh(script, dir.path(), &[]))],
        LONG,
        Duration::ZERO,
    );
    fs::write(dir.path().join("hold"), "").expect("hold");
    for seq in 1..=6 {
        hooks.offer(Source::Luxid, &event(seq, "job.status").line());
    }
    let started: Vec<u64> = (1..=6).collect();
    poll_until(&mut hooks, |_, _| {
        (1..=4).all(|seq| dir.path().join(format!("pid.{seq}")).exists())
    });
    let running: Vec<u32> = (1..=4)
        .flat_map(|seq| pids(dir.path().join(format!("pid.{seq}"))))
        .collect();
    hooks.stop();
    assert_eq!(hooks.pending(), 0);
    assert_eq!(hooks.running(), 0);
    assert_eq!(hooks.done_through(Source::Luxid), 0);
    // The killed ones are reaped by later polls.
    poll_until(&mut hooks, |hooks, _| hooks.next_wakeup().is_none());
    assert_all_gone(&running);

    // Read again from the durable position: every event runs.
    fs::remove_file(dir.path().join("hold")).expect("hold");
    for &seq in &started {
        hooks.offer(Source::Luxid, &event(seq, "job.status").line());
    }
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 6);
    assert_eq!(hooks.done_through(Source::Luxid), 6);
    for seq in started {
        assert!(dir.path().join(format!("ran.{seq}")).exists(), "{seq}");
    }
}

#[test]
fn an_event_offered_again_is_ignored() {
    let mut hooks = hooks(
        &[("job.", vec!["/bin/true".to_owned()])],
        LONG,
        Duration::ZERO,
    );
    hooks.offer(Source::Luxid, &event(5, "job.status").line());
    hooks.offer(Source::Luxid, &event(5, "job.status").line());
    hooks.offer(Source::Luxid, &event(3, "job.status").line());
    assert_eq!(hooks.pending(), 1);
    hooks.check_invariants();
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 1);
    assert_eq!(hooks.done_through(Source::Luxid), 5);
}

#[test]
fn past_the_pending_bound_there_is_no_room() {
    let mut hooks = hooks(
        &[("job.", vec!["/bin/true".to_owned()])],
        LONG,
        Duration::ZERO,
    );
    let bound = u64::try_from(HOOK_RUNS_PENDING_MAX).expect("fits");
    for seq in 1..bound {
        hooks.offer(Source::Luxid, &event(seq, "job.status").line());
    }
    assert!(hooks.has_room());
    hooks.offer(Source::Luxid, &event(bound, "job.status").line());
    assert_eq!(hooks.pending(), HOOK_RUNS_PENDING_MAX);
    assert!(!hooks.has_room());
    hooks.check_invariants();
    // Never polled: nothing started. Stopping forgets them.
    hooks.stop();
    assert!(hooks.has_room());
    assert_eq!(hooks.done_through(Source::Luxid), 0);
}

#[test]
fn a_hook_that_does_not_read_stdin_never_blocks_the_caller() {
    // A line several times a pipe's buffer, to a hook that never reads it.
    let mut big = event(1, "job.finished");
    big.fields
        .insert("blob".to_owned(), json!("x".repeat(300_000)));
    let mut hooks = hooks(
        &[("job.", vec!["/bin/sleep".to_owned(), "2".to_owned()])],
        LONG,
        Duration::ZERO,
    );
    hooks.offer(Source::Luxid, &big.line());
    let deadline = Instant::now() + DEADLINE;
    let mut slowest = Duration::ZERO;
    let mut outcomes = Vec::new();
    while hooks.pending() > 0 {
        assert!(Instant::now() < deadline, "the hook never ended");
        let before = Instant::now();
        outcomes.extend(hooks.poll(before));
        slowest = slowest.max(before.elapsed());
        thread::sleep(HOOK_REAP_INTERVAL);
    }
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].result, HookResult::Succeeded);
    // A blocking write would have waited for the hook's two seconds.
    assert!(slowest < Duration::from_secs(1), "a poll took {slowest:?}");
}

#[test]
fn a_large_event_reaches_a_hook_whole() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut big = event(1, "job.finished");
    big.fields
        .insert("blob".to_owned(), json!("y".repeat(300_000)));
    // It reads only after a while: the line waits, partly written.
    let script = r#"sleep 2; cat > "$0/in""#;
    let mut hooks = hooks(
        &[("job.", sh(script, dir.path(), &[]))],
        LONG,
        Duration::ZERO,
    );
    hooks.offer(Source::Luxid, &big.line());
    let before = Instant::now();
    assert!(hooks.poll(Instant::now()).is_empty());
    // A blocking write would have waited for the hook's two seconds.
    assert!(
        before.elapsed() < Duration::from_secs(1),
        "the first poll waited"
    );
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes[0].result, HookResult::Succeeded);
    assert_eq!(
        fs::read(dir.path().join("in")).expect("stdin"),
        big.encode()
    );
}

#[test]
fn output_is_drained_and_its_tail_kept() {
    // Far more than a pipe holds: without draining, the hook would stall
    // until its timeout.
    let script = r#"head -c 300000 /dev/zero | tr '\0' a; printf END
        head -c 100000 /dev/zero | tr '\0' b >&2"#;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut hooks = hooks(
        &[("job.", sh(script, dir.path(), &[]))],
        Duration::from_secs(10),
        Duration::ZERO,
    );
    hooks.offer(Source::Luxid, &event(1, "job.finished").line());
    let outcomes = run_until_idle(&mut hooks);
    assert_eq!(outcomes.len(), 1);
    let outcome = &outcomes[0];
    assert_eq!(outcome.result, HookResult::Succeeded);
    assert_eq!(outcome.stdout.len(), HOOK_OUTPUT_TAIL_BYTES);
    assert!(outcome.stdout.ends_with(b"aaaEND"));
    assert_eq!(outcome.stderr, vec![b'b'; HOOK_OUTPUT_TAIL_BYTES]);
}
