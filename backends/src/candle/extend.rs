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
        profile::region(
            "extend.split_rows",
            &b.device,
            || match crate::switches::is("FORKSCORE_ROW_SPLIT", "rows") {
                true => split_rows_one_by_one(start, updates, &lens, past),
                false => split_rows(start, updates, &lens, past),
            },
        )
    }
}

/// Each row's state after a padded pass: `start` (if any) with the row's own `lens[row]` tokens
/// of every layer's update appended.
///
/// An attention layer's rows are cut with ONE gather per K and V (whatever the row count):
/// `[past ; new]` as rows of `hd` values, index-selected into one buffer that holds every row's
/// `(1, Hkv, P + n, hd)` back to back, each row's state a contiguous view of it. The values are
/// copies, so each state is bit for bit what appending the row's own K/V to the past gives
/// ([`split_rows_one_by_one`], the reference the unit test holds it to), in a handful of launches
/// per layer instead of a few per row and layer. Linear-attention states are `(N, …)` row views.
fn split_rows(
    start: Option<&CandleState>,
    updates: Vec<state::LayerUpdate>,
    lens: &[usize],
    past: usize,
) -> Result<Vec<CandleState>, CandleError> {
    let mut per_row: Vec<Vec<LayerState>> = lens
        .iter()
        .map(|_| Vec::with_capacity(updates.len()))
        .collect();
    // the gather index, the same for every attention layer of the pass (built on first use)
    let mut gather: Option<RowGather> = None;
    for (l, update) in updates.into_iter().enumerate() {
        let prev = start.map(|s| &s.layers()[l]);
        match update {
            state::LayerUpdate::Attention { k, v } => {
                let (pk, pv) = match prev {
                    None => (None, None),
                    Some(LayerState::Attention { k, v }) => (Some(k), Some(v)),
                    Some(LayerState::Linear { .. }) => {
                        return Err(CandleError::InvalidRequest {
                            reason: "layer update does not match the layer's state kind".into(),
                        })
                    }
                };
                let g = match &mut gather {
                    Some(g) => g,
                    None => gather.insert(RowGather::new(&k, lens, past)?),
                };
                let ks = g.rows(pk, &k)?;
                let vs = g.rows(pv, &v)?;
                for (row, (k, v)) in ks.into_iter().zip(vs).enumerate() {
                    per_row[row].push(LayerState::Attention { k, v });
                }
            }
            state::LayerUpdate::Linear { conv, recurrent } => {
                for (row, states) in per_row.iter_mut().enumerate() {
                    states.push(LayerState::extend(
                        prev,
                        linear_row(&conv, &recurrent, row)?,
                    )?);
                }
            }
        }
    }
    Ok(per_row
        .into_iter()
        .zip(lens)
        .map(|(layers, &n)| CandleState::new(layers, past + n))
        .collect())
}

/// Row `row` of a linear-attention update: conv / recurrent `(N, …)` -> `(1, …)`, contiguous
/// views.
fn linear_row(
    conv: &Tensor,
    recurrent: &Tensor,
    row: usize,
) -> Result<state::LayerUpdate, CandleError> {
    let cut = |t: &Tensor| {
        t.narrow(0, row, 1)
            .and_then(|t| t.contiguous())
            .map_err(CandleError::tensor("split padded rows"))
    };
    Ok(state::LayerUpdate::Linear {
        conv: cut(conv)?,
        recurrent: cut(recurrent)?,
    })
}

/// Where each row's `(1, Hkv, P + n, hd)` K (or V) comes from in `[past ; new]` viewed as rows of
/// `hd` values: the past `(1, Hkv, P, hd)` first, then the new `(N, Hkv, Lmax, hd)`.
struct RowGather {
    /// `(Σ Hkv·(P + n),)` u32: per row, per head, the past's `P` rows then the row's own `n`.
    index: Tensor,
    /// Per row: its first index entry and its length `P + n`.
    spans: Vec<(usize, usize)>,
    /// `(N, Hkv, Lmax, hd)` of the new K/V and `P`: every layer's must match the first's.
    new_dims: (usize, usize, usize, usize),
    past: usize,
}

