use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaModule, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    CudaDevice, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor,
};

use super::GdnDims;

/// nvcc's fat binary of `kernels/cuda/gdn_recurrent.cu` (the `forkscore-kernels` crate).
static FATBIN: &[u8] = forkscore_kernels::fatbin::GDN_RECURRENT;
/// Must match `4 · GDN_CPL · GDN_WARPS` and `32 · GDN_WARPS` of the kernel source.
const COLUMNS_PER_BLOCK: usize = 32;
const THREADS: u32 = 128;
/// The L2-normalisation epsilon of the candle path ([`super::super::norm::L2_EPS`]).
const L2_EPS: f32 = super::super::norm::L2_EPS as f32;

pub(super) fn module(dev: &CudaDevice) -> Result<Arc<CudaModule>> {
    crate::candle::cuda::cuda_module::load(dev, "gdn_recurrent", FATBIN)
}

/// The op: applied to `qkv`, holding the other inputs. Its one output is the flat
/// concatenation `[o (B·L·Hv·dv) | state (B·Hv·dk·dv)]`, split by [`run`].
struct GatedDeltaRule {
    beta: Tensor,
    g: Tensor,
    state: Tensor,
    /// `(B,)` u32: the state row each batch row continues (None: row b continues row b).
    slots: Option<Tensor>,
    dims: GdnDims,
    /// Long calls take the chunked kernels where they fit ([`takes_chunked`]).
    chunked: bool,
    /// Whether the final states are written (false: the kernels get a null `s1`).
    keep_state: bool,
}

pub(super) fn cuda_f32<'a>(
    storage: &'a Storage,
    layout: &Layout,
    what: &str,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, f32>> {
    crate::candle::cuda::cuda_module::contiguous_view::<f32>(storage, layout, "fused GDN", what)
}

/// A contiguous `(n,)` u32 tensor on the GPU as a view (the lengths / slot maps).
pub(super) fn cuda_u32<'a>(
    storage: &'a Storage,
    layout: &Layout,
    what: &str,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, u32>> {
    crate::candle::cuda::cuda_module::contiguous_view::<u32>(storage, layout, "fused GDN", what)
}

