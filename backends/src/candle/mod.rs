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

pub mod attention;
pub mod checkpoint;
pub mod config;
pub mod device;
pub mod fusion;
pub mod gated_deltanet;
pub mod gguf;
pub mod limits;
pub mod profile;
pub mod state;

mod cpu_aligned;
mod cpu_amx;
mod cpu_attention;
mod cpu_bf16gemm;
#[cfg(feature = "openblas")]
mod cpu_blas;
mod cpu_gemm;
mod cpu_heads;
mod cpu_host;
mod cpu_isa;
#[doc(hidden)]
pub mod cpu_kernels;
#[cfg(target_arch = "x86_64")]
mod cpu_key_major;
mod cpu_math;
mod cpu_q4gemm;
mod cpu_qgemm;
mod cpu_switches;
mod cpu_tile_store;
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
mod packing;
pub mod residual_norm;
mod rope;
mod shards;
mod step;
mod swiglu;
mod table;
mod tree;
mod vocab;
pub mod vocab_topk;
mod warmup;
mod weights;

use candle_core::Tensor;

pub use checkpoint::{
    hf_cache_main_revision, hf_cache_root, validate_revision, CheckpointSource, ResolvedCheckpoint,
    UNLABELLED,
};
pub use config::{Architecture, LayerKind, ModelConfig, TextConfig};
pub use device::{CandleDType, ComputeDType, DeviceSpec, OpenDevice};
pub use linear::QuantSummary;
pub use state::{CandleState, LayerState};

/// The x86 vector instructions this process's CPU kernels run with (`"avx512"` or `"avx2"`,
/// capped by `FORKSCORE_CPU_ISA=avx2`; `"avx512+amx"` where f32 linear layers run on AMX tiles); `None` where they do not run (no AVX2 + FMA, or off
/// x86-64), so CPU layers take candle's kernels.
pub fn cpu_kernel_isa() -> Option<&'static str> {
    match cpu_gemm::amx() {
        true => Some("avx512+amx"),
        false => cpu_isa::Isa::chosen().map(cpu_isa::Isa::name),
    }
}

use crate::error::CandleError;
use forkscore_seam::{
    Architecture as ModelClass, Backend, BackendError, CandidateLogits, DecodeStep, ModelFacts,
    PositionVocab, PrefixState, Quantization, ScoreRequest, ScoreRow, TreePacking, TreeRequest,
    VocabRequest, VocabRow,
};
use gguf::GgufTensors;
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
        if matches!(options.device, DeviceSpec::Cpu) {
            cpu_switches::check_env().map_err(invalid)?;
        }
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
        warmup::compile_candle_kernels(&device);
        let view = match &store {
            LoadedStore::Safetensors(shards) => {
                limits::check_against_tensors(&config, shards.shapes())?;
                weights::Store::Safetensors(shards)
            }
            LoadedStore::Gguf(g) => {
                let shapes = g.hf_shapes();
                limits::check_against_tensors(
                    &config,
                    shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())),
                )?;
                weights::Store::Gguf(g)
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
        updates: &[state::LayerUpdate],
        rows: usize,
        len: usize,
        past: usize,
        slots: usize,
    ) {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let mut kv = 0;
        let mut attention_layers = 0;
        for u in updates {
            if let state::LayerUpdate::Attention { k, v } = u {
                kv += bytes(k) + bytes(v);
                attention_layers += 1;
            }
        }
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
        let updates = b.forward_state(&ids, &pasts, &step)?;
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

    /// Attention-only models: packed; hybrids: one row per root-to-leaf path (see `tree`).
    fn score_tree(
        &self,
        request: &TreeRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, BackendError> {
        match self.packing() {
            TreePacking::Packed => Ok(self.score_tree_packed(request)?),
            TreePacking::RowPerLeaf => Ok(self.score_tree_leaves(request)?),
            TreePacking::RowPerNode => forkscore_seam::score_tree_by_rows(self, request),
        }
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

impl CandleBackend {
    /// [`Backend::score`] in candle's own error type. The request is valid by construction
    /// (rows name existing states, suffixes and candidates are non-empty); what is left to check
    /// here is what only this model knows: token ids against its embedding, state layer counts.
    fn score_request(
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
        // several slots: each slot's rows attend to it alone (no left padding), as in a call of
        // those rows alone
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
        };
        let (hidden, branch) = b.forward(&ids, &pasts, &step)?;
        self.record_branch(&branch, sources.len(), len, p, layout.slots.len());
        drop(branch);
        // each pick's flat position in (B*L), in the caller's order
        let flat: Vec<u32> = picks
            .iter()
            .map(|&(r, t)| (layout.position[r] * len + t) as u32)
            .collect();
        self.project(&hidden, &flat, candidates, vocab_top_k)
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

#[cfg(test)]
mod state_only_tests {
    //! A prefill's last layer computes its state update only (`Backbone::forward_state`):
    //! the retained state must be exactly what the full forward retains, on every architecture
    //! (Qwen2.5 with biased q/k/v, Qwen3 with q/k norms, the Qwen3.5 hybrid whose layers
    //! alternate Gated DeltaNet and gated attention), in one chunk and over several chunks.
    use super::*;
    use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
    use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};

    fn load(dir: &std::path::Path) -> CandleBackend {
        let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-test").expect("resolve");
        CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load")
    }

    fn host(state: &CandleState) -> Vec<Vec<f32>> {
        state
            .layers()
            .iter()
            .flat_map(|l| match l {
                state::LayerState::Attention { k, v } => [k.clone(), v.clone()],
                state::LayerState::Linear { conv, recurrent } => [conv.clone(), recurrent.clone()],
            })
            .map(|t| {
                t.flatten_all()
                    .and_then(|t| t.to_dtype(candle_core::DType::F32))
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("state to host")
            })
            .collect()
    }

    #[test]
    fn state_only_prefill_keeps_exactly_the_full_forward_state() {
        let models = [
            ("qwen2.5", load(&ensure_tiny_model(&TinySpec::qwen25()))),
            ("qwen3", load(&ensure_tiny_model(&TinySpec::qwen3()))),
            (
                "qwen3.5",
                load(
                    &TinyQwen35::new(8, Qwen35Layout::TextOnly)
                        .ensure()
                        .expect("tiny qwen3.5"),
                ),
            ),
        ];
        let ids: Vec<u32> = (0..45u32).map(|i| (i * 7919 + 13) % 500).collect();
        for (name, backend) in &models {
            for chunk in [45usize, 16] {
                let full = backend
                    .run_chunks(None, &ids, chunk, Some(&mut |_, _| Ok(())))
                    .expect("full forward");
                let state_only = backend
                    .run_chunks(None, &ids, chunk, None)
                    .expect("state only");
                assert_eq!(full.len(), state_only.len());
                assert_eq!(
                    host(&full),
                    host(&state_only),
                    "{name}, chunk {chunk}: the state-only prefill changed the state"
                );
            }
        }
    }
}
