//! The harness's only source of chance: a seeded generator (SplitMix64),
//! so that a seed names one schedule of actions.

/// SplitMix64: tiny, fast, and good enough to pick actions; every thread
/// of a run gets its own stream, derived from the run's seed and the
/// thread's role ([`Rng::stream`]), so one thread's draws never depend on
/// another's timing.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The generator of stream `index` of `seed` (one per thread).
    pub fn stream(seed: u64, index: u64) -> Rng {
        let mut mixer = Rng(seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F));
        Rng(mixer.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0) has no answer");
        self.next_u64() % n
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "an empty range");
        low + self.below(high - low + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_one_sequence_and_streams_differ() {
        let draws = |mut rng: Rng| (0..8).map(|_| rng.below(1000)).collect::<Vec<_>>();
        assert_eq!(draws(Rng::stream(7, 1)), draws(Rng::stream(7, 1)));
        assert_ne!(draws(Rng::stream(7, 1)), draws(Rng::stream(7, 2)));
        assert_ne!(draws(Rng::stream(7, 1)), draws(Rng::stream(8, 1)));
        let mut rng = Rng::new(3);
        for _ in 0..1000 {
            let value = rng.between(5, 9);
            assert!((5..=9).contains(&value));
        }
    }
}
