//! The `warden` command: the launcher (`up`, `demo`) and a client of both
//! daemons for people and scripts. Every command that prints data takes
//! `--json` and then prints one JSON document (or, for `watch`, one per
//! line) of a stable shape; human output is aligned tables, coloured only
//! on a terminal. Errors are one line on stderr and an exit code of
//! [`Exit`].

mod demo;
mod events;
mod filters;
mod jobs;
mod launcher;
mod locks;
mod output;
mod why;
mod workers;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use serde_json::Value;

use crate::client::{Client, ClientError, Daemon};
use crate::limits::LUXID_FRAME_BYTES_MAX_DEFAULT;

pub use demo::{EXAMPLES, FARM, Farm};
pub use output::Output;

/// warden runs jobs as processes that take locks from a lock daemon.
///
/// Start the daemons with `warden up` (or see it all work with `warden
/// demo`), then submit jobs with `warden exec` or `warden submit`.
#[derive(Parser, Debug)]
#[command(name = "warden", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// Directory holding the daemons' state and sockets [default: a
    /// per-user state directory, ~/.local/state/warden]
    #[arg(long, global = true, env = "WARDEN_ROOT", value_name = "DIR")]
    root: Option<PathBuf>,

    /// Print data as JSON (one document; `watch` prints one per line)
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  a job (or the demo) did not end as it should; a daemon of `up` died
  2  bad usage or a bad job file
  3  a daemon is not running on the root
  4  the daemon refused the request (unknown job, bad opcode, bad lock name, ...)
  5  anything else (I/O error, malformed answer)";

#[derive(Subcommand, Debug)]
enum Command {
    /// Start wconfd, luxid and a reporter on the root, in the foreground, until Ctrl-C
    Up {
        /// Start no reporter (no metrics, no hooks) beside the daemons
        #[arg(long)]
        no_reporter: bool,
    },
    /// A tour: both daemons on a temporary root, the example jobs contending for locks and workers
    Demo,
    /// Submit a job file: a JSON list of opcodes, or a list of such lists (several jobs)
    Submit {
        /// The file, or `-` for standard input
        file: String,
    },
    /// Submit a job that runs one program (an OP_EXEC opcode)
    Exec(Box<jobs::ExecArgs>),
    /// List the jobs
    List {
        /// Only jobs with this status (repeatable)
        #[arg(long, value_name = "STATUS")]
        status: Vec<String>,
        /// Include archived jobs
        #[arg(long)]
        archived: bool,
    },
    /// Everything about one job: its opcodes, results and log
    Info {
        /// The job id
        id: u64,
    },
    /// Follow a job to its end, printing its log as it happens; exits 0 only on success
    Watch {
        /// The job id
        id: u64,
    },
    /// Cancel a job (queued, waiting or, with --kill, running)
    Cancel {
        /// The job id
        id: u64,
        /// Also stop a running job: SIGKILL to its processes; it ends `error`
        #[arg(long)]
        kill: bool,
    },
    /// Move a finished job to the archive
    Archive {
        /// The job id
        id: u64,
    },
    /// Archive every job finished at least AGE ago (e.g. 90s, 30m, 12h, 7d; `all`)
    Autoarchive {
        /// The age: seconds, or a number with s, m, h or d; `all` for every finished job
        age: String,
    },
    /// Change the priority of a queued or running job
    Priority {
        /// The job id
        id: u64,
        /// The new priority: -10 (high), 0 (normal) or 10 (low)
        #[arg(allow_hyphen_values = true)]
        priority: i64,
    },
    /// Stop (`on`) or allow (`off`) new submissions
    Drain {
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// The lock table: every lock with its owners, every waiter with its blockers
    Locks {
        /// Show who blocks whom as a tree
        #[arg(long)]
        tree: bool,
    },
    /// Are the daemons up; jobs per status; locks held and waited for
    Status,
    /// Why a job is not running: dependencies, slots, filter rules, rate limits, workers, and who holds the locks it waits for, down to the root
    Why {
        /// The job
        id: u64,
    },
    /// Both daemons' events (job changes, grants, workers, ...), merged by time; --follow for more as they happen
    Events(events::EventsArgs),
    /// Run a reporter in the foreground: metrics (Prometheus, statsd) and hooks from the events; one of several is elected
    Reporter,
    /// The workers jobs hold while they run: list, register, let in, fail, ...
    #[command(subcommand)]
    Workers(workers::WorkersCommand),
    /// luxid's job filter rules (Ganeti's gnt-filter): add, list, info, replace, delete
    #[command(subcommand)]
    Filter(filters::FilterCommand),
    /// Print a shell completion script (e.g. `warden completions bash > /etc/bash_completion.d/warden`)
    Completions { shell: clap_complete::Shell },
}

/// The exit codes of `warden` (also in `--help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    /// A job, or the demo, did not end as it should; a daemon of `up` died.
    Unsuccessful = 1,
    /// Bad usage or a bad job file (clap uses 2 for usage errors too).
    Usage = 2,
    /// A daemon is not running on the root.
    DaemonDown = 3,
    /// The daemon refused the request.
    Refused = 4,
    /// Anything else.
    Failure = 5,
}

