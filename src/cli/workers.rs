//! `warden workers ...`: the worker registry of wconfd (WORKERS.md), for
//! operators of device farms and build pools.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::Subcommand;
use serde_json::Value;

use super::output::{Cell, Output, Style};
use super::{CliError, CliResult, connect};
use crate::client::{Client, Daemon};
use crate::protocol::wconfd::WconfdRequest;
use crate::protocol::workers::{decode_caps, decode_groups, decode_strings};
use crate::text::shortened;
use crate::workers::{Direction, Filter, Order, Page, Sort, SortItem, State};

#[derive(Subcommand, Debug)]
pub enum WorkersCommand {
    /// The workers, filtered, sorted and paged
    List {
        /// Only workers in this state (repeatable)
        #[arg(long = "state", value_name = "STATE")]
        states: Vec<String>,
        /// Only workers in one of these groups (repeatable)
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
        /// Only workers with this capability (repeatable, all must match)
        #[arg(long = "cap", value_name = "KEY=VALUE")]
        caps: Vec<String>,
        /// Sort by uuid, state or groups
        #[arg(long, default_value = "uuid", value_parser = ["uuid", "state", "groups"])]
        sort: String,
        /// Descending order
        #[arg(long)]
        desc: bool,
        /// At most this many (0: the most a page holds)
        #[arg(long, default_value_t = 0)]
        limit: usize,
        /// The page after this uuid
        #[arg(long, value_name = "UUID")]
        after: Option<String>,
    },
    /// One worker, with its history
    Info { uuid: String },
    /// Register a worker (new ones start in MAINTENANCE), or every worker of a file
    Register {
        /// A capability; UUID=... is required (repeatable)
        #[arg(
            long = "cap",
            value_name = "KEY=VALUE",
            required_unless_present = "file"
        )]
        caps: Vec<String>,
        /// A group (repeatable)
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
        /// How jobs reach it (host:port, a URL, a device path)
        #[arg(long)]
        address: Option<String>,
        /// The program run before it is handed out again (after `--prepare --`)
        #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "ARGV")]
        prepare: Option<Vec<String>>,
        /// A registrations file (`-`: standard input): a JSON list of
        /// objects with caps, groups, address and prepare, registered in
        /// order (e.g. jobs/board-farm-workers.json)
        #[arg(long, value_name = "FILE", conflicts_with_all = ["caps", "groups", "address", "prepare"])]
        file: Option<String>,
    },
    /// Let a worker in (`idle`, through its prepare) or take it out (`maintenance`)
    State {
        uuid: String,
        #[arg(value_parser = ["idle", "maintenance"])]
        state: String,
        /// With maintenance: kill the job holding it instead of waiting for it
        #[arg(long)]
        kill: bool,
    },
    /// Mark a worker broken; a job holding it is killed and ends in error
    Fail { uuid: String, reason: String },
    /// Replace a worker's groups
    Groups { uuid: String, groups: Vec<String> },
    /// Remove a worker in MAINTENANCE or FAILED
    Deregister { uuid: String },
}

