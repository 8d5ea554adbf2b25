//! The CPU kernels' `FORKSCORE_*` switches whose values are read lazily, on a layer's first call,
//! checked once when a CPU backend loads: a misspelled value is an error naming the variable
//! and what it accepts, instead of silently running the default.
//!
//! - `FORKSCORE_CPU_ISA`: a level name (`avx2`, `avxvnni`, `avx512`) or empty.
//! - `FORKSCORE_CPU_QPREFETCH`: a count (blocks ahead; 0: none).
//! - `FORKSCORE_CPU_GEMM_BLOCKING`: a blocking the f32 kernel of this CPU's level holds (checked
//!   only where the kernels run: on a CPU without AVX2 + FMA the variable has no effect).

use super::cpu_isa::Isa;

/// The first switch of `get` (a variable's value, if set) whose value is wrong, as a message.
pub(crate) fn check(get: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    if let Some(v) = get("FORKSCORE_CPU_ISA") {
        let name = v.trim();
        if !name.is_empty() && Isa::from_name(name).is_none() {
            return Err(format!(
                "FORKSCORE_CPU_ISA={v:?}: not an instruction level (avx2, avxvnni, avx512)"
            ));
        }
    }
    if let Some(v) = get("FORKSCORE_CPU_QPREFETCH") {
        super::cpu_qgemm::parse_prefetch(&v)?;
    }
    if let (Some(v), Some(isa)) = (get("FORKSCORE_CPU_GEMM_BLOCKING"), Isa::chosen()) {
        super::cpu_gemm::Blocking::parse(&v, isa.f32_level())
            .map_err(|e| format!("FORKSCORE_CPU_GEMM_BLOCKING={v:?}: {e}"))?;
    }
    Ok(())
}

/// [`check`] on this process's environment.
pub(crate) fn check_env() -> Result<(), String> {
    check(|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<(), String> {
        check(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    /// Right values and unset variables pass; a wrong one is refused by name.
    #[test]
    fn a_wrong_switch_is_named() {
        assert_eq!(with(&[]), Ok(()));
        assert_eq!(
            with(&[
                ("FORKSCORE_CPU_ISA", "avxvnni"),
                ("FORKSCORE_CPU_QPREFETCH", "0")
            ]),
            Ok(())
        );
        assert_eq!(with(&[("FORKSCORE_CPU_ISA", " ")]), Ok(()));
        let e = with(&[("FORKSCORE_CPU_ISA", "avx3")]).expect_err("avx3");
        assert!(
            e.contains("FORKSCORE_CPU_ISA=\"avx3\"") && e.contains("avx2, avxvnni, avx512"),
            "{e}"
        );
        let e = with(&[("FORKSCORE_CPU_QPREFETCH", "far")]).expect_err("far");
        assert!(e.contains("FORKSCORE_CPU_QPREFETCH=\"far\""), "{e}");
        if Isa::chosen().is_some() {
            assert_eq!(with(&[("FORKSCORE_CPU_GEMM_BLOCKING", "pf=4")]), Ok(()));
            let e = with(&[("FORKSCORE_CPU_GEMM_BLOCKING", "pf=x")]).expect_err("pf=x");
            assert!(e.contains("FORKSCORE_CPU_GEMM_BLOCKING=\"pf=x\""), "{e}");
        }
    }
}
