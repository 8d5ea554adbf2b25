//! Gated DeltaNet linear attention, the recurrent half of the Qwen3.5 hybrid backbone.
//!
//! In: the `input_layernorm`-ed residual `(B, L, D)` in the activation dtype, the layer's
//! [`GdnState`] (conv + recurrent, both f32) and optionally the [`RightPadding`] of a ragged batch.
//! Out: the layer output `(B, L, D)` in the activation dtype and the **new** state; the input
//! state is never mutated (forking a prefix = sharing its state and running rows from it).
//!
//! Flow: `p = x W_qkvᵀ`, `z`, `b`, `a` projections → causal conv + SiLU on `p` only
//! ([`conv`]) → split `[q | k | v]` → L2-normalise q, k (eps 1e-6 on the sum), scale q by `dk^−½`
//! ([`norm`]) → `β = σ(b)`, `g = −exp(A_log)·softplus(a + dt_bias)` ([`gates`]) → value head `h`
//! reads key head `⌊h / r⌋` → delta rule: token by token for one-token calls
//! ([`recurrence`]), chunked (C = 64) otherwise ([`chunked`]) → gated RMSNorm with the plain
//! weight → `W_out`. On CUDA ([`DeltaRule::Fused`]) the conv, the delta rule ([`fused`]), the
//! gates and the gated RMSNorm ([`fused_pointwise`]) run as fused kernels computing the same
//! functions; the candle forms stay the reference and the CPU path.
//!
//! Padding rule: at right-padded positions β = 0 and g = 0, so the recurrent state passes through
//! exactly, and each row's conv state is gathered at its own last valid token. Outputs at padded
//! positions are garbage and must be ignored by the caller.

mod candle_rule;
pub mod chunked;
pub mod conv;
pub mod fused;
pub mod fused_pointwise;
pub mod gates;
pub mod norm;
mod packed;
mod projections;

use projections::{InProjections, Projections};
pub mod recurrence;

use candle_core::{DType, Device, Tensor};

use crate::candle::profile;
use forkscore_seam::Quantization;

use crate::candle::layers::linear::{Linear, QuantSummary};

pub use conv::RightPadding;

use crate::error::CandleError;

/// Shapes of one Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnDims {
    /// Residual width `D`.
    pub hidden: usize,
    /// `Hk`, `linear_num_key_heads`.
    pub key_heads: usize,
    /// `Hv`, `linear_num_value_heads` (a multiple of `Hk`).
    pub value_heads: usize,
    /// `dk`, `linear_key_head_dim`.
    pub key_dim: usize,
    /// `dv`, `linear_value_head_dim`.
    pub value_dim: usize,
    /// `Kc`, `linear_conv_kernel_dim` (≥ 1).
    pub conv_kernel: usize,
    /// `rms_norm_eps`, used by the gated output norm.
    pub rms_norm_eps: f64,
}

impl GdnDims {
    /// `Ck = Hk·dk`.
    pub fn key_channels(&self) -> usize {
        self.key_heads * self.key_dim
    }
    /// `Cv = Hv·dv`.
    pub fn value_channels(&self) -> usize {
        self.value_heads * self.value_dim
    }
    /// `Cc = 2·Ck + Cv`, the conv channels.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_channels() + self.value_channels()
    }
    /// Rows of conv state kept per sequence: `Kc − 1`.
    pub fn conv_state_len(&self) -> usize {
        self.conv_kernel.saturating_sub(1)
    }

    fn validate(&self) -> Result<(), String> {
        let positive = [
            self.hidden,
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
            self.conv_kernel,
        ];
        if positive.contains(&0) {
            return Err(format!(
                "every linear-attention dimension must be positive: {self:?}"
            ));
        }
        if !self.value_heads.is_multiple_of(self.key_heads) {
            return Err(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.value_heads, self.key_heads
            ));
        }
        Ok(())
    }
}

/// State of one Gated DeltaNet layer for a batch of `B` sequences. Both tensors are f32.
#[derive(Debug, Clone)]
pub struct GdnState {
    /// Last `Kc−1` pre-conv `p` rows: `(B, Kc−1, Cc)`.
    pub conv: Tensor,
    /// Recurrent state `S`: `(B, Hv, dk, dv)` (HF/FLA layout).
    pub recurrent: Tensor,
}

