//! The value parsers of the switchboard's specification switches ([`crate::switches::Accepts::Spec`]),
//! for [`crate::switches::Switches::validate`] at load: each is checked by the parser of the
//! kernel that reads it, so the load refuses exactly what the kernel would refuse on its first
//! call.
//!
//! - `FORKSCORE_CPU_QPREFETCH`: a count (blocks ahead; 0: none).
//! - `FORKSCORE_CPU_GEMM_BLOCKING`: a blocking the f32 kernel of this CPU's level holds (checked
//!   only where the kernels run: on a CPU without AVX2 + FMA the variable has no effect).
//! - `FORKSCORE_CPU_AMX`: the AMX kernel's blocking (`hot`, a timing probe, is refused).
//! - `FORKSCORE_CPU_ATTENTION`: the CPU attention kernel's tiles.

use super::isa::Isa;

/// Whether `value` is right for the specification switch `name`; the reason when it is not.
pub(crate) fn check_spec(name: &'static str, value: &str) -> Result<(), String> {
    match name {
        "FORKSCORE_CPU_QPREFETCH" => super::qgemm::parse_prefetch(value).map(|_| ()),
        "FORKSCORE_CPU_GEMM_BLOCKING" => match Isa::chosen() {
            Some(isa) => super::gemm::Blocking::parse(value, isa.f32_level()).map(|_| ()),
            None => Ok(()),
        },
        "FORKSCORE_CPU_AMX" => match super::amx::AmxBlocking::parse(value) {
            Ok(b) if b.hot => Err("hot is a timing probe with wrong results".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        },
        "FORKSCORE_CPU_ATTENTION" => super::attention::TileSizes::parse(value)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        other => Err(format!("{other} has no parser")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switches::Switches;

    fn with(pairs: &[(&str, &str)]) -> Result<(), String> {
        Switches::from_source_with(
            |name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            },
            true,
        )
        .validate(check_spec)
        .map_err(|e| e.to_string())
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
            e.contains("FORKSCORE_CPU_ISA=\"avx3\"") && e.contains("avx512, avxvnni, avx2"),
            "{e}"
        );
        let e = with(&[("FORKSCORE_CPU_QPREFETCH", "far")]).expect_err("far");
        assert!(e.contains("FORKSCORE_CPU_QPREFETCH=\"far\""), "{e}");
        if Isa::chosen().is_some() {
            assert_eq!(with(&[("FORKSCORE_CPU_GEMM_BLOCKING", "pf=4")]), Ok(()));
            let e = with(&[("FORKSCORE_CPU_GEMM_BLOCKING", "pf=x")]).expect_err("pf=x");
            assert!(e.contains("FORKSCORE_CPU_GEMM_BLOCKING=\"pf=x\""), "{e}");
        }
        let e = with(&[("FORKSCORE_CPU_AMX", "hot=1")]).expect_err("hot");
        assert!(e.contains("timing probe"), "{e}");
    }

    /// Every specification switch of the table has a parser here.
    #[test]
    fn every_spec_switch_has_a_parser() {
        for s in crate::switches::TABLE {
            if let crate::switches::Accepts::Spec(_) = s.accepts {
                let r = check_spec(s.name, "");
                assert!(
                    !matches!(&r, Err(e) if e.contains("has no parser")),
                    "{}",
                    s.name
                );
            }
        }
    }
}
