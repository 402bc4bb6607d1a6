//! wconfd: the lock and configuration daemon. Runs in the foreground,
//! logs to stderr, stops on SIGTERM or SIGINT.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// The lock and configuration daemon of warden.
#[derive(Parser)]
#[command(version)]
struct Options {
    /// Directory holding all state (socket/, locks.data, config.data, livelocks/).
    #[arg(long, env = "WARDEN_ROOT")]
    root: PathBuf,
}

fn main() -> ExitCode {
    let options = Options::parse();
    warden::logging::init();
    warden::daemon::exit_code("wconfd", warden::wconfd::run(&options.root))
}
