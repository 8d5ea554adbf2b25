//! One linear layer, side by side in one run: f32 GEMM vs candle's quantized kernel vs
//! dequantize-then-f32-GEMM, for the weight shapes of Qwen2.5-0.5B's MLP and a range of row
//! counts (1 = one token, 40 = 8 fields × 5 suffix tokens, 441 = a prefill chunk).
//!
//! `cargo bench -p forkscore-benches --bench qmatmul` — prints a table and writes
//! target/bench/qmatmul.json. The crossover row count it shows is where the quantized linear
//! layer switches to dequantize + GEMM on the CPU (`linear::kernel_max_rows`).
//! Env: FORKSCORE_BENCH_REPEATS (default 5), FORKSCORE_BENCH_ROWS (default 1,4,8,16,40,441).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::path::PathBuf;
use std::time::Instant;

fn median_ms(repeats: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?; // warm-up
    let mut t = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn main() -> anyhow::Result<()> {
    let repeats: usize = std::env::var("FORKSCORE_BENCH_REPEATS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let rows: Vec<usize> = std::env::var("FORKSCORE_BENCH_ROWS")
        .unwrap_or_else(|_| "1,4,8,16,40,441".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let dev = Device::Cpu;
    let mut report = Vec::new();
    println!(
        "{:>10} {:>5} {:>6} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "(out,in)", "rows", "type", "f32 ms", "quant ms", "deq+gemm", "q/f32", "dq/f32"
    );
    for (out_dim, in_dim) in [(4864usize, 896usize), (896, 4864)] {
        // (out, in) f32 weight, uniform in ±1/sqrt(in)
        let w = (Tensor::rand(0f32, 1f32, (out_dim, in_dim), &dev)? - 0.5)?
            .affine(2.0 / (in_dim as f64).sqrt(), 0.0)?;
        for ggml in [GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q4_0] {
            if in_dim % ggml.block_size() != 0 {
                continue;
            }
            let q = std::sync::Arc::new(QTensor::quantize(&w, ggml)?);
            let qmm = QMatMul::from_arc(q.clone())?;
            for &m in &rows {
                let x = Tensor::rand(-1f32, 1f32, (m, in_dim), &dev)?;
                // (m, in) x (in, out) -> (m, out)
                let f32_ms = median_ms(repeats, || {
                    x.matmul(&w.t()?)?;
                    Ok(())
                })?;
                let q_ms = median_ms(repeats, || {
                    qmm.forward(&x)?;
                    Ok(())
                })?;
                let dq_ms = median_ms(repeats, || {
                    let wd = q.dequantize(&dev)?.to_dtype(DType::F32)?;
                    x.matmul(&wd.t()?)?;
                    Ok(())
                })?;
                let name = format!("{ggml:?}").to_ascii_lowercase();
                println!(
                    "{:>10} {m:>5} {name:>6} {f32_ms:>10.2} {q_ms:>10.2} {dq_ms:>10.2} {:>8.2}x {:>8.2}x",
                    format!("({out_dim},{in_dim})"),
                    q_ms / f32_ms,
                    dq_ms / f32_ms
                );
                report.push(serde_json::json!({
                    "out": out_dim, "in": in_dim, "rows": m, "ggml": name,
                    "f32_gemm_ms": f32_ms, "quantized_kernel_ms": q_ms, "dequantize_gemm_ms": dq_ms,
                    "gflop": 2.0 * (m * in_dim * out_dim) as f64 / 1e9,
                }));
            }
        }
    }
    let out = std::env::var("FORKSCORE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench"));
    std::fs::create_dir_all(&out)?;
    let threads = candle_core::utils::get_num_threads();
    std::fs::write(
        out.join("qmatmul.json"),
        serde_json::to_string_pretty(
            &serde_json::json!({"repeats": repeats, "threads": threads, "rows": report}),
        )?,
    )?;
    println!("report: {}", out.join("qmatmul.json").display());
    Ok(())
}