impl GdnState {
    /// The state of `batch` fresh sequences (all zeros).
    pub fn zeros(dims: &GdnDims, batch: usize, device: &Device) -> candle_core::Result<Self> {
        Ok(Self {
            conv: Tensor::zeros(
                (batch, dims.conv_state_len(), dims.conv_channels()),
                DType::F32,
                device,
            )?,
            recurrent: Tensor::zeros(
                (batch, dims.value_heads, dims.key_dim, dims.value_dim),
                DType::F32,
                device,
            )?,
        })
    }

    /// Number of sequences `B`.
    pub fn batch(&self) -> usize {
        self.recurrent.dims().first().copied().unwrap_or(0)
    }

    /// A new batch whose row `i` is a copy of row `rows[i]` of `self` (fork: rows start from
    /// their slot's state; `self` is untouched).
    pub fn select_rows(&self, rows: &[u32]) -> candle_core::Result<Self> {
        let idx = Tensor::new(rows, self.recurrent.device())?;
        Ok(Self {
            conv: self.conv.index_select(&idx, 0)?,
            recurrent: self.recurrent.index_select(&idx, 0)?,
        })
    }
}

/// Raw tensors of one layer, as stored in an HF checkpoint (any float dtype; shapes are checked
/// by [`GdnLayer::new`]).
#[derive(Debug, Clone)]
pub struct GdnWeights {
    /// `in_proj_qkv.weight`: `(Cc, D)`.
    pub in_proj_qkv: Tensor,
    /// `in_proj_z.weight`: `(Cv, D)`.
    pub in_proj_z: Tensor,
    /// `in_proj_b.weight`: `(Hv, D)`.
    pub in_proj_b: Tensor,
    /// `in_proj_a.weight`: `(Hv, D)`.
    pub in_proj_a: Tensor,
    /// `conv1d.weight`: `(Cc, 1, Kc)` or `(Cc, Kc)`.
    pub conv1d: Tensor,
    /// `A_log`: `(Hv,)`.
    pub a_log: Tensor,
    /// `dt_bias`: `(Hv,)`.
    pub dt_bias: Tensor,
    /// `norm.weight`: `(dv,)`, plain convention.
    pub norm: Tensor,
    /// `out_proj.weight`: `(D, Cv)`.
    pub out_proj: Tensor,
}

/// Which form of the delta rule a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaRule {
    /// Token by token ([`recurrence`]).
    Recurrent,
    /// Chunk-parallel with the given chunk length ([`chunked`]).
    Chunked(usize),
    /// The fused CUDA kernel ([`fused`]): token by token with the state held on chip.
    Fused,
}

impl DeltaRule {
    /// HF's choice: recurrent for a one-token call, chunked (64) otherwise.
    pub fn for_len(len: usize) -> Self {
        if len == 1 {
            DeltaRule::Recurrent
        } else {
            DeltaRule::Chunked(chunked::CHUNK)
        }
    }

    /// The form a call takes: the fused kernel where it runs ([`fused::supports`]) unless the
    /// environment sets `FORKSCORE_GDN=candle`, else [`DeltaRule::for_len`].
    pub fn for_call(len: usize, dims: &GdnDims, device: &Device) -> Self {
        if fused::supports(dims, device) && !candle_path_forced() {
            DeltaRule::Fused
        } else {
            DeltaRule::for_len(len)
        }
    }
}

/// `FORKSCORE_GDN=candle` keeps the candle path on CUDA (to compare or profile), read once.
fn candle_path_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| crate::switches::is("FORKSCORE_GDN", "candle"))
}

/// One Gated DeltaNet layer, ready to run.
#[derive(Debug, Clone)]
pub struct GdnLayer {
    dims: GdnDims,
    in_proj: InProjections,
    out_proj: Linear,
    /// `(Cc, Kc)` f32.
    conv: Tensor,
    /// `(Hv,)` f32.
    a_log: Tensor,
    /// `(Hv,)` f32.
    dt_bias: Tensor,
    /// `(dv,)` f32.
    norm: Tensor,
}

fn check_shape(name: &str, t: &Tensor, expected: &[usize]) -> Result<(), CandleError> {
    if t.dims() != expected {
        return Err(CandleError::WrongShape {
            name: name.to_string(),
            expected: expected.to_vec(),
            actual: t.dims().to_vec(),
        });
    }
    Ok(())
}

