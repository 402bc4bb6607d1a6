//! The `job` resource of `Query` and `QueryFields`: its fields with
//! Ganeti 3.0's titles, kinds and descriptions, and the query itself over
//! luxid's queue, as Ganeti's luxid answers it:
//! - a filter that only asks for ids (`["=", "id", 3]`, or an `|` of
//!   such filters) names the jobs to look at, in its order, each
//!   looked for in the queue and then in the archive, whatever the fields;
//!   a job found in neither has its id and every other value
//!   `unavailable`;
//! - any other filter looks at every job of the queue, in id order, and
//!   at the archived ones too when the field list asks for `archived`;
//! - an unknown field asked for is answered with status `unknown` and a
//!   definition of kind `unknown`; an unknown field inside the filter
//!   refuses the query.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use serde_json::Value;

use super::filter::{Datum, EvalError, Filter, Literal};
use super::{FieldDef, FieldKind, ResultStatus};
use crate::jobs::{FIELDS, Job, JobId};
use crate::protocol::query as wire;
use crate::queue::{FinishedJob, Queue};

/// A job field's definition.
pub struct JobField {
    pub name: &'static str,
    pub title: &'static str,
    pub kind: FieldKind,
    pub doc: &'static str,
}

const fn field(
    name: &'static str,
    title: &'static str,
    kind: FieldKind,
    doc: &'static str,
) -> JobField {
    JobField {
        name,
        title,
        kind,
        doc,
    }
}

/// Every job field, in Ganeti's order (`Ganeti.Query.Job`): exactly
/// Ganeti's, so that `gnt-job list-fields` and `Query` clients see what
/// they know (warden's `workers` is QueryJobs' alone).
pub const JOB_FIELDS: [JobField; 16] = [
    field("id", "ID", FieldKind::Number, "Job ID"),
    field("status", "Status", FieldKind::Text, "Job status"),
    field(
        "priority",
        "Priority",
        FieldKind::Number,
        "Current job priority (19 to -20)",
    ),
    field(
        "archived",
        "Archived",
        FieldKind::Bool,
        "Whether job is archived",
    ),
    field("ops", "OpCodes", FieldKind::Other, "List of all opcodes"),
    field(
        "opresult",
        "OpCode_result",
        FieldKind::Other,
        "List of opcodes results",
    ),
    field(
        "opstatus",
        "OpCode_status",
        FieldKind::Other,
        "List of opcodes status",
    ),
    field(
        "oplog",
        "OpCode_log",
        FieldKind::Other,
        "List of opcode output logs",
    ),
    field(
        "opstart",
        "OpCode_start",
        FieldKind::Other,
        "List of opcode start timestamps (before acquiring locks)",
    ),
    field(
        "opexec",
        "OpCode_exec",
        FieldKind::Other,
        "List of opcode execution start timestamps (after acquiring locks)",
    ),
    field(
        "opend",
        "OpCode_end",
        FieldKind::Other,
        "List of opcode execution end timestamps",
    ),
    field(
        "oppriority",
        "OpCode_prio",
        FieldKind::Other,
        "List of opcode priorities",
    ),
    field(
        "summary",
        "Summary",
        FieldKind::Other,
        "List of per-opcode summaries",
    ),
    field(
        "received_ts",
        "Received",
        FieldKind::Other,
        "Timestamp of when job was received (tuple containing seconds and microseconds)",
    ),
    field(
        "start_ts",
        "Start",
        FieldKind::Other,
        "Timestamp of job start (tuple containing seconds and microseconds)",
    ),
    field(
        "end_ts",
        "End",
        FieldKind::Other,
        "Timestamp of job end (tuple containing seconds and microseconds)",
    ),
];

/// The field that names a job.
const ID: &str = "id";

/// A job field by name.
pub fn job_field(name: &str) -> Option<&'static JobField> {
    JOB_FIELDS.iter().find(|field| field.name == name)
}

