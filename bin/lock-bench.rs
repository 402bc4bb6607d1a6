//! lock-bench: throughput and scaling of the in-process lock core
//! ([`warden::locks::LockManager`]), against the targets recorded in
//! design/PERFORMANCE.md.
//!
//! ```text
//! cargo run --release --bin lock-bench [single|scale|drain] [--runs N] [--quick]
//! ```
//!
//! The scenarios, what they measure and how: `warden::bench::lock`.

#![deny(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    warden::bench::lock::main()
}
