//! The environment switches the kernels read themselves, because they decide inside a kernel
//! rather than in a shell: `FORKSCORE_CPU_ISA` (the cap of [`super::isa::Isa::chosen`], which the
//! vector math and attention dispatch on) and `FORKSCORE_CPU_QPREFETCH` (the integer tiles'
//! prefetch distance, [`super::qgemm::prefetch`]).
//!
//! Read once per process with the rule of the backends' switchboard
//! (`forkscore_backends::switches`, which lists these two in its table, documents them and
//! checks their values when a backend loads): a variable's trimmed value, unset when empty.

use std::sync::OnceLock;

/// The switches this crate reads.
pub const NAMES: &[&str] = &["FORKSCORE_CPU_ISA", "FORKSCORE_CPU_QPREFETCH"];

/// The trimmed value of switch `name` (one of [`NAMES`]) in this process, when set and not empty.
pub(crate) fn value(name: &str) -> Option<&'static str> {
    static VALUES: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    debug_assert!(NAMES.contains(&name), "{name} is not a kernel switch");
    VALUES
        .get_or_init(|| {
            NAMES
                .iter()
                .filter_map(|&n| {
                    let v = std::env::var(n).ok()?;
                    let v = v.trim();
                    (!v.is_empty()).then(|| (n, v.to_string()))
                })
                .collect()
        })
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}
