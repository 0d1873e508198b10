//! A small deterministic PRNG (SplitMix64). Every decision of a schedule is
//! drawn from one seeded by the schedule's seed, so a seed replays the exact
//! same run.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Scramble once so that neighbouring seeds start far apart.
        let mut rng = Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B);
        rng.next_u64();
        rng
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform in `lo..=hi`, for sizes and counts.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        self.range(lo as u64, hi as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64) / ((1u64 << 53) as f64) < p
    }

    /// A uniform rate in `lo..hi`.
    pub fn rate(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64) / ((1u64 << 53) as f64)
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.between(0, items.len() - 1)]
    }

    /// A random visiting order of `0..n`. Subtasks run concurrently in
    /// Flink, so no fixed order is more faithful than another; varying it
    /// is what exposes order-dependent recovery.
    pub fn order(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..v.len()).rev() {
            let j = self.between(0, i);
            v.swap(i, j);
        }
        v
    }

    /// An independent stream, for a component that draws at its own pace
    /// (the fault plan is consulted from inside destination calls).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}
