//! luxid-bench: the real luxid, wconfd and job runners over LUXI, against
//! the targets of design/PERFORMANCE.md.
//!
//! ```text
//! cargo build --release --bins
//! target/release/luxid-bench [throughput|latency|restart|events] [--runs N] [--quick] [--dir DIR]
//!                            [--runner PATH] [--reporter]
//! ```
//!
//! The scenarios, what they measure and how: `warden::bench::luxid`.

#![deny(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    warden::bench::luxid::main()
}
