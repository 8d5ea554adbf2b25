//! Exact top-K and logsumexp of full-vocabulary rows on the GPU (`kernels/cuda/vocab_topk.cu`).
//!
//! In: f32 logits `(n, V)` on a CUDA device and K. Out: per row the f32 logsumexp, the K best
//! `(id, log-probability)` best first, or the lowest id of a NaN / +inf logit. Only these few
//! numbers cross to the host (at K = 5: 56 bytes a row instead of V · 4 bytes).
//!
//! The kernel follows the definitions of [`forkscore_seam::topk`] — `m + ln Σ exp(x − m)` with
//! `exp` in f32 and the sum in f64, `x − lse` in f32, log-probability descending then id
//! ascending — and is exact: its top K is, bit for bit, the first K of the full log-softmax
//! computed with its own logsumexp, sorted (a GPU test checks this on real model rows). The
//! logsumexp itself sums in a different order than the host's and `expf` may differ from the
//! host's `exp` in the last bit, so it can differ from the host's value by an ulp.
//!
//! Limits: K ≤ [`MAX_K`], V ≤ [`MAX_VOCAB`]; other requests take the host path
//! ([`takes_device_path`]). `FORKSCORE_VOCAB_TOPK=host` forces the host path (the reference).

use candle_core::Tensor;

/// The largest K the kernel serves.
pub const MAX_K: usize = 256;
/// The largest vocabulary the kernel serves (its shared block-max table: 6,144 blocks of 64).
pub const MAX_VOCAB: usize = 6144 * 64;

/// What the kernel returns for `n` rows (host copies).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTopK {
    /// `(n,)`.
    pub logsumexp: Vec<f32>,
    /// `(n, K)` row-major; entries past the vocabulary are `u32::MAX`.
    pub ids: Vec<u32>,
    /// `(n, K)`.
    pub logprobs: Vec<f32>,
    /// `(n,)`: −1, or the lowest id holding NaN / +inf.
    pub status: Vec<i32>,
    /// K as launched (at least 1 slot per row is written even for K = 0).
    pub stride: usize,
}

/// Whether rows of `vocab` logits on `logits`' device with this K take the GPU kernel.
pub fn takes_device_path(logits: &Tensor, vocab: usize, k: usize) -> bool {
    logits.device().is_cuda()
        && k <= MAX_K
        && vocab <= MAX_VOCAB
        && !crate::switches::is("FORKSCORE_VOCAB_TOPK", "host")
}

/// Run the kernel over `logits (n, V)` (f32, on CUDA).
#[cfg(feature = "cuda")]
pub fn device_top_k(logits: &Tensor, k: usize) -> candle_core::Result<DeviceTopK> {
    cuda::run(logits, k)
}

#[cfg(not(feature = "cuda"))]
pub fn device_top_k(_logits: &Tensor, _k: usize) -> candle_core::Result<DeviceTopK> {
    candle_core::bail!("the GPU top-K kernel needs the `cuda` feature")
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{DType, Result, Tensor};

    use super::{DeviceTopK, MAX_K, MAX_VOCAB};
    use crate::candle::cuda::cuda_module::{self, contiguous_view};

    /// nvcc's fat binary of `kernels/cuda/vocab_topk.cu` (the `forkscore-kernels` crate).
    static FATBIN: &[u8] = forkscore_kernels::fatbin::VOCAB_TOPK;
    /// Must match the kernel: one block of this many threads per row.
    const THREADS: u32 = 1024;
    const OP: &str = "vocabulary top-K";

    pub(super) fn run(logits: &Tensor, k: usize) -> Result<DeviceTopK> {
        let (n, vocab) = logits.dims2()?;
        if logits.dtype() != DType::F32 {
            candle_core::bail!("{OP}: logits are {:?}, expected f32", logits.dtype());
        }
        if k > MAX_K || vocab > MAX_VOCAB || vocab == 0 || n == 0 {
            candle_core::bail!(
                "{OP}: {n} rows of {vocab} logits with K = {k} are outside the kernel's limits (K ≤ {MAX_K}, 1 ≤ V ≤ {MAX_VOCAB})"
            );
        }
        let candle_core::Device::Cuda(dev) = logits.device() else {
            candle_core::bail!("{OP}: logits are not on a CUDA device")
        };
        let logits = logits.contiguous()?;
        let (storage, layout) = logits.storage_and_layout();
        let x = contiguous_view::<f32>(&storage, &layout, OP, "logits")?;
        let stride = k.max(1);
        let stream = dev.cuda_stream();
        // SAFETY: the kernel writes the logsumexp and status of every row, and all `stride`
        // entries of every row's top K (sentinels past the vocabulary), unless the row is
        // refused, in which case only its status is read back as meaningful.
        let mut lse = unsafe { stream.alloc::<f32>(n) }.w()?;
        let mut ids = unsafe { stream.alloc::<u32>(n * stride) }.w()?;
        let mut lp = unsafe { stream.alloc::<f32>(n * stride) }.w()?;
        let mut status = unsafe { stream.alloc::<i32>(n) }.w()?;
        let func = cuda_module::load(dev, "vocab_topk", FATBIN)?
            .load_function("vocab_topk_f32")
            .w()?;
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [n as i32, vocab as i32, k as i32];
        let mut builder = stream.launch_builder(&func);
        builder.arg(&x);
        for v in &ints {
            builder.arg(v);
        }
        builder.arg(&mut lse);
        builder.arg(&mut ids);
        builder.arg(&mut lp);
        builder.arg(&mut status);
        // SAFETY: argument types and order match the kernel's signature; limits checked above.
        unsafe { builder.launch(cfg) }.w()?;
        drop(builder);
        drop(storage);
        Ok(DeviceTopK {
            logsumexp: stream.clone_dtoh(&lse).w()?,
            ids: stream.clone_dtoh(&ids).w()?,
            logprobs: stream.clone_dtoh(&lp).w()?,
            status: stream.clone_dtoh(&status).w()?,
            stride,
        })
    }
}
