//! Ganeti's query filter language, typed: a [`Filter`] over fields of any
//! type `F`, evaluated against a row through [`Row`]. Pure: no JSON, no
//! I/O. The wire form (`["&", ["=", "id", 3], ...]`) is decoded in
//! `protocol::query`; job filters (`gnt-filter` rules) reuse the same
//! language.
//!
//! Semantics, operator by operator, as Ganeti 3.0 evaluates them:
//! - `&` and `|` evaluate their operands left to right and stop at the
//!   first that decides (an empty `&` is true, an empty `|` false), so an
//!   operand after the deciding one is never evaluated and cannot fail;
//! - `!` negates; `!=` is `!` of `==` (Ganeti decodes it so);
//! - `?` is the truth of a boolean field; any other value is an error;
//! - `==`/`=`, `<`, `<=`, `>`, `>=` compare a text with a text and an
//!   integer with a number; any other pairing is an error;
//! - `=~` searches a text field (unanchored) with a regular expression;
//! - `=[]` asks whether a list of texts (or of integers) holds the value;
//! - a field whose value is not known (its row has no normal value for
//!   it) satisfies every leaf that names it: Ganeti lets such rows through
//!   rather than guess.

use std::cmp::Ordering;
use std::fmt;

/// A filter over fields named by `F`: Ganeti's `Filter a`.
#[derive(Clone, Debug)]
pub enum Filter<F> {
    /// No filter (`null` on the wire): every row.
    All,
    And(Vec<Filter<F>>),
    Or(Vec<Filter<F>>),
    Not(Box<Filter<F>>),
    /// `?`: the field is true.
    Truth(F),
    /// `==`, `<`, `<=`, `>`, `>=`.
    Compare(F, Comparison, Literal),
    /// `=~`.
    Regex(F, Pattern),
    /// `=[]`: the list field holds the value.
    Contains(F, Literal),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Comparison {
    pub fn holds(self, ordering: Ordering) -> bool {
        match self {
            Comparison::Eq => ordering == Ordering::Equal,
            Comparison::Lt => ordering == Ordering::Less,
            Comparison::Le => ordering != Ordering::Greater,
            Comparison::Gt => ordering == Ordering::Greater,
            Comparison::Ge => ordering != Ordering::Less,
        }
    }
}

/// The value a leaf compares with: a text or an integer (Ganeti's
/// `FilterValue`; a filter holds no booleans, floats or lists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Literal {
    Text(String),
    Integer(i128),
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Text(text) => write!(f, "{}", Datum::Text(text.clone())),
            Literal::Integer(number) => write!(f, "{number}"),
        }
    }
}

/// A compiled regular expression and the text it was compiled from.
#[derive(Clone, Debug)]
pub struct Pattern {
    source: String,
    regex: regex::Regex,
}

