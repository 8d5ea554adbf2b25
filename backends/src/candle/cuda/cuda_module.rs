//! Loading this crate's own CUDA kernels: nvcc's fat binaries of `kernels/cuda/*.cu` (the `forkscore-kernels` crate),
//! embedded in the library and loaded once per (kernel source, device). Loading machine code
//! takes microseconds; the compute_80 PTX fallback is compiled by the driver once on GPUs other
//! than the build target.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::{CudaModule, CudaView};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{DeviceId, WrapErr};
use candle_core::{CudaDevice, Layout, Result, Storage};

/// The module of the kernel source `name` (its fat binary `fatbin`) on `dev`.
pub(crate) fn load(
    dev: &CudaDevice,
    name: &'static str,
    fatbin: &'static [u8],
) -> Result<Arc<CudaModule>> {
    type Cache = Mutex<HashMap<(&'static str, DeviceId), Arc<CudaModule>>>;
    static MODULES: OnceLock<Cache> = OnceLock::new();
    let mut map = MODULES
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .map_err(|_| candle_core::Error::Msg("CUDA module cache poisoned".into()))?;
    if let Some(m) = map.get(&(name, dev.id())) {
        return Ok(m.clone());
    }
    let m = dev
        .cuda_stream()
        .context()
        .load_module(Ptx::from_binary(fatbin.to_vec()))
        .w()?;
    map.insert((name, dev.id()), m.clone());
    Ok(m)
}

/// The elements of a contiguous tensor's CUDA storage, as a typed view. `what` names the
/// operand in errors (`op: what is not …`).
pub(crate) fn contiguous_view<'a, T: candle_core::cuda_backend::CudaDType>(
    storage: &'a Storage,
    layout: &Layout,
    op: &str,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let Storage::Cuda(s) = storage else {
        candle_core::bail!("{op}: {what} is not on a CUDA device")
    };
    if !layout.is_contiguous() {
        candle_core::bail!("{op}: {what} is not contiguous");
    }
    let start = layout.start_offset();
    Ok(s.as_cuda_slice::<T>()?
        .slice(start..start + layout.shape().elem_count()))
}
