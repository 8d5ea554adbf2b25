//! Model architectures over shared parts: a generic pre-norm decoder [`Backbone`] whose layers
//! each hold a token [`Mixer`] (softmax attention, or linear attention for hybrids) and a SwiGLU
//! MLP. One file per architecture builds a [`Backbone`] from a checkpoint; [`load`] dispatches
//! on [`Architecture`].
//!
//! Backbone call: ids `(B, L)` -> embed `(B, L, D)` -> per layer
//! `x += mixer(norm1(x), past, step); x += mlp(norm2(x))` -> hidden `(B, L, D)` (before the final
//! norm, which [`Backbone::logits`] applies to the gathered last positions only). Each residual
//! add runs with the norm that reads its result (`RmsNorm::add_forward`: one kernel on CUDA);
//! the MLP's add is carried into the next layer as a [`Residual`].
//! Adding an architecture: a variant of [`Architecture`], a file here with
//! `pub(crate) fn load(&ModelConfig, &Weights) -> Result<Backbone, CandleError>`, one match arm.

pub(crate) mod qwen2;
pub(crate) mod qwen3;
pub(crate) mod qwen3_5;
pub(crate) mod self_attn;

use candle_core::{DType, Device, Tensor};

use super::layers::head::CandidateHead;
use super::layers::linear::QuantSummary;
use super::layers::mlp::Mlp;
use super::layers::norm::RmsNorm;
use super::layers::rope::Rope;
use super::load::config::{Architecture, LayerKind, ModelConfig};
use super::load::table::Table;
use super::load::weights::Weights;
use super::profile;
use super::state::{LayerPast, LayerUpdate};
use super::step::Step;
use crate::error::CandleError;
use self_attn::{SelfAttention, SelfAttentionSpec};

/// The token mixer of one decoder layer.
pub(crate) trait Mixer: Send + Sync {
    /// Which kind of layer this is (profiling regions are named after it).
    fn kind(&self) -> LayerKind;

    /// Count the ggml type of each of its linear weights.
    fn summarize(&self, summary: &mut QuantSummary);

    /// `x (B, L, D)` (normed) -> `(B, L, D)`, and what the new tokens add to the layer's state.
    fn forward(
        &self,
        x: &Tensor,
        past: &LayerPast,
        step: &Step,
    ) -> Result<(Tensor, LayerUpdate), CandleError>;

    /// Only what the new tokens add to the layer's state, for a last layer whose output nobody
    /// reads (a prefill). Must equal `forward`'s update; the default computes `forward` and drops
    /// the output, a mixer that can skip work overrides it.
    fn state_update(
        &self,
        x: &Tensor,
        past: &LayerPast,
        step: &Step,
    ) -> Result<LayerUpdate, CandleError> {
        self.forward(x, past, step).map(|(_, update)| update)
    }
}

/// One pre-norm decoder layer.
pub(crate) struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub mixer: Box<dyn Mixer>,
    pub post_norm: RmsNorm,
    pub mlp: Mlp,
}

impl DecoderLayer {
    /// The profiling region of its mixer.
    fn region(&self) -> &'static str {
        match self.mixer.kind() {
            LayerKind::FullAttention => "attention",
            LayerKind::LinearAttention => "linear_attention",
        }
    }

    /// `(B, L, D) -> (B, L, D)`, the output left as the residual stream plus the MLP output
    /// (the next layer adds it in one kernel with its input norm, [`Residual`]).
    fn forward(
        &self,
        x: Residual,
        past: &LayerPast,
        step: &Step,
    ) -> Result<(Residual, LayerUpdate), CandleError> {
        let region = self.region();
        let (x, h) = x.add_norm(&self.input_norm)?;
        let (m, update) =
            profile::region(region, x.device(), || self.mixer.forward(&h, past, step))?;
        let (x, h) = self.post_norm.add_forward(&x, &m)?;
        let m = profile::region("mlp", x.device(), || self.mlp.forward(&h))?;
        Ok((
            Residual {
                x,
                pending: Some(m),
            },
            update,
        ))
    }

    /// The layer's state update alone: its output (mixer output, residual, MLP) is not computed.
    fn state_update(
        &self,
        x: Residual,
        past: &LayerPast,
        step: &Step,
    ) -> Result<LayerUpdate, CandleError> {
        let region = self.region();
        let (_, h) = x.add_norm(&self.input_norm)?;
        profile::region(region, h.device(), || {
            self.mixer.state_update(&h, past, step)
        })
    }
}

