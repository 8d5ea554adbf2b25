//! f32 linear layers on the CPU through the system OpenBLAS (`--features openblas` and
//! `FORKSCORE_CPU_GEMM=openblas`, or by default on a CPU without AVX2 + FMA, where the packed
//! kernel of `super::gemm` does not run; Debian / Ubuntu `libopenblas-dev`): `y = x Wᵀ` as
//! one `cblas_sgemm` on the untouched row-major weight. At a 306-token prefill's shapes on two
//! AVX2 cores, OpenBLAS ran at 127–144 GFLOP/s against 80–110 for candle's own GEMM.
//! candle's matmul stays the reference (the
//! equivalence test below); `FORKSCORE_CPU_GEMM=candle` switches to it at run time.

use std::sync::OnceLock;

use candle_core::{DType, Device, Result, Storage, Tensor};

mod ffi {
    extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn cblas_sgemm(
            order: i32,
            trans_a: i32,
            trans_b: i32,
            m: i32,
            n: i32,
            k: i32,
            alpha: f32,
            a: *const f32,
            lda: i32,
            b: *const f32,
            ldb: i32,
            beta: f32,
            c: *mut f32,
            ldc: i32,
        );
        pub fn openblas_set_num_threads(n: i32);
    }
}

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// Whether CPU f32 linear layers go through OpenBLAS (`FORKSCORE_CPU_GEMM=openblas`, or
/// with the feature on a CPU without AVX2 + FMA; see [`super::gemm::choice`]).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = super::gemm::choice() == super::gemm::CpuGemm::OpenBlas;
        if on {
            // OpenBLAS runs single-threaded inside the rayon threads (see `linear`): its own
            // worker threads keep spinning after each call and would take the cores from the
            // rayon work between products.
            // SAFETY: a plain setter of the library's thread count.
            unsafe { ffi::openblas_set_num_threads(1) };
        }
        on
    })
}

/// Whether linear layers run `x (.., in)` against `w (out, in)` through [`linear`]: OpenBLAS
/// chosen ([`enabled`]) and the operands [`fits`].
pub(crate) fn takes(x: &Tensor, w: &Tensor) -> bool {
    enabled() && fits(x, w)
}

/// Whether [`linear`] can run `x (.., in)` against `w (out, in)`: both f32 on the CPU, `w`
/// contiguous, and every extent within OpenBLAS's 32-bit indices.
fn fits(x: &Tensor, w: &Tensor) -> bool {
    let Ok((out, k)) = w.dims2() else {
        return false;
    };
    let rows = x.elem_count() / k.max(1);
    x.device().is_cpu()
        && w.device().is_cpu()
        && x.dtype() == DType::F32
        && w.dtype() == DType::F32
        && w.is_contiguous()
        && x.dims().last() == Some(&k)
        && [rows, out, k, rows * out]
            .iter()
            .all(|&v| v > 0 && v < i32::MAX as usize)
}

/// `x (.., in) · w (out, in)ᵀ -> (.., out)`, f32 on the CPU (the caller checked [`takes`]).
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (out, k) = w.dims2()?;
    let rows = x.elem_count() / k;
    let x = x.contiguous()?;
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (Storage::Cpu(xc), Storage::Cpu(wc)) = (&*xs, &*ws) else {
        candle_core::bail!("OpenBLAS linear: operands are not on the CPU");
    };
    let xd = &xc.as_slice::<f32>()?[xl.start_offset()..][..rows * k];
    let wd = &wc.as_slice::<f32>()?[wl.start_offset()..][..out * k];
    let mut y: Vec<f32> = Vec::with_capacity(rows * out);
    // One single-threaded sgemm per block of output columns, on the rayon threads: block j
    // computes y[:, n0..n1] = x · w[n0..n1]ᵀ (its rows of w are contiguous), so each thread packs
    // only its share of the weight.
    let threads = rayon::current_num_threads().max(1);
    let block = out.div_ceil(threads).next_multiple_of(16).min(out);
    let y_addr = y.as_mut_ptr() as usize;
    use rayon::prelude::*;
    (0..out)
        .step_by(block)
        .collect::<Vec<_>>()
        .par_iter()
        .for_each(|&n0| {
            let nb = block.min(out - n0);
            // SAFETY: the extents fit i32 (`takes`); a is rows × k row-major and b the nb rows
            // n0.. of the out × k weight, both in bounds (sliced above); c starts at column n0 of
            // the rows × out output (capacity reserved above) with row stride out, and the blocks
            // write disjoint columns. With beta = 0 sgemm writes every element of its block
            // without reading it.
            unsafe {
                ffi::cblas_sgemm(
                    ROW_MAJOR,
                    NO_TRANS,
                    TRANS,
                    rows as i32,
                    nb as i32,
                    k as i32,
                    1.0,
                    xd.as_ptr(),
                    k as i32,
                    wd.as_ptr().add(n0 * k),
                    k as i32,
                    0.0,
                    (y_addr as *mut f32).add(n0),
                    out as i32,
                );
            }
        });
    // SAFETY: the column blocks cover [0, out) of every row, so all rows × out elements are
    // written.
    unsafe { y.set_len(rows * out) };
    drop((xs, ws));
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out;
    }
    Tensor::from_vec(y, dims, &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenBLAS equals candle's matmul to f32 rounding, on 2-D and 3-D inputs, a view with an
    /// offset, and a one-row call.
    #[test]
    fn openblas_linear_equals_candle_matmul() -> Result<()> {
        let dev = Device::Cpu;
        for (xdims, out) in [
            (vec![37usize, 96], 130usize),
            (vec![2, 19, 64], 48),
            (vec![1, 1, 896], 7),
        ] {
            let k = *xdims.last().unwrap();
            let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
            let w = Tensor::randn(0f32, 1.0, (out + 3, k), &dev)?.narrow(0, 3, out)?;
            let w = w.contiguous()?; // an offset-free copy, and the view below keeps its offset
            let big = Tensor::randn(0f32, 1.0, (out + 1, k), &dev)?;
            let w_view = big.narrow(0, 1, out)?; // contiguous, start offset k
            for w in [&w, &w_view] {
                assert!(fits(&x, w), "{xdims:?} x ({out}, {k})");
                let got = linear(&x, w)?;
                let want = x.broadcast_matmul(&w.t()?)?;
                assert_eq!(got.dims(), want.dims());
                let d = (&got - &want)?
                    .abs()?
                    .flatten_all()?
                    .max(0)?
                    .to_scalar::<f32>()?;
                let r = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
                assert!(d <= 1e-5 * r.max(1.0), "{xdims:?}: {d:e} (max {r})");
            }
        }
        Ok(())
    }
}
