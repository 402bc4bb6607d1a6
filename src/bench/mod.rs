//! Measuring and reporting for warden's benchmark binaries: medians of
//! repeated runs, targets and verdicts, the machine context.
//!
//! A scenario's run yields [`Measure`]s; a [`Report`] gathers every run of
//! one scenario into a [`Series`] per figure, [`print_runs`] shows them with
//! their medians, and [`CommandLine::run`] ends with a summary that
//! judges the medians against their targets. [`Context`] is what a figure
//! needs beside it to mean something later.

pub mod harness;
pub mod lock;
pub mod luxid;
pub mod wconfd;
pub mod workers;

use std::fmt::{self, Display, Write as _};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

/// One figure of one run.
pub struct Measure {
    pub label: String,
    pub unit: Unit,
    pub target: Option<Target>,
    pub value: f64,
}

impl Measure {
    pub fn new(label: impl Into<String>, unit: Unit, value: f64) -> Measure {
        Measure {
            label: label.into(),
            unit,
            target: None,
            value,
        }
    }

    pub fn with_target(self, target: Target) -> Measure {
        Measure {
            target: Some(target),
            ..self
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    PerSecond,
    Nanos,
    Seconds,
    Ratio,
    /// The exponent k of time ~ n^k: 1 is linear, 2 quadratic.
    Exponent,
    Bytes,
}

impl Unit {
    pub fn format(self, value: f64) -> String {
        match self {
            Unit::PerSecond => format!("{}/s", grouped(value.round() as u64)),
            Unit::Nanos => format!("{} ns", grouped(value.round() as u64)),
            Unit::Seconds if value.abs() < 1e-3 => format!("{:.1} us", value * 1e6),
            Unit::Seconds if value.abs() < 1.0 => format!("{:.2} ms", value * 1e3),
            Unit::Seconds => format!("{value:.2} s"),
            Unit::Ratio => format!("{value:.2}x"),
            Unit::Exponent => format!("{value:.2}"),
            Unit::Bytes => format!("{:.1} MiB", value / (1024.0 * 1024.0)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
    Below(f64),
}

impl Target {
    pub fn is_met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(bound) => value >= bound,
            Target::AtMost(bound) => value <= bound,
            Target::Below(bound) => value < bound,
        }
    }

    pub fn format(self, unit: Unit) -> String {
        match self {
            Target::AtLeast(bound) => format!(">= {}", unit.format(bound)),
            Target::AtMost(bound) => format!("<= {}", unit.format(bound)),
            Target::Below(bound) => format!("< {}", unit.format(bound)),
        }
    }
}

/// Every run of one figure.
pub struct Series {
    pub label: String,
    pub unit: Unit,
    pub target: Option<Target>,
    pub values: Vec<f64>,
}

impl Series {
    pub fn median(&self) -> f64 {
        let mut sorted = self.values.clone();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        if sorted.len() % 2 == 1 {
            sorted[middle]
        } else {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        }
    }
}

/// Every run of one scenario, one series per figure.
pub struct Report {
    /// The scenario's name, as the summary shows it.
    pub scenario: &'static str,
    pub series: Vec<Series>,
}

impl Report {
    pub fn new(scenario: &'static str) -> Report {
        Report {
            scenario,
            series: Vec::new(),
        }
    }

    /// Adds one run's figures; every run must measure the same figures in
    /// the same order.
    pub fn add_run(&mut self, measures: Vec<Measure>) {
        if self.series.is_empty() {
            self.series = measures
                .iter()
                .map(|measure| Series {
                    label: measure.label.clone(),
                    unit: measure.unit,
                    target: measure.target,
                    values: Vec::new(),
                })
                .collect();
        }
        assert_eq!(
            self.series.len(),
            measures.len(),
            "every run measures the same"
        );
        for (series, measure) in self.series.iter_mut().zip(measures) {
            assert_eq!(series.label, measure.label, "every run measures the same");
            series.values.push(measure.value);
        }
    }
}

/// The nearest-rank percentile of sorted samples (`fraction` in 0..=1).
pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    assert!(!sorted.is_empty(), "every measurement takes samples");
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// 1 -> "1 run", 1000 -> "1,000 runs".
pub fn counted(count: usize, noun: &str) -> String {
    let plural = if count == 1 { "" } else { "s" };
    format!("{} {noun}{plural}", grouped(count as u64))
}

/// 1234567 -> "1,234,567".
pub fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

// ---------------------------------------------------------------------------
// Output

/// The part of a bench's context every bench shows: the machine, the load,
/// the code and the build. Read it at start, before any measuring.
pub struct Context {
    cpus: usize,
    model: String,
    load: String,
}

impl Context {
    pub fn read() -> Context {
        let cpus = std::thread::available_parallelism().map_or(0, |cpus| cpus.get());
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let load = std::fs::read_to_string("/proc/loadavg")
            .map(|text| {
                text.split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|_| "unknown".to_owned());
        Context { cpus, model, load }
    }

    /// Prints `title`, then the command, machine, load, commit and build
    /// lines; the bench adds its own lines and ends with [`print_mode`].
    pub fn print(&self, title: &str, command_line: &str) {
        let build = if cfg!(debug_assertions) {
            "debug (figures meaningless: use --release)"
        } else {
            "release"
        };
        println!("{title}");
        println!("command : {command_line}");
        println!("machine : {} cpus, {}", self.cpus, self.model);
        println!("load    : {} (1, 5, 15 min averages at start)", self.load);
        println!("commit  : {}", git_commit());
        println!("build   : {build}");
    }
}

/// The last line of the context: quick or full, and the runs per scenario.
pub fn print_mode(quick: bool, runs: usize) {
    println!(
        "mode    : {}, {} per scenario",
        if quick { "quick" } else { "full" },
        counted(runs, "run")
    );
}

/// The short commit, marked when the tree has changes the commit lacks.
pub fn git_commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        None => "unknown (no git)".to_owned(),
        Some(commit) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if changes.is_empty() => commit,
            _ => format!("{commit} + uncommitted changes"),
        },
    }
}

/// Every run of every figure of one scenario, and their medians.
pub fn print_runs(series: &[Series], runs: usize) {
    let label_width = series.iter().map(|s| s.label.len()).max().unwrap_or(0);
    let mut header = format!("   {:label_width$}", "");
    for run in 1..=runs {
        let _ = write!(header, " {:>12}", format!("run {run}"));
    }
    println!("{header} {:>12}", "MEDIAN");
    for series in series {
        let mut line = format!("   {:label_width$}", series.label);
        for value in &series.values {
            let _ = write!(line, " {:>12}", series.unit.format(*value));
        }
        println!("{line} {:>12}", series.unit.format(series.median()));
    }
}

/// The medians of every scenario's figures against their targets; a quick
/// run's figures mean nothing, so its targets are not judged.
fn print_summary(reports: &[Report], runs: usize, quick: bool) {
    println!("\n== summary: medians of {}", counted(runs, "run"));
    let rows: Vec<[String; 5]> = reports
        .iter()
        .flat_map(|report| {
            report.series.iter().map(|series| {
                let median = series.median();
                let (target, verdict) = match series.target {
                    None => (String::new(), String::new()),
                    Some(target) => (
                        target.format(series.unit),
                        match (quick, target.is_met(median)) {
                            (true, _) => "n/a (quick)".to_owned(),
                            (false, true) => "met".to_owned(),
                            (false, false) => "MISSED".to_owned(),
                        },
                    ),
                };
                [
                    report.scenario.to_owned(),
                    series.label.clone(),
                    series.unit.format(median),
                    target,
                    verdict,
                ]
            })
        })
        .collect();
    let header = ["scenario", "figure", "median", "target", "verdict"].map(str::to_owned);
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            std::iter::once(&header)
                .chain(&rows)
                .map(|row| row[column].len())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "   {:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
        );
        println!("{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(values: &[f64]) -> Series {
        Series {
            label: "figure".to_owned(),
            unit: Unit::Seconds,
            target: None,
            values: values.to_vec(),
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(series(&[3.0, 1.0, 2.0]).median(), 2.0);
        assert_eq!(series(&[4.0, 1.0, 3.0, 2.0]).median(), 2.5);
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.50), 50.0);
        assert_eq!(percentile(&sorted, 0.99), 99.0);
        assert_eq!(percentile(&sorted, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn numbers_are_grouped_and_counted() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(counted(1, "run"), "1 run");
        assert_eq!(counted(1_000, "run"), "1,000 runs");
    }

    #[test]
    fn units_format() {
        assert_eq!(Unit::PerSecond.format(1_234_567.4), "1,234,567/s");
        assert_eq!(Unit::Nanos.format(41.6), "42 ns");
        assert_eq!(Unit::Seconds.format(25e-6), "25.0 us");
        assert_eq!(Unit::Seconds.format(-25e-6), "-25.0 us");
        assert_eq!(Unit::Seconds.format(0.0123), "12.30 ms");
        assert_eq!(Unit::Seconds.format(1.5), "1.50 s");
        assert_eq!(Unit::Ratio.format(1.234), "1.23x");
        assert_eq!(Unit::Exponent.format(1.004), "1.00");
        assert_eq!(Unit::Bytes.format(3.0 * 1024.0 * 1024.0), "3.0 MiB");
    }

    #[test]
    fn targets_judge_and_format() {
        assert!(Target::AtLeast(2.0).is_met(2.0));
        assert!(!Target::AtLeast(2.0).is_met(1.9));
        assert!(Target::AtMost(2.0).is_met(2.0));
        assert!(!Target::AtMost(2.0).is_met(2.1));
        assert!(!Target::Below(2.0).is_met(2.0));
        assert!(Target::Below(2.0).is_met(1.9));
        assert_eq!(Target::Below(0.05).format(Unit::Seconds), "< 50.00 ms");
        assert_eq!(Target::AtMost(2.0).format(Unit::Ratio), "<= 2.00x");
    }

    #[test]
    fn a_report_gathers_runs_per_figure() {
        let mut report = Report::new("scenario");
        for value in [1.0, 3.0, 2.0] {
            report.add_run(vec![
                Measure::new("a", Unit::Ratio, value),
                Measure::new("b", Unit::Ratio, 10.0 * value).with_target(Target::AtMost(5.0)),
            ]);
        }
        assert_eq!(report.series.len(), 2);
        assert_eq!(report.series[0].values, [1.0, 3.0, 2.0]);
        assert_eq!(report.series[1].median(), 20.0);
        assert_eq!(report.series[1].target, Some(Target::AtMost(5.0)));
    }
}

// ---------------------------------------------------------------------------
// The command line every benchmark binary shares

/// A benchmark binary's scenario.
/// Runs per scenario unless `--runs` says otherwise: enough for a median
/// to shrug off one disturbed run.
pub const RUNS_DEFAULT: usize = 5;

pub trait Scenario: Copy + 'static {
    /// Every scenario, in the order a full run takes them.
    const ALL: &'static [Self];