impl RowGather {
    fn new(new: &Tensor, lens: &[usize], past: usize) -> Result<RowGather, CandleError> {
        let op = CandleError::tensor("split padded rows");
        let (n, kv_heads, lmax, head_dim) = new.dims4().map_err(op)?;
        if n != lens.len() || lens.iter().any(|&l| l > lmax) {
            return Err(CandleError::InvalidRequest {
                reason: format!("{n} padded rows of {lmax} for {} row lengths", lens.len()),
            });
        }
        let new_base = kv_heads * past;
        let mut index = Vec::with_capacity(lens.iter().map(|l| kv_heads * (past + l)).sum());
        let mut spans = Vec::with_capacity(n);
        for (r, &len) in lens.iter().enumerate() {
            spans.push((index.len(), past + len));
            for h in 0..kv_heads {
                index.extend((0..past).map(|t| (h * past + t) as u32));
                let own = new_base + (r * kv_heads + h) * lmax;
                index.extend((0..len).map(|t| (own + t) as u32));
            }
        }
        let len = index.len();
        let index = Tensor::from_vec(index, len, new.device())
            .map_err(CandleError::tensor("gather index"))?;
        Ok(RowGather {
            index,
            spans,
            new_dims: (n, kv_heads, lmax, head_dim),
            past,
        })
    }

    /// One state tensor per row, each a contiguous `(1, Hkv, P + n, hd)` view of one gathered
    /// buffer.
    fn rows(&self, past: Option<&Tensor>, new: &Tensor) -> Result<Vec<Tensor>, CandleError> {
        let op = |e| CandleError::tensor("split padded rows")(e);
        let (_, hkv, _, hd) = self.new_dims;
        let past_dims = past.map(|p| p.dims().to_vec());
        if new.dims4().map_err(op)? != self.new_dims
            || past_dims
                .as_ref()
                .is_some_and(|d| d[..] != [1, hkv, self.past, hd])
        {
            return Err(CandleError::InvalidRequest {
                reason: format!(
                    "attention layers disagree on K/V shapes: {:?} after {:?}, past {past_dims:?}",
                    new.dims(),
                    self.new_dims
                ),
            });
        }
        // (N, Hkv, Lmax, hd) -> (N·Hkv·Lmax, hd); with a past, (Hkv·P, hd) before it
        let new_rows = new
            .contiguous()
            .and_then(|t| t.reshape((t.elem_count() / hd, hd)))
            .map_err(op)?;
        let source = match past {
            None => new_rows,
            Some(p) => p
                .contiguous()
                .and_then(|p| p.reshape((p.elem_count() / hd, hd)))
                .and_then(|p| Tensor::cat(&[&p, &new_rows], 0))
                .map_err(op)?,
        };
        let all = source.index_select(&self.index, 0).map_err(op)?;
        self.spans
            .iter()
            .map(|&(first, len)| {
                all.narrow(0, first, hkv * len)
                    .and_then(|t| t.reshape((1, hkv, len, hd)))
                    .map_err(op)
            })
            .collect()
    }
}

