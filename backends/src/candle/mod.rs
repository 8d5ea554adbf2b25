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
//! - `score_tree(request)`: attention-only models pack each state's tree nodes into one sequence
//!   under a tree mask; hybrids run one batched row per root-to-leaf path (see `tree`);
//! - `forward_full(ids, candidates)` is the plain path: the whole prompt from scratch, one call;
//! - `decode_step(state, token)`: one token over the retained state, the full head at that one
//!   position, the greedy argmax (see `decode`);
//! - opt-in full-vocabulary summaries (`ScoreRequest::with_vocab`, `vocab_rows`): see `vocab`.

pub use layers::attention;
pub use layers::fusion;
pub use load::checkpoint;
pub use load::config;
pub use load::device;
pub mod gated_deltanet;
pub use load::gguf;
pub use load::limits;
pub mod profile;
pub mod state;

pub mod cpu;
pub mod cuda;
pub mod layers;
pub mod load;
#[cfg(feature = "cuda")]
pub use cuda::cuda_runtime;
mod decode;
mod extend;
pub use layers::mask;
pub use layers::mlp;
mod models;
mod packing;
mod prefill;
pub use layers::residual_norm;
mod score;
mod step;
mod tree;
pub use cuda::vocab_topk;

use candle_core::Tensor;

pub use layers::linear::QuantSummary;
pub use load::checkpoint::{
    hf_cache_main_revision, hf_cache_root, validate_revision, CheckpointSource, ResolvedCheckpoint,
    UNLABELLED,
};
pub use load::config::{Architecture, LayerKind, ModelConfig, TextConfig};
pub use load::device::{CandleDType, ComputeDType, DeviceSpec, OpenDevice};
pub use load::shards::inspect_weights;
pub use state::{CandleState, LayerState};

/// The x86 vector instructions this process's CPU kernels run with (`"avx512"` or `"avx2"`,
/// capped by `FORKSCORE_CPU_ISA=avx2`; `"avx512+amx"` where f32 linear layers run on AMX tiles); `None` where they do not run (no AVX2 + FMA, or off
/// x86-64), so CPU layers take candle's kernels.
pub fn cpu_kernel_isa() -> Option<&'static str> {
    match cpu::gemm::amx() {
        true => Some("avx512+amx"),
        false => cpu::isa::Isa::chosen().map(cpu::isa::Isa::name),
    }
}

use crate::error::CandleError;
use forkscore_seam::{
    Architecture as ModelClass, Backend, BackendError, CandidateLogits, DecodeStep, ModelFacts,
    PositionVocab, PrefixState, Quantization, ScoreRequest, ScoreRow, TreePacking, TreeRequest,
    VocabRequest, VocabRow,
};
use load::gguf::GgufTensors;
use load::shards::{ShardSet, WeightFiles};
use load::weights::Weights;
use models::Backbone;
use state::{merge_slots, LayerPast};
use step::Step;

/// Default number of prefix tokens per prefill chunk on the CPU (bounds activation memory).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Default prefill chunk on GPUs: a whole long prefix in one pass (fewer, larger GEMMs and one
/// launch of each fused kernel per layer), activations still in the hundreds of MiB.
pub const GPU_PREFILL_CHUNK: usize = 4096;

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
    /// `--deterministic`: on GPUs, no call ever holds two contexts
    /// ([`Backend::contexts_alone`]: the engine prefills and scores each context in calls of its
    /// own), so a context's result is bit for bit its result alone, whatever cuBLAS picks for
    /// larger shapes (bf16 batch invariance, at the cost of the merged calls). No effect on the
    /// CPU, whose kernels are batch-invariant by construction.
    pub deterministic: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceSpec::Cpu,
            dtype: ComputeDType::F32,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            quantization: None,
            deterministic: false,
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
            deterministic: false,
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
    /// `--deterministic` on a GPU: see [`LoadOptions::deterministic`].
    contexts_alone: bool,
    /// Names of the checkpoint tensors read at load, sorted (vision / MTP tensors never are).
    tensors_read: Vec<String>,
    /// For a GGUF checkpoint: its tensor types and what was dequantized at load.
    gguf: Option<GgufSummary>,
    /// What the scoring calls since the last [`CandleBackend::take_branch_footprint`] allocated
    /// for their branches.
    footprint: std::sync::Mutex<BranchFootprint>,
}

/// The tensor files a load reads from, held until the model is built.
enum LoadedStore {
    Safetensors(ShardSet),
    Gguf(GgufTensors),
}

