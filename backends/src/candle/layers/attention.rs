//! Grouped-query scaled dot-product attention of new tokens over a retained past plus
//! themselves, with the softmax in f32.
//!
//! In: queries `(B, H, L, hd)`, the new keys/values `(B, Hkv, L, hd)`, and optionally the past
//! K/V of `S` slots in KV-head-major layout `(Hkv, S, P, hd)`, where `S` divides `B` and rows are
//! slot-major (row `b` continues slot `b / (B/S)`). `S == 1` is one prefix shared by every row;
//! `S == B` one past per row. Out: `(B, L, H*hd)` in the input dtype, ready for `o_proj`.
//!
//! Layout: everything is computed KV-head-major, `(Hkv, B, G, L, keys)` with `G = H / Hkv`
//! (query head `h` reads KV head `h / G`, transformers' `repeat_interleave`), so K/V are never
//! repeated per query head, and the `R = B/S` rows of a slot fold into the query axis of one
//! matmul against that slot's past `(Hkv, S, R*G*L, hd) x (Hkv, S, hd, P)` — the past is never
//! copied per row. Scores over past and new keys are concatenated before one softmax, so the
//! result equals attention over `past ++ new` in one sequence. Queries are pre-scaled by
//! `hd^-1/2` (as transformers' SDPA math path does) so no pass over the scores is spent on it.
//!
//! That candle path is the reference. On CUDA in bf16, [`super::super::cuda::flash_attention`] computes the
//! same function without materialising the scores (one kernel, online softmax; under a token
//! tree's mask it reads the tree's u8 visibility); it is taken whenever it supports the call,
//! unless [`set_kernel`] or `FORKSCORE_ATTENTION=candle` in the environment asks for the candle
//! path (to compare or profile).

use crate::candle::cpu;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use candle_core::{DType, Tensor, D};

use super::super::cuda::flash_attention;
pub use super::past_kv::PastKv;
use crate::error::CandleError;

/// Masks for one call, see [`super::mask`].
pub struct AttnMasks<'a> {
    /// `(1, 1, 1, L, L)` over the new keys: causal or a packed token tree's (each built when a
    /// path first reads it); `None` when `L == 1`.
    pub new_keys: Option<&'a super::mask::NewKeysMask>,
    /// `(1, B, 1, 1, P)`; `None` when every row sees its whole past.
    pub past: Option<&'a Tensor>,
    /// `(B,)` u32: each row's first visible past key, the same information as `past` for the
    /// flash kernel; `None` exactly when `past` is.
    pub past_start: Option<&'a Tensor>,
    /// The precision of the CPU kernel's products ([`AttnPrecision`]).
    pub precision: AttnPrecision,
}

/// The precision of attention's products on the CPU: f32 (the default), or bf16 on the AMX
/// tiles for layers whose linear weights already compute in bf16 or int8 (`--quantize
/// bf16|int8`, `--dtype bf16` on the CPU: `forkscore_kernels::cpu::attention`'s `bf16`), where
/// AMX runs; the f32 forms elsewhere. GPUs ignore it (their precision is the model's dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttnPrecision {
    #[default]
    F32,
    Bf16,
}

impl AttnMasks<'_> {
    /// The same masks with products in `precision`.
    pub fn with_precision(self, precision: AttnPrecision) -> Self {
        AttnMasks { precision, ..self }
    }

    /// Whether the past's two forms are both given or both absent: the kernels read
    /// `past_start`, the candle path the additive `past`.
    fn past_forms_agree(&self) -> bool {
        self.past.is_some() == self.past_start.is_some()
    }
}

/// Which implementation computes attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The flash kernel wherever it supports the call (CUDA, bf16, head dim 64/128/256), else
    /// candle. The default.
    Fastest,
    /// Always the candle path (the reference).
    Candle,
}

/// 0: not set (the environment decides), 1: [`AttentionKernel::Fastest`], 2: `Candle`.
static KERNEL: AtomicU8 = AtomicU8::new(0);

/// Choose the attention implementation for the whole process (tests compare the two);
/// `None` returns to the default (`FORKSCORE_ATTENTION=candle` or [`AttentionKernel::Fastest`]).
pub fn set_kernel(kernel: Option<AttentionKernel>) {
    let v = match kernel {
        None => 0,
        Some(AttentionKernel::Fastest) => 1,
        Some(AttentionKernel::Candle) => 2,
    };
    KERNEL.store(v, Ordering::Relaxed);
}