/// The residual stream between decoder layers: `x`, and the previous layer's MLP output when
/// it is not added yet — the next layer adds it in the same pass as its input norm
/// ([`RmsNorm::add_forward`]), the last one by [`Residual::finish`].
pub(crate) struct Residual {
    x: Tensor,
    pending: Option<Tensor>,
}

impl Residual {
    fn new(x: Tensor) -> Self {
        Residual { x, pending: None }
    }

    /// The stream with the pending output added, and its norm under `norm`.
    fn add_norm(self, norm: &RmsNorm) -> Result<(Tensor, Tensor), CandleError> {
        match self.pending {
            Some(m) => norm.add_forward(&self.x, &m),
            None => {
                let h = norm.forward(&self.x)?;
                Ok((self.x, h))
            }
        }
    }

    /// `(B, L, D)`: the stream with the pending output added.
    fn finish(self) -> Result<Tensor, CandleError> {
        match self.pending {
            Some(m) => (self.x + m).map_err(CandleError::tensor("residual add")),
            None => Ok(self.x),
        }
    }
}

/// Embedding, decoder layers, final norm and candidate head of one loaded model.
pub(crate) struct Backbone {
    /// `(V, D)`: in the compute dtype, or a GGUF block table read by rows.
    pub embed: Table,
    pub layers: Vec<DecoderLayer>,
    pub final_norm: RmsNorm,
    pub head: CandidateHead,
    pub rope: Rope,
    pub dtype: DType,
    pub device: Device,
}

impl Backbone {
    pub fn vocab_size(&self) -> usize {
        self.embed.dims().0
    }

    pub fn hidden_size(&self) -> usize {
        self.embed.dims().1
    }

    /// What each linear weight of the decoder layers was loaded as.
    pub fn quant_summary(&self) -> QuantSummary {
        let mut s = QuantSummary::default();
        for l in &self.layers {
            l.mixer.summarize(&mut s);
            l.mlp.summarize(&mut s);
        }
        s
    }

    /// Run ids `(B, L)` (row-major) over `pasts` (one per layer). Returns the hidden states
    /// `(B, L, D)` before the final norm and one update per layer.
    pub fn forward(
        &self,
        ids: &[u32],
        pasts: &[LayerPast],
        step: &Step,
    ) -> Result<(Tensor, Vec<LayerUpdate>), CandleError> {
        let x = Residual::new(self.embed_ids(ids, pasts, step)?);
        let mut updates = Vec::with_capacity(self.layers.len());
        let x = run_layers(&self.layers, pasts, x, step, |u| updates.push(u))?.finish()?;
        Ok((x, updates))
    }

    /// [`Backbone::forward`] for a branch whose state nobody keeps (a scoring pass): the same
    /// hidden states, but each layer's update is summarised and dropped as soon as the layer is
    /// done, so the pass never holds more than one layer's branch state (for a Gated DeltaNet
    /// layer, one `(Hv, dk, dv)` f32 state per row — none where the step is
    /// [`Step::discarding_state`] and the fused kernels run: they skip writing it).
    pub fn forward_branch(
        &self,
        ids: &[u32],
        pasts: &[LayerPast],
        step: &Step,
    ) -> Result<(Tensor, BranchKv), CandleError> {
        let x = Residual::new(self.embed_ids(ids, pasts, step)?);
        let mut kv = BranchKv::default();
        let x = run_layers(&self.layers, pasts, x, step, |u| kv.add(&u))?.finish()?;
        Ok((x, kv))
    }

