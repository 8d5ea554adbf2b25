//! The tensor-facing shell of the bf16-weight kernel (`forkscore_kernels::cpu::bf16`, AVX-512
//! BF16 `vdpbf16ps`, `--quantize bf16`): which kernel an f32 model's bf16 weights take on this
//! CPU ([`kernel`]: AMX tiles, this kernel, or candle's matmul), weights packed from tensors and
//! `x (.., k) · Wᵀ` on tensors with the f32 kernel's AVX-512 blocking.

use candle_core::{Result, Tensor};
use forkscore_kernels::cpu::bf16 as kernel;

use super::gemm::{chosen_blocking, Blocking};
use super::host::{kernel_err, PackTensor};
use super::isa::Isa;

pub(crate) use kernel::PackedBf16;

impl PackTensor for PackedBf16 {
    fn from_host_rows(w: &[f32], n: usize, k: usize) -> Self {
        PackedBf16::from_rows(w, n, k)
    }
}

/// The kernel an f32 model's bf16 weights run on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bf16Kernel {
    /// AMX bf16 tiles, one product per tile pair ([`super::amx`], one part).
    Amx,
    /// AVX-512 BF16 `vdpbf16ps` (`forkscore_kernels::cpu::bf16`).
    Dot,
    /// A bf16 tensor through candle's matmul.
    Candle,
}

impl Bf16Kernel {
    /// The kernel for `asked` (`FORKSCORE_CPU_BF16`, trimmed; empty when unset) on a CPU where
    /// AMX runs (`amx`) and the AVX-512 BF16 kernel runs (`dot`): the fastest one that runs,
    /// `amx` first; `dot` skips AMX; `candle` keeps candle's matmul. Anything else is an error
    /// naming the choices.
    pub(crate) fn choose(asked: &str, amx: bool, dot: bool) -> std::result::Result<Self, String> {
        let fallback = match dot {
            true => Bf16Kernel::Dot,
            false => Bf16Kernel::Candle,
        };
        match asked.to_ascii_lowercase().as_str() {
            "" | "amx" if amx => Ok(Bf16Kernel::Amx),
            "" | "amx" | "dot" => Ok(fallback),
            "candle" => Ok(Bf16Kernel::Candle),
            other => Err(format!("`{other}`: expected amx, dot or candle")),
        }
    }
}

