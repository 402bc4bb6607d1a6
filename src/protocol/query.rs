//! The wire side of `Query` and `QueryFields`: their arguments decoded
//! (the filter into a typed [`Filter`], with Ganeti's texts for a
//! malformed one and warden's limits on its size), field values turned
//! into the [`Datum`]s a filter sees, and answers encoded in Ganeti's
//! shape: `{"fields": [{"name", "title", "kind", "doc"}, ...], "data":
//! [[[status, value], ...], ...]}`.

use serde_json::{Map, Value, json};

use super::{Args, WireError};
use crate::limits::{
    QUERY_FIELDS_MAX, QUERY_FILTER_NODES_MAX, QUERY_FILTER_REGEX_BYTES_MAX,
    QUERY_FILTER_REGEXES_MAX,
};
use crate::query::FieldDef;
use crate::query::filter::{Comparison, Datum, Filter, Literal, Pattern};
use crate::query::jobs::{Answer, Cell, QueryError};
use crate::text::shortened;

/// The resources Ganeti's query knows; warden answers `job` and `filter`.
const GANETI_RESOURCES: [&str; 10] = [
    "cluster", "instance", "node", "group", "os", "export", "network", "lock", "job", "filter",
];

/// The resources warden's query answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Job,
    /// The job filter rules.
    Filter,
}

/// A decoded `Query`.
#[derive(Debug)]
pub struct QueryRequest {
    pub resource: Resource,
    pub fields: Vec<String>,
    pub filter: Filter<String>,
}

/// `Query [what, fields, filter]`, for `what` = `"job"` or `"filter"`.
pub fn decode_query(args: &[Value]) -> Result<QueryRequest, WireError> {
    let args = Args::exactly("Query", args, 3)?;
    let resource = resource(&args)?;
    let fields = field_names(&args, 1)?;
    let filter = decode_filter(args.get(2))
        .map_err(|error| args.bad(2, format!("is not a valid filter: {error}")))?;
    Ok(QueryRequest {
        resource,
        fields,
        filter,
    })
}

/// `QueryFields [what, fields or null]`: the resource and the field
/// names (none: every field).
pub fn decode_query_fields(args: &[Value]) -> Result<(Resource, Vec<String>), WireError> {
    let args = Args::exactly("QueryFields", args, 2)?;
    let resource = resource(&args)?;
    if args.get(1).is_null() {
        return Ok((resource, Vec::new()));
    }
    Ok((resource, field_names(&args, 1)?))
}

fn resource(args: &Args) -> Result<Resource, WireError> {
    let what = args.string(0)?;
    if what == "job" {
        Ok(Resource::Job)
    } else if what == "filter" {
        Ok(Resource::Filter)
    } else if GANETI_RESOURCES.contains(&what) {
        Err(WireError::generic(format!(
            "Query '{what}' not supported (warden answers 'job' and 'filter')"
        )))
    } else {
        Err(args.bad(0, format!("is no resource: '{}'", shortened(what))))
    }
}

fn field_names(args: &Args, index: usize) -> Result<Vec<String>, WireError> {
    let fields = args.list(index)?;
    if fields.len() > QUERY_FIELDS_MAX {
        return Err(WireError {
            class: "OpPrereqError",
            args: vec![
                json!(format!(
                    "{} fields are over the limit of {QUERY_FIELDS_MAX} per query",
                    fields.len()
                )),
                json!("wrong_input"),
            ],
        });
    }
    fields
        .iter()
        .map(|field| {
            field
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| args.bad(index, "holds a field name that is not a string"))
        })
        .collect()
}

/// A filter from its wire form, with Ganeti's texts for what is wrong
/// with it, and refused past warden's limits.
pub fn decode_filter(value: &Value) -> Result<Filter<String>, String> {
    let mut budget = Budget {
        nodes: QUERY_FILTER_NODES_MAX,
        regexes: QUERY_FILTER_REGEXES_MAX,
    };
    decode(value, &mut budget)
}

/// What a filter may still hold.
struct Budget {
    nodes: usize,
    regexes: usize,
}