/// Why a command failed: the exit code and one line for stderr.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> CliError {
        CliError {
            exit,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Usage, message)
    }

    pub fn refused(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Refused, message)
    }

    pub fn failure(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Failure, message)
    }
}

impl From<ClientError> for CliError {
    fn from(error: ClientError) -> CliError {
        match &error {
            ClientError::Connect { daemon, path, .. } => CliError::new(
                Exit::DaemonDown,
                format!(
                    "{daemon} is not running on this root (no answer at {}); start it with `warden up`",
                    path.display()
                ),
            ),
            ClientError::Failed { args, .. } => CliError::refused(refusal_message(args)),
            ClientError::Io { .. } | ClientError::Protocol { .. } => {
                CliError::failure(error.to_string())
            }
        }
    }
}

/// A daemon's error arguments as one line: Ganeti's errors carry the
/// message first (`OpPrereqError` adds an error code after it). A message
/// of several lines (a regular expression's error points at the bad
/// character on a line of its own) is joined into one.
fn refusal_message(args: &[Value]) -> String {
    match args.first() {
        Some(Value::String(text)) => text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
        Some(other) => other.to_string(),
        None => "refused without a reason".to_owned(),
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;

/// Runs a parsed command line; the exit code to leave with.
pub fn run(cli: Cli) -> ExitCode {
    let output = Output::new(cli.json);
    let outcome = match cli.root.clone().map_or_else(default_root, Ok) {
        Ok(root) => execute(&cli, &root, &output),
        Err(error) => Err(error),
    };
    match outcome {
        Ok(Exit::Success) => ExitCode::SUCCESS,
        Ok(exit) => ExitCode::from(exit as u8),
        Err(error) => {
            output.error(&error.message);
            ExitCode::from(error.exit as u8)
        }
    }
}

fn execute(cli: &Cli, root: &Path, output: &Output) -> CliResult<Exit> {
    let done = |result: CliResult| result.map(|()| Exit::Success);
    match &cli.command {
        Command::Up { no_reporter } => launcher::up(root, output, !*no_reporter),
        Command::Demo => demo::run(output),
        Command::Submit { file } => done(jobs::submit(root, output, file)),
        Command::Exec(args) => jobs::exec(root, output, args),
        Command::List { status, archived } => done(jobs::list(root, output, status, *archived)),
        Command::Info { id } => done(jobs::info(root, output, *id)),
        Command::Watch { id } => jobs::watch(root, output, *id),
        Command::Cancel { id, kill } => done(jobs::cancel(root, output, *id, *kill)),
        Command::Archive { id } => done(jobs::archive(root, output, *id)),
        Command::Autoarchive { age } => done(jobs::autoarchive(root, output, age)),
        Command::Priority { id, priority } => done(jobs::priority(root, output, *id, *priority)),
        Command::Drain { state } => done(jobs::drain(root, output, state == "on")),
        Command::Locks { tree } => done(locks::locks(root, output, *tree)),
        Command::Status => locks::status(root, output),
        Command::Why { id } => done(why::why(root, output, *id)),
        Command::Events(args) => done(events::events(root, output, args)),
        Command::Reporter => {
            crate::logging::init();
            crate::reporter::run(root).map_err(|error| CliError::failure(error.to_string()))?;
            Ok(Exit::Success)
        }
        Command::Workers(command) => done(workers::run(root, output, command)),
        Command::Filter(command) => done(filters::run(root, output, command)),
        Command::Completions { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "warden",
                &mut std::io::stdout(),
            );
            Ok(Exit::Success)
        }
    }
}

/// `$XDG_STATE_HOME/warden`, else `~/.local/state/warden`.
fn default_root() -> CliResult<PathBuf> {
    let from = |variable: &str| {
        std::env::var_os(variable)
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    };
    if let Some(state) = from("XDG_STATE_HOME") {
        return Ok(state.join("warden"));
    }
    match from("HOME") {
        Some(home) => Ok(home.join(".local/state/warden")),
        None => Err(CliError::usage(
            "no root: give --root DIR or set WARDEN_ROOT (neither XDG_STATE_HOME nor HOME is set)",
        )),
    }
}

/// Connects to a daemon of `root`.
fn connect(root: &Path, daemon: Daemon) -> CliResult<Client> {
    Ok(Client::connect(
        root,
        daemon,
        LUXID_FRAME_BYTES_MAX_DEFAULT,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_refused_request_keeps_the_daemons_message() {
        let error = CliError::from(ClientError::Failed {
            daemon: "luxid",
            class: "OpPrereqError".to_owned(),
            args: vec![
                Value::String("Unknown opcode 'OP_X'".to_owned()),
                Value::String("wrong_input".to_owned()),
            ],
        });
        assert_eq!(error.exit, Exit::Refused);
        assert_eq!(error.message, "Unknown opcode 'OP_X'");
        let error = CliError::from(ClientError::Failed {
            daemon: "luxid",
            class: "OpPrereqError".to_owned(),
            args: vec![Value::String(
                "predicate 0: Invalid regular expression: regex parse error:\n    (\n    ^\nerror: unclosed group".to_owned(),
            )],
        });
        assert_eq!(
            error.message,
            "predicate 0: Invalid regular expression: regex parse error: ( ^ error: unclosed group"
        );
    }
}
