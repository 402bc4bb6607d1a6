//! `warden filter ...`: luxid's job filter rules (design/SCHEDULING.md),
//! as Ganeti's `gnt-filter` drives them: `ReplaceFilter`, `DeleteFilter`
//! and `QueryFilters` (design/PROTOCOL.md).
//!
//! The command checks only the form of what it is given (an action it
//! knows, predicates that are `KIND:JSON`, JSON that parses) and sends the
//! predicates as written: luxid judges the rule, and its refusal names
//! the bad part.

use std::path::Path;

use clap::Subcommand;
use serde_json::{Map, Value, json};

use super::output::{Cell, Output, Style, utc_time};
use super::{CliError, CliResult, connect};
use crate::client::{Client, Daemon};
use crate::protocol::luxi::ReplaceFilterCall;
use crate::scheduling::decode_action;
use crate::scheduling::filters::Action;
use crate::text::shortened;

#[derive(Subcommand, Debug)]
pub enum FilterCommand {
    /// Add a rule; prints its uuid
    Add(RuleArgs),
    /// The rules in the order they apply: (priority, watermark, uuid) ascending; the first whose predicates all hold and whose action is not CONTINUE applies to a job
    List,
    /// Every field of these rules, their reason trails included
    Info {
        /// The rules' uuids
        #[arg(required = true, value_name = "UUID")]
        uuids: Vec<String>,
    },
    /// Replace a rule, keeping its uuid; an option not given keeps the rule's value (a uuid of no rule is added, as by `add`)
    Replace {
        /// The rule's uuid
        uuid: String,
        #[command(flatten)]
        rule: RuleArgs,
    },
    /// Delete a rule; the jobs it held are scheduled again at once
    Delete {
        /// The rule's uuid
        uuid: String,
    },
}

/// The parts of a rule `add` and `replace` take.
#[derive(clap::Args, Debug)]
pub struct RuleArgs {
    /// The rule's priority, 0 or more; lower applies first [add: 0]
    #[arg(long, value_name = "N")]
    priority: Option<u64>,
    /// A predicate: KIND (jobid, opcode or reason) and a filter of the
    /// query language as JSON, e.g. `opcode:'["=", "OP_ID", "OP_EXEC"]'`;
    /// repeatable, all must hold [add: none, every job]
    #[arg(
        long = "predicate",
        value_name = "KIND:FILTER_JSON",
        conflicts_with = "predicates"
    )]
    predicate: Vec<String>,
    /// Every predicate at once, as gnt-filter takes them: a JSON list of
    /// [kind, filter]
    #[arg(long, value_name = "JSON")]
    predicates: Option<String>,
    /// ACCEPT, PAUSE, REJECT, CONTINUE, or RATE_LIMIT:N (also `RATE_LIMIT N`)
    /// with N a positive integer [add: CONTINUE]
    #[arg(long, value_name = "ACTION")]
    action: Option<String>,
    /// Why: the reason trail's entry
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// A rule's fields, as `QueryFilters` names them.
const RULE_FIELDS: [&str; 6] = [
    "uuid",
    "watermark",
    "priority",
    "predicates",
    "action",
    "reason_trail",
];

/// The parts of `RuleArgs` that were given, their form checked.
struct RuleOptions {
    priority: Option<u64>,
    predicates: Option<Value>,
    action: Option<Action>,
    reason: Vec<Value>,
}