    /// Its name on the command line and in the report.
    fn name(self) -> &'static str;
}

/// `[SCENARIO] [--runs N] [--quick]`, and the options of one binary.
pub struct CommandLine<S> {
    /// The one named, or all of them.
    pub scenarios: Vec<S>,
    pub runs: usize,
    /// A smoke run (CI's): every code path, figures that mean nothing.
    pub quick: bool,
    /// The command line as given, for the report.
    pub text: String,
}

impl<S: Scenario> CommandLine<S> {
    /// Runs every scenario named, in order, and prints the summary of
    /// their reports: the one driver of every bench binary.
    pub fn run(&self, mut scenario: impl FnMut(S) -> Result<Report>) -> Result<()> {
        let reports = self
            .scenarios
            .iter()
            .map(|&named| scenario(named))
            .collect::<Result<Vec<Report>>>()?;
        print_summary(&reports, self.runs, self.quick);
        Ok(())
    }

    /// Parses `args` (without the program name); `None` for `--help`.
    /// Every argument that is neither a scenario nor a shared option goes
    /// to `own` with the arguments after it (for a value): it answers
    /// whether it was one of the binary's options.
    pub fn parse<'a>(
        program: &str,
        args: &'a [String],
        runs_default: usize,
        mut own: impl FnMut(
            &str,
            &mut std::slice::Iter<'a, String>,
        ) -> std::result::Result<bool, String>,
    ) -> std::result::Result<Option<CommandLine<S>>, String> {
        let mut command_line = CommandLine {
            scenarios: S::ALL.to_vec(),
            runs: runs_default,
            quick: false,
            text: std::iter::once(program)
                .chain(args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
        };
        let mut chosen = None;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => command_line.quick = true,
                "--help" | "-h" => return Ok(None),
                "--runs" => {
                    let value = args.next().ok_or("--runs needs a number")?;
                    command_line.runs = match value.parse() {
                        Ok(runs) if runs > 0 => runs,
                        _ => return Err(format!("--runs wants a positive number, not '{value}'")),
                    };
                }
                name => {
                    if own(name, &mut args)? {
                        continue;
                    }
                    let scenario = S::ALL
                        .iter()
                        .copied()
                        .find(|scenario| scenario.name() == name)
                        .ok_or_else(|| format!("unknown scenario or option '{name}'"))?;
                    if chosen.replace(scenario).is_some() {
                        return Err("name at most one scenario".to_owned());
                    }
                }
            }
        }
        if let Some(scenario) = chosen {
            command_line.scenarios = vec![scenario];
        }
        Ok(Some(command_line))
    }
}

