//! `locks [--tree]` and `status`: what wconfd holds and who waits, and
//! whether the daemons are up.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::jobs::text;
use super::output::{Cell, Output, Style, duration};
use super::{CliError, CliResult, Exit, connect};
use crate::client::{Client, Daemon};
use crate::jobs::Status;
use crate::reporter::{REPORTER_IDENT, REPORTER_LOCK};
use crate::settings::Settings;
use crate::workers::{Filter, State as WorkerState};

/// How long `status --json` waits for the elected reporter's
/// `/status.json`, connecting and reading together; past it the figures
/// are `null` and status goes on.
const REPORTER_ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest `/status.json` answer read (the figures of a large farm
/// are a few hundred KiB).
const REPORTER_ANSWER_BYTES_MAX: usize = 16 << 20;

/// A lock owner as wconfd names it: `[ident, livelock, pid]`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owner(Value);

/// Any total order will do (owners are only collected in sets); the JSON
/// text gives one.
impl Ord for Owner {
    fn cmp(&self, other: &Owner) -> std::cmp::Ordering {
        self.0.to_string().cmp(&other.0.to_string())
    }
}

impl PartialOrd for Owner {
    fn partial_cmp(&self, other: &Owner) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Owner {
    /// `job 7 (pid 1234)` or `my-script (pid 1234)`.
    fn label(&self) -> String {
        let ident = match self.0.get(0) {
            Some(Value::Number(job)) => format!("job {job}"),
            other => text(other),
        };
        format!("{ident} (pid {})", text(self.0.get(2)))
    }

    fn json(&self) -> Value {
        json!({"ident": self.0.get(0), "livelock": self.0.get(1), "pid": self.0.get(2)})
    }
}

/// One lock of the table and its direct holders.
struct Lock {
    name: String,
    holders: Vec<Holder>,
}

struct Holder {
    owner: Owner,
    mode: String,
    /// The fencing token it was granted with (0 for a holding restored
    /// from a state saved before tokens).
    token: u64,
    /// The dead previous holders its grant was told of.
    died: Value,
}

/// One pending request.
struct Waiter {
    owner: Owner,
    priority: i64,
    request: Vec<(String, String)>,
    waiting_seconds: f64,
    blockers: Vec<Owner>,
}

/// The lock table and the waiters, as wconfd lists them now.
struct Table {
    locks: Vec<Lock>,
    waiters: Vec<Waiter>,
}

fn read_table(wconfd: &mut Client) -> CliResult<Table> {
    let malformed = |method: &str, answer: &Value| {
        CliError::failure(format!(
            "wconfd answered {method} with something unexpected: {answer}"
        ))
    };
    let owners = wconfd.list_all_locks_owners_with_tokens()?;
    let locks = owners
        .as_array()
        .ok_or_else(|| malformed("listAllLocksOwners", &owners))?
        .iter()
        .map(|row| {
            let name = row.get(0).and_then(Value::as_str)?.to_owned();
            let holders = row
                .get(1)?
                .as_array()?
                .iter()
                .map(|holder| {
                    let grant = holder.get(2)?;
                    Some(Holder {
                        owner: Owner(holder.get(0)?.clone()),
                        mode: text(holder.get(1)),
                        token: grant.get("token")?.as_u64()?,
                        died: grant.get("died").cloned().unwrap_or_else(|| json!([])),
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Lock { name, holders })
        })
        .collect::<Option<Vec<Lock>>>()
        .ok_or_else(|| malformed("listAllLocksOwners", &owners))?;
    let listed = wconfd.list_waiters()?;
    let waiters = listed
        .as_array()
        .ok_or_else(|| malformed("listWaiters", &listed))?
        .iter()
        .map(|waiter| {
            Some(Waiter {
                owner: Owner(waiter.get("owner")?.clone()),
                priority: waiter.get("priority")?.as_i64()?,
                request: waiter
                    .get("request")?
                    .as_array()?
                    .iter()
                    .map(|entry| Some((text(entry.get(0)), text(entry.get(1)))))
                    .collect::<Option<Vec<_>>>()?,
                waiting_seconds: waiter.get("waiting_seconds")?.as_f64()?,
                blockers: waiter
                    .get("blockers")?
                    .as_array()?
                    .iter()
                    .map(|owner| Owner(owner.clone()))
                    .collect(),
            })
        })
        .collect::<Option<Vec<Waiter>>>()
        .ok_or_else(|| malformed("listWaiters", &listed))?;
    Ok(Table { locks, waiters })
}

/// Who reports: the pid of the owner holding [`REPORTER_LOCK`], and how
/// many reporters wait for it.
fn election(table: &Table) -> (Option<u64>, usize) {
    let is_reporter =
        |owner: &Owner| owner.0.get(0).and_then(Value::as_str) == Some(REPORTER_IDENT);
    let elected = table
        .locks
        .iter()
        .filter(|lock| lock.name == REPORTER_LOCK)
        .flat_map(|lock| &lock.holders)
        .find_map(|holder| holder.owner.0.get(2).and_then(Value::as_u64));
    let standing_by = table
        .waiters
        .iter()
        .filter(|waiter| {
            is_reporter(&waiter.owner)
                && waiter.request.iter().any(|(lock, _)| lock == REPORTER_LOCK)
        })
        .count();
    (elected, standing_by)
}

/// `reporter  pid 1234, elected (2 standing by)` or `none elected`.
fn election_text(elected: Option<u64>, standing_by: usize) -> String {
    let elected = match elected {
        Some(pid) => format!("pid {pid}, elected"),
        None => "none elected".to_owned(),
    };
    if standing_by == 0 {
        elected
    } else {
        format!("{elected} ({standing_by} standing by)")
    }
}

/// The elected reporter's `GET /status.json` on `listen`, if it is the
/// reporter of `pid` (another root's reporter may listen there); why not
/// otherwise.
fn reporter_status(listen: &str, pid: u64) -> Result<Value, String> {
    let address: SocketAddr = listen
        .parse()
        .map_err(|_| format!("[metrics] listen = {listen:?} is not an address"))?;
    let deadline = Instant::now() + REPORTER_ANSWER_TIMEOUT;
    let io = |error: std::io::Error| format!("http://{listen}/status.json: {error}");
    let mut stream = TcpStream::connect_timeout(&address, REPORTER_ANSWER_TIMEOUT).map_err(io)?;
    stream
        .set_write_timeout(Some(REPORTER_ANSWER_TIMEOUT))
        .map_err(io)?;
    stream
        .write_all(
            format!("GET /status.json HTTP/1.1\r\nHost: {listen}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .map_err(io)?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "http://{listen}/status.json did not answer within {} s",
                REPORTER_ANSWER_TIMEOUT.as_secs()
            ));
        }
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let read = match stream.read(&mut chunk) {
            Ok(read) => read,
            // Interrupted, or the read timeout (as the platform names it):
            // the deadline above decides.
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(error) => return Err(io(error)),
        };
        if read == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..read]);
        if answer.len() > REPORTER_ANSWER_BYTES_MAX {
            return Err(format!(
                "http://{listen}/status.json answered more than {REPORTER_ANSWER_BYTES_MAX} bytes"
            ));
        }
    }
    let malformed =
        || format!("http://{listen}/status.json answered something else than its status");
    let split = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or_else(malformed)?;
    let status_line = answer[..split]
        .split(|byte| *byte == b'\r')
        .next()
        .unwrap_or_default();
    let status_line = String::from_utf8_lossy(status_line);
    if status_line.split(' ').nth(1) != Some("200") {
        return Err(format!(
            "http://{listen}/status.json answered {status_line:?}"
        ));
    }
    let document: Value = serde_json::from_slice(&answer[split + 4..]).map_err(|_| malformed())?;
    match document["reporter"]["pid"].as_u64() {
        Some(served) if served == pid => Ok(document),
        Some(served) => Err(format!(
            "http://{listen} is served by pid {served}, not by this root's elected reporter (pid {pid})"
        )),
        None => Err(malformed()),
    }
}

/// `status --json`'s `reporter` and `metrics`: the election, and the
/// elected reporter's positions and figures if it answers.
fn reporter_json(root: &Path, elected: Option<u64>, standing_by: usize) -> (Value, Value) {
    let listen = Settings::load(root).map(|settings| settings.metrics.listen);
    let mut reporter = json!({
        "pid": elected,
        "standing_by": standing_by,
        "listen": listen.as_ref().ok().filter(|listen| !listen.is_empty()),
    });
    let answer = match (&listen, elected) {
        (Err(error), _) => Err(error.to_string()),
        (Ok(listen), _) if listen.is_empty() => Err("[metrics] listen is empty".to_owned()),
        (Ok(_), None) => Err("no reporter is elected".to_owned()),
        (Ok(listen), Some(pid)) => reporter_status(listen, pid),
    };
    let metrics = match answer {
        Ok(mut document) => {
            if let (Some(ours), Some(served)) =
                (reporter.as_object_mut(), document["reporter"].as_object())
            {
                for (key, value) in served {
                    ours.entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
            reporter["metrics_error"] = Value::Null;
            document["metrics"].take()
        }
        Err(why) => {
            reporter["metrics_error"] = Value::from(why);
            Value::Null
        }
    };
    (reporter, metrics)
}

/// `locks [--tree]`.
pub fn locks(root: &Path, output: &Output, tree: bool) -> CliResult {
    let mut wconfd = connect(root, Daemon::Wconfd)?;
    let table = read_table(&mut wconfd)?;
    if tree {
        print_tree(output, &table);
    } else if output.json {
        output.json_value(&table_json(&table), false);
    } else {
        for line in table_lines(output, &table) {
            output.line(&line);
        }
    }
    Ok(())
}

fn table_json(table: &Table) -> Value {
    json!({
        "locks": table.locks.iter().map(|lock| json!({
            "lock": lock.name,
            "owners": lock.holders.iter().map(|holder| json!({
                "owner": holder.owner.json(),
                "mode": holder.mode,
                "token": holder.token,
                "died": holder.died,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "waiters": table.waiters.iter().map(waiter_json).collect::<Vec<_>>(),
    })
}

fn waiter_json(waiter: &Waiter) -> Value {
    json!({
        "owner": waiter.owner.json(),
        "priority": waiter.priority,
        "request": waiter.request.iter().map(|(lock, mode)| json!({"lock": lock, "mode": mode})).collect::<Vec<_>>(),
        "waiting_seconds": waiter.waiting_seconds,
        "blockers": waiter.blockers.iter().map(Owner::json).collect::<Vec<_>>(),
    })
}

/// The lock table and the waiters as two tables.
fn table_lines(output: &Output, table: &Table) -> Vec<String> {
    let mut lines = Vec::new();
    if table.locks.is_empty() {
        lines.push("no locks held".to_owned());
    } else {
        let mut rows: Vec<Vec<Cell>> = Vec::new();
        for lock in &table.locks {
            if lock.holders.is_empty() {
                rows.push(vec![
                    lock.name.clone().into(),
                    "-".into(),
                    Cell::styled("(through its members)", Some(Style::Dim)),
                    "".into(),
                ]);
            }
            for (index, holder) in lock.holders.iter().enumerate() {
                let name = if index == 0 {
                    lock.name.clone()
                } else {
                    String::new()
                };
                let style = (holder.mode == "exclusive").then_some(Style::Yellow);
                rows.push(vec![
                    name.into(),
                    holder.owner.label().into(),
                    Cell::styled(&holder.mode, style),
                    token_text(&lock.name, holder).into(),
                ]);
            }
        }
        lines.extend(output.table_lines(&["LOCK", "OWNER", "MODE", "TOKEN"], &rows));
    }
    if !table.waiters.is_empty() {
        lines.push(String::new());
        let rows: Vec<Vec<Cell>> = table
            .waiters
            .iter()
            .map(|waiter| {
                vec![
                    waiter.owner.label().into(),
                    waiter.priority.to_string().into(),
                    Cell::styled(duration(waiter.waiting_seconds), Some(Style::Cyan)),
                    request_text(waiter).into(),
                    owner_list(&waiter.blockers).into(),
                ]
            })
            .collect();
        lines
            .extend(output.table_lines(&["WAITER", "PRIO", "WAITING", "FOR", "BLOCKED BY"], &rows));
    }
    lines
}

/// A holding's fencing token, and the dead previous holders its grant
/// was told of: `7 (job 3 died holding it)`.
fn token_text(lock: &str, holder: &Holder) -> String {
    let dead: Vec<String> = holder
        .died
        .as_array()
        .into_iter()
        .flatten()
        .map(|death| {
            let owner = owner_list(&[Owner(death["owner"].clone())]);
            match death["lock"].as_str() {
                Some(held) if held != lock => format!("{owner} died holding {held}"),
                _ => format!("{owner} died holding it"),
            }
        })
        .collect();
    if dead.is_empty() {
        holder.token.to_string()
    } else {
        format!("{} ({})", holder.token, dead.join("; "))
    }
}

fn request_text(waiter: &Waiter) -> String {
    waiter
        .request
        .iter()
        .map(|(lock, mode)| format!("{lock} {mode}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn owner_list(owners: &[Owner]) -> String {
    owners
        .iter()
        .map(|owner| match owner.0.get(0) {
            Some(Value::Number(job)) => format!("job {job}"),
            other => text(other),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `locks --tree`: each owner that blocks others and waits for no one, and
/// under it whom it blocks, recursively; then every cycle of waits.
fn print_tree(output: &Output, table: &Table) {
    let lines = tree_lines(output, table);
    if output.json {
        let roots = tree_roots(table);
        let json: Vec<Value> = roots
            .iter()
            .map(|root| tree_json(table, root, &mut BTreeSet::new()))
            .collect();
        let cycles: Vec<Vec<Value>> = cycles(table)
            .iter()
            .map(|cycle| cycle.iter().map(Owner::json).collect())
            .collect();
        output.json_value(&json!({ "tree": json, "cycles": cycles }), false);
    } else {
        for line in lines {
            output.line(&line);
        }
    }
}

/// Owners that block someone and wait for no one, then, for each cycle of
/// waits that none of them leads to, its first owner, so that nothing is
/// hidden.
fn tree_roots(table: &Table) -> Vec<Owner> {
    let blockers: BTreeSet<&Owner> = table
        .waiters
        .iter()
        .flat_map(|waiter| &waiter.blockers)
        .collect();
    let waiting: BTreeSet<&Owner> = table.waiters.iter().map(|waiter| &waiter.owner).collect();
    let mut roots: Vec<Owner> = blockers
        .iter()
        .filter(|owner| !waiting.contains(*owner))
        .map(|owner| (*owner).clone())
        .collect();
    let mut shown: BTreeSet<Owner> = BTreeSet::new();
    for root in &roots {
        blocked_below(table, root, &mut shown);
    }
    for cycle in cycles(table) {
        if !shown.contains(&cycle[0]) {
            blocked_below(table, &cycle[0], &mut shown);
            roots.push(cycle[0].clone());
        }
    }
    roots
}

/// Adds every owner `owner` blocks, directly or through others, to `seen`.
fn blocked_below(table: &Table, owner: &Owner, seen: &mut BTreeSet<Owner>) {
    let mut stack = vec![owner.clone()];
    while let Some(next) = stack.pop() {
        for waiter in blocked_by(table, &next) {
            if seen.insert(waiter.owner.clone()) {
                stack.push(waiter.owner.clone());
            }
        }
    }
}

/// The cycles of waits in the table (a deadlock wconfd let wait, with
/// `deadlock_check = "off"`, or left from before it was turned on): one
/// cycle through each knot of owners waiting for each other, each starting
/// at its smallest owner, in order.
fn cycles(table: &Table) -> Vec<Vec<Owner>> {
    let waits_for: std::collections::BTreeMap<&Owner, &[Owner]> = table
        .waiters
        .iter()
        .map(|waiter| (&waiter.owner, waiter.blockers.as_slice()))
        .collect();
    let mut done: BTreeSet<&Owner> = BTreeSet::new();
    let mut found: BTreeSet<Vec<Owner>> = BTreeSet::new();
    for start in waits_for.keys() {
        if done.contains(start) {
            continue;
        }
        // Depth first, the path on a stack with the blockers left to try.
        let mut path: Vec<(&Owner, std::slice::Iter<Owner>)> =
            vec![(start, waits_for[start].iter())];
        while let Some((owner, next)) = path.last_mut() {
            let owner: &Owner = owner;
            match next.next() {
                None => {
                    done.insert(owner);
                    path.pop();
                }
                Some(blocker) => {
                    if let Some(at) = path.iter().position(|(on, _)| *on == blocker) {
                        let mut cycle: Vec<Owner> =
                            path[at..].iter().map(|(on, _)| (*on).clone()).collect();
                        let smallest = (0..cycle.len())
                            .min_by_key(|index| &cycle[*index])
                            .unwrap_or(0);
                        cycle.rotate_left(smallest);
                        found.insert(cycle);
                    } else if !done.contains(blocker)
                        && let Some(onward) = waits_for.get(blocker)
                    {
                        path.push((blocker, onward.iter()));
                    }
                }
            }
        }
    }
    found.into_iter().collect()
}

fn holdings(table: &Table, owner: &Owner) -> String {
    let held: Vec<String> = table
        .locks
        .iter()
        .flat_map(|lock| {
            lock.holders
                .iter()
                .filter(|holder| holder.owner == *owner)
                .map(|holder| format!("{} {}", lock.name, holder.mode))
        })
        .collect();
    if held.is_empty() {
        "holds nothing".to_owned()
    } else {
        format!("holds {}", held.join(", "))
    }
}

fn blocked_by<'a>(table: &'a Table, owner: &'a Owner) -> impl Iterator<Item = &'a Waiter> + 'a {
    table
        .waiters
        .iter()
        .filter(move |waiter| waiter.blockers.contains(owner))
}

fn tree_lines(output: &Output, table: &Table) -> Vec<String> {
    let roots = tree_roots(table);
    if roots.is_empty() {
        return vec!["nobody waits for a lock".to_owned()];
    }
    let mut lines = Vec::new();
    for root in &roots {
        lines.push(format!("{}  {}", root.label(), holdings(table, root)));
        branch(output, table, root, "", &mut vec![root.clone()], &mut lines);
    }
    let cycles = cycles(table);
    if !cycles.is_empty() {
        lines.push(String::new());
        for cycle in cycles {
            let labels: Vec<String> = cycle.iter().map(Owner::label).collect();
            let text = super::why::cycle_text(&labels);
            lines.push(output.paint(&format!("deadlock: {text}"), Some(Style::Yellow)));
        }
    }
    lines
}

fn branch(
    output: &Output,
    table: &Table,
    owner: &Owner,
    indent: &str,
    path: &mut Vec<Owner>,
    lines: &mut Vec<String>,
) {
    let children: Vec<&Waiter> = blocked_by(table, owner).collect();
    for (index, waiter) in children.iter().enumerate() {
        let last = index + 1 == children.len();
        let (fork, next) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let cycle = path.contains(&waiter.owner);
        lines.push(format!(
            "{indent}{fork}{}  waits {} for {}{}",
            waiter.owner.label(),
            output.paint(&duration(waiter.waiting_seconds), Some(Style::Cyan)),
            request_text(waiter),
            if cycle {
                "  (deadlock: already above)"
            } else {
                ""
            }
        ));
        if !cycle {
            path.push(waiter.owner.clone());
            branch(
                output,
                table,
                &waiter.owner,
                &format!("{indent}{next}"),
                path,
                lines,
            );
            path.pop();
        }
    }
}

fn tree_json(table: &Table, owner: &Owner, path: &mut BTreeSet<Owner>) -> Value {
    path.insert(owner.clone());
    let blocks: Vec<Value> = blocked_by(table, owner)
        .map(|waiter| {
            let mut node = waiter_json(waiter);
            if !path.contains(&waiter.owner) {
                node["blocks"] = tree_json(table, &waiter.owner, path)["blocks"].clone();
            } else {
                node["blocks"] = json!([]);
                node["deadlock"] = json!(true);
            }
            node
        })
        .collect();
    path.remove(owner);
    json!({"owner": owner.json(), "blocks": blocks})
}

/// `status`: exits 0 when both daemons answer, 3 otherwise.
pub fn status(root: &Path, output: &Output) -> CliResult<Exit> {
    let wconfd = connect(root, Daemon::Wconfd).and_then(|mut wconfd| {
        wconfd.echo("status")?;
        let table = read_table(&mut wconfd)?;
        let workers = super::workers::list(&mut wconfd, Filter::default())?;
        Ok((table, workers))
    });
    // Workers by state, every state named (zero included).
    let mut worker_states = serde_json::Map::new();
    for state in WorkerState::ALL {
        worker_states.insert(state.wire().to_owned(), json!(0));
    }
    if let Ok((_, listing)) = &wconfd {
        for worker in super::workers::workers_of(listing) {
            if let Some(count) = worker["state"]
                .as_str()
                .and_then(|state| worker_states.get_mut(state))
            {
                *count = json!(count.as_u64().unwrap_or(0) + 1);
            }
        }
    }
    let luxid = connect(root, Daemon::Luxid).and_then(|mut luxid| {
        let drained = luxid.query_config_values(&["drain_flag"])?;
        let rows = Value::Array(luxid.query_jobs(None, &["status"])?);
        Ok((drained.first() == Some(&Value::Bool(true)), rows))
    });
    let mut jobs = serde_json::Map::new();
    for status in Status::ALL {
        jobs.insert(status.name().to_owned(), json!(0));
    }
    if let Ok((_, rows)) = &luxid {
        for row in rows.as_array().into_iter().flatten() {
            if let Some(count) = row
                .get(0)
                .and_then(Value::as_str)
                .and_then(|status| jobs.get_mut(status))
            {
                *count = json!(count.as_u64().unwrap_or(0) + 1);
            }
        }
    }
    let (held, owners, waiters) = match &wconfd {
        Ok((table, _)) => {
            let owners: BTreeSet<&Owner> = table
                .locks
                .iter()
                .flat_map(|lock| lock.holders.iter().map(|holder| &holder.owner))
                .collect();
            let held = table
                .locks
                .iter()
                .filter(|lock| !lock.holders.is_empty())
                .count();
            (held, owners.len(), table.waiters.len())
        }
        Err(_) => (0, 0, 0),
    };
    let (elected, standing_by) = match &wconfd {
        Ok((table, _)) => election(table),
        Err(_) => (None, 0),
    };
    let socket = |daemon: Daemon| root.join(daemon.socket_path()).display().to_string();
    let down_reason = |error: &CliError| error.message.clone();
    if output.json {
        let (reporter, metrics) = reporter_json(root, elected, standing_by);
        output.json_value(
            &json!({
                "root": root.display().to_string(),
                "daemons": {
                    "wconfd": {
                        "up": wconfd.is_ok(),
                        "socket": socket(Daemon::Wconfd),
                        "error": wconfd.as_ref().err().map(down_reason),
                    },
                    "luxid": {
                        "up": luxid.is_ok(),
                        "socket": socket(Daemon::Luxid),
                        "drained": luxid.as_ref().ok().map(|(drained, _)| *drained),
                        "error": luxid.as_ref().err().map(down_reason),
                    },
                },
                "jobs": jobs,
                "locks": {"held": held, "owners": owners, "waiters": waiters},
                "workers": {
                    "states": worker_states,
                    "list": wconfd.as_ref().ok().map(|(_, listing)| {
                        Value::Array(super::workers::workers_of(listing).to_vec())
                    }),
                },
                "reporter": reporter,
                "metrics": metrics,
            }),
            false,
        );
    } else {
        let up = |ok: bool| {
            if ok {
                Cell::styled("up", Some(Style::Green))
            } else {
                Cell::styled("down", Some(Style::Red))
            }
        };
        let luxid_note = match &luxid {
            Ok((true, _)) => format!("{}  (queue drained)", socket(Daemon::Luxid)),
            _ => socket(Daemon::Luxid),
        };
        let job_counts: Vec<String> = Status::ALL
            .iter()
            .filter_map(|status| {
                let count = jobs.get(status.name())?.as_u64()?;
                (count > 0).then(|| format!("{count} {}", status.name()))
            })
            .collect();
        let mut rows = vec![
            vec!["root".into(), "".into(), root.display().to_string().into()],
            vec![
                "wconfd".into(),
                up(wconfd.is_ok()),
                socket(Daemon::Wconfd).into(),
            ],
            vec!["luxid".into(), up(luxid.is_ok()), luxid_note.into()],
            vec![
                "jobs".into(),
                "".into(),
                if luxid.is_err() {
                    "-".to_owned()
                } else if job_counts.is_empty() {
                    "none".to_owned()
                } else {
                    job_counts.join(", ")
                }
                .into(),
            ],
            vec![
                "locks".into(),
                "".into(),
                if wconfd.is_err() {
                    "-".to_owned()
                } else {
                    format!(
                        "{held} held by {owners} owner{}, {waiters} waiting",
                        if owners == 1 { "" } else { "s" }
                    )
                }
                .into(),
            ],
            vec![
                "reporter".into(),
                "".into(),
                if wconfd.is_err() {
                    "-".to_owned()
                } else {
                    election_text(elected, standing_by)
                }
                .into(),
            ],
        ];
        if let Ok((_, listing)) = &wconfd
            && !super::workers::workers_of(listing).is_empty()
        {
            let counts: Vec<String> = worker_states
                .iter()
                .filter_map(|(state, count)| {
                    let count = count.as_u64()?;
                    (count > 0).then(|| format!("{count} {state}"))
                })
                .collect();
            rows.push(vec!["workers".into(), "".into(), counts.join(", ").into()]);
        }
        for line in output.table_lines(&["", "", ""], &rows).iter().skip(1) {
            output.line(line);
        }
        if let Ok((_, listing)) = &wconfd
            && !super::workers::workers_of(listing).is_empty()
        {
            output.line("");
            for line in super::workers::listing_lines(output, listing) {
                output.line(&line);
            }
        }
    }
    Ok(if wconfd.is_ok() && luxid.is_ok() {
        Exit::Success
    } else {
        Exit::DaemonDown
    })
}

/// The lock table and waiters as `locks` prints them (for the demo).
pub fn lock_table_lines(output: &Output, wconfd: &mut Client) -> CliResult<Vec<String>> {
    Ok(table_lines(output, &read_table(wconfd)?))
}
