//! Job filters (Ganeti 3.0's `design-optables`, what `gnt-filter` drives):
//! rules that accept, pause, reject or rate-limit queued jobs, by
//! predicates over a job's id, opcodes and reasons.
//!
//! Ganeti's semantics, kept exactly:
//! - rules apply in `(priority, watermark, uuid)` order, ascending; the
//!   *applying* rule of a job is the first whose predicates all match and
//!   whose action is not `CONTINUE`;
//! - `jobid` and `reason` predicates honour only comparisons: any other
//!   operator, an unknown field, or (for `jobid`) a text other than
//!   `"watermark"` makes the whole predicate false; a text compared with a
//!   number orders before it (Ganeti's derived order of filter values);
//! - an `opcode` predicate matches if the filter holds for any opcode,
//!   every field a dotted path into the opcode's JSON (`OP_ID` included);
//!   a path an opcode lacks, or a comparison its values cannot make, makes
//!   the filter false for that opcode;
//! - `RATE_LIMIT n` lets a job start while fewer than `n` started,
//!   unfinished jobs have that rule as their applying rule.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::Value;

use crate::protocol::query::datum;
use crate::query::filter::{Filter, Literal};

/// What a rule does to the jobs it applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Accept,
    Pause,
    Reject,
    Continue,
    RateLimit(u64),
}

/// What a rule asks of a job.
#[derive(Clone, Debug)]
pub enum Predicate {
    JobId(Filter<String>),
    OpCode(Filter<String>),
    Reason(Filter<String>),
}

impl Action {
    /// The action's wire form (`"PAUSE"`, `["RATE_LIMIT", n]`).
    pub fn to_json(&self) -> Value {
        match self {
            Action::Accept => Value::from("ACCEPT"),
            Action::Pause => Value::from("PAUSE"),
            Action::Reject => Value::from("REJECT"),
            Action::Continue => Value::from("CONTINUE"),
            Action::RateLimit(limit) => serde_json::json!(["RATE_LIMIT", limit]),
        }
    }
}

/// One rule.
#[derive(Clone, Debug)]
pub struct FilterRule {
    pub uuid: String,
    /// The highest job id handed out when the rule was added or replaced.
    pub watermark: u64,
    pub priority: u64,
    pub predicates: Vec<Predicate>,
    pub action: Action,
    /// The predicates as the client sent them.
    pub predicates_json: Value,
    /// `[source, text, timestamp_ns]` entries: why the rule was made.
    pub reason_trail: Value,
}

/// Rules are the same when their wire forms are.
impl PartialEq for FilterRule {
    fn eq(&self, other: &FilterRule) -> bool {
        self.to_json() == other.to_json()
    }
}

impl FilterRule {
    /// A rule of checked parts (see [`super::decode_rule`]).
    pub fn new(
        uuid: String,
        watermark: u64,
        parts: super::RuleParts,
        reason_trail: Value,
    ) -> FilterRule {
        FilterRule {
            uuid,
            watermark,
            priority: parts.priority,
            predicates: parts.predicates,
            action: parts.action,
            predicates_json: parts.predicates_json,
            reason_trail,
        }
    }

    /// The rule in its wire form, as queries answer it and luxid stores it.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "uuid": self.uuid,
            "watermark": self.watermark,
            "priority": self.priority,
            "predicates": self.predicates_json,
            "action": self.action.to_json(),
            "reason_trail": self.reason_trail,
        })
    }

    /// The key rules apply in: `(priority, watermark, uuid)`.
    pub fn order_key(&self) -> (u64, u64, &str) {
        (self.priority, self.watermark, &self.uuid)
    }

    /// Whether every predicate holds for `job`.
    pub fn matches(&self, job: &impl FilteredJob) -> bool {
        self.predicates
            .iter()
            .all(|predicate| predicate_holds(predicate, job, self.watermark))
    }
}

/// What the filters see of a job.
pub trait FilteredJob {
    fn id(&self) -> u64;
    /// Its opcodes as JSON objects (as submitted, with their reasons).
    fn opcodes(&self) -> impl Iterator<Item = &Value>;
}

impl FilteredJob for crate::jobs::Job {
    fn id(&self) -> u64 {
        self.id
    }
    fn opcodes(&self) -> impl Iterator<Item = &Value> {
        self.ops.iter().map(|op| &op.input)
    }
}

/// A reason entry of an opcode: `[source, text, timestamp]`.
fn reasons(opcode: &Value) -> impl Iterator<Item = (&str, &str, i128)> {
    opcode
        .get("reason")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.as_array()?;
            let source = entry.first()?.as_str()?;
            let text = entry.get(1)?.as_str()?;
            let timestamp = entry.get(2).and_then(Value::as_i64).unwrap_or(0);
            Some((source, text, i128::from(timestamp)))
        })
}

/// Every reason text of a job (for its rate-limit buckets).
pub fn reason_texts(job: &impl FilteredJob) -> impl Iterator<Item = &str> {
    job.opcodes()
        .flat_map(|opcode| reasons(opcode).map(|(_, text, _)| text))
}

/// The rules in the order they apply.
pub fn ordered(rules: &[FilterRule]) -> Vec<&FilterRule> {
    let mut ordered: Vec<&FilterRule> = rules.iter().collect();
    ordered.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    ordered
}

/// The applying rule of `job` among `ordered` rules (see [`ordered`]).
pub fn applying<'a>(ordered: &[&'a FilterRule], job: &impl FilteredJob) -> Option<&'a FilterRule> {
    ordered
        .iter()
        .copied()
        .filter(|rule| rule.action != Action::Continue)
        .find(|rule| rule.matches(job))
}

