//! How much memory the accelerator has: the default group budget is derived from it.

use forkscore_backends::DeviceSpec;

/// Total memory of a CUDA device from nvidia-smi (None when unavailable or not CUDA). The
/// ordinal is forkscore's (`cuda:N`); nvidia-smi numbers physical GPUs, so it is mapped through
/// `CUDA_VISIBLE_DEVICES` when that lists indices.
pub fn cuda_memory_bytes(device: DeviceSpec) -> Option<u64> {
    let DeviceSpec::Cuda(ordinal) = device else {
        return None;
    };
    let physical = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) if !list.trim().is_empty() => list.split(',').nth(ordinal)?.trim().to_string(),
        _ => ordinal.to_string(),
    };
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=memory.total",
            "--format=csv,noheader,nounits",
            "-i",
            &physical,
        ])
        .output()
        .ok()?;
    let mib: u64 = String::from_utf8(out.stdout).ok()?.trim().parse().ok()?;
    Some(mib << 20)
}
