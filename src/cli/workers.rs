//! `warden workers ...`: the worker registry of wconfd (WORKERS.md), for
//! operators of device farms and build pools.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::Subcommand;
use serde_json::Value;

use super::output::{Cell, Output, Style};
use super::{CliError, CliResult, connect};
use crate::client::Daemon;
use crate::protocol::wconfd::WconfdRequest;
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
    /// Register a worker (new ones start in MAINTENANCE)
    Register {
        /// A capability; UUID=... is required (repeatable)
        #[arg(long = "cap", value_name = "KEY=VALUE", required = true)]
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
            print_listing(output, &listing);
            return Ok(());
        }
        WorkersCommand::Info { uuid } => {
            let worker = wconfd.wconfd(&WconfdRequest::GetWorkerInfo { uuid: uuid.clone() })?;
            print_worker(output, &worker);
            return Ok(());
        }
        WorkersCommand::Register {
            caps,
            groups,
            address,
            prepare,
        } => WconfdRequest::RegisterWorker {
            caps: key_values(caps)?,
            groups: (!groups.is_empty()).then(|| groups.iter().cloned().collect()),
            address: address.clone(),
            prepare: prepare.clone(),
        },
        WorkersCommand::State { uuid, state, kill } => WconfdRequest::SetWorkerState {
            uuid: uuid.clone(),
            state: state.to_ascii_uppercase(),
            kill: *kill,
        },
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

fn state_style(state: &str) -> Option<Style> {
    match state {
        "IDLE" => Some(Style::Green),
        "RUNNING" | "PREPARE" => Some(Style::Cyan),
        "FAILED" => Some(Style::Red),
        "BUSY" | "MAINTENANCE" => Some(Style::Yellow),
        _ => None,
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn caps_text(caps: &Value) -> String {
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

fn print_listing(output: &Output, listing: &Value) {
    if output.json {
        output.json_value(listing, false);
        return;
    }
    let rows: Vec<Vec<Cell>> = listing["workers"]
        .as_array()
        .into_iter()
        .flatten()
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
    output.table(
        &["UUID", "STATE", "JOB", "GROUPS", "CAPS", "ADDRESS"],
        &rows,
    );
    output.note(&format!(
        "{} of {} workers; {} more",
        rows.len(),
        text(&listing["total"]),
        text(&listing["remaining"])
    ));
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
