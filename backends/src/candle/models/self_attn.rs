//! Softmax self-attention as a [`Mixer`], shared by every architecture with attention layers.
//!
//! Options cover the Qwen family: q/k/v (and o) biases (Qwen2), per-head q/k RMSNorm before RoPE
//! in either weight convention (Qwen3 plain, Qwen3.5 offset), partial RoPE (the step's tables
//! decide how many dims rotate), and the Qwen3.5 output gate (`q_proj` emits, per head, `hd`
//! query values then `hd` gate values; the attention output is multiplied by `sigmoid(gate)`
//! before `o_proj`). The K/V it returns as its update are after norm and RoPE.

use crate::candle::cpu;
use crate::candle::cuda;
use candle_core::{Tensor, D};
use forkscore_seam::Quantization;

use super::Mixer;
use crate::candle::layers::attention::{self, attend, AttnPrecision, PastKv};
use crate::candle::layers::linear::{Linear, QuantSummary};
use crate::candle::layers::mlp::{apply, linear};
use crate::candle::layers::norm::RmsNorm;
use crate::candle::load::config::LayerKind;
use crate::candle::load::weights::Weights;
use crate::candle::profile;
use crate::candle::state::{LayerPast, LayerUpdate};
use crate::candle::step::{Packing, Segment, Step};
use crate::error::CandleError;

/// Which RMSNorm weight convention q/k norms use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormConvention {
    /// `x̂ * w` (Qwen3).
    Plain,
    /// `x̂ * (1 + w)` (Qwen3.5).
    Offset,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct SelfAttentionSpec {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: Option<NormConvention>,
    pub output_gate: bool,
    pub eps: f64,
}

/// The q, k and v projections: three products (the reference), or one product with the weights
/// and biases stacked `(H·hd + 2·Hkv·hd, D)` (CUDA, dense weights, biased q/k/v, no output gate;
/// see [`crate::candle::layers::fusion`]).
enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Stacked(Linear),
}

pub(crate) struct SelfAttention {
    qkv: Qkv,
    o_proj: Linear,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    spec: SelfAttentionSpec,
    /// bf16 where the linear weights compute in bf16 or int8 ([`AttnPrecision`]).
    precision: AttnPrecision,
}

/// `FORKSCORE_HEADS=candle` keeps the candle form of the heads on CUDA (to compare), read once.
fn fused_heads_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| crate::switches::is("FORKSCORE_HEADS", "candle"))
}

/// Whether a stacked q|k|v product's heads may take the fused heads kernel on `device`: CUDA,
/// with neither `FORKSCORE_HEADS=candle` nor `fusion::qkv_heads` turning it off.
fn stacked_heads_fuse(device: &candle_core::Device) -> bool {
    device.is_cuda() && !fused_heads_off() && crate::candle::layers::fusion::qkv_heads()
}

fn op(name: &'static str) -> impl FnOnce(candle_core::Error) -> CandleError {
    CandleError::tensor(name)
}

