//! wconfd-bench: the real wconfd over its socket, against the targets of
//! design/PERFORMANCE.md.
//!
//! ```text
//! cargo build --release --bins
//! target/release/wconfd-bench [throughput|latency|scale|death|events|reporter] [--runs N] [--quick]
//!                             [--dir DIR] [--reporter]
//! ```
//!
//! The scenarios, what they measure and how: `warden::bench::wconfd`.

#![deny(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    warden::bench::wconfd::main()
}
