//! A projection's output into head-major attention heads with the per-head RMSNorm and the
//! rotary embedding fused, on CUDA in bf16 (`kernels/cuda/heads_norm_rope.cu`): one read of the
//! projection and one write of the heads, instead of the candle form's norm, transpose copy,
//! rotary narrow copy, rope kernel and concatenation. The candle form
//! (`SelfAttention::heads` + `RopeTables::apply`) is the reference every other device and
//! dtype runs; the two agree to one bf16 rounding step (the rope's products stay f32 here), and
//! the GPU tests hold this path to the CPU f32 reference like the rest of a bf16 layer.
//!
//! In: `x (B, L, H, hd)` bf16, a view whose last dim is contiguous and whose rows follow each
//! other (`stride(0) = L · stride(1)`; the query half of a gated layer's `q | gate` interleave is
//! read in place), the norm's effective weight `(hd,)` bf16 and eps (or none), the call's rotary
//! tables `cos, sin (B, L, R/2)` bf16. Out: `(B, H, L, hd)` bf16 contiguous. [`reference`] is the
//! candle form on the same inputs (the GPU test compares the two).

use candle_core::{Result, Tensor};

/// The kernel's head width bound (`MAX_HD` of the source).
const MAX_HD: usize = 512;
/// Warps per block (`WARPS` of the source).
const WARPS: usize = 8;

/// Whether the fused kernel runs this call (see the module docs for the layout it reads).
pub fn takes(x: &Tensor, weight: Option<&Tensor>, cos: &Tensor, sin: &Tensor) -> bool {
    if !cfg!(feature = "cuda") || !x.device().is_cuda() || x.dtype() != candle_core::DType::BF16 {
        return false;
    }
    let Ok((b, l, h, hd)) = x.dims4() else {
        return false;
    };
    let st = x.stride();
    let rot = 2 * cos.dim(2).unwrap_or(usize::MAX / 4);
    let even = |v: usize| v.is_multiple_of(2);
    st[3] == 1
        && (b == 1 || st[0] == l * st[1])
        && even(st[1])
        && even(st[2])
        && even(x.layout().start_offset())
        && even(hd)
        && hd <= MAX_HD
        && even(rot)
        && rot > 0
        && rot <= hd
        && cos.dims() == [b, l, rot / 2]
        && sin.dims() == cos.dims()
        && cos.dtype() == x.dtype()
        && sin.dtype() == x.dtype()
        && weight.is_none_or(|w| w.dims() == [hd] && w.dtype() == x.dtype())
        && (b * l * h).div_ceil(WARPS) < i32::MAX as usize
}

/// `x (B, L, H, hd)` -> `(B, H, L, hd)`: normed by `norm` (weight, eps) when given, the first
/// `R` dims rotated by `cos, sin`. Call only where [`takes`] holds.
#[cfg(feature = "cuda")]
pub fn norm_rope(
    x: &Tensor,
    norm: Option<(&Tensor, f32)>,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let op = kernel::HeadsNormRope {
        weight: norm.map(|(w, _)| w.contiguous()).transpose()?,
        eps: norm.map_or(0.0, |(_, e)| e),
        cos: cos.contiguous()?,
        sin: sin.contiguous()?,
    };
    x.apply_op1_no_bwd(&op)
}

/// Without the `cuda` feature [`takes`] is false.
#[cfg(not(feature = "cuda"))]
pub fn norm_rope(
    _x: &Tensor,
    _norm: Option<(&Tensor, f32)>,
    _cos: &Tensor,
    _sin: &Tensor,
) -> Result<Tensor> {
    candle_core::bail!("the fused heads kernel needs the `cuda` feature")
}

/// The candle form of [`norm_rope`] on any device and dtype, the model's own path: candle's
/// rmsnorm, the head-major copy, then the rotation of the first `R` dims.
pub fn reference(
    x: &Tensor,
    norm: Option<(&Tensor, f32)>,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let x = match norm {
        Some((w, eps)) => candle_nn::ops::rms_norm(&x, w, eps)?,
        None => x,
    };
    let x = x.transpose(1, 2)?.contiguous()?;
    crate::candle::layers::rope::rotate(&x, cos, sin)
        .map_err(|e| candle_core::Error::Msg(e.to_string()))
}

