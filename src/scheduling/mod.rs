//! Scheduling (design/SCHEDULING.md): what decides, beyond slots,
//! dependencies and workers, whether a queued job may start. Pure: no I/O,
//! no clock.
//!
//! - [`filters`]: Ganeti 3.0's job filter rules (`gnt-filter`), their
//!   order, predicates and actions, and the decisions they make for the
//!   queued jobs given the running ones;
//! - [`rate_limit`]: Ganeti's ad-hoc rate limits from `rate-limit:n:label`
//!   reasons.
//!
//! A rule as LUXI's `ReplaceFilter` carries it is decoded and checked by
//! [`decode_rule`]: a bad rule is refused whole, naming what is wrong.

pub mod filters;
pub mod rate_limit;

use serde_json::Value;

use crate::protocol::query::decode_filter;
use filters::{Action, Predicate};

/// The parts of a rule a client gives (`ReplaceFilter`'s priority,
/// predicates and action), checked.
#[derive(Clone, Debug)]
pub struct RuleParts {
    pub priority: u64,
    pub predicates: Vec<Predicate>,
    /// The predicates as the client sent them: queries answer them so.
    pub predicates_json: Value,
    pub action: Action,
}

/// Decodes a rule's priority, predicates and action from their wire form;
/// the error names the part that is wrong (luxid answers it as
/// `OpPrereqError`).
pub fn decode_rule(
    priority: &Value,
    predicates: &Value,
    action: &Value,
) -> Result<RuleParts, String> {
    let priority = match priority {
        Value::Number(number) => number
            .as_u64()
            .ok_or_else(|| format!("priority: {number} is not an integer of 0 or more"))?,
        other => return Err(format!("priority: {other} is not an integer of 0 or more")),
    };
    let Value::Array(items) = predicates else {
        return Err(format!("predicates: {predicates} is not a list"));
    };
    let predicates = items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            decode_predicate(item).map_err(|what| format!("predicate {index}: {what}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let action = decode_action(action).map_err(|what| format!("action: {what}"))?;
    Ok(RuleParts {
        priority,
        predicates,
        predicates_json: Value::Array(items.clone()),
        action,
    })
}

/// Parts are the same when their wire forms are (the predicates are
/// decoded from theirs).
impl PartialEq for RuleParts {
    fn eq(&self, other: &RuleParts) -> bool {
        (self.priority, &self.predicates_json, &self.action)
            == (other.priority, &other.predicates_json, &other.action)
    }
}

fn decode_predicate(value: &Value) -> Result<Predicate, String> {
    let Some([Value::String(kind), filter]) = value.as_array().map(Vec::as_slice) else {
        return Err(format!("{value} is not [kind, filter]"));
    };
    let filter = decode_filter(filter)?;
    match kind.as_str() {
        "jobid" => Ok(Predicate::JobId(filter)),
        "opcode" => Ok(Predicate::OpCode(filter)),
        "reason" => Ok(Predicate::Reason(filter)),
        other => Err(format!("unknown kind {other:?} (jobid, opcode or reason)")),
    }
}

/// An action from its wire form (`"PAUSE"`, `["RATE_LIMIT", n]`).
pub fn decode_action(value: &Value) -> Result<Action, String> {
    match value {
        Value::String(name) => match name.as_str() {
            "ACCEPT" => Ok(Action::Accept),
            "PAUSE" => Ok(Action::Pause),
            "REJECT" => Ok(Action::Reject),
            "CONTINUE" => Ok(Action::Continue),
            other => Err(format!(
                "unknown action {other:?} (ACCEPT, PAUSE, REJECT, CONTINUE or [\"RATE_LIMIT\", n])"
            )),
        },
        Value::Array(items) => match items.as_slice() {
            [Value::String(name), Value::Number(limit)] if name == "RATE_LIMIT" => limit
                .as_u64()
                .filter(|limit| *limit > 0)
                .map(Action::RateLimit)
                .ok_or_else(|| format!("RATE_LIMIT needs a positive integer, not {limit}")),
            _ => Err(format!("{value} is not [\"RATE_LIMIT\", n]")),
        },
        other => Err(format!("{other} is not an action")),
    }
}

#[cfg(test)]
mod tests;