impl SelfAttention {
    /// Load `prefix.{q,k,v,o}_proj` (and `prefix.{q,k}_norm`).
    pub fn load(
        w: &Weights<'_>,
        prefix: &str,
        spec: SelfAttentionSpec,
    ) -> Result<Self, CandleError> {
        let s = &spec;
        let q_out = s.heads * s.head_dim * if s.output_gate { 2 } else { 1 };
        let kv_out = s.kv_heads * s.head_dim;
        let qk_norm = match s.qk_norm {
            None => None,
            Some(conv) => {
                let load = |n: &str| match conv {
                    NormConvention::Plain => {
                        RmsNorm::plain(w, &format!("{prefix}.{n}.weight"), s.head_dim, s.eps)
                    }
                    NormConvention::Offset => {
                        RmsNorm::offset(w, &format!("{prefix}.{n}.weight"), s.head_dim, s.eps)
                    }
                };
                Some((load("q_norm")?, load("k_norm")?))
            }
        };
        let q = linear(w, &format!("{prefix}.q_proj"), s.hidden, q_out, s.qkv_bias)?;
        let k = linear(w, &format!("{prefix}.k_proj"), s.hidden, kv_out, s.qkv_bias)?;
        let v = linear(w, &format!("{prefix}.v_proj"), s.hidden, kv_out, s.qkv_bias)?;
        let stackable = s.qkv_bias
            && !s.output_gate
            && s.qk_norm.is_none()
            && crate::candle::layers::fusion::qkv(w.device());
        // (H·hd, D) ++ (Hkv·hd, D) ++ (Hkv·hd, D) -> rows [q | k | v]; biases alike
        let stacked = match stackable {
            true => Linear::stack(&[&q, &k, &v])?,
            false => None,
        };
        let qkv = match stacked {
            Some(l) => Qkv::Stacked(l),
            None => Qkv::Separate { q, k, v },
        };
        Ok(SelfAttention {
            qkv,
            o_proj: linear(
                w,
                &format!("{prefix}.o_proj"),
                s.heads * s.head_dim,
                s.hidden,
                s.o_bias,
            )?,
            qk_norm,
            spec,
            precision: match w.quantization() {
                Some(Quantization::Bf16 | Quantization::Int8) => AttnPrecision::Bf16,
                _ => AttnPrecision::F32,
            },
        })
    }

    /// `(B, L, n*hd) -> (B, n, L, hd)`, normed with `norm` per head when given.
    fn heads(
        &self,
        t: Tensor,
        n: usize,
        norm: Option<&RmsNorm>,
        step: &Step,
    ) -> Result<Tensor, CandleError> {
        let t = t
            .reshape((step.rows, step.len, n, self.spec.head_dim))
            .map_err(op("split heads"))?;
        let t = match norm {
            Some(norm) => norm.forward(&t)?,
            None => t,
        };
        t.transpose(1, 2)
            .and_then(|t| t.contiguous())
            .map_err(op("heads transpose"))
    }

    /// [`Self::heads`] then the rotary embedding: `t (B, L, n·hd)` or a `(B, L, n, hd)` view ->
    /// `(B, n, L, hd)`. On CUDA in bf16 one fused kernel does both
    /// ([`crate::candle::cuda::heads`]); the candle form is the reference.
    fn rotated_heads(
        &self,
        t: Tensor,
        n: usize,
        norm: Option<&RmsNorm>,
        step: &Step,
    ) -> Result<Tensor, CandleError> {
        if t.device().is_cuda() && !fused_heads_off() {
            // a (B, L, n, hd) view (the query half of q | gate) is read in place
            let view = match t.rank() {
                4 => t.clone(),
                _ => t
                    .reshape((step.rows, step.len, n, self.spec.head_dim))
                    .map_err(op("split heads"))?,
            };
            let weight = match norm {
                Some(n) => Some(n.weight_and_eps(view.dtype())?),
                None => None,
            };
            let (cos, sin) = (&step.rope.cos, &step.rope.sin);
            if cuda::heads::takes(&view, weight.as_ref().map(|(w, _)| w), cos, sin) {
                let norm = weight.as_ref().map(|(w, e)| (w, *e));
                return cuda::heads::norm_rope(&view, norm, cos, sin).map_err(op("fused heads"));
            }
        }
        step.rope.apply(&self.heads(t, n, norm, step)?)
    }
}

impl Mixer for SelfAttention {
    fn kind(&self) -> LayerKind {
        LayerKind::FullAttention
    }

    fn summarize(&self, summary: &mut QuantSummary) {
        match &self.qkv {
            Qkv::Separate { q, k, v } => [q, k, v].into_iter().for_each(|l| summary.count(l)),
            // three checkpoint projections, all dense
            Qkv::Stacked(l) => (0..3).for_each(|_| summary.count(l)),
        }
        summary.count(&self.o_proj);
    }

