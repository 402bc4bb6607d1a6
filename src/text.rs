//! How error texts quote what a client sent: enough to recognise it, never
//! a frame's worth of it in an answer or a log line.

use crate::limits::QUOTED_CHARS_MAX;

/// A client's string as an error text quotes it: at most
/// [`QUOTED_CHARS_MAX`] characters, then `...`.
pub fn shortened(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS_MAX) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}
