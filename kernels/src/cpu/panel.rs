//! The packed weight layout every CPU GEMM shares (f32, bf16, AMX, `Q8_0`, `Q4_K`): weights
//! are stored in panels of [`NR`] output columns, and the tile store writes outputs by panel. A
//! leaf, so the kernels that share it need not import each other.

/// Output columns per panel (two 8-lane vectors).
pub const NR: usize = 16;