    fn forward(
        &self,
        x: &Tensor,
        past: &LayerPast,
        step: &Step,
    ) -> Result<(Tensor, LayerUpdate), CandleError> {
        let dev = x.device();
        let (q, k, v, gate) = profile::region("attention.project", dev, || self.project(x, step))?;
        if let LayerPast::AttentionSlots(slots) = past {
            let o = profile::region("attention.core", dev, || {
                attend_slots(&q, &k, &v, slots, step, self.precision)
            })?; // (B, L, H*hd)
            return self.output(o, gate, dev, k, v);
        }
        let past_kv = match past {
            LayerPast::Empty => None,
            LayerPast::AttentionSlots(_) => None,
            LayerPast::Attention { k, v } => Some(PastKv { k, v }),
            LayerPast::Linear { .. } => {
                return Err(CandleError::InvalidRequest {
                    reason: "attention layer given a linear-attention state".into(),
                })
            }
        };
        if step.packed.is_some() && past_kv.is_some() {
            return Err(CandleError::InvalidRequest {
                reason: "a packed prefill starts from no retained state".into(),
            });
        }
        let o = profile::region("attention.core", dev, || match &step.packed {
            None => attend(
                &q,
                &k,
                &v,
                past_kv,
                &step.masks().with_precision(self.precision),
            ),
            Some(packing) => attend_segments(&q, &k, &v, packing, self.precision),
        })?; // (B, L, H*hd)
        self.output(o, gate, dev, k, v)
    }

    /// K and V alone: no queries, no attention, no `o_proj` (the stacked q|k|v product, one
    /// GEMM, still computes the query columns).
    fn state_update(
        &self,
        x: &Tensor,
        past: &LayerPast,
        step: &Step,
    ) -> Result<LayerUpdate, CandleError> {
        if matches!(past, LayerPast::Linear { .. }) {
            return Err(CandleError::InvalidRequest {
                reason: "attention layer given a linear-attention state".into(),
            });
        }
        let (k, v) = match &self.qkv {
            Qkv::Stacked(_) => {
                let (_, k, v, _) = self.project(x, step)?;
                (k, v)
            }
            Qkv::Separate { k, v, .. } => self.project_kv(k, v, x, step)?,
        };
        Ok(LayerUpdate::Attention { k, v })
    }
}

type Projected = (Tensor, Tensor, Tensor, Option<Tensor>);

impl SelfAttention {
    /// The attention output `o (B, L, H*hd)` through the output gate (when the layer has one:
    /// `(B, L, H, hd)`, a view) and `o_proj`, with the new K/V as the layer's update.
    fn output(
        &self,
        mut o: Tensor,
        gate: Option<Tensor>,
        dev: &candle_core::Device,
        k: Tensor,
        v: Tensor,
    ) -> Result<(Tensor, LayerUpdate), CandleError> {
        if let Some(gate) = gate {
            // sigmoid reads the gate's (B, L, H, hd) view of the q | gate product in place and
            // writes it contiguous, so it reshapes to o's (B, L, H*hd) without a copy
            o = candle_nn::ops::sigmoid(&gate)
                .and_then(|g| g.reshape(o.shape()))
                .and_then(|g| o * g)
                .map_err(op("output gate"))?;
        }
        let out = profile::region("attention.o_proj", dev, || {
            apply(&self.o_proj, &o, "o_proj")
        })?; // (B, L, D)
        Ok((out, LayerUpdate::Attention { k, v }))
    }
}

