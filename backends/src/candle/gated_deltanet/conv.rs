//! Causal depthwise conv1d + SiLU over the `[q | k | v]` channels, with its carried state.
//!
//! In: pre-conv projections `p` `(B, L, Cc)` f32, the conv state `(B, Kc−1, Cc)` f32 (the last
//! `Kc−1` pre-conv rows of the tokens before this call; zeros for a fresh sequence), the weight
//! `(Cc, Kc)` f32 (HF `[Cc, 1, Kc]` squeezed; `w[c, Kc−1]` hits the current token), and
//! optionally the per-row valid lengths `ℓ_b` of a right-padded batch.
//! Out: `SiLU(conv)` `(B, L, Cc)` and the new conv state `(B, Kc−1, Cc)`.
//!
//! The state keeps `Kc−1` positions (only those are mathematically needed; HF keeps a
//! `Kc`-wide window whose oldest column is never read). With padding, row `b`'s new state is rows
//! `[ℓ_b, ℓ_b + Kc − 1)` of `X̃ = [old state; p]`, i.e. it ends at the row's own last valid token
//! (and keeps part of the old state when `ℓ_b < Kc − 1`). Padded inputs are zeroed first, which is
//! harmless for right padding and keeps pads out of every valid window.

use candle_core::{Result, Tensor};

/// Per-row valid lengths of a right-padded batch, checked against the padded length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RightPadding {
    lengths: Vec<usize>,
    padded_len: usize,
}

impl RightPadding {
    /// `lengths[b]` valid leading positions of row `b` in a batch padded to `padded_len`.
    /// Returns `None` when some length exceeds `padded_len`.
    pub fn new(lengths: Vec<usize>, padded_len: usize) -> Option<Self> {
        if lengths.iter().any(|l| *l > padded_len) {
            return None;
        }
        Some(Self {
            lengths,
            padded_len,
        })
    }

    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    pub fn padded_len(&self) -> usize {
        self.padded_len
    }

    /// True when no row has padding.
    pub fn is_full(&self) -> bool {
        self.lengths.iter().all(|l| *l == self.padded_len)
    }

    /// `(B, L)` f32 mask, 1 on valid positions and 0 on pads.
    pub fn mask(&self, device: &candle_core::Device) -> Result<Tensor> {
        let l = self.padded_len;
        let data: Vec<f32> = self
            .lengths
            .iter()
            .flat_map(|len| (0..l).map(move |t| if t < *len { 1.0 } else { 0.0 }))
            .collect();
        Tensor::from_vec(data, (self.lengths.len(), l), device)
    }
}

/// Causal depthwise conv + SiLU. See the module docs for shapes and the padding rule.
pub fn causal_conv_silu(
    p: &Tensor,
    state: &Tensor,
    weight: &Tensor,
    padding: Option<&RightPadding>,
) -> Result<(Tensor, Tensor)> {
    let (b, l, cc) = p.dims3()?;
    let (_, kc) = weight.dims2()?;
    let keep = kc - 1;
    let p = match padding {
        Some(pad) if !pad.is_full() => p.broadcast_mul(&pad.mask(p.device())?.unsqueeze(2)?)?,
        _ => p.clone(),
    };
    // (B, Kc−1, Cc) ++ (B, L, Cc) -> (B, L+Kc−1, Cc)
    let x = Tensor::cat(&[state, &p], 1)?;
    let mut acc = Tensor::zeros((b, l, cc), p.dtype(), p.device())?;
    for j in 0..kc {
        // (Cc, 1) -> (1, 1, Cc): tap j looks Kc−1−j steps back
        let tap = weight.narrow(1, j, 1)?.reshape((1, 1, cc))?;
        acc = acc.add(&x.narrow(1, j, l)?.broadcast_mul(&tap)?)?;
    }
    let out = acc.silu()?;
    let new_state = match padding {
        Some(pad) if !pad.is_full() => {
            let rows = pad
                .lengths()
                .iter()
                .enumerate()
                .map(|(row, len)| x.narrow(0, row, 1)?.narrow(1, *len, keep))
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&rows, 0)?
        }
        _ => x.narrow(1, l, keep)?,
    };
    Ok((out, new_state.contiguous()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn naive(p: &[f32], st: &[f32], w: &[f32], l: usize, cc: usize, kc: usize) -> Vec<f32> {
        // X̃ rows: state (kc-1) then p (l)
        let row = |i: usize, c: usize| {
            if i < kc - 1 {
                st[i * cc + c]
            } else {
                p[(i - (kc - 1)) * cc + c]
            }
        };
        let mut out = vec![0f32; l * cc];
        for t in 0..l {
            for c in 0..cc {
                let s: f32 = (0..kc).map(|j| w[c * kc + j] * row(t + j, c)).sum();
                out[t * cc + c] = s / (1.0 + (-s).exp());
            }
        }
        out
    }

    #[test]
    fn matches_scalar_loop_and_keeps_last_rows() -> Result<()> {
        let dev = Device::Cpu;
        let (l, cc, kc) = (5usize, 3usize, 4usize);
        let p: Vec<f32> = (0..l * cc)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let st: Vec<f32> = (0..(kc - 1) * cc)
            .map(|i| ((i * 13 % 7) as f32 - 3.0) / 3.0)
            .collect();
        let w: Vec<f32> = (0..cc * kc)
            .map(|i| ((i * 29 % 9) as f32 - 4.0) / 5.0)
            .collect();
        let pt = Tensor::from_slice(&p, (1, l, cc), &dev)?;
        let stt = Tensor::from_slice(&st, (1, kc - 1, cc), &dev)?;
        let wt = Tensor::from_slice(&w, (cc, kc), &dev)?;
        let (out, ns) = causal_conv_silu(&pt, &stt, &wt, None)?;
        let got: Vec<f32> = out.flatten_all()?.to_vec1()?;
        for (a, b) in got.iter().zip(naive(&p, &st, &w, l, cc, kc)) {
            assert!((a - b).abs() < 1e-6);
        }
        let ns: Vec<f32> = ns.flatten_all()?.to_vec1()?;
        assert_eq!(ns, p[(l - (kc - 1)) * cc..].to_vec());
        Ok(())
    }

    #[test]
    fn padded_row_state_ends_at_its_last_valid_token() -> Result<()> {
        let dev = Device::Cpu;
        let (l, cc, kc) = (4usize, 2usize, 4usize);
        let p: Vec<f32> = (0..2 * l * cc).map(|i| i as f32 + 1.0).collect();
        let st: Vec<f32> = (0..2 * (kc - 1) * cc).map(|i| -(i as f32) - 1.0).collect();
        let pt = Tensor::from_slice(&p, (2, l, cc), &dev)?;
        let stt = Tensor::from_slice(&st, (2, kc - 1, cc), &dev)?;
        let wt = Tensor::ones((cc, kc), candle_core::DType::F32, &dev)?;
        let pad = RightPadding::new(vec![4, 1], 4).ok_or(candle_core::Error::Msg("pad".into()))?;
        let (_, ns) = causal_conv_silu(&pt, &stt, &wt, Some(&pad))?;
        let ns = ns.to_vec3::<f32>()?;
        // Row 0 (full): the last 3 inputs. Row 1 (ℓ = 1): two old-state rows, then its 1st input.
        assert_eq!(ns[0], vec![vec![3.0, 4.0], vec![5.0, 6.0], vec![7.0, 8.0]]);
        assert_eq!(
            ns[1],
            vec![vec![-9.0, -10.0], vec![-11.0, -12.0], vec![9.0, 10.0]]
        );
        Ok(())
    }
}
