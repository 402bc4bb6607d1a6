//! How error texts quote what a client sent (enough to recognise it, never
//! a frame's worth of it in an answer or a log line), and how they name a
//! time.

use crate::limits::QUOTED_CHARS_MAX;

/// A client's string as an error text quotes it: at most
/// [`QUOTED_CHARS_MAX`] characters, then `...`.
pub fn shortened(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS_MAX) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// A Unix time as UTC, `2026-12-02T23:00:00Z` (whole seconds, rounded
/// down); times before 1970 or beyond the year 9999 as their number.
pub fn utc_time(unix_secs: f64) -> String {
    if !(0.0..253_402_300_800.0).contains(&unix_secs) {
        return format!("{unix_secs}");
    }
    let secs = unix_secs as i64;
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of a count of days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The Unix time of a UTC date and time as [`utc_time`] writes it,
/// `2026-12-02T23:00:00Z`; a space for the `T`, and no seconds, are
/// accepted too. `None` for anything else, or a date that does not exist.
pub fn parse_utc_time(text: &str) -> Option<i64> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once(['T', ' '])?;
    let numbers = |part: &str, separator: char| -> Option<Vec<i64>> {
        part.split(separator)
            .map(|field| {
                (!field.is_empty() && field.bytes().all(|byte| byte.is_ascii_digit()))
                    .then(|| field.parse().ok())
                    .flatten()
            })
            .collect()
    };
    let (date, time) = (numbers(date, '-')?, numbers(time, ':')?);
    let [year, month, day] = date[..] else {
        return None;
    };
    let (hour, minute, second) = match time[..] {
        [hour, minute] => (hour, minute, 0),
        [hour, minute, second] => (hour, minute, second),
        _ => return None,
    };
    if !(1..=12).contains(&month) || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = days_from_civil(year, month as u32, day as u32);
    // A day past its month's end would come back as another date.
    (civil_from_days(days) == (year, month as u32, day as u32))
        .then_some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// The count of days since 1970-01-01 of a proleptic Gregorian date, the
/// inverse of [`civil_from_days`] (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_index = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_index + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_are_civil_dates() {
        assert_eq!(utc_time(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400.5), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(1_796_252_806.9), "2026-12-02T23:06:46Z");
        assert_eq!(utc_time(-1.0), "-1");
    }

    #[test]
    fn utc_times_parse_back() {
        for secs in [0, 951_782_400, 1_796_252_806, 253_402_300_799] {
            assert_eq!(parse_utc_time(&utc_time(secs as f64)), Some(secs));
        }
        assert_eq!(parse_utc_time("2026-12-02 23:06Z"), Some(1_796_252_760));
        for bad in [
            "2026-12-02T23:06:46",
            "2026-02-30T00:00Z",
            "2026-13-01T00:00Z",
            "2026-12-02T24:00Z",
            "2026-12-02",
            "2026-12-+2T00:00Z",
            "tomorrow",
        ] {
            assert_eq!(parse_utc_time(bad), None, "{bad}");
        }
    }
}