impl JobField {
    pub fn def(&'static self) -> FieldDef {
        FieldDef {
            name: Cow::Borrowed(self.name),
            title: Cow::Borrowed(self.title),
            kind: self.kind,
            doc: Cow::Borrowed(self.doc),
        }
    }

    /// A job's timestamps are filtered by their seconds (Ganeti's
    /// `QffTimestamp`), and a job without one has no value for it.
    fn is_timestamp(&self) -> bool {
        matches!(self.name, "received_ts" | "start_ts" | "end_ts")
    }
}

/// The definitions `QueryFields` answers: the named fields in their
/// order (unknown ones of kind `unknown`), or every field sorted by name
/// when none is named.
pub fn field_defs(names: &[String]) -> Vec<FieldDef> {
    if names.is_empty() {
        let mut all: Vec<&'static JobField> = JOB_FIELDS.iter().collect();
        all.sort_by_key(|field| field.name);
        return all.into_iter().map(JobField::def).collect();
    }
    names
        .iter()
        .map(|name| match job_field(name) {
            Some(field) => field.def(),
            None => FieldDef::unknown(name),
        })
        .collect()
}

/// Where a query finds jobs.
pub trait JobSource {
    /// The ids of the queue's jobs, and of the archived ones when
    /// `archived`; ascending, each once.
    fn ids(&self, archived: bool) -> Vec<JobId>;
    /// A job (from the queue, else from the archive) and whether it is
    /// archived; `None` for no such job.
    fn load(&self, id: JobId) -> Option<(Cow<'_, Job>, bool)>;
}

/// luxid's queue as a [`JobSource`]: its unfinished jobs, its finished
/// ones (kept encoded) and the archive on disk.
pub struct QueueJobs<'a> {
    pub unfinished: &'a BTreeMap<JobId, Job>,
    pub finished: &'a BTreeMap<JobId, FinishedJob>,
    pub queue: &'a Queue,
}

impl JobSource for QueueJobs<'_> {
    fn ids(&self, archived: bool) -> Vec<JobId> {
        let mut ids: Vec<JobId> = self
            .unfinished
            .keys()
            .chain(self.finished.keys())
            .copied()
            .collect();
        if archived {
            ids.extend(self.queue.archived_ids());
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn load(&self, id: JobId) -> Option<(Cow<'_, Job>, bool)> {
        if let Some(job) = self.unfinished.get(&id) {
            return Some((Cow::Borrowed(job), false));
        }
        if let Some(job) = self.finished.get(&id) {
            return Some((Cow::Owned(job.job()), false));
        }
        // Above the serial no job was ever submitted: nothing to read.
        if id > self.queue.serial() {
            return None;
        }
        match self.queue.read_archived(id) {
            Ok(job) => job.map(|job| (Cow::Owned(job), true)),
            Err(error) => {
                // Answered as unavailable, never as a guess.
                tracing::error!(job = id, %error, "skipped an archived job file that cannot be read");
                None
            }
        }
    }
}

/// One value of a result row.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Normal(Value),
    Absent(ResultStatus),
}

/// A query's answer: the definitions of the fields asked for, and one row
/// per job that passed the filter.
#[derive(Debug)]
pub struct Answer {
    pub fields: Vec<FieldDef>,
    pub rows: Vec<Vec<Cell>>,
}

/// Why a job query was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum QueryError {
    /// An id in an ids-only filter that is no job id.
    BadJobId(String),
    /// The filter names a field jobs do not have.
    UnknownFilterField(String),
    /// The filter asks something of a value that cannot answer it.
    Eval(EvalError),
    /// The answer would not fit in a frame.
    TooLong { limit_bytes: usize },
}