pub fn run(root: &Path, output: &Output, command: &WorkersCommand) -> CliResult {
    let mut wconfd = connect(root, Daemon::Wconfd)?;
    let request = match command {
        WorkersCommand::List {
            states,
            groups,
            caps,
            sort,
            desc,
            limit,
            after,
        } => {
            let mut filter = Filter {
                groups: groups.iter().cloned().collect(),
                caps: key_values(caps)?,
                states: BTreeSet::new(),
            };
            for state in states {
                filter.states.insert(
                    State::parse(&state.to_ascii_uppercase()).ok_or_else(|| {
                        CliError::usage(format!("unknown worker state '{state}'"))
                    })?,
                );
            }
            let sort = Sort {
                item: SortItem::parse(sort).map_err(|error| CliError::usage(error.to_string()))?,
                order: if *desc {
                    Order::Descending
                } else {
                    Order::Ascending
                },
            };
            let page = Page {
                after: after.clone(),
                direction: Direction::Forward,
                limit: *limit,
            };
            let listing = wconfd.wconfd(&WconfdRequest::ListWorkers { filter, sort, page })?;
            if output.json {
                output.json_value(&listing, false);
            } else {
                for line in listing_lines(output, &listing) {
                    output.line(&line);
                }
                output.note(&format!(
                    "{} of {} workers; {} more",
                    workers_of(&listing).len(),
                    text(&listing["total"]),
                    text(&listing["remaining"])
                ));
            }
            return Ok(());
        }
        WorkersCommand::Info { uuid } => {
            let worker = wconfd.wconfd(&WconfdRequest::GetWorkerInfo { uuid: uuid.clone() })?;
            print_worker(output, &worker);
            return Ok(());
        }
        WorkersCommand::Register {
            file: Some(file), ..
        } => {
            let registrations = registrations(&super::jobs::read_json_file(file)?)?;
            let uuids = register_all(&mut wconfd, &registrations)?;
            if output.json {
                output.json_value(&serde_json::json!({ "registered": uuids }), false);
            } else {
                output.line(&format!("registered {}", uuids.join(", ")));
            }
            return Ok(());
        }
        WorkersCommand::Register {
            caps,
            groups,
            address,
            prepare,
            file: None,
        } => Registration {
            caps: key_values(caps)?,
            groups: (!groups.is_empty()).then(|| groups.iter().cloned().collect()),
            address: address.clone(),
            prepare: prepare.clone(),
        }
        .request(),
        WorkersCommand::State { uuid, state, kill } => state_request(uuid, state, *kill),
        WorkersCommand::Fail { uuid, reason } => WconfdRequest::SetWorkerFail {
            uuid: uuid.clone(),
            reason: reason.clone(),
        },
        WorkersCommand::Groups { uuid, groups } => WconfdRequest::SetWorkerGroups {
            uuid: uuid.clone(),
            groups: groups.iter().cloned().collect(),
        },
        WorkersCommand::Deregister { uuid } => {
            WconfdRequest::DeregisterWorker { uuid: uuid.clone() }
        }
    };
    wconfd.wconfd(&request)?;
    if output.json {
        output.json_value(&serde_json::json!({"done": true}), false);
    } else {
        output.line("done");
    }
    Ok(())
}

/// One worker to register: the arguments of `registerWorker`. A
/// registrations file holds a JSON list of them as objects with these
/// names (and an optional `comment`), as `warden workers info --json`
/// names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub caps: BTreeMap<String, String>,
    pub groups: Option<BTreeSet<String>>,
    pub address: Option<String>,
    pub prepare: Option<Vec<String>>,
}

impl Registration {
    /// The value of its `UUID` capability (wconfd refuses a worker
    /// without one).
    pub fn uuid(&self) -> &str {
        self.caps.get("UUID").map_or("", String::as_str)
    }

    fn request(&self) -> WconfdRequest {
        WconfdRequest::RegisterWorker {
            caps: self.caps.clone(),
            groups: self.groups.clone(),
            address: self.address.clone(),
            prepare: self.prepare.clone(),
        }
    }
}

/// The fields of a registrations file's entry.
const REGISTRATION_FIELDS: [&str; 5] = ["caps", "groups", "address", "prepare", "comment"];

/// A registrations file's workers, in order; the whole file is checked
/// before anything is registered.
pub fn registrations(document: &Value) -> CliResult<Vec<Registration>> {
    let shape_error = || {
        CliError::usage(
            "a registrations file holds a JSON list of workers: objects with caps, groups, address and prepare",
        )
    };
    let entries = document.as_array().ok_or_else(shape_error)?;
    if entries.is_empty() {
        return Err(shape_error());
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let bad =
                |what: String| CliError::usage(format!("worker {} of the file: {what}", index + 1));
            let object = entry.as_object().ok_or_else(shape_error)?;
            if let Some(other) = object
                .keys()
                .find(|key| !REGISTRATION_FIELDS.contains(&key.as_str()))
            {
                return Err(bad(format!(
                    "unknown field '{}' (known: {})",
                    shortened(other),
                    REGISTRATION_FIELDS.join(", ")
                )));
            }
            let caps = decode_caps(
                object
                    .get("caps")
                    .ok_or_else(|| bad("no caps".to_owned()))?,
            )
            .map_err(|what| bad(format!("caps {what}")))?;
            let groups = match object.get("groups") {
                None | Some(Value::Null) => None,
                Some(value) => {
                    Some(decode_groups(value).map_err(|what| bad(format!("groups {what}")))?)
                }
            };
            let address = match object.get("address") {
                None | Some(Value::Null) => None,
                Some(Value::String(address)) => Some(address.clone()),
                Some(_) => return Err(bad("address is not a string".to_owned())),
            };
            let prepare = match object.get("prepare") {
                None | Some(Value::Null) => None,
                Some(value) => Some(
                    decode_strings(value, "arguments")
                        .map_err(|what| bad(format!("prepare {what}")))?,
                ),
            };
            if object
                .get("comment")
                .is_some_and(|comment| !comment.is_string())
            {
                return Err(bad("comment is not a string".to_owned()));
            }
            Ok(Registration {
                caps,
                groups,
                address,
                prepare,
            })
        })
        .collect()
}

