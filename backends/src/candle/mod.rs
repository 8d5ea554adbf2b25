//! The candle implementation of the [`Backend`] seam (CPU, and CUDA / Metal behind features).
//!
//! `CandleBackend::load(&ResolvedCheckpoint, &LoadOptions)` reads `config.json`, maps the
//! safetensors files and builds the architecture's backbone in the chosen dtype on the chosen
//! device. Then:
//! - `prefill(ids)` runs the prefix in chunks of `prefill_chunk` tokens, appending each chunk's
//!   K/V to the retained [`CandleState`] (no vocabulary projection);
//! - `score(states, rows, candidates)` forks: rows are laid out slot-major (one slot per state
//!   used, equal rows per slot, short slots filled with dropped copies); rows continuing one
//!   shared state read its K/V directly; several states are merged once per slot, left-padded to
//!   the longest prefix and masked. Suffixes are right-padded to the longest, each row's last
//!   real position is gathered, and only the candidate rows of the head are projected (f32).
//!   Branch K/V are discarded;
//! - `forward_full(ids, candidates)` is the plain path: the whole prompt from scratch, one call;
//! - `decode_step(state, token)`: one token over the retained state, the full head at that one
//!   position, the greedy argmax (see `decode`);
//! - opt-in full-vocabulary summaries (`ScoreRequest::with_vocab`, `vocab_rows`): see `vocab`.

pub mod attention;
pub mod checkpoint;
pub mod config;
pub mod device;
pub mod gated_deltanet;
pub mod limits;
pub mod profile;
pub mod state;

#[cfg(feature = "cuda")]
mod cuda_module;
#[cfg(feature = "cuda")]
pub mod cuda_runtime;
mod decode;
mod flash_attention;
mod head;
mod linear;
pub mod mask;
pub mod mlp;
mod models;
mod norm;
mod rope;
mod shards;
mod step;
mod swiglu;
mod vocab;
pub mod vocab_topk;
mod warmup;
mod weights;

use candle_core::Tensor;

pub use checkpoint::{hf_cache_root, validate_revision, CheckpointSource, ResolvedCheckpoint};
pub use config::{Architecture, LayerKind, ModelConfig, TextConfig};
pub use device::{CandleDType, ComputeDType, DeviceSpec, OpenDevice};
pub use linear::QuantSummary;
pub use state::{CandleState, LayerState};

use crate::error::CandleError;
use forkscore_seam::{
    Architecture as ModelClass, Backend, BackendError, CandidateLogits, DecodeStep, ModelFacts,
    PositionVocab, PrefixState, Quantization, ScoreRequest, ScoreRow, VocabRequest, VocabRow,
};
use models::Backbone;
use shards::{ShardSet, WeightFiles};
use state::{merge_slots, LayerPast};
use step::Step;
use weights::Weights;

/// Default number of prefix tokens per prefill chunk on the CPU (bounds activation memory).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Default prefill chunk on GPUs: a whole long prefix in one pass (fewer, larger GEMMs and one
/// launch of each fused kernel per layer), activations still in the hundreds of MiB.
pub const GPU_PREFILL_CHUNK: usize = 4096;

/// Padded tokens (rows × longest prefix) of one batched prefill pass ([`CandleBackend::prefill_batch`]):
/// large enough that the GEMMs run at full rate, small enough that the f32 attention scores of
/// the pass (`rows · heads · L²` floats) stay in the hundreds of MiB on a real model.
pub const PREFILL_BATCH_TOKENS: usize = 8192;

/// How to load a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    pub device: DeviceSpec,
    pub dtype: ComputeDType,
    /// Prefix tokens per prefill chunk (> 0). Chunking bounds activation memory; results equal
    /// a one-shot prefill within f32 rounding.
    pub prefill_chunk: usize,
    /// Quantize the decoder's linear weights in memory at load time (the embedding, norms and
    /// candidate head stay in `dtype`); `None` keeps every weight in `dtype`.
    pub quantization: Option<Quantization>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceSpec::Cpu,
            dtype: ComputeDType::F32,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            quantization: None,
        }
    }
}

impl LoadOptions {
    /// `device` with its default dtype (f32 on CPU, bf16 on accelerators) and prefill chunk
    /// ([`DEFAULT_PREFILL_CHUNK`] on CPU, [`GPU_PREFILL_CHUNK`] on accelerators).
    pub fn for_device(device: DeviceSpec) -> Self {
        LoadOptions {
            device,
            dtype: device.default_dtype(),
            prefill_chunk: if matches!(device, DeviceSpec::Cpu) {
                DEFAULT_PREFILL_CHUNK
            } else {
                GPU_PREFILL_CHUNK
            },
            quantization: None,
        }
    }
}