    /// One update per layer, equal to [`Backbone::forward`]'s (tested), for a prefill whose
    /// hidden states nobody reads: the last layer computes its state update only and skips its
    /// output — for an attention layer its queries, attention, `o_proj` and MLP over every new
    /// token.
    pub fn forward_state(
        &self,
        ids: &[u32],
        pasts: &[LayerPast],
        step: &Step,
    ) -> Result<Vec<LayerUpdate>, CandleError> {
        let x = Residual::new(self.embed_ids(ids, pasts, step)?);
        let mut updates = Vec::with_capacity(self.layers.len());
        if let (Some((last, layers)), Some((last_past, layer_pasts))) =
            (self.layers.split_last(), pasts.split_last())
        {
            let x = run_layers(layers, layer_pasts, x, step, |u| updates.push(u))?;
            updates.push(last.state_update(x, last_past, step)?);
        }
        Ok(updates)
    }

    /// `ids (B*L,)` -> embeddings `(B, L, D)`, after checking there is one past per layer.
    fn embed_ids(
        &self,
        ids: &[u32],
        pasts: &[LayerPast],
        step: &Step,
    ) -> Result<Tensor, CandleError> {
        if pasts.len() != self.layers.len() {
            return Err(CandleError::InvalidRequest {
                reason: format!(
                    "{} layer states for a model of {} layers",
                    pasts.len(),
                    self.layers.len()
                ),
            });
        }
        let ids = Tensor::new(ids, &self.device).map_err(CandleError::tensor("ids"))?;
        // (B*L,) -> (B*L, D) -> (B, L, D)
        profile::region("embed", &self.device, || {
            self.embed
                .rows(&ids)
                .and_then(|x| x.reshape((step.rows, step.len, self.hidden_size())))
        })
        .map_err(CandleError::tensor("embed"))
    }

    /// Final norm and candidate head: `(N, D)` -> `(N, C)` f32.
    pub fn logits(&self, last_hidden: &Tensor, candidates: &[u32]) -> Result<Tensor, CandleError> {
        profile::region("head", &self.device, || {
            let h = self.final_norm.forward(last_hidden)?;
            self.head.project(&h, candidates, &self.device)
        })
    }

    /// Final norm and the full head: `(N, D)` -> `(N, V)` f32 (opt-in diagnostics only).
    pub fn full_logits(&self, last_hidden: &Tensor) -> Result<Tensor, CandleError> {
        profile::region("head", &self.device, || {
            let h = self.final_norm.forward(last_hidden)?;
            self.head.project_all(&h)
        })
    }
}

/// `x (B, L, D)` through `layers` over their `pasts`, handing each layer's update to `sink`
/// as soon as the layer is done.
fn run_layers(
    layers: &[DecoderLayer],
    pasts: &[LayerPast],
    mut x: Residual,
    step: &Step,
    mut sink: impl FnMut(LayerUpdate),
) -> Result<Residual, CandleError> {
    for (layer, past) in layers.iter().zip(pasts) {
        let (next, update) = layer.forward(x, past, step)?;
        x = next;
        sink(update);
    }
    Ok(x)
}

/// What a branch's attention layers computed for its new tokens, for the footprint statistics
/// ([`super::CandleBackend::record_branch`]): the bytes of their K/V and how many layers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BranchKv {
    pub bytes: usize,
    pub attention_layers: usize,
}

impl BranchKv {
    fn add(&mut self, update: &LayerUpdate) {
        if let LayerUpdate::Attention { k, v } = update {
            let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
            self.bytes += bytes(k) + bytes(v);
            self.attention_layers += 1;
        }
    }
}

