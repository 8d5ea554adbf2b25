//! The prefill verbs of [`CandleBackend`]: one prefix in chunks, several prefixes packed into
//! shared passes, or right-padded into one batch; each returns per-prefix retained states.

use super::*;

impl CandleBackend {
    /// Prefill with an explicit chunk size (`prefill` uses the loaded `prefill_chunk`).
    pub fn prefill_chunked(&self, ids: &[u32], chunk: usize) -> Result<CandleState, CandleError> {
        self.continue_chunked(None, ids, chunk)
    }

    /// Prefill `ids` in chunks, continuing `start` when given (which is never mutated: each
    /// chunk builds new layer states from the previous ones).
    pub fn continue_chunked(
        &self,
        start: Option<&CandleState>,
        ids: &[u32],
        chunk: usize,
    ) -> Result<CandleState, CandleError> {
        self.run_chunks(start, ids, chunk, None)
    }

    /// [`CandleBackend::continue_chunked`], handing each chunk's hidden states `(1, L, D)`
    /// (before the final norm) and the chunk's first position to `on_hidden` when given. With
    /// `None` no hidden state is read, so the last layer computes its state update only
    /// ([`Backbone::forward_state`]).
    pub(crate) fn run_chunks(
        &self,
        start: Option<&CandleState>,
        ids: &[u32],
        chunk: usize,
        mut on_hidden: Option<&mut dyn FnMut(&Tensor, usize) -> Result<(), CandleError>>,
    ) -> Result<CandleState, CandleError> {
        if ids.is_empty() {
            return Err(invalid("cannot prefill an empty prefix"));
        }
        if chunk == 0 {
            return Err(invalid("prefill chunk must be positive"));
        }
        self.check_ids(ids)?;
        let b = &self.backbone;
        let mut layers: Vec<LayerState> = start.map(|s| s.layers().to_vec()).unwrap_or_default();
        let mut offset = start.map_or(0, PrefixState::len);
        for part in ids.chunks(chunk) {
            let step = Step::new(
                &b.rope,
                &[offset],
                &[part.len()],
                part.len(),
                None,
                b.dtype,
                &b.device,
            )?;
            let pasts: Vec<LayerPast> = if layers.is_empty() {
                b.layers.iter().map(|_| LayerPast::Empty).collect()
            } else {
                layers
                    .iter()
                    .map(LayerPast::whole)
                    .collect::<Result<_, _>>()?
            };
            let updates = match on_hidden.as_mut() {
                Some(on_hidden) => {
                    let (hidden, updates) = b.forward(part, &pasts, &step)?;
                    on_hidden(&hidden, offset)?;
                    updates
                }
                None => b.forward_state(part, &pasts, &step)?,
            };
            layers = if layers.is_empty() {
                updates
                    .into_iter()
                    .map(|u| LayerState::extend(None, u))
                    .collect::<Result<_, _>>()?
            } else {
                layers
                    .iter()
                    .zip(updates)
                    .map(|(l, u)| LayerState::extend(Some(l), u))
                    .collect::<Result<_, _>>()?
            };
            offset += part.len();
        }
        Ok(CandleState::new(layers, offset))
    }

