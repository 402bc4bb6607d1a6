//! Ad-hoc rate limits (Ganeti 3.0's "reason rate limiting"): a reason entry
//! `rate-limit:<n>:<label>` puts its job in a bucket of at most `n` running
//! jobs.
//!
//! Ganeti's rules, kept exactly:
//! - the text must start with `rate-limit:` (a leading space makes it a
//!   plain reason); what follows up to the next `:` is `n`, read as an
//!   integer with surrounding whitespace allowed, and it must be positive;
//!   the rest (possibly empty, possibly with more `:`) is the label;
//! - a bucket is the whole text after `rate-limit:` with its `n`: so
//!   `rate-limit:2:x` and `rate-limit:3:x` are different buckets;
//! - a job is in every bucket any reason of any of its opcodes names, once
//!   each (its opcodes run one after the other, so it takes one slot);
//! - a job may start only if every bucket it is in has a free slot; jobs
//!   already running count (a bucket they overfill blocks only jobs in
//!   it).

use std::collections::BTreeMap;

const PREFIX: &str = "rate-limit:";

/// A bucket: the text after `rate-limit:` (`"2:nightly"`) and its limit.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket {
    pub name: String,
    pub limit: u64,
}

impl Bucket {
    /// The bucket a reason text names, if it is a rate limit at all.
    pub fn of_reason(text: &str) -> Option<Bucket> {
        let rest = text.strip_prefix(PREFIX)?;
        let count = rest.split(':').next().unwrap_or_default();
        let limit: i64 = count.trim().parse().ok()?;
        if limit <= 0 || count.trim().starts_with('+') {
            return None;
        }
        Some(Bucket {
            name: rest.to_owned(),
            limit: limit.unsigned_abs(),
        })
    }
}

/// The buckets of a job, from the reason texts of all its opcodes: each
/// once (none, and no allocation, for a job with no rate limit).
pub fn buckets_of<'a>(reasons: impl IntoIterator<Item = &'a str>) -> Vec<Bucket> {
    let mut buckets: Vec<Bucket> = reasons.into_iter().filter_map(Bucket::of_reason).collect();
    buckets.sort();
    buckets.dedup();
    buckets
}

/// How many running jobs each bucket holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    running: BTreeMap<Bucket, u64>,
}

impl Occupancy {
    /// From the buckets of the jobs running (started, not yet finished).
    pub fn of_running<'a>(jobs: impl IntoIterator<Item = &'a [Bucket]>) -> Occupancy {
        let mut occupancy = Occupancy::default();
        for buckets in jobs {
            occupancy.occupy(buckets);
        }
        occupancy
    }

    /// Whether a job in `buckets` fits: each has a free slot.
    pub fn has_room(&self, buckets: &[Bucket]) -> bool {
        buckets
            .iter()
            .all(|bucket| self.running(bucket) < bucket.limit)
    }

    /// A job in `buckets` starts.
    pub fn occupy(&mut self, buckets: &[Bucket]) {
        for bucket in buckets {
            *self.running.entry(bucket.clone()).or_default() += 1;
        }
    }

    pub fn running(&self, bucket: &Bucket) -> u64 {
        self.running.get(bucket).copied().unwrap_or(0)
    }

    /// The buckets past their limit (jobs that started before a change, or
    /// a restart that found more running).
    pub fn overfull(&self) -> Vec<&Bucket> {
        self.running
            .iter()
            .filter(|(bucket, running)| **running > bucket.limit)
            .map(|(bucket, _)| bucket)
            .collect()
    }
}

/// Which of `candidates` (in the order they would start) may start, given
/// the jobs running: Ganeti's `reasonRateLimit`. Their indexes, in order.
pub fn fitting(running: &Occupancy, candidates: &[&[Bucket]]) -> Vec<usize> {
    let mut occupancy = running.clone();
    let mut started = Vec::new();
    for (index, buckets) in candidates.iter().enumerate() {
        if occupancy.has_room(buckets) {
            occupancy.occupy(buckets);
            started.push(index);
        }
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(text: &str) -> Bucket {
        Bucket::of_reason(text).expect("a rate limit")
    }

    #[test]
    fn reasons_parse_as_ganeti_reads_them() {
        let b20 = bucket("rate-limit:20:my label");
        assert_eq!((b20.name.as_str(), b20.limit), ("20:my label", 20));
        assert_ne!(b20, bucket("rate-limit:21:my label"));
        assert_eq!(bucket("rate-limit:2:a:b").name, "2:a:b");
        assert_eq!(bucket("rate-limit:2").name, "2");
        assert_eq!(bucket("rate-limit: 2 :x").limit, 2);
        for plain in [
            " rate-limit:20:my label",
            "rate-limit:x:y",
            "rate-limit:0:y",
            "rate-limit:-3:y",
            "rate-limit:+3:y",
            "rate-limit::y",
            "rate-limit:99999999999999999999:y",
            "Rate-limit:2:y",
            "rate-limit",
        ] {
            assert_eq!(Bucket::of_reason(plain), None, "{plain:?}");
        }
    }

    #[test]
    fn a_job_is_in_each_bucket_once() {
        let buckets = buckets_of([
            "rate-limit:2:a",
            "plain",
            "rate-limit:2:a",
            "rate-limit:3:a",
        ]);
        assert_eq!(
            buckets,
            [bucket("rate-limit:2:a"), bucket("rate-limit:3:a")]
        );
    }

    /// Ganeti's `case_hasSlotsFor_examples`, as buckets of running jobs.
    #[test]
    fn room_is_needed_in_every_bucket_of_the_job_and_only_there() {
        let (a, b, c) = (
            bucket("rate-limit:2:a"),
            bucket("rate-limit:4:b"),
            bucket("rate-limit:8:c"),
        );
        let mut occupancy = Occupancy::default();
        occupancy.occupy(&[a.clone(), b.clone()]);
        occupancy.occupy(std::slice::from_ref(&b));
        assert!(occupancy.has_room(&[a.clone(), b.clone()]));
        occupancy.occupy(std::slice::from_ref(&b));
        occupancy.occupy(std::slice::from_ref(&b));
        assert!(!occupancy.has_room(&[a.clone(), b.clone()]), "b is full");
        assert!(occupancy.has_room(std::slice::from_ref(&a)));
        for _ in 0..10 {
            occupancy.occupy(std::slice::from_ref(&c));
        }
        assert_eq!(occupancy.overfull(), [&c]);
        assert!(
            occupancy.has_room(std::slice::from_ref(&a)),
            "an overfull bucket blocks only its own"
        );
        assert!(Occupancy::default().has_room(&[a, b]));
    }

    #[test]
    fn candidates_start_in_order_while_their_buckets_have_room() {
        let (a, b) = (bucket("rate-limit:2:a"), bucket("rate-limit:1:b"));
        let running = Occupancy::of_running([std::slice::from_ref(&a)]);
        let jobs: Vec<Vec<Bucket>> = vec![
            vec![a.clone()],
            vec![a.clone(), b.clone()],
            vec![b.clone()],
            vec![],
            vec![b.clone()],
        ];
        let candidates: Vec<&[Bucket]> = jobs.iter().map(Vec::as_slice).collect();
        // The first takes a's last slot, so the second cannot start (and
        // takes no slot of b); the third takes b's; the fourth is in no
        // bucket.
        assert_eq!(fitting(&running, &candidates), [0, 2, 3]);
    }
}
