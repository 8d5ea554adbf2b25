//! The fused causal conv + SiLU of a Gated DeltaNet layer on CUDA (`gdn_causal_conv_silu*`
//! and the paired `gdn_conv_pairs*` of `kernels/cuda/gdn_recurrent.cu`): the op, its launch
//! and the checks of [`conv`]; the delta rule's shells are in [`super::cuda`].

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor};

use super::cuda::{check_slots, cuda_f32, cuda_u32, module};

/// The conv op: applied to `p`, holding the state, weight and lengths. One output, the flat
/// concatenation `[out (B·L·Cc) | new_state (B·(Kc−1)·Cc)]`, split by [`conv`].
struct CausalConvSilu {
    state: Tensor,
    /// `(B,)` u32: the state row each batch row continues (None: row b continues row b).
    /// Only with the paired kernel ([`conv`] gathers the state rows for the other one).
    slots: Option<Tensor>,
    /// The paired kernel runs ([`takes_pairs`], decided by [`conv`] on the input it passes).
    pairs: bool,
    weight: Tensor,
    /// `(B,)` u32 lengths, or None when no row is padded.
    lengths: Option<Tensor>,
    /// `(B, L)` of the call (`p` is `(B, L, Cc)`, or a packed `(1, T, Cc)` with `row_start`).
    batch: (usize, usize),
    /// `(B,)` u32: the first row of batch row `b` in a packed `p` (paired kernel only).
    row_start: Option<Tensor>,
}

/// Whether the conv can read a packed `p (1, T, Cc)` of `rows` rows of at most `lmax` tokens
/// through row starts (the paired kernel) instead of a right-padded copy.
pub(super) fn reads_packed(p: &Tensor, weight: &Tensor, rows: usize, lmax: usize) -> bool {
    let (Ok((one, _, cc)), Ok((_, kc))) = (p.dims3(), weight.dims2()) else {
        return false;
    };
    one == 1
        && p.is_contiguous()
        && matches!(p.dtype(), DType::BF16 | DType::F32)
        && takes_pairs(rows, lmax, cc, kc, p.layout().start_offset())
}

/// Tokens per thread of the paired conv kernel (`CONV_RUN` of the kernel source).
const CONV_RUN: usize = 16;
/// Threads per block of the paired conv kernel (each owns two channels).
const CONV_PAIR_THREADS: usize = 128;

/// Whether a conv call can take the paired kernel (`gdn_conv_pairs*`: two channels per
/// thread, taps in registers, state rows read through a slot map): an even channel count
/// and an even start of `p` (pair loads are 4- / 8-byte aligned), 2 ≤ Kc ≤ 8 (the widths it
/// is instantiated for), and a grid within CUDA's limits.
fn takes_pairs(b: usize, l: usize, cc: usize, kc: usize, p_start: usize) -> bool {
    cc % 2 == 0
        && p_start % 2 == 0
        && (2..=8).contains(&kc)
        && b <= 65_535
        && l.div_ceil(CONV_RUN) < 65_535
}