impl GdnLayer {
    /// Check shapes and cast: projections to `dtype` (the activation dtype), conv weight,
    /// `A_log`, `dt_bias` and the norm weight to f32.
    pub fn new(dims: GdnDims, w: GdnWeights, dtype: DType) -> Result<Self, CandleError> {
        Self::build(dims, w, |_, t| {
            Ok(Linear::dense(
                t.to_dtype(dtype)
                    .map_err(CandleError::tensor("gdn.load.cast"))?,
                None,
            ))
        })
    }

    /// As [`GdnLayer::new`], with the five projections quantized under `q` onto `device`
    /// (see [`Linear::quantized`]; `dtype` is the activation dtype).
    pub(crate) fn new_quantized(
        dims: GdnDims,
        w: GdnWeights,
        dtype: DType,
        q: Quantization,
        device: &candle_core::Device,
    ) -> Result<Self, CandleError> {
        Self::build(dims, w, |name, t| {
            Linear::quantized(name, &t, None, q, dtype, device)
        })
    }

    /// Count the ggml type of each projection.
    pub(crate) fn summarize(&self, summary: &mut QuantSummary) {
        self.in_proj.summarize(summary);
        summary.count(&self.out_proj);
    }

    fn build(
        dims: GdnDims,
        w: GdnWeights,
        lin: impl Fn(&str, Tensor) -> Result<Linear, CandleError>,
    ) -> Result<Self, CandleError> {
        dims.validate()
            .map_err(|reason| CandleError::InvalidRequest { reason })?;
        let (d, cc, cv, hv) = (
            dims.hidden,
            dims.conv_channels(),
            dims.value_channels(),
            dims.value_heads,
        );
        check_shape("linear_attn.in_proj_qkv.weight", &w.in_proj_qkv, &[cc, d])?;
        check_shape("linear_attn.in_proj_z.weight", &w.in_proj_z, &[cv, d])?;
        check_shape("linear_attn.in_proj_b.weight", &w.in_proj_b, &[hv, d])?;
        check_shape("linear_attn.in_proj_a.weight", &w.in_proj_a, &[hv, d])?;
        check_shape("linear_attn.A_log", &w.a_log, &[hv])?;
        check_shape("linear_attn.dt_bias", &w.dt_bias, &[hv])?;
        check_shape("linear_attn.norm.weight", &w.norm, &[dims.value_dim])?;
        check_shape("linear_attn.out_proj.weight", &w.out_proj, &[d, cv])?;
        let conv = match w.conv1d.dims() {
            [c, 1, k] if *c == cc && *k == dims.conv_kernel => w
                .conv1d
                .squeeze(1)
                .map_err(CandleError::tensor("gdn.load.conv"))?,
            _ => {
                check_shape(
                    "linear_attn.conv1d.weight",
                    &w.conv1d,
                    &[cc, dims.conv_kernel],
                )?;
                w.conv1d
            }
        };
        let f32 = |t: Tensor| {
            t.to_dtype(DType::F32)
                .map_err(CandleError::tensor("gdn.load.cast"))
        };
        let stacks = crate::candle::layers::fusion::gdn_projections(w.in_proj_qkv.device());
        let in_proj = InProjections::new(
            [
                lin("linear_attn.in_proj_qkv.weight", w.in_proj_qkv)?,
                lin("linear_attn.in_proj_z.weight", w.in_proj_z)?,
                lin("linear_attn.in_proj_b.weight", w.in_proj_b)?,
                lin("linear_attn.in_proj_a.weight", w.in_proj_a)?,
            ],
            stacks,
        )?;
        Ok(Self {
            dims,
            in_proj,
            out_proj: lin("linear_attn.out_proj.weight", w.out_proj)?,
            conv: f32(conv)?,
            a_log: f32(w.a_log)?,
            dt_bias: f32(w.dt_bias)?,
            norm: f32(w.norm)?,
        })
    }

    pub fn dims(&self) -> &GdnDims {
        &self.dims
    }

    /// Run the layer with HF's algorithm choice ([`DeltaRule::for_len`]).
    pub fn forward(
        &self,
        x: &Tensor,
        state: &GdnState,
        padding: Option<&RightPadding>,
    ) -> Result<(Tensor, GdnState), CandleError> {
        self.forward_with(x, state, None, padding, self.rule_for(x))
    }

