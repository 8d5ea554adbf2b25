//! A projection's output into head-major attention heads with the per-head RMSNorm and the
//! rotary embedding fused, on CUDA in bf16 (`kernels/cuda/heads_norm_rope.cu`): one read of the
//! projection and one write of the heads, instead of the candle form's norm, transpose copy,
//! rotary narrow copy, rope kernel and concatenation. For a biased projection (the Qwen2
//! family's stacked q|k|v) the same pass adds the bias the product left out ([`bias_rope`]:
//! queries and keys rotated, values only laid out head-major), instead of candle's bias add over
//! the whole product and the values' transpose copy. The candle form
//! (`SelfAttention::heads` + `RopeTables::apply`) is the reference every other device and
//! dtype runs; the two agree to one bf16 rounding step (the rope's products stay f32 here), and
//! the GPU tests hold this path to the CPU f32 reference like the rest of a bf16 layer.
//!
//! In: `x (B, L, H, hd)` bf16, a view whose last dim is contiguous and whose rows follow each
//! other (`stride(0) = L · stride(1)`; the query half of a gated layer's `q | gate` interleave is
//! read in place), the norm's effective weight `(hd,)` bf16 and eps (or none), the call's rotary
//! tables `cos, sin (B, L, R/2)` bf16, or a bias `(H·hd,)` bf16 and optionally the tables. Out:
//! `(B, H, L, hd)` bf16 contiguous. [`reference`] and [`reference_biased`] are the candle forms
//! on the same inputs (the GPU test compares them).

use candle_core::{Result, Tensor};

/// The kernel's head width bound (`MAX_HD` of the source).
const MAX_HD: usize = 512;
/// Warps per block (`WARPS` of the source).
const WARPS: usize = 8;

/// Whether the fused kernel runs this call (see the module docs for the layout it reads).
pub fn takes(x: &Tensor, weight: Option<&Tensor>, cos: &Tensor, sin: &Tensor) -> bool {
    takes_with(x, weight, Some((cos, sin)), None)
}

/// Whether the fused kernel runs a call that adds `bias` `(H·hd,)` to every head before the
/// rotation `rope` (none: the heads are only laid out head-major, as a value projection's are),
/// with no norm: the heads of a biased projection whose product left its bias out.
pub fn takes_biased(x: &Tensor, bias: &Tensor, rope: Option<(&Tensor, &Tensor)>) -> bool {
    takes_with(x, None, rope, Some(bias))
}

fn takes_with(
    x: &Tensor,
    weight: Option<&Tensor>,
    rope: Option<(&Tensor, &Tensor)>,
    bias: Option<&Tensor>,
) -> bool {
    if !cfg!(feature = "cuda") || !x.device().is_cuda() || x.dtype() != candle_core::DType::BF16 {
        return false;
    }
    let Ok((b, l, h, hd)) = x.dims4() else {
        return false;
    };
    let st = x.stride();
    let even = |v: usize| v.is_multiple_of(2);
    let rope_ok = match rope {
        None => true,
        Some((cos, sin)) => {
            let rot = 2 * cos.dim(2).unwrap_or(usize::MAX / 4);
            even(rot)
                && rot > 0
                && rot <= hd
                && cos.dims() == [b, l, rot / 2]
                && sin.dims() == cos.dims()
                && cos.dtype() == x.dtype()
                && sin.dtype() == x.dtype()
        }
    };
    let bias_ok = bias.is_none_or(|t| {
        t.dims() == [h * hd]
            && t.dtype() == x.dtype()
            && t.is_contiguous()
            && even(t.layout().start_offset())
    });
    st[3] == 1
        && (b == 1 || st[0] == l * st[1])
        && even(st[1])
        && even(st[2])
        && even(x.layout().start_offset())
        && even(hd)
        && hd <= MAX_HD
        && rope_ok
        && bias_ok
        && weight.is_none_or(|w| w.dims() == [hd] && w.dtype() == x.dtype())
        && (b * l * h).div_ceil(WARPS) < i32::MAX as usize
}

/// `x (B, L, H, hd)` -> `(B, H, L, hd)`: normed by `norm` (weight, eps) when given, the first
/// `R` dims rotated by `cos, sin`. Call only where [`takes`] holds.
pub fn norm_rope(
    x: &Tensor,
    norm: Option<(&Tensor, f32)>,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    launch(x, norm, Some((cos, sin)), None)
}

