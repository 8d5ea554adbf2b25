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
            let (o, next) = self.mix(&part, &zero, None, None, rule, act, true)?;
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
    /// `(K, Lmax, ..)` batch (the conv input read in place through row starts instead, where the
    /// paired conv kernel runs: bit-identical) from zero state (pads have β = g = 0 and each row's conv state is
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
        // the fused conv reads p's rows in place where it can (no padded copy of the widest
        // projection); β and g are narrow and padded either way
        let in_place = !packed_conv_copies()
            && super::fused::conv_reads_packed(&proj.p, &self.conv, segments.len(), lmax);
        let padded = profile::region("gdn.pack", dev, || {
            Ok::<_, candle_core::Error>(Projections {
                p: match in_place {
                    true => proj.p.clone(),
                    false => pad_segments(&proj.p, segments, lmax)?,
                },
                z: proj.z.clone(), // not read by the mixing part
                b_logits: pad_segments(&proj.b_logits, segments, lmax)?,
                a_in: pad_segments(&proj.a_in, segments, lmax)?,
                p_rows: in_place.then(|| segments.iter().map(|&(s, _)| s).collect()),
            })
        })?;
        let padding = RightPadding::new(lens.clone(), lmax).ok_or_else(|| {
            candle_core::Error::Msg("packed GDN: a segment over its batch".into())
        })?;
        let zero = GdnState::zeros(&self.dims, segments.len(), dev)?;
        let (o, next) = self.mix(
            &padded,
            &zero,
            None,
            Some(&padding),
            DeltaRule::Fused,
            act,
            true,
        )?;
        // (K, Lmax, Hv, dv) -> (1, T, Hv, dv)
        let o = profile::region("gdn.unpack", dev, || cut_segments(&o, &lens))?;
        let out = self.finish(&o, &proj.z, DeltaRule::Fused, act)?;
        Ok((out, next))
    }
}

/// `FORKSCORE_GDN_PACKED_CONV=copy`: the conv input goes through a padded copy (to compare),
/// read once.
fn packed_conv_copies() -> bool {
    static COPY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *COPY.get_or_init(|| crate::switches::is("FORKSCORE_GDN_PACKED_CONV", "copy"))
}

/// `t (1, T, ..)` -> `(K, Lmax, ..)`: segment `i`'s tokens first in batch row `i`, zeros after
/// (right padding). One copy per segment into a zeroed batch.
fn pad_segments(
    t: &Tensor,
    segments: &[(usize, usize)],
    lmax: usize,
) -> candle_core::Result<Tensor> {
    let t = t.contiguous()?;
    let dims = t.dims().to_vec();
    let end = segments.iter().map(|&(s, n)| s + n).max().unwrap_or(0);
    if dims.len() < 2 || dims[0] != 1 || end > dims[1] || segments.iter().any(|&(_, n)| n > lmax) {
        candle_core::bail!("packed GDN: segments {segments:?} over an input of {dims:?}");
    }
    let (rest, width): (Vec<usize>, usize) = (dims[2..].to_vec(), dims[2..].iter().product());
    // (K·Lmax, width), filled segment by segment
    let batch = Tensor::zeros((segments.len() * lmax, width), t.dtype(), t.device())?;
    for (i, &(start, n)) in segments.iter().enumerate() {
        // a leading-1 row: tokens start .. start + n are one contiguous block
        let part = t.narrow(1, start, n)?.reshape((n, width))?;
        batch.slice_set(&part, 0, i * lmax)?;
    }
    let mut shape = vec![segments.len(), lmax];
    shape.extend(rest);
    batch.reshape(shape)
}

/// `o (K, Lmax, ..)` -> `(1, T, ..)`: each batch row's first `lens[i]` tokens, back to back in
/// row order (the packed layout). One concatenation of the rows' leading blocks (each a
/// contiguous view): on CUDA a gather by `index_select` took 1.8× its time at the 4B's shapes.
fn cut_segments(o: &Tensor, lens: &[usize]) -> candle_core::Result<Tensor> {
    let dims = o.dims().to_vec();
    if dims.len() < 2 || dims[0] != lens.len() || lens.iter().any(|&n| n > dims[1]) {
        candle_core::bail!("packed GDN: lengths {lens:?} over a batch of {dims:?}");
    }
    let rows = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| o.narrow(0, i, 1)?.narrow(1, 0, n))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&rows, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use proptest::prelude::*;

    /// The segments' tokens padded into a batch, the old way: narrow, pad, concatenate.
    fn pad_by_cat(t: &Tensor, segments: &[(usize, usize)], lmax: usize) -> Tensor {
        let rows: Vec<Tensor> = segments
            .iter()
            .map(|&(s, n)| {
                t.narrow(1, s, n)
                    .and_then(|r| r.pad_with_zeros(1, 0, lmax - n))
            })
            .collect::<candle_core::Result<_>>()
            .expect("rows");
        Tensor::cat(&rows, 0).expect("cat")
    }

    proptest! {
        /// Padding into a batch equals the narrow / pad / concatenate form bit for bit, for any
        /// segment lengths and trailing shape, and cutting back undoes it.
        #[test]
        fn pad_and_cut_equal_the_concatenating_forms(
            lens in proptest::collection::vec(1usize..9, 1..5),
            width in 1usize..6,
            heads in 1usize..3,
        ) {
            let dev = Device::Cpu;
            let total: usize = lens.iter().sum();
            let lmax = *lens.iter().max().expect("one segment");
            let mut start = 0;
            let segments: Vec<(usize, usize)> = lens
                .iter()
                .map(|&n| {
                    start += n;
                    (start - n, n)
                })
                .collect();
            let t = Tensor::arange(1f32, (total * heads * width) as f32 + 1.0, &dev)
                .and_then(|t| t.reshape((1, total, heads, width)))
                .expect("t");
            let padded = pad_segments(&t, &segments, lmax).expect("pad");
            let want = pad_by_cat(&t, &segments, lmax);
            prop_assert_eq!(padded.dims(), want.dims());
            let flat = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("vec");
            prop_assert_eq!(flat(&padded), flat(&want));
            let back = cut_segments(&padded, &lens).expect("cut");
            prop_assert_eq!(back.dims(), t.dims());
            prop_assert_eq!(flat(&back), flat(&t));
            // other dtypes copy the same way (compared with the f32 form rounded to bf16:
            // integers above 256 are not all representable in bf16)
            let b = t.to_dtype(DType::BF16).expect("bf16");
            let pb = pad_segments(&b, &segments, lmax).and_then(|p| p.to_dtype(DType::F32)).expect("pad bf16");
            let want_bf16 = want.to_dtype(DType::BF16).and_then(|w| w.to_dtype(DType::F32)).expect("want bf16");
            prop_assert_eq!(flat(&pb), flat(&want_bf16));
        }
    }

    #[test]
    fn a_length_over_the_batch_is_an_error() {
        let o = Tensor::zeros((2, 3, 4), DType::F32, &Device::Cpu).expect("o");
        assert!(cut_segments(&o, &[3, 4]).is_err());
        assert!(cut_segments(&o, &[3]).is_err());
    }
}