    /// Run `B` rows that continue rows of `state` (`S` rows): row `b` continues state row
    /// `slot_of_row[b]`, several rows may continue one (a scoring pass forked from a prefix).
    /// The same result as [`GdnLayer::forward`] from `state.select_rows(slot_of_row)`; the
    /// fused CUDA kernels read each row's state in place instead of copying it per row.
    pub fn forward_from_slots(
        &self,
        x: &Tensor,
        state: &GdnState,
        slot_of_row: &[u32],
        padding: Option<&RightPadding>,
    ) -> Result<(Tensor, GdnState), CandleError> {
        self.forward_with(x, state, Some(slot_of_row), padding, self.rule_for(x))
    }

    /// The delta-rule form of a call on `x (B, L, D)` ([`DeltaRule::for_call`]).
    fn rule_for(&self, x: &Tensor) -> DeltaRule {
        DeltaRule::for_call(
            x.dims().get(1).copied().unwrap_or(0),
            &self.dims,
            x.device(),
        )
    }

    /// Run the layer with an explicit delta-rule form (tests compare the forms), optionally
    /// from state rows picked per row ([`GdnLayer::forward_from_slots`]).
    pub fn forward_with(
        &self,
        x: &Tensor,
        state: &GdnState,
        slot_of_row: Option<&[u32]>,
        padding: Option<&RightPadding>,
        rule: DeltaRule,
    ) -> Result<(Tensor, GdnState), CandleError> {
        self.forward_keeping(x, state, slot_of_row, padding, rule, true)
    }

    /// [`GdnLayer::forward_with`] (HF's form choice) for a call whose new state nobody reads
    /// (a scoring pass, `keep_state` false): the same outputs; the fused CUDA kernels then skip
    /// writing each row's final recurrent state, and the returned state's `recurrent` holds
    /// no values (`(B, Hv, 0, dv)`). The other forms compute it as usual.
    pub fn forward_discarding(
        &self,
        x: &Tensor,
        state: &GdnState,
        slot_of_row: Option<&[u32]>,
        padding: Option<&RightPadding>,
    ) -> Result<(Tensor, GdnState), CandleError> {
        self.forward_keeping(x, state, slot_of_row, padding, self.rule_for(x), false)
    }

    fn forward_keeping(
        &self,
        x: &Tensor,
        state: &GdnState,
        slot_of_row: Option<&[u32]>,
        padding: Option<&RightPadding>,
        rule: DeltaRule,
        keep_state: bool,
    ) -> Result<(Tensor, GdnState), CandleError> {
        let (b, l, _) = x.dims3().map_err(CandleError::tensor("gdn.input"))?;
        match slot_of_row {
            None if state.batch() != b => {
                return Err(CandleError::InvalidRequest {
                    reason: format!("GDN state holds {} rows, input has {b}", state.batch()),
                });
            }
            Some(slots) if slots.len() != b => {
                return Err(CandleError::InvalidRequest {
                    reason: format!("{} row slots for an input of {b} rows", slots.len()),
                });
            }
            Some(slots) => {
                if let Some(bad) = slots.iter().find(|&&s| s as usize >= state.batch()) {
                    return Err(CandleError::InvalidRequest {
                        reason: format!(
                            "row slot {bad} out of range: the GDN state holds {} rows",
                            state.batch()
                        ),
                    });
                }
            }
            None => {}
        }
        if let Some(pad) = padding {
            if pad.lengths().len() != b || pad.padded_len() != l {
                return Err(CandleError::InvalidRequest {
                    reason: format!(
                        "padding describes {} rows of length {}, input is ({b}, {l})",
                        pad.lengths().len(),
                        pad.padded_len()
                    ),
                });
            }
        }
        self.run(x, state, slot_of_row, padding, rule, keep_state)
            .map_err(CandleError::tensor("gdn.forward"))
    }

    fn run(
        &self,
        x: &Tensor,
        state: &GdnState,
        slot_of_row: Option<&[u32]>,
        padding: Option<&RightPadding>,
        rule: DeltaRule,
        keep_state: bool,
    ) -> candle_core::Result<(Tensor, GdnState)> {
        let act = x.dtype();
        let dev = x.device();
        // Rows continuing picked state rows: the fused kernels read them through the map, the
        // candle forms from a gathered copy (B, ..).
        let gathered;
        let (state, slots) = match slot_of_row {
            Some(rows) if rule != DeltaRule::Fused => {
                gathered = state.select_rows(rows)?;
                (&gathered, None)
            }
            Some(rows) => (state, Some(Tensor::new(rows, dev)?)),
            None => (state, None),
        };
        let proj = self.project(x, Self::in_dtype(rule, act))?;
        let (o, next) = self.mix(&proj, state, slots.as_ref(), padding, rule, act, keep_state)?;
        let out = self.finish(&o, &proj.z, rule, act)?;
        Ok((out, next))
    }

