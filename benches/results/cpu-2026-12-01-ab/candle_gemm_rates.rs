use candle_core::{Device, Tensor, DType};
use std::time::Instant;
fn main() -> candle_core::Result<()> {
    let d = Device::Cpu;
    for &(m, k, n) in &[(306usize, 896usize, 4864usize), (306, 4864, 896), (306, 896, 1152), (306, 896, 9728), (964, 896, 4864), (60, 896, 4864)] {
        let x = Tensor::randn(0f32, 1., (1, m, k), &d)?;
        let w = Tensor::randn(0f32, 1., (n, k), &d)?;
        let wt = w.t()?.contiguous()?; // (k, n)
        let flops = 2.0 * (m * n * k) as f64;
        let time = |f: &dyn Fn() -> candle_core::Result<Tensor>| -> candle_core::Result<f64> {
            f()?;
            let mut best = f64::MAX;
            let mut v = vec![]; for _ in 0..15 { let t = Instant::now(); let y = f()?; let _ = y.dims(); v.push(t.elapsed().as_secs_f64()); } v.sort_by(|a,b| a.partial_cmp(b).unwrap()); best = best.min(v[7]);
            Ok(best)
        };
        let a = time(&|| x.matmul(&w.broadcast_left(1)?.t()?))?;
        let b = time(&|| x.matmul(&wt.broadcast_left(1)?))?;
        let x2 = x.squeeze(0)?;
        let c = time(&|| x2.matmul(&w.t()?))?;
        let e = time(&|| x2.matmul(&wt))?;
        println!("{m}x{k}x{n}: w.t() batched {:.1} GF/s, w^T contiguous batched {:.1}, 2-D w.t() {:.1}, 2-D w^T {:.1}", flops/a/1e9, flops/b/1e9, flops/c/1e9, flops/e/1e9);
        let _ = DType::F32;
    }
    Ok(())
}
