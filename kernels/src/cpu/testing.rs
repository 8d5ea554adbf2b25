//! Random operands for the kernels' tests (the backends' tests draw theirs from candle; here a
//! small deterministic generator does, so the crate's tests need no tensor library).

/// A xorshift64* generator.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `len` values uniform in [lo, hi).
    pub(crate) fn uniform(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len)
            .map(|_| lo + (hi - lo) * self.unit() as f32)
            .collect()
    }

    /// `len` values normal with mean 0 and deviation `scale` (Box–Muller).
    pub(crate) fn normal(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|_| {
                let (u, v) = (1.0 - self.unit(), self.unit());
                let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
                (z * scale as f64) as f32
            })
            .collect()
    }
}