    /// Conv, gates and delta rule over the projections: `o (B, L, Hv, dv)` and the new state
    /// (its recurrent part left empty by the fused kernels where `keep_state` is false).
    #[allow(clippy::too_many_arguments)]
    fn mix(
        &self,
        proj: &Projections,
        state: &GdnState,
        slots: Option<&Tensor>,
        padding: Option<&RightPadding>,
        rule: DeltaRule,
        act: DType,
        keep_state: bool,
    ) -> candle_core::Result<(Tensor, GdnState)> {
        let Projections {
            p, b_logits, a_in, ..
        } = proj;
        if proj.p_rows.is_some() && rule != DeltaRule::Fused {
            candle_core::bail!("a packed p reaches only the fused conv");
        }
        let dev = p.device();

        let (c, conv_state) = profile::region("gdn.conv", dev, || {
            if rule == DeltaRule::Fused {
                let lengths = padding.filter(|p| !p.is_full()).map(|p| p.lengths());
                let packed = match (&proj.p_rows, padding) {
                    (Some(starts), Some(pad)) => Some((starts.as_slice(), pad.padded_len())),
                    (Some(_), None) => candle_core::bail!("a packed p without its batch lengths"),
                    _ => None,
                };
                fused::causal_conv_silu(p, &state.conv, slots, &self.conv, lengths, packed)
            } else {
                conv::causal_conv_silu(p, &state.conv, &self.conv, padding)
            }
        })?;

        // (B, L, Hv) each
        let (beta, g) = profile::region("gdn.gates", dev, || {
            if rule == DeltaRule::Fused {
                let lengths = padding.filter(|p| !p.is_full()).map(|p| p.lengths());
                return fused_pointwise::gates(b_logits, a_in, &self.a_log, &self.dt_bias, lengths);
            }
            let mut beta = gates::beta(b_logits)?;
            let mut g = gates::log_decay(a_in, &self.a_log, &self.dt_bias)?;
            if let Some(pad) = padding.filter(|p| !p.is_full()) {
                let mask = pad.mask(dev)?;
                beta = gates::apply_mask(&beta, &mask)?;
                g = gates::apply_mask(&g, &mask)?;
            }
            Ok::<_, candle_core::Error>((beta, g))
        })?;

        // o: (B, L, Hv, dv)
        let (o, recurrent) = if rule == DeltaRule::Fused {
            profile::region("gdn.delta_rule", dev, || {
                fused::gated_delta_rule(
                    &c,
                    &beta,
                    &g,
                    &state.recurrent,
                    slots,
                    &self.dims,
                    act != DType::F32,
                    keep_state,
                )
            })?
        } else {
            candle_rule::delta_rule(&c, &beta, &g, &state.recurrent, &self.dims, rule)?
        };
        Ok((
            o,
            GdnState {
                conv: conv_state,
                recurrent,
            },
        ))
    }

    /// Gated output norm and `out_proj`: `o (B, L, Hv, dv)`, `z (B, L, Hv, dv)` -> `(B, L, D)`.
    fn finish(
        &self,
        o: &Tensor,
        z: &Tensor,
        rule: DeltaRule,
        act: DType,
    ) -> candle_core::Result<Tensor> {
        let (b, l, _, _) = o.dims4()?;
        let cv = self.dims.value_channels();
        profile::region("gdn.norm_out", o.device(), || {
            let eps = self.dims.rms_norm_eps;
            let y = if rule == DeltaRule::Fused && matches!(act, DType::F32 | DType::BF16) {
                fused_pointwise::gated_norm(o, z, &self.norm, eps, act)?
            } else {
                norm::gated_rms_norm(o, z, &self.norm, eps)?.to_dtype(act)?
            };
            // (B, L, Hv, dv) -> (B, L, Cv) -> (B, L, D)
            let y = y.reshape((b, l, cv))?;
            self.out_proj.forward(&y)
        })
    }
}