/// A loaded model on one device.
pub struct CandleBackend {
    backbone: Backbone,
    facts: ModelFacts,
    config: ModelConfig,
    checkpoint: ResolvedCheckpoint,
    prefill_chunk: usize,
    /// Names of the checkpoint tensors read at load, sorted (vision / MTP tensors never are).
    tensors_read: Vec<String>,
}

/// f32 conv + recurrent state bytes per sequence over the linear-attention layers.
fn fixed_state_bytes(config: &ModelConfig) -> usize {
    let Some(lin) = &config.linear_attention else {
        return 0;
    };
    let layers = config
        .text
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::LinearAttention)
        .count();
    let conv_dim =
        2 * lin.num_key_heads * lin.key_head_dim + lin.num_value_heads * lin.value_head_dim;
    let conv = lin.conv_kernel_dim.saturating_sub(1) * conv_dim;
    let recurrent = lin.num_value_heads * lin.key_head_dim * lin.value_head_dim;
    layers * (conv + recurrent) * std::mem::size_of::<f32>()
}

fn invalid(reason: impl Into<String>) -> CandleError {
    CandleError::InvalidRequest {
        reason: reason.into(),
    }
}

impl CandleBackend {
    pub fn load(
        checkpoint: &ResolvedCheckpoint,
        options: &LoadOptions,
    ) -> Result<Self, CandleError> {
        if options.prefill_chunk == 0 {
            return Err(invalid("prefill_chunk must be positive"));
        }
        let config = ModelConfig::from_file(&checkpoint.dir.join("config.json"))?;
        let device = options.device.open()?;
        warmup::compile_candle_kernels(&device);
        let shards = ShardSet::open(&WeightFiles::discover(&checkpoint.dir)?)?;
        limits::check_against_tensors(&config, shards.shapes())?;
        let weights = Weights::new(&shards, "", options.dtype.dtype(), &device)
            .with_quantization(options.quantization);
        let backbone = models::load(&config, &weights)?;
        let facts = ModelFacts {
            architecture: ModelClass::from_name(&config.architecture_name)
                .unwrap_or_else(|| config.architecture.model_class()),
            family: Some(config.architecture.family()),
            vocab_size: backbone.vocab_size(),
            num_layers: backbone.layers.len(),
            hidden_size: backbone.hidden_size(),
            attention_heads: config.text.num_heads,
            kv_heads: config.text.num_kv_heads,
            head_dim: config.text.head_dim,
            fixed_state_bytes: fixed_state_bytes(&config),
            dtype: options.dtype,
            device: options.device,
            quantization: options.quantization,
            max_positions: config.text.max_positions,
        };
        let tensors_read = shards.names_read();
        Ok(CandleBackend {
            backbone,
            facts,
            config,
            checkpoint: checkpoint.clone(),
            prefill_chunk: options.prefill_chunk,
            tensors_read,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn checkpoint(&self) -> &ResolvedCheckpoint {
        &self.checkpoint
    }

    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// Names of the checkpoint tensors whose bytes were read at load, sorted.
    pub fn tensors_read(&self) -> &[String] {
        &self.tensors_read
    }

    /// What each linear weight of the decoder layers was loaded as (ggml type or `dense`).
    pub fn quant_summary(&self) -> QuantSummary {
        self.backbone.quant_summary()
    }

    /// Whether the output head is the tied embedding.
    pub fn tied_head(&self) -> bool {
        self.backbone.head.tied()
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), CandleError> {
        let vocab_size = self.backbone.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab_size) {
            Some(&id) => Err(CandleError::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }

    fn check_candidates(&self, candidates: &[u32]) -> Result<(), CandleError> {
        if candidates.is_empty() {
            return Err(invalid("no candidate ids"));
        }
        self.check_ids(candidates)
    }

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
        self.run_chunks(start, ids, chunk, |_, _| Ok(()))
    }

    /// [`CandleBackend::continue_chunked`], handing each chunk's hidden states `(1, L, D)`
    /// (before the final norm) and the chunk's first position to `on_hidden`.
    pub(crate) fn run_chunks(
        &self,
        start: Option<&CandleState>,
        ids: &[u32],
        chunk: usize,
        mut on_hidden: impl FnMut(&Tensor, usize) -> Result<(), CandleError>,
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
            let (hidden, updates) = b.forward(part, &pasts, &step)?;
            on_hidden(&hidden, offset)?;
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

    /// Prefill several prefixes in as few forward passes as fit, each pass a right-padded batch
    /// of prefixes (every row masked by its own length: causal attention never reaches a pad,
    /// Gated DeltaNet pads have β = g = 0 and each row's conv state is taken at its own last
    /// token), so the GEMMs see thousands of rows instead of one prefix's. A batch holds at most
    /// [`PREFILL_BATCH_TOKENS`] padded tokens; a prefix longer than that (or alone in its batch)
    /// takes the chunked path of [`Backend::prefill`]. On the CPU, where padding only adds work,
    /// every prefix takes that path. Results are in input order, one per prefix; a failing batch
    /// is retried prefix by prefix so one bad prefix never fails the others.
    ///
    /// Equal to `prefill` of each prefix within f32 rounding (tested on every architecture).
    pub fn prefill_batch(&self, prefixes: &[&[u32]]) -> Vec<Result<CandleState, BackendError>> {
        let b = &self.backbone;
        if matches!(b.device, candle_core::Device::Cpu) || prefixes.len() < 2 {
            return prefixes.iter().map(|ids| self.prefill(ids)).collect();
        }
        let mut out: Vec<Option<Result<CandleState, BackendError>>> =
            prefixes.iter().map(|_| None).collect();
        // Longest first, so each batch pads little; batches are cut by the padded-token budget.
        let mut order: Vec<usize> = (0..prefixes.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(prefixes[i].len()));
        let mut start = 0;
        while start < order.len() {
            let longest = prefixes[order[start]].len();
            let fit = (PREFILL_BATCH_TOKENS / longest.max(1)).max(1);
            let end = (start + fit).min(order.len());
            let members = &order[start..end];
            let batch: Vec<&[u32]> = members.iter().map(|&i| prefixes[i]).collect();
            match (members.len() > 1)
                .then(|| self.prefill_padded(&batch))
                .and_then(Result::ok)
            {
                Some(states) => {
                    for (&i, s) in members.iter().zip(states) {
                        out[i] = Some(Ok(s));
                    }
                }
                None => {
                    for &i in members {
                        out[i] = Some(self.prefill(prefixes[i]));
                    }
                }
            }
            start = end;
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(invalid("prefix left unprefilled").into())))
            .collect()
    }

    /// One forward pass over `prefixes` right-padded to the longest: `(N, Lmax)` ids from empty
    /// pasts, then each row's layer updates cut to its own length. No chunking and no budget:
    /// [`CandleBackend::prefill_batch`] decides what goes into one pass.
    pub fn prefill_padded(&self, prefixes: &[&[u32]]) -> Result<Vec<CandleState>, CandleError> {
        let b = &self.backbone;
        if prefixes.iter().any(|p| p.is_empty()) {
            return Err(invalid("cannot prefill an empty prefix"));
        }
        let lens: Vec<usize> = prefixes.iter().map(|p| p.len()).collect();
        let len = lens.iter().copied().max().unwrap_or(0);
        let mut ids = vec![0u32; prefixes.len() * len];
        for (row, p) in prefixes.iter().enumerate() {
            self.check_ids(p)?;
            ids[row * len..row * len + p.len()].copy_from_slice(p);
        }
        let zeros = vec![0usize; prefixes.len()];
        let step = Step::new(&b.rope, &zeros, &lens, len, None, b.dtype, &b.device)?;
        let pasts: Vec<LayerPast> = b.layers.iter().map(|_| LayerPast::Empty).collect();
        let (_, updates) = b.forward(&ids, &pasts, &step)?;
        let op = |e: candle_core::Error| CandleError::tensor("split batched prefill")(e);
        let mut per_row: Vec<Vec<LayerState>> = prefixes
            .iter()
            .map(|_| Vec::with_capacity(updates.len()))
            .collect();
        for update in updates {
            for (row, &n) in lens.iter().enumerate() {
                // K/V (N, Hkv, Lmax, hd) -> (1, Hkv, n, hd); conv / recurrent (N, …) -> (1, …)
                let cut = |t: &Tensor, keep_len: bool| {
                    let t = t.narrow(0, row, 1)?;
                    let t = if keep_len { t } else { t.narrow(2, 0, n)? };
                    t.contiguous()
                };
                let layer = match &update {
                    state::LayerUpdate::Attention { k, v } => LayerState::Attention {
                        k: cut(k, false).map_err(op)?,
                        v: cut(v, false).map_err(op)?,
                    },
                    state::LayerUpdate::Linear { conv, recurrent } => LayerState::Linear {
                        conv: cut(conv, true).map_err(op)?,
                        recurrent: cut(recurrent, true).map_err(op)?,
                    },
                };
                per_row[row].push(layer);
            }
        }
        Ok(per_row
            .into_iter()
            .zip(&lens)
            .map(|(layers, &n)| CandleState::new(layers, n))
            .collect())
    }

    /// `(B*L, D)` hidden rows at `flat_index` -> f32 logits `(B, C)` as a row-major Vec, and
    /// with `vocab_top_k` one full-vocabulary summary per gathered row.
    fn project(
        &self,
        hidden: &Tensor,
        flat_index: &[u32],
        candidates: &[u32],
        vocab_top_k: Option<usize>,
    ) -> Result<(Vec<f32>, Option<Vec<VocabRow>>), CandleError> {
        let b = &self.backbone;
        let idx =
            Tensor::new(flat_index, &b.device).map_err(CandleError::tensor("gather index"))?;
        // (B, L, D) -> (B*L, D) -> (N, D)
        let last = hidden
            .flatten_to(1)
            .and_then(|h| h.index_select(&idx, 0))
            .map_err(CandleError::tensor("gather last positions"))?;
        let logits = b
            .logits(&last, candidates)?
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(CandleError::tensor("logits to host"))?;
        let vocab = match vocab_top_k {
            None => None,
            Some(k) => {
                let rows: Vec<(usize, Option<u32>)> =
                    (0..flat_index.len()).map(|r| (r, None)).collect();
                let summaries = self.summarise(&last, k, &rows)?;
                Some(summaries.into_iter().map(|p| p.vocab).collect())
            }
        };
        Ok((logits, vocab))
    }
}

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

impl Backend for CandleBackend {
    type State = CandleState;

    fn facts(&self) -> &ModelFacts {
        &self.facts
    }

    fn prefill(&self, ids: &[u32]) -> Result<CandleState, BackendError> {
        Ok(self.prefill_chunked(ids, self.prefill_chunk)?)
    }

    fn prefill_many(&self, prefixes: &[&[u32]]) -> Vec<Result<CandleState, BackendError>> {
        self.prefill_batch(prefixes)
    }

    fn extend(&self, state: &CandleState, ids: &[u32]) -> Result<CandleState, BackendError> {
        Ok(self.continue_chunked(Some(state), ids, self.prefill_chunk)?)
    }

    fn score(
        &self,
        request: &ScoreRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, BackendError> {
        Ok(self.score_request(request)?)
    }

    fn decode_step(
        &self,
        state: &CandleState,
        token: u32,
    ) -> Result<DecodeStep<CandleState>, BackendError> {
        Ok(self.decode_step_candle(state, token)?)
    }

    fn forward_full(&self, ids: &[u32], candidates: &[u32]) -> Result<Vec<f32>, BackendError> {
        Ok(self.forward_full_candle(ids, candidates)?)
    }

    fn vocab_rows(&self, request: &VocabRequest<'_>) -> Result<Vec<PositionVocab>, BackendError> {
        Ok(self.vocab_rows_candle(request)?)
    }
}

impl CandleBackend {
    /// [`Backend::score`] in candle's own error type. The request is valid by construction
    /// (rows name existing states, suffixes and candidates are non-empty); what is left to check
    /// here is what only this model knows: token ids against its embedding, state layer counts.
    fn score_request(
        &self,
        request: &ScoreRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, CandleError> {
        let (states, rows, candidates) = (request.states(), request.rows(), request.candidates());
        self.check_ids(candidates)?;
        let b = &self.backbone;
        for (i, s) in states.iter().enumerate() {
            if s.layers().len() != b.layers.len() {
                return Err(invalid(format!(
                    "state {i} has {} layers; this model has {}",
                    s.layers().len(),
                    b.layers.len()
                )));
            }
        }
        for r in rows {
            self.check_ids(r.suffix)?;
        }
        let layout = SlotLayout::new(rows);
        let batch_slot: Vec<u32> = layout.batch.iter().map(|&(_, slot)| slot).collect();
        let (pasts, p) = merge_slots(states, &layout.slots, &batch_slot)?;
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
        let merged = if layout.slots.len() > 1 {
            Some(p)
        } else {
            None
        };
        let step = Step::new(&b.rope, &past_lens, &valid, len, merged, b.dtype, &b.device)?;
        let (hidden, _branch) = b.forward(&ids, &pasts, &step)?;
        // each caller row's last real position, in the caller's order
        let last: Vec<u32> = layout
            .position
            .iter()
            .map(|&pos| (pos * len + valid[pos] - 1) as u32)
            .collect();
        if let Some(k) = request.vocab_top_k() {
            self.check_top_k(k)?;
        }
        let (data, vocab) = self.project(&hidden, &last, candidates, request.vocab_top_k())?;
        Ok(CandidateLogits {
            rows: rows.len(),
            candidates: candidates.len(),
            data,
            vocab,
        })
    }

    fn forward_full_candle(
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
        let step = Step::new(&b.rope, &[0], &[n], n, None, b.dtype, &b.device)?;
        let pasts: Vec<LayerPast> = b.layers.iter().map(|_| LayerPast::Empty).collect();
        let (hidden, _) = b.forward(ids, &pasts, &step)?;
        Ok(self
            .project(&hidden, &[(n - 1) as u32], candidates, None)?
            .0)
    }
}

// The seam requires Send + Sync backends.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CandleBackend>();
    assert_send_sync::<CandleState>();
};
