//! A small deterministic PRNG (xoshiro256++ seeded by SplitMix64): the same seed gives the same
//! values on every device and platform, because values are always drawn on the host.
//!
//! Written here rather than taken from `rand` for the same reason as orch-data's sampler: a
//! seed's initial parameters must stay the same across orch builds (a resumed or repeated run
//! reproduces an earlier one), and `rand` does not promise that its `StdRng` or its sampling
//! stays the same between versions. The algorithms are the published reference ones.

/// xoshiro256++ (Blackman and Vigna), public domain reference algorithm.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let mut next = || {
            sm = sm.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = sm;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [low, high).
    pub fn uniform(&mut self, low: f32, high: f32) -> f32 {
        let v = low as f64 + (high as f64 - low as f64) * self.next_f64();
        // Rounding to f32 can land on `high`; keep the interval half open.
        let v = v as f32;
        if v >= high {
            low.max(high - (high - low) * f32::EPSILON)
        } else {
            v
        }
    }

    /// Standard normal values by the Box-Muller transform, two at a time.
    pub fn fill_normal(&mut self, out: &mut [f32]) {
        let mut chunks = out.chunks_exact_mut(2);
        for pair in &mut chunks {
            let (a, b) = self.normal_pair();
            pair[0] = a as f32;
            pair[1] = b as f32;
        }
        if let [last] = chunks.into_remainder() {
            *last = self.normal_pair().0 as f32;
        }
    }

    fn normal_pair(&mut self) -> (f64, f64) {
        let u1 = 1.0 - self.next_f64(); // in (0, 1]: ln stays finite
        let u2 = self.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f64::consts::TAU * u2;
        (r * theta.cos(), r * theta.sin())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_values_and_sane_moments() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut v = vec![0.0; 100_001];
        Rng::new(1).fill_normal(&mut v);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.02,
            "mean {mean} var {var}"
        );
        let mut r = Rng::new(3);
        assert!(
            (0..10_000)
                .map(|_| r.uniform(-1.0, 2.0))
                .all(|x| (-1.0..2.0).contains(&x))
        );
    }
}