/// Attention of rows continuing several slots, one slot at a time: q `(B, H, L, hd)`, the new
/// k / v `(B, Hkv, L, hd)` with `B / S` consecutive rows per slot, each slot's own past K/V
/// `(Hkv, 1, P_s, hd)` -> `(B, L, H*hd)`. Each slot's rows are attended under the step they
/// would have alone, so a row's output never depends on the other slots of the call.
fn attend_slots(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    slots: &[(Tensor, Tensor)],
    step: &Step,
    precision: AttnPrecision,
) -> Result<Tensor, CandleError> {
    let Some(per_slot) = step.slots.as_ref().filter(|s| s.steps.len() == slots.len()) else {
        return Err(CandleError::InvalidRequest {
            reason: format!("{} slot pasts without a per-slot step", slots.len()),
        });
    };
    let alone: Vec<_> = per_slot.steps.iter().map(Step::masks).collect();
    if let Some(o) = attention::attend_slot_table(q, k, v, slots, &alone) {
        return o; // (B, L, H*hd)
    }
    let r = per_slot.rows_per_slot;
    let l = step.len;
    // a slot's rows, cut to the slot's own longest row (the length its call alone would have)
    let rows = |t: &Tensor, i: usize, len: usize| {
        t.narrow(0, i * r, r)
            .and_then(|t| t.narrow(2, 0, len))
            .and_then(|t| t.contiguous())
            .map_err(op("slot rows"))
    };
    let outs = slots
        .iter()
        .zip(&per_slot.steps)
        .enumerate()
        .map(|(i, ((pk, pv), alone))| {
            let n = alone.len;
            let past = PastKv { k: pk, v: pv };
            let o = attend(
                &rows(q, i, n)?,
                &rows(k, i, n)?,
                &rows(v, i, n)?,
                Some(past),
                &alone.masks().with_precision(precision),
            )?; // (R, n, H*hd)
                // positions past the slot's longest row are padding nobody reads: zeros
            o.pad_with_zeros(1, 0, l - n).map_err(op("slot padding"))
        })
        .collect::<Result<Vec<_>, _>>()?; // each (R, L, H*hd)
    Tensor::cat(&outs, 0).map_err(op("slot attention"))
}

/// Attention of a packed prefill: q `(1, H, T, hd)`, k / v `(1, Hkv, T, hd)` -> `(1, T, H*hd)`,
/// each segment attending only to itself under its own causal mask, exactly as its solo prefill
/// would (same kernel, same shapes), so a segment's output never depends on its neighbours.
fn attend_segments(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    packing: &Packing,
    precision: AttnPrecision,
) -> Result<Tensor, CandleError> {
    let spans: Vec<_> = packing.segments.iter().map(|s| (s.start, s.len)).collect();
    if let Some(o) = attention::attend_varlen(q, k, v, &spans) {
        return o; // (1, T, H*hd)
    }
    let cut = |t: &Tensor, seg: &Segment| {
        t.narrow(2, seg.start, seg.len)
            .and_then(|t| t.contiguous())
            .map_err(op("packed segment"))
    };
    let outs = packing
        .segments
        .iter()
        .zip(&packing.steps)
        .map(|(seg, solo)| {
            attend(
                &cut(q, seg)?,
                &cut(k, seg)?,
                &cut(v, seg)?,
                None,
                &solo.masks().with_precision(precision),
            )
        })
        .collect::<Result<Vec<_>, _>>()?; // each (1, len, H*hd)
    match outs.as_slice() {
        [one] => Ok(one.clone()),
        _ => Tensor::cat(&outs, 1).map_err(op("packed attention")),
    }
}

impl SelfAttention {
    /// K `(B, Hkv, L, hd)` after norm and RoPE, and V `(B, Hkv, L, hd)`, from separate
    /// projections.
    fn project_kv(
        &self,
        k_proj: &Linear,
        v_proj: &Linear,
        x: &Tensor,
        step: &Step,
    ) -> Result<(Tensor, Tensor), CandleError> {
        let s = &self.spec;
        let kn = self.qk_norm.as_ref().map(|(_, kn)| kn);
        let k = apply(k_proj, x, "k_proj")?; // (B, L, Hkv*hd)
        let k = self.rotated_heads(k, s.kv_heads, kn, step)?; // (B, Hkv, L, hd)
        let v = apply(v_proj, x, "v_proj")?;
        let v = self.heads(v, s.kv_heads, None, step)?; // (B, Hkv, L, hd)
        Ok((k, v))
    }