pub fn run(root: &Path, output: &Output, command: &FilterCommand) -> CliResult {
    match command {
        FilterCommand::Add(args) => {
            let options = rule_options(args)?;
            let mut luxid = connect(root, Daemon::Luxid)?;
            let uuid = luxid.replace_filter(&ReplaceFilterCall {
                uuid: None,
                priority: options.priority.unwrap_or(0),
                predicates: options.predicates.unwrap_or_else(|| json!([])),
                action: options.action.unwrap_or(Action::Continue),
                reason: options.reason,
            })?;
            print_uuid(output, &uuid);
        }
        FilterCommand::Replace { uuid, rule } => {
            let options = rule_options(rule)?;
            let mut luxid = connect(root, Daemon::Luxid)?;
            let call = replacement(&mut luxid, uuid, options)?;
            let uuid = luxid.replace_filter(&call)?;
            print_uuid(output, &uuid);
        }
        FilterCommand::List => {
            let mut luxid = connect(root, Daemon::Luxid)?;
            let rules = query_rules(&mut luxid, None)?;
            print_list(output, &rules);
        }
        FilterCommand::Info { uuids } => {
            let mut luxid = connect(root, Daemon::Luxid)?;
            let rules = query_rules(&mut luxid, Some(uuids))?;
            let missing: Vec<String> = uuids
                .iter()
                .filter(|uuid| !rules.iter().any(|rule| rule_uuid(rule) == uuid.as_str()))
                .map(|uuid| shortened(uuid))
                .collect();
            if !missing.is_empty() {
                return Err(CliError::refused(format!(
                    "no filter rule with UUID {}",
                    missing.join(", ")
                )));
            }
            // In the order asked for.
            let asked: Vec<&Map<String, Value>> = uuids
                .iter()
                .filter_map(|uuid| rules.iter().find(|rule| rule_uuid(rule) == uuid.as_str()))
                .collect();
            print_info(output, &asked);
        }
        FilterCommand::Delete { uuid } => {
            let mut luxid = connect(root, Daemon::Luxid)?;
            luxid.delete_filter(uuid)?;
            if output.json {
                output.json_value(&json!({ "deleted": uuid }), false);
            }
        }
    }
    Ok(())
}

fn print_uuid(output: &Output, uuid: &str) {
    if output.json {
        output.json_value(&json!({ "uuid": uuid }), false);
    } else {
        output.line(uuid);
    }
}

/// Checks the form of a rule's options, before anything is sent.
fn rule_options(args: &RuleArgs) -> CliResult<RuleOptions> {
    let predicates =
        match &args.predicates {
            Some(text) => Some(serde_json::from_str::<Value>(text).map_err(|error| {
                CliError::usage(format!("--predicates: not valid JSON: {error}"))
            })?),
            None if args.predicate.is_empty() => None,
            None => Some(Value::Array(
                args.predicate
                    .iter()
                    .map(|spec| parse_predicate(spec))
                    .collect::<CliResult<Vec<Value>>>()?,
            )),
        };
    Ok(RuleOptions {
        priority: args.priority,
        predicates,
        action: args.action.as_deref().map(parse_action).transpose()?,
        reason: args
            .reason
            .as_deref()
            .map(|text| vec![super::jobs::reason_entry("filter", text)])
            .unwrap_or_default(),
    })
}

