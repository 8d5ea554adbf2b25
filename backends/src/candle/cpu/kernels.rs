//! The CPU linear kernels ([`super::gemm`], [`super::qgemm`], [`super::q4gemm`],
//! [`super::bf16gemm`]) and the CPU attention
//! kernel ([`super::attention`]) on their own, for the `cpu_linear` and `cpu_attention`
//! benches: pack a weight once, then time products at one blocking after another in one
//! process. Not part of the engine's API (the model layers reach the kernels through
//! `linear`); hidden from the docs.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;

use super::super::layers::mask::NewKeysMask;
use super::super::layers::past_kv::PastKv;
use super::amx::AmxWeight;
use super::bf16gemm::{Bf16Kernel, PackedBf16};
use super::gemm::{Blocking, PackedWeight};
use super::isa::Isa;
use super::q4gemm::PackedQ4;
use super::qgemm::PackedQ8;
use crate::error::CandleError;

fn tensor_err(op: &'static str) -> impl Fn(candle_core::Error) -> CandleError {
    move |source| CandleError::Tensor { op, source }
}

/// The level named `name` (`avx2`, `avxvnni`, `avx512`), if this CPU has it; an error names
/// an unknown or missing one.
fn named_isa(name: &str) -> Result<Isa, CandleError> {
    match Isa::from_name(name) {
        Some(l) if Isa::supported().contains(&l) => Ok(l),
        Some(_) => Err(CandleError::Device {
            reason: format!("this CPU has no {name}"),
        }),
        None => Err(CandleError::InvalidRequest {
            reason: format!("unknown instruction level `{name}` (avx2, avxvnni, avx512)"),
        }),
    }
}

/// The instruction levels this CPU's kernels can run, narrowest first (`"avx2"`, `"avxvnni"`,
/// `"avx512"`).
pub fn levels() -> Vec<&'static str> {
    Isa::supported().iter().map(|l| l.name()).collect()
}

fn chosen_isa() -> Result<Isa, CandleError> {
    Isa::chosen().ok_or_else(|| CandleError::Device {
        reason: "the CPU kernels need x86-64 with AVX2 + FMA".into(),
    })
}

/// An f32 weight `(out, in)` packed for the f32 kernel.
pub struct F32Weight(PackedWeight);

impl F32Weight {
    /// Pack `w (out, in)` (any float dtype).
    pub fn pack(w: &Tensor) -> Result<Self, CandleError> {
        PackedWeight::pack(w)
            .map(F32Weight)
            .map_err(tensor_err("pack f32 weight"))
    }
}

/// An f32 weight `(out, in)` split into bf16 planes for the AMX kernel.
pub struct AmxF32Weight(AmxWeight);

impl AmxF32Weight {
    /// Split `w (out, in)` (any float dtype).
    pub fn pack(w: &Tensor) -> Result<Self, CandleError> {
        AmxWeight::pack(w)
            .map(AmxF32Weight)
            .map_err(tensor_err("split f32 weight"))
    }
}

/// Whether the AMX bf16 × 6 f32 kernel runs on this CPU (AMX tiles granted), whether or not
/// the model's layers use it (they do with `FORKSCORE_CPU_GEMM=amx`).
pub fn amx() -> bool {
    super::amx::available()
}

/// A blocking of the AMX kernel, parsed once (`mc=…,pf=…` over the default, as
/// `FORKSCORE_CPU_AMX`; an error names a wrong key or value).
pub struct AmxBlocking(super::amx::AmxBlocking);

impl AmxBlocking {
    pub fn parse(spec: &str) -> Result<Self, CandleError> {
        super::amx::AmxBlocking::parse(spec)
            .map(AmxBlocking)
            .map_err(|reason| CandleError::InvalidRequest {
                reason: format!("amx blocking `{spec}`: {reason}"),
            })
    }
}

/// `x (.., in) · Wᵀ` through the AMX kernel with blocking `bl` (an error where AMX does not
/// run).
pub fn linear_amx(x: &Tensor, w: &AmxF32Weight, bl: &AmxBlocking) -> Result<Tensor, CandleError> {
    super::amx::linear_with(x, &w.0, &bl.0).map_err(tensor_err("amx f32 linear"))
}

/// A weight `(out, in)` quantized to `Q8_0` and packed for the integer kernel of the chosen
/// instruction level.
pub struct Q8Weight(PackedQ8);

impl Q8Weight {
    /// Quantize `w (out, in)` (f32; `in` a multiple of 32) the way `--quantize q8_0` does, and
    /// pack it.
    pub fn quantize(w: &Tensor) -> Result<Self, CandleError> {
        Self::quantize_for(w, chosen_isa()?.name())
    }

