//! Batch-invariant dense products on GPUs (`--deterministic`): `x · Wᵀ` computed as GEMMs of
//! exactly [`ROWS`] rows each (the rows of `x` in order, the last block zero-padded), so every
//! product the layer ever runs has one shape `(ROWS, in) · (in, out)`.
//!
//! Why: cuBLAS picks its kernel — tile shape, split-K / stream-K partition — from the whole
//! problem shape, so one row's summation order, and in bf16 its rounded result, follows how many
//! other rows share the call. A context packed with others then differs from the same context
//! alone. With one fixed shape the library runs one kernel for every call; whether a row's
//! result is also independent of its position inside the block is what
//! `scripts/gpu-kernels/gemm_invariance_probe.py` measures on the GPU machine.
//!
//! Cost: one launch per block and the padding of the last block; the benches report it beside
//! the default path.

use candle_core::{Tensor, D};

/// Rows per GEMM call.
pub const ROWS: usize = 512;

/// `x (.., in) · w (out, in)ᵀ (+ bias)` in blocks of [`ROWS`] rows.
pub(crate) fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
    let dims = x.dims().to_vec();
    let k = x.dim(D::Minus1)?;
    let rows = x.elem_count() / k.max(1);
    let out = w.dim(0)?;
    // (rows, in), padded to whole blocks
    let flat = x.reshape((rows, k))?;
    let padded_rows = rows.div_ceil(ROWS).max(1) * ROWS;
    let flat = if padded_rows > rows {
        flat.pad_with_zeros(0, 0, padded_rows - rows)?
    } else {
        flat
    };
    let wt = w.t()?;
    let blocks = (0..padded_rows / ROWS)
        .map(|i| flat.narrow(0, i * ROWS, ROWS)?.contiguous()?.matmul(&wt))
        .collect::<candle_core::Result<Vec<_>>>()?; // each (ROWS, out)
    let y = Tensor::cat(&blocks, 0)?.narrow(0, 0, rows)?;
    let mut shape = dims;
    if let Some(last) = shape.last_mut() {
        *last = out;
    }
    let y = y.reshape(shape)?;
    match bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Result};

    fn rand(shape: &[usize], seed: u64) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let mut s = seed;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
    }

    #[test]
    fn blocks_equal_the_plain_product_on_every_row_count() -> Result<()> {
        let w = rand(&[24, 40], 1)?;
        let b = rand(&[24], 2)?;
        for rows in [1, 7, ROWS - 1, ROWS, ROWS + 3, 2 * ROWS + 17] {
            let x = rand(&[1, rows, 40], rows as u64 + 3)?;
            let want = x.broadcast_matmul(&w.t()?)?.broadcast_add(&b)?;
            let got = linear(&x, &w, Some(&b))?;
            assert_eq!(got.dims(), &[1, rows, 24]);
            let diff = (got - want)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()?;
            assert!(diff < 1e-5, "{rows} rows: max |diff| {diff}");
        }
        Ok(())
    }

    #[test]
    fn a_row_does_not_depend_on_the_other_rows_of_the_call() -> Result<()> {
        let w = rand(&[16, 32], 5)?;
        let ctx = rand(&[300, 32], 6)?;
        let alone = linear(&ctx, &w, None)?;
        // the same rows after 700 rows of another context: other blocks, other offsets
        let other = rand(&[700, 32], 7)?;
        let packed = Tensor::cat(&[&other, &ctx], 0)?;
        let y = linear(&packed, &w, None)?.narrow(0, 700, 300)?;
        let a: Vec<f32> = alone.flatten_all()?.to_vec1()?;
        let b: Vec<f32> = y.flatten_all()?.to_vec1()?;
        assert_eq!(a, b);
        Ok(())
    }
}
