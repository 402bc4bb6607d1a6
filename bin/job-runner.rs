//! job-runner: runs one job of the queue (started by luxid, one process
//! per job). Logs to stderr; exits 0 once the job file is final, 3 if it
//! could not write it, 4 if it could not create its livelock, 1 otherwise.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use warden::jobs::runner_contract::Start;

/// Runs one job of warden's queue: takes its locks, runs its opcodes and
/// records them in its job file.
#[derive(Parser)]
#[command(version)]
struct Options {
    /// Directory holding all state (queue/, livelocks/, socket/).
    #[arg(long, env = "WARDEN_ROOT")]
    root: PathBuf,
    /// Wait for one byte on stdin before touching the job: luxid starts
    /// the runner of a new job while it makes the job durable, and writes
    /// the byte once it is (without it, the job is left alone).
    #[arg(long = "wait-for-commit")]
    wait_for_commit: bool,
    /// The job to run.
    job_id: u64,
}

fn main() -> ExitCode {
    let options = Options::parse();
    warden::logging::init();
    let start = if options.wait_for_commit {
        Start::AfterCommit
    } else {
        Start::Now
    };
    match warden::runner::run(&options.root, options.job_id, start) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(job = options.job_id, "job-runner: {error}");
            eprintln!("job-runner: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