/// The output head, tied to the embedding (stored as `embed_name`, a root-level name) exactly
/// when transformers ties it:
/// - `tie_word_embeddings: false`: `lm_head.weight` (root name, no prefix), which must exist;
/// - flag true or absent, no `lm_head.weight` stored: tied;
/// - flag true or absent, `lm_head.weight` stored (save_pretrained writes it when the module
///   held its own parameter, e.g. after a torch `.bin` conversion): tied when its bytes equal
///   the embedding's, else the stored head is used. transformers does the same (it warns and
///   does not tie differing tensors), so the config flag alone must not discard a stored head.
pub(crate) fn output_head(
    cfg: &ModelConfig,
    root: &Weights<'_>,
    embed: &Table,
    embed_name: &str,
) -> Result<CandidateHead, CandleError> {
    const HEAD: &str = "lm_head.weight";
    let tied = match (cfg.tie_word_embeddings, root.contains(HEAD)) {
        (Some(false), _) => false,
        (_, false) => true,
        (_, true) => root.stored_identical(HEAD, embed_name)?,
    };
    if tied {
        return Ok(CandidateHead::new(embed.clone(), true));
    }
    let w = root.table(HEAD, &[cfg.text.vocab_size, cfg.text.hidden_size])?;
    Ok(CandidateHead::new(w, false))
}

/// Build the backbone of `cfg.architecture` from `weights` (rooted at the checkpoint's top level).
pub(crate) fn load(cfg: &ModelConfig, weights: &Weights<'_>) -> Result<Backbone, CandleError> {
    match cfg.architecture {
        Architecture::Qwen2 => qwen2::load(cfg, weights),
        Architecture::Qwen3 => qwen3::load(cfg, weights),
        Architecture::Qwen3_5 => qwen3_5::load(cfg, weights),
    }
}

/// An attention-only decoder (Qwen2, Qwen3): under `model.`, every layer a [`SelfAttention`]
/// built from `spec`, plain RMSNorms, SwiGLU MLPs, full RoPE; the head per [`output_head`].
pub(crate) fn dense_backbone(
    cfg: &ModelConfig,
    root: &Weights<'_>,
    spec: SelfAttentionSpec,
) -> Result<Backbone, CandleError> {
    require_full_attention(cfg)?;
    let t = &cfg.text;
    let w = root.with_prefix("model.");
    let norm = |name: &str| RmsNorm::plain(&w, name, t.hidden_size, t.rms_norm_eps);
    let mut layers = Vec::with_capacity(t.num_layers);
    for i in 0..t.num_layers {
        let p = format!("layers.{i}");
        layers.push(DecoderLayer {
            input_norm: norm(&format!("{p}.input_layernorm.weight"))?,
            mixer: Box::new(SelfAttention::load(&w, &format!("{p}.self_attn"), spec)?),
            post_norm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
            mlp: Mlp::load(&w, &format!("{p}.mlp"), t.hidden_size, t.intermediate_size)?,
        });
    }
    let embed = w.table("embed_tokens.weight", &[t.vocab_size, t.hidden_size])?;
    Ok(Backbone {
        head: output_head(cfg, root, &embed, &w.full_name("embed_tokens.weight"))?,
        embed,
        layers,
        final_norm: norm("norm.weight")?,
        rope: Rope::new(t.rope.theta, t.rotary_dim()),
        dtype: w.dtype(),
        device: w.device().clone(),
    })
}

/// Reject `layer_types` other than full attention for attention-only architectures.
pub(crate) fn require_full_attention(cfg: &ModelConfig) -> Result<(), CandleError> {
    if let Some(i) = cfg
        .text
        .layer_kinds
        .iter()
        .position(|k| *k != LayerKind::FullAttention)
    {
        return Err(CandleError::InvalidConfig {
            path: cfg.path.clone(),
            reason: format!(
                "{} has only full-attention layers, but layer {i} is {:?}",
                cfg.architecture_name, cfg.text.layer_kinds[i]
            ),
        });
    }
    Ok(())
}
