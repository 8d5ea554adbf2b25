//! Which x86 vector instructions the CPU kernels ([`super::gemm`], [`super::qgemm`])
//! run with: detected once at run time, the widest the CPU has.
//!
//! - [`Isa::Avx2`]: AVX2 + FMA (8 f32 lanes; int8 products as 16-bit multiply-adds).
//! - [`Isa::AvxVnni`]: AVX2 + FMA and AVX-VNNI, the 256-bit `vpdpbusd` of Intel's client CPUs
//!   without AVX-512 (Alder Lake and later: most laptops) and of AMD's Zen 5: the f32 kernels of
//!   AVX2, the integer ones as 4-way `u8 × i8` dot products on 8 lanes.
//! - [`Isa::Avx512`]: AVX-512 F + BW + VNNI as well (16 f32 lanes; int8 products as 4-way
//!   `u8 × i8` dot products, `vpdpbusd`).
//!
//! The caller may cap the choice at a level ([`super::settings::Settings::isa_cap`]; the backends
//! take it from `FORKSCORE_CPU_ISA=avx2` or `avxvnni`, to compare levels on one machine); nothing
//! capped takes the widest. Tests run every level the CPU has ([`Isa::supported`]), whatever the
//! cap says.

/// A level of x86 vector instructions, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// AVX2 + FMA.
    Avx2,
    /// AVX2 + FMA + AVX-VNNI (256-bit `vpdpbusd`).
    AvxVnni,
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
                if is_x86_feature_detected!("avxvnni") {
                    levels.push(Isa::AvxVnni);
                }
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

    /// The level named `name` (as [`Isa::name`] spells it), if any.
    pub fn from_name(name: &str) -> Option<Isa> {
        [Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
            .into_iter()
            .find(|l| l.name() == name)
    }

    /// `Ok` where this CPU has the level, else an error `"{what}: this CPU has no {name}"`:
    /// the check every kernel entry point makes before it runs.
    pub fn require(self, what: &str) -> super::Result<()> {
        match Isa::supported().contains(&self) {
            true => Ok(()),
            false => super::bail!("{what}: this CPU has no {}", self.name()),
        }
    }

    /// Lower-case name, as `FORKSCORE_CPU_ISA` and the bench reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
        }
    }

    /// The level whose f32 kernels this one runs: AVX-VNNI adds integer dot products only, so
    /// its f32 work is AVX2's.
    pub fn f32_level(self) -> Isa {
        match self {
            Isa::Avx2 | Isa::AvxVnni => Isa::Avx2,
            Isa::Avx512 => Isa::Avx512,
        }
    }
}

/// Whether the AMX kernel runs in this process: x86-64 Linux, CPUID AMX-TILE + AMX-BF16,
/// the OS saving the tile state (XCR0 bits 17–18), and the kernel granting it to this process.
/// Detected (and the permission asked for) once.
pub fn amx_available() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(detect_amx)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect_amx() -> bool {
    use std::arch::x86_64::{__cpuid_count, _xgetbv};
    // SAFETY: cpuid is present on every x86-64 CPU; xgetbv(0) only after CPUID reports OSXSAVE
    unsafe {
        let l7 = __cpuid_count(7, 0);
        let (amx_bf16, amx_tile) = (l7.edx & (1 << 22) != 0, l7.edx & (1 << 24) != 0);
        let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
        if !(amx_bf16 && amx_tile && osxsave) {
            return false;
        }
        if _xgetbv(0) & (0b11 << 17) != (0b11 << 17) {
            return false;
        }
        // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA
        libc::syscall(libc::SYS_arch_prctl, 0x1023, 18) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect_amx() -> bool {
    false
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
        assert_eq!(Isa::AvxVnni.f32_level(), Isa::Avx2);
        for l in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            assert_eq!(Isa::from_name(l.name()), Some(l));
        }
        assert_eq!(Isa::from_name("sse2"), None);
        // AVX-VNNI sits between the two (a cap at it keeps AVX-512 off)
        assert!(Isa::Avx2 < Isa::AvxVnni && Isa::AvxVnni < Isa::Avx512);
    }
}
