//! How `warden` prints: JSON documents, aligned tables, colour only on a
//! terminal (and never with `NO_COLOR` set), errors as one line on stderr.

use std::io::{IsTerminal, Write};

use serde_json::Value;

/// A colour for a table cell or a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Bold,
    Dim,
    Green,
    Red,
    Yellow,
    Cyan,
}

impl Style {
    fn code(self) -> &'static str {
        match self {
            Style::Bold => "1",
            Style::Dim => "2",
            Style::Green => "32",
            Style::Red => "31",
            Style::Yellow => "33",
            Style::Cyan => "36",
        }
    }

    /// The colour of a job status.
    pub fn of_status(status: &str) -> Option<Style> {
        match status {
            "success" => Some(Style::Green),
            "error" => Some(Style::Red),
            "canceled" | "canceling" => Some(Style::Yellow),
            "running" | "waiting" => Some(Style::Cyan),
            _ => None,
        }
    }
}

/// One table cell: its text and its colour.
#[derive(Clone, Debug)]
pub struct Cell {
    pub text: String,
    pub style: Option<Style>,
}

impl Cell {
    pub fn styled(text: impl Into<String>, style: Option<Style>) -> Cell {
        Cell {
            text: text.into(),
            style,
        }
    }
}

impl<T: Into<String>> From<T> for Cell {
    fn from(text: T) -> Cell {
        Cell::styled(text, None)
    }
}

/// Where and how a command prints.
pub struct Output {
    pub json: bool,
    colour: bool,
    error_colour: bool,
}

impl Output {
    pub fn new(json: bool) -> Output {
        let colour_allowed = std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
        Output {
            json,
            colour: colour_allowed && std::io::stdout().is_terminal(),
            error_colour: colour_allowed && std::io::stderr().is_terminal(),
        }
    }

    /// True when stdout is a terminal that takes colour (and so also
    /// redrawing of a line).
    pub fn is_terminal(&self) -> bool {
        self.colour
    }

    pub fn paint(&self, text: &str, style: Option<Style>) -> String {
        paint(self.colour, text, style)
    }

    /// A line on stdout. A closed stdout (`warden list | head`) is not an
    /// error worth a message.
    pub fn line(&self, text: &str) {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{text}");
    }

    /// A JSON document on stdout: pretty, or `compact` (one line, for
    /// streams).
    pub fn json_value(&self, value: &Value, compact: bool) {
        let text = if compact {
            serde_json::to_string(value)
        } else {
            serde_json::to_string_pretty(value)
        }
        .expect("a JSON value always serialises");
        self.line(&text);
    }

    /// One line on stderr, `warden: error: ...`.
    pub fn error(&self, message: &str) {
        let label = paint(self.error_colour, "error", Some(Style::Red));
        eprintln!("warden: {label}: {message}");
    }

    /// A note on stderr (progress of the launcher and the demo).
    pub fn note(&self, message: &str) {
        eprintln!("{message}");
    }

    /// Prints `rows` under `headers`, each column as wide as its widest
    /// cell, two spaces apart; the last column is not padded.
    pub fn table(&self, headers: &[&str], rows: &[Vec<Cell>]) {
        for line in self.table_lines(headers, rows) {
            self.line(&line);
        }
    }

    pub fn table_lines(&self, headers: &[&str], rows: &[Vec<Cell>]) -> Vec<String> {
        let mut widths: Vec<usize> = headers.iter().map(|header| width(header)).collect();
        for row in rows {
            for (column, cell) in row.iter().enumerate() {
                if column < widths.len() {
                    widths[column] = widths[column].max(width(&cell.text));
                }
            }
        }
        let render = |cells: &mut dyn Iterator<Item = (String, Option<Style>)>| {
            let cells: Vec<(String, Option<Style>)> = cells.collect();
            let last = cells.len().saturating_sub(1);
            let mut line = String::new();
            for (column, (text, style)) in cells.into_iter().enumerate() {
                let padding = if column == last {
                    0
                } else {
                    widths[column].saturating_sub(width(&text))
                };
                line.push_str(&self.paint(&text, style));
                if column != last {
                    line.push_str(&" ".repeat(padding + 2));
                }
            }
            line.trim_end().to_owned()
        };
        let mut lines = vec![render(
            &mut headers
                .iter()
                .map(|header| (header.to_string(), Some(Style::Bold))),
        )];
        for row in rows {
            lines.push(render(
                &mut row.iter().map(|cell| (cell.text.clone(), cell.style)),
            ));
        }
        lines
    }
}