impl Pattern {
    /// Compiles `source`; a pattern whose compiled form would exceed
    /// `size_bytes_max` is refused (the regex crate's size limit).
    pub fn new(source: &str, size_bytes_max: usize) -> Result<Pattern, regex::Error> {
        let regex = regex::RegexBuilder::new(source)
            .size_limit(size_bytes_max)
            .dfa_size_limit(size_bytes_max)
            .build()?;
        Ok(Pattern {
            source: source.to_owned(),
            regex,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }
}

/// A field's value as a filter sees it. Rows convert their own values
/// (a timestamp field, for instance, is compared by its seconds).
#[derive(Clone, Debug, PartialEq)]
pub enum Datum {
    Null,
    Bool(bool),
    Integer(i128),
    Float(f64),
    Text(String),
    List(Vec<Datum>),
    Map(Vec<(String, Datum)>),
}

impl fmt::Display for Datum {
    /// JSON-like, for error messages meant for people.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Datum::Null => write!(f, "null"),
            Datum::Bool(value) => write!(f, "{value}"),
            Datum::Integer(value) => write!(f, "{value}"),
            Datum::Float(value) => write!(f, "{value}"),
            Datum::Text(text) => {
                f.write_str("\"")?;
                for c in text.chars() {
                    match c {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        '\n' => f.write_str("\\n")?,
                        c if u32::from(c) < 0x20 => write!(f, "\\u{:04x}", u32::from(c))?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("\"")
            }
            Datum::List(items) => {
                f.write_str("[")?;
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Datum::Map(entries) => {
                f.write_str("{")?;
                for (index, (key, value)) in entries.iter().enumerate() {
                    if index > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{}: {value}", Datum::Text(key.clone()))?;
                }
                f.write_str("}")
            }
        }
    }
}

/// Why a filter could not be evaluated on a row: the filter asks
/// something of a field that its value cannot answer.
#[derive(Clone, Debug, PartialEq)]
pub enum EvalError {
    /// `?` of a value that is not a boolean.
    NotBoolean(Datum),
    /// A comparison of a value with a literal of another type.
    Incomparable { value: Datum, literal: Literal },
    /// `=~` on a value that is not a text.
    RegexOnNonText(Datum),
    /// `=[]` on a value that is not a list of the literal's type.
    NotAList { value: Datum, literal: Literal },
}

impl fmt::Display for EvalError {
    /// Ganeti's texts for these errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvalError::NotBoolean(value) => {
                write!(f, "Unexpected value '{value}' in boolean context")
            }
            EvalError::Incomparable { value, literal } => write!(
                f,
                "Invalid types in comparison, trying to compare {value} with '{literal}'"
            ),
            EvalError::RegexOnNonText(value) => write!(
                f,
                "Invalid field value used in regexp matching, expecting string but got '{value}'"
            ),
            EvalError::NotAList { value, literal } => {
                let wanted = match literal {
                    Literal::Text(_) => "a list of strings",
                    Literal::Integer(_) => "a list of integers",
                };
                write!(
                    f,
                    "Cannot convert value '{value}', error: expected {wanted}"
                )
            }
        }
    }
}

/// A row a filter is evaluated against: the value of a field, or `None`
/// when the row has no normal value for it (unavailable, unknown).
pub trait Row<F> {
    fn value(&self, field: &F) -> Option<Datum>;
}

impl<F, T: Fn(&F) -> Option<Datum>> Row<F> for T {
    fn value(&self, field: &F) -> Option<Datum> {
        self(field)
    }
}