/// [`split_rows`] one row and one layer at a time (a narrow and an append per row): the
/// reference its gather is tested against, and the A/B side of `FORKSCORE_ROW_SPLIT=rows`.
fn split_rows_one_by_one(
    start: Option<&CandleState>,
    updates: Vec<state::LayerUpdate>,
    lens: &[usize],
    past: usize,
) -> Result<Vec<CandleState>, CandleError> {
    let op = |e: candle_core::Error| CandleError::tensor("split padded rows")(e);
    let mut per_row: Vec<Vec<LayerState>> = lens.iter().map(|_| Vec::new()).collect();
    for (l, update) in updates.into_iter().enumerate() {
        let prev = start.map(|s| &s.layers()[l]);
        for (row, &n) in lens.iter().enumerate() {
            let own = match &update {
                state::LayerUpdate::Attention { k, v } => {
                    let cut = |t: &Tensor| t.narrow(0, row, 1)?.narrow(2, 0, n)?.contiguous();
                    state::LayerUpdate::Attention {
                        k: cut(k).map_err(op)?,
                        v: cut(v).map_err(op)?,
                    }
                }
                state::LayerUpdate::Linear { conv, recurrent } => linear_row(conv, recurrent, row)?,
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
    use super::*;
    use candle_core::{DType, Device};
    use proptest::prelude::*;

    fn values(shape: &[usize], seed: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::arange(0f32, n as f32, &Device::Cpu)
            .and_then(|t| (t + seed as f64)?.reshape(shape))
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("tensor")
    }

    /// Per state: its length, and each layer tensor's dims and values.
    type Flat = (usize, Vec<Vec<usize>>, Vec<Vec<f32>>);

    fn flat(states: &[CandleState]) -> Vec<Flat> {
        states
            .iter()
            .map(|s| {
                let ts: Vec<&Tensor> = s
                    .layers()
                    .iter()
                    .flat_map(|l| match l {
                        LayerState::Attention { k, v } => [k, v],
                        LayerState::Linear { conv, recurrent } => [conv, recurrent],
                    })
                    .collect();
                (
                    s.len(),
                    ts.iter().map(|t| t.dims().to_vec()).collect(),
                    ts.iter()
                        .map(|t| {
                            assert!(t.is_contiguous(), "a state tensor is not contiguous");
                            t.flatten_all()
                                .and_then(|t| t.to_dtype(DType::F32))
                                .and_then(|t| t.to_vec1::<f32>())
                                .expect("to host")
                        })
                        .collect(),
                )
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The one-gather split gives every row exactly the state the row-by-row appends give
        /// (K/V of attention layers, conv / recurrent of linear ones), with and without a past.
        #[test]
        fn gathered_split_equals_row_by_row(
            lens in proptest::collection::vec(1usize..6, 1..5),
            kv_heads in 1usize..3,
            past in 0usize..4,
            with_start in any::<bool>(),
        ) {
            let hd = 4;
            let n = lens.len();
            let lmax = *lens.iter().max().unwrap();
            let past = if with_start { past } else { 0 };
            let updates = || {
                vec![
                    state::LayerUpdate::Attention {
                        k: values(&[n, kv_heads, lmax, hd], 0.0),
                        v: values(&[n, kv_heads, lmax, hd], 1000.0),
                    },
                    state::LayerUpdate::Linear {
                        conv: values(&[n, 2, 3], 7.0),
                        recurrent: values(&[n, 2, 2, 2], 9.0),
                    },
                    state::LayerUpdate::Attention {
                        k: values(&[n, kv_heads, lmax, hd], 500.0),
                        v: values(&[n, kv_heads, lmax, hd], 1500.0),
                    },
                ]
            };
            let start = with_start.then(|| {
                CandleState::new(
                    vec![
                        LayerState::Attention {
                            k: values(&[1, kv_heads, past, hd], -100.0),
                            v: values(&[1, kv_heads, past, hd], -200.0),
                        },
                        LayerState::Linear {
                            conv: values(&[1, 2, 3], -1.0),
                            recurrent: values(&[1, 2, 2, 2], -2.0),
                        },
                        LayerState::Attention {
                            k: values(&[1, kv_heads, past, hd], -300.0),
                            v: values(&[1, kv_heads, past, hd], -400.0),
                        },
                    ],
                    past,
                )
            });
            let gathered = split_rows(start.as_ref(), updates(), &lens, past).unwrap();
            let reference = split_rows_one_by_one(start.as_ref(), updates(), &lens, past).unwrap();
            prop_assert_eq!(flat(&gathered), flat(&reference));
        }
    }

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