fn kernel() -> AttentionKernel {
    match KERNEL.load(Ordering::Relaxed) {
        1 => AttentionKernel::Fastest,
        2 => AttentionKernel::Candle,
        _ => {
            static ENV: OnceLock<AttentionKernel> = OnceLock::new();
            *ENV.get_or_init(|| {
                if crate::switches::is("FORKSCORE_ATTENTION", "candle") {
                    AttentionKernel::Candle
                } else {
                    AttentionKernel::Fastest
                }
            })
        }
    }
}

fn op(name: &'static str) -> impl FnOnce(candle_core::Error) -> CandleError {
    CandleError::tensor(name)
}

/// Attention output `(B, L, H*hd)`.
pub fn attend(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<PastKv<'_>>,
    masks: &AttnMasks<'_>,
) -> Result<Tensor, CandleError> {
    if takes_flash(q, k_new, past.as_ref(), masks) {
        let tree = match masks.new_keys {
            Some(m) => m.visibility()?,
            None => None,
        };
        return flash_attention::attend(q, k_new, v_new, past.as_ref(), masks.past_start, tree);
    }
    if takes_cpu_kernel(q, k_new, v_new, past.as_ref(), masks) {
        return cpu::attention::attend(
            q,
            k_new,
            v_new,
            past.as_ref(),
            masks.past_start,
            masks.new_keys,
            masks.precision == AttnPrecision::Bf16,
        );
    }
    attend_candle(q, k_new, v_new, past, masks)
}

/// A packed prefill's attention in ONE flash launch (q `(1, H, T, hd)`, k / v
/// `(1, Hkv, T, hd)`, segments `(start, len)` back to back) when every segment's solo call would
/// take the flash kernel — each segment is then bit-identical to that solo call. `None`: the
/// caller attends segment by segment.
pub fn attend_varlen(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    segments: &[(usize, usize)],
) -> Option<Result<Tensor, CandleError>> {
    (batched_flash()
        && kernel() == AttentionKernel::Fastest
        && flash_attention::supports(q, k_new, None))
    .then(|| flash_attention::attend_varlen(q, k_new, v_new, segments))
}

/// Scoring rows over several slots' pasts in ONE flash launch (q `(B, H, L, hd)`, the new
/// k / v `(B, Hkv, L, hd)`, `B / S` rows per slot, slot `s`'s past `(Hkv, 1, P_s, hd)`) when
/// every slot's own call — `alone[s]`'s masks: causal new keys, the whole past visible — would
/// take the flash kernel; each slot's rows are then bit-identical to that call up to its own
/// length. `None`: the caller attends slot by slot.
pub fn attend_slot_table(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    slots: &[(Tensor, Tensor)],
    alone: &[AttnMasks<'_>],
) -> Option<Result<Tensor, CandleError>> {
    let (first_k, first_v) = slots.first()?;
    let plain = alone.iter().all(|m| {
        m.past.is_none() && m.past_start.is_none() && m.new_keys.is_none_or(|n| !n.is_tree())
    });
    let past = PastKv {
        k: first_k,
        v: first_v,
    };
    (plain
        && batched_flash()
        && alone.len() == slots.len()
        && kernel() == AttentionKernel::Fastest
        && flash_attention::supports(q, k_new, Some(&past)))
    .then(|| flash_attention::attend_slot_table(q, k_new, v_new, slots))
}

/// Whether the batched flash forms run: on unless `FORKSCORE_FLASH_BATCHED=off` (the
/// per-segment / per-slot launches, which the batched forms equal bit for bit:
/// `scripts/gpu-kernels/flash_varlen_harness.py`, `backends/tests/gpu.rs`).
fn batched_flash() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::switches::is("FORKSCORE_FLASH_BATCHED", "off"))
}

/// Whether [`attend`] computes this call with the flash kernel (else the candle path).
pub fn takes_flash(
    q: &Tensor,
    k_new: &Tensor,
    past: Option<&PastKv<'_>>,
    masks: &AttnMasks<'_>,
) -> bool {
    kernel() == AttentionKernel::Fastest
        && flash_attention::supports(q, k_new, past)
        && masks.past_forms_agree()
}

