//! The `filter` resource of `Query` and `QueryFields`, and LUXI's
//! `QueryFilters`: the job filter rules (SCHEDULING.md) with Ganeti 3.0's
//! fields (`Ganeti.Query.FilterRules`), as `gnt-filter list`,
//! `list-fields` and `info` read them.
//!
//! As Ganeti answers them: rules in uuid order; a filter that names
//! uuids picks rules, and an unknown uuid gives no row (not an error);
//! an unknown output field is a cell of status `unknown` in `Query`, and
//! refuses `QueryFilters` ("Unknown output fields selected"); an unknown
//! field inside the filter refuses the query.

use std::borrow::Cow;

use serde_json::Value;

use super::filter::{Filter, Literal};
use super::jobs::{Answer, Cell, QueryError};
use super::{FieldDef, FieldKind, ResultStatus};
use crate::protocol::query as wire;
use crate::scheduling::filters::FilterRule;

/// The rule fields, in Ganeti's order, every one of kind `other`.
const FILTER_FIELDS: [(&str, &str, &str); 6] = [
    (
        "watermark",
        "Watermark",
        "Highest job ID used at the time when the filter was added",
    ),
    ("priority", "Priority", "Filter priority"),
    ("predicates", "Predicates", "List of filter predicates"),
    ("action", "Action", "Filter action"),
    (
        "reason_trail",
        "ReasonTrail",
        "Reason why this filter was added",
    ),
    ("uuid", "UUID", "Filter ID"),
];

fn known(name: &str) -> Option<FieldDef> {
    FILTER_FIELDS
        .iter()
        .find(|(field, _, _)| *field == name)
        .map(|(name, title, doc)| FieldDef {
            name: Cow::Borrowed(name),
            title: Cow::Borrowed(title),
            kind: FieldKind::Other,
            doc: Cow::Borrowed(doc),
        })
}

/// The definitions `QueryFields ["filter", ...]` answers: the named
/// fields in their order (unknown ones of kind `unknown`), or every field
/// sorted by name.
pub fn field_defs(names: &[String]) -> Vec<FieldDef> {
    if names.is_empty() {
        let mut all: Vec<FieldDef> = FILTER_FIELDS
            .iter()
            .filter_map(|(name, _, _)| known(name))
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        return all;
    }
    names
        .iter()
        .map(|name| known(name).unwrap_or_else(|| FieldDef::unknown(name)))
        .collect()
}

/// A rule's value of a known field.
fn value(rule: &FilterRule, field: &str) -> Option<Value> {
    Some(match field {
        "uuid" => Value::from(rule.uuid.as_str()),
        "watermark" => Value::from(rule.watermark),
        "priority" => Value::from(rule.priority),
        "predicates" => rule.predicates_json.clone(),
        "action" => rule.action.to_json(),
        "reason_trail" => rule.reason_trail.clone(),
        _ => return None,
    })
}

/// The rules, in uuid order, that pass `filter`, with `fields` of each.
pub fn query(
    fields: &[String],
    filter: Filter<String>,
    rules: &[FilterRule],
) -> Result<Answer, QueryError> {
    let filter = filter.compile(&mut |name: String| match known(&name) {
        Some(_) => Ok(name),
        None => Err(QueryError::UnknownFilterField(name)),
    })?;
    let mut sorted: Vec<&FilterRule> = rules.iter().collect();
    sorted.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    let mut rows = Vec::new();
    for rule in sorted {
        let passes = filter
            .matches(&|field: &String| value(rule, field).map(|value| wire::datum(&value)))
            .map_err(QueryError::Eval)?;
        if !passes {
            continue;
        }
        rows.push(
            fields
                .iter()
                .map(|field| match value(rule, field) {
                    Some(value) => Cell::Normal(value),
                    None => Cell::Absent(ResultStatus::Unknown),
                })
                .collect(),
        );
    }
    Ok(Answer {
        fields: field_defs_of(fields),
        rows,
    })
}

fn field_defs_of(fields: &[String]) -> Vec<FieldDef> {
    fields
        .iter()
        .map(|name| known(name).unwrap_or_else(|| FieldDef::unknown(name)))
        .collect()
}

