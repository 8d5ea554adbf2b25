//! How forkscore runs candle's CUDA device: two settings of the CUDA runtime that cost host time
//! on every operation with candle's defaults, changed once when a CUDA device is opened.
//!
//! - **Event tracking off.** cudarc creates two CUDA events for every buffer it allocates (and
//!   destroys them when the buffer drops) so that buffers shared between streams can be
//!   synchronised. forkscore issues all of a backend's work on one stream, where those events
//!   are never waited on: they only add four driver calls to every tensor operation. Buffers
//!   allocated after this call carry no events.
//! - **The stream-ordered memory pool keeps what it has.** Every candle output is a fresh
//!   `cuMemAllocAsync` from the device's default pool, whose release threshold is 0 by default:
//!   at every synchronisation (each copy of logits to the host) the pool hands its free memory
//!   back to the driver, and the next forward pass maps it again. The threshold is raised to
//!   "never release", so activation buffers are reused across passes, as PyTorch's caching
//!   allocator does. Memory held this way is at most the largest pass's peak.
//!
//! Neither setting changes what is computed. `FORKSCORE_CUDA_RUNTIME=candle` keeps candle's
//! defaults (the reference for equivalence tests and A/B timings).

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::CudaDevice;

/// Which runtime settings a process uses (`FORKSCORE_CUDA_RUNTIME`: `tuned`, the default, or
/// `candle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeSettings {
    Tuned,
    Candle,
}

impl RuntimeSettings {
    /// From `FORKSCORE_CUDA_RUNTIME`; anything but `candle` is the tuned default.
    pub fn from_env() -> RuntimeSettings {
        match crate::switches::is("FORKSCORE_CUDA_RUNTIME", "candle") {
            true => RuntimeSettings::Candle,
            false => RuntimeSettings::Tuned,
        }
    }
}

/// Apply `settings` to a freshly opened device (before any tensor is allocated on it). A device
/// without stream-ordered allocation (no memory pools) keeps its synchronous allocator.
pub fn apply(dev: &CudaDevice, settings: RuntimeSettings) -> Result<(), String> {
    if settings == RuntimeSettings::Candle {
        return Ok(());
    }
    // SAFETY: forkscore runs each backend's work on the device's one stream; buffers are never
    // handed to another stream, which is what the events would synchronise.
    unsafe { dev.disable_event_tracking() };
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread()
        .map_err(|e| format!("binding the CUDA context: {e}"))?;
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: plain driver calls on a live device; `threshold` outlives the call.
    unsafe {
        let r = sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device());
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuDeviceGetDefaultMemPool: {r:?}"));
        }
        let mut threshold: u64 = u64::MAX;
        let r = sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        );
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuMemPoolSetAttribute(RELEASE_THRESHOLD): {r:?}"));
        }
    }
    Ok(())
}
