//! The shared-past verb of [`CandleBackend`]: several suffixes continuing one retained state
//! (a prompt head shared by many contexts, each context's own tokens after it).
//!
//! On the CPU each suffix is extended alone through the chunked prefill over a past, so a
//! suffix's state never depends on the others (bit for bit). On a GPU the suffixes run as
//! right-padded rows of one pass over the shared past — the scoring pass's layout: attention
//! reads the one past K/V for every row, the Gated DeltaNet kernels read the one past state
//! through their row map, pads sit after each row's last token — in passes of at most
//! `prefill_chunk` padded tokens, longest first so that rows of like length share a pass.

use super::*;

impl CandleBackend {
    /// [`Backend::extend_many`]: one result per suffix, in input order. A failing GPU pass is
    /// retried suffix by suffix so one bad suffix never fails the others.
    pub fn extend_batch(
        &self,
        start: &CandleState,
        suffixes: &[&[u32]],
    ) -> Vec<Result<CandleState, BackendError>> {
        if self.backbone.device.is_cpu() {
            return suffixes.iter().map(|s| self.extend(start, s)).collect();
        }
        let budget = self.prefill_chunk;
        let mut out: Vec<Option<Result<CandleState, BackendError>>> =
            suffixes.iter().map(|_| None).collect();
        for pass in padded_passes(suffixes.iter().map(|s| s.len()), budget) {
            if let [only] = pass.as_slice() {
                // alone: the chunked path (also for a suffix over the budget, or an empty one,
                // whose error it reports)
                out[*only] = Some(self.extend(start, suffixes[*only]));
                continue;
            }
            let batch: Vec<&[u32]> = pass.iter().map(|&i| suffixes[i]).collect();
            match self.extend_padded(start, &batch) {
                Ok(states) => {
                    for (&i, s) in pass.iter().zip(states) {
                        out[i] = Some(Ok(s));
                    }
                }
                Err(_) => {
                    for &i in &pass {
                        out[i] = Some(self.extend(start, suffixes[i]));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(invalid("suffix left unextended").into())))
            .collect()
    }

    /// One forward pass of `suffixes` as right-padded rows `(N, Lmax)`, every row continuing
    /// `start` (no chunking, no budget: [`CandleBackend::extend_batch`] decides what goes into
    /// one pass). Each row's state is `start` with its own tokens appended: attention K/V cut to
    /// the row's length after the past, linear-attention states taken at the row's last token.
    pub fn extend_padded(
        &self,
        start: &CandleState,
        suffixes: &[&[u32]],
    ) -> Result<Vec<CandleState>, CandleError> {
        self.check_states(&[start])?;
        if suffixes.is_empty() || suffixes.iter().any(|s| s.is_empty()) {
            return Err(invalid("cannot extend by an empty suffix"));
        }
        self.padded_rows(Some(start), suffixes, Some("extend.padded_forward"))
    }

    /// One forward pass of `rows` right-padded into `(N, Lmax)`, each row continuing `start`
    /// (or from an empty past): attention K/V cut to the row's own tokens and appended to the
    /// past's, linear-attention states taken at the row's last token (the layers read the
    /// right padding from the step). The rows are checked non-empty by the caller; `region` names
    /// the forward in the profile.
    pub(crate) fn padded_rows(
        &self,
        start: Option<&CandleState>,
        rows: &[&[u32]],
        region: Option<&'static str>,
    ) -> Result<Vec<CandleState>, CandleError> {
        let b = &self.backbone;
        let lens: Vec<usize> = rows.iter().map(|r| r.len()).collect();
        let len = lens.iter().copied().max().unwrap_or(0);
        // (N, Lmax) right-padded with id 0; pads sit after each row's last real token
        let mut ids = vec![0u32; rows.len() * len];
        for (row, r) in rows.iter().enumerate() {
            self.check_ids(r)?;
            ids[row * len..row * len + r.len()].copy_from_slice(r);
        }
        let past = start.map_or(0, PrefixState::len);
        let past_lens = vec![past; rows.len()];
        let step = Step::new(&b.rope, &past_lens, &lens, len, None, b.dtype, &b.device)?;
        let pasts: Vec<LayerPast> = match start {
            Some(s) => s
                .layers()
                .iter()
                .map(LayerPast::whole)
                .collect::<Result<_, _>>()?,
            None => b.layers.iter().map(|_| LayerPast::Empty).collect(),
        };
        let forward = || b.forward_state(&ids, &pasts, &step);
        let updates = match region {
            Some(name) => profile::region(name, &b.device, forward)?,
            None => forward()?,
        };
        profile::region("extend.split_rows", &b.device, || {
            split_rows(start, updates, &lens, past)
        })
    }
}

/// Each row's state after a padded pass: `start` (if any) with the row's own `lens[row]` tokens
/// of every layer's update appended.
fn split_rows(
    start: Option<&CandleState>,
    updates: Vec<state::LayerUpdate>,
    lens: &[usize],
    past: usize,
) -> Result<Vec<CandleState>, CandleError> {
    let op = |e: candle_core::Error| CandleError::tensor("split padded rows")(e);
    let mut per_row: Vec<Vec<LayerState>> = lens
        .iter()
        .map(|_| Vec::with_capacity(updates.len()))
        .collect();
    for (l, update) in updates.into_iter().enumerate() {
        let prev = start.map(|s| &s.layers()[l]);
        for (row, &n) in lens.iter().enumerate() {
            // K/V (N, Hkv, Lmax, hd) -> (1, Hkv, n, hd): a view where the append to a past
            // copies it anyway, else contiguous; conv / recurrent (N, …) -> (1, …)
            let own = match &update {
                state::LayerUpdate::Attention { k, v } => {
                    let cut = |t: &Tensor| {
                        let t = t.narrow(0, row, 1)?.narrow(2, 0, n)?;
                        match prev {
                            Some(_) => Ok(t),
                            None => t.contiguous(),
                        }
                    };
                    state::LayerUpdate::Attention {
                        k: cut(k).map_err(op)?,
                        v: cut(v).map_err(op)?,
                    }
                }
                state::LayerUpdate::Linear { conv, recurrent } => {
                    let cut = |t: &Tensor| t.narrow(0, row, 1)?.contiguous();
                    state::LayerUpdate::Linear {
                        conv: cut(conv).map_err(op)?,
                        recurrent: cut(recurrent).map_err(op)?,
                    }
                }
            };
            per_row[row].push(LayerState::extend(prev, own)?);
        }
    }
    Ok(per_row
        .into_iter()
        .zip(lens)
        .map(|(layers, &n)| CandleState::new(layers, past + n))
        .collect())
}

/// Which suffixes share a padded pass: longest first, each pass as many as fit
/// `rows × longest ≤ budget`. A suffix that is empty or over the budget is a pass of its own
/// (the chunked path handles it). Every index lands in exactly one pass.
pub(crate) fn padded_passes(
    lens: impl IntoIterator<Item = usize>,
    budget: usize,
) -> Vec<Vec<usize>> {
    let lens: Vec<usize> = lens.into_iter().collect();
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut passes: Vec<Vec<usize>> = Vec::new();
    let mut widest = 0;
    for i in order {
        let n = lens[i];
        if n == 0 || n > budget {
            passes.push(vec![i]);
            widest = 0;
            continue;
        }
        match passes.last_mut() {
            // sorted longest first: the pass's first row is its longest
            Some(pass) if widest > 0 && (pass.len() + 1) * widest <= budget => pass.push(i),
            _ => {
                passes.push(vec![i]);
                widest = n;
            }
        }
    }
    passes
}

#[cfg(test)]
mod tests {
    use super::padded_passes;
    use proptest::prelude::*;

    #[test]
    fn passes_fill_by_the_longest_row() {
        // budget 10: [5, 5] fits (2 × 5), then [4, 3] (2 × 4 ≤ 10, 3 × 4 > 10), [3, 2, 1]
        assert_eq!(
            padded_passes([3, 5, 4, 5, 1, 2, 3], 10),
            vec![vec![1, 3], vec![2, 0], vec![6, 5, 4]]
        );
        assert_eq!(
            padded_passes([11, 0, 2], 10),
            vec![vec![0], vec![2], vec![1]]
        );
    }

    proptest! {
        #[test]
        fn every_suffix_lands_once_and_padded_passes_fit(
            lens in proptest::collection::vec(0usize..40, 0..30),
            budget in 1usize..64,
        ) {
            let passes = padded_passes(lens.iter().copied(), budget);
            let mut seen = vec![0u32; lens.len()];
            for pass in &passes {
                prop_assert!(!pass.is_empty());
                if pass.len() > 1 {
                    let widest = pass.iter().map(|&i| lens[i]).max().unwrap();
                    prop_assert!(widest * pass.len() <= budget);
                    prop_assert!(pass.iter().all(|&i| lens[i] > 0));
                }
                for &i in pass {
                    seen[i] += 1;
                }
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
        }
    }
}