    /// Prefill several prefixes in as few forward passes as fit: prefixes of at most
    /// `prefill_chunk` tokens are packed back to back without padding into passes of at most
    /// `prefill_chunk` tokens ([`CandleBackend::prefill_packed`]: every projection and MLP one
    /// GEMM over all packed tokens, attention and the Gated DeltaNet scan per prefix), longer
    /// prefixes take the chunked path of [`Backend::prefill`]. Which path a prefix takes depends
    /// only on its own length, and a packed prefix is computed exactly as it would be alone, so
    /// a prefix's state does not depend on the prefixes it was packed with (bit for bit where
    /// the device's GEMM gives each row the same result at every row count, as the CPU kernels
    /// do; tested). Results are in input order, one per prefix; a failing pass is retried
    /// prefix by prefix so one bad prefix never fails the others.
    pub fn prefill_batch(&self, prefixes: &[&[u32]]) -> Vec<Result<CandleState, BackendError>> {
        let budget = self.prefill_chunk;
        let mut out: Vec<Option<Result<CandleState, BackendError>>> =
            prefixes.iter().map(|_| None).collect();
        let plan = packing::plan(prefixes.iter().map(|p| p.len()), budget);
        for pass in &plan.passes {
            let batch: Vec<&[u32]> = pass.iter().map(|&i| prefixes[i]).collect();
            match self.prefill_packed(&batch) {
                Ok(states) => {
                    for (&i, s) in pass.iter().zip(states) {
                        out[i] = Some(Ok(s));
                    }
                }
                Err(_) if pass.len() > 1 => {
                    for &i in pass {
                        out[i] = Some(
                            self.prefill_packed(&[prefixes[i]])
                                .map_err(BackendError::from)
                                .and_then(|mut s| {
                                    s.pop().ok_or_else(|| invalid("no packed state").into())
                                }),
                        );
                    }
                }
                Err(e) => out[pass[0]] = Some(Err(e.into())),
            }
        }
        for &i in &plan.alone {
            out[i] = Some(self.prefill(prefixes[i]));
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(invalid("prefix left unprefilled").into())))
            .collect()
    }

    /// One forward pass over `prefixes` packed back to back in one row of `sum(len)` tokens
    /// (no padding, no chunking, no budget: [`CandleBackend::prefill_batch`] decides what goes
    /// into one pass). Each prefix starts at position 0 from an empty past; projections, norms
    /// and MLPs run over all tokens at once, attention and the Gated DeltaNet conv and scan per
    /// prefix. Returns one state per prefix, in order.
    pub fn prefill_packed(&self, prefixes: &[&[u32]]) -> Result<Vec<CandleState>, CandleError> {
        let b = &self.backbone;
        if prefixes.is_empty() || prefixes.iter().any(|p| p.is_empty()) {
            return Err(invalid("cannot prefill an empty prefix"));
        }
        let lens: Vec<usize> = prefixes.iter().map(|p| p.len()).collect();
        let ids: Vec<u32> = prefixes.concat(); // (T,)
        self.check_ids(&ids)?;
        let step = Step::packed(&b.rope, &lens, b.dtype, &b.device)?;
        let pasts: Vec<LayerPast> = b.layers.iter().map(|_| LayerPast::Empty).collect();
        let updates = profile::region("prefill.packed_forward", &b.device, || {
            b.forward_state(&ids, &pasts, &step)
        })?;
        let op = |e: candle_core::Error| CandleError::tensor("split packed prefill")(e);
        let mut per_prefix: Vec<Vec<LayerState>> = prefixes
            .iter()
            .map(|_| Vec::with_capacity(updates.len()))
            .collect();
        for update in updates {
            let mut start = 0;
            for (i, &n) in lens.iter().enumerate() {
                let layer = match &update {
                    // K/V (1, Hkv, T, hd) -> (1, Hkv, n, hd): the prefix's own tokens
                    state::LayerUpdate::Attention { k, v } => {
                        let cut = |t: &Tensor| t.narrow(2, start, n)?.contiguous();
                        LayerState::Attention {
                            k: cut(k).map_err(op)?,
                            v: cut(v).map_err(op)?,
                        }
                    }
                    // conv / recurrent (K, …) -> (1, …): the prefix's own final state
                    state::LayerUpdate::Linear { conv, recurrent } => {
                        let cut = |t: &Tensor| t.narrow(0, i, 1)?.contiguous();
                        LayerState::Linear {
                            conv: cut(conv).map_err(op)?,
                            recurrent: cut(recurrent).map_err(op)?,
                        }
                    }
                };
                per_prefix[i].push(layer);
                start += n;
            }
        }
        Ok(per_prefix
            .into_iter()
            .zip(&lens)
            .map(|(layers, &n)| CandleState::new(layers, n))
            .collect())
    }

    /// One forward pass over `prefixes` right-padded to the longest: `(N, Lmax)` ids from empty
    /// pasts, then each row's layer updates cut to its own length. No chunking and no budget:
    /// [`CandleBackend::prefill_batch`] decides what goes into one pass.
    pub fn prefill_padded(&self, prefixes: &[&[u32]]) -> Result<Vec<CandleState>, CandleError> {
        if prefixes.iter().any(|p| p.is_empty()) {
            return Err(invalid("cannot prefill an empty prefix"));
        }
        self.padded_rows(None, prefixes, None)
    }
}
