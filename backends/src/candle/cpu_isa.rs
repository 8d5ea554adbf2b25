//! Which x86 vector instructions the CPU kernels ([`super::cpu_gemm`], [`super::cpu_qgemm`])
//! run with: detected once at run time, the widest the CPU has.
//!
//! - [`Isa::Avx2`]: AVX2 + FMA (8 f32 lanes; int8 products as 16-bit multiply-adds).
//! - [`Isa::Avx512`]: AVX-512 F + BW + VNNI as well (16 f32 lanes; int8 products as 4-way
//!   `u8 × i8` dot products, `vpdpbusd`).
//!
//! `FORKSCORE_CPU_ISA=avx2` caps the choice at AVX2 (to compare the two on one machine);
//! anything else, or nothing, takes the widest. Tests run every level the CPU has
//! ([`Isa::supported`]), whatever the variable says.

/// A level of x86 vector instructions, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512 F, BW and VNNI (with AVX2 + FMA).
    Avx512,
}

impl Isa {
    /// The levels this CPU has, narrowest first (empty off x86-64 or without AVX2 + FMA),
    /// detected once.
    pub fn supported() -> &'static [Isa] {
        use std::sync::OnceLock;
        static LEVELS: OnceLock<Vec<Isa>> = OnceLock::new();
        LEVELS.get_or_init(Isa::detect)
    }

    fn detect() -> Vec<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            let mut levels = Vec::new();
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                levels.push(Isa::Avx2);
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    levels.push(Isa::Avx512);
                }
            }
            levels
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Vec::new()
        }
    }

    /// The level the kernels run with in this process: the widest supported, capped by
    /// `FORKSCORE_CPU_ISA=avx2`; `None` where the CPU has no AVX2 + FMA.
    pub fn chosen() -> Option<Isa> {
        use std::sync::OnceLock;
        static CHOSEN: OnceLock<Option<Isa>> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let cap = match std::env::var("FORKSCORE_CPU_ISA").as_deref().map(str::trim) {
                Ok("avx2") => Isa::Avx2,
                _ => Isa::Avx512,
            };
            Isa::supported().iter().copied().filter(|&l| l <= cap).max()
        })
    }

    /// Lower-case name, as `FORKSCORE_CPU_ISA` and the bench reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chosen_level_is_one_the_cpu_supports() {
        let supported = Isa::supported();
        match Isa::chosen() {
            Some(level) => assert!(supported.contains(&level), "{level:?} not in {supported:?}"),
            None => assert!(supported.is_empty()),
        }
        // narrowest first, no repeats
        assert!(supported.windows(2).all(|w| w[0] < w[1]), "{supported:?}");
        assert_eq!(Isa::Avx512.name(), "avx512");
    }
}