/// Whether [`attend`] computes this call with the CPU f32 kernel ([`super::super::cpu::attention`]).
pub fn takes_cpu_kernel(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<&PastKv<'_>>,
    masks: &AttnMasks<'_>,
) -> bool {
    kernel() == AttentionKernel::Fastest
        && cpu::attention::supports(q, k_new, v_new, past)
        && masks.past_forms_agree()
}

/// `(B, Hkv, L, hd) -> (Hkv, B, L, hd)`, contiguous: K/V in the KV-head-major layout.
fn kv_major(t: &Tensor, what: &'static str) -> Result<Tensor, CandleError> {
    t.transpose(0, 1)
        .and_then(|t| t.contiguous())
        .map_err(op(what))
}

/// `(Hkv, B, G, L, hd)` (any shape of that many elements) -> `(B, L, Hkv, G, hd)` ->
/// `(B, L, H*hd)`, the attention output ready for `o_proj`.
fn merge_heads(
    out: &Tensor,
    dims: (usize, usize, usize, usize, usize),
) -> Result<Tensor, CandleError> {
    let (hkv, b, g, l, hd) = dims;
    out.reshape((hkv, b, g, l, hd))
        .and_then(|o| o.permute((1, 3, 0, 2, 4)))
        .and_then(|o| o.contiguous())
        .and_then(|o| o.reshape((b, l, hkv * g * hd)))
        .map_err(op("attention out"))
}

/// Queries per block of [`attend_causal_blocks`].
const CAUSAL_BLOCK: usize = 128;

/// The candle path: scores materialised in f32, one softmax over past ++ new keys. A causal
/// call without a past (a prefill, or the first chunk of one) of more than one block of
/// queries takes [`attend_causal_blocks`], which skips the keys the mask hides. The reference
/// the faster forms are tested against.
pub(crate) fn attend_candle(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<PastKv<'_>>,
    masks: &AttnMasks<'_>,
) -> Result<Tensor, CandleError> {
    let l = q.dim(2).map_err(op("attention q dims"))?;
    match (&past, masks.new_keys) {
        (None, Some(m)) if !m.is_tree() && l > CAUSAL_BLOCK && blocks_enabled() => {
            attend_causal_blocks(q, k_new, v_new, m)
        }
        _ => attend_full(q, k_new, v_new, past, masks),
    }
}

/// Whether causal calls take the blocked form (`FORKSCORE_CAUSAL_BLOCKS=0` turns it off, to
/// compare or profile).
fn blocks_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::switches::is("FORKSCORE_CAUSAL_BLOCKS", "0"))
}

/// Causal self-attention of `L` new tokens without a past, by blocks of [`CAUSAL_BLOCK`]
/// queries: block `i` (queries `[s, e)`) scores only keys `[0, e)` — the keys after `e` are
/// masked for all of its queries — so about half of the `L × L` scores are never computed and
/// no `L × L` matrix is ever held. Each query row's softmax sees the same unmasked scores as
/// [`attend_full`]'s (the skipped ones are exactly 0 after its softmax), so the two agree to
/// f32 rounding (the equivalence test holds them together).
fn attend_causal_blocks(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    mask: &super::mask::NewKeysMask,
) -> Result<Tensor, CandleError> {
    let (b, h, l, hd) = q.dims4().map_err(op("attention q dims"))?;
    let hkv = k_new.dim(1).map_err(op("attention k dims"))?;
    let g = h / hkv;
    let dtype = q.dtype();
    let scale = 1.0 / (hd as f64).sqrt();
    // (B, H, L, hd) -> (Hkv, B, G, L, hd), pre-scaled
    let q = (q * scale)
        .and_then(|q| q.reshape((b, hkv, g, l, hd)))
        .and_then(|q| q.transpose(0, 1))
        .map_err(op("attention q layout"))?;
    let k = kv_major(k_new, "attention k layout")?;
    let v = kv_major(v_new, "attention v layout")?;
    // (1, 1, 1, L, L)
    let causal = mask.tensor()?;
    let mut outs = Vec::with_capacity(l.div_ceil(CAUSAL_BLOCK));
    for start in (0..l).step_by(CAUSAL_BLOCK) {
        let end = (start + CAUSAL_BLOCK).min(l);
        let n = end - start;
        // (Hkv, B, G, n, hd) -> (Hkv, B, G*n, hd)
        let qb = q
            .narrow(3, start, n)
            .and_then(|t| t.contiguous())
            .and_then(|t| t.reshape((hkv, b, g * n, hd)))
            .map_err(op("attention q block"))?;
        // (Hkv, B, end, hd): the keys any query of the block may see
        let kb = k.narrow(2, 0, end).map_err(op("attention k block"))?;
        let vb = v.narrow(2, 0, end).map_err(op("attention v block"))?;
        // (Hkv, B, G*n, hd) x (Hkv, B, hd, end) -> (Hkv, B, G, n, end) f32, + mask rows [s, e)
        let scores = qb
            .matmul(&kb.t().map_err(op("k^T"))?)
            .and_then(|s| s.to_dtype(DType::F32))
            .and_then(|s| s.reshape((hkv, b, g, n, end)))
            .and_then(|s| {
                let m = causal.narrow(3, start, n)?.narrow(4, 0, end)?;
                s.broadcast_add(&m)
            })
            .map_err(op("attention block scores"))?;
        // (Hkv, B, G*n, end) x (Hkv, B, end, hd) -> (Hkv, B, G, n, hd)
        let ob = super::super::profile::region("attention.softmax", scores.device(), || {
            candle_nn::ops::softmax_last_dim(&scores)
        })
        .and_then(|p| p.to_dtype(dtype))
        .and_then(|p| p.reshape((hkv, b, g * n, end)))
        .and_then(|p| p.matmul(&vb))
        .and_then(|o| o.reshape((hkv, b, g, n, hd)))
        .map_err(op("attention block values"))?;
        outs.push(ob);
    }
    // n-blocks of (Hkv, B, G, n, hd) -> (Hkv, B, G, L, hd)
    let out = Tensor::cat(&outs, 3).map_err(op("attention out"))?;
    merge_heads(&out, (hkv, b, g, l, hd))
}

