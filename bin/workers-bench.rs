//! workers-bench: the worker registry's matching, its durable calls and a
//! waiting job's start, against the targets recorded in
//! design/PERFORMANCE.md.
//!
//! ```text
//! cargo run --release --bin workers-bench [match|calls|start] [--runs N] [--quick]
//! ```
//!
//! The scenarios, what they measure and how: `warden::bench::workers`.

#![deny(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    warden::bench::workers::main()
}