impl CustomOp1 for CausalConvSilu {
    fn name(&self) -> &'static str {
        "fused-causal-conv-silu"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("the fused causal conv runs on CUDA only")
    }

    fn cuda_fwd(&self, p: &CudaStorage, p_l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (_, _, cc) = p_l.shape().dims3()?;
        let (b, l) = self.batch;
        let kc = self.weight.dim(1)?;
        let dev = p.device().clone();
        if !p_l.is_contiguous() {
            candle_core::bail!("fused conv: p is not contiguous");
        }
        let range = p_l.start_offset()..p_l.start_offset() + p_l.shape().elem_count();
        // p in f32, or bf16 straight from the projection (the `_bf16` kernel upcasts)
        let (p_f32, p_bf16, kernel) = match p.dtype() {
            DType::F32 => (
                Some(p.as_cuda_slice::<f32>()?.slice(range)),
                None,
                "gdn_causal_conv_silu",
            ),
            DType::BF16 => (
                None,
                Some(p.as_cuda_slice::<half::bf16>()?.slice(range)),
                "gdn_causal_conv_silu_bf16",
            ),
            other => candle_core::bail!("fused conv: p is {other:?}, expected f32 or bf16"),
        };
        let (st_s, st_l) = self.state.storage_and_layout();
        let st = cuda_f32(&st_s, st_l, "conv state")?;
        let (w_s, w_l) = self.weight.storage_and_layout();
        let w = cuda_f32(&w_s, w_l, "conv weight")?;
        let lens_guard = self.lengths.as_ref().map(|t| t.storage_and_layout());
        let lens = match &lens_guard {
            Some((s, layout)) => {
                let Storage::Cuda(s) = &**s else {
                    candle_core::bail!("fused conv: lengths are not on a CUDA device")
                };
                let o = layout.start_offset();
                Some(s.as_cuda_slice::<u32>()?.slice(o..o + b))
            }
            None => None,
        };
        let slots_guard = self.slots.as_ref().map(|t| t.storage_and_layout());
        let slots = match &slots_guard {
            Some((s, layout)) => Some(cuda_u32(s, layout, "slot_of_row")?),
            None => None,
        };
        let starts_guard = self.row_start.as_ref().map(|t| t.storage_and_layout());
        let starts = match &starts_guard {
            Some((s, layout)) => Some(cuda_u32(s, layout, "row_start")?),
            None => None,
        };
        let pairs = self.pairs;
        if (slots.is_some() || starts.is_some()) && !pairs {
            candle_core::bail!("fused conv: a slot map or a packed input needs the paired kernel");
        }
        let n_out = b * l * cc;
        let n_state = b * (kc - 1) * cc;
        // SAFETY: the kernel writes every output element and every state element.
        let mut dst = unsafe { dev.alloc::<f32>(n_out + n_state)? };
        let (mut out, mut ns) = dst.split_at_mut(n_out);
        let kernel = match (pairs, p_bf16.is_some()) {
            (true, true) => "gdn_conv_pairs_bf16",
            (true, false) => "gdn_conv_pairs",
            (false, _) => kernel,
        };
        let func = module(&dev)?.load_function(kernel).w()?;
        let stream = dev.cuda_stream();
        let cfg = if pairs {
            // a thread per channel pair and run of CONV_RUN tokens of one row; one more row
            // block per batch row writes its new state
            LaunchConfig {
                grid_dim: (
                    (cc / 2).div_ceil(CONV_PAIR_THREADS) as u32,
                    (l.div_ceil(CONV_RUN) + 1) as u32,
                    b as u32,
                ),
                block_dim: (CONV_PAIR_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            }
        } else {
            // one thread per channel, each row block taking runs of CONV_ROWS of the
            // B·L + B·(Kc−1) rows (the kernel's constant)
            const CONV_ROWS: usize = 16;
            let rows = b * l + b * (kc - 1);
            LaunchConfig {
                grid_dim: (
                    cc.div_ceil(256) as u32,
                    rows.div_ceil(CONV_ROWS).clamp(1, 65_535) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            }
        };
        let (b_i, l_i, cc_i, kc_i) = (b as i32, l as i32, cc as i32, kc as i32);
        let null: u64 = 0;
        let mut builder = stream.launch_builder(&func);
        match (&p_f32, &p_bf16) {
            (Some(v), _) => builder.arg(v),
            (_, Some(v)) => builder.arg(v),
            _ => candle_core::bail!("fused conv: no input view"),
        };
        builder.arg(&st);
        builder.arg(&w);
        match &lens {
            Some(v) => builder.arg(v),
            None => builder.arg(&null),
        };
        if pairs {
            match &slots {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
            match &starts {
                Some(v) => builder.arg(v),
                None => builder.arg(&null),
            };
        }
        builder.arg(&mut out);
        builder.arg(&mut ns);
        if !pairs {
            builder.arg(&b_i);
        }
        builder.arg(&l_i);
        builder.arg(&cc_i);
        builder.arg(&kc_i);
        // SAFETY: argument types and order match the chosen kernel's signature (the paired
        // kernel takes the slot map and the row starts after the lengths and no batch size: its
        // grid has it);
        // shapes were checked by `conv`.
        unsafe { builder.launch(cfg) }.w()?;
        drop(builder);
        Ok((
            CudaStorage::wrap_cuda_slice(dst, dev),
            Shape::from(n_out + n_state),
        ))
    }
}

pub(super) fn conv(
    p: &Tensor,
    state: &Tensor,
    slot_of_row: Option<&Tensor>,
    weight: &Tensor,
    lengths: Option<&[usize]>,
    packed: Option<(&[usize], usize)>,
) -> Result<(Tensor, Tensor)> {
    let (b, l, cc) = match packed {
        Some((starts, lmax)) => {
            let (one, total, cc) = p.dims3()?;
            let lens = lengths.map_or_else(|| vec![lmax; starts.len()], <[usize]>::to_vec);
            let over = starts.iter().zip(&lens).any(|(&s, &n)| s + n > total);
            if one != 1 || lens.len() != starts.len() || over {
                candle_core::bail!(
                    "fused conv: packed rows {starts:?} of lengths {lens:?} over p {:?}",
                    p.dims()
                );
            }
            if !reads_packed(p, weight, starts.len(), lmax) {
                candle_core::bail!("fused conv: this packed call cannot take the paired kernel");
            }
            (starts.len(), lmax, cc)
        }
        None => p.dims3()?,
    };
    let (wc, kc) = weight.dims2()?;
    let states = check_slots(slot_of_row, b, state.dim(0)?)?;
    if wc != cc || kc == 0 || state.dims() != [states, kc - 1, cc] {
        candle_core::bail!(
            "fused conv: p {:?}, state {:?}, weight {:?} do not fit",
            p.dims(),
            state.dims(),
            weight.dims()
        );
    }
    let lengths = match lengths {
        Some(ls) => {
            if ls.len() != b || ls.iter().any(|&n| n == 0 || n > l) {
                candle_core::bail!("fused conv: lengths {ls:?} for a ({b}, {l}) call");
            }
            let v: Vec<u32> = ls.iter().map(|&n| n as u32).collect();
            Some(Tensor::new(v.as_slice(), p.device())?)
        }
        None => None,
    };
    let f32c = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
    // bf16 p is read as is (exact upcast in the kernel); any other dtype goes through f32
    let p = if p.dtype() == DType::BF16 {
        p.contiguous()?
    } else {
        f32c(p)?
    };
    let pairs = packed.is_some() || takes_pairs(b, l, cc, kc, p.layout().start_offset());
    let row_start = match packed {
        Some((starts, _)) => {
            let v: Vec<u32> = starts.iter().map(|&s| s as u32).collect();
            Some(Tensor::new(v.as_slice(), p.device())?)
        }
        None => None,
    };
    // The per-channel kernel reads state row b for row b: gather the rows for it.
    let (state, slots) = match slot_of_row {
        Some(idx) if !pairs => (state.index_select(idx, 0)?, None),
        other => (state.clone(), other.map(Tensor::contiguous).transpose()?),
    };
    let op = CausalConvSilu {
        state: f32c(&state)?,
        slots,
        pairs,
        weight: f32c(weight)?,
        lengths,
        batch: (b, l),
        row_start,
    };
    // (B·L·Cc + B·(Kc−1)·Cc,) -> (B, L, Cc), (B, Kc−1, Cc)
    let flat = p.apply_op1_no_bwd(&op)?;
    let n_out = b * l * cc;
    let out = flat.narrow(0, 0, n_out)?.reshape((b, l, cc))?;
    let new_state = flat
        .narrow(0, n_out, b * (kc - 1) * cc)?
        .reshape((b, kc - 1, cc))?;
    Ok((out, new_state))
}