/// `x (B, L, H, hd)` -> `(B, H, L, hd)`: `bias (H·hd,)` added to every head (rounded to bf16 as
/// candle's add rounds it), then the first `R` dims rotated by `rope` when given. Call only
/// where [`takes_biased`] holds.
pub fn bias_rope(x: &Tensor, bias: &Tensor, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
    launch(x, None, rope, Some(bias))
}

#[cfg(feature = "cuda")]
fn launch(
    x: &Tensor,
    norm: Option<(&Tensor, f32)>,
    rope: Option<(&Tensor, &Tensor)>,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    let op = kernel::HeadsNormRope {
        weight: norm.map(|(w, _)| w.contiguous()).transpose()?,
        eps: norm.map_or(0.0, |(_, e)| e),
        rope: rope
            .map(|(c, s)| Ok::<_, candle_core::Error>((c.contiguous()?, s.contiguous()?)))
            .transpose()?,
        bias: bias.cloned(),
    };
    x.apply_op1_no_bwd(&op)
}

/// Without the `cuda` feature [`takes`] and [`takes_biased`] are false.
#[cfg(not(feature = "cuda"))]
fn launch(
    _x: &Tensor,
    _norm: Option<(&Tensor, f32)>,
    _rope: Option<(&Tensor, &Tensor)>,
    _bias: Option<&Tensor>,
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

/// The candle form of [`bias_rope`] on any device and dtype: the bias added to `x` as the
/// product's bias add does, the head-major copy, then the rotation when given.
pub fn reference_biased(
    x: &Tensor,
    bias: &Tensor,
    rope: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    let (_, _, h, hd) = x.dims4()?;
    let x = x.broadcast_add(&bias.reshape((h, hd))?)?;
    let x = x.transpose(1, 2)?.contiguous()?;
    match rope {
        Some((cos, sin)) => crate::candle::layers::rope::rotate(&x, cos, sin)
            .map_err(|e| candle_core::Error::Msg(e.to_string())),
        None => Ok(x),
    }
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
        /// cos, sin `(B, L, R/2)`; none: no rotation (R = 0)
        pub rope: Option<(Tensor, Tensor)>,
        /// `(H·hd,)`, contiguous
        pub bias: Option<Tensor>,
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
            let tables = self
                .rope
                .as_ref()
                .map(|(c, s)| (c.storage_and_layout(), s.storage_and_layout()));
            let (cv, sv, rot) = match &tables {
                Some(((c_s, c_l), (s_s, s_l))) => (
                    Some(cuda_module::contiguous_view::<bf16>(
                        c_s,
                        c_l,
                        "heads_norm_rope",
                        "cos",
                    )?),
                    Some(cuda_module::contiguous_view::<bf16>(
                        s_s,
                        s_l,
                        "heads_norm_rope",
                        "sin",
                    )?),
                    2 * c_l.dims().last().copied().unwrap_or(0),
                ),
                None => (None, None, 0),
            };
            let bias = self.bias.as_ref().map(|b| b.storage_and_layout());
            let bv = match &bias {
                Some((b_s, b_l)) => {
                    if b_l.dims() != [h * hd] {
                        candle_core::bail!(
                            "heads_norm_rope: bias {:?}, expected ({})",
                            b_l.dims(),
                            h * hd
                        );
                    }
                    Some(cuda_module::contiguous_view::<bf16>(
                        b_s,
                        b_l,
                        "heads_norm_rope",
                        "bias",
                    )?)
                }
                None => None,
            };
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
            match &bv {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
            match &wv {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
            match &cv {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
            match &sv {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
            builder.arg(&mut out);
            builder.arg(&t_i);
            builder.arg(&l_i);
            builder.arg(&h_i);
            builder.arg(&hd_i);
            builder.arg(&rot_i);
            builder.arg(&tok_stride);
            builder.arg(&head_stride);
            builder.arg(&self.eps);
            // SAFETY: argument types and order match the kernel's signature; `takes` /
            // `takes_biased` checked the layout (even strides, widths and bias offset,
            // hd ≤ MAX_HD, tables of (B, L, R/2), a bias of H·hd).
            unsafe { builder.launch(cfg) }.w()?;
            drop(builder);
            Ok((bf16::wrap_cuda_slice(out, dev), Shape::from((b, h, l, hd))))
        }
    }
}