/// Registers `registrations` in order; their uuids. A refusal names the
/// worker, and those registered before it.
pub fn register_all(wconfd: &mut Client, registrations: &[Registration]) -> CliResult<Vec<String>> {
    let mut uuids: Vec<String> = Vec::new();
    for (index, registration) in registrations.iter().enumerate() {
        if let Err(error) = wconfd.wconfd(&registration.request()) {
            let error = CliError::from(error);
            return Err(CliError::new(
                error.exit,
                format!(
                    "worker {}{} of the file: {}{}",
                    index + 1,
                    match registration.uuid() {
                        "" => String::new(),
                        uuid => format!(" ({uuid})"),
                    },
                    error.message,
                    if uuids.is_empty() {
                        String::new()
                    } else {
                        format!(" (registered: {})", uuids.join(", "))
                    }
                ),
            ));
        }
        uuids.push(registration.uuid().to_owned());
    }
    Ok(uuids)
}

/// `state UUID idle|maintenance [--kill]`.
fn state_request(uuid: &str, state: &str, kill: bool) -> WconfdRequest {
    WconfdRequest::SetWorkerState {
        uuid: uuid.to_owned(),
        state: state.to_ascii_uppercase(),
        kill,
    }
}

/// Lets a worker in (`idle`) or takes it out (`maintenance`), as `state`
/// does.
pub fn set_state(wconfd: &mut Client, uuid: &str, state: &str, kill: bool) -> CliResult {
    wconfd.wconfd(&state_request(uuid, state, kill))?;
    Ok(())
}

/// The workers that `filter` admits, by uuid, as one listing (the most a
/// page holds).
pub fn list(wconfd: &mut Client, filter: Filter) -> CliResult<Value> {
    Ok(wconfd.wconfd(&WconfdRequest::ListWorkers {
        filter,
        sort: Sort::default(),
        page: Page::default(),
    })?)
}

/// The worker objects of a listing.
pub fn workers_of(listing: &Value) -> &[Value] {
    listing["workers"].as_array().map_or(&[], Vec::as_slice)
}

/// `KEY=VALUE` arguments as a map.
pub fn key_values(pairs: &[String]) -> CliResult<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .ok_or_else(|| CliError::usage(format!("'{pair}' is not KEY=VALUE")))
        })
        .collect()
}

/// The colour of a worker state.
pub fn state_style(state: &str) -> Option<Style> {
    match state {
        "IDLE" => Some(Style::Green),
        "RUNNING" | "PREPARE" => Some(Style::Cyan),
        "FAILED" => Some(Style::Red),
        "BUSY" | "MAINTENANCE" => Some(Style::Yellow),
        _ => None,
    }
}

