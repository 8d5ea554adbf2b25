//! The tensor-facing frame the CPU kernels' shells share: a weight read as row-major f32 on the
//! host to pack from, a call's activations checked and read as rows, and the kernel's `(m, n)`
//! result shaped back (the kernels themselves, on slices, are `forkscore_kernels::cpu`).

use candle_core::{DType, Device, Result, Storage, Tensor};

/// A kernel's error as candle's, with the same message (what `candle_core::bail!` makes).
pub(crate) fn kernel_err(e: forkscore_kernels::cpu::Error) -> candle_core::Error {
    candle_core::Error::Msg(e.0).bt()
}

/// A weight the CPU kernels pack from a tensor: `w (n, k)` (any float dtype, any device) read as
/// row-major f32 on the host ([`with_host_rows`]) and handed to the kernel's packer.
pub(crate) trait PackTensor: Sized {
    /// The packer, on row-major `w (n, k)`.
    fn from_host_rows(w: &[f32], n: usize, k: usize) -> Self;

    /// Pack `w (n, k)` (any float dtype, any device: read as f32 on the host).
    fn pack(w: &Tensor) -> Result<Self> {
        with_host_rows(w, Self::from_host_rows)
    }
}

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
/// contiguous `(m, k)` rows, whose `m · n` result becomes the output (its error is the call's).
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

/// What the shells' equivalence tests share.
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

    /// The tolerance of a `k`-term f32 sum taken in another order: 2e-6, growing like √k.
    pub(crate) fn sum_tolerance(k: usize) -> f32 {
        2e-6f32.max(1.2e-7 * (k as f32).sqrt())
    }
}
