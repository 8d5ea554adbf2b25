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
//! Two batched forms take many contexts in one launch, each bit-identical to its solo launch
//! (the kernel lays out a segment's or a slot's blocks exactly as its solo call does):
//! [`attend_varlen`] — a packed prefill's segments back to back, each attending only to itself;
//! [`attend_slot_table`] — scoring rows over several separately stored pasts (one per slot).
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

/// The error of every entry point built without the `cuda` feature ([`supports`] is false there,
/// so callers never reach it).
#[cfg(not(feature = "cuda"))]
fn needs_cuda() -> CandleError {
    CandleError::InvalidRequest {
        reason: "the flash attention kernel needs the `cuda` feature".into(),
    }
}

/// Packed prefill: q `(1, H, T, hd)`, k / v `(1, Hkv, T, hd)` holding the segments
/// `(start, len)` back to back (covering `0..T` in order) -> `(1, T, H·hd)`, each segment
/// attending causally to itself only, bit-identical to [`attend`] on that segment alone.
#[cfg(feature = "cuda")]
pub(crate) fn attend_varlen(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    segments: &[(usize, usize)],
) -> Result<Tensor, CandleError> {
    cuda::attend_varlen(q, k_new, v_new, segments)
        .map_err(CandleError::tensor("flash attention (varlen)"))
}

/// Scoring rows over `S` slots: q `(B, H, L, hd)`, the new k / v `(B, Hkv, L, hd)` with
/// `B / S` consecutive rows per slot, slot `s`'s past `(Hkv, 1, P_s, hd)` (all of it visible)
/// -> `(B, L, H·hd)`. A slot's rows at positions below its own call length are bit-identical to
/// [`attend`] over that slot alone; later positions are padding (finite, never read).
#[cfg(feature = "cuda")]
pub(crate) fn attend_slot_table(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    slots: &[(Tensor, Tensor)],
) -> Result<Tensor, CandleError> {
    cuda::attend_slot_table(q, k_new, v_new, slots)
        .map_err(CandleError::tensor("flash attention (slot table)"))
}

/// Without the `cuda` feature there is no flash kernel ([`supports`] is false).
#[cfg(not(feature = "cuda"))]
pub(crate) fn attend_varlen(
    _q: &Tensor,
    _k_new: &Tensor,
    _v_new: &Tensor,
    _segments: &[(usize, usize)],
) -> Result<Tensor, CandleError> {
    Err(needs_cuda())
}

