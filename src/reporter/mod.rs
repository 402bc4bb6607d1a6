//! The reporter (EVENTS.md): reads both daemons' event sequences and turns
//! them into metrics (Prometheus and statsd) and hook runs.

pub mod hooks;
pub mod metrics;