    /// Whether the stacked `q | k | v` product may leave its bias to the fused heads kernel: on
    /// CUDA with the fused heads on ([`Self::fused_stacked_heads`]) and the bias fold not
    /// switched off (`FORKSCORE_QKV_HEADS=bias-apart` keeps candle's bias add, to compare).
    fn folds_qkv_bias(x: &Tensor) -> bool {
        x.dtype() == candle_core::DType::BF16
            && stacked_heads_fuse(x.device())
            && !crate::switches::is("FORKSCORE_QKV_HEADS", "bias-apart")
    }

    /// The stacked `q | k | v` product `(B, L, H + 2Hkv, hd)` into heads on CUDA in bf16, by
    /// the fused heads kernel straight from the product's views: the query and key heads
    /// rotated, the value heads laid out head-major, each with its part of `bias` added first
    /// when the product left it out (one launch per part, no norm, no gate here). `None` where
    /// that kernel does not take the call, or where `fusion::qkv_heads` is off (the candle form
    /// then runs, after adding the bias).
    fn fused_stacked_heads(
        &self,
        qkv: &Tensor,
        bias: Option<&Tensor>,
        step: &Step,
    ) -> Result<Option<Projected>, CandleError> {
        let s = &self.spec;
        if !stacked_heads_fuse(qkv.device()) {
            return Ok(None);
        }
        let part = |start: usize, n: usize| qkv.narrow(2, start, n).map_err(op("q|k|v heads"));
        let (q, k) = (part(0, s.heads)?, part(s.heads, s.kv_heads)?);
        let v = part(s.heads + s.kv_heads, s.kv_heads)?;
        let (cos, sin) = (&step.rope.cos, &step.rope.sin);
        let rope = Some((cos, sin));
        let Some(bias) = bias else {
            if !(cuda::heads::takes(&q, None, cos, sin) && cuda::heads::takes(&k, None, cos, sin)) {
                return Ok(None);
            }
            let q = self.rotated_heads(q, s.heads, None, step)?; // (B, H, L, hd)
            let k = self.rotated_heads(k, s.kv_heads, None, step)?; // (B, Hkv, L, hd)
            let v = v
                .transpose(1, 2)
                .and_then(|t| t.contiguous())
                .map_err(op("q|k|v heads"))?; // (B, Hkv, L, hd)
            return Ok(Some((q, k, v, None)));
        };
        // the bias (H·hd + 2·Hkv·hd,) cut like the product's heads
        let hd = s.head_dim;
        let bias_of =
            |start: usize, n: usize| bias.narrow(0, start * hd, n * hd).map_err(op("q|k|v bias"));
        let (bq, bk, bv) = (
            bias_of(0, s.heads)?,
            bias_of(s.heads, s.kv_heads)?,
            bias_of(s.heads + s.kv_heads, s.kv_heads)?,
        );
        if !(cuda::heads::takes_biased(&q, &bq, rope)
            && cuda::heads::takes_biased(&k, &bk, rope)
            && cuda::heads::takes_biased(&v, &bv, None))
        {
            return Ok(None);
        }
        let heads = |x: &Tensor, b: &Tensor, rope| {
            cuda::heads::bias_rope(x, b, rope).map_err(op("fused heads"))
        };
        let q = heads(&q, &bq, rope)?; // (B, H, L, hd)
        let k = heads(&k, &bk, rope)?; // (B, Hkv, L, hd)
        let v = heads(&v, &bv, None)?; // (B, Hkv, L, hd)
        Ok(Some((q, k, v, None)))
    }

