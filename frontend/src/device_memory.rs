//! How much memory the accelerator has: the default group budget is derived from it.

use forkscore_backends::DeviceSpec;

/// Total memory of a CUDA device, from the CUDA driver API (None when unknown or not CUDA:
/// then the default budget applies). See `forkscore_backends::candle::device::cuda_total_memory`.
pub fn cuda_memory_bytes(device: DeviceSpec) -> Option<u64> {
    let DeviceSpec::Cuda(ordinal) = device else {
        return None;
    };
    forkscore_backends::candle::device::cuda_total_memory(ordinal)
}
