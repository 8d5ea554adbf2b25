//! A `(V, D)` token table — the input embedding or the output head — read by rows.
//!
//! Dense: a tensor in the compute dtype (every safetensors checkpoint, and GGUF tensors stored
//! as F32 / F16 / BF16). Blocks: a GGUF tensor stored in a ggml block format kept in it (a
//! vocabulary-sized table dequantized to f32 would take 4 bytes a value: 933 MB for a 1.5B
//! Qwen's embedding alone, against 126 MB as Q4_K); rows are dequantized to f32 when read
//! (`QTensor::embedding`), so the candidate head projects exactly the f32 rows the dequantized
//! table would hold. The full projection ([`Table::project_all`], the opt-in diagnostics and
//! the generation baseline's greedy step) takes candle's quantized matmul for a few rows —
//! activations rounded to 8 bits, as llama.cpp computes its head — and f32 slices of
//! dequantized rows above that.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};

/// Rows of the full projection that still take the quantized matmul ([`Table::project_all`]).
const QUANTIZED_PROJECTION_ROWS: usize = 4;

#[derive(Clone)]
pub(crate) enum Table {
    /// `(V, D)` in the compute dtype.
    Dense(Tensor),
    /// `(V, D)` ggml blocks on the model's device; rows are read in f32 and cast to `dtype`.
    Blocks {
        blocks: Arc<QTensor>,
        matmul: Option<QMatMul>,
        dtype: DType,
    },
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Table::Dense(t) => write!(f, "Table::Dense({:?})", t.shape()),
            Table::Blocks { blocks, .. } => {
                write!(
                    f,
                    "Table::Blocks({:?} {:?})",
                    blocks.dtype(),
                    blocks.shape()
                )
            }
        }
    }
}

impl Table {
    /// A block table; `dtype` is the compute dtype rows are returned in.
    pub fn blocks(blocks: QTensor, dtype: DType) -> candle_core::Result<Self> {
        let blocks = Arc::new(blocks);
        let (_, d) = blocks.shape().dims2()?;
        let ggml = blocks.dtype();
        // candle's CPU dot products of these formats take blocks in pairs (a debug assertion
        // on an odd count): such a table is projected through dequantized slices only
        let pairs = matches!(ggml, GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1);
        let matmul = match pairs && (d / ggml.block_size()) % 2 == 1 {
            true => None,
            false => Some(QMatMul::from_arc(blocks.clone())?),
        };
        Ok(Table::Blocks {
            blocks,
            matmul,
            dtype,
        })
    }

    /// `(V, D)`.
    pub fn dims(&self) -> (usize, usize) {
        let dims = match self {
            Table::Dense(t) => t.dims(),
            Table::Blocks { blocks, .. } => blocks.shape().dims(),
        };
        (
            dims.first().copied().unwrap_or(0),
            dims.get(1).copied().unwrap_or(0),
        )
    }

    /// The ggml type of a block table (`None` when dense).
    #[cfg(test)]
    pub fn ggml(&self) -> Option<GgmlDType> {
        match self {
            Table::Dense(_) => None,
            Table::Blocks { blocks, .. } => Some(blocks.dtype()),
        }
    }