fn paint(colour: bool, text: &str, style: Option<Style>) -> String {
    match style {
        Some(style) if colour && !text.is_empty() => {
            format!("\x1b[{}m{text}\x1b[0m", style.code())
        }
        _ => text.to_owned(),
    }
}

/// Display width of a cell: characters (job data is mostly ASCII; wide
/// characters are rare enough not to need a width table).
fn width(text: &str) -> usize {
    text.chars().count()
}

/// `1.234s`, `42.0s`, `3m04s`, `2h05m`: short, for tables.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "-".to_owned();
    }
    if seconds < 10.0 {
        format!("{seconds:.3}s")
    } else if seconds < 60.0 {
        format!("{seconds:.1}s")
    } else if seconds < 3600.0 {
        let whole = seconds as u64;
        format!("{}m{:02}s", whole / 60, whole % 60)
    } else {
        let whole = seconds as u64;
        format!("{}h{:02}m", whole / 3600, (whole % 3600) / 60)
    }
}

/// A job timestamp (`[seconds, microseconds]`) in seconds, if it is one.
pub fn timestamp_secs(value: &Value) -> Option<f64> {
    let pair = value.as_array()?;
    match pair.as_slice() {
        [seconds, micros] => Some(seconds.as_f64()? + micros.as_f64()? / 1e6),
        _ => None,
    }
}

/// A job timestamp as UTC date and time, `2026-11-30 10:03:12.345Z`.
pub fn utc_time(seconds: f64) -> String {
    let whole = seconds.floor() as i64;
    let millis = ((seconds - whole as f64) * 1000.0) as u32;
    let days = whole.div_euclid(86_400);
    let in_day = whole.rem_euclid(86_400);
    let (year, month, day) = crate::text::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{millis:03}Z",
        in_day / 3600,
        (in_day % 3600) / 60,
        in_day % 60
    )
}

/// Seconds since the epoch now.
pub fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |elapsed| elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_do_not_pad_the_last() {
        let output = Output {
            json: false,
            colour: false,
            error_colour: false,
        };
        let lines = output.table_lines(
            &["ID", "STATUS", "SUMMARY"],
            &[
                vec!["1".into(), "success".into(), "EXEC(/bin/true)".into()],
                vec!["12".into(), "queued".into(), "x".into()],
            ],
        );
        assert_eq!(
            lines,
            [
                "ID  STATUS   SUMMARY",
                "1   success  EXEC(/bin/true)",
                "12  queued   x",
            ]
        );
    }

    #[test]
    fn colour_does_not_disturb_alignment() {
        let output = Output {
            json: false,
            colour: true,
            error_colour: false,
        };
        let lines = output.table_lines(
            &["STATUS", "ID"],
            &[vec![Cell::styled("ok", Some(Style::Green)), "1".into()]],
        );
        assert_eq!(lines[1], "\x1b[32mok\x1b[0m      1");
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(duration(0.0123), "0.012s");
        assert_eq!(duration(42.04), "42.0s");
        assert_eq!(duration(184.0), "3m04s");
        assert_eq!(duration(7500.0), "2h05m");
        assert_eq!(duration(-1.0), "-");
    }

    #[test]
    fn timestamps_are_utc_dates() {
        assert_eq!(utc_time(0.0), "1970-01-01 00:00:00.000Z");
        assert_eq!(utc_time(1_796_034_192.5), "2026-11-30 10:23:12.500Z");
        assert_eq!(utc_time(951_782_400.0), "2000-02-29 00:00:00.000Z");
        assert_eq!(
            timestamp_secs(&serde_json::json!([10, 500_000])),
            Some(10.5)
        );
        assert_eq!(timestamp_secs(&Value::Null), None);
    }
}