impl<F> Filter<F> {
    /// Whether `row` passes: see the module documentation.
    pub fn matches(&self, row: &impl Row<F>) -> Result<bool, EvalError> {
        match self {
            Filter::All => Ok(true),
            Filter::And(operands) => {
                for operand in operands {
                    if !operand.matches(row)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Filter::Or(operands) => {
                for operand in operands {
                    if operand.matches(row)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Filter::Not(operand) => operand.matches(row).map(|matched| !matched),
            Filter::Truth(field) => match row.value(field) {
                None => Ok(true),
                Some(Datum::Bool(value)) => Ok(value),
                Some(other) => Err(EvalError::NotBoolean(other)),
            },
            Filter::Compare(field, comparison, literal) => match row.value(field) {
                None => Ok(true),
                Some(value) => match order(&value, literal) {
                    Some(ordering) => Ok(comparison.holds(ordering)),
                    None => Err(EvalError::Incomparable {
                        value,
                        literal: literal.clone(),
                    }),
                },
            },
            Filter::Regex(field, pattern) => match row.value(field) {
                None => Ok(true),
                Some(Datum::Text(text)) => Ok(pattern.is_match(&text)),
                Some(other) => Err(EvalError::RegexOnNonText(other)),
            },
            Filter::Contains(field, literal) => match row.value(field) {
                None => Ok(true),
                Some(value) => contains(&value, literal).ok_or_else(|| EvalError::NotAList {
                    value,
                    literal: literal.clone(),
                }),
            },
        }
    }

    /// The same filter over other fields: `lookup` resolves each name (and
    /// may refuse one, which refuses the filter).
    pub fn compile<G, E>(self, lookup: &mut impl FnMut(F) -> Result<G, E>) -> Result<Filter<G>, E> {
        Ok(match self {
            Filter::All => Filter::All,
            Filter::And(operands) => Filter::And(
                operands
                    .into_iter()
                    .map(|operand| operand.compile(lookup))
                    .collect::<Result<_, _>>()?,
            ),
            Filter::Or(operands) => Filter::Or(
                operands
                    .into_iter()
                    .map(|operand| operand.compile(lookup))
                    .collect::<Result<_, _>>()?,
            ),
            Filter::Not(operand) => Filter::Not(Box::new(operand.compile(lookup)?)),
            Filter::Truth(field) => Filter::Truth(lookup(field)?),
            Filter::Compare(field, comparison, literal) => {
                Filter::Compare(lookup(field)?, comparison, literal)
            }
            Filter::Regex(field, pattern) => Filter::Regex(lookup(field)?, pattern),
            Filter::Contains(field, literal) => Filter::Contains(lookup(field)?, literal),
        })
    }

    /// Every field the filter names, in order, repeats included.
    pub fn fields(&self) -> Vec<&F> {
        let mut fields = Vec::new();
        self.collect_fields(&mut fields);
        fields
    }

    fn collect_fields<'a>(&'a self, into: &mut Vec<&'a F>) {
        match self {
            Filter::All => {}
            Filter::And(operands) | Filter::Or(operands) => {
                for operand in operands {
                    operand.collect_fields(into);
                }
            }
            Filter::Not(operand) => operand.collect_fields(into),
            Filter::Truth(field)
            | Filter::Compare(field, _, _)
            | Filter::Regex(field, _)
            | Filter::Contains(field, _) => into.push(field),
        }
    }

    /// The values asked for when the filter only asks for names: no
    /// filter (`Some` of nothing), `name == v`, or an `|` of such filters
    /// (Ganeti's `requestedNames`); anything else is `None`.
    pub fn requested_names(&self, is_name: &impl Fn(&F) -> bool) -> Option<Vec<&Literal>> {
        match self {
            Filter::All => Some(Vec::new()),
            Filter::Or(operands) => {
                let mut names = Vec::new();
                for operand in operands {
                    names.extend(operand.requested_names(is_name)?);
                }
                Some(names)
            }
            Filter::Compare(field, Comparison::Eq, literal) if is_name(field) => {
                Some(vec![literal])
            }
            _ => None,
        }
    }

    /// How many operators and leaves the filter has.
    pub fn node_count(&self) -> usize {
        match self {
            Filter::All => 1,
            Filter::And(operands) | Filter::Or(operands) => {
                1 + operands.iter().map(Filter::node_count).sum::<usize>()
            }
            Filter::Not(operand) => 1 + operand.node_count(),
            _ => 1,
        }
    }
}

/// The order of `value` against `literal`, if they are comparable.
fn order(value: &Datum, literal: &Literal) -> Option<Ordering> {
    match (value, literal) {
        (Datum::Text(text), Literal::Text(other)) => Some(text.as_str().cmp(other.as_str())),
        (Datum::Integer(number), Literal::Integer(other)) => Some(number.cmp(other)),
        (Datum::Float(number), Literal::Integer(other)) => Some(float_order(*number, *other)),
        _ => None,
    }
}

/// Exact order of a float and an integer (no rounding of large
/// integers).
fn float_order(number: f64, integer: i128) -> Ordering {
    // Every float at or beyond 2^53 in size is integral, and every i128
    // is within the range of f64.
    let approximate = number.partial_cmp(&(integer as f64));
    match approximate {
        Some(Ordering::Equal) if number.abs() >= 2f64.powi(53) => {
            if number >= 2f64.powi(127) {
                Ordering::Greater
            } else if number < -(2f64.powi(127)) {
                Ordering::Less
            } else {
                (number as i128).cmp(&integer)
            }
        }
        Some(ordering) => ordering,
        // NaN cannot come from JSON; order it last.
        None => Ordering::Greater,
    }
}

/// Whether the list `value` holds `literal`; `None` if `value` is not a
/// list of the literal's type.
fn contains(value: &Datum, literal: &Literal) -> Option<bool> {
    let Datum::List(items) = value else {
        return None;
    };
    let mut found = false;
    for item in items {
        let equal = match (item, literal) {
            (Datum::Text(text), Literal::Text(wanted)) => text == wanted,
            (Datum::Integer(number), Literal::Integer(wanted)) => number == wanted,
            (Datum::Float(number), Literal::Integer(wanted)) if number.fract() == 0.0 => {
                float_order(*number, *wanted) == Ordering::Equal
            }
            _ => return None,
        };
        found |= equal;
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    type F = Filter<&'static str>;

    fn text(value: &str) -> Literal {
        Literal::Text(value.to_owned())
    }

    fn cmp(field: &'static str, comparison: Comparison, literal: Literal) -> F {
        Filter::Compare(field, comparison, literal)
    }

    /// A job-like row: `id` 7, `status` "running", `archived` false,
    /// `summary` a list of texts, `oppriority` a list of integers,
    /// `start_ts` unknown, `ratio` a float.
    fn row(field: &&'static str) -> Option<Datum> {
        match *field {
            "id" => Some(Datum::Integer(7)),
            "status" => Some(Datum::Text("running".into())),
            "archived" => Some(Datum::Bool(false)),
            "summary" => Some(Datum::List(vec![
                Datum::Text("TEST_DELAY(0.5)".into()),
                Datum::Text("EXEC(/bin/true)".into()),
            ])),
            "oppriority" => Some(Datum::List(vec![Datum::Integer(0), Datum::Integer(10)])),
            "ratio" => Some(Datum::Float(2.5)),
            "ops" => Some(Datum::List(vec![Datum::Map(vec![(
                "OP_ID".into(),
                Datum::Text("OP_EXEC".into()),
            )])])),
            _ => None,
        }
    }

    fn eval(filter: &F) -> Result<bool, EvalError> {
        filter.matches(&row)
    }

    #[test]
    fn comparisons_of_integers_and_texts() {
        use Comparison::*;
        let cases = [
            (cmp("id", Eq, Literal::Integer(7)), true),
            (cmp("id", Eq, Literal::Integer(8)), false),
            (cmp("id", Lt, Literal::Integer(8)), true),
            (cmp("id", Lt, Literal::Integer(7)), false),
            (cmp("id", Le, Literal::Integer(7)), true),
            (cmp("id", Gt, Literal::Integer(6)), true),
            (cmp("id", Gt, Literal::Integer(7)), false),
            (cmp("id", Ge, Literal::Integer(7)), true),
            (cmp("id", Ge, Literal::Integer(8)), false),
            (cmp("status", Eq, text("running")), true),
            (cmp("status", Eq, text("queued")), false),
            (cmp("status", Lt, text("s")), true),
            (cmp("status", Gt, text("s")), false),
            (cmp("status", Ge, text("running")), true),
            (cmp("ratio", Gt, Literal::Integer(2)), true),
            (cmp("ratio", Lt, Literal::Integer(3)), true),
            (cmp("ratio", Eq, Literal::Integer(2)), false),
        ];
        for (filter, expected) in cases {
            assert_eq!(eval(&filter), Ok(expected), "{filter:?}");
        }
    }

    #[test]
    fn comparing_across_types_is_an_error() {
        let error = eval(&cmp("status", Comparison::Eq, Literal::Integer(3))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "Invalid types in comparison, trying to compare \"running\" with '3'"
        );
        assert!(matches!(
            eval(&cmp("id", Comparison::Lt, text("7"))),
            Err(EvalError::Incomparable { .. })
        ));
        // Booleans and lists compare with nothing.
        assert!(eval(&cmp("archived", Comparison::Eq, Literal::Integer(0))).is_err());
        assert!(eval(&cmp("summary", Comparison::Eq, text("x"))).is_err());
    }

    #[test]
    fn truth_of_booleans_only() {
        assert_eq!(eval(&Filter::Truth("archived")), Ok(false));
        let error = eval(&Filter::Truth("status")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "Unexpected value '\"running\"' in boolean context"
        );
        assert!(matches!(
            eval(&Filter::Truth("id")),
            Err(EvalError::NotBoolean(Datum::Integer(7)))
        ));
    }

    #[test]
    fn regexp_searches_texts_unanchored() {
        let pattern = |source: &str| Pattern::new(source, 1 << 20).expect("valid");
        assert_eq!(eval(&Filter::Regex("status", pattern("unn"))), Ok(true));
        assert_eq!(eval(&Filter::Regex("status", pattern("^run"))), Ok(true));
        assert_eq!(eval(&Filter::Regex("status", pattern("^unn"))), Ok(false));
        assert_eq!(
            eval(&Filter::Regex("status", pattern("(?i)RUNNING"))),
            Ok(true)
        );
        assert_eq!(
            eval(&Filter::Regex("status", pattern("RUNNING"))),
            Ok(false)
        );
        let error = eval(&Filter::Regex("id", pattern("7"))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "Invalid field value used in regexp matching, expecting string but got '7'"
        );
        assert!(eval(&Filter::Regex("summary", pattern("x"))).is_err());
    }

    #[test]
    fn patterns_over_the_size_limit_are_refused() {
        assert!(Pattern::new("a{1000}{1000}", 1 << 20).is_err());
        assert!(Pattern::new("(", 1 << 20).is_err());
        assert_eq!(Pattern::new("a+", 1 << 20).expect("valid").source(), "a+");
    }

    #[test]
    fn contains_looks_into_lists_of_the_literals_type() {
        let contains = |field, literal| eval(&Filter::Contains(field, literal));
        assert_eq!(contains("summary", text("EXEC(/bin/true)")), Ok(true));
        assert_eq!(contains("summary", text("EXEC")), Ok(false));
        assert_eq!(contains("oppriority", Literal::Integer(10)), Ok(true));
        assert_eq!(contains("oppriority", Literal::Integer(-10)), Ok(false));
        // A list of texts holds no integers, and the other way round.
        assert!(contains("summary", Literal::Integer(1)).is_err());
        assert!(contains("oppriority", text("0")).is_err());
        // Not a list at all, or a list of something else.
        let error = contains("status", text("r")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "Cannot convert value '\"running\"', error: expected a list of strings"
        );
        assert!(contains("ops", text("OP_EXEC")).is_err());
    }

    #[test]
    fn unknown_values_satisfy_every_leaf() {
        let pattern = Pattern::new("x", 1 << 20).expect("valid");
        for filter in [
            Filter::Truth("start_ts"),
            cmp("start_ts", Comparison::Eq, Literal::Integer(1)),
            cmp("start_ts", Comparison::Lt, text("x")),
            Filter::Regex("start_ts", pattern),
            Filter::Contains("start_ts", text("x")),
        ] {
            assert_eq!(eval(&filter), Ok(true), "{filter:?}");
            assert_eq!(eval(&Filter::Not(Box::new(filter))), Ok(false));
        }
    }

    #[test]
    fn logic_short_circuits_left_to_right() {
        let bad = || Filter::Truth("status");
        let yes = || cmp("id", Comparison::Eq, Literal::Integer(7));
        let no = || cmp("id", Comparison::Eq, Literal::Integer(8));
        assert_eq!(eval(&Filter::All), Ok(true));
        assert_eq!(eval(&Filter::And(vec![])), Ok(true));
        assert_eq!(eval(&Filter::Or(vec![])), Ok(false));
        assert_eq!(eval(&Filter::And(vec![yes(), yes()])), Ok(true));
        assert_eq!(eval(&Filter::And(vec![yes(), no()])), Ok(false));
        assert_eq!(eval(&Filter::Or(vec![no(), yes()])), Ok(true));
        assert_eq!(eval(&Filter::Or(vec![no(), no()])), Ok(false));
        // The deciding operand stops the evaluation before a bad one ...
        assert_eq!(eval(&Filter::And(vec![no(), bad()])), Ok(false));
        assert_eq!(eval(&Filter::Or(vec![yes(), bad()])), Ok(true));
        // ... and a bad one reached fails the whole filter.
        assert!(eval(&Filter::And(vec![yes(), bad()])).is_err());
        assert!(eval(&Filter::Or(vec![no(), bad()])).is_err());
        assert!(eval(&Filter::Not(Box::new(bad()))).is_err());
        // Nesting.
        let nested = Filter::Not(Box::new(Filter::And(vec![
            Filter::Or(vec![no(), Filter::Not(Box::new(no()))]),
            Filter::Not(Box::new(Filter::Truth("archived"))),
        ])));
        assert_eq!(eval(&nested), Ok(false));
        assert_eq!(nested.node_count(), 8);
    }

    #[test]
    fn compile_resolves_or_refuses_every_field() {
        let filter = Filter::And(vec![
            cmp("id", Comparison::Eq, Literal::Integer(1)),
            Filter::Not(Box::new(Filter::Truth("archived"))),
        ]);
        assert_eq!(filter.fields(), [&"id", &"archived"]);
        let compiled = filter
            .clone()
            .compile(&mut |name: &str| Ok::<usize, String>(name.len()))
            .expect("known");
        assert_eq!(compiled.fields(), [&2, &8]);
        let refused = filter.compile(&mut |name: &str| {
            if name == "archived" {
                Err(format!("Can't find field named '{name}'"))
            } else {
                Ok(name.len())
            }
        });
        assert_eq!(refused.unwrap_err(), "Can't find field named 'archived'");
    }

    #[test]
    fn requested_names_only_for_ors_of_name_equalities() {
        let is_id = |field: &&'static str| *field == "id";
        let id = |n| cmp("id", Comparison::Eq, Literal::Integer(n));
        assert_eq!(F::All.requested_names(&is_id), Some(vec![]));
        assert_eq!(
            id(3).requested_names(&is_id),
            Some(vec![&Literal::Integer(3)])
        );
        let or = Filter::Or(vec![id(3), Filter::Or(vec![id(1)]), id(3)]);
        assert_eq!(
            or.requested_names(&is_id),
            Some(vec![
                &Literal::Integer(3),
                &Literal::Integer(1),
                &Literal::Integer(3)
            ])
        );
        for other in [
            Filter::And(vec![id(3)]),
            Filter::Or(vec![id(3), cmp("status", Comparison::Eq, text("x"))]),
            cmp("id", Comparison::Lt, Literal::Integer(3)),
            Filter::Not(Box::new(id(3))),
        ] {
            assert_eq!(other.requested_names(&is_id), None, "{other:?}");
        }
    }

    #[test]
    fn floats_and_huge_integers_compare_exactly() {
        assert_eq!(
            float_order(9007199254740993.0, 9007199254740992),
            Ordering::Equal
        );
        assert_eq!(float_order(1e300, i128::MAX), Ordering::Greater);
        assert_eq!(float_order(-1e300, i128::MIN), Ordering::Less);
        assert_eq!(float_order(0.5, 0), Ordering::Greater);
        assert_eq!(float_order(-0.5, 0), Ordering::Less);
    }
}
