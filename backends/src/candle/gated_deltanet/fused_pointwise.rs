//! Fused CUDA kernels for the point-wise passes around the delta rule (`kernels/cuda/gdn_pointwise.cu`),
//! taken together with [`super::fused`] when [`super::DeltaRule::Fused`] runs:
//!
//! - [`gates`]: `β = σ(b)` and `g = −exp(A_log) · softplus(a + dt_bias)`, zero at right-padded
//!   positions — the same function as [`super::gates`] (`beta`, `log_decay`, `apply_mask`);
//! - [`gated_norm`]: `(w · x · rsqrt(mean(x²) + eps)) · SiLU(z)` over the last dim, written in the
//!   activation dtype — the same function as [`super::norm::gated_rms_norm`] followed by the cast.
//!
//! In: `b, a: (B, L, Hv)` f32, `a_log, dt_bias: (Hv,)` f32, optional per-row lengths;
//! `x, z: (…, dv)` f32, `w: (dv,)` f32. Without the `cuda` feature these return an error and are
//! never called ([`super::fused::supports`] is false).

use candle_core::{DType, Result, Tensor};

/// `(β, g)`, each `(B, L, Hv)` f32; `lengths`: each row's real tokens when right-padded.
#[cfg(feature = "cuda")]
pub fn gates(
    b: &Tensor,
    a: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    lengths: Option<&[usize]>,
) -> Result<(Tensor, Tensor)> {
    cuda::gates(b, a, a_log, dt_bias, lengths)
}

/// The gated RMSNorm of `x` with gate `z` and weight `w`, in `out_dtype` (f32 or bf16).
#[cfg(feature = "cuda")]
pub fn gated_norm(
    x: &Tensor,
    z: &Tensor,
    w: &Tensor,
    eps: f64,
    out_dtype: DType,
) -> Result<Tensor> {
    cuda::gated_norm(x, z, w, eps, out_dtype)
}

/// Without the `cuda` feature there is no fused kernel.
#[cfg(not(feature = "cuda"))]
pub fn gates(
    _b: &Tensor,
    _a: &Tensor,
    _a_log: &Tensor,
    _dt_bias: &Tensor,
    _lengths: Option<&[usize]>,
) -> Result<(Tensor, Tensor)> {
    candle_core::bail!("the fused Gated DeltaNet gates need the `cuda` feature")
}

