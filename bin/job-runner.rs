//! job-runner: runs one job of the queue (started by luxid, one process
//! per job). Logs to stderr; exits 0 once the job file is final, 3 if it
//! could not write it, 4 if it could not create its livelock, 1 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Runs one job of warden's queue: takes its locks, runs its opcodes and
/// records them in its job file.
#[derive(Parser)]
#[command(version)]
struct Options {
    /// Directory holding all state (queue/, livelocks/, socket/).
    #[arg(long, env = "WARDEN_ROOT")]
    root: PathBuf,
    /// The job to run.
    job_id: u64,
}

fn main() -> ExitCode {
    let options = Options::parse();
    warden::logging::init();
    match warden::runner::run(&options.root, options.job_id) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(job = options.job_id, "job-runner: {error}");
            eprintln!("job-runner: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
