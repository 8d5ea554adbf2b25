//! The building blocks the model files assemble: attention and its masks (`attention`, `past_kv`, `mask`), RoPE (`rope`), norms (`norm`, `residual_norm`), linear layers dense or quantized (`linear`), the MLP and its SwiGLU (`mlp`, `swiglu`, `fusion`), the candidate head (`head`) and full-vocabulary summaries (`vocab`).

pub mod attention;
pub mod fusion;
pub(in crate::candle) mod head;
pub(in crate::candle) mod linear;
pub mod mask;
pub mod mlp;
pub(in crate::candle) mod norm;
pub(in crate::candle) mod past_kv;
pub mod residual_norm;
pub(in crate::candle) mod rope;
pub(in crate::candle) mod swiglu;
pub(in crate::candle) mod vocab;
