//! The host-side frame the CPU kernels ([`super::gemm`], [`super::qgemm`], [`super::q4gemm`],
//! [`super::amx`]) share: the split of a product's panels into one run per rayon thread, and
//! the `key=count` lists their blocking overrides are written in.

/// `spec`'s comma-separated `key=count` pairs as `(part, key, count)` (blanks around parts,
/// keys and counts ignored, empty parts skipped); an error names a part that is not
/// `key=value` or whose value is not a count. The caller checks the keys.
pub(crate) fn spec_counts(spec: &str) -> std::result::Result<Vec<(&str, &str, usize)>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not key=value"))?;
            let v = value
                .trim()
                .parse()
                .map_err(|_| format!("`{part}`: `{}` is not a count", value.trim()))?;
            Ok((part, key.trim(), v))
        })
        .collect()
}

/// `f(p0, p1)` for each of the runs `p0..p1` that split `panels` into one contiguous run per
/// rayon thread, on the rayon threads (`paired`: every run but the last an even count, so the
/// kernels' two-panel tiles never straddle two runs).
#[cfg(target_arch = "x86_64")]
pub(crate) fn for_panel_runs(panels: usize, paired: bool, f: impl Fn(usize, usize) + Sync) {
    use rayon::prelude::*;
    if panels == 0 {
        return;
    }
    let threads = rayon::current_num_threads().clamp(1, panels);
    let per = match paired {
        true => panels.div_ceil(threads).next_multiple_of(2),
        false => panels.div_ceil(threads),
    };
    (0..panels)
        .step_by(per)
        .collect::<Vec<_>>()
        .into_par_iter()
        .for_each(|p0| f(p0, (p0 + per).min(panels)));
}

/// What the kernels' equivalence tests share.
#[cfg(test)]
pub(crate) mod checks {
    /// `max |got − want|` relative to `max(max |want|, 1)`, against an f64 reference.
    pub(crate) fn max_rel_to(got: &[f32], want: &[f64]) -> f64 {
        let scale = want.iter().fold(1f64, |s, w| s.max(w.abs()));
        got.iter()
            .zip(want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0.0, f64::max)
            / scale
    }

    /// The tolerance of a `k`-term f32 sum taken in another order: 2e-6, growing like √k.
    pub(crate) fn sum_tolerance(k: usize) -> f32 {
        2e-6f32.max(1.2e-7 * (k as f32).sqrt())
    }
}
