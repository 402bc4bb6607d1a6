//! torture: the randomized crash harness. Runs the real wconfd, luxid and
//! job runners (the binaries beside this one) on a temp root under client
//! load, kills them with SIGKILL at seeded random moments, starts the
//! daemons again, and checks that nothing acknowledged was lost or broken.
//!
//! ```text
//! cargo build --release --bins
//! target/release/torture [--seed N] [--duration SECS | --long] [--root DIR]
//! ```
//!
//! Exit 0: no violation; 1: violations (the seed and the command replaying
//! it are printed); 2: bad usage or the run could not start.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use warden::torture::{self, DURATION_DEFAULT, DURATION_LONG, Options};

/// Randomized crash harness for warden's daemons and runners.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// The seed of the run's schedule (default: a random one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds of chaos before settling and the final checks (default 20).
    #[arg(long, conflicts_with = "long")]
    duration: Option<u64>,
    /// A long run: 300 seconds of chaos.
    #[arg(long)]
    long: bool,
    /// Where the root goes (kept afterwards); default: a temp directory,
    /// removed after a passing run.
    #[arg(long)]
    root: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let binaries = match torture::processes::Binaries::beside_this_executable() {
        Ok(binaries) => binaries,
        Err(message) => {
            eprintln!("torture: {message}");
            return ExitCode::from(2);
        }
    };
    let seed = cli.seed.unwrap_or_else(torture::random_seed);
    let duration = match (cli.duration, cli.long) {
        (Some(secs), _) => Duration::from_secs(secs),
        (None, true) => DURATION_LONG,
        (None, false) => DURATION_DEFAULT,
    };
    let replay = format!(
        "{} --seed {seed} --duration {}",
        std::env::args()
            .next()
            .unwrap_or_else(|| "torture".to_owned()),
        duration.as_secs()
    );
    println!(
        "torture: seed {seed}, {} s of chaos (replay: {replay})",
        duration.as_secs()
    );
    let options = Options {
        seed,
        duration,
        root: cli.root,
        binaries,
    };
    match torture::run(&options) {
        Ok(outcome) => {
            for line in &outcome.figures {
                println!("  {line}");
            }
            println!("  elapsed   : {:.1} s", outcome.elapsed.as_secs_f64());
            if outcome.violations.is_empty() {
                println!("torture: seed {seed}: no violation");
                ExitCode::SUCCESS
            } else {
                println!(
                    "torture: seed {seed}: {} violation(s), root kept at {}",
                    outcome.violations.len(),
                    outcome.root.display()
                );
                for violation in &outcome.violations {
                    println!("  - {violation}");
                }
                println!("replay: {replay}");
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            eprintln!("torture: {message}\nreplay: {replay}");
            ExitCode::from(2)
        }
    }
}
