//! Tests of the hook runner with real processes.