impl CustomOp1 for GatedDeltaRule {
    fn name(&self) -> &'static str {
        "fused-gated-delta-rule"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("the fused Gated DeltaNet kernel runs on CUDA only")
    }

    fn cuda_fwd(&self, qkv: &CudaStorage, qkv_l: &Layout) -> Result<(CudaStorage, Shape)> {
        let GdnDims {
            key_heads: hk,
            value_heads: hv,
            key_dim: dk,
            value_dim: dv,
            ..
        } = self.dims;
        let (b, l, _) = qkv_l.shape().dims3()?;
        let dev = qkv.device().clone();
        if !qkv_l.is_contiguous() {
            candle_core::bail!("fused GDN: qkv is not contiguous");
        }
        let qkv = qkv
            .as_cuda_slice::<f32>()?
            .slice(qkv_l.start_offset()..qkv_l.start_offset() + qkv_l.shape().elem_count());
        let (beta_s, beta_l) = self.beta.storage_and_layout();
        let beta = cuda_f32(&beta_s, beta_l, "beta")?;
        let (g_s, g_l) = self.g.storage_and_layout();
        let g = cuda_f32(&g_s, g_l, "g")?;
        let (st_s, st_l) = self.state.storage_and_layout();
        let s0 = cuda_f32(&st_s, st_l, "state")?;
        let slots_guard = self.slots.as_ref().map(|t| t.storage_and_layout());
        let slots = match &slots_guard {
            Some((s, layout)) => Some(cuda_u32(s, layout, "slot_of_row")?),
            None => None,
        };

        let n_out = b * l * hv * dv;
        // the final states only where they are kept: without them the kernels get a null s1
        let n_state = if self.keep_state { b * hv * dk * dv } else { 0 };
        // SAFETY: every element is written by the kernel (outputs of all B·L tokens and,
        // when kept, the final state of all B rows).
        let mut dst = unsafe { dev.alloc::<f32>(n_out + n_state)? };
        let (mut out, mut s1) = dst.split_at_mut(n_out);

        if self.chunked && takes_chunked(l, dk, dv) {
            chunked(
                &dev,
                &qkv,
                &beta,
                &g,
                &s0,
                slots.as_ref(),
                &mut out,
                self.keep_state.then_some(&mut s1),
                b,
                l,
                &self.dims,
            )?;
            return Ok((
                CudaStorage::wrap_cuda_slice(dst, dev),
                Shape::from(n_out + n_state),
            ));
        }
        let func = module(&dev)?
            .load_function(&format!("gdn_recurrent_dk{dk}"))
            .w()?;
        let stream = dev.cuda_stream();
        let cfg = LaunchConfig {
            grid_dim: ((b * hv) as u32, dv.div_ceil(COLUMNS_PER_BLOCK) as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (l_i, hk_i, hv_i, dv_i) = (l as i32, hk as i32, hv as i32, dv as i32);
        let q_scale = (dk as f32).powf(-0.5);
        let null: u64 = 0;
        let mut builder = stream.launch_builder(&func);
        builder.arg(&qkv);
        builder.arg(&beta);
        builder.arg(&g);
        builder.arg(&s0);
        match &slots {
            Some(v) => builder.arg(v),
            None => builder.arg(&null),
        };
        builder.arg(&mut out);
        match self.keep_state {
            true => builder.arg(&mut s1),
            false => builder.arg(&null),
        };
        builder.arg(&l_i);
        builder.arg(&hk_i);
        builder.arg(&hv_i);
        builder.arg(&dv_i);
        builder.arg(&q_scale);
        builder.arg(&L2_EPS);
        // SAFETY: argument types and order match the kernel's signature; shapes were
        // checked by `run`.
        unsafe { builder.launch(cfg) }.w()?;
        drop(builder);
        Ok((
            CudaStorage::wrap_cuda_slice(dst, dev),
            Shape::from(n_out + n_state),
        ))
    }
}

/// nvcc's fat binary of `kernels/cuda/gdn_chunked.cu` (the `forkscore-kernels` crate).
static CHUNKED_FATBIN: &[u8] = forkscore_kernels::fatbin::GDN_CHUNKED;
/// Must match the kernel source: tokens per chunk, threads per block, value columns per
/// scan block.
const CHUNK: usize = 64;
const CHUNK_THREADS: u32 = 256;
const SCAN_TILE: usize = 32;
/// Calls of at least this many tokens take the chunked form.
const CHUNKED_MIN_TOKENS: usize = 64;
/// Dynamic shared memory the GPU grants one block at most (Hopper: 227 KiB).
const MAX_SHARED: usize = 227 * 1024;

/// Padded shared-memory rows of the kernels (32-byte aligned WMMA tiles, fewer conflicts).
const PAD: usize = 8;

/// Prep's three reused regions (q̂ then A | T; k̂; the two products then v: see the kernel)
/// and its per-token scalars; its C × C matrices have rows of C + 4.
fn prep_smem(dk: usize, dv: usize) -> usize {
    let tri = 2 * CHUNK * (CHUNK + 4);
    4 * ((CHUNK * (dk + PAD)).max(tri)
        + CHUNK * (dk + PAD)
        + (CHUNK * (dv + PAD)).max(tri)
        + 5 * CHUNK)
}
fn scan_smem(dk: usize) -> usize {
    let sld = SCAN_TILE + PAD;
    4 * (dk * sld + 3 * CHUNK * sld + 3 * CHUNK * (dk + PAD) + CHUNK * (CHUNK + PAD))
}
/// Workspace floats per (row, head, chunk), a multiple of 8 (32-byte aligned chunks).
fn ws_per_chunk(dk: usize, dv: usize) -> usize {
    (CHUNK * dk * 3 + CHUNK * dv + CHUNK * CHUNK + 1).div_ceil(8) * 8
}

/// Whether a call of `l` tokens can take the chunked kernels (long calls, dk 32 / 64 / 128,
/// dv a multiple of 16 — whole tensor-core tiles —, the shared memory fits).
fn takes_chunked(l: usize, dk: usize, dv: usize) -> bool {
    l >= CHUNKED_MIN_TOKENS
        && matches!(dk, 32 | 64 | 128)
        && dv % 16 == 0
        && prep_smem(dk, dv) <= MAX_SHARED
        && scan_smem(dk) <= MAX_SHARED
}

/// The chunked delta rule (`kernels/cuda/gdn_chunked.cu`): all chunks' WY terms in parallel, then
/// one scan over the chunks per (row, value head, 32 value columns). The outputs of the
/// token-by-token kernel up to TF32 rounding of the products.
#[allow(clippy::too_many_arguments)]
fn chunked(
    dev: &CudaDevice,
    qkv: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, f32>,
    beta: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, f32>,
    g: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, f32>,
    s0: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, f32>,
    slots: Option<&candle_core::cuda_backend::cudarc::driver::CudaView<'_, u32>>,
    out: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, f32>,
    s1: Option<&mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, f32>>,
    b: usize,
    l: usize,
    dims: &GdnDims,
) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
    let (hk, hv, dk, dv) = (
        dims.key_heads,
        dims.value_heads,
        dims.key_dim,
        dims.value_dim,
    );
    let nc = l.div_ceil(CHUNK);
    // SAFETY: the prep kernel writes every workspace element the scan reads.
    let mut ws = unsafe { dev.alloc::<f32>(b * hv * nc * ws_per_chunk(dk, dv))? };
    let m = crate::candle::cuda::cuda_module::load(dev, "gdn_chunked", CHUNKED_FATBIN)?;
    let prep = m.load_function(&format!("gdn_chunk_prep_dk{dk}")).w()?;
    let scan = m.load_function(&format!("gdn_chunk_scan_dk{dk}")).w()?;
    let (p_smem, s_smem) = (prep_smem(dk, dv), scan_smem(dk));
    for (f, smem) in [(&prep, p_smem), (&scan, s_smem)] {
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .w()?;
    }
    let stream = dev.cuda_stream();
    let (l_i, hk_i, hv_i, dv_i, nc_i) = (l as i32, hk as i32, hv as i32, dv as i32, nc as i32);
    let q_scale = (dk as f32).powf(-0.5);
    let mut builder = stream.launch_builder(&prep);
    builder.arg(qkv);
    builder.arg(beta);
    builder.arg(g);
    builder.arg(&mut ws);
    builder.arg(&l_i);
    builder.arg(&hk_i);
    builder.arg(&hv_i);
    builder.arg(&dv_i);
    builder.arg(&q_scale);
    builder.arg(&L2_EPS);
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, hv as u32, b as u32),
        block_dim: (CHUNK_THREADS, 1, 1),
        shared_mem_bytes: p_smem as u32,
    };
    // SAFETY: argument types and order match the kernel's signature; shapes were checked
    // by `run`.
    unsafe { builder.launch(cfg) }.w()?;
    drop(builder);
    let null: u64 = 0;
    let mut builder = stream.launch_builder(&scan);
    builder.arg(&ws);
    builder.arg(s0);
    match slots {
        Some(v) => builder.arg(v),
        None => builder.arg(&null),
    };
    builder.arg(out);
    match s1 {
        Some(s1) => builder.arg(s1),
        None => builder.arg(&null),
    };
    builder.arg(&l_i);
    builder.arg(&hv_i);
    builder.arg(&dv_i);
    builder.arg(&nc_i);
    let cfg = LaunchConfig {
        grid_dim: (dv.div_ceil(SCAN_TILE) as u32, hv as u32, b as u32),
        block_dim: (CHUNK_THREADS, 1, 1),
        shared_mem_bytes: s_smem as u32,
    };
    // SAFETY: as above; the scan writes every output token and, given one, the whole final
    // state (a null s1 skips it).
    unsafe { builder.launch(cfg) }.w()?;
    drop(builder);
    Ok(())
}

