//! LUXI's generic `Query` and `QueryFields` (Ganeti's "query2"): the
//! filter language ([`filter`], pure, shared with job filters), the shape
//! of an answer (field definitions, result statuses) and the `job`
//! resource ([`jobs`]: its fields and the query over luxid's queue), and
//! the `filter` resource ([`filters`]: the job filter rules).
//! Decoding requests and filters from JSON and encoding answers is
//! `protocol::query`'s.

pub mod filter;
pub mod filters;
pub mod jobs;

use std::borrow::Cow;

use serde_json::Value;

use crate::protocol::WireError;
use crate::protocol::query as wire;
use crate::scheduling::filters::FilterRule;

/// The kind of a field (Ganeti's `QFT_*`), which tells clients how to
/// format it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    Unknown,
    Text,
    Bool,
    Number,
    Float,
    Unit,
    Timestamp,
    Other,
}

impl FieldKind {
    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::Unknown => "unknown",
            FieldKind::Text => "text",
            FieldKind::Bool => "bool",
            FieldKind::Number => "number",
            FieldKind::Float => "float",
            FieldKind::Unit => "unit",
            FieldKind::Timestamp => "timestamp",
            FieldKind::Other => "other",
        }
    }
}

/// The status of one value of a result row (Ganeti's `RS_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultStatus {
    Normal,
    /// The field does not exist.
    Unknown,
    /// No data was collected for it.
    NoData,
    /// The item has no such value (a job that does not exist, a job not
    /// started has no start time).
    Unavailable,
    Offline,
}

impl ResultStatus {
    /// The code on the wire.
    pub fn code(self) -> u8 {
        match self {
            ResultStatus::Normal => 0,
            ResultStatus::Unknown => 1,
            ResultStatus::NoData => 2,
            ResultStatus::Unavailable => 3,
            ResultStatus::Offline => 4,
        }
    }
}

/// A field's definition as `Query` and `QueryFields` answer it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDef {
    pub name: Cow<'static, str>,
    pub title: Cow<'static, str>,
    pub kind: FieldKind,
    pub doc: Cow<'static, str>,
}

impl FieldDef {
    /// The definition Ganeti gives a field it does not know: its name as
    /// its title, kind `unknown`.
    pub fn unknown(name: &str) -> FieldDef {
        FieldDef {
            name: Cow::Owned(name.to_owned()),
            title: Cow::Owned(name.to_owned()),
            kind: FieldKind::Unknown,
            doc: Cow::Owned(format!("Unknown field '{name}'")),
        }
    }
}

/// `Query([what, fields, filter])` for luxid: the request decoded, run
/// against its jobs or its filter rules, the answer encoded.
pub fn luxi_query(
    args: &[Value],
    jobs: &impl jobs::JobSource,
    rules: &[FilterRule],
    answer_bytes_max: usize,
) -> Result<Value, WireError> {
    let request = wire::decode_query(args)?;
    let answer = match request.resource {
        wire::Resource::Job => jobs::query(&request.fields, request.filter, jobs, answer_bytes_max),
        wire::Resource::Filter => filters::query(&request.fields, request.filter, rules),
    }
    .map_err(wire::query_error)?;
    Ok(wire::encode_answer(&answer))
}

/// `QueryFields([what, fields or null])` for luxid.
pub fn luxi_query_fields(args: &[Value]) -> Result<Value, WireError> {
    let (resource, fields) = wire::decode_query_fields(args)?;
    let defs = match resource {
        wire::Resource::Job => jobs::field_defs(&fields),
        wire::Resource::Filter => filters::field_defs(&fields),
    };
    Ok(wire::encode_field_defs(&defs))
}
