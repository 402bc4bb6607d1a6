//! What luxid and a job's runner agree on, beside the job file: how a
//! runner is told when it may act, what its exit status says, and the
//! name of its livelock. Both sides use these definitions; neither knows
//! the other's code.

use super::Job;

/// The runner's option that makes it wait for luxid's word before it acts
/// ([`Start::AfterCommit`]).
pub const WAIT_FOR_COMMIT_FLAG: &str = "--wait-for-commit";

/// When a runner may act on its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// The job is durable: at once.
    Now,
    /// luxid is still making the job's submission durable: once a byte
    /// arrives on stdin. The end of stdin without one means the job must
    /// be left alone.
    AfterCommit,
}

/// The exit status of a runner that could not write its job file (a full
/// or read-only disk): luxid ends the job `error` saying so.
pub const EXIT_JOB_FILE_UNWRITABLE: u8 = 3;
/// The exit status of a runner that could not create its livelock.
pub const EXIT_NO_LIVELOCK: u8 = 4;

/// What a runner's exit status says it died of, for the job's error
/// (the runner's own message is in luxid's log, its stderr).
pub fn exit_cause(code: i32) -> Option<&'static str> {
    match u8::try_from(code).ok()? {
        EXIT_JOB_FILE_UNWRITABLE => Some("could not write the job file (see luxid's log)"),
        EXIT_NO_LIVELOCK => Some("could not create its livelock (see luxid's log)"),
        _ => None,
    }
}

/// The seconds in a job's livelock name: those of its submission (0 for a
/// job file without them). luxid finds a runner's livelock by the same
/// rule, so two runners of one job want the same livelock.
pub fn livelock_secs(job: &Job) -> u64 {
    job.received_timestamp.map_or(0, |received| received.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_name_their_causes() {
        assert!(
            exit_cause(i32::from(EXIT_JOB_FILE_UNWRITABLE))
                .is_some_and(|cause| cause.contains("job file"))
        );
        assert!(
            exit_cause(i32::from(EXIT_NO_LIVELOCK)).is_some_and(|cause| cause.contains("livelock"))
        );
        for other in [0, 1, 2, 5, 255, 256 + 3, -3] {
            assert_eq!(exit_cause(other), None, "{other}");
        }
    }
}