/// Without the `cuda` feature there is no fused kernel.
#[cfg(not(feature = "cuda"))]
pub fn gated_norm(
    _x: &Tensor,
    _z: &Tensor,
    _w: &Tensor,
    _eps: f64,
    _out_dtype: DType,
) -> Result<Tensor> {
    candle_core::bail!("the fused gated RMSNorm needs the `cuda` feature")
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{
        CudaDevice, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor,
    };
    use half::bf16;

    use crate::candle::cuda::cuda_module::{self, contiguous_view};

    /// nvcc's fat binary of `kernels/cuda/gdn_pointwise.cu` (the `forkscore-kernels` crate).
    static FATBIN: &[u8] = forkscore_kernels::fatbin::GDN_POINTWISE;
    const THREADS: u32 = 256;

    fn function(
        dev: &CudaDevice,
        name: &str,
    ) -> Result<candle_core::cuda_backend::cudarc::driver::CudaFunction> {
        cuda_module::load(dev, "gdn_pointwise", FATBIN)?
            .load_function(name)
            .w()
    }

    fn view<'a>(
        storage: &'a Storage,
        layout: &Layout,
        what: &str,
    ) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, f32>> {
        contiguous_view::<f32>(storage, layout, "fused GDN point-wise", what)
    }

    /// Applied to `b`; one output `[β | g]` of `2·B·L·Hv` f32.
    struct Gates {
        a: Tensor,
        a_log: Tensor,
        dt_bias: Tensor,
        lengths: Option<Tensor>,
    }

    impl CustomOp1 for Gates {
        fn name(&self) -> &'static str {
            "fused-gdn-gates"
        }

        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<(candle_core::CpuStorage, Shape)> {
            candle_core::bail!("the fused Gated DeltaNet gates run on CUDA only")
        }

        fn cuda_fwd(&self, b: &CudaStorage, b_l: &Layout) -> Result<(CudaStorage, Shape)> {
            let (rows, l, hv) = b_l.shape().dims3()?;
            let dev = b.device().clone();
            if !b_l.is_contiguous() {
                candle_core::bail!("fused GDN gates: b is not contiguous");
            }
            let range = b_l.start_offset()..b_l.start_offset() + b_l.shape().elem_count();
            // b and a share a dtype: f32, or bf16 straight from the projections
            let bf16_in = b.dtype() == DType::BF16;
            let (a_s, a_l) = self.a.storage_and_layout();
            let (b_f, a_f, b_h, a_h) = if bf16_in {
                (
                    None,
                    None,
                    Some(b.as_cuda_slice::<bf16>()?.slice(range)),
                    Some(contiguous_view::<bf16>(&a_s, a_l, "fused GDN gates", "a")?),
                )
            } else {
                (
                    Some(b.as_cuda_slice::<f32>()?.slice(range)),
                    Some(view(&a_s, a_l, "a")?),
                    None,
                    None,
                )
            };
            let (al_s, al_l) = self.a_log.storage_and_layout();
            let a_log = view(&al_s, al_l, "A_log")?;
            let (dt_s, dt_l) = self.dt_bias.storage_and_layout();
            let dt = view(&dt_s, dt_l, "dt_bias")?;
            let lens_guard = self.lengths.as_ref().map(|t| t.storage_and_layout());
            let lens = match &lens_guard {
                Some((s, layout)) => Some(contiguous_view::<u32>(
                    s,
                    layout,
                    "fused GDN gates",
                    "lengths",
                )?),
                None => None,
            };
            let n = rows * l * hv;
            // SAFETY: the kernel writes all 2·n elements (β and g of every position).
            let mut out = unsafe { dev.alloc::<f32>(2 * n)? };
            let func = function(
                &dev,
                if bf16_in {
                    "gdn_gates_bf16"
                } else {
                    "gdn_gates"
                },
            )?;
            let cfg = LaunchConfig {
                grid_dim: (
                    (n as u64).div_ceil(THREADS as u64).clamp(1, 1 << 16) as u32,
                    1,
                    1,
                ),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (b_i, l_i, hv_i) = (rows as i32, l as i32, hv as i32);
            let null: u64 = 0;
            let stream = dev.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            match (&b_f, &a_f, &b_h, &a_h) {
                (Some(b), Some(a), _, _) => {
                    builder.arg(b);
                    builder.arg(a);
                }
                (_, _, Some(b), Some(a)) => {
                    builder.arg(b);
                    builder.arg(a);
                }
                _ => candle_core::bail!("fused GDN gates: no input views"),
            }
            builder.arg(&a_log);
            builder.arg(&dt);
            match &lens {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
            builder.arg(&mut out);
            builder.arg(&b_i);
            builder.arg(&l_i);
            builder.arg(&hv_i);
            // SAFETY: argument types and order match the kernel's signature; shapes were
            // checked by `gates`.
            unsafe { builder.launch(cfg) }.w()?;
            drop(builder);
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(2 * n)))
        }
    }

    pub(super) fn gates(
        b: &Tensor,
        a: &Tensor,
        a_log: &Tensor,
        dt_bias: &Tensor,
        lengths: Option<&[usize]>,
    ) -> Result<(Tensor, Tensor)> {
        let (rows, l, hv) = b.dims3()?;
        if a.dims() != b.dims() || a_log.dims() != [hv] || dt_bias.dims() != [hv] {
            candle_core::bail!(
                "fused GDN gates: b {:?}, a {:?}, A_log {:?}, dt_bias {:?} do not fit",
                b.dims(),
                a.dims(),
                a_log.dims(),
                dt_bias.dims()
            );
        }
        let lengths = match lengths {
            Some(ls) => {
                if ls.len() != rows || ls.iter().any(|&n| n > l) {
                    candle_core::bail!("fused GDN gates: lengths {ls:?} for a ({rows}, {l}) call");
                }
                let v: Vec<u32> = ls.iter().map(|&n| n as u32).collect();
                Some(Tensor::new(v.as_slice(), b.device())?)
            }
            None => None,
        };
        let f32c = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
        // b and a in bf16 are read as they are (exact upcast in the kernel), else as f32
        let both_bf16 = b.dtype() == DType::BF16 && a.dtype() == DType::BF16;
        let input = |t: &Tensor| if both_bf16 { t.contiguous() } else { f32c(t) };
        let op = Gates {
            a: input(a)?,
            a_log: f32c(a_log)?,
            dt_bias: f32c(dt_bias)?,
            lengths,
        };
        // (2·B·L·Hv,) -> (B, L, Hv) ×2
        let flat = input(b)?.apply_op1_no_bwd(&op)?;
        let n = rows * l * hv;
        let beta = flat.narrow(0, 0, n)?.reshape((rows, l, hv))?;
        let g = flat.narrow(0, n, n)?.reshape((rows, l, hv))?;
        Ok((beta, g))
    }

    /// Applied to `x`; output `(…, dv)` in `out`.
    struct GatedNorm {
        z: Tensor,
        w: Tensor,
        eps: f32,
        out: DType,
    }

    impl CustomOp1 for GatedNorm {
        fn name(&self) -> &'static str {
            "fused-gated-rms-norm"
        }

        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<(candle_core::CpuStorage, Shape)> {
            candle_core::bail!("the fused gated RMSNorm runs on CUDA only")
        }

        fn cuda_fwd(&self, x: &CudaStorage, x_l: &Layout) -> Result<(CudaStorage, Shape)> {
            let shape = x_l.shape().clone();
            let dv = shape.dims().last().copied().unwrap_or(0);
            let n = shape.elem_count();
            let rows = if dv == 0 { 0 } else { n / dv };
            let dev = x.device().clone();
            if !x_l.is_contiguous() {
                candle_core::bail!("fused gated norm: x is not contiguous");
            }
            let start = x_l.start_offset();
            let x_v = x.as_cuda_slice::<f32>()?.slice(start..start + n);
            let (z_s, z_l) = self.z.storage_and_layout();
            let (w_s, w_l) = self.w.storage_and_layout();
            let w = view(&w_s, w_l, "w")?;
            let warps_per_block = (THREADS / 32) as usize;
            let cfg = LaunchConfig {
                grid_dim: (
                    rows.div_ceil(warps_per_block).clamp(1, 1 << 16) as u32,
                    1,
                    1,
                ),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (rows, dv) = (rows as i32, dv as i32);
            let storage = match (self.z.dtype(), self.out) {
                (DType::BF16, DType::BF16) => {
                    let z = contiguous_view::<bf16>(&z_s, z_l, "fused gated norm", "z")?;
                    let args = NormArgs {
                        x: &x_v,
                        z: &z,
                        w: &w,
                        rows,
                        dv,
                        eps: self.eps,
                        cfg,
                    };
                    launch_norm::<bf16, bf16>(&dev, "gdn_gated_norm_bf16_zbf16", n, &args)?
                }
                (DType::F32, out) => {
                    let z = view(&z_s, z_l, "z")?;
                    let args = NormArgs {
                        x: &x_v,
                        z: &z,
                        w: &w,
                        rows,
                        dv,
                        eps: self.eps,
                        cfg,
                    };
                    match out {
                        DType::BF16 => {
                            launch_norm::<bf16, f32>(&dev, "gdn_gated_norm_bf16", n, &args)?
                        }
                        DType::F32 => {
                            launch_norm::<f32, f32>(&dev, "gdn_gated_norm_f32", n, &args)?
                        }
                        other => candle_core::bail!("fused gated norm: no {other:?} output"),
                    }
                }
                (z, out) => {
                    candle_core::bail!("fused gated norm: no kernel for z {z:?} -> {out:?}")
                }
            };
            Ok((storage, shape))
        }
    }

    /// The operands of one gated-norm launch.
    struct NormArgs<'a, Z> {
        x: &'a CudaView<'a, f32>,
        z: &'a CudaView<'a, Z>,
        w: &'a CudaView<'a, f32>,
        rows: i32,
        dv: i32,
        eps: f32,
        cfg: LaunchConfig,
    }

    /// Launch the gated-norm kernel `name` writing `n` elements of `T`.
    fn launch_norm<T: CudaDType + DeviceRepr, Z: DeviceRepr>(
        dev: &CudaDevice,
        name: &str,
        n: usize,
        a: &NormArgs<'_, Z>,
    ) -> Result<CudaStorage> {
        // SAFETY: the kernel writes every element of every row.
        let mut out = unsafe { dev.alloc::<T>(n)? };
        let func = function(dev, name)?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(a.x);
        builder.arg(a.z);
        builder.arg(a.w);
        builder.arg(&mut out);
        builder.arg(&a.rows);
        builder.arg(&a.dv);
        builder.arg(&a.eps);
        // SAFETY: argument types and order match the kernel's signature.
        unsafe { builder.launch(a.cfg) }.w()?;
        drop(builder);
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    }

    pub(super) fn gated_norm(
        x: &Tensor,
        z: &Tensor,
        w: &Tensor,
        eps: f64,
        out_dtype: DType,
    ) -> Result<Tensor> {
        let dv = x.dims().last().copied().unwrap_or(0);
        if z.dims() != x.dims() || w.dims() != [dv] {
            candle_core::bail!(
                "fused gated norm: x {:?}, z {:?}, w {:?} do not fit",
                x.dims(),
                z.dims(),
                w.dims()
            );
        }
        let f32c = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
        // a bf16 gate feeding a bf16 output is read as is (exact upcast in the kernel)
        let z = if z.dtype() == DType::BF16 && out_dtype == DType::BF16 {
            z.contiguous()?
        } else {
            f32c(z)?
        };
        let op = GatedNorm {
            z,
            w: f32c(w)?,
            eps: eps as f32,
            out: out_dtype,
        };
        f32c(x)?.apply_op1_no_bwd(&op)
    }
}
