//! One linear layer, side by side in one run: candle's f32 matmul, the engine's packed f32
//! kernel, candle's quantized kernel, dequantize-then-f32-GEMM, and the engine's integer kernel
//! for the type (`Q8_0`: `cpu_qgemm`; `Q4_0` / `Q4_K`: `cpu_q4gemm`; what an f32 model's
//! quantized layers run on an x86 CPU with AVX2; `BF16`, `--quantize bf16`: `cpu_bf16gemm`,
//! where the CPU has AVX-512 BF16 — candle's "quantized" matmul of a BF16 tensor is its f32
//! matmul of the widened weight), for the weight shapes of Qwen2.5-0.5B's MLP
//! and a range of row counts (1 = one token, 40 = 8 fields × 5 suffix tokens, 441 = a prefill
//! chunk). The ratios are against the packed f32 kernel (the engine's f32 path).
//!
//! `cargo bench -p forkscore-benches --bench qmatmul` — prints a table and writes
//! target/bench/qmatmul.json. Where no integer kernel runs (no AVX2), the crossover row count
//! candle's column shows is where a quantized layer switches to dequantize + GEMM
//! (`linear::kernel_max_rows`).
//! Env: FORKSCORE_BENCH_REPEATS (default 5), FORKSCORE_BENCH_ROWS (default 1,4,8,16,40,441).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use forkscore_kernels::cpu::amx::{self, AmxWeight, Parts};
use forkscore_kernels::cpu::bf16::{self, PackedBf16};
use forkscore_kernels::cpu::gemm::{self, Blocking, PackedWeight};
use forkscore_kernels::cpu::isa::Isa;
use forkscore_kernels::cpu::q4gemm::{self, PackedQ4, Q4Format};
use forkscore_kernels::cpu::qgemm::{self, PackedQ8};
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
    // the FORKSCORE_* switches (the kernels' level cap and prefetch among them), read and
    // checked as a model load does
    forkscore_backends::switches::Switches::current()
        .validate(|_, _| Ok(()))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
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
    // the engine's kernels need x86-64 with AVX2 + FMA; elsewhere their columns stay empty
    let level = Isa::chosen();
    let isa = level.map(Isa::name);
    // the f32 kernel's default blocking at this level, and the bf16 weights' one at AVX-512
    let blocking = level.map(|l| Blocking::default_for(l.f32_level()));
    // the bf16 weights' kernels run at the process's blockings, as the layers do
    // (`FORKSCORE_CPU_GEMM_BLOCKING` at AVX-512 for the dot kernel, `FORKSCORE_CPU_AMX`)
    let switch = forkscore_backends::switches::value;
    let bf16_blocking = match switch("FORKSCORE_CPU_GEMM_BLOCKING") {
        Some(s) => Blocking::parse(s, Isa::Avx512).map_err(anyhow::Error::msg)?,
        None => Blocking::default_for(Isa::Avx512),
    };
    let amx_blocking = match switch("FORKSCORE_CPU_AMX") {
        Some(s) => amx::AmxBlocking::parse(s).map_err(anyhow::Error::msg)?,
        None => amx::AmxBlocking::DEFAULT,
    };
    // which kernels the model's layers take here (the switches and the CPU decide)
    let choice = forkscore_backends::candle::cpu::kernel_choice()?;
    println!(
        "engine kernels: {}; bf16 weights: {}",
        isa.unwrap_or("none (no AVX2 + FMA)"),
        choice.bf16.unwrap_or("candle's matmul")
    );
    println!(
        "{:>10} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "(out,in)",
        "rows",
        "type",
        "f32 ms",
        "packed",
        "candle q",
        "deq+gemm",
        "int ms",
        "q/pk",
        "int/pk"
    );
    for (out_dim, in_dim) in [(4864usize, 896usize), (896, 4864)] {
        // (out, in) f32 weight, uniform in ±1/sqrt(in)
        let w = (Tensor::rand(0f32, 1f32, (out_dim, in_dim), &dev)? - 0.5)?
            .affine(2.0 / (in_dim as f64).sqrt(), 0.0)?;
        let rows_w = w.flatten_all()?.to_vec1::<f32>()?;
        let packed = isa.map(|_| PackedWeight::from_rows(&rows_w, out_dim, in_dim));
        for ggml in [
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q4_0,
            GgmlDType::BF16,
        ] {
            if in_dim % ggml.block_size() != 0 {
                continue;
            }
            let q = std::sync::Arc::new(QTensor::quantize(&w, ggml)?);
            let qmm = QMatMul::from_arc(q.clone())?;
            enum Int {
                Q8(PackedQ8),
                Q4(PackedQ4),
                Bf16Amx(AmxWeight),
                Bf16Dot(PackedBf16),
            }
            // the weight as the layer packs it (`--quantize`): the blocks candle quantized
            let bytes = q.data()?;
            let int = match (level, ggml, choice.bf16) {
                (_, GgmlDType::BF16, Some("amx")) => Some(Int::Bf16Amx(AmxWeight::split_rows(
                    &rows_w,
                    out_dim,
                    in_dim,
                    Parts::One,
                ))),
                (_, GgmlDType::BF16, Some(_)) => Some(Int::Bf16Dot(PackedBf16::from_rows(
                    &rows_w, out_dim, in_dim,
                ))),
                (None, _, _) | (_, GgmlDType::BF16, None) => None,
                (Some(l), GgmlDType::Q8_0, _) => {
                    PackedQ8::from_blocks(&bytes, out_dim, in_dim, l).map(Int::Q8)
                }
                (Some(l), _, _) => {
                    let format = match ggml {
                        GgmlDType::Q4K => Q4Format::Q4K,
                        _ => Q4Format::Q4_0,
                    };
                    PackedQ4::from_blocks(format, &bytes, out_dim, in_dim, l).map(Int::Q4)
                }
            };
            for &m in &rows {
                let x = Tensor::rand(-1f32, 1f32, (m, in_dim), &dev)?;
                let xs = x.flatten_all()?.to_vec1::<f32>()?;
                // (m, in) x (in, out) -> (m, out)
                let f32_ms = median_ms(repeats, || {
                    x.matmul(&w.t()?)?;
                    Ok(())
                })?;
                let packed_ms = match (&packed, &blocking) {
                    (Some(pw), Some(bl)) => Some(median_ms(repeats, || {
                        let l = level.map(Isa::f32_level).expect("a level with a blocking");
                        gemm::product(&xs, m, pw, l, bl)?;
                        Ok(())
                    })?),
                    _ => None,
                };
                let int_ms = match &int {
                    Some(Int::Q8(qw)) => Some(median_ms(repeats, || {
                        match choice.q8_amx && qw.isa() == Isa::Avx512 {
                            true => amx::q8_product(&xs, m, qw)?,
                            false => qgemm::product(&xs, m, qw)?,
                        };
                        Ok(())
                    })?),
                    Some(Int::Q4(qw)) => Some(median_ms(repeats, || {
                        q4gemm::product(&xs, m, qw)?;
                        Ok(())
                    })?),
                    Some(Int::Bf16Amx(bw)) => Some(median_ms(repeats, || {
                        amx::product(&xs, m, bw, &amx_blocking)?;
                        Ok(())
                    })?),
                    Some(Int::Bf16Dot(bw)) => Some(median_ms(repeats, || {
                        bf16::product(&xs, m, bw, &bf16_blocking)?;
                        Ok(())
                    })?),
                    None => None,
                };
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
                let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
                let base = packed_ms.unwrap_or(f32_ms);
                println!(
                    "{:>10} {m:>5} {name:>6} {f32_ms:>9.2} {:>9} {q_ms:>9.2} {dq_ms:>9.2} {:>9} {:>7.2}x {:>8}",
                    format!("({out_dim},{in_dim})"),
                    ms(packed_ms),
                    ms(int_ms),
                    q_ms / base,
                    int_ms.map_or("-".to_string(), |v| format!("{:.2}x", v / base)),
                );
                report.push(serde_json::json!({
                    "out": out_dim, "in": in_dim, "rows": m, "ggml": name,
                    "f32_gemm_ms": f32_ms, "packed_f32_ms": packed_ms,
                    "quantized_kernel_ms": q_ms, "dequantize_gemm_ms": dq_ms,
                    "integer_kernel_ms": int_ms,
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
        serde_json::to_string_pretty(&serde_json::json!({
            "repeats": repeats, "threads": threads, "isa": isa, "rows": report
        }))?,
    )?;
    println!("report: {}", out.join("qmatmul.json").display());
    Ok(())
}