/// Checks an optional row → state-row map of `rows` rows against `states` retained rows;
/// returns the state rows the call must be given (`rows` without a map).
pub(super) fn check_slots(slots: Option<&Tensor>, rows: usize, states: usize) -> Result<usize> {
    let Some(t) = slots else { return Ok(rows) };
    if t.dtype() != DType::U32 || t.dims() != [rows] {
        candle_core::bail!(
            "fused GDN: slot_of_row is {:?} {:?}, expected u32 ({rows},)",
            t.dtype(),
            t.dims()
        );
    }
    Ok(states)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    qkv: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
    slot_of_row: Option<&Tensor>,
    dims: &GdnDims,
    chunked: bool,
    keep_state: bool,
) -> Result<(Tensor, Tensor)> {
    let (b, l, cc) = qkv.dims3()?;
    let (hv, dk, dv) = (dims.value_heads, dims.key_dim, dims.value_dim);
    if cc != dims.conv_channels() {
        candle_core::bail!(
            "fused GDN: qkv has {cc} channels, expected {}",
            dims.conv_channels()
        );
    }
    for (name, t) in [("beta", beta), ("g", g)] {
        if t.dims() != [b, l, hv] {
            candle_core::bail!(
                "fused GDN: {name} is {:?}, expected {:?}",
                t.dims(),
                [b, l, hv]
            );
        }
    }
    let states = check_slots(slot_of_row, b, state.dim(0)?)?;
    if state.dims() != [states, hv, dk, dv] {
        candle_core::bail!(
            "fused GDN: state is {:?}, expected {:?}",
            state.dims(),
            [states, hv, dk, dv]
        );
    }
    let f32c = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
    let op = GatedDeltaRule {
        beta: f32c(beta)?,
        g: f32c(g)?,
        state: f32c(state)?,
        slots: slot_of_row.map(Tensor::contiguous).transpose()?,
        dims: *dims,
        chunked,
        keep_state,
    };
    // (B·L·Hv·dv + B·Hv·dk·dv,) -> (B, L, Hv, dv), (B, Hv, dk, dv); without the state
    // (B·L·Hv·dv,) and an empty (B, Hv, 0, dv)
    let flat = f32c(qkv)?.apply_op1_no_bwd(&op)?;
    let n_out = b * l * hv * dv;
    let o = flat.narrow(0, 0, n_out)?.reshape((b, l, hv, dv))?;
    let s = match keep_state {
        true => flat
            .narrow(0, n_out, b * hv * dk * dv)?
            .reshape((b, hv, dk, dv))?,
        false => flat.narrow(0, 0, 0)?.reshape((b, hv, 0, dv))?,
    };
    Ok((o, s))
}