/// The candle path over the whole `L × (P + L)` score matrix.
fn attend_full(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<PastKv<'_>>,
    masks: &AttnMasks<'_>,
) -> Result<Tensor, CandleError> {
    let (b, h, l, hd) = q.dims4().map_err(op("attention q dims"))?;
    let hkv = k_new.dim(1).map_err(op("attention k dims"))?;
    let g = h / hkv;
    let dtype = q.dtype();
    let scale = 1.0 / (hd as f64).sqrt();
    // (B, H, L, hd) = (B, Hkv, G*L, hd) -> (Hkv, B, G*L, hd), pre-scaled
    let q = (q * scale)
        .and_then(|q| q.reshape((b, hkv, g * l, hd)))
        .and_then(|q| q.transpose(0, 1))
        .and_then(|q| q.contiguous())
        .map_err(op("attention q layout"))?;
    let k_new = kv_major(k_new, "attention k layout")?;
    let v_new = kv_major(v_new, "attention v layout")?;

    // new part: (Hkv, B, G*L, hd) x (Hkv, B, hd, L) -> (Hkv, B, G, L, L) f32
    let s_new = q
        .matmul(&k_new.t().map_err(op("k^T"))?)
        .and_then(|s| s.to_dtype(DType::F32))
        .and_then(|s| s.reshape((hkv, b, g, l, l)))
        .map_err(op("attention scores new"))?;
    let s_new = match masks.new_keys {
        Some(m) => s_new
            .broadcast_add(m.tensor()?)
            .map_err(op("attention causal / tree mask"))?,
        None => s_new,
    };

    // past part: (Hkv, S, R*G*L, hd) x (Hkv, S, hd, P) -> (Hkv, S, R*G*L, P) = (Hkv, B, G, L, P)
    let mut slots_p = None;
    let scores = match &past {
        None => s_new,
        Some(PastKv { k, .. }) => {
            let (slots, p) = (
                k.dim(1).map_err(op("past dims"))?,
                k.dim(2).map_err(op("past dims"))?,
            );
            if slots == 0 || b % slots != 0 {
                return Err(CandleError::InvalidRequest {
                    reason: format!("{b} rows cannot be split evenly over {slots} past slots"),
                });
            }
            slots_p = Some((slots, p));
            let s_past = q
                .reshape((hkv, slots, (b / slots) * g * l, hd))
                .and_then(|qs| qs.matmul(&k.t()?))
                .and_then(|s| s.to_dtype(DType::F32))
                .and_then(|s| s.reshape((hkv, b, g, l, p)))
                .map_err(op("attention scores past"))?;
            let s_past = match masks.past {
                Some(m) => s_past
                    .broadcast_add(m)
                    .map_err(op("attention padding mask"))?,
                None => s_past,
            };
            // one softmax over past ++ new keys: (Hkv, B, G, L, P + L)
            Tensor::cat(&[&s_past, &s_new], D::Minus1).map_err(op("attention cat scores"))?
        }
    };
    let probs = super::super::profile::region("attention.softmax", scores.device(), || {
        candle_nn::ops::softmax_last_dim(&scores)
    })
    .and_then(|p| p.to_dtype(dtype))
    .map_err(op("attention softmax"))?;

    let p = slots_p.map(|(_, p)| p).unwrap_or(0);
    // (Hkv, B, G*L, L) x (Hkv, B, L, hd) -> (Hkv, B, G*L, hd)
    let probs_new = if p == 0 {
        Ok(probs.clone())
    } else {
        probs.narrow(D::Minus1, p, l).and_then(|t| t.contiguous())
    };
    let mut out = probs_new
        .and_then(|pn| pn.reshape((hkv, b, g * l, l)))
        .and_then(|pn| pn.matmul(&v_new))
        .map_err(op("attention new values"))?;
    if let (Some(PastKv { v, .. }), Some((slots, p))) = (&past, slots_p) {
        // (Hkv, S, R*G*L, P) x (Hkv, S, P, hd) -> (Hkv, S, R*G*L, hd) = (Hkv, B, G*L, hd)
        let pp = probs
            .narrow(D::Minus1, 0, p)
            .and_then(|pp| pp.contiguous())
            .and_then(|pp| pp.reshape((hkv, slots, (b / slots) * g * l, p)))
            .and_then(|pp| pp.matmul(v))
            .and_then(|o| o.reshape((hkv, b, g * l, hd)))
            .map_err(op("attention past values"))?;
        out = (out + pp).map_err(op("attention sum"))?;
    }
    // (Hkv, B, G*L, hd)
    merge_heads(&out, (hkv, b, g, l, hd))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::candle::layers::mask::NewKeysMask;
    use candle_core::Device;

    /// A `shape` tensor of uniform values in (-2, 2) from a seeded LCG (also the CPU kernel's
    /// tests' inputs).
    pub(crate) fn rand(shape: &[usize], seed: &mut u64) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 2.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor")
    }

    /// The blocked causal form equals the full score matrix on prefills of one block plus a
    /// token, several whole blocks and a ragged tail, with grouped-query heads and two rows.
    #[test]
    fn causal_blocks_equal_the_full_scores() {
        let mut seed = 7u64;
        let mut worst = 0f32;
        for (b, h, hkv, l, hd) in [
            (1, 2, 1, CAUSAL_BLOCK + 1, 8),
            (2, 4, 2, 3 * CAUSAL_BLOCK, 16),
            (1, 6, 2, 2 * CAUSAL_BLOCK + 37, 8),
        ] {
            let q = rand(&[b, h, l, hd], &mut seed);
            let k = rand(&[b, hkv, l, hd], &mut seed);
            let v = rand(&[b, hkv, l, hd], &mut seed);
            let mask = NewKeysMask::causal(l, &Device::Cpu);
            let masks = AttnMasks {
                new_keys: Some(&mask),
                past: None,
                past_start: None,
                precision: Default::default(),
            };
            let blocked = attend_causal_blocks(&q, &k, &v, &mask).expect("blocked");
            let full = attend_full(&q, &k, &v, None, &masks).expect("full");
            let through_candle = attend_candle(&q, &k, &v, None, &masks).expect("candle");
            let d = (&blocked - &full)
                .and_then(|d| d.abs())
                .and_then(|d| d.flatten_all())
                .and_then(|d| d.max(0))
                .and_then(|d| d.to_scalar::<f32>())
                .expect("diff");
            worst = worst.max(d);
            assert_eq!(blocked.dims(), &[b, l, h * hd]);
            let same: Vec<f32> = (&through_candle - &blocked)
                .and_then(|d| d.abs())
                .and_then(|d| d.flatten_all())
                .and_then(|d| d.to_vec1())
                .expect("candle path");
            assert!(
                same.iter().all(|x| *x == 0.0),
                "the candle path takes the blocked form"
            );
        }
        assert!(worst <= 1e-5, "blocked vs full: {worst:e}");
    }
}
