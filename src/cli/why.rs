//! `why ID`: luxid's `WhyJob` answer (SCHEDULING.md "Why") as a tree of
//! reasons, through the jobs depended on and the holders of the workers
//! asked for, down to the owner at the root of each lock chain; `--json`
//! prints the answer as luxid gave it.

use std::path::Path;

use serde_json::Value;

use super::output::{Output, Style};
use super::{CliResult, connect};
use crate::client::Daemon;
use crate::protocol::luxi::LuxiRequest;

/// `why ID`.
pub fn why(root: &Path, output: &Output, id: u64) -> CliResult {
    let mut luxid = connect(root, Daemon::Luxid)?;
    let answer = luxid.luxi(&LuxiRequest::WhyJob { id })?;
    if output.json {
        output.json_value(&answer, false);
        return Ok(());
    }
    for line in why_lines(output, &answer, "") {
        output.line(&line);
    }
    Ok(())
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn jobs(value: &Value) -> String {
    let ids: Vec<String> = value
        .as_array()
        .into_iter()
        .flatten()
        .map(|id| format!("job {id}"))
        .collect();
    if ids.is_empty() {
        "none".to_owned()
    } else {
        ids.join(", ")
    }
}

/// An owner of a lock chain: `job N`, or its name.
fn owner_label(node: &Value) -> String {
    match node.get("job") {
        Some(job) => format!("job {job}"),
        None => node
            .get("owner")
            .and_then(|owner| owner.get(0))
            .map_or_else(|| "?".to_owned(), text),
    }
}

fn request_text(request: &Value) -> String {
    request
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| format!("{} {}", text(&entry[0]), text(&entry[1])))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lines of one job's answer, each under `indent`.
fn why_lines(output: &Output, answer: &Value, indent: &str) -> Vec<String> {
    let id = text(&answer["id"]);
    let status = text(&answer["status"]);
    let reasons = answer["reasons"].as_array().cloned().unwrap_or_default();
    let mut lines = Vec::new();
    let head = if reasons.is_empty() {
        match status.as_str() {
            "queued" => format!("job {id} (queued): nothing holds it; it starts in the next pass"),
            _ => format!("job {id} ({status}): nothing is in its way"),
        }
    } else {
        format!("job {id} ({status}):")
    };
    lines.push(format!("{indent}{head}"));
    let inner = format!("{indent}    ");
    for reason in &reasons {
        let kind = reason["kind"].as_str().unwrap_or("?");
        let line = match kind {
            "dependency" => format!(
                "depends on job {} ({})",
                text(&reason["job"]),
                text(&reason["status"])
            ),
            "slots" => format!(
                "every slot is taken (max_running_jobs {}): {}",
                text(&reason["max_running_jobs"]),
                jobs(&reason["running"])
            ),
            "filter" => {
                let mut line = format!(
                    "filter rule {} ({})",
                    text(&reason["rule"]),
                    text(&reason["action"])
                );
                if reason["running"]
                    .as_array()
                    .is_some_and(|ids| !ids.is_empty())
                {
                    line.push_str(&format!(": its slots held by {}", jobs(&reason["running"])));
                }
                line
            }
            "rate_limit" => format!(
                "rate-limit bucket {} is full ({} at once): {}",
                text(&reason["bucket"]),
                text(&reason["limit"]),
                jobs(&reason["running"])
            ),
            "workers" => format!("waits for {}", workers_request_text(&reason["request"])),
            "locks" => "waits for locks".to_owned(),
            "starting" => "its runner is starting".to_owned(),
            "start_by" => format!("must start by {}", text(&reason["utc"])),
            "backoff" => format!(
                "its runner died; it runs again (retry.on_death) from {}",
                text(&reason["utc"])
            ),
            "drained" => "the queue is drained (new jobs are refused)".to_owned(),
            "finished" => format!("finished: {}", text(&reason["result"])),
            other => format!("{other}: {reason}"),
        };
        lines.push(format!("{indent}  - {line}"));
        if kind == "dependency" && reason["why"].is_object() {
            lines.extend(why_lines(output, &reason["why"], &inner));
        }
        if kind == "workers" {
            fitting_lines(output, reason, &inner, &mut lines);
        }
        if kind == "locks" {
            match reason["waits"].as_array() {
                Some(waits) => {
                    for wait in waits {
                        chain_lines(output, wait, &inner, &mut Vec::new(), &mut lines);
                    }
                }
                None => lines.push(format!("{inner}({})", text(&reason["error"]))),
            }
        }
    }
    lines
}

/// A workers request: how many, of which groups, with which caps.
fn workers_request_text(request: &Value) -> String {
    let count = request["count"].as_u64().unwrap_or(1);
    let mut line = format!("{count} worker{}", if count == 1 { "" } else { "s" });
    let groups: Vec<String> = request["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    if !groups.is_empty() {
        line.push_str(&format!(" of group {}", groups.join(" or ")));
    }
    let caps: Vec<String> = request["caps"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| format!("{key}={}", text(value)))
        .collect();
    if !caps.is_empty() {
        line.push_str(&format!(" with {}", caps.join(", ")));
    }
    line
}

/// The workers fitting a request, each with its holder and, when the
/// holder does not run, why.
fn fitting_lines(output: &Output, reason: &Value, indent: &str, lines: &mut Vec<String>) {
    let Some(workers) = reason["workers"].as_array() else {
        lines.push(format!("{indent}({})", text(&reason["error"])));
        return;
    };
    if workers.is_empty() {
        lines.push(format!("{indent}none registered fits"));
    }
    for worker in workers {
        let mut line = format!(
            "{indent}worker {} ({})",
            text(&worker["uuid"]),
            text(&worker["state"])
        );
        let holder = &worker["holder"];
        if holder.is_object() {
            line.push_str(&format!(
                ", held by job {} ({})",
                text(&holder["job"]),
                text(&holder["status"])
            ));
        }
        lines.push(line);
        if holder["why"].is_object() {
            lines.extend(why_lines(output, &holder["why"], &format!("{indent}  ")));
        }
    }
    let more = reason["total"]
        .as_u64()
        .unwrap_or(0)
        .saturating_sub(workers.len() as u64);
    if more > 0 {
        lines.push(format!("{indent}and {more} more that fit"));
    }
}

/// One pending request of a lock chain and whom it waits for; `path` is
/// the chain of waiters above it, so that a deadlock can be named whole.
fn chain_lines(
    output: &Output,
    wait: &Value,
    indent: &str,
    path: &mut Vec<String>,
    lines: &mut Vec<String>,
) {
    path.push(owner_label(wait));
    let waited = wait["waiting_seconds"].as_f64().unwrap_or(0.0);
    lines.push(format!(
        "{indent}{} waits {} for {}",
        owner_label(wait),
        output.paint(&format!("{waited:.1} s"), Some(Style::Cyan)),
        request_text(&wait["request"])
    ));
    for blocker in wait["blockers"].as_array().into_iter().flatten() {
        let holds = request_text(&blocker["holds"]);
        let mut line = format!("{indent}  blocked by {}", owner_label(blocker));
        if !holds.is_empty() {
            line.push_str(&format!(", holding {holds}"));
        }
        if let Some(count) = blocker["holds_count"].as_u64() {
            line.push_str(&format!(" ({count} locks in all)"));
        }
        if blocker["waits"]["deadlock"] == true {
            let cycle = cycle_on_path(path, &owner_label(blocker));
            line.push_str(&format!(
                "  {}",
                output.paint(&format!("(deadlock: {cycle})"), Some(Style::Yellow))
            ));
        }
        lines.push(line);
        if blocker["waits"].get("request").is_some() {
            let indent = format!("{indent}    ");
            chain_lines(output, &blocker["waits"], &indent, path, lines);
        }
    }
    path.pop();
}

/// The cycle a blocker already on `path` closes: `job 3 waits for job 5,
/// which waits for job 3`.
fn cycle_on_path(path: &[String], blocker: &str) -> String {
    let start = path.iter().position(|label| label == blocker).unwrap_or(0);
    cycle_text(&path[start..])
}

/// A cycle of waits told from its first owner back to it; shared with
/// `warden locks --tree`.
pub(super) fn cycle_text(cycle: &[String]) -> String {
    let mut text = String::new();
    for (index, label) in cycle.iter().chain(&cycle[..1.min(cycle.len())]).enumerate() {
        text.push_str(match index {
            0 => "",
            1 => " waits for ",
            _ => ", which waits for ",
        });
        text.push_str(label);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::cycle_on_path;

    #[test]
    fn a_deadlock_is_named_from_the_blocker_on_the_path_back_to_it() {
        let path = ["job 1", "job 3", "job 5"].map(String::from);
        assert_eq!(
            cycle_on_path(&path, "job 3"),
            "job 3 waits for job 5, which waits for job 3"
        );
        assert_eq!(
            cycle_on_path(&path[..2], "job 1"),
            "job 1 waits for job 3, which waits for job 1"
        );
    }
}
