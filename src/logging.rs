//! Logging of the daemons: `tracing` to stderr, filtered by `WARDEN_LOG`
//! (for example `debug`, or `warden=debug`; default `info`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Environment variable holding the log filter.
pub const LOG_FILTER_VARIABLE: &str = "WARDEN_LOG";

pub fn init() {
    let filter =
        EnvFilter::try_from_env(LOG_FILTER_VARIABLE).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
