//! Judging an opcode's dependencies (JOBS.md "Scheduling"): luxid starts a
//! job only once every job it depends on is final; the runner then checks,
//! opcode by opcode, that each ended with an accepted status. Pure: the
//! statuses are looked up by the caller. Messages follow Ganeti's.

use crate::jobs::opcode::Dependency;
use crate::jobs::{JobId, Status};

/// What one dependency means for the opcode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The dependency ended as required: go on.
    Met,
    /// The opcode fails (`error`) with this message.
    Error(String),
    /// The dependency was canceled and that was not accepted: the opcode
    /// is canceled, with this message.
    Cancel(String),
}

/// The absolute id of a dependency of job `own` (a relative id left in a
/// stored opcode counts back from `own`); `None` if it names no job.
pub fn absolute_id(own: JobId, dependency: &Dependency) -> Option<JobId> {
    if dependency.job >= 0 {
        return u64::try_from(dependency.job).ok();
    }
    own.checked_sub(dependency.job.unsigned_abs())
        .filter(|&id| id > 0)
}

/// The verdict on a dependency of job `own` on job `dependency`, which is
/// in `status` (`None`: no such job), accepting `accepted` (empty: any
/// final status but `canceled`).
pub fn judge(
    own: JobId,
    dependency: JobId,
    status: Option<Status>,
    accepted: &[Status],
) -> Verdict {
    if dependency == own {
        return Verdict::Error("Job can't depend on itself".to_owned());
    }
    let Some(status) = status else {
        return Verdict::Error(format!("Dependency error: job {dependency} not found"));
    };
    if !status.is_final() {
        return Verdict::Error(format!(
            "Dependency job {dependency} has not finished (status '{}')",
            status.name()
        ));
    }
    if status == Status::Canceled && !accepted.contains(&Status::Canceled) {
        return Verdict::Cancel(format!("Dependency job {dependency} was cancelled"));
    }
    if accepted.is_empty() || accepted.contains(&status) {
        return Verdict::Met;
    }
    let names: Vec<&str> = accepted.iter().map(|status| status.name()).collect();
    Verdict::Error(format!(
        "Dependency job {dependency} finished with status '{}', not one of '{}' as required",
        status.name(),
        names.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    #[test]
    fn accepted_statuses_are_met() {
        assert_eq!(judge(5, 3, Some(Success), &[]), Verdict::Met);
        assert_eq!(judge(5, 3, Some(Error), &[]), Verdict::Met);
        assert_eq!(judge(5, 3, Some(Error), &[Success, Error]), Verdict::Met);
        assert_eq!(judge(5, 3, Some(Canceled), &[Canceled]), Verdict::Met);
    }

    #[test]
    fn a_canceled_dependency_cancels_unless_accepted() {
        assert_eq!(
            judge(5, 3, Some(Canceled), &[]),
            Verdict::Cancel("Dependency job 3 was cancelled".into())
        );
        assert!(matches!(
            judge(5, 3, Some(Canceled), &[Success]),
            Verdict::Cancel(_)
        ));
    }

    #[test]
    fn other_statuses_fail_with_ganetis_message() {
        assert_eq!(
            judge(5, 3, Some(Error), &[Success, Canceled]),
            Verdict::Error(
                "Dependency job 3 finished with status 'error', not one of 'success, canceled' as required"
                    .into()
            )
        );
    }

    #[test]
    fn self_unknown_and_unfinished_dependencies_fail() {
        assert_eq!(
            judge(5, 5, Some(Success), &[]),
            Verdict::Error("Job can't depend on itself".into())
        );
        assert!(matches!(judge(5, 9, None, &[]), Verdict::Error(m) if m.contains("not found")));
        assert!(
            matches!(judge(5, 3, Some(Running), &[]), Verdict::Error(m) if m.contains("not finished"))
        );
    }

    #[test]
    fn relative_ids_count_back_from_the_job() {
        let dep = |job| Dependency {
            job,
            statuses: vec![],
        };
        assert_eq!(absolute_id(10, &dep(3)), Some(3));
        assert_eq!(absolute_id(10, &dep(-1)), Some(9));
        assert_eq!(absolute_id(10, &dep(-10)), None);
        assert_eq!(absolute_id(10, &dep(i64::MIN)), None);
    }
}
