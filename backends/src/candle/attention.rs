//! Grouped-query scaled dot-product attention of new tokens over a retained past plus
//! themselves, with the softmax in f32.
//!
//! In: queries `(B, H, L, hd)`, the new keys/values `(B, Hkv, L, hd)`, and the past as a
//! [`PastKv`]: none, one prefix shared by every row (`(1, Hkv, P, hd)`, never copied per row:
//! the rows are folded into the query axis for the past half of the product), or one past per
//! row (`(B, Hkv, P, hd)`, left-padded and masked). Out: `(B, H, L, hd)` in the input dtype.
//!
//! Query head `h` reads KV head `h / (H / Hkv)` (transformers' `repeat_interleave`); the group
//! axis `G = H / Hkv` is carried in the score layout `(B, Hkv, G, L, keys)` so K/V are never
//! repeated. Scores over past and new keys are concatenated before one softmax, so the result
//! equals attention over `past ++ new` in one sequence.

use candle_core::{DType, Tensor, D};

use crate::BackendError;

/// The retained keys/values the new tokens attend to.
pub(crate) enum PastKv<'a> {
    None,
    /// `(1, Hkv, P, hd)` shared by all rows.
    Shared { k: &'a Tensor, v: &'a Tensor },
    /// `(B, Hkv, P, hd)`, one (left-padded) past per row.
    PerRow { k: &'a Tensor, v: &'a Tensor },
}

/// Masks for one call, see [`super::mask`].
pub(crate) struct AttnMasks<'a> {
    /// `(1, 1, 1, L, L)`; `None` when `L == 1`.
    pub causal: Option<&'a Tensor>,
    /// `(B, 1, 1, 1, P)`; `None` when every row sees its whole past.
    pub past: Option<&'a Tensor>,
}

fn op(name: &'static str) -> impl FnOnce(candle_core::Error) -> BackendError {
    BackendError::tensor(name)
}

/// Fold rows into the query axis: `(B, Hkv, M, X) -> (1, Hkv, B*M, X)`.
fn fold_rows(t: &Tensor) -> candle_core::Result<Tensor> {
    let (b, hkv, m, x) = t.dims4()?;
    t.transpose(0, 1)?.contiguous()?.reshape((1, hkv, b * m, x))
}

/// Inverse of [`fold_rows`]: `(1, Hkv, B*M, X) -> (B, Hkv, M, X)`.
fn unfold_rows(t: &Tensor, b: usize) -> candle_core::Result<Tensor> {
    let (_, hkv, bm, x) = t.dims4()?;
    t.reshape((hkv, b, bm / b, x))?.transpose(0, 1)?.contiguous()
}

/// Attention output `(B, H, L, hd)`.
pub(crate) fn attend(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: PastKv<'_>,
    masks: &AttnMasks<'_>,
) -> Result<Tensor, BackendError> {
    let (b, h, l, hd) = q.dims4().map_err(op("attention q dims"))?;
    let hkv = k_new.dim(1).map_err(op("attention k dims"))?;
    let g = h / hkv;
    let dtype = q.dtype();
    let scale = 1.0 / (hd as f64).sqrt();
    // (B, H, L, hd) -> (B, Hkv, G*L, hd): heads of one KV group are adjacent.
    let q4 = q.contiguous().and_then(|q| q.reshape((b, hkv, g * l, hd))).map_err(op("attention q group"))?;

    // new part: (B, Hkv, G*L, hd) x (B, Hkv, hd, L) -> (B, Hkv, G, L, L) f32
    let s_new = q4
        .matmul(&k_new.t().map_err(op("k^T"))?)
        .and_then(|s| s.to_dtype(DType::F32))
        .and_then(|s| s * scale)
        .and_then(|s| s.reshape((b, hkv, g, l, l)))
        .map_err(op("attention scores new"))?;
    let s_new = match masks.causal {
        Some(m) => s_new.broadcast_add(m).map_err(op("attention causal mask"))?,
        None => s_new,
    };

    // past part: (B, Hkv, G, L, P) f32
    let (s_past, p) = match &past {
        PastKv::None => (None, 0),
        PastKv::Shared { k, .. } => {
            let p = k.dim(2).map_err(op("past dims"))?;
            // (1, Hkv, B*G*L, hd) x (1, Hkv, hd, P) -> (1, Hkv, B*G*L, P) -> (B, Hkv, G*L, P)
            let s = fold_rows(&q4)
                .and_then(|qf| qf.matmul(&k.t()?))
                .and_then(|s| unfold_rows(&s, b))
                .map_err(op("attention scores shared past"))?;
            (Some(s), p)
        }
        PastKv::PerRow { k, .. } => {
            let p = k.dim(2).map_err(op("past dims"))?;
            // (B, Hkv, G*L, hd) x (B, Hkv, hd, P) -> (B, Hkv, G*L, P)
            let s = q4.matmul(&k.t().map_err(op("k^T"))?).map_err(op("attention scores row past"))?;
            (Some(s), p)
        }
    };
    let s_past = match s_past {
        None => None,
        Some(s) => {
            let s = s
                .to_dtype(DType::F32)
                .and_then(|s| s * scale)
                .and_then(|s| s.reshape((b, hkv, g, l, p)))
                .map_err(op("attention scores past"))?;
            Some(match masks.past {
                Some(m) => s.broadcast_add(m).map_err(op("attention padding mask"))?,
                None => s,
            })
        }
    };

    // one softmax over past ++ new keys: (B, Hkv, G, L, P + L)
    let scores = match &s_past {
        Some(sp) => Tensor::cat(&[sp, &s_new], D::Minus1).map_err(op("attention cat scores"))?,
        None => s_new,
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)
        .and_then(|p| p.to_dtype(dtype))
        .map_err(op("attention softmax"))?;

    // (B, Hkv, G*L, L) x (B, Hkv, L, hd) -> (B, Hkv, G*L, hd)
    let out = probs
        .narrow(D::Minus1, p, l)
        .and_then(|pn| pn.contiguous())
        .and_then(|pn| pn.reshape((b, hkv, g * l, l)))
        .and_then(|pn| pn.matmul(&v_new.contiguous()?))
        .map_err(op("attention new values"))?;
    let out = match past {
        PastKv::None => out,
        PastKv::Shared { v, .. } => {
            // (1, Hkv, B*G*L, P) x (1, Hkv, P, hd) -> (B, Hkv, G*L, hd)
            let pp = probs
                .narrow(D::Minus1, 0, p)
                .and_then(|pp| pp.contiguous())
                .and_then(|pp| pp.reshape((b, hkv, g * l, p)))
                .and_then(|pp| fold_rows(&pp))
                .and_then(|pf| pf.matmul(v))
                .and_then(|o| unfold_rows(&o, b))
                .map_err(op("attention shared past values"))?;
            (out + pp).map_err(op("attention sum"))?
        }
        PastKv::PerRow { v, .. } => {
            let pp = probs
                .narrow(D::Minus1, 0, p)
                .and_then(|pp| pp.contiguous())
                .and_then(|pp| pp.reshape((b, hkv, g * l, p)))
                .and_then(|pp| pp.matmul(v))
                .map_err(op("attention row past values"))?;
            (out + pp).map_err(op("attention sum"))?
        }
    };
    // (B, Hkv, G*L, hd) -> (B, H, L, hd)
    out.reshape((b, h, l, hd)).map_err(op("attention out"))
}
