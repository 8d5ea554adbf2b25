//! Linear layers and the SwiGLU MLP: `down( silu(gate(x)) * up(x) )`.

use candle_core::Tensor;

pub(crate) use super::linear::apply;
use super::linear::{Linear, QuantSummary};
use super::weights::Weights;
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

pub(crate) struct Mlp {
    gate: Linear,
    up: Linear,
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
        Ok(Mlp {
            gate: linear(
                w,
                &format!("{prefix}.gate_proj"),
                hidden,
                intermediate,
                false,
            )?,
            up: linear(w, &format!("{prefix}.up_proj"), hidden, intermediate, false)?,
            down: linear(
                w,
                &format!("{prefix}.down_proj"),
                intermediate,
                hidden,
                false,
            )?,
        })
    }

    /// Count the ggml type of each projection.
    pub fn summarize(&self, summary: &mut QuantSummary) {
        for l in [&self.gate, &self.up, &self.down] {
            summary.count(l);
        }
    }

    /// `(B, L, D) -> (B, L, D)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, CandleError> {
        let gate = apply(&self.gate, x, "mlp gate")?; // (B, L, F)
        let up = apply(&self.up, x, "mlp up")?; // (B, L, F)
        let h = candle_nn::ops::silu(&gate)
            .and_then(|g| g * up)
            .map_err(CandleError::tensor("mlp swiglu"))?;
        apply(&self.down, &h, "mlp down") // (B, L, D)
    }
}