fn decode(value: &Value, budget: &mut Budget) -> Result<Filter<String>, String> {
    if budget.nodes == 0 {
        return Err(format!(
            "the filter has more than {QUERY_FILTER_NODES_MAX} operators and operands"
        ));
    }
    budget.nodes -= 1;
    let (op, operands) = match value {
        Value::Null => return Ok(Filter::All),
        Value::Array(items) => match items.split_first() {
            Some((Value::String(op), operands)) => (op.as_str(), operands),
            _ => return Err(not_a_filter(value)),
        },
        _ => return Err(not_a_filter(value)),
    };
    let comparison = |comparison| -> Result<Filter<String>, String> {
        let (field, literal) = field_and_value(operands)?;
        Ok(Filter::Compare(field, comparison, literal))
    };
    match op {
        "&" => Ok(Filter::And(decode_all(operands, budget)?)),
        "|" => Ok(Filter::Or(decode_all(operands, budget)?)),
        "!" => match operands {
            [operand] => Ok(Filter::Not(Box::new(decode(operand, budget)?))),
            _ => Err(format!(
                "Cannot deserialise field, expected [filter] but got {}",
                shown(&Value::Array(operands.to_vec()))
            )),
        },
        "?" => match operands {
            [Value::String(field)] => Ok(Filter::Truth(field.clone())),
            _ => Err(format!(
                "Cannot deserialise field, expected [fieldname] but got {}",
                shown(&Value::Array(operands.to_vec()))
            )),
        },
        "==" | "=" => comparison(Comparison::Eq),
        "!=" => Ok(Filter::Not(Box::new(comparison(Comparison::Eq)?))),
        "<" => comparison(Comparison::Lt),
        "<=" => comparison(Comparison::Le),
        ">" => comparison(Comparison::Gt),
        ">=" => comparison(Comparison::Ge),
        "=[]" => {
            let (field, literal) = field_and_value(operands)?;
            Ok(Filter::Contains(field, literal))
        }
        "=~" => {
            let [Value::String(field), pattern] = operands else {
                return Err(not_a_pair(operands));
            };
            let Value::String(pattern) = pattern else {
                return Err(format!(
                    "Cannot deserialise regular expression, expecting a string, got {}",
                    shown(pattern)
                ));
            };
            if budget.regexes == 0 {
                return Err(format!(
                    "the filter has more than {QUERY_FILTER_REGEXES_MAX} regular expressions"
                ));
            }
            budget.regexes -= 1;
            let pattern = Pattern::new(pattern, QUERY_FILTER_REGEX_BYTES_MAX)
                .map_err(|error| format!("Invalid regular expression: {error}"))?;
            Ok(Filter::Regex(field.clone(), pattern))
        }
        other => Err(format!("Unknown filter operand '{}'", shortened(other))),
    }
}

fn decode_all(operands: &[Value], budget: &mut Budget) -> Result<Vec<Filter<String>>, String> {
    operands
        .iter()
        .map(|operand| decode(operand, budget))
        .collect()
}

fn field_and_value(operands: &[Value]) -> Result<(String, Literal), String> {
    let [Value::String(field), value] = operands else {
        return Err(not_a_pair(operands));
    };
    Ok((field.clone(), literal(value)?))
}

/// A filter value: a string, or an integral number (Ganeti's
/// `FilterValue`).
fn literal(value: &Value) -> Result<Literal, String> {
    match value {
        Value::String(text) => Ok(Literal::Text(text.clone())),
        Value::Number(number) => {
            if let Some(integer) = number.as_i64() {
                Ok(Literal::Integer(i128::from(integer)))
            } else if let Some(integer) = number.as_u64() {
                Ok(Literal::Integer(i128::from(integer)))
            } else {
                let float = number.as_f64().unwrap_or(f64::NAN);
                if float.fract() != 0.0 || !float.is_finite() {
                    Err(format!(
                        "Cannot deserialise numeric filter value, expecting integral but got a fractional value: {number}"
                    ))
                } else if float.abs() >= 2f64.powi(127) {
                    Err(format!(
                        "Cannot deserialise numeric filter value: {number} is out of range"
                    ))
                } else {
                    Ok(Literal::Integer(float as i128))
                }
            }
        }
        other => Err(format!(
            "Cannot deserialise filter value, expecting string or integer, got {}",
            shown(other)
        )),
    }
}

fn not_a_filter(value: &Value) -> String {
    format!(
        "Cannot deserialise filter: expected array [string, args], got {}",
        shown(value)
    )
}

fn not_a_pair(operands: &[Value]) -> String {
    format!(
        "Cannot deserialise field/value pair, expected [fieldname, value] but got {}",
        shown(&Value::Array(operands.to_vec()))
    )
}

/// A value quoted in an error, shortened.
fn shown(value: &Value) -> String {
    shortened(&value.to_string())
}