/// A field of a worker object as text; `-` for null.
pub fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Caps as `K=V,...`, without the UUID.
pub fn caps_text(caps: &Value) -> String {
    caps.as_object()
        .map(|caps| {
            caps.iter()
                .filter(|(key, _)| *key != "UUID")
                .map(|(key, value)| format!("{key}={}", text(value)))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn groups_text(groups: &Value) -> String {
    groups
        .as_array()
        .map(|groups| groups.iter().map(text).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// A listing as the table `list` prints.
pub fn listing_lines(output: &Output, listing: &Value) -> Vec<String> {
    let rows: Vec<Vec<Cell>> = workers_of(listing)
        .iter()
        .map(|worker| {
            let state = text(&worker["state"]);
            vec![
                Cell::from(text(&worker["uuid"])),
                Cell::styled(state.clone(), state_style(&state)),
                Cell::from(text(&worker["holder"])),
                Cell::from(groups_text(&worker["groups"])),
                Cell::from(caps_text(&worker["caps"])),
                Cell::from(text(&worker["address"])),
            ]
        })
        .collect();
    output.table_lines(
        &["UUID", "STATE", "JOB", "GROUPS", "CAPS", "ADDRESS"],
        &rows,
    )
}

fn print_worker(output: &Output, worker: &Value) {
    if output.json {
        output.json_value(worker, false);
        return;
    }
    let state = text(&worker["state"]);
    for (name, value) in [
        ("uuid", text(&worker["uuid"])),
        ("state", output.paint(&state, state_style(&state))),
        ("holder", text(&worker["holder"])),
        ("groups", groups_text(&worker["groups"])),
        ("caps", caps_text(&worker["caps"])),
        ("address", text(&worker["address"])),
        ("prepare", text(&worker["prepare"])),
        ("fail reason", text(&worker["fail_reason"])),
    ] {
        output.line(&format!("{name:<12} {value}"));
    }
    let rows: Vec<Vec<Cell>> = worker["history"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .map(|holding| {
            let status = text(&holding["status"]);
            vec![
                Cell::from(text(&holding["job"])),
                Cell::styled(status.clone(), Style::of_status(&status)),
                Cell::from(format!(
                    "{:.1} s",
                    holding["to"].as_f64().unwrap_or(0.0) - holding["from"].as_f64().unwrap_or(0.0)
                )),
            ]
        })
        .collect();
    if !rows.is_empty() {
        output.line("");
        output.table(&["JOB", "ENDED", "HELD"], &rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_board_farm_of_jobs_is_a_registrations_file() {
        let document: Value =
            serde_json::from_str(include_str!("../../jobs/board-farm-workers.json")).expect("JSON");
        let farm = registrations(&document).expect("registrations");
        let uuids: Vec<&str> = farm.iter().map(Registration::uuid).collect();
        assert_eq!(uuids, ["board-a1", "board-a2", "board-b1"]);
        assert!(farm.iter().all(|worker| worker.prepare.is_some()));
        assert_eq!(farm[1].caps.get("camera").map(String::as_str), Some("yes"));
    }

    #[test]
    fn a_registrations_file_is_checked_whole() {
        let one = registrations(&json!([{"caps": {"UUID": "w"}, "comment": "x"}])).expect("ok");
        assert_eq!(
            one,
            [Registration {
                caps: [("UUID".to_owned(), "w".to_owned())].into(),
                groups: None,
                address: None,
                prepare: None,
            }]
        );
        for (document, message) in [
            (json!({}), "a registrations file holds"),
            (json!([]), "a registrations file holds"),
            (json!([[]]), "a registrations file holds"),
            (json!([{"groups": ["g"]}]), "worker 1 of the file: no caps"),
            (
                json!([{"caps": {"UUID": "w"}}, {"caps": {"UUID": 1}}]),
                "worker 2 of the file: caps has a value of UUID",
            ),
            (
                json!([{"caps": {}, "groups": "g"}]),
                "worker 1 of the file: groups is not a list",
            ),
            (
                json!([{"caps": {}, "address": 5}]),
                "address is not a string",
            ),
            (
                json!([{"caps": {}, "prepare": [1]}]),
                "prepare has arguments that are not strings",
            ),
            (
                json!([{"caps": {}, "comment": 1}]),
                "comment is not a string",
            ),
            (
                json!([{"caps": {}, "state": "IDLE"}]),
                "unknown field 'state'",
            ),
        ] {
            let error = registrations(&document).expect_err("refused");
            assert_eq!(error.exit, super::super::Exit::Usage);
            assert!(
                error.message.contains(message),
                "{document}: {}",
                error.message
            );
        }
    }
}
