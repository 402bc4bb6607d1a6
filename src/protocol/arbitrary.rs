//! Arbitrary JSON values for the property tests of the decoders: mostly
//! the names and shapes the decoders look for (methods, opcode fields,
//! lock names, owners), so that generated values reach deep into them,
//! and anything else besides.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Strings a decoder may recognise, and some it must not.
const WORDS: [&str; 32] = [
    "",
    "x",
    "node/n1",
    "cluster/BGL",
    "instance/i1",
    "nodegroup/[lockset]",
    "cluster/config",
    "nodes/n1",
    "node",
    "shared",
    "exclusive",
    "release",
    "OP_ID",
    "OP_EXEC",
    "OP_TEST_DELAY",
    "argv",
    "duration",
    "priority",
    "depends",
    "reason",
    "env",
    "locks",
    "timeout",
    "on_nodes",
    "success",
    "/bin/true",
    "/r/livelocks/job_000001_1",
    "1",
    "-1",
    "\u{0}",
    "\u{3}",
    "é\u{fffd}",
];

/// A JSON leaf: numbers at the edges of every integer width, words the
/// decoders know, any string.
pub fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(-1),
            Just(10),
            Just(-10),
            Just(i64::MIN),
            Just(i64::MAX),
            Just(i64::from(i32::MAX) + 1),
            any::<i64>(),
        ]
        .prop_map(Value::from),
        prop_oneof![Just(u64::MAX), any::<u64>()].prop_map(Value::from),
        prop_oneof![
            Just(0.5f64),
            Just(-0.0),
            Just(1e300),
            Just(f64::MAX),
            any::<f64>()
        ]
        .prop_map(|number| serde_json::Number::from_f64(number).map_or(Value::Null, Value::Number)),
        proptest::sample::select(&WORDS[..]).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
}

/// Any JSON value up to a few levels deep.
pub fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(
                (
                    prop_oneof![
                        proptest::sample::select(&WORDS[..]).prop_map(String::from),
                        ".{0,6}"
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}