/// Runs `scenario` `runs` times (`run` is one run), printing what it does
/// (`description`), each run's time (on stderr: stdout stays a clean
/// record to paste) and every figure with its median.
pub fn run_scenario<S: Scenario>(
    scenario: S,
    description: &str,
    runs: usize,
    mut run: impl FnMut() -> Result<Vec<Measure>>,
) -> Result<Report> {
    println!("\n== {}: {description}", scenario.name());
    let mut report = Report::new(scenario.name());
    for index in 1..=runs {
        let started = std::time::Instant::now();
        let measures =
            run().map_err(|error| Error(format!("{} run {index}: {error}", scenario.name())))?;
        eprintln!(
            "   {} run {index}/{runs} took {:.1} s",
            scenario.name(),
            started.elapsed().as_secs_f64()
        );
        report.add_run(measures);
    }
    print_runs(&report.series, runs);
    Ok(report)
}

/// A benchmark binary's `main`: `parse` the arguments (`None` for
/// `--help`, which prints `usage`), then `bench`. Exit 0, 1 if the bench
/// failed, 2 for a bad command line.
pub fn main<O>(
    program: &str,
    usage: &str,
    parse: impl FnOnce(&[String]) -> std::result::Result<Option<O>, String>,
    bench: impl FnOnce(O) -> Result<()>,
) -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{usage}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("{program}: {message}\n{usage}");
            return std::process::ExitCode::from(2);
        }
    };
    exit_code(program, bench(options))
}