    /// Rows `ids (N,)` (u32, on the table's device) -> `(N, D)` in the compute dtype.
    pub fn rows(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Table::Dense(t) => t.index_select(ids, 0),
            Table::Blocks { blocks, dtype, .. } => blocks.embedding(ids)?.to_dtype(*dtype),
        }
    }

    /// Rows `ids (N,)` -> `(N, D)` in f32.
    pub fn rows_f32(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Table::Dense(t) => t.index_select(ids, 0)?.to_dtype(DType::F32),
            Table::Blocks { blocks, .. } => blocks.embedding(ids)?.to_dtype(DType::F32),
        }
    }

    /// Rows `start .. start + len` -> `(len, D)` in f32.
    pub fn slice_f32(&self, start: usize, len: usize) -> candle_core::Result<Tensor> {
        match self {
            Table::Dense(t) => t.narrow(0, start, len)?.to_dtype(DType::F32),
            Table::Blocks { blocks, .. } => {
                let device = blocks.device();
                let ids = Tensor::arange(start as u32, (start + len) as u32, &device)?;
                blocks.embedding(&ids)?.to_dtype(DType::F32)
            }
        }
    }

    /// `h (N, D)` f32 -> `(N, V)` f32 through the quantized matmul, when this is a block
    /// table with one and `N` is small; `None` otherwise (the caller projects f32 slices).
    pub fn project_quantized(&self, h: &Tensor) -> candle_core::Result<Option<Tensor>> {
        match self {
            Table::Blocks {
                matmul: Some(m), ..
            } if h.dim(0)? <= QUANTIZED_PROJECTION_ROWS => {
                Ok(Some(m.forward(&h.to_dtype(DType::F32)?.contiguous()?)?))
            }
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A block table reads exactly the rows of its dequantized copy (by id, by range), and its
    /// quantized full projection of a few rows stays within the 8-bit activation rounding of
    /// the f32 product; above that row count, and for a pair format with an odd block count,
    /// it declines (the caller projects f32 slices).
    #[test]
    fn block_rows_equal_the_dequantized_table() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        for (ggml, d) in [
            (GgmlDType::Q8_0, 64),
            (GgmlDType::Q4_0, 64),
            (GgmlDType::Q5_0, 64),
            (GgmlDType::Q4K, 256),
            (GgmlDType::Q6K, 256),
        ] {
            let w = Tensor::randn(0f32, 1.0, (70, d), &dev)?;
            let q = QTensor::quantize(&w, ggml)?;
            let dense = q.dequantize(&dev)?;
            let table = Table::blocks(q, DType::F32)?;
            assert_eq!(table.dims(), (70, d));
            assert_eq!(table.ggml(), Some(ggml));
            let ids = Tensor::new(&[0u32, 69, 5, 5, 33], &dev)?;
            let want = dense.index_select(&ids, 0)?.to_vec2::<f32>()?;
            assert_eq!(table.rows(&ids)?.to_vec2::<f32>()?, want, "{ggml:?}");
            assert_eq!(table.rows_f32(&ids)?.to_vec2::<f32>()?, want, "{ggml:?}");
            assert_eq!(
                table.slice_f32(10, 7)?.to_vec2::<f32>()?,
                dense.narrow(0, 10, 7)?.to_vec2::<f32>()?,
                "{ggml:?}"
            );
            let h = Tensor::randn(0f32, 1.0, (2, d), &dev)?;
            let exact = h.matmul(&dense.t()?)?;
            let got = table
                .project_quantized(&h)?
                .expect("two rows take the matmul");
            let scale = exact.abs()?.max_all()?.to_scalar::<f32>()?;
            let diff = (got - &exact)?.abs()?.max_all()?.to_scalar::<f32>()?;
            // activations rounded to 8-bit blocks: a fraction of a percent of the scale
            assert!(diff <= 0.02 * scale, "{ggml:?}: {diff} vs scale {scale}");
            let many = Tensor::randn(0f32, 1.0, (QUANTIZED_PROJECTION_ROWS + 1, d), &dev)?;
            assert!(table.project_quantized(&many)?.is_none());
        }
        // Q5_0 with 3 blocks a row: no quantized matmul (candle's dot product takes pairs)
        let q = QTensor::quantize(&Tensor::randn(0f32, 1.0, (8, 96), &dev)?, GgmlDType::Q5_0)?;
        let table = Table::blocks(q, DType::F32)?;
        let h = Tensor::randn(0f32, 1.0, (1, 96), &dev)?;
        assert!(table.project_quantized(&h)?.is_none());
        Ok(())
    }
}