/// A field of the query: a job field, or one that does not exist.
#[derive(Clone, Copy)]
enum Selected {
    Known(&'static JobField),
    Unknown,
}

/// Runs a job query: see the module documentation. Rows are counted as
/// they are made, and an answer longer than `answer_bytes_max` is refused
/// before it is built whole.
pub fn query(
    fields: &[String],
    filter: Filter<String>,
    source: &impl JobSource,
    answer_bytes_max: usize,
) -> Result<Answer, QueryError> {
    let ids = match requested_ids(&filter)? {
        Some(ids) => ids,
        None => source.ids(fields.iter().any(|name| name == "archived")),
    };
    let filter = filter.compile(&mut |name: String| {
        job_field(&name).ok_or(QueryError::UnknownFilterField(name))
    })?;
    let selected: Vec<Selected> = fields
        .iter()
        .map(|name| job_field(name).map_or(Selected::Unknown, Selected::Known))
        .collect();
    let defs = fields
        .iter()
        .zip(&selected)
        .map(|(name, selected)| match selected {
            Selected::Known(field) => field.def(),
            Selected::Unknown => FieldDef::unknown(name),
        })
        .collect();
    let mut rows = Vec::new();
    let mut answer_bytes = 0;
    for id in ids {
        let job = source.load(id);
        let job = job
            .as_ref()
            .map(|(job, archived)| (job.as_ref(), *archived));
        let passes = filter
            .matches(&|field: &&'static JobField| filter_value(field, id, job))
            .map_err(QueryError::Eval)?;
        if !passes {
            continue;
        }
        let row: Vec<Cell> = selected
            .iter()
            .map(|selected| match selected {
                Selected::Known(field) => cell(field, id, job),
                Selected::Unknown => Cell::Absent(ResultStatus::Unknown),
            })
            .collect();
        answer_bytes += wire::row_bytes(&row) + 1;
        if answer_bytes > answer_bytes_max {
            return Err(QueryError::TooLong {
                limit_bytes: answer_bytes_max,
            });
        }
        rows.push(row);
    }
    Ok(Answer { fields: defs, rows })
}

/// The ids an ids-only filter asks for, each once, in its order; `None`
/// for any other filter, or no filter.
fn requested_ids(filter: &Filter<String>) -> Result<Option<Vec<JobId>>, QueryError> {
    let Some(literals) = filter.requested_names(&|field: &String| field == ID) else {
        return Ok(None);
    };
    if literals.is_empty() {
        return Ok(None);
    }
    let mut seen = HashSet::new();
    let mut ids = Vec::with_capacity(literals.len());
    for literal in literals {
        let id = match literal {
            Literal::Integer(number) => u64::try_from(*number).map_err(|_| {
                QueryError::BadJobId(format!("Invalid value for job ID ' {number}'"))
            })?,
            Literal::Text(text) => text
                .trim()
                .parse::<u64>()
                .map_err(|_| QueryError::BadJobId(format!("Cannot parse job id: '{}'", text)))?,
        };
        if seen.insert(id) {
            ids.push(id);
        }
    }
    Ok(Some(ids))
}

/// A field's value in a result row.
fn cell(field: &JobField, id: JobId, job: Option<(&Job, bool)>) -> Cell {
    if field.name == ID {
        return Cell::Normal(Value::from(id));
    }
    let Some((job, archived)) = job else {
        return Cell::Absent(ResultStatus::Unavailable);
    };
    match job.field(field.name, archived) {
        Some(Value::Null) if field.is_timestamp() => Cell::Absent(ResultStatus::Unavailable),
        Some(value) => Cell::Normal(value),
        None => {
            debug_assert!(false, "every job field has a value: {}", field.name);
            Cell::Absent(ResultStatus::Unavailable)
        }
    }
}

/// A field's value as the filter sees it: `None` where the row has no
/// normal value; a timestamp by its seconds.
fn filter_value(field: &JobField, id: JobId, job: Option<(&Job, bool)>) -> Option<Datum> {
    match cell(field, id, job) {
        Cell::Absent(_) => None,
        Cell::Normal(value) if field.is_timestamp() => value
            .get(0)
            .and_then(Value::as_u64)
            .map(|secs| Datum::Integer(i128::from(secs))),
        Cell::Normal(value) => Some(wire::datum(&value)),
    }
}

// The job model knows this table's fields and QueryJobs' `workers`.
const _: () = assert!(FIELDS.len() == JOB_FIELDS.len() + 1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{QueuedOpcode, Status, Timestamp};
    use crate::query::filter::{Comparison, Pattern};
    use serde_json::json;

    /// Jobs by id, the archived ones flagged.
    struct Jobs(BTreeMap<JobId, (Job, bool)>);

    impl JobSource for Jobs {
        fn ids(&self, archived: bool) -> Vec<JobId> {
            self.0
                .iter()
                .filter(|(_, (_, is_archived))| archived || !is_archived)
                .map(|(id, _)| *id)
                .collect()
        }
        fn load(&self, id: JobId) -> Option<(Cow<'_, Job>, bool)> {
            self.0
                .get(&id)
                .map(|(job, archived)| (Cow::Borrowed(job), *archived))
        }
    }

    fn job(id: JobId, status: Status, started: Option<u64>) -> Job {
        let mut op = QueuedOpcode::new(json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.5}), 0);
        op.status = status;
        Job {
            id,
            ops: vec![op],
            received_timestamp: Some(Timestamp(100, 5)),
            start_timestamp: started.map(|secs| Timestamp(secs, 0)),
            end_timestamp: None,
            livelock: None,
            process_id: None,
            workers: Vec::new(),
        }
    }

