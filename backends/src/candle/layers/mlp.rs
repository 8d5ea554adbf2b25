//! Linear layers and the SwiGLU MLP: `down( silu(gate(x)) * up(x) )`. On CUDA and the CPU the
//! gate and up weights are stacked at load into one `(2F, D)` product whose output feeds one
//! fused SwiGLU pass (`super::swiglu`): two kernels instead of four, one larger matrix product.

use crate::candle::cpu;
use candle_core::quantized::GgmlDType;
use candle_core::Tensor;

use super::super::cpu::amx::{AmxI8Weight, AmxWeight};
use super::super::cpu::gemm::PackedWeight;
use super::super::cpu::q4gemm::PackedQ4;
use super::super::cpu::qgemm::PackedQ8;
use super::super::load::weights::Weights;
use super::super::profile;
pub(crate) use super::linear::apply;
use super::linear::{Linear, QuantSummary};
use super::swiglu;
use crate::error::CandleError;

/// Load `name.weight` `(out, in)` and, when `bias`, `name.bias` `(out,)` (quantized when the
/// view says so, see [`Weights::linear`]).
pub(crate) fn linear(
    w: &Weights<'_>,
    name: &str,
    in_dim: usize,
    out_dim: usize,
    bias: bool,
) -> Result<Linear, CandleError> {
    w.linear(name, in_dim, out_dim, bias)
}

/// The gate and up projections: two products (the reference, and quantized weights), or one
/// product with the weights stacked `(2F, D)` followed by the fused SwiGLU pass (dense weights
/// on CUDA and the CPU; see [`super::fusion`]).
enum GateUp {
    Separate {
        gate: Linear,
        up: Linear,
    },
    Stacked(Linear),
    /// Packed gate and up (f32, `Q8_0`, 4-bit, bf16 on AMX) of an f32 model on an x86 CPU, one
    /// weight whose panels alternate (gate's `p`, up's `p`): the SwiGLU is taken as the kernel
    /// writes each output tile (integer kernels, `super::super::cpu::tile_store`; AMX, from its
    /// C tiles) or block (f32), equal bit for bit to `Stacked` and the pass, without storing
    /// the `(…, 2F)` product.
    InTiles(InTiles),
}

/// The weight of [`GateUp::InTiles`].
enum InTiles {
    F32(PackedWeight),
    Q8(PackedQ8),
    Q4(PackedQ4),
    /// bf16-rounded (`--quantize bf16`) on the AMX tiles.
    AmxBf16(AmxWeight),
    /// int8 per output row (`--quantize int8`) on the AMX-INT8 tiles.
    Int8(AmxI8Weight),
}

impl InTiles {
    /// `gate` and `up` as one weight for the SwiGLU in the tiles, where both are packed weights
    /// of one kind, format and kernel, without biases, with `F` a multiple of 16 (and, f32,
    /// an input width the kernel keeps innermost).
    fn of(gate: &Linear, up: &Linear) -> Option<Self> {
        if let (Some(g), Some(u)) = (gate.packed_f32(), up.packed_f32()) {
            // the f32 kernel's blocks are whole in cache only with `k` innermost
            let (_, k) = g.dims();
            return match cpu::gemm::swiglu_fits(k) {
                true => PackedWeight::gate_up(g, u).map(InTiles::F32),
                false => None,
            };
        }
        let integer = gate.packed_q8().is_some()
            || gate.packed_q4().is_some()
            || gate.packed_int8().is_some();
        if integer && super::linear::f32_activations() {
            // the integer and int8 tiles round the activations: each product goes through
            // `Linear::forward`, which multiplies them in f32
            return None;
        }
        if let (Some(g), Some(u)) = (gate.packed_q8(), up.packed_q8()) {
            return PackedQ8::gate_up(g, u).map(InTiles::Q8);
        }
        if let (Some(g), Some(u)) = (gate.packed_q4(), up.packed_q4()) {
            return PackedQ4::gate_up(g, u).map(InTiles::Q4);
        }
        if let (Some(g), Some(u)) = (gate.packed_int8(), up.packed_int8()) {
            return AmxI8Weight::gate_up(g, u).map(InTiles::Int8);
        }
        if let (Some(g), Some(u)) = (gate.packed_amx_bf16(), up.packed_amx_bf16()) {
            // the blocked kernel's A/B switch keeps the stacked product and the pass
            if crate::switches::value("FORKSCORE_CPU_AMX").is_none() {
                return AmxWeight::gate_up(g, u).map(InTiles::AmxBf16);
            }
        }
        None
    }