/// `KIND:FILTER_JSON` → `[KIND, FILTER]`. The kind is luxid's to judge;
/// here it need only be a word.
fn parse_predicate(spec: &str) -> CliResult<Value> {
    let bad = |what: String| CliError::usage(format!("--predicate {}: {what}", shortened(spec)));
    let (kind, filter) = spec
        .split_once(':')
        .filter(|(kind, _)| {
            !kind.is_empty()
                && kind
                    .chars()
                    .all(|char| char.is_ascii_alphanumeric() || char == '_')
        })
        .ok_or_else(|| {
            bad(r#"expected KIND:FILTER_JSON, e.g. opcode:["=", "OP_ID", "OP_EXEC"]"#.to_owned())
        })?;
    let filter: Value = serde_json::from_str(filter)
        .map_err(|error| bad(format!("the filter is not valid JSON: {error}")))?;
    Ok(json!([kind, filter]))
}

/// `ACCEPT`, `PAUSE`, `REJECT`, `CONTINUE`, `RATE_LIMIT:N`, `RATE_LIMIT N`
/// (any case).
fn parse_action(text: &str) -> CliResult<Action> {
    let upper = text.trim().to_ascii_uppercase();
    let action = match upper.as_str() {
        "ACCEPT" => Some(Action::Accept),
        "PAUSE" => Some(Action::Pause),
        "REJECT" => Some(Action::Reject),
        "CONTINUE" => Some(Action::Continue),
        other => other
            .strip_prefix("RATE_LIMIT")
            .and_then(|rest| rest.strip_prefix(':').or_else(|| rest.strip_prefix(' ')))
            .and_then(|limit| limit.trim().parse::<u64>().ok())
            .filter(|limit| *limit > 0)
            .map(Action::RateLimit),
    };
    action.ok_or_else(|| {
        CliError::usage(format!(
            "--action {}: expected ACCEPT, PAUSE, REJECT, CONTINUE or RATE_LIMIT:N with N a positive integer",
            shortened(text)
        ))
    })
}

/// The `ReplaceFilter` of `replace UUID`: the options given, the rule's
/// values for the others (`add`'s defaults if there is no such rule).
fn replacement(
    luxid: &mut Client,
    uuid: &str,
    options: RuleOptions,
) -> CliResult<ReplaceFilterCall> {
    let asked = [uuid.to_owned()];
    let current = query_rules(luxid, Some(&asked))?
        .into_iter()
        .find(|rule| rule_uuid(rule) == uuid);
    let current_action = match current.as_ref().and_then(|rule| rule.get("action")) {
        Some(action) => Some(decode_action(action).map_err(|what| {
            CliError::failure(format!(
                "luxid answered QueryFilters with an action it cannot have: {what}"
            ))
        })?),
        None => None,
    };
    let field = |name: &str| current.as_ref().and_then(|rule| rule.get(name)).cloned();
    Ok(ReplaceFilterCall {
        uuid: Some(uuid.to_owned()),
        priority: options
            .priority
            .or_else(|| field("priority").and_then(|priority| priority.as_u64()))
            .unwrap_or(0),
        predicates: options
            .predicates
            .or_else(|| field("predicates"))
            .unwrap_or_else(|| json!([])),
        action: options
            .action
            .or(current_action)
            .unwrap_or(Action::Continue),
        reason: options.reason,
    })
}

/// The rules of `uuids` (`None`: every rule) as objects of every field,
/// in the order they apply.
fn query_rules(luxid: &mut Client, uuids: Option<&[String]>) -> CliResult<Vec<Map<String, Value>>> {
    let rows = luxid.query_filters(uuids, &RULE_FIELDS)?;
    let mut rules: Vec<Map<String, Value>> = rows
        .iter()
        .map(|row| {
            RULE_FIELDS
                .iter()
                .zip(row.as_array().into_iter().flatten())
                .map(|(field, value)| ((*field).to_owned(), value.clone()))
                .collect()
        })
        .collect();
    rules.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
    Ok(rules)
}

/// `(priority, watermark, uuid)`: the order rules apply in.
fn order_key(rule: &Map<String, Value>) -> (u64, u64, &str) {
    let number = |name: &str| rule.get(name).and_then(Value::as_u64).unwrap_or(0);
    (number("priority"), number("watermark"), rule_uuid(rule))
}

fn rule_uuid(rule: &Map<String, Value>) -> &str {
    rule.get("uuid").and_then(Value::as_str).unwrap_or("")
}

/// An action for people: `PAUSE`, `RATE_LIMIT:4` (as `--action` takes it).
fn action_text(action: Option<&Value>) -> String {
    match action {
        Some(Value::String(name)) => name.clone(),
        Some(Value::Array(parts)) => match parts.as_slice() {
            [Value::String(name), limit] => format!("{name}:{limit}"),
            _ => compact(&Value::Array(parts.clone())),
        },
        Some(other) => compact(other),
        None => "-".to_owned(),
    }
}

fn action_style(action: &str) -> Option<Style> {
    match action {
        "ACCEPT" => Some(Style::Green),
        "PAUSE" => Some(Style::Yellow),
        "REJECT" => Some(Style::Red),
        "CONTINUE" => Some(Style::Dim),
        _ => Some(Style::Cyan),
    }
}

fn compact(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value always serialises")
}

fn field_text(rule: &Map<String, Value>, name: &str) -> String {
    match rule.get(name) {
        Some(Value::String(text)) => text.clone(),
        Some(value) => compact(value),
        None => "-".to_owned(),
    }
}

fn print_list(output: &Output, rules: &[Map<String, Value>]) {
    if output.json {
        let rules: Vec<Value> = rules.iter().cloned().map(Value::Object).collect();
        output.json_value(&Value::Array(rules), false);
        return;
    }
    if rules.is_empty() {
        output.line("no filter rules");
        return;
    }
    let rows: Vec<Vec<Cell>> = rules
        .iter()
        .map(|rule| {
            let action = action_text(rule.get("action"));
            let style = action_style(&action);
            vec![
                Cell::from(rule_uuid(rule)),
                Cell::from(field_text(rule, "priority")),
                Cell::styled(action, style),
                Cell::from(field_text(rule, "watermark")),
                Cell::from(shortened(&field_text(rule, "predicates"))),
            ]
        })
        .collect();
    output.table(
        &["UUID", "PRIORITY", "ACTION", "WATERMARK", "PREDICATES"],
        &rows,
    );
}

fn print_info(output: &Output, rules: &[&Map<String, Value>]) {
    if output.json {
        let rules: Vec<Value> = rules
            .iter()
            .map(|rule| Value::Object((*rule).clone()))
            .collect();
        output.json_value(&Value::Array(rules), false);
        return;
    }
    for (index, rule) in rules.iter().enumerate() {
        if index > 0 {
            output.line("");
        }
        let action = action_text(rule.get("action"));
        let label = |name: &str| output.paint(&format!("{name:<12}"), Some(Style::Bold));
        output.line(&format!("{}  {}", label("uuid"), rule_uuid(rule)));
        output.line(&format!(
            "{}  {}",
            label("priority"),
            field_text(rule, "priority")
        ));
        output.line(&format!(
            "{}  {}",
            label("watermark"),
            field_text(rule, "watermark")
        ));
        output.line(&format!(
            "{}  {}",
            label("action"),
            output.paint(&action, action_style(&action))
        ));
        output.line(&format!(
            "{}  {}",
            label("predicates"),
            field_text(rule, "predicates")
        ));
        let trail = rule
            .get("reason_trail")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        if trail.is_empty() {
            output.line(&format!("{}  -", label("reason_trail")));
        }
        for (index, entry) in trail.iter().enumerate() {
            let name = if index == 0 { "reason_trail" } else { "" };
            output.line(&format!("{}  {}", label(name), reason_text(entry)));
        }
    }
}

/// A reason entry (`[source, text, timestamp_ns]`) for people:
/// `warden:client:filter  "maintenance"  2026-11-30 10:03:12.345Z`.
fn reason_text(entry: &Value) -> String {
    match entry.as_array().map(Vec::as_slice) {
        Some([Value::String(source), text, at]) => {
            let at = at
                .as_f64()
                .map_or_else(|| compact(at), |ns| utc_time(ns / 1e9));
            format!("{source}  {}  {at}", compact(text))
        }
        _ => compact(entry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Exit;

    #[test]
    fn actions_take_gnt_filters_names_and_a_rate_limit() {
        assert_eq!(parse_action("PAUSE").unwrap(), Action::Pause);
        assert_eq!(parse_action("accept").unwrap(), Action::Accept);
        assert_eq!(parse_action("REJECT").unwrap(), Action::Reject);
        assert_eq!(parse_action("CONTINUE").unwrap(), Action::Continue);
        assert_eq!(parse_action("RATE_LIMIT:3").unwrap(), Action::RateLimit(3));
        assert_eq!(parse_action("RATE_LIMIT 4").unwrap(), Action::RateLimit(4));
        for bad in [
            "",
            "DROP",
            "RATE_LIMIT",
            "RATE_LIMIT:0",
            "RATE_LIMIT:-1",
            "RATE_LIMIT:x",
            "RATE_LIMITS:3",
        ] {
            let error = parse_action(bad).unwrap_err();
            assert_eq!(error.exit, Exit::Usage, "{bad}");
            assert!(error.message.starts_with("--action"), "{}", error.message);
        }
    }

    #[test]
    fn predicates_are_a_kind_and_a_json_filter() {
        assert_eq!(
            parse_predicate(r#"opcode:["=", "OP_ID", "OP_EXEC"]"#).unwrap(),
            json!(["opcode", ["=", "OP_ID", "OP_EXEC"]])
        );
        // A kind luxid does not know is luxid's to refuse.
        assert_eq!(
            parse_predicate("nodeid:null").unwrap(),
            json!(["nodeid", null])
        );
        for bad in [
            "opcode",
            r#":["=", "id", 1]"#,
            r#"["opcode", null]"#,
            "opcode:[",
            "jobid:",
        ] {
            let error = parse_predicate(bad).unwrap_err();
            assert_eq!(error.exit, Exit::Usage, "{bad}");
            assert!(
                error.message.starts_with("--predicate"),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn rules_are_listed_in_the_order_they_apply() {
        let rule = |uuid: &str, priority: u64, watermark: u64| {
            json!({"uuid": uuid, "priority": priority, "watermark": watermark})
                .as_object()
                .cloned()
                .expect("an object")
        };
        let mut rules = [
            rule("c", 1, 0),
            rule("b", 0, 5),
            rule("a", 0, 5),
            rule("d", 0, 2),
        ];
        rules.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        let uuids: Vec<&str> = rules.iter().map(rule_uuid).collect();
        assert_eq!(uuids, ["d", "a", "b", "c"]);
        assert_eq!(action_text(Some(&json!(["RATE_LIMIT", 4]))), "RATE_LIMIT:4");
        assert_eq!(action_text(Some(&json!("PAUSE"))), "PAUSE");
    }
}