    fn jobs() -> Jobs {
        Jobs(BTreeMap::from([
            (1, (job(1, Status::Success, Some(110)), true)),
            (2, (job(2, Status::Running, Some(120)), false)),
            (3, (job(3, Status::Queued, None), false)),
        ]))
    }

    fn names(fields: &[&str]) -> Vec<String> {
        fields.iter().map(|name| (*name).to_owned()).collect()
    }

    fn ids_of(answer: &Answer) -> Vec<Cell> {
        answer.rows.iter().map(|row| row[0].clone()).collect()
    }

    fn id_cells(ids: &[u64]) -> Vec<Cell> {
        ids.iter().map(|id| Cell::Normal(json!(id))).collect()
    }

    fn eq(field: &str, literal: Literal) -> Filter<String> {
        Filter::Compare(field.to_owned(), Comparison::Eq, literal)
    }

    #[test]
    fn all_jobs_of_the_queue_and_the_archive_only_with_archived() {
        let answer = query(&names(&["id", "status"]), Filter::All, &jobs(), 1 << 20).expect("ok");
        assert_eq!(ids_of(&answer), id_cells(&[2, 3]));
        assert_eq!(answer.rows[0][1], Cell::Normal(json!("running")));
        let answer = query(&names(&["id", "archived"]), Filter::All, &jobs(), 1 << 20).expect("ok");
        assert_eq!(ids_of(&answer), id_cells(&[1, 2, 3]));
        assert_eq!(answer.rows[0][1], Cell::Normal(json!(true)));
        // A filter naming "archived" does not open the archive.
        let answer = query(
            &names(&["id"]),
            Filter::Truth("archived".into()),
            &jobs(),
            1 << 20,
        )
        .expect("ok");
        assert_eq!(ids_of(&answer), id_cells(&[]));
    }

    #[test]
    fn requested_ids_are_looked_up_in_order_archived_or_missing() {
        let filter = Filter::Or(vec![
            eq("id", Literal::Integer(9)),
            eq("id", Literal::Integer(1)),
            eq("id", Literal::Integer(3)),
            eq("id", Literal::Integer(1)),
        ]);
        let answer = query(
            &names(&["id", "status", "start_ts"]),
            filter,
            &jobs(),
            1 << 20,
        )
        .expect("ok");
        assert_eq!(ids_of(&answer), id_cells(&[9, 1, 3]));
        assert_eq!(
            answer.rows[0][1..],
            [
                Cell::Absent(ResultStatus::Unavailable),
                Cell::Absent(ResultStatus::Unavailable)
            ]
        );
        assert_eq!(answer.rows[1][1], Cell::Normal(json!("success")));
        // A job not started has no start time.
        assert_eq!(answer.rows[2][2], Cell::Absent(ResultStatus::Unavailable));
        for (literal, message) in [
            (Literal::Integer(-1), "Invalid value for job ID ' -1'"),
            (Literal::Text("x".into()), "Cannot parse job id: 'x'"),
        ] {
            let error = query(&names(&["id"]), eq("id", literal), &jobs(), 1 << 20).unwrap_err();
            assert_eq!(error, QueryError::BadJobId(message.into()));
        }
        // A text that is an id names the job, which the filter then
        // compares with a number: an error, as in Ganeti.
        let error = query(
            &names(&["id"]),
            eq("id", Literal::Text("3".into())),
            &jobs(),
            1 << 20,
        )
        .unwrap_err();
        assert!(matches!(
            error,
            QueryError::Eval(EvalError::Incomparable { .. })
        ));
    }

