//! Linear layers and the SwiGLU MLP: `down( silu(gate(x)) * up(x) )`.

use candle_core::Tensor;
use candle_nn::{Linear, Module};

use super::weights::Weights;
use crate::error::CandleError;

/// Load `name.weight` `(out, in)` and, when `bias`, `name.bias` `(out,)`.
pub(crate) fn linear(
    w: &Weights<'_>,
    name: &str,
    in_dim: usize,
    out_dim: usize,
    bias: bool,
) -> Result<Linear, CandleError> {
    let weight = w.get(&format!("{name}.weight"), &[out_dim, in_dim])?;
    let bias = if bias {
        Some(w.get(&format!("{name}.bias"), &[out_dim])?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

/// `(.., in) -> (.., out)`.
pub(crate) fn apply(layer: &Linear, x: &Tensor, name: &'static str) -> Result<Tensor, CandleError> {
    layer.forward(x).map_err(CandleError::tensor(name))
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