    /// How the quant summary names the weights (as [`Linear::weight_kind`]).
    fn kind(&self) -> String {
        let ggml = match self {
            InTiles::F32(_) => None,
            InTiles::Q8(_) => Some(GgmlDType::Q8_0),
            InTiles::Q4(w) => Some(cpu::q4gemm::ggml(w)),
            InTiles::AmxBf16(_) => Some(GgmlDType::BF16),
            InTiles::Int8(_) => return "int8".to_string(),
        };
        super::linear::QuantSummary::key(ggml)
    }

    /// `(B, L, D) -> (B, L, F)`.
    fn swiglu(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            InTiles::F32(w) => cpu::gemm::swiglu(x, w),
            InTiles::Q8(w) => cpu::qgemm::swiglu(x, w),
            InTiles::Q4(w) => cpu::q4gemm::swiglu(x, w),
            InTiles::AmxBf16(w) => cpu::amx::bf16_swiglu(x, w),
            InTiles::Int8(w) => cpu::amx::int8_swiglu(x, w),
        }
    }
}

pub(crate) struct Mlp {
    gate_up: GateUp,
    down: Linear,
}

impl Mlp {
    /// `prefix.{gate,up,down}_proj`, no biases.
    pub fn load(
        w: &Weights<'_>,
        prefix: &str,
        hidden: usize,
        intermediate: usize,
    ) -> Result<Self, CandleError> {
        let gate = linear(
            w,
            &format!("{prefix}.gate_proj"),
            hidden,
            intermediate,
            false,
        )?;
        let up = linear(w, &format!("{prefix}.up_proj"), hidden, intermediate, false)?;
        let down = linear(
            w,
            &format!("{prefix}.down_proj"),
            intermediate,
            hidden,
            false,
        )?;
        let stacks = super::fusion::gate_up(w.device());
        // the interleaved weight is built only where it will be used
        let in_tiles = match stacks && super::fusion::gate_up_in_tiles() {
            true => InTiles::of(&gate, &up),
            false => None,
        };
        let gate_up = match (stacks, in_tiles) {
            (true, Some(fused)) => GateUp::InTiles(fused),
            // (F, D) ++ (F, D) -> (2F, D): one product, rows [gate | up]
            (true, None) => match Linear::stack(&[&gate, &up])? {
                Some(stacked) => GateUp::Stacked(stacked),
                None => GateUp::Separate { gate, up },
            },
            (false, _) => GateUp::Separate { gate, up },
        };
        Ok(Mlp { gate_up, down })
    }

    /// Count the ggml type of each projection.
    pub fn summarize(&self, summary: &mut QuantSummary) {
        match &self.gate_up {
            GateUp::Separate { gate, up } => {
                summary.count(gate);
                summary.count(up);
            }
            GateUp::Stacked(l) => {
                // two checkpoint projections, one kind
                summary.count(l);
                summary.count(l);
            }
            GateUp::InTiles(w) => {
                summary.count_kind(w.kind());
                summary.count_kind(w.kind());
            }
        }
        summary.count(&self.down);
    }

    /// `(B, L, D) -> (B, L, D)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, CandleError> {
        let h = match &self.gate_up {
            GateUp::Separate { gate, up } => {
                let dev = x.device();
                let (gate, up) = profile::region("mlp.gate_up", dev, || {
                    Ok::<_, CandleError>((apply(gate, x, "mlp gate")?, apply(up, x, "mlp up")?))
                })?; // (B, L, F) each
                profile::region("mlp.act", dev, || {
                    candle_nn::ops::silu(&gate)
                        .and_then(|g| g * up)
                        .map_err(CandleError::tensor("mlp swiglu"))
                })?
            }
            GateUp::Stacked(l) => {
                let dev = x.device();
                let gu = profile::region("mlp.gate_up", dev, || apply(l, x, "mlp gate|up"))?; // (B, L, 2F)
                profile::region("mlp.act", dev, || {
                    swiglu::swiglu(&gu).map_err(CandleError::tensor("mlp swiglu"))
                })? // (B, L, F)
            }
            GateUp::InTiles(w) => {
                // (B, L, D) -> (B, L, F): the product and the SwiGLU in one pass
                profile::region("mlp.gate_up", x.device(), || {
                    w.swiglu(x)
                        .map_err(CandleError::tensor("mlp gate|up swiglu"))
                })?
            }
        };
        profile::region("mlp.down", h.device(), || apply(&self.down, &h, "mlp down"))
        // (B, L, D)
    }
}
