//! The metrics computed from the event sequences (EVENTS.md, "Metrics").
