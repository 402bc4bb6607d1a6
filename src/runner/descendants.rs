//! What a program started, found in `/proc`, so that its timeout reaches
//! the processes it started and not only the program (D64). The runner is
//! its descendants' subreaper ([`crate::sys::become_subreaper`]): a process
//! the program started and left (the background half of `sh -c 'a & b'`
//! after the shell died) is re-parented to the runner, and is found among
//! the runner's children started after the program.

use std::collections::BTreeMap;
use std::fs;

/// One process of `/proc`.
struct Process {
    parent: u32,
    /// Clock ticks from boot to its start (`/proc/<pid>/stat` field 22).
    started: u64,
    zombie: bool,
}

/// The process `pid`, if it exists and its `stat` reads.
fn process(pid: u32) -> Option<Process> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(stat: &str) -> Option<Process> {
    // The command name (field 2) may hold spaces and parentheses: the
    // fields that follow start after its last `)`.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Process {
        zombie: *fields.first()? == "Z",
        parent: fields.get(1)?.parse().ok()?,
        started: fields.get(19)?.parse().ok()?,
    })
}

/// Every process of `/proc` now; one that exits while it is read is left
/// out.
fn processes() -> BTreeMap<u32, Process> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, process(pid)?)))
        .collect()
}

/// A running program's descendants, as the runner can find them.
pub struct Descendants {
    program: u32,
    runner: u32,
    /// The program's start: a child of the runner started before it is a
    /// leftover of an earlier opcode, not the program's.
    since: u64,
}

impl Descendants {
    /// Of the program `program`, a child of this process not yet reaped.
    pub fn of(program: u32) -> Descendants {
        Descendants {
            program,
            runner: std::process::id(),
            // Unreadable only if /proc is not mounted: then nothing the
            // runner adopted counts as the program's.
            since: process(program).map_or(u64::MAX, |process| process.started),
        }
    }

    /// The live processes descending from the program, and from the
    /// runner's adopted children started since the program (the program
    /// itself not included).
    pub fn live(&self) -> Vec<u32> {
        let table = processes();
        let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (&pid, process) in &table {
            children.entry(process.parent).or_default().push(pid);
        }
        let adopted = children
            .get(&self.runner)
            .into_iter()
            .flatten()
            .filter(|&&pid| pid != self.program && table[&pid].started >= self.since);
        let mut pending: Vec<u32> = children
            .get(&self.program)
            .into_iter()
            .flatten()
            .chain(adopted)
            .copied()
            .collect();
        let mut live = Vec::new();
        // A snapshot read while pids are reused could, in theory, hold a
        // cycle.
        let mut seen = std::collections::BTreeSet::new();
        while let Some(pid) = pending.pop() {
            if !seen.insert(pid) {
                continue;
            }
            if !table[&pid].zombie {
                live.push(pid);
            }
            pending.extend(children.get(&pid).into_iter().flatten());
        }
        live
    }
}

/// Reaps the runner's exited children, the orphans it adopted, so that
/// none stays a zombie until the runner exits. Only once the program is
/// reaped: the program is std's `Child` to reap.
pub fn reap_adopted() {
    let runner = std::process::id();
    for (pid, process) in processes() {
        if process.parent == runner && process.zombie {
            let _ = crate::sys::reap_child(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn a_programs_descendants_are_found_through_every_generation() {
        let mut shell = Command::new("/bin/sh")
            .args(["-c", "sleep 30 & (sleep 30 & wait) & wait"])
            .spawn()
            .expect("spawn sh");
        let descendants = Descendants::of(shell.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        // Two sleeps, the subshell between them and the second.
        let mut live = descendants.live();
        while live.len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            live = descendants.live();
        }
        assert_eq!(live.len(), 3, "{live:?}");
        assert!(!live.contains(&shell.id()), "the program is not its own");
        for &pid in &live {
            assert_eq!(
                process(pid).map(|process| process.zombie),
                Some(false),
                "{pid}"
            );
        }
        for pid in live {
            let _ = crate::sys::send_signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = shell.kill();
        let _ = shell.wait();
    }

    #[test]
    fn a_stat_line_with_parentheses_in_the_name_parses() {
        let line = "4242 (a) (b)) Z 17 4242 4242 0 -1 4194560 80 0 0 0 0 0 0 0 20 0 1 0 987654 0 0";
        let parsed = parse_stat(line).expect("a stat line");
        assert_eq!(
            (parsed.parent, parsed.started, parsed.zombie),
            (17, 987_654, true)
        );
        assert!(parse_stat("4242 (a) S 17").is_none(), "too short");
        let me = process(std::process::id()).expect("this process");
        assert_eq!(me.parent, nix::unistd::getppid().as_raw() as u32);
        assert!(!me.zombie);
    }
}