/// Without the `cuda` feature there is no flash kernel ([`supports`] is false).
#[cfg(not(feature = "cuda"))]
pub(crate) fn attend_slot_table(
    _q: &Tensor,
    _k_new: &Tensor,
    _v_new: &Tensor,
    _slots: &[(Tensor, Tensor)],
) -> Result<Tensor, CandleError> {
    Err(needs_cuda())
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
    Err(needs_cuda())
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
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
        batched: Batched,
    }

    /// The batched forms of one launch (see the kernel's `seg_off` / `slot_past`).
    enum Batched {
        None,
        /// Segment `(start, len)`s of a packed prefill, back to back over `0..T`.
        Varlen(Vec<(usize, usize)>),
        /// One contiguous past `(Hkv, 1, P_s, hd)` per slot.
        SlotTable(Vec<(Tensor, Tensor)>),
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

            let stream = dev.cuda_stream();
            let g = h / hkv;
            // The varlen segment offsets, or the slot table (addresses read while the guards
            // below hold each slot's storage), uploaded for this launch.
            let mut n_seg = 0i32;
            let mut blocks_x = (g * l).div_ceil(BLOCK_ROWS);
            let seg_off = match &self.batched {
                Batched::Varlen(segs) => {
                    let mut offs = Vec::with_capacity(segs.len() + 1);
                    offs.push(0i32);
                    for &(start, len) in segs {
                        offs.push((start + len) as i32);
                    }
                    n_seg = segs.len() as i32;
                    blocks_x = segs
                        .iter()
                        .map(|&(_, n)| (g * n).div_ceil(BLOCK_ROWS))
                        .sum();
                    Some(stream.clone_htod(&offs).w()?)
                }
                _ => None,
            };
            let slot_guard: Vec<_> = match &self.batched {
                Batched::SlotTable(slots) => slots
                    .iter()
                    .map(|(k, v)| (k.storage_and_layout(), v.storage_and_layout()))
                    .collect(),
                _ => Vec::new(),
            };
            let slot_views = slot_guard
                .iter()
                .map(|((ks, kl), (vs, vl))| {
                    let p = kl.shape().dims()[2];
                    Ok((
                        contiguous_view::<bf16>(ks, kl, OP, "slot past keys")?,
                        contiguous_view::<bf16>(vs, vl, OP, "slot past values")?,
                        p,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let mut ptr_guards = Vec::with_capacity(2 * slot_views.len());
            let mut table = Vec::with_capacity(5 * slot_views.len());
            for (k, v, p) in &slot_views {
                let (kp, kg) = k.device_ptr(&stream);
                let (vp, vg) = v.device_ptr(&stream);
                ptr_guards.push(kg);
                ptr_guards.push(vg);
                // K and V addresses, the slot's length, head strides (contiguous: P·hd)
                let head = (p * hd) as i64;
                table.extend_from_slice(&[kp as i64, vp as i64, *p as i64, head, head]);
            }
            let slot_table = match (&self.batched, table.is_empty()) {
                (Batched::SlotTable(_), false) => Some(stream.clone_htod(&table).w()?),
                _ => None,
            };
            let (slots, p) = match (&self.batched, &self.past) {
                (Batched::SlotTable(s), _) => (s.len(), 0),
                (_, Some((k, _))) => (k.dim(1)?, k.dim(2)?),
                _ => (0, 0),
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
            let cfg = LaunchConfig {
                grid_dim: (blocks_x as u32, hkv as u32, b as u32),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let scale_log2 = (hd as f32).powf(-0.5) * std::f32::consts::LOG2_E;
            let ints = [b, h, hkv, l, slots, p].map(|v| v as i32);
            let null: u64 = 0;
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
            match &seg_off {
                Some(s) => builder.arg(s),
                None => builder.arg(&null),
            };
            builder.arg(&n_seg);
            match &slot_table {
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
            drop(ptr_guards);
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
            batched: Batched::None,
        };
        q.contiguous()?.apply_op1_no_bwd(&op)
    }

    /// Shapes of a batched call: q `(B, H, L, hd)` and k / v `(B, Hkv, L, hd)` that fit.
    fn check_new(q: &Tensor, k_new: &Tensor, v_new: &Tensor) -> Result<(usize, usize, usize)> {
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
        Ok((b, l, hkv))
    }

    pub(super) fn attend_varlen(
        q: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        segments: &[(usize, usize)],
    ) -> Result<Tensor> {
        let (b, t, _) = check_new(q, k_new, v_new)?;
        let mut next = 0;
        for &(start, len) in segments {
            if start != next {
                candle_core::bail!("{OP}: segments {segments:?} do not lie back to back from 0");
            }
            next = start + len;
        }
        if b != 1 || next != t {
            candle_core::bail!("{OP}: segments {segments:?} do not cover one row of {t} tokens");
        }
        let op = FlashAttention {
            k_new: k_new.contiguous()?,
            v_new: v_new.contiguous()?,
            past: None,
            past_start: None,
            tree: None,
            batched: Batched::Varlen(segments.to_vec()),
        };
        q.contiguous()?.apply_op1_no_bwd(&op)
    }

    pub(super) fn attend_slot_table(
        q: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        slots: &[(Tensor, Tensor)],
    ) -> Result<Tensor> {
        let (b, _, hkv) = check_new(q, k_new, v_new)?;
        let hd = q.dim(3)?;
        if slots.is_empty() || b % slots.len() != 0 {
            candle_core::bail!("{OP}: {b} rows cannot be split over {} slots", slots.len());
        }
        let slots = slots
            .iter()
            .map(|(k, v)| {
                let (sh, one, _, sd) = k.dims4()?;
                if (sh, one, sd) != (hkv, 1, hd) || v.dims() != k.dims() {
                    candle_core::bail!(
                        "{OP}: slot past k {:?} / v {:?} do not fit {hkv} KV heads × {hd}",
                        k.dims(),
                        v.dims()
                    );
                }
                Ok((k.contiguous()?, v.contiguous()?))
            })
            .collect::<Result<Vec<_>>>()?;
        let op = FlashAttention {
            k_new: k_new.contiguous()?,
            v_new: v_new.contiguous()?,
            past: None,
            past_start: None,
            tree: None,
            batched: Batched::SlotTable(slots),
        };
        q.contiguous()?.apply_op1_no_bwd(&op)
    }
}