/// What a GGUF checkpoint stored and what the load did with it (for provenance).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GgufSummary {
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// Every stored tensor, counted per ggml type (`Q4_K`, `F32`, …).
    pub stored_types: std::collections::BTreeMap<String, usize>,
    /// Tensors stored in a block format but held dense in the compute dtype (the embedding,
    /// the output head, and any block weight a kernel cannot take), per stored type.
    pub dequantized: std::collections::BTreeMap<String, usize>,
}

/// Branch memory of scoring calls (`score`, `score_tree`): what a call allocates for the tokens
/// it runs beyond the retained states it reads. Summed / maxed over the calls since the last
/// [`CandleBackend::take_branch_footprint`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BranchFootprint {
    /// Backbone passes of scoring calls.
    pub passes: usize,
    /// Token positions run (rows × padded length; a packed tree: its node count), summed.
    pub tokens: usize,
    /// Branch K/V of every attention layer (measured on the returned update tensors), summed.
    pub kv_bytes: usize,
    /// Largest single pass: its branch K/V, plus one layer's f32 attention scores
    /// (`heads · rows · L · (P + L) · 4`, the largest transient of the candle attention path),
    /// plus its f32 masks (`L²` causal or tree, left padding) and, when several states were
    /// merged into slots, the merged past K/V copy. An accounting of tensors, not an allocator
    /// reading.
    pub peak_bytes: usize,
}

impl BranchFootprint {
    fn add_pass(&mut self, tokens: usize, kv: usize, transient: usize) {
        self.passes += 1;
        self.tokens += tokens;
        self.kv_bytes += kv;
        self.peak_bytes = self.peak_bytes.max(kv + transient);
    }
}

/// The linear-attention layers (those holding a fixed-size state); 0 for attention-only models.
fn fixed_state_layers(config: &ModelConfig) -> usize {
    match &config.linear_attention {
        None => 0,
        Some(_) => config
            .text
            .layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::LinearAttention)
            .count(),
    }
}

