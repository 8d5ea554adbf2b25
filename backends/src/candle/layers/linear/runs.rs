//! Block formats without an integer kernel (`Q6_K`, `Q5_0`, …) on the CPU: the weight
//! dequantized and packed for the f32 kernel for one call, a run of output rows at a time.
//!
//! Dequantizing the whole weight first held two f32 copies of it (dense and packed) during the
//! call: for a 1,536 × 8,960 `ffn_down` 110 MB above the model's resident size, which set a
//! GGUF run's peak memory. By runs of about [`RUN_VALUES`] weights the transient is two
//! copies of one run, and each output column is the same sum as before (the kernel reduces
//! over `in` for each column on its own; tested bit for bit).

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::{Device, Tensor, D};

use crate::candle::cpu;
use crate::candle::cpu::gemm::PackedWeight;
use crate::candle::cpu::host::PackTensor;

/// Weights per run (2 M f32: 8 MB dense, as much packed).
pub(super) const RUN_VALUES: usize = 1 << 21;

/// `x (.., in) · Wᵀ -> (.., out)` for the stored blocks `blocks (out, in)` of `ggml`, in runs
/// of `run_rows` output rows (rounded up to 16, the kernel's panel width).
pub(super) fn product_in_runs(
    x: &Tensor,
    blocks: &QTensor,
    ggml: GgmlDType,
    run_rows: usize,
) -> candle_core::Result<Tensor> {
    let (n, k) = blocks.shape().dims2()?;
    let data = blocks.data()?;
    if n == 0 || data.len() % n != 0 {
        candle_core::bail!(
            "{ggml:?} weight ({n}, {k}): {} bytes are not whole rows",
            data.len()
        );
    }
    let row_bytes = data.len() / n;
    let run = run_rows.max(1).div_ceil(16) * 16;
    let mut outs = Vec::with_capacity(n.div_ceil(run));
    for r0 in (0..n).step_by(run) {
        let r1 = (r0 + run).min(n);
        let part = qtensor_from_ggml(
            ggml,
            &data[r0 * row_bytes..r1 * row_bytes],
            vec![r1 - r0, k],
            &Device::Cpu,
        )?;
        let packed = PackedWeight::pack(&part.dequantize(&Device::Cpu)?)?;
        outs.push(cpu::gemm::linear(x, &packed)?);
    }
    match outs.len() {
        1 => Ok(outs.remove(0)),
        _ => Tensor::cat(&outs, D::Minus1),
    }
}

/// The run length for an input width `k`: about [`RUN_VALUES`] weights.
pub(super) fn run_rows(k: usize) -> usize {
    RUN_VALUES / k.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of any length give the whole weight's product bit for bit, for the formats that
    /// take this path.
    #[test]
    fn runs_equal_the_whole_weight() -> candle_core::Result<()> {
        if cpu::isa::Isa::chosen().is_none() {
            return Ok(());
        }
        let dev = Device::Cpu;
        for (ggml, n, k) in [(GgmlDType::Q6K, 72, 512), (GgmlDType::Q5_0, 50, 96)] {
            let w = Tensor::randn(0f32, 0.3, (n, k), &dev)?;
            let blocks = QTensor::quantize(&w, ggml)?;
            let x = Tensor::randn(0f32, 1.0, (2, 7, k), &dev)?;
            let whole = cpu::gemm::linear(&x, &PackedWeight::pack(&blocks.dequantize(&dev)?)?)?;
            for run in [1, 16, 17, 40, n, 10 * n] {
                let y = product_in_runs(&x, &blocks, ggml, run)?;
                assert_eq!(y.dims(), whole.dims(), "{ggml:?} run {run}");
                let (a, b) = (
                    y.flatten_all()?.to_vec1::<f32>()?,
                    whole.flatten_all()?.to_vec1::<f32>()?,
                );
                assert!(
                    a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ggml:?} run {run}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn run_length_tracks_the_input_width() {
        assert!(run_rows(8960) * 8960 <= RUN_VALUES);
        assert!(run_rows(0) > 0);
    }
}
