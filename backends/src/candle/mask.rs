//! Additive f32 attention masks (0 = visible, -inf = hidden), shaped to broadcast over the
//! 5-D score layout `(Hkv, B, G, L, keys)` used by [`super::attention`].
//!
//! - causal: within the new tokens of one call, query `i` sees new keys `j <= i`. Right padding
//!   needs no extra mask: pad tokens sit after a row's last valid token, so no valid query sees
//!   them, and pad queries are never read.
//! - left padding: when rows continue prefixes of different lengths merged into one `P`-long
//!   past (left-padded), row `r` hides its first `P - len_r` past keys.

use candle_core::{Device, Tensor};

use crate::error::CandleError;

/// `(1, 1, 1, L, L)` causal mask over the new tokens.
pub fn causal(len: usize, device: &Device) -> Result<Tensor, CandleError> {
    let data: Vec<f32> = (0..len)
        .flat_map(|i| (0..len).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(data, (1, 1, 1, len, len), device).map_err(CandleError::tensor("causal mask"))
}

/// `(1, B, 1, 1, P)` mask hiding each row's left padding in a merged past of length `p`.
/// `past_lens[r] <= p` is row `r`'s own prefix length.
pub fn left_padding(past_lens: &[usize], p: usize, device: &Device) -> Result<Tensor, CandleError> {
    let data: Vec<f32> = past_lens
        .iter()
        .flat_map(|&len| (0..p).map(move |j| if j + len >= p { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(data, (1, past_lens.len(), 1, 1, p), device)
        .map_err(CandleError::tensor("padding mask"))
}

/// `(B,)` u32: row `r`'s first visible key in a merged past of length `p` (`p - past_lens[r]`),
/// the left-padding mask in the form the flash kernel reads.
pub fn past_starts(past_lens: &[usize], p: usize, device: &Device) -> Result<Tensor, CandleError> {
    let data: Vec<u32> = past_lens
        .iter()
        .map(|&len| p.saturating_sub(len) as u32)
        .collect();
    Tensor::from_vec(data, past_lens.len(), device).map_err(CandleError::tensor("past starts"))
}