    /// [`Q8Weight::quantize`] for the kernel of the level named `level` (which this CPU must
    /// have), to compare levels in one process.
    pub fn quantize_for(w: &Tensor, level: &str) -> Result<Self, CandleError> {
        let isa = named_isa(level)?;
        let (n, k) = w.dims2().map_err(tensor_err("q8_0 weight dims"))?;
        let q = QTensor::quantize(w, GgmlDType::Q8_0).map_err(tensor_err("quantize q8_0"))?;
        let bytes = q.data().map_err(tensor_err("q8_0 bytes"))?;
        PackedQ8::from_blocks(&bytes, n, k, isa)
            .map(Q8Weight)
            .ok_or_else(|| CandleError::Quantize {
                name: format!("({n}, {k}) weight"),
                reason: "in is not a multiple of 32".into(),
            })
    }
}

/// A weight `(out, in)` quantized to `Q4_0` or `Q4_K` and packed for the 4-bit integer kernel
/// of the chosen instruction level.
pub struct Q4Weight(PackedQ4);

impl Q4Weight {
    /// Quantize `w (out, in)` (f32) to `ggml` (`Q4_0`: `in` a multiple of 32; `Q4_K`: of 256)
    /// the way `--quantize q4k` does, and pack it. Another type is an error.
    pub fn quantize(w: &Tensor, ggml: GgmlDType) -> Result<Self, CandleError> {
        Self::quantize_for(w, ggml, chosen_isa()?.name())
    }

    /// [`Q4Weight::quantize`] for the kernel of the level named `level` (which this CPU must
    /// have).
    pub fn quantize_for(w: &Tensor, ggml: GgmlDType, level: &str) -> Result<Self, CandleError> {
        let isa = named_isa(level)?;
        let (n, k) = w.dims2().map_err(tensor_err("4-bit weight dims"))?;
        let name = format!("({n}, {k}) weight");
        if !matches!(ggml, GgmlDType::Q4_0 | GgmlDType::Q4K) || !k.is_multiple_of(ggml.block_size())
        {
            return Err(CandleError::Quantize {
                name,
                reason: format!("{ggml:?} does not fit: 4-bit kernels take Q4_0 (in a multiple of 32) or Q4K (of 256)"),
            });
        }
        let q = QTensor::quantize(w, ggml).map_err(tensor_err("quantize 4-bit"))?;
        let bytes = q.data().map_err(tensor_err("4-bit bytes"))?;
        PackedQ4::from_blocks(ggml, &bytes, n, k, isa)
            .map(Q4Weight)
            .ok_or_else(|| CandleError::Quantize {
                name,
                reason: "the blocks do not fit the shape".into(),
            })
    }
}

/// `x (.., in) · Wᵀ` (f32 `x`; another dtype is an error) through the 4-bit integer kernel.
pub fn linear_q4(x: &Tensor, w: &Q4Weight) -> Result<Tensor, CandleError> {
    super::q4gemm::linear(x, &w.0).map_err(tensor_err("4-bit linear"))
}

/// The instruction level the kernels run with here (`"avx512"` / `"avx2"`), or `None`.
pub fn isa() -> Option<&'static str> {
    Isa::chosen().map(Isa::name)
}

/// A blocking of the f32 kernel on this CPU, parsed once (`key=value,…` over the default, see
/// `FORKSCORE_CPU_GEMM_BLOCKING`; an error names a wrong key or value). `Display` prints it
/// resolved, as `mr=…,kc=…,mc=…,nc=…,short_k=…,pf=…`.
pub struct F32Blocking(Isa, Blocking);

impl F32Blocking {
    pub fn parse(spec: &str) -> Result<Self, CandleError> {
        let isa = chosen_isa()?.f32_level();
        Blocking::parse(spec, isa)
            .map(|b| F32Blocking(isa, b))
            .map_err(|reason| CandleError::InvalidRequest {
                reason: format!("blocking `{spec}`: {reason}"),
            })
    }
}

impl std::fmt::Display for F32Blocking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = &self.1;
        write!(
            f,
            "mr={},kc={},mc={},nc={},short_k={},pf={}",
            b.mr, b.kc, b.mc, b.nc, b.short_k, b.pf
        )
    }
}

/// `x (.., in) · Wᵀ` through the f32 kernel with blocking `bl`.
pub fn linear_f32(x: &Tensor, w: &F32Weight, bl: &F32Blocking) -> Result<Tensor, CandleError> {
    super::gemm::linear_with(x, &w.0, bl.0, &bl.1).map_err(tensor_err("packed f32 linear"))
}

