//! A stored block-format tensor (an embedding or output table) copied into candle's CPU blocks
//! a run of pages at a time, each run's mapped pages dropped once copied: copying it whole
//! first held the tensor twice, mapped and copied (145 MB on top of the weights for the Q8_0
//! output head of a 0.5B model).

use std::mem::size_of;

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1, GgmlType,
};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;

use super::file::TensorInfo;
use super::GgufTensors;

/// Bytes copied between two releases of mapped pages.
const RUN: usize = 8 << 20;

impl GgufTensors {
    /// The block-format tensor `info` (checked by [`GgufTensors::info`] against `shape`) as
    /// candle's blocks on the CPU, equal byte for byte to `qtensor_from_ggml` on its bytes
    /// (tested), with its mapped pages released as they are copied. Float types go through
    /// candle's loader as they are.
    pub(crate) fn cpu_blocks(
        &self,
        info: &TensorInfo,
        shape: &[usize],
    ) -> candle_core::Result<QTensor> {
        macro_rules! by_type {
            ($($g:ident => $t:ty),* $(,)?) => {
                match info.dtype.0 {
                    $(GgmlDType::$g => self.copy_blocks::<$t>(info, shape, RUN),)*
                    other => candle_core::quantized::ggml_file::qtensor_from_ggml(
                        other,
                        self.bytes(info),
                        shape.to_vec(),
                        &Device::Cpu,
                    ),
                }
            };
        }
        let blocks = by_type!(
            Q4_0 => BlockQ4_0, Q4_1 => BlockQ4_1, Q5_0 => BlockQ5_0, Q5_1 => BlockQ5_1,
            Q8_0 => BlockQ8_0, Q8_1 => BlockQ8_1, Q2K => BlockQ2K, Q3K => BlockQ3K,
            Q4K => BlockQ4K, Q5K => BlockQ5K, Q6K => BlockQ6K, Q8K => BlockQ8K,
        )?;
        self.release(info);
        Ok(blocks)
    }

    /// `info`'s bytes as a `Vec` of blocks `T`, copied `run` bytes at a time.
    fn copy_blocks<T: GgmlType + Send + Sync + 'static>(
        &self,
        info: &TensorInfo,
        shape: &[usize],
        run: usize,
    ) -> candle_core::Result<QTensor> {
        let bytes = self.bytes(info);
        let elements: usize = shape.iter().product();
        let want = elements / T::BLCK_SIZE * size_of::<T>();
        if !elements.is_multiple_of(T::BLCK_SIZE) || bytes.len() != want {
            candle_core::bail!(
                "{:?} tensor of shape {shape:?}: {} bytes stored, {want} expected",
                T::DTYPE,
                bytes.len()
            );
        }
        let n = bytes.len() / size_of::<T>();
        let mut blocks: Vec<T> = Vec::with_capacity(n);
        let dst = blocks.as_mut_ptr() as *mut u8;
        for at in (0..bytes.len()).step_by(run.max(1)) {
            let end = (at + run.max(1)).min(bytes.len());
            // SAFETY: `dst` has room for `n` blocks, `bytes.len()` bytes; the ranges are
            // within both and do not overlap (one is mapped file, the other a new buffer).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().add(at), dst.add(at), end - at) };
            self.file.release_range(info.start + at, info.start + end);
        }
        // SAFETY: every byte of the `n` blocks was written above; ggml blocks are plain data
        // (f16 and integer arrays) for which any bytes are a value, as candle's own loader
        // assumes when it reads them from a file.
        unsafe { blocks.set_len(n) };
        QTensor::new(QStorage::Cpu(Box::new(blocks)), shape)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use candle_core::quantized::k_quants::BlockQ8_0;
    use candle_core::quantized::GgmlDType;
    use candle_core::Device;

    use super::super::GgufTensors;

    /// The fixture's block tables copied run by run (whole, and in ragged runs smaller than a
    /// page and than a block) equal candle's loader byte for byte; a shape that does not fit the
    /// bytes is an error.
    #[test]
    fn copied_blocks_equal_candles_loader() -> candle_core::Result<()> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/qwen25_q8_0.gguf");
        let g = GgufTensors::open(&path).expect("fixture");
        let mut seen = 0;
        for info in g.file.tensors.values() {
            if info.dtype.0 != GgmlDType::Q8_0 {
                continue;
            }
            seen += 1;
            let want = candle_core::quantized::ggml_file::qtensor_from_ggml(
                GgmlDType::Q8_0,
                g.bytes(info),
                info.shape.clone(),
                &Device::Cpu,
            )?;
            let whole = g.cpu_blocks(info, &info.shape)?;
            assert_eq!(whole.shape(), want.shape());
            assert_eq!(whole.data()?, want.data()?);
            for run in [1usize, 33, 4097] {
                let got = g.copy_blocks::<BlockQ8_0>(info, &info.shape, run)?;
                assert_eq!(got.data()?, want.data()?, "run {run}");
            }
            let mut wrong = info.shape.clone();
            wrong[0] += 1;
            assert!(g.copy_blocks::<BlockQ8_0>(info, &wrong, 4096).is_err());
        }
        assert!(seen > 0, "the fixture holds Q8_0 tensors");
        Ok(())
    }
}