/// A field value as a filter sees it.
pub fn datum(value: &Value) -> Datum {
    match value {
        Value::Null => Datum::Null,
        Value::Bool(value) => Datum::Bool(*value),
        Value::Number(number) => {
            if let Some(integer) = number.as_i64() {
                Datum::Integer(i128::from(integer))
            } else if let Some(integer) = number.as_u64() {
                Datum::Integer(i128::from(integer))
            } else {
                Datum::Float(number.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(text) => Datum::Text(text.clone()),
        Value::Array(items) => Datum::List(items.iter().map(datum).collect()),
        Value::Object(entries) => Datum::Map(
            entries
                .iter()
                .map(|(key, value)| (key.clone(), datum(value)))
                .collect(),
        ),
    }
}

/// The wire errors of a refused query, as Ganeti classes them.
pub fn query_error(error: QueryError) -> WireError {
    match error {
        QueryError::BadJobId(message) => WireError::generic(message),
        QueryError::UnknownFilterField(name) => {
            parameter_error(format!("Can't find field named '{}'", shortened(&name)))
        }
        QueryError::Eval(error @ crate::query::filter::EvalError::NotAList { .. }) => {
            // Ganeti fails these in its JSON conversion, a generic error.
            WireError::generic(shortened(&error.to_string()))
        }
        QueryError::Eval(error) => parameter_error(shortened(&error.to_string())),
        QueryError::TooLong { limit_bytes } => WireError::generic(format!(
            "the answer would be longer than the frame limit of {limit_bytes} bytes; \
             ask for fewer jobs or fields"
        )),
    }
}

fn parameter_error(message: String) -> WireError {
    WireError {
        class: "ParameterError",
        args: vec![Value::String(message)],
    }
}

fn field_def(def: &FieldDef) -> Value {
    let mut object = Map::new();
    object.insert("name".into(), json!(def.name));
    object.insert("title".into(), json!(def.title));
    object.insert("kind".into(), json!(def.kind.name()));
    object.insert("doc".into(), json!(def.doc));
    Value::Object(object)
}

/// `{"fields": [definitions]}`: the answer of `QueryFields`.
pub fn encode_field_defs(defs: &[FieldDef]) -> Value {
    json!({"fields": defs.iter().map(field_def).collect::<Vec<_>>()})
}

fn encode_cell(cell: &Cell) -> Value {
    match cell {
        Cell::Normal(value) => json!([0, value]),
        Cell::Absent(status) => json!([status.code(), null]),
    }
}

fn encode_row(row: &[Cell]) -> Value {
    Value::Array(row.iter().map(encode_cell).collect())
}

/// `{"fields": [definitions], "data": [rows]}`: the answer of `Query`.
pub fn encode_answer(answer: &Answer) -> Value {
    json!({
        "fields": answer.fields.iter().map(field_def).collect::<Vec<_>>(),
        "data": answer.rows.iter().map(|row| encode_row(row)).collect::<Vec<_>>(),
    })
}

/// The length of a row as JSON, counted without keeping the text.
pub fn row_bytes(row: &[Cell]) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, &encode_row(row)).expect("counting JSON cannot fail");
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::ResultStatus;
    use proptest::prelude::*;

    fn decoded(value: Value) -> Filter<String> {
        decode_filter(&value).unwrap_or_else(|error| panic!("{value}: {error}"))
    }

    fn refused(value: Value) -> String {
        match decode_filter(&value) {
            Ok(filter) => panic!("{value} decoded to {filter:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn every_operator_decodes() {
        assert!(matches!(decoded(json!(null)), Filter::All));
        assert!(matches!(
            decoded(json!(["&", ["?", "archived"], null])),
            Filter::And(operands) if matches!(operands[..], [Filter::Truth(_), Filter::All])
        ));
        assert!(matches!(decoded(json!(["|"])), Filter::Or(operands) if operands.is_empty()));
        assert!(matches!(decoded(json!(["!", ["?", "x"]])), Filter::Not(_)));
        for (op, expected) in [
            ("==", Comparison::Eq),
            ("=", Comparison::Eq),
            ("<", Comparison::Lt),
            ("<=", Comparison::Le),
            (">", Comparison::Gt),
            (">=", Comparison::Ge),
        ] {
            match decoded(json!([op, "id", 3])) {
                Filter::Compare(field, comparison, Literal::Integer(3)) => {
                    assert_eq!(field, "id");
                    assert_eq!(comparison, expected, "{op}");
                }
                other => panic!("{op}: {other:?}"),
            }
        }
        assert!(matches!(
            decoded(json!(["!=", "status", "queued"])),
            Filter::Not(inner) if matches!(*inner, Filter::Compare(_, Comparison::Eq, Literal::Text(_)))
        ));
        assert!(matches!(
            decoded(json!(["=~", "status", "^r"])),
            Filter::Regex(_, pattern) if pattern.source() == "^r"
        ));
        assert!(matches!(
            decoded(json!(["=[]", "summary", "EXEC(x)"])),
            Filter::Contains(_, Literal::Text(_))
        ));
        // An integral float is an integer, as in Ganeti.
        assert!(matches!(
            decoded(json!(["=", "id", 3.0])),
            Filter::Compare(_, _, Literal::Integer(3))
        ));
        assert!(matches!(
            decoded(json!(["=", "id", u64::MAX])),
            Filter::Compare(_, _, Literal::Integer(n)) if n == i128::from(u64::MAX)
        ));
    }

    #[test]
    fn malformed_filters_are_refused_with_ganetis_texts() {
        let cases = [
            (
                json!("id"),
                "Cannot deserialise filter: expected array [string, args], got \"id\"",
            ),
            (
                json!([]),
                "Cannot deserialise filter: expected array [string, args], got []",
            ),
            (json!([1, "id"]), "expected array [string, args]"),
            (json!(["~", "id", 1]), "Unknown filter operand '~'"),
            (
                json!(["!"]),
                "Cannot deserialise field, expected [filter] but got []",
            ),
            (json!(["!", null, null]), "expected [filter]"),
            (
                json!(["?", 1]),
                "Cannot deserialise field, expected [fieldname] but got [1]",
            ),
            (json!(["?"]), "expected [fieldname]"),
            (
                json!(["=", "id"]),
                "Cannot deserialise field/value pair, expected [fieldname, value] but got [\"id\"]",
            ),
            (json!(["=", 1, 1]), "expected [fieldname, value]"),
            (json!(["=", "id", 1, 2]), "expected [fieldname, value]"),
            (
                json!(["=", "id", true]),
                "Cannot deserialise filter value, expecting string or integer, got true",
            ),
            (
                json!(["<", "id", null]),
                "expecting string or integer, got null",
            ),
            (
                json!(["=[]", "id", [1]]),
                "expecting string or integer, got [1]",
            ),
            (
                json!(["=", "id", 1.5]),
                "expecting integral but got a fractional value: 1.5",
            ),
            (json!(["=", "id", 1e300]), "out of range"),
            (json!(["=~", "status", 1]), "expecting a string, got 1"),
            (json!(["=~", "status", "("]), "Invalid regular expression"),
            (json!(["&", ["?", "x"], 3]), "got 3"),
            (json!(["|", ["!", ["=", "id", {}]]]), "got {}"),
        ];
        for (value, expected) in cases {
            let error = refused(value.clone());
            assert!(error.contains(expected), "{value}: {error}");
        }
    }

    #[test]
    fn filter_limits_are_enforced() {
        let wide = Value::Array(
            std::iter::once(json!("|"))
                .chain((0..QUERY_FILTER_NODES_MAX).map(|id| json!(["=", "id", id])))
                .collect(),
        );
        assert!(refused(wide).contains(&format!(
            "more than {QUERY_FILTER_NODES_MAX} operators and operands"
        )));
        let just_fits = Value::Array(
            std::iter::once(json!("|"))
                .chain((1..QUERY_FILTER_NODES_MAX).map(|id| json!(["=", "id", id])))
                .collect(),
        );
        assert_eq!(decoded(just_fits).node_count(), QUERY_FILTER_NODES_MAX);
        let regexes = Value::Array(
            std::iter::once(json!("&"))
                .chain((0..=QUERY_FILTER_REGEXES_MAX).map(|_| json!(["=~", "status", "a"])))
                .collect(),
        );
        assert!(refused(regexes).contains(&format!(
            "more than {QUERY_FILTER_REGEXES_MAX} regular expressions"
        )));
        // A pattern that compiles to more than the size limit.
        let huge = json!(["=~", "status", "\\w{1000}\\w{1000}\\w{1000}"]);
        assert!(refused(huge).contains("Invalid regular expression"));
    }

    #[test]
    fn query_arguments_are_checked() {
        let request = decode_query(&[json!("job"), json!(["id", "x"]), json!(["?", "archived"])])
            .expect("valid");
        assert_eq!(request.fields, ["id", "x"]);
        let bad = |args: &[Value]| decode_query(args).unwrap_err();
        assert_eq!(
            bad(&[json!("job")]).message(),
            "Query takes 3 arguments, got 1"
        );
        assert_eq!(
            bad(&[json!("node"), json!([]), json!(null)]).message(),
            "Query 'node' not supported (warden answers 'job' and 'filter')"
        );
        assert_eq!(
            bad(&[json!("nodes"), json!([]), json!(null)]).message(),
            "Query: argument 1 is no resource: 'nodes'"
        );
        assert_eq!(
            bad(&[json!("job"), json!([1]), json!(null)]).message(),
            "Query: argument 2 holds a field name that is not a string"
        );
        let error = bad(&[json!("job"), json!([]), json!(["=", "id"])]);
        assert_eq!(error.class, "GenericError");
        assert!(
            error
                .message()
                .starts_with("Query: argument 3 is not a valid filter: ")
        );
        let too_many = Value::Array(vec![json!("id"); QUERY_FIELDS_MAX + 1]);
        assert_eq!(
            bad(&[json!("job"), too_many, json!(null)]).class,
            "OpPrereqError"
        );
        assert_eq!(
            decode_query_fields(&[json!("job"), json!(null)]).expect("valid"),
            (Resource::Job, Vec::<String>::new())
        );
        assert_eq!(
            decode_query_fields(&[json!("filter"), json!(["uuid"])]).expect("valid"),
            (Resource::Filter, vec!["uuid".to_owned()])
        );
        assert!(decode_query_fields(&[json!("job"), json!("status")]).is_err());
    }

    #[test]
    fn answers_are_ganeti_shaped() {
        let answer = Answer {
            fields: vec![FieldDef::unknown("x")],
            rows: vec![vec![
                Cell::Normal(json!(3)),
                Cell::Absent(ResultStatus::Unavailable),
                Cell::Absent(ResultStatus::Unknown),
            ]],
        };
        assert_eq!(
            encode_answer(&answer),
            json!({
                "fields": [{"name": "x", "title": "x", "kind": "unknown", "doc": "Unknown field 'x'"}],
                "data": [[[0, 3], [3, null], [1, null]]],
            })
        );
        assert_eq!(
            row_bytes(&answer.rows[0]),
            encode_row(&answer.rows[0]).to_string().len()
        );
    }

    #[test]
    fn errors_carry_ganetis_classes() {
        let error = query_error(QueryError::UnknownFilterField("nosuch".into()));
        assert_eq!(error.class, "ParameterError");
        assert_eq!(error.message(), "Can't find field named 'nosuch'");
        let error = query_error(QueryError::Eval(
            crate::query::filter::EvalError::NotBoolean(Datum::Integer(1)),
        ));
        assert_eq!(error.class, "ParameterError");
        assert_eq!(error.message(), "Unexpected value '1' in boolean context");
        assert_eq!(
            query_error(QueryError::BadJobId("x".into())).class,
            "GenericError"
        );
    }

    proptest! {
        /// Whatever JSON a filter is, it decodes to a filter or is refused
        /// with a message, never a panic; a decoded filter evaluates
        /// against any row without a panic.
        #[test]
        fn any_json_filter_decodes_or_is_refused(value in crate::protocol::arbitrary::json()) {
            match decode_filter(&value) {
                Ok(filter) => {
                    prop_assert!(filter.node_count() <= QUERY_FILTER_NODES_MAX);
                    let row = |field: &String| match field.as_str() {
                        "" => None,
                        other => Some(datum(&json!(other))),
                    };
                    let _ = filter.matches(&row);
                }
                Err(error) => prop_assert!(!error.is_empty()),
            }
        }

        /// Filters built from the operators, with arbitrary operands, do
        /// the same.
        #[test]
        fn any_operator_with_any_operands_decodes_or_is_refused(
            op in prop::sample::select(vec!["&", "|", "!", "?", "==", "=", "!=", "<", "<=", ">", ">=", "=~", "=[]", "x"]),
            operands in proptest::collection::vec(crate::protocol::arbitrary::json(), 0..4),
        ) {
            let value = Value::Array(std::iter::once(json!(op)).chain(operands).collect());
            if let Err(error) = decode_filter(&value) {
                prop_assert!(!error.is_empty());
            }
        }
    }
}