/// The place, in `ordered` rules, of the applying rule of `job`.
pub fn applying_index(ordered: &[FilterRule], job: &impl FilteredJob) -> Option<usize> {
    ordered
        .iter()
        .position(|rule| rule.action != Action::Continue && rule.matches(job))
}

/// What the filters decide for a queued job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No rule, or an `ACCEPT` (its uuid), applies.
    Run(Option<String>),
    Pause(String),
    Reject(String),
    /// Its `RATE_LIMIT` rule has no free slot.
    RateLimited(String),
}

/// Decides for `candidates` (queued jobs in the order they would start),
/// given the jobs started and not yet finished: Ganeti's `jobFiltering`.
/// A rate-limited rule's slots are taken by the running jobs it applies to,
/// then by the candidates let through, in order.
pub fn decide<J: FilteredJob>(
    rules: &[FilterRule],
    running: &[&J],
    candidates: &[&J],
) -> Vec<Decision> {
    let ordered = ordered(rules);
    let mut taken: BTreeMap<&str, u64> = BTreeMap::new();
    for job in running {
        if let Some(rule) = applying(&ordered, *job)
            && let Action::RateLimit(_) = rule.action
        {
            *taken.entry(&rule.uuid).or_default() += 1;
        }
    }
    candidates
        .iter()
        .map(|job| match applying(&ordered, *job) {
            None => Decision::Run(None),
            Some(rule) => match rule.action {
                Action::Accept | Action::Continue => Decision::Run(Some(rule.uuid.clone())),
                Action::Pause => Decision::Pause(rule.uuid.clone()),
                Action::Reject => Decision::Reject(rule.uuid.clone()),
                Action::RateLimit(limit) => {
                    let slots = taken.entry(&rule.uuid).or_default();
                    if *slots < limit {
                        *slots += 1;
                        Decision::Run(Some(rule.uuid.clone()))
                    } else {
                        Decision::RateLimited(rule.uuid.clone())
                    }
                }
            },
        })
        .collect()
}

fn predicate_holds(predicate: &Predicate, job: &impl FilteredJob, watermark: u64) -> bool {
    match predicate {
        Predicate::JobId(filter) => comparisons_hold(filter, &mut |field, literal| {
            if field != "id" {
                return None;
            }
            match literal {
                Literal::Integer(number) => Some(i128::from(job.id()).cmp(number)),
                Literal::Text(text) if text == "watermark" => Some(job.id().cmp(&watermark)),
                Literal::Text(_) => None,
            }
        }),
        Predicate::Reason(filter) => job.opcodes().any(|opcode| {
            reasons(opcode).any(|(source, text, timestamp)| {
                comparisons_hold(filter, &mut |field, literal| {
                    let value = match field {
                        "source" => Literal::Text(source.to_owned()),
                        "reason" => Literal::Text(text.to_owned()),
                        "timestamp" => Literal::Integer(timestamp),
                        _ => return None,
                    };
                    Some(value_order(&value, literal))
                })
            })
        }),
        Predicate::OpCode(filter) => job.opcodes().any(|opcode| opcode_matches(filter, opcode)),
    }
}

/// Ganeti's order of filter values: texts by their characters, numbers
/// by value, any text before any number.
fn value_order(value: &Literal, literal: &Literal) -> Ordering {
    match (value, literal) {
        (Literal::Text(a), Literal::Text(b)) => a.cmp(b),
        (Literal::Integer(a), Literal::Integer(b)) => a.cmp(b),
        (Literal::Text(_), Literal::Integer(_)) => Ordering::Less,
        (Literal::Integer(_), Literal::Text(_)) => Ordering::Greater,
    }
}

/// A filter of comparisons only: `compare(field, literal)` orders the
/// field's value against the literal, `None` if it cannot (which, as any
/// operator but a comparison, makes the whole filter false).
fn comparisons_hold(
    filter: &Filter<String>,
    compare: &mut dyn FnMut(&str, &Literal) -> Option<Ordering>,
) -> bool {
    fn evaluate(
        filter: &Filter<String>,
        compare: &mut dyn FnMut(&str, &Literal) -> Option<Ordering>,
    ) -> Option<bool> {
        match filter {
            Filter::All => Some(true),
            // Every operand is evaluated: one that cannot be makes all fail.
            Filter::And(operands) => operands
                .iter()
                .map(|operand| evaluate(operand, compare))
                .collect::<Option<Vec<bool>>>()
                .map(|values| values.into_iter().all(|value| value)),
            Filter::Or(operands) => operands
                .iter()
                .map(|operand| evaluate(operand, compare))
                .collect::<Option<Vec<bool>>>()
                .map(|values| values.into_iter().any(|value| value)),
            Filter::Not(operand) => evaluate(operand, compare).map(|value| !value),
            Filter::Compare(field, comparison, literal) => {
                compare(field, literal).map(|ordering| comparison.holds(ordering))
            }
            Filter::Truth(_) | Filter::Regex(..) | Filter::Contains(..) => None,
        }
    }
    evaluate(filter, compare).unwrap_or(false)
}

/// The value at a dotted path (`a.b.c`) of a JSON object.
fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |value, key| value.as_object()?.get(key))
}

fn opcode_matches(filter: &Filter<String>, opcode: &Value) -> bool {
    // Every field must be there: Ganeti resolves them all first.
    if filter
        .fields()
        .into_iter()
        .any(|path| at_path(opcode, path).is_none())
    {
        return false;
    }
    let row = |path: &String| at_path(opcode, path).map(datum);
    filter.matches(&row).unwrap_or(false)
}