/// How many 32-value blocks ahead the `Q8_0` kernel's AVX-512 and AVX-VNNI tiles prefetch
/// their weights from now on, in this process (0: none; `usize::MAX`: each level's default;
/// `FORKSCORE_CPU_QPREFETCH` sets it for a whole run).
pub fn set_q8_prefetch(blocks: usize) {
    super::qgemm::set_prefetch(blocks)
}

/// `x (.., in) · Wᵀ` (f32 `x`; another dtype is an error) through the `Q8_0` integer kernel.
pub fn linear_q8(x: &Tensor, w: &Q8Weight) -> Result<Tensor, CandleError> {
    super::amx::q8_linear(x, &w.0).map_err(tensor_err("q8_0 linear"))
}

/// A weight `(out, in)` rounded to bf16 and packed for the kernel `--quantize bf16` takes on
/// this CPU (AMX tiles with one part, or AVX-512 BF16).
pub struct Bf16Weight(Bf16Packed);

enum Bf16Packed {
    Amx(AmxWeight),
    Dot(PackedBf16),
}

impl Bf16Weight {
    /// Round and pack `w (out, in)` (any float dtype) for the chosen kernel; an error where
    /// bf16 weights take candle's matmul.
    pub fn pack(w: &Tensor) -> Result<Self, CandleError> {
        let err = tensor_err("pack bf16 weight");
        match super::bf16gemm::kernel().map_err(&err)? {
            Bf16Kernel::Amx => AmxWeight::pack_bf16(w).map(Bf16Packed::Amx),
            Bf16Kernel::Dot => PackedBf16::pack(w).map(Bf16Packed::Dot),
            Bf16Kernel::Candle => {
                return Err(CandleError::Device {
                    reason: "bf16 weights take candle's matmul on this CPU".into(),
                })
            }
        }
        .map(Bf16Weight)
        .map_err(err)
    }
}

/// The kernel bf16 weights run on this CPU (`"amx"`, `"dot"`), or `None` (candle's matmul).
pub fn bf16_kernel() -> Option<&'static str> {
    match super::bf16gemm::kernel() {
        Ok(Bf16Kernel::Amx) => Some("amx"),
        Ok(Bf16Kernel::Dot) => Some("dot"),
        _ => None,
    }
}

/// `x (.., in) · Wᵀ` (f32 `x`) through the bf16 weight's kernel.
pub fn linear_bf16(x: &Tensor, w: &Bf16Weight) -> Result<Tensor, CandleError> {
    match &w.0 {
        Bf16Packed::Amx(w) => super::amx::linear(x, w),
        Bf16Packed::Dot(w) => super::bf16gemm::linear(x, w),
    }
    .map_err(tensor_err("bf16 linear"))
}

/// The tile sizes the CPU attention kernel runs [`attention`] with.
pub struct AttentionPath(super::attention::TileSizes);

impl AttentionPath {
    /// `query_block=…,tile_rows=…,key_block=…,form=auto|products` over the default (as `FORKSCORE_CPU_ATTENTION`; an error
    /// names a wrong key or value).
    pub fn parse(sizes: &str) -> Result<Self, CandleError> {
        super::attention::TileSizes::parse(sizes)
            .map(AttentionPath)
            .map_err(|reason| CandleError::InvalidRequest {
                reason: format!("attention tile sizes `{sizes}`: {reason}"),
            })
    }
}

/// Causal attention of `q (B, H, L, hd)` over new keys / values `(B, Hkv, L, hd)` and, when
/// given, a past `(Hkv, 1, P, hd)` every row sees whole: a prefill (`B` 1, no past) or a
/// scoring pass (many short rows over one prefix). `(B, L, H·hd)`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    past: Option<(&Tensor, &Tensor)>,
    path: &AttentionPath,
) -> Result<Tensor, CandleError> {
    let l = q.dims4().map_err(tensor_err("attention q dims"))?.2;
    let mask = (l > 1).then(|| NewKeysMask::causal(l, q.device()));
    let past = past.map(|(k, v)| PastKv { k, v });
    if !super::attention::supports(q, k, v, past.as_ref()) {
        return Err(CandleError::InvalidRequest {
            reason: "the CPU attention kernel takes f32 CPU tensors with grouped heads".into(),
        });
    }
    super::attention::attend_with(q, k, v, past.as_ref(), None, mask.as_ref(), path.0)
}
