//! Grouped-query scaled dot-product attention of new tokens over a retained past plus
//! themselves, with the softmax in f32.
//!
//! In: queries `(B, H, L, hd)`, the new keys/values `(B, Hkv, L, hd)`, and optionally the past
//! K/V of `S` slots `(S, Hkv, P, hd)` where `S` divides `B` and rows are slot-major (row `b`
//! continues slot `b / (B/S)`). `S == 1` is one prefix shared by every row; `S == B` one past per
//! row. The past is never copied per row: the `B/S` rows of a slot are folded into the query
//! axis for the past half of the product, so each slot's K/V is read by one matmul.
//! Out: `(B, H, L, hd)` in the input dtype.
//!
//! Query head `h` reads KV head `h / (H / Hkv)` (transformers' `repeat_interleave`); the group
//! axis `G = H / Hkv` is carried in the score layout `(B, Hkv, G, L, keys)` so K/V are never
//! repeated. Scores over past and new keys are concatenated before one softmax, so the result
//! equals attention over `past ++ new` in one sequence.

use candle_core::{DType, Tensor, D};

use crate::BackendError;

/// The retained keys/values of `S` slots, each `(S, Hkv, P, hd)`.
pub(crate) struct PastKv<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
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

/// Fold each slot's rows into the query axis: `(S*R, Hkv, M, X) -> (S, Hkv, R*M, X)`.
fn fold_rows(t: &Tensor, s: usize) -> candle_core::Result<Tensor> {
    let (b, hkv, m, x) = t.dims4()?;
    let r = b / s;
    if r == 1 {
        return Ok(t.clone());
    }
    t.reshape((s, r, hkv, m, x))?.transpose(1, 2)?.contiguous()?.reshape((s, hkv, r * m, x))
}

/// Inverse of [`fold_rows`]: `(S, Hkv, R*M, X) -> (S*R, Hkv, M, X)`.
fn unfold_rows(t: &Tensor, b: usize) -> candle_core::Result<Tensor> {
    let (s, hkv, rm, x) = t.dims4()?;
    let r = b / s;
    if r == 1 {
        return Ok(t.clone());
    }
    t.reshape((s, hkv, r, rm / r, x))?.transpose(1, 2)?.contiguous()?.reshape((b, hkv, rm / r, x))
}

/// Attention output `(B, H, L, hd)`.
pub(crate) fn attend(
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    past: Option<PastKv<'_>>,
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

    // past part: (S, Hkv, R*G*L, hd) x (S, Hkv, hd, P) -> (S, Hkv, R*G*L, P) -> (B, Hkv, G*L, P)
    let (s_past, p) = match &past {
        None => (None, 0),
        Some(PastKv { k, .. }) => {
            let (slots, p) = (k.dim(0).map_err(op("past dims"))?, k.dim(2).map_err(op("past dims"))?);
            if slots == 0 || b % slots != 0 {
                return Err(BackendError::InvalidRequest {
                    reason: format!("{b} rows cannot be split evenly over {slots} past slots"),
                });
            }
            let s = fold_rows(&q4, slots)
                .and_then(|qf| qf.matmul(&k.t()?))
                .and_then(|s| unfold_rows(&s, b))
                .map_err(op("attention scores past"))?;
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
        None => out,
        Some(PastKv { k, v }) => {
            let slots = k.dim(0).map_err(op("past dims"))?;
            // (S, Hkv, R*G*L, P) x (S, Hkv, P, hd) -> (S, Hkv, R*G*L, hd) -> (B, Hkv, G*L, hd)
            let pp = probs
                .narrow(D::Minus1, 0, p)
                .and_then(|pp| pp.contiguous())
                .and_then(|pp| pp.reshape((b, hkv, g * l, p)))
                .and_then(|pp| fold_rows(&pp, slots))
                .and_then(|pf| pf.matmul(v))
                .and_then(|o| unfold_rows(&o, b))
                .map_err(op("attention past values"))?;
            (out + pp).map_err(op("attention sum"))?
        }
    };
    // (B, Hkv, G*L, hd) -> (B, H, L, hd)
    out.reshape((b, h, l, hd)).map_err(op("attention out"))
}
