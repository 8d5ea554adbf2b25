//! The process-wide settings that decide inside the kernels rather than in their callers: the
//! cap on the instruction level ([`super::isa::Isa::chosen`], which the vector math and the
//! attention dispatch on) and the integer tiles' prefetch distance ([`super::qgemm::prefetch`]).
//!
//! This crate reads no environment variable. Its caller installs the settings once, before the
//! first kernel call ([`install`]); the backends' switchboard does so from `FORKSCORE_CPU_ISA`
//! and `FORKSCORE_CPU_QPREFETCH` when it reads the environment. Nothing installed, the kernels
//! run at the widest level the CPU has, with each level's default prefetch.

use std::sync::OnceLock;

use super::isa::Isa;

/// The kernels' process-wide settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// The widest instruction level the kernels may use (None: the widest the CPU has).
    pub isa_cap: Option<Isa>,
    /// The integer tiles' prefetch distance in blocks (None: the level's default).
    pub q_prefetch: Option<usize>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Fix the settings for the process. The first installation wins, and a kernel that already ran
/// fixed the defaults: returns the settings in force, so a caller sees whether its own took.
pub fn install(settings: Settings) -> Settings {
    *SETTINGS.get_or_init(|| settings)
}

/// The settings in force (the defaults when nothing was installed; they are fixed from then on).
pub fn current() -> Settings {
    *SETTINGS.get_or_init(Settings::default)
}

impl Isa {
    /// The level the kernels run with in this process: the widest supported, capped by the
    /// settings' `isa_cap`; `None` where the CPU has no AVX2 + FMA. (Defined here rather than in
    /// [`super::isa`], which stays a leaf.)
    pub fn chosen() -> Option<Isa> {
        static CHOSEN: OnceLock<Option<Isa>> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let cap = current().isa_cap.unwrap_or(Isa::Avx512);
            Isa::supported().iter().copied().filter(|&l| l <= cap).max()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once fixed, the settings do not change: a later installation returns the earlier ones.
    #[test]
    fn the_first_settings_hold() {
        let first = current();
        let other = Settings {
            isa_cap: Some(Isa::Avx2),
            q_prefetch: Some(first.q_prefetch.map_or(7, |p| p + 1)),
        };
        assert_eq!(install(other), first);
        assert_eq!(current(), first);
    }
}
