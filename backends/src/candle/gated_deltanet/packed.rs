//! A packed prefill through one Gated DeltaNet layer: several independent prefixes back to
//! back in one row `(1, T, D)`, each from zero state. The projections run once over all tokens;
//! the conv, gates and delta rule per prefix (the candle forms, bit-identical to each prefix's
//! solo call) or, on the fused CUDA kernels, over the prefixes right-padded into one batch.

use candle_core::{DType, Tensor};

use super::{DeltaRule, GdnLayer, GdnState, Projections, RightPadding};
use crate::candle::profile;
use crate::error::CandleError;

impl GdnLayer {
    /// Several independent prefixes packed back to back in one row, `x (1, T, D)`, each from
    /// zero state: the projections run once over all `T` tokens (large GEMMs), the conv, gates
    /// and delta rule per segment exactly as that prefix's solo call runs them. Returns the
    /// output `(1, T, D)` and the segments' final states stacked `(K, ..)` in segment order.
    pub(crate) fn forward_packed(
        &self,
        x: &Tensor,
        segments: &[(usize, usize)],
    ) -> Result<(Tensor, GdnState), CandleError> {
        let (b, l, _) = x.dims3().map_err(CandleError::tensor("gdn.input"))?;
        let end = segments.iter().map(|&(s, n)| s + n).max().unwrap_or(0);
        if b != 1 || segments.is_empty() || end > l || segments.iter().any(|&(_, n)| n == 0) {
            return Err(CandleError::InvalidRequest {
                reason: format!(
                    "packed GDN call: segments {segments:?} over an input of ({b}, {l})"
                ),
            });
        }
        self.run_packed(x, segments)
            .map_err(CandleError::tensor("gdn.packed"))
    }

    fn run_packed(
        &self,
        x: &Tensor,
        segments: &[(usize, usize)],
    ) -> candle_core::Result<(Tensor, GdnState)> {
        let act = x.dtype();
        let dev = x.device();
        // fused or not does not depend on the length, so every segment takes the same family
        let whole = self.rule_for(x);
        let proj = self.project(x, Self::in_dtype(whole, act))?;
        if whole == DeltaRule::Fused && segments.len() > 1 {
            return self.run_packed_fused(&proj, segments, act);
        }
        let mut outs = Vec::with_capacity(segments.len());
        let mut convs = Vec::with_capacity(segments.len());
        let mut recurrents = Vec::with_capacity(segments.len());
        for &(start, len) in segments {
            let rule = DeltaRule::for_call(len, &self.dims, dev);
            let part = proj.narrow(start, len)?;
            let zero = GdnState::zeros(&self.dims, 1, dev)?;
            let (o, next) = self.mix(&part, &zero, None, None, rule, act)?;
            outs.push(o);
            convs.push(next.conv);
            recurrents.push(next.recurrent);
        }
        let cat = |parts: &[Tensor], dim: usize| match parts {
            [one] => Ok(one.clone()),
            _ => Tensor::cat(parts, dim),
        };
        let o = cat(&outs, 1)?; // (1, T, Hv, dv)
        let out = self.finish(&o, &proj.z, whole, act)?;
        Ok((
            out,
            GdnState {
                conv: cat(&convs, 0)?,           // (K, Kc−1, Cc)
                recurrent: cat(&recurrents, 0)?, // (K, Hv, dk, dv)
            },
        ))
    }

    /// The fused kernels over a packed call: the segments' projections right-padded into one
    /// `(K, Lmax, ..)` batch from zero state (pads have β = g = 0 and each row's conv state is
    /// taken at its own last token), so one launch of each kernel runs every (segment, head)
    /// pair in parallel instead of one launch sequence per segment; the outputs are cut back to
    /// the packed row. (The per-segment loop stays for the candle forms: there it keeps each
    /// segment bit-identical to its solo call.)
    fn run_packed_fused(
        &self,
        proj: &Projections,
        segments: &[(usize, usize)],
        act: DType,
    ) -> candle_core::Result<(Tensor, GdnState)> {
        let dev = proj.p.device();
        let lens: Vec<usize> = segments.iter().map(|&(_, n)| n).collect();
        let lmax = lens.iter().copied().max().unwrap_or(0);
        // (1, T, C) -> (K, Lmax, C), each segment's tokens first, zeros after
        let batch = |t: &Tensor| -> candle_core::Result<Tensor> {
            let rows = segments
                .iter()
                .map(|&(start, n)| t.narrow(1, start, n)?.pad_with_zeros(1, 0, lmax - n))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&rows, 0)
        };
        let padded = profile::region("gdn.pack", dev, || {
            Ok::<_, candle_core::Error>(Projections {
                p: batch(&proj.p)?,
                z: proj.z.clone(), // not read by the mixing part
                b_logits: batch(&proj.b_logits)?,
                a_in: batch(&proj.a_in)?,
            })
        })?;
        let padding = RightPadding::new(lens.clone(), lmax).ok_or_else(|| {
            candle_core::Error::Msg("packed GDN: a segment over its batch".into())
        })?;
        let zero = GdnState::zeros(&self.dims, segments.len(), dev)?;
        let (o, next) = self.mix(&padded, &zero, None, Some(&padding), DeltaRule::Fused, act)?;
        // (K, Lmax, Hv, dv) -> (1, T, Hv, dv)
        let o = profile::region("gdn.unpack", dev, || {
            let rows = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| o.narrow(0, i, 1)?.narrow(1, 0, n))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&rows, 1)
        })?;
        let out = self.finish(&o, &proj.z, DeltaRule::Fused, act)?;
        Ok((out, next))
    }
}