    #[test]
    fn unknown_fields_are_cells_but_refuse_a_filter() {
        let answer = query(&names(&["id", "nosuch"]), Filter::All, &jobs(), 1 << 20).expect("ok");
        assert_eq!(answer.fields[1], FieldDef::unknown("nosuch"));
        assert_eq!(answer.fields[1].doc, "Unknown field 'nosuch'");
        assert_eq!(answer.rows[0][1], Cell::Absent(ResultStatus::Unknown));
        let error = query(
            &names(&["id"]),
            Filter::Truth("nosuch".into()),
            &jobs(),
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(error, QueryError::UnknownFilterField("nosuch".into()));
    }

    #[test]
    fn filters_see_timestamps_by_their_seconds_and_skip_the_unknown() {
        let filter = Filter::Compare("start_ts".into(), Comparison::Ge, Literal::Integer(115));
        let answer = query(&names(&["id"]), filter, &jobs(), 1 << 20).expect("ok");
        // Job 3 has no start time: it passes, as in Ganeti.
        assert_eq!(ids_of(&answer), id_cells(&[2, 3]));
        let filter = Filter::And(vec![
            Filter::Regex("status".into(), Pattern::new("^r", 1 << 20).expect("valid")),
            Filter::Contains("summary".into(), Literal::Text("TEST_DELAY(0.5)".into())),
        ]);
        let answer = query(&names(&["id"]), filter, &jobs(), 1 << 20).expect("ok");
        assert_eq!(ids_of(&answer), id_cells(&[2]));
        let error = query(
            &names(&["id"]),
            eq("status", Literal::Integer(1)),
            &jobs(),
            1 << 20,
        )
        .unwrap_err();
        assert!(matches!(
            error,
            QueryError::Eval(EvalError::Incomparable { .. })
        ));
    }

    #[test]
    fn an_answer_longer_than_the_limit_is_refused() {
        let fields = names(&["id", "ops", "summary"]);
        let full = query(&fields, Filter::All, &jobs(), 1 << 20).expect("ok");
        let bytes: usize = full.rows.iter().map(|row| wire::row_bytes(row) + 1).sum();
        assert!(query(&fields, Filter::All, &jobs(), bytes).is_ok());
        assert_eq!(
            query(&fields, Filter::All, &jobs(), bytes - 1).unwrap_err(),
            QueryError::TooLong {
                limit_bytes: bytes - 1
            }
        );
    }

    #[test]
    fn field_definitions_all_sorted_or_as_named() {
        let all = field_defs(&[]);
        let all_names: Vec<&str> = all.iter().map(|def| def.name.as_ref()).collect();
        let mut sorted = all_names.clone();
        sorted.sort_unstable();
        assert_eq!(all_names, sorted);
        assert_eq!(all.len(), JOB_FIELDS.len());
        for name in FIELDS.iter().filter(|name| **name != "workers") {
            assert!(job_field(name).is_some(), "{name} has a definition");
        }
        assert!(job_field("workers").is_none(), "not Ganeti's");
        let named = field_defs(&names(&["status", "x"]));
        assert_eq!(named[0].title, "Status");
        assert_eq!(named[0].kind, FieldKind::Text);
        assert_eq!(named[1].kind, FieldKind::Unknown);
    }
}