/// f32 conv + recurrent state bytes per sequence over the linear-attention layers.
fn fixed_state_bytes(config: &ModelConfig) -> usize {
    let Some(lin) = &config.linear_attention else {
        return 0;
    };
    let layers = fixed_state_layers(config);
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
        crate::switches::Switches::current()
            .validate(cpu::switches::check_spec)
            .map_err(|e| invalid(e.to_string()))?;
        let store = match &checkpoint.gguf {
            Some(file) => LoadedStore::Gguf(GgufTensors::open(file)?),
            None => {
                LoadedStore::Safetensors(ShardSet::open(&WeightFiles::discover(&checkpoint.dir)?)?)
            }
        };
        let config = match &store {
            LoadedStore::Gguf(g) => g.config()?,
            LoadedStore::Safetensors(_) => {
                ModelConfig::from_file(&checkpoint.dir.join("config.json"))?
            }
        };
        let device = options.device.open()?;
        let view = match &store {
            LoadedStore::Safetensors(shards) => {
                load::config::check_against_tensors(&config, shards.shapes())?;
                load::weights::Store::Safetensors(shards)
            }
            LoadedStore::Gguf(g) => {
                let shapes = g.hf_shapes();
                load::config::check_against_tensors(
                    &config,
                    shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())),
                )?;
                load::weights::Store::Gguf(g)
            }
        };
        let weights = Weights::new(view, "", options.dtype.dtype(), &device)
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
            fixed_state_layers: fixed_state_layers(&config),
            dtype: options.dtype,
            device: options.device,
            quantization: options.quantization,
            max_positions: config.text.max_positions,
        };
        let (tensors_read, gguf) = match &store {
            LoadedStore::Safetensors(shards) => (shards.names_read(), None),
            LoadedStore::Gguf(g) => (
                g.names_read(),
                Some(GgufSummary {
                    stored_types: g.stored_types(),
                    dequantized: g.dequantized(),
                    version: g.file().version,
                }),
            ),
        };
        drop(store);
        Ok(CandleBackend {
            backbone,
            facts,
            config,
            checkpoint: checkpoint.clone(),
            prefill_chunk: options.prefill_chunk,
            contexts_alone: options.deterministic && !device.is_cpu(),
            tensors_read,
            gguf,
            footprint: std::sync::Mutex::new(BranchFootprint::default()),
        })
    }

    /// What a GGUF checkpoint held and what the load converted (`None` for safetensors).
    pub fn gguf_summary(&self) -> Option<&GgufSummary> {
        self.gguf.as_ref()
    }

    /// The branch memory of the scoring calls since the last take (and reset it).
    pub fn take_branch_footprint(&self) -> BranchFootprint {
        match self.footprint.lock() {
            Ok(mut f) => std::mem::take(&mut *f),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    /// Account one scoring pass of `rows × len` new tokens over a past of `past` positions
    /// merged from `slots` states (1: read in place).
    pub(crate) fn record_branch(
        &self,
        branch: models::BranchKv,
        rows: usize,
        len: usize,
        past: usize,
        slots: usize,
    ) {
        let models::BranchKv {
            bytes: kv,
            attention_layers,
        } = branch;
        let f32s = std::mem::size_of::<f32>();
        let heads = self.config.text.num_heads;
        let scores = heads * rows * len * (past + len) * f32s;
        let new_keys_mask = if len > 1 { len * len * f32s } else { 0 };
        let padding_mask = if slots > 1 { rows * past * f32s } else { 0 };
        let merged = if slots > 1 {
            // K and V (Hkv, S, P, hd) per attention layer
            attention_layers
                * 2
                * self.config.text.num_kv_heads
                * slots
                * past
                * self.config.text.head_dim
                * self.backbone.dtype.size_in_bytes()
        } else {
            0
        };
        let mut f = match self.footprint.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        f.add_pass(
            rows * len,
            kv,
            scores + new_keys_mask + padding_mask + merged,
        );
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

    /// Every state must have one layer state per decoder layer of this model.
    fn check_states(&self, states: &[&CandleState]) -> Result<(), CandleError> {
        let layers = self.backbone.layers.len();
        for (i, s) in states.iter().enumerate() {
            if s.layers().len() != layers {
                return Err(invalid(format!(
                    "state {i} has {} layers; this model has {layers}",
                    s.layers().len()
                )));
            }
        }
        Ok(())
    }

    /// `(B, L, D)` hidden rows at `flat_index` -> f32 logits `(N, C)` as a row-major Vec, and
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
        self.project_rows(&last, candidates, vocab_top_k)
    }

    /// Gathered hidden rows `(N, D)` (before the final norm) -> f32 logits `(N, C)` as a
    /// row-major Vec, and with `vocab_top_k` one full-vocabulary summary per row.
    fn project_rows(
        &self,
        last: &Tensor,
        candidates: &[u32],
        vocab_top_k: Option<usize>,
    ) -> Result<(Vec<f32>, Option<Vec<VocabRow>>), CandleError> {
        let logits = self
            .backbone
            .logits(last, candidates)?
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(CandleError::tensor("logits to host"))?;
        let vocab = match vocab_top_k {
            None => None,
            Some(k) => {
                let n = last.dim(0).map_err(CandleError::tensor("gathered rows"))?;
                let rows: Vec<(usize, Option<u32>)> = (0..n).map(|r| (r, None)).collect();
                let summaries = self.summarise(last, k, &rows)?;
                Some(summaries.into_iter().map(|p| p.vocab).collect())
            }
        };
        Ok((logits, vocab))
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

    fn contexts_alone(&self) -> bool {
        self.contexts_alone
    }

    fn prefill_many(&self, prefixes: &[&[u32]]) -> Vec<Result<CandleState, BackendError>> {
        profile::region("verb.prefill_many", &self.backbone.device, || {
            self.prefill_batch(prefixes)
        })
    }

    fn extend(&self, state: &CandleState, ids: &[u32]) -> Result<CandleState, BackendError> {
        Ok(self.continue_chunked(Some(state), ids, self.prefill_chunk)?)
    }

    fn extend_many(
        &self,
        state: &CandleState,
        suffixes: &[&[u32]],
    ) -> Vec<Result<CandleState, BackendError>> {
        profile::region("verb.extend_many", &self.backbone.device, || {
            self.extend_batch(state, suffixes)
        })
    }

    fn score(
        &self,
        request: &ScoreRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, BackendError> {
        profile::region("verb.score", &self.backbone.device, || {
            Ok(self.score_request(request)?)
        })
    }

    /// Attention-only models: packed; hybrids: one row per root-to-leaf path (see `tree`).
    fn score_tree(
        &self,
        request: &TreeRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, BackendError> {
        profile::region("verb.score_tree", &self.backbone.device, || {
            match self.packing() {
                TreePacking::Packed => Ok(self.score_tree_packed(request)?),
                TreePacking::RowPerLeaf => Ok(self.score_tree_leaves(request)?),
                TreePacking::RowPerNode => forkscore_seam::score_tree_by_rows(self, request),
            }
        })
    }

    fn tree_packing(&self) -> TreePacking {
        self.packing()
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

// The seam requires Send + Sync backends.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CandleBackend>();
    assert_send_sync::<CandleState>();
};

#[cfg(test)]
mod state_only_tests;