/// `QueryFilters [uuids or null, fields]`: Ganeti's classic answer, a
/// list of rows of plain values; `None` or no uuids: every rule.
pub fn query_filters(
    uuids: Option<&[String]>,
    fields: &[String],
    rules: &[FilterRule],
) -> Result<Value, String> {
    let unknown: Vec<&str> = fields
        .iter()
        .filter(|name| known(name).is_none())
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "Unknown output fields selected: {}",
            unknown.join(", ")
        ));
    }
    let filter = match uuids {
        Some(uuids) if !uuids.is_empty() => Filter::Or(
            uuids
                .iter()
                .map(|uuid| {
                    Filter::Compare(
                        "uuid".to_owned(),
                        super::filter::Comparison::Eq,
                        Literal::Text(uuid.clone()),
                    )
                })
                .collect(),
        ),
        _ => Filter::All,
    };
    let answer = query(fields, filter, rules).map_err(|error| format!("{error:?}"))?;
    Ok(Value::Array(
        answer
            .rows
            .into_iter()
            .map(|row| {
                Value::Array(
                    row.into_iter()
                        .map(|cell| match cell {
                            Cell::Normal(value) => value,
                            Cell::Absent(_) => Value::Null,
                        })
                        .collect(),
                )
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::decode_rule;
    use serde_json::json;

    fn rule(uuid: &str, priority: u64, action: Value) -> FilterRule {
        let parts = decode_rule(
            &json!(priority),
            &json!([["jobid", [">", "id", "watermark"]]]),
            &action,
        )
        .expect("a good rule");
        FilterRule::new(uuid.to_owned(), 7, parts, json!([["gnt:user", "why", 1]]))
    }

    fn names(fields: &[&str]) -> Vec<String> {
        fields.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn rules_come_in_uuid_order_with_their_fields() {
        let rules = [
            rule("b", 0, json!("PAUSE")),
            rule("a", 5, json!(["RATE_LIMIT", 2])),
        ];
        let answer = query(&names(&["uuid", "action", "nope"]), Filter::All, &rules).unwrap();
        assert_eq!(answer.fields[2].kind, FieldKind::Unknown);
        assert_eq!(
            answer.rows,
            vec![
                vec![
                    Cell::Normal(json!("a")),
                    Cell::Normal(json!(["RATE_LIMIT", 2])),
                    Cell::Absent(ResultStatus::Unknown)
                ],
                vec![
                    Cell::Normal(json!("b")),
                    Cell::Normal(json!("PAUSE")),
                    Cell::Absent(ResultStatus::Unknown)
                ],
            ]
        );
    }

    #[test]
    fn query_filters_picks_uuids_and_refuses_unknown_fields() {
        let rules = [rule("b", 0, json!("PAUSE")), rule("a", 5, json!("ACCEPT"))];
        let uuids = names(&["b", "missing"]);
        assert_eq!(
            query_filters(
                Some(&uuids),
                &names(&["uuid", "priority", "watermark"]),
                &rules
            ),
            Ok(json!([["b", 0, 7]]))
        );
        assert_eq!(
            query_filters(None, &names(&["predicates", "reason_trail"]), &rules),
            Ok(json!([
                [
                    [["jobid", [">", "id", "watermark"]]],
                    [["gnt:user", "why", 1]]
                ],
                [
                    [["jobid", [">", "id", "watermark"]]],
                    [["gnt:user", "why", 1]]
                ]
            ]))
        );
        assert_eq!(
            query_filters(None, &names(&["uuid", "bogus"]), &rules),
            Err("Unknown output fields selected: bogus".to_owned())
        );
    }

    #[test]
    fn a_filter_over_an_unknown_field_refuses_the_query() {
        let filter = Filter::Compare(
            "bogus".to_owned(),
            super::super::filter::Comparison::Eq,
            Literal::Integer(1),
        );
        assert!(matches!(
            query(&names(&["uuid"]), filter, &[]),
            Err(QueryError::UnknownFilterField(_))
        ));
    }

    #[test]
    fn every_field_is_listed_sorted() {
        let defs = field_defs(&[]);
        let listed: Vec<&str> = defs.iter().map(|def| def.name.as_ref()).collect();
        assert_eq!(
            listed,
            [
                "action",
                "predicates",
                "priority",
                "reason_trail",
                "uuid",
                "watermark"
            ]
        );
    }
}