/// Exit 0 for `Ok`; for an error, 1 with the error on stderr.
pub fn exit_code(program: &str, outcome: Result<()>) -> std::process::ExitCode {
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// What the benchmarks of the daemons share (wconfd-bench, luxid-bench)

/// Why the bench stopped: a daemon misbehaved or the OS refused something.
#[derive(Debug)]
pub struct Error(pub String);

pub type Result<T> = std::result::Result<T, Error>;

impl Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub fn fail<T>(message: String) -> Result<T> {
    Err(Error(message))
}

/// Says what was being done when an error happened.
pub trait WithContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Display> WithContext<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|error| Error(format!("{}: {error}", what())))
    }
}

/// The end of a daemon's log, for an error message.
pub fn log_tail(path: &Path) -> String {
    const LINES: usize = 20;
    match fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LINES)..].join("\n")
        }
        Err(error) => format!("(cannot read {}: {error})", path.display()),
    }
}

/// How long ago a file was modified: a stale binary shows up here.
pub fn age(path: &Path) -> String {
    let modified = fs::metadata(path).and_then(|metadata| metadata.modified());
    match modified.map(|modified| SystemTime::now().duration_since(modified)) {
        Ok(Ok(age)) if age.as_secs() < 120 => format!("{} s ago", age.as_secs()),
        Ok(Ok(age)) if age.as_secs() < 2 * 3600 => format!("{} min ago", age.as_secs() / 60),
        Ok(Ok(age)) => format!("{} h ago", age.as_secs() / 3600),
        _ => "at an unknown time".to_owned(),
    }
}

/// The type and device of the file system holding `path` (its longest
/// mount point in /proc/self/mounts): it decides what a sync costs.
pub fn file_system(path: &Path) -> String {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(point)
                .then(|| (point.len(), format!("{kind} on {device}")))
        })
        .max_by_key(|(length, _)| *length)
        .map_or_else(|| "unknown file system".to_owned(), |(_, text)| text)
}
