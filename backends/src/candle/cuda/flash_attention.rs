//! Flash-style attention on NVIDIA GPUs (`kernels/cuda/flash_attn.cu`): the same function as the
//! candle path of [`super::super::layers::attention::attend`], without materialising the score matrix. One
//! kernel serves prefill (no past), chunked prefill (a past of one slot), and forked scoring
//! rows over one shared prefix or several left-padded slots.
//!
//! In (bf16, on one CUDA device): `q (B, H, L, hd)`, `k_new, v_new (B, Hkv, L, hd)`, optionally
//! the past `k, v (Hkv, S, P, hd)` of `S` slots (row `b` continues slot `b / (B/S)`) and
//! `past_start (B,)` u32, each row's first visible past key (its left padding is hidden), and
//! optionally a token tree's `(L, L)` u8 visibility (the new tokens are packed tree nodes, parents
//! first). Out: `(B, L, H·hd)` bf16. Query `l` sees the visible past and new keys `0..=l`, under
//! a tree only those its visibility row opens.
//!
//! Supported: bf16, `hd ∈ {64, 128, 256}`, `H` a multiple of `Hkv`; [`supports`] says whether
//! a call can take this path. Without the `cuda` feature, or on another device, it is false.

use candle_core::{DType, Tensor};

use super::super::layers::past_kv::PastKv;
use crate::error::CandleError;

/// Whether the flash kernel can compute this call.
pub(crate) fn supports(q: &Tensor, k_new: &Tensor, past: Option<&PastKv<'_>>) -> bool {
    let (Ok((_, h, _, hd)), Ok((_, hkv, _, _))) = (q.dims4(), k_new.dims4()) else {
        return false;
    };
    cfg!(feature = "cuda")
        && q.device().is_cuda()
        && q.dtype() == DType::BF16
        && k_new.dtype() == DType::BF16
        && past.is_none_or(|p| p.k.dtype() == DType::BF16 && p.v.dtype() == DType::BF16)
        && matches!(hd, 64 | 128 | 256)
        && hkv > 0
        && h % hkv == 0
}

/// Attention output `(B, L, H·hd)`; see the module docs.
#[cfg(feature = "cuda")]
pub(crate) fn attend(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<&PastKv<'_>>,
    past_start: Option<&Tensor>,
    tree: Option<&Tensor>,
) -> Result<Tensor, CandleError> {
    cuda::attend(q, k_new, v_new, past, past_start, tree)
        .map_err(CandleError::tensor("flash attention"))
}