#[cfg(feature = "cuda")]
mod kernel {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
    use half::bf16;

    use super::WARPS;
    use crate::candle::cuda::cuda_module;

    /// nvcc's fat binary of `kernels/cuda/heads_norm_rope.cu`.
    static FATBIN: &[u8] = forkscore_kernels::fatbin::HEADS_NORM_ROPE;

    pub(super) struct HeadsNormRope {
        pub weight: Option<Tensor>,
        pub eps: f32,
        pub cos: Tensor,
        pub sin: Tensor,
    }

    impl CustomOp1 for HeadsNormRope {
        fn name(&self) -> &'static str {
            "heads-norm-rope"
        }

        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<(candle_core::CpuStorage, Shape)> {
            candle_core::bail!("the fused heads kernel runs on CUDA only")
        }

        fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
            if x.dtype() != DType::BF16 {
                candle_core::bail!("heads_norm_rope: {:?} input, expected bf16", x.dtype());
            }
            let &[b, l, h, hd] = xl.dims() else {
                candle_core::bail!(
                    "heads_norm_rope: input {:?} is not (B, L, H, hd)",
                    xl.dims()
                );
            };
            let st = xl.stride();
            if st[3] != 1 || (b > 1 && st[0] != l * st[1]) {
                candle_core::bail!("heads_norm_rope: unsupported strides {st:?}");
            }
            let dev = x.device().clone();
            let tokens = b * l;
            // the view's extent from its start: the last token's last head's last element
            let extent = (tokens.max(1) - 1) * st[1] + (h.max(1) - 1) * st[2] + hd;
            let start = xl.start_offset();
            let xv = x.as_cuda_slice::<bf16>()?.slice(start..start + extent);
            let (c_s, c_l) = self.cos.storage_and_layout();
            let cv = cuda_module::contiguous_view::<bf16>(&c_s, c_l, "heads_norm_rope", "cos")?;
            let (s_s, s_l) = self.sin.storage_and_layout();
            let sv = cuda_module::contiguous_view::<bf16>(&s_s, s_l, "heads_norm_rope", "sin")?;
            let rot = 2 * c_l.dims().last().copied().unwrap_or(0);
            let w = self.weight.as_ref().map(|w| w.storage_and_layout());
            let wv = match &w {
                Some((ws, wl)) => Some(cuda_module::contiguous_view::<bf16>(
                    ws,
                    wl,
                    "heads_norm_rope",
                    "weight",
                )?),
                None => None,
            };
            let n = tokens * h * hd;
            // SAFETY: one warp per (token, head) writes that head's hd outputs: all n.
            let mut out = unsafe { dev.alloc::<bf16>(n)? };
            let func = cuda_module::load(&dev, "heads_norm_rope", FATBIN)?
                .load_function("heads_norm_rope_bf16")
                .w()?;
            let cfg = LaunchConfig {
                grid_dim: ((tokens * h).div_ceil(WARPS) as u32, 1, 1),
                block_dim: ((WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let (t_i, l_i, h_i, hd_i, rot_i) =
                (tokens as i32, l as i32, h as i32, hd as i32, rot as i32);
            let (tok_stride, head_stride) = (st[1] as i64, st[2] as i64);
            let null: u64 = 0;
            let stream = dev.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            builder.arg(&xv);
            match &wv {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
            builder.arg(&cv);
            builder.arg(&sv);
            builder.arg(&mut out);
            builder.arg(&t_i);
            builder.arg(&l_i);
            builder.arg(&h_i);
            builder.arg(&hd_i);
            builder.arg(&rot_i);
            builder.arg(&tok_stride);
            builder.arg(&head_stride);
            builder.arg(&self.eps);
            // SAFETY: argument types and order match the kernel's signature; `takes` checked
            // the layout (even strides and widths, hd ≤ MAX_HD, tables of (B, L, R/2)).
            unsafe { builder.launch(cfg) }.w()?;
            drop(builder);
            Ok((bf16::wrap_cuda_slice(out, dev), Shape::from((b, h, l, hd))))
        }
    }
}
