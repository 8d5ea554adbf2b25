//! The host-side frame the CPU kernels ([`super::gemm`], [`super::qgemm`],
//! [`super::amx`]) share: a weight read as row-major f32 on the host to pack from, a
//! call's activations checked and read as rows, the kernel's `(m, n)` result shaped back, and
//! the split of a product's panels into one run per rayon thread, and the `key=count` lists
//! their blocking overrides are written in.

use candle_core::{DType, Device, Result, Storage, Tensor};

/// `f(rows, n, k)` on `w (n, k)` (any float dtype, any device) read as row-major f32 on the
/// host: what the CPU kernels pack their weights from.
pub(crate) fn with_host_rows<T>(
    w: &Tensor,
    f: impl FnOnce(&[f32], usize, usize) -> T,
) -> Result<T> {
    let (n, k) = w.dims2()?;
    let host = w
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .contiguous()?;
    let (st, l) = host.storage_and_layout();
    let Storage::Cpu(c) = &*st else {
        candle_core::bail!("weight: the host copy is not on the CPU");
    };
    Ok(f(&c.as_slice::<f32>()?[l.start_offset()..][..n * k], n, k))
}

/// `x (.., k) -> (.., n)` through a kernel: `x` must be f32 on the CPU with last dim `k` (else
/// an error naming `what` and the shapes, never a panic); an empty product is zeros; otherwise
/// `ready()` (the kernel's own checks: its ISA, its blocking) and then `product(rows, m)` on the
/// contiguous `(m, k)` rows, whose `m · n` result becomes the output.
pub(crate) fn apply_rows(
    x: &Tensor,
    nk: (usize, usize),
    what: &str,
    ready: impl FnOnce() -> Result<()>,
    product: impl FnOnce(&[f32], usize) -> Vec<f32>,
) -> Result<Tensor> {
    try_apply_rows(x, nk, what, ready, |xd, m| Ok(product(xd, m)))
}

/// [`apply_rows`] with a product that can fail (its error is the call's).
pub(crate) fn try_apply_rows(
    x: &Tensor,
    (n, k): (usize, usize),
    what: &str,
    ready: impl FnOnce() -> Result<()>,
    product: impl FnOnce(&[f32], usize) -> Result<Vec<f32>>,
) -> Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 || x.dims().last() != Some(&k) {
        candle_core::bail!(
            "{what}: input {:?} {:?} on {:?} does not fit a ({n}, {k}) CPU weight",
            x.dims(),
            x.dtype(),
            x.device()
        );
    }
    let m = x.elem_count() / k.max(1);
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    if m == 0 || n == 0 || k == 0 {
        return Tensor::zeros(dims, DType::F32, &Device::Cpu);
    }
    ready()?;
    let x = x.contiguous()?;
    let (xs, xl) = x.storage_and_layout();
    let Storage::Cpu(xc) = &*xs else {
        candle_core::bail!("{what}: input is not on the CPU");
    };
    let y = product(&xc.as_slice::<f32>()?[xl.start_offset()..][..m * k], m)?;
    drop(xs);
    Tensor::from_vec(y, dims, &Device::Cpu)
}

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

/// What the f32 kernels' equivalence tests share.
#[cfg(test)]
pub(crate) mod checks {
    use candle_core::Tensor;

    /// `max |a − b|` relative to `max(max |b|, 1)`.
    pub(crate) fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b)
            .and_then(|d| d.abs())
            .and_then(|d| d.flatten_all())
            .and_then(|d| d.max(0));
        let s = b.abs().and_then(|d| d.flatten_all()).and_then(|d| d.max(0));
        d.and_then(|d| d.to_scalar::<f32>()).expect("diff")
            / s.and_then(|s| s.to_scalar::<f32>())
                .expect("scale")
                .max(1.0)
    }

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
