//! luxid: the job queue daemon. Runs in the foreground, logs to stderr,
//! stops on SIGTERM or SIGINT (running jobs go on; the next luxid adopts
//! them). Needs a wconfd on the same root.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// The job queue daemon of warden.
#[derive(Parser)]
#[command(version)]
struct Options {
    /// Directory holding all state (socket/, queue/, livelocks/, ...).
    #[arg(long, env = "WARDEN_ROOT")]
    root: PathBuf,
}

fn main() -> ExitCode {
    let options = Options::parse();
    warden::logging::init();
    warden::daemon::exit_code("luxid", warden::luxid::run(&options.root))
}
