//! The scoring verbs of [`CandleBackend`]: rows continuing one or several retained states,
//! laid out slot-major ([`SlotLayout`]), evaluated in one backbone call and projected onto
//! their candidate tokens.

use super::*;

/// Rows of one scoring call laid out slot-major: slot `i` (state `slots[i]`) owns batch rows
/// `i*R .. (i+1)*R`. Slots with fewer than `R` rows are filled with copies of their first row,
/// whose results are dropped.
struct SlotLayout {
    slots: Vec<usize>,
    /// For each batch row: the caller's row it computes (`None` for a filler copy) and its slot.
    batch: Vec<(Option<usize>, u32)>,
    /// For each caller row: its batch row.
    position: Vec<usize>,
}

impl SlotLayout {
    fn new(rows: &[ScoreRow<'_>]) -> Self {
        let mut slots: Vec<usize> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            match slots.iter().position(|&s| s == r.state) {
                Some(k) => members[k].push(i),
                None => {
                    slots.push(r.state);
                    members.push(vec![i]);
                }
            }
        }
        let per_slot = members.iter().map(Vec::len).max().unwrap_or(0);
        let mut batch = Vec::with_capacity(slots.len() * per_slot);
        let mut position = vec![0; rows.len()];
        for (k, m) in members.iter().enumerate() {
            for j in 0..per_slot {
                match m.get(j) {
                    Some(&i) => {
                        position[i] = batch.len();
                        batch.push((Some(i), k as u32));
                    }
                    None => batch.push((None, k as u32)),
                }
            }
        }
        SlotLayout {
            slots,
            batch,
            position,
        }
    }

    /// The caller's row a batch row computes (a filler computes its slot's first row again).
    fn source(&self, batch_row: usize, rows: &[ScoreRow<'_>]) -> usize {
        let (own, slot) = self.batch[batch_row];
        own.unwrap_or_else(|| {
            let state = self.slots[slot as usize];
            rows.iter().position(|r| r.state == state).unwrap_or(0)
        })
    }
}

impl CandleBackend {
    /// [`Backend::score`] in candle's own error type. The request is valid by construction
    /// (rows name existing states, suffixes and candidates are non-empty); what is left to check
    /// here is what only this model knows: token ids against its embedding, state layer counts.
    pub(super) fn score_request(
        &self,
        request: &ScoreRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, CandleError> {
        let rows = request.rows();
        // each row's last suffix token
        let picks: Vec<(usize, usize)> = rows
            .iter()
            .enumerate()
            .map(|(r, row)| (r, row.suffix.len() - 1))
            .collect();
        let (data, vocab) = self.score_at(
            request.states(),
            rows,
            &picks,
            request.candidates(),
            request.vocab_top_k(),
        )?;
        Ok(CandidateLogits {
            rows: rows.len(),
            candidates: request.candidates().len(),
            data,
            vocab,
        })
    }

    /// Run `rows` (each continuing its state, slot-merged and right-padded as in
    /// [`Backend::score`]) in one pass and project the positions `picks` (caller row, offset
    /// into its suffix), in that order: f32 logits `(picks, C)` row-major, and with
    /// `vocab_top_k` one full-vocabulary summary per pick.
    pub(crate) fn score_at(
        &self,
        states: &[&CandleState],
        rows: &[ScoreRow<'_>],
        picks: &[(usize, usize)],
        candidates: &[u32],
        vocab_top_k: Option<usize>,
    ) -> Result<(Vec<f32>, Option<Vec<VocabRow>>), CandleError> {
        self.check_ids(candidates)?;
        let b = &self.backbone;
        self.check_states(states)?;
        for r in rows {
            self.check_ids(r.suffix)?;
            if r.state >= states.len() || r.suffix.is_empty() {
                return Err(invalid("a row names no state or has an empty suffix"));
            }
        }
        if let Some(&(r, t)) = picks
            .iter()
            .find(|&&(r, t)| rows.get(r).is_none_or(|row| t >= row.suffix.len()))
        {
            return Err(invalid(format!(
                "position {t} of row {r} is not in the call"
            )));
        }
        if let Some(k) = vocab_top_k {
            self.check_top_k(k)?;
        }
        let layout = SlotLayout::new(rows);
        let batch_slot: Vec<u32> = layout.batch.iter().map(|&(_, slot)| slot).collect();
        let (pasts, p) = profile::region("score.merge_slots", &b.device, || {
            merge_slots(states, &layout.slots, &batch_slot)
        })?;
        let sources: Vec<&ScoreRow> = (0..layout.batch.len())
            .map(|b| &rows[layout.source(b, rows)])
            .collect();
        let past_lens: Vec<usize> = sources.iter().map(|r| states[r.state].len()).collect();
        let valid: Vec<usize> = sources.iter().map(|r| r.suffix.len()).collect();
        let len = valid.iter().copied().max().unwrap_or(1);
        // (B, L) right-padded with id 0; pads sit after each row's last real token
        let mut ids = vec![0u32; sources.len() * len];
        for (b, row) in sources.iter().enumerate() {
            ids[b * len..b * len + row.suffix.len()].copy_from_slice(row.suffix);
        }
        // several slots: each slot's rows attend to it alone (no left padding), as in a call of
        // those rows alone
        // the branch's layer updates are dropped: the step says so (no final GDN states)
        let step = match layout.slots.len() {
            1 => Step::new(&b.rope, &past_lens, &valid, len, None, b.dtype, &b.device)?,
            s => Step::per_slot(
                &b.rope,
                &past_lens,
                &valid,
                len,
                sources.len() / s,
                b.dtype,
                &b.device,
            )?,
        }
        .discarding_state();
        let (hidden, branch) = profile::region("score.forward", &b.device, || {
            b.forward_branch(&ids, &pasts, &step)
        })?;
        self.record_branch(branch, sources.len(), len, p, layout.slots.len());
        // each pick's flat position in (B*L), in the caller's order
        let flat: Vec<u32> = picks
            .iter()
            .map(|&(r, t)| (layout.position[r] * len + t) as u32)
            .collect();
        profile::region("score.project", &b.device, || {
            self.project(&hidden, &flat, candidates, vocab_top_k)
        })
    }

    pub(super) fn forward_full_candle(
        &self,
        ids: &[u32],
        candidates: &[u32],
    ) -> Result<Vec<f32>, CandleError> {
        if ids.is_empty() {
            return Err(invalid("cannot run an empty prompt"));
        }
        self.check_ids(ids)?;
        self.check_candidates(candidates)?;
        let b = &self.backbone;
        let n = ids.len();
        let step = Step::new(&b.rope, &[0], &[n], n, None, b.dtype, &b.device)?.discarding_state();
        let pasts: Vec<LayerPast> = b.layers.iter().map(|_| LayerPast::Empty).collect();
        let (hidden, _) = b.forward_branch(ids, &pasts, &step)?;
        Ok(self
            .project(&hidden, &[(n - 1) as u32], candidates, None)?
            .0)
    }
}