/// The kernel this process runs bf16 weights with: [`Bf16Kernel::choose`] over
/// `FORKSCORE_CPU_BF16`, AMX tiles (`forkscore_kernels::cpu::amx::available`) and [`kernel::available`]; candle's
/// matmul when `FORKSCORE_CPU_GEMM` asks for candle's (or the CPU has no packed kernels).
/// Read once; an invalid value is an error naming it.
pub(crate) fn kernel() -> Result<Bf16Kernel> {
    use std::sync::OnceLock;
    static K: OnceLock<std::result::Result<Bf16Kernel, String>> = OnceLock::new();
    let chosen = K.get_or_init(|| {
        let asked = crate::switches::value("FORKSCORE_CPU_BF16").unwrap_or_default();
        let packed = super::gemm::choice() == super::gemm::CpuGemm::Packed;
        Bf16Kernel::choose(
            asked.trim(),
            packed && super::amx::tiles_run(),
            packed && kernel::available(),
        )
        .map_err(|e| format!("FORKSCORE_CPU_BF16={asked:?}: {e}"))
    });
    chosen.clone().map_err(candle_core::Error::Msg)
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU through the bf16 kernel, with the f32 kernel's
/// blocking for AVX-512 ([`chosen_blocking`], in pair units). Errors (never panics) on a
/// non-f32, non-CPU or mis-sized `x`, or a CPU where the kernel does not run.
pub(crate) fn linear(x: &Tensor, w: &PackedBf16) -> Result<Tensor> {
    linear_with(x, w, &chosen_blocking(Isa::Avx512)?)
}

/// [`linear`] with blocking `bl` (an error if a count is 0, `mr` is over the AVX-512 tile's
/// 14 rows, or `mc` is not a multiple of `mr`).
pub(crate) fn linear_with(x: &Tensor, w: &PackedBf16, bl: &Blocking) -> Result<Tensor> {
    let ready = || kernel::check(bl).map_err(kernel_err);
    super::host::try_apply_rows(x, w.dims(), "bf16 linear", ready, |xd, m| {
        kernel::product(xd, m, w, bl).map_err(kernel_err)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// `len` values uniform in [-1, 1).
    fn random(len: usize) -> Vec<f32> {
        Tensor::rand(-1f32, 1.0, len, &Device::Cpu)
            .and_then(|t| t.to_vec1())
            .expect("random values")
    }

    /// A 3-D input and a strided (transposed) one take the path of their contiguous rows.
    #[test]
    fn shaped_inputs_take_the_same_path() -> Result<()> {
        if !kernel::has_bf16_dot() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return Ok(());
        }
        // a 3-D input and a strided (transposed) one
        let (n, k) = (40, 96);
        let w = PackedBf16::from_rows(&random(n * k), n, k);
        let x3 = Tensor::from_vec(random(2 * 5 * k), (2, 5, k), &Device::Cpu)?;
        let y3 = linear(&x3, &w)?;
        assert_eq!(y3.dims(), [2, 5, n]);
        let flat = linear(&x3.reshape((10, k))?, &w)?;
        assert_eq!(
            y3.flatten_all()?.to_vec1::<f32>()?,
            flat.flatten_all()?.to_vec1::<f32>()?
        );
        let xt = Tensor::from_vec(random(k * 6), (k, 6), &Device::Cpu)?.t()?;
        let yt = linear(&xt, &w)?;
        let yc = linear(&xt.contiguous()?, &w)?;
        assert_eq!(
            yt.flatten_all()?.to_vec1::<f32>()?,
            yc.flatten_all()?.to_vec1::<f32>()?
        );
        Ok(())
    }

    /// AMX first where it runs, then the AVX-512 BF16 kernel, then candle's matmul; `dot`
    /// skips AMX, `candle` takes candle's; an unknown name is an error naming the choices.
    #[test]
    fn the_kernel_choice_follows_the_cpu_and_the_variable() {
        use Bf16Kernel::*;
        let choose = |asked: &str, amx, dot| Bf16Kernel::choose(asked, amx, dot);
        assert_eq!(choose("", true, true), Ok(Amx));
        assert_eq!(choose("", false, true), Ok(Dot));
        assert_eq!(choose("", false, false), Ok(Candle));
        assert_eq!(choose("AMX", false, true), Ok(Dot));
        assert_eq!(choose("dot", true, true), Ok(Dot));
        assert_eq!(choose("dot", true, false), Ok(Candle));
        assert_eq!(choose("candle", true, true), Ok(Candle));
        let e = choose("avx", true, true).expect_err("unknown");
        assert!(
            e.contains("`avx`") && e.contains("amx, dot or candle"),
            "{e}"
        );
    }

    /// A mis-sized, non-f32 or empty input is an error or an empty result, never a panic;
    /// a blocking the tile cannot hold is an error.
    #[test]
    fn misfits_are_errors() -> Result<()> {
        let w = PackedBf16::from_rows(&random(16 * 8), 16, 8);
        let wrong = Tensor::zeros((2, 9), DType::F32, &Device::Cpu)?;
        assert!(linear(&wrong, &w).is_err());
        let bf = Tensor::zeros((2, 8), DType::BF16, &Device::Cpu)?;
        assert!(linear(&bf, &w).is_err());
        let empty = Tensor::zeros((0, 8), DType::F32, &Device::Cpu)?;
        assert_eq!(linear(&empty, &w)?.dims(), [0, 16]);
        if kernel::has_bf16_dot() {
            let mut bl = Blocking::default_for(Isa::Avx512);
            bl.mr = 15;
            let x = Tensor::zeros((2, 8), DType::F32, &Device::Cpu)?;
            let err = linear_with(&x, &w, &bl)
                .expect_err("15-row tile")
                .to_string();
            assert!(err.contains("does not fit"), "{err}");
        }
        Ok(())
    }
}
