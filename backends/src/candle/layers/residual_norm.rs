//! The residual add of a pre-norm decoder layer fused with the RMSNorm that reads it:
//! `sum = x + m`, `normed = rms_norm(sum) · w`, both `(…, D)` in the activation dtype.
//!
//! On CUDA in f32 / bf16 (D even) one kernel (`kernels/cuda/add_rms_norm.cu`) reads `x` and `m` once
//! and writes both results, instead of candle's add (read two, write one) followed by its
//! rmsnorm (read the sum twice, write one). [`reference`] is the candle form, the one every other
//! device and dtype runs, and the one the GPU equivalence test compares with.

use candle_core::{Result, Tensor};

/// `(sum, normed)` of `x + m` under the RMSNorm `weight` (`(D,)`, the effective multiplier, in
/// the activation dtype) and `eps`.
pub fn add_rms_norm(x: &Tensor, m: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if cuda::takes(x, m, weight) {
        return cuda::add_rms_norm(x, m, weight, eps);
    }
    reference(x, m, weight, eps)
}

/// The candle form: the add, then candle's rmsnorm of the rounded sum.
pub fn reference(x: &Tensor, m: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    let sum = (x + m)?.contiguous()?;
    let w = weight.to_dtype(sum.dtype())?;
    let normed = candle_nn::ops::rms_norm(&sum, &w, eps)?;
    Ok((sum, normed))
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, D};
    use half::bf16;

    use crate::candle::cuda::cuda_module;

    /// nvcc's fat binary of `kernels/cuda/add_rms_norm.cu` (the `forkscore-kernels` crate).
    static FATBIN: &[u8] = forkscore_kernels::fatbin::ADD_RMS_NORM;
    /// Must match `THREADS` of the kernel source.
    const THREADS: u32 = 256;
    /// The row is kept in shared memory as f32: at most 48 KiB without an opt-in.
    const MAX_DIM: usize = 12 * 1024;

    /// CUDA, f32 or bf16 everywhere, the same shape for `x` and `m`, an even row within
    /// [`MAX_DIM`] and at most 2^31 − 1 rows.
    pub(super) fn takes(x: &Tensor, m: &Tensor, w: &Tensor) -> bool {
        let d = x.dim(D::Minus1).unwrap_or(0);
        x.device().is_cuda()
            && matches!(x.dtype(), DType::F32 | DType::BF16)
            && m.dtype() == x.dtype()
            && w.dtype() == x.dtype()
            && x.dims() == m.dims()
            && w.dims() == [d]
            && d % 2 == 0
            && d > 0
            && d <= MAX_DIM
            && x.elem_count() / d < i32::MAX as usize
    }

    struct AddRmsNorm {
        weight: Tensor,
        eps: f32,
    }

    pub(super) fn add_rms_norm(
        x: &Tensor,
        m: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        let shape = x.shape().clone();
        let n = x.elem_count();
        let op = AddRmsNorm {
            weight: weight.contiguous()?,
            eps,
        };
        // (2·N,) = [sum | normed]
        let flat = x.contiguous()?.apply_op2_no_bwd(&m.contiguous()?, &op)?;
        let sum = flat.narrow(0, 0, n)?.reshape(&shape)?;
        let normed = flat.narrow(0, n, n)?.reshape(&shape)?;
        Ok((sum, normed))
    }

    fn launch<T: CudaDType + DeviceRepr>(
        name: &str,
        x: (&CudaStorage, &Layout),
        m: (&CudaStorage, &Layout),
        w: &Tensor,
        eps: f32,
    ) -> Result<CudaStorage> {
        let dev = x.0.device().clone();
        let n = x.1.shape().elem_count();
        let d = x.1.shape().dims().last().copied().unwrap_or(0);
        let rows = n / d.max(1);
        let (xs, ms) = (x.1.start_offset(), m.1.start_offset());
        let xv = x.0.as_cuda_slice::<T>()?.slice(xs..xs + n);
        let mv = m.0.as_cuda_slice::<T>()?.slice(ms..ms + n);
        let (w_s, w_l) = w.storage_and_layout();
        let wv = cuda_module::contiguous_view::<T>(&w_s, w_l, "add_rms_norm", "weight")?;
        // SAFETY: the kernel writes all 2·n outputs (every row's sum and normed halves).
        let mut out = unsafe { dev.alloc::<T>(2 * n)? };
        let (mut sum, mut normed) = out.split_at_mut(n);
        let func = cuda_module::load(&dev, "add_rms_norm", FATBIN)?
            .load_function(name)
            .w()?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: (4 * d) as u32,
        };
        let d_i = d as i32;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(&xv);
        builder.arg(&mv);
        builder.arg(&wv);
        builder.arg(&mut sum);
        builder.arg(&mut normed);
        builder.arg(&d_i);
        builder.arg(&eps);
        // SAFETY: argument types and order match the kernel's signature; `takes` checked the
        // shapes (same shape, even D within the shared-memory budget).
        unsafe { builder.launch(cfg) }.w()?;
        drop(builder);
        Ok(T::wrap_cuda_slice(out, dev))
    }

    impl CustomOp2 for AddRmsNorm {
        fn name(&self) -> &'static str {
            "add-rms-norm"
        }

        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &Layout,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<(candle_core::CpuStorage, Shape)> {
            candle_core::bail!("the fused add + RMSNorm kernel runs on CUDA only")
        }

        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            m: &CudaStorage,
            ml: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            if !xl.is_contiguous() || !ml.is_contiguous() || xl.shape() != ml.shape() {
                candle_core::bail!("add_rms_norm: inputs must be contiguous and of one shape");
            }
            let n = xl.shape().elem_count();
            let out = match x.dtype() {
                DType::BF16 => launch::<bf16>(
                    "add_rms_norm_bf16",
                    (x, xl),
                    (m, ml),
                    &self.weight,
                    self.eps,
                )?,
                DType::F32 => {
                    launch::<f32>("add_rms_norm_f32", (x, xl), (m, ml), &self.weight, self.eps)?
                }
                other => candle_core::bail!("add_rms_norm: no kernel for {other:?}"),
            };
            Ok((out, Shape::from(2 * n)))
        }
    }
}
