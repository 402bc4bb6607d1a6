//! What the harness saw, and the pure checks over it: lock holding
//! intervals (no two owners held conflicting locks at once) and job ids
//! (never handed out twice, never going backwards).
//!
//! Times are microseconds of the system's wall clock (`SystemTime`), the
//! clock the job runners stamp their opcodes with, so the intervals of
//! lock clients and of jobs lie on one time line. A client's interval runs
//! from the moment a grant was acknowledged to it (its answer read) to the
//! moment it asked for the release (before sending it): a sub-interval of
//! the time wconfd had the lock allocated to that owner, whatever the
//! scheduling of the processes. Two sub-intervals of conflicting
//! allocations can therefore only overlap if the allocations did.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::locks::Mode;

/// Microseconds since the epoch, now.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// One owner's hold of one lock in one mode, `[start_us, end_us)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The owner as the harness names it (`job 12`, or a client owner's
    /// ident).
    pub owner: String,
    pub lock: String,
    pub mode: Mode,
    pub start_us: u64,
    pub end_us: u64,
    /// How the harness learnt the end (for reports): `release`, `killed`,
    /// `opcode end`, ...
    pub ended: &'static str,
}

/// The group lock of a member (`node/x` -> `node/[lockset]`,
/// `cluster/BGL` -> `cluster/[lockset]`); None for a group and for
/// `cluster/config`, which belongs to no group.
fn group_of(lock: &str) -> Option<String> {
    let (level, member) = lock.split_once('/')?;
    if member == "[lockset]" || lock == "cluster/config" {
        return None;
    }
    Some(format!("{level}/[lockset]"))
}

/// Whether two holdings by different owners may not coexist (LOCKS.md
/// "Conflicts").
pub fn conflicting(a: &Interval, b: &Interval) -> bool {
    if a.owner == b.owner {
        return false;
    }
    let exclusive = a.mode == Mode::Exclusive || b.mode == Mode::Exclusive;
    if a.lock == b.lock {
        return exclusive;
    }
    // A group against one of its members: an exclusive group excludes
    // every member, a shared group excludes exclusive members.
    let related = group_of(&a.lock).as_deref() == Some(b.lock.as_str())
        || group_of(&b.lock).as_deref() == Some(a.lock.as_str());
    related && exclusive
}

/// Every pair of overlapping conflicting intervals (at most `limit`), and
/// how many intervals were compared. Intervals of one level are swept in
/// order of their start, keeping those still open.
pub fn conflicts(intervals: &[Interval], limit: usize) -> Vec<(Interval, Interval)> {
    let mut by_start: Vec<&Interval> = intervals.iter().collect();
    by_start.sort_by_key(|interval| (interval.start_us, interval.end_us));
    let mut found = Vec::new();
    // Open intervals per level (a lock conflicts only within its level).
    let mut open: std::collections::HashMap<&str, Vec<&Interval>> =
        std::collections::HashMap::new();
    for interval in by_start {
        let level = interval.lock.split('/').next().unwrap_or_default();
        let active = open.entry(level).or_default();
        active.retain(|other| other.end_us > interval.start_us);
        for other in active.iter() {
            if conflicting(other, interval) && found.len() < limit {
                found.push(((*other).clone(), interval.clone()));
            }
        }
        active.push(interval);
    }
    found
}

/// Job ids as luxid acknowledged them: each must be new and greater than
/// every id acknowledged before its submission was sent.
#[derive(Debug, Default)]
pub struct Serials {
    acknowledged: BTreeSet<u64>,
}

impl Serials {
    /// The greatest id acknowledged so far (0 if none): read before a
    /// submission is sent.
    pub fn high(&self) -> u64 {
        self.acknowledged.last().copied().unwrap_or(0)
    }

    /// Records an acknowledged id; `high_before` is [`Serials::high`] as it
    /// was when the submission was sent. An error says what went wrong.
    pub fn acknowledge(&mut self, id: u64, high_before: u64) -> Result<(), String> {
        if !self.acknowledged.insert(id) {
            return Err(format!("job id {id} was acknowledged twice"));
        }
        if id <= high_before {
            return Err(format!(
                "job id {id} was acknowledged after id {high_before} had been: \
                 the serial went backwards"
            ));
        }
        Ok(())
    }

    pub fn is_acknowledged(&self, id: u64) -> bool {
        self.acknowledged.contains(&id)
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.acknowledged.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.acknowledged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.acknowledged.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(owner: &str, lock: &str, mode: Mode, start_us: u64, end_us: u64) -> Interval {
        Interval {
            owner: owner.to_owned(),
            lock: lock.to_owned(),
            mode,
            start_us,
            end_us,
            ended: "test",
        }
    }

    #[test]
    fn conflicts_follow_locks_md() {
        use Mode::{Exclusive as X, Shared as S};
        let cases = [
            (("a", "node/n1", X), ("b", "node/n1", S), true),
            (("a", "node/n1", S), ("b", "node/n1", S), false),
            (("a", "node/n1", X), ("a", "node/n1", X), false),
            (("a", "node/n1", X), ("b", "node/n2", X), false),
            (("a", "node/[lockset]", S), ("b", "node/n2", S), false),
            (("a", "node/[lockset]", S), ("b", "node/n2", X), true),
            (("a", "node/n2", S), ("b", "node/[lockset]", X), true),
            (("a", "cluster/[lockset]", X), ("b", "cluster/BGL", S), true),
            (
                ("a", "cluster/[lockset]", X),
                ("b", "cluster/config", X),
                false,
            ),
            (("a", "instance/[lockset]", X), ("b", "node/n1", X), false),
        ];
        for ((oa, la, ma), (ob, lb, mb), expected) in cases {
            let (a, b) = (hold(oa, la, ma, 0, 1), hold(ob, lb, mb, 0, 1));
            assert_eq!(conflicting(&a, &b), expected, "{a:?} {b:?}");
            assert_eq!(conflicting(&b, &a), expected, "{b:?} {a:?}");
        }
    }

    #[test]
    fn only_overlapping_conflicts_are_found() {
        use Mode::{Exclusive as X, Shared as S};
        let intervals = vec![
            hold("a", "node/n1", X, 10, 20),
            // Touching is not overlapping: released at 20, granted at 20.
            hold("b", "node/n1", X, 20, 30),
            hold("c", "node/n1", S, 25, 26),
            hold("d", "cluster/BGL", S, 0, 100),
            hold("e", "cluster/BGL", S, 5, 50),
            hold("f", "node/[lockset]", S, 40, 60),
            hold("g", "node/n3", X, 55, 70),
        ];
        let found = conflicts(&intervals, 10);
        let pairs: Vec<(&str, &str)> = found
            .iter()
            .map(|(a, b)| (a.owner.as_str(), b.owner.as_str()))
            .collect();
        assert_eq!(pairs, [("b", "c"), ("f", "g")]);
        assert_eq!(conflicts(&intervals, 1).len(), 1);
    }

    #[test]
    fn serials_must_grow() {
        let mut serials = Serials::default();
        assert_eq!(serials.high(), 0);
        serials.acknowledge(1, 0).unwrap();
        // Two submissions in flight together may be answered in any order.
        let high = serials.high();
        serials.acknowledge(3, high).unwrap();
        serials.acknowledge(2, high).unwrap();
        assert!(serials.acknowledge(3, 0).unwrap_err().contains("twice"));
        assert!(serials.acknowledge(2, 3).is_err());
        assert!(serials.acknowledge(4, 3).is_ok());
    }
}