/// Without the `cuda` feature there is no flash kernel ([`supports`] is false).
#[cfg(not(feature = "cuda"))]
pub(crate) fn attend(
    _q: &Tensor,
    _k_new: &Tensor,
    _v_new: &Tensor,
    _past: Option<&PastKv<'_>>,
    _past_start: Option<&Tensor>,
    _tree: Option<&Tensor>,
) -> Result<Tensor, CandleError> {
    Err(CandleError::InvalidRequest {
        reason: "the flash attention kernel needs the `cuda` feature".into(),
    })
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, CustomOp1, Layout, Result, Shape, Tensor};
    use half::bf16;

    use super::PastKv;
    use crate::candle::cuda::cuda_module::{self, contiguous_view};

    /// nvcc's fat binary of `kernels/cuda/flash_attn.cu` (the `forkscore-kernels` crate).
    static FATBIN: &[u8] = forkscore_kernels::fatbin::FLASH_ATTN;
    /// Must match the kernel source: query rows per block, threads, shared-row padding, and the
    /// key tile per head dim.
    const BLOCK_ROWS: usize = 64;
    const THREADS: u32 = 128;
    const PAD: usize = 8;
    fn key_tile(hd: usize) -> usize {
        if hd == 256 {
            32
        } else {
            64
        }
    }
    /// Dynamic shared memory: the query tile and two buffers of K and V tiles, bf16.
    fn smem_bytes(hd: usize) -> usize {
        (BLOCK_ROWS + 4 * key_tile(hd)) * (hd + PAD) * 2
    }

    /// Applied to `q`, holding the other operands.
    struct FlashAttention {
        k_new: Tensor,
        v_new: Tensor,
        past: Option<(Tensor, Tensor)>,
        past_start: Option<Tensor>,
        tree: Option<Tensor>,
    }

    const OP: &str = "flash attention";

    impl CustomOp1 for FlashAttention {
        fn name(&self) -> &'static str {
            "flash-attention"
        }

        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<(candle_core::CpuStorage, Shape)> {
            candle_core::bail!("the flash attention kernel runs on CUDA only")
        }

        fn cuda_fwd(&self, q: &CudaStorage, q_l: &Layout) -> Result<(CudaStorage, Shape)> {
            let (b, h, l, hd) = q_l.shape().dims4()?;
            let (_, hkv, _, _) = self.k_new.dims4()?;
            let dev = q.device().clone();
            if !q_l.is_contiguous() {
                candle_core::bail!("{OP}: q is not contiguous");
            }
            let start = q_l.start_offset();
            let q = q
                .as_cuda_slice::<bf16>()?
                .slice(start..start + q_l.shape().elem_count());
            let (kn_s, kn_l) = self.k_new.storage_and_layout();
            let kn = contiguous_view::<bf16>(&kn_s, kn_l, OP, "new keys")?;
            let (vn_s, vn_l) = self.v_new.storage_and_layout();
            let vn = contiguous_view::<bf16>(&vn_s, vn_l, OP, "new values")?;
            let past_guard = self
                .past
                .as_ref()
                .map(|(k, v)| (k.storage_and_layout(), v.storage_and_layout()));
            let past = match &past_guard {
                Some(((ks, kl), (vs, vl))) => Some((
                    contiguous_view::<bf16>(ks, kl, OP, "past keys")?,
                    contiguous_view::<bf16>(vs, vl, OP, "past values")?,
                )),
                None => None,
            };
            let (slots, p) = match &self.past {
                Some((k, _)) => (k.dim(1)?, k.dim(2)?),
                None => (0, 0),
            };
            let start_guard = self.past_start.as_ref().map(|t| t.storage_and_layout());
            let past_start = match &start_guard {
                Some((s, layout)) => Some(contiguous_view::<u32>(s, layout, OP, "past starts")?),
                None => None,
            };
            let tree_guard = self.tree.as_ref().map(|t| t.storage_and_layout());
            let tree = match &tree_guard {
                Some((s, layout)) => Some(contiguous_view::<u8>(s, layout, OP, "tree visibility")?),
                None => None,
            };

            // SAFETY: the kernel writes every output element (each query row of every block).
            let mut out = unsafe { dev.alloc::<bf16>(b * l * h * hd)? };
            let func = cuda_module::load(&dev, "flash_attn", FATBIN)?
                .load_function(&format!("flash_attn_hd{hd}"))
                .w()?;
            let smem = smem_bytes(hd);
            func.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .w()?;
            let g = h / hkv;
            let cfg = LaunchConfig {
                grid_dim: ((g * l).div_ceil(BLOCK_ROWS) as u32, hkv as u32, b as u32),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let scale_log2 = (hd as f32).powf(-0.5) * std::f32::consts::LOG2_E;
            let ints = [b, h, hkv, l, slots, p].map(|v| v as i32);
            let null: u64 = 0;
            let stream = dev.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            builder.arg(&q);
            builder.arg(&kn);
            builder.arg(&vn);
            match &past {
                Some((k, v)) => {
                    builder.arg(k);
                    builder.arg(v);
                }
                None => {
                    builder.arg(&null);
                    builder.arg(&null);
                }
            }
            match &past_start {
                Some(s) => builder.arg(s),
                None => builder.arg(&null),
            };
            match &tree {
                Some(t) => builder.arg(t),
                None => builder.arg(&null),
            };
            builder.arg(&mut out);
            for v in &ints {
                builder.arg(v);
            }
            builder.arg(&scale_log2);
            // SAFETY: argument types and order match the kernel's signature; shapes were
            // checked by `attend`.
            unsafe { builder.launch(cfg) }.w()?;
            drop(builder);
            Ok((
                CudaStorage::wrap_cuda_slice(out, dev),
                Shape::from((b, l, h * hd)),
            ))
        }
    }

    pub(super) fn attend(
        q: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        past: Option<&PastKv<'_>>,
        past_start: Option<&Tensor>,
        tree: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, h, l, hd) = q.dims4()?;
        let (kb, hkv, kl, khd) = k_new.dims4()?;
        if (kb, kl, khd) != (b, l, hd) || v_new.dims() != k_new.dims() || h % hkv != 0 {
            candle_core::bail!(
                "{OP}: q {:?}, new k {:?}, new v {:?} do not fit",
                q.dims(),
                k_new.dims(),
                v_new.dims()
            );
        }
        let past = match past {
            Some(PastKv { k, v }) => {
                let (phkv, slots, p, phd) = k.dims4()?;
                if phkv != hkv || phd != hd || v.dims() != k.dims() || slots == 0 || b % slots != 0
                {
                    candle_core::bail!(
                        "{OP}: past k {:?} / v {:?} do not fit {b} rows of {hkv} KV heads × {hd}",
                        k.dims(),
                        v.dims()
                    );
                }
                (p > 0).then(|| Ok::<_, candle_core::Error>((k.contiguous()?, v.contiguous()?)))
            }
            None => None,
        }
        .transpose()?;
        let past_start = match (past_start, &past) {
            (Some(s), Some(_)) => {
                if s.dims() != [b] || s.dtype() != candle_core::DType::U32 {
                    candle_core::bail!("{OP}: past starts {:?} for {b} rows", s.dims());
                }
                Some(s.contiguous()?)
            }
            _ => None,
        };
        let tree = match tree {
            Some(t) => {
                if t.dims() != [l, l] || t.dtype() != candle_core::DType::U8 {
                    candle_core::bail!("{OP}: tree visibility {:?} for {l} new tokens", t.dims());
                }
                Some(t.contiguous()?)
            }
            None => None,
        };
        let op = FlashAttention {
            k_new: k_new.contiguous()?,
            v_new: v_new.contiguous()?,
            past,
            past_start,
            tree,
        };
        q.contiguous()?.apply_op1_no_bwd(&op)
    }
}