    /// Queries `(B, H, L, hd)` after norm and RoPE, K and V `(B, Hkv, L, hd)`, and the output
    /// gate `(B, L, H, hd)` (a view of the q | gate product) when the layer has one.
    fn project(&self, x: &Tensor, step: &Step) -> Result<Projected, CandleError> {
        let s = &self.spec;
        let (b, l) = (step.rows, step.len);
        let qn = self.qk_norm.as_ref().map(|(qn, _)| qn);
        let (q, k, v, gate) = match &self.qkv {
            Qkv::Stacked(stacked) => {
                // (B, L, (H + 2Hkv)·hd) -> (B, L, H + 2Hkv, hd), heads [q | k | v]; each part is
                // a view that `heads_of` copies once, head-major (no norm, no gate here). On
                // CUDA the product may leave its bias to the fused heads kernel.
                let apart = match Self::folds_qkv_bias(x) {
                    true => stacked.forward_bias_apart(x),
                    false => None,
                };
                let (qkv, bias) = match apart {
                    Some(r) => {
                        let (y, b) = r.map_err(op("q|k|v"))?;
                        (y, Some(b))
                    }
                    None => (apply(stacked, x, "q|k|v")?, None),
                }; // (B, L, (H + 2Hkv)·hd), bias (H·hd + 2·Hkv·hd,) when left out
                if bias.is_none() && cpu::heads::supports(&qkv, &step.rope) {
                    // the same split and rotation in one pass (equal bit for bit)
                    let (q, k, v) = cpu::heads::split_rotate(
                        &qkv, &step.rope, s.heads, s.kv_heads, s.head_dim,
                    )?;
                    return Ok((q, k, v, None));
                }
                let qkv = qkv
                    .reshape((b, l, s.heads + 2 * s.kv_heads, s.head_dim))
                    .map_err(op("split q|k|v"))?;
                if let Some(heads) = self.fused_stacked_heads(&qkv, bias, step)? {
                    return Ok(heads);
                }
                // the kernel declined: the bias the product left out, added as candle does
                let qkv = match bias {
                    Some(b) => b
                        .reshape((s.heads + 2 * s.kv_heads, s.head_dim))
                        .and_then(|b| qkv.broadcast_add(&b))
                        .map_err(op("q|k|v bias"))?,
                    None => qkv,
                };
                let part = |start: usize, n: usize| {
                    qkv.narrow(2, start, n)
                        .and_then(|t| t.transpose(1, 2))
                        .and_then(|t| t.contiguous())
                        .map_err(op("q|k|v heads"))
                };
                let q = step.rope.apply(&part(0, s.heads)?)?; // (B, H, L, hd)
                let k = step.rope.apply(&part(s.heads, s.kv_heads)?)?; // (B, Hkv, L, hd)
                let v = part(s.heads + s.kv_heads, s.kv_heads)?; // (B, Hkv, L, hd)
                (q, k, v, None)
            }
            Qkv::Separate {
                q: q_proj,
                k: k_proj,
                v: v_proj,
            } => {
                let q = apply(q_proj, x, "q_proj")?; // (B, L, H*hd) or (B, L, H*2hd)
                let (q, gate) = if s.output_gate {
                    // (B, L, H, 2hd): per head [query | gate]
                    let qg = q
                        .reshape((b, l, s.heads, 2 * s.head_dim))
                        .map_err(op("split gate"))?;
                    // a view: the fused heads kernel reads it in place, the candle form
                    // copies it
                    let query = qg.narrow(D::Minus1, 0, s.head_dim);
                    let gate = qg.narrow(D::Minus1, s.head_dim, s.head_dim); // (B, L, H, hd) view
                    (query.map_err(op("query"))?, Some(gate.map_err(op("gate"))?))
                } else {
                    (q, None)
                };
                let q = self.rotated_heads(q, s.heads, qn, step)?; // (B, H, L, hd)
                let (k, v) = self.project_kv(k_proj, v_proj, x, step)?;
                (q, k, v, gate)
            }
        };
        Ok((q, k, v, gate))
    }
}
