//! A small deterministic generator (SplitMix64). Every input is drawn from
//! its own generator, seeded from the target's name and the input's seed,
//! so one `(target, seed)` pair names one input on every machine and in
//! every build.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The generator of input `seed` of `target`. The name is mixed in so
    /// that targets sharing a generator function (the two control files)
    /// still see different inputs for the same seed.
    pub fn for_input(target: &str, seed: u64) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in target.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut rng = Rng(h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        rng.next_u64();
        rng
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `0..n` (`n` > 0), as an index.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        // Eight bytes per draw: inputs are generated in debug builds too.
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// A length that is usually small but sometimes reaches `max`: decoders
    /// break at boundaries more often than in the middle.
    pub fn length(&mut self, max: usize) -> usize {
        match self.below(8) {
            0 => 0,
            1 => max,
            2..=4 => self.index(max.min(16) + 1),
            _ => self.index(max + 1),
        }
    }

    /// A u64 that is a boundary of some encoding (bincode's varint steps,
    /// the integer widths, the envelope's body limit) or random.
    pub fn interesting_u64(&mut self) -> u64 {
        const VALUES: [u64; 16] = [
            0,
            1,
            250,
            251,
            255,
            256,
            65_535,
            65_536,
            (1 << 20) - 1,
            1 << 20,
            u32::MAX as u64,
            u32::MAX as u64 + 1,
            i64::MAX as u64,
            i64::MAX as u64 + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        match self.below(4) {
            0 => *self.pick(&VALUES),
            1 => self.below(1000),
            2 => self.next_u64() >> self.below(64),
            _ => self.next_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_targets_differ() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::for_input("handle", 7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::for_input("handle", 7);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(
            Rng::for_input("handle", 7).next_u64(),
            Rng::for_input("envelope", 7).next_u64()
        );
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::new(1);
        for n in 1..200 {
            assert!(r.below(n) < n);
        }
        assert!((0..1000).all(|_| r.range(5, 6) >= 5));
    }
}
