//! Every limit warden enforces, in one place, each with the reason for its
//! value. Each has a test that exceeds it and gets a clear error.

/// Longest lock name accepted, in bytes of its wire form. Ganeti's names are
/// host names and UUIDs (well under 256 bytes); anything near this is a bug
/// or an attack, and names are copied into several indexes.
pub const LOCK_NAME_BYTES_MAX: usize = 1024;
