//! Start-up on NVIDIA GPUs: candle ships its element-wise, reduction, indexing, … kernels as PTX,
//! which the driver compiles to machine code the first time each module is loaded — seconds per
//! module, ~15–20 s in all on a fresh machine, paid inside the first forward pass. Later
//! processes load the machine code from the driver's compute cache on disk.
//!
//! [`compile_candle_kernels`] starts that compilation at load time, one thread per module in
//! parallel, while the weights are read from disk: each thread loads the module's PTX into the
//! device's context (the driver JIT-compiles it and stores the result in its compute cache) and
//! drops it; candle's own load of the same PTX at first use then finds it in the cache. The
//! quantized-matmul module is skipped (forkscore does not use it). Nothing here changes results:
//! a thread that fails only leaves the compilation to candle, as before.
//!
//! Opt-in (`FORKSCORE_KERNEL_WARMUP=1`), and skipped when the driver's cache is disabled
//! (`CUDA_CACHE_DISABLE=1`: the work would be thrown away). Measured on a fresh machine
//! (seeded Qwen3.5-4B, bf16): without it the first process spent 14.5 s of JIT inside its first
//! prefill and 22.3 s in all; with it the prefill took 0.22 s but the process 28.9 s, because the
//! parallel JIT slowed the weight upload more than it saved. So it stays off by default; a
//! machine's second process needs neither (7.1 s in all, 6.5 s of it loading).

use candle_core::Device;

/// Start compiling candle's CUDA kernel modules in the background (no-op off CUDA).
pub fn compile_candle_kernels(device: &Device) {
    #[cfg(feature = "cuda")]
    cuda::start(device);
    #[cfg(not(feature = "cuda"))]
    let _ = device;
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
    use candle_core::cuda_backend::kernels;
    use candle_core::Device;

    pub(super) fn start(device: &Device) {
        let Device::Cuda(dev) = device else { return };
        let cache_off = std::env::var("CUDA_CACHE_DISABLE").is_ok_and(|v| v.trim() == "1");
        if !crate::switches::is("FORKSCORE_KERNEL_WARMUP", "1") || cache_off {
            return;
        }
        let modules = [
            &kernels::AFFINE,
            &kernels::BINARY,
            &kernels::CAST,
            &kernels::CONV,
            &kernels::FILL,
            &kernels::INDEXING,
            &kernels::REDUCE,
            &kernels::SORT,
            &kernels::TERNARY,
            &kernels::UNARY,
        ];
        for module in modules {
            let ctx = dev.cuda_stream().context().clone();
            let ptx = module.ptx();
            // Detached: the process may start computing (or exit) before a thread finishes.
            let _ = std::thread::Builder::new()
                .name("cuda-kernel-warmup".into())
                .spawn(move || {
                    let _ = ctx.load_module(Ptx::from_src(ptx));
                });
        }
    }
}
