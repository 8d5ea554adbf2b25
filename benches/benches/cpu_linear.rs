//! The CPU linear kernels alone, at a model's layer shapes, under several blockings of the f32
//! kernel in one run: the harness the blocking defaults are chosen with (`cpu_gemm::Blocking`).
//!
//! `cargo bench -p forkscore-benches --bench cpu_linear` — prints GFLOP/s per (rows, layer,
//! blocking) and each blocking's time for one transformer layer's linear work, and writes
//! target/bench/cpu_linear.json. The blockings are timed round-robin (one call of each in
//! turn, repeated), so a drift of the machine falls on all of them alike; the figure is the
//! median. The same shapes through torch (the peer, same cores): `scripts/cpu-real/gemm_peak.py
//! --rows … --shapes …`.
//!
//! Env:
//! - FORKSCORE_BENCH_BLOCKINGS: `;`-separated blocking specs (`mr=12,mc=96;kc=128`; keys as
//!   `FORKSCORE_CPU_GEMM_BLOCKING`, over this CPU's default; an empty spec is the default).
//!   Default: the default alone.
//! - FORKSCORE_BENCH_ROWS: row counts (default 512,160,40: a prefill chunk, a scoring pass of
//!   28 fields, one of 8).
//! - FORKSCORE_BENCH_SHAPES: `name:out x in` layers (default Qwen2.5-0.5B's
//!   qkv:1152x896,o:896x896,gate_up:9728x896,down:896x4864).
//! - FORKSCORE_BENCH_REPEATS: calls per blocking and shape (default 7).
//! - FORKSCORE_BENCH_Q8=1: also the `Q8_0` integer kernel at each shape; or a list of the
//!   instruction levels whose kernels to time side by side (`avx2,avxvnni,avx512`: each must be
//!   one this CPU has; `all`: every one it has).
//! - FORKSCORE_BENCH_QPF: `,`-separated prefetch distances (blocks ahead, 0: none) the `Q8_0`
//!   kernels are timed at, each as its own kernel (default: the process's setting,
//!   `FORKSCORE_CPU_QPREFETCH` or the default).
//! - FORKSCORE_BENCH_Q4=1 (or a list of levels, as above): also the 4-bit kernel, on the format
//!   `--quantize q4k` gives the shape (`Q4_K` where `in` is a multiple of 256, else `Q4_0`).
//! - FORKSCORE_BENCH_WEIGHT_COPIES: distinct weights per shape, taken in turn (default 1). With
//!   enough copies to outgrow the last-level cache the weights come from memory, as a model's
//!   24 layers do.
//!
//! - FORKSCORE_BENCH_AMX_BLOCKINGS: `;`-separated blockings of the AMX f32 kernel (`mc=64,pf=1`;
//!   keys as `FORKSCORE_CPU_AMX`). Where the CPU runs AMX tiles that kernel (bf16 × 6, what f32
//!   layers use with `FORKSCORE_CPU_GEMM=amx`) is timed at each shape too, at the default
//!   unless this lists others.

use anyhow::{bail, Context};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use forkscore_benches::{env_or, median, write_report};
use forkscore_kernels::cpu::amx::{self, AmxBlocking, AmxWeight};
use forkscore_kernels::cpu::gemm::{self, Blocking, PackedWeight};
use forkscore_kernels::cpu::isa::Isa;
use forkscore_kernels::cpu::q4gemm::{self, PackedQ4, Q4Format};
use forkscore_kernels::cpu::qgemm::{self, PackedQ8};
use std::time::Instant;

/// The level named `name` (`avx2`, `avxvnni`, `avx512`), if this CPU has it; an error names
/// an unknown or missing one.
fn named_isa(name: &str) -> anyhow::Result<Isa> {
    match Isa::from_name(name) {
        Some(l) if Isa::supported().contains(&l) => Ok(l),
        Some(_) => bail!("this CPU has no {name}"),
        None => bail!("unknown instruction level `{name}` (avx2, avxvnni, avx512)"),
    }
}

/// `w (n, k)` quantized to `Q8_0` the way `--quantize q8_0` does (candle's blocks), packed
/// for the kernel of the level named `level`.
fn quantize_q8(w: &Tensor, level: &str) -> anyhow::Result<PackedQ8> {
    let isa = named_isa(level)?;
    let (n, k) = w.dims2()?;
    let bytes = QTensor::quantize(w, GgmlDType::Q8_0)?.data()?.into_owned();
    PackedQ8::from_blocks(&bytes, n, k, isa)
        .with_context(|| format!("({n}, {k}) weight: in is not a multiple of 32"))
}

/// `w (n, k)` quantized to `Q4_K` (`in` a multiple of 256) or else `Q4_0` the way
/// `--quantize q4k` does, packed for the kernel of the level named `level`.
fn quantize_q4(w: &Tensor, level: &str) -> anyhow::Result<PackedQ4> {
    let isa = named_isa(level)?;
    let (n, k) = w.dims2()?;
    let (ggml, format) = match k % 256 {
        0 => (GgmlDType::Q4K, Q4Format::Q4K),
        _ => (GgmlDType::Q4_0, Q4Format::Q4_0),
    };
    let bytes = QTensor::quantize(w, ggml)?.data()?.into_owned();
    PackedQ4::from_blocks(format, &bytes, n, k, isa)
        .with_context(|| format!("({n}, {k}) weight: the {ggml:?} blocks do not fit"))
}

struct Shape {
    name: String,
    out: usize,
    inp: usize,
}

fn parse_shapes(s: &str) -> anyhow::Result<Vec<Shape>> {
    s.split(',')
        .map(|part| {
            let (name, dims) = part
                .trim()
                .split_once(':')
                .with_context(|| format!("shape `{part}` is not name:OUTxIN"))?;
            let (out, inp) = dims
                .split_once('x')
                .with_context(|| format!("shape `{part}` is not name:OUTxIN"))?;
            Ok(Shape {
                name: name.to_string(),
                out: out
                    .trim()
                    .parse()
                    .with_context(|| format!("shape `{part}`"))?,
                inp: inp
                    .trim()
                    .parse()
                    .with_context(|| format!("shape `{part}`"))?,
            })
        })
        .collect()
}

/// One kernel and blocking the bench times (parsed before any timing).
enum Kernel {
    /// The f32 kernel: the blocking, and its resolved form for the report.
    F32(Blocking, String),
    /// The AMX f32 kernel: the blocking and its spec.
    Amx(AmxBlocking, String),
    /// The `Q8_0` integer kernel of an instruction level (its label, its position among the
    /// levels, the prefetch distance it runs at unless the process's).
    Q8(String, usize, Option<usize>),
    /// The `Q4_K` integer kernel of an instruction level.
    Q4(String, usize),
}

impl Kernel {
    fn label(&self) -> (&'static str, &str) {
        match self {
            Kernel::F32(_, resolved) => ("f32", resolved),
            Kernel::Amx(_, spec) if spec.is_empty() => ("amx", "default"),
            Kernel::Amx(_, spec) => ("amx", spec),
            Kernel::Q8(label, _, _) => ("q8_0", label),
            Kernel::Q4(level, _) => ("q4k", level),
        }
    }
}

fn main() -> anyhow::Result<()> {
    // the FORKSCORE_* switches (the kernels' level cap and prefetch among them), read and
    // checked as a model load does
    forkscore_backends::switches::Switches::current()
        .validate(|_, _| Ok(()))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(level) = Isa::chosen() else {
        bail!("the CPU kernels do not run on this CPU (no AVX2 + FMA)");
    };
    let isa = level.name();
    // the `Q8_0` layer dispatch: AVX-512 weights on the AMX-INT8 tiles where
    // `FORKSCORE_CPU_Q8=amx` asks for them and they run
    let q8_amx = forkscore_backends::candle::cpu::kernel_choice()?.q8_amx;
    let repeats: usize = env_or("FORKSCORE_BENCH_REPEATS", "7")
        .parse()
        .context("FORKSCORE_BENCH_REPEATS")?;
    if repeats == 0 {
        bail!("FORKSCORE_BENCH_REPEATS must be at least 1");
    }
    let rows: Vec<usize> = env_or("FORKSCORE_BENCH_ROWS", "512,160,40")
        .split(',')
        .map(|s| s.trim().parse().with_context(|| format!("row count `{s}`")))
        .collect::<anyhow::Result<_>>()?;
    let shapes = parse_shapes(&env_or(
        "FORKSCORE_BENCH_SHAPES",
        "qkv:1152x896,o:896x896,gate_up:9728x896,down:896x4864",
    ))?;
    // the instruction levels whose integer kernels are timed: `1` the chosen one, `all` every
    // one the CPU has, or a list
    let int_levels = |var: &str| -> Vec<String> {
        match env_or(var, "0").trim() {
            "0" | "" => Vec::new(),
            "1" => vec![isa.to_string()],
            "all" => Isa::supported()
                .iter()
                .map(|l| l.name().to_string())
                .collect(),
            list => list.split(',').map(|l| l.trim().to_string()).collect(),
        }
    };
    let (q8_levels, q4_levels) = (
        int_levels("FORKSCORE_BENCH_Q8"),
        int_levels("FORKSCORE_BENCH_Q4"),
    );
    let copies: usize = env_or("FORKSCORE_BENCH_WEIGHT_COPIES", "1")
        .parse()
        .context("FORKSCORE_BENCH_WEIGHT_COPIES")?;
    if copies == 0 {
        bail!("FORKSCORE_BENCH_WEIGHT_COPIES must be at least 1");
    }
    // the AMX bf16 × 6 kernel runs on this CPU (tiles granted), whether or not the model's
    // layers use it
    let amx = amx::available();
    // every kernel and blocking timed, in this order
    let mut configs: Vec<Kernel> = Vec::new();
    for spec in env_or("FORKSCORE_BENCH_BLOCKINGS", "").split(';') {
        let spec = spec.trim();
        let bl = Blocking::parse(spec, level.f32_level())
            .map_err(|reason| anyhow::anyhow!("blocking `{spec}`: {reason}"))?;
        let resolved = format!(
            "mr={},kc={},mc={},nc={},short_k={},pf={}",
            bl.mr, bl.kc, bl.mc, bl.nc, bl.short_k, bl.pf
        );
        configs.push(Kernel::F32(bl, resolved));
    }
    if amx {
        for spec in env_or("FORKSCORE_BENCH_AMX_BLOCKINGS", "").split(';') {
            let spec = spec.trim().to_string();
            let bl = AmxBlocking::parse(&spec)
                .map_err(|reason| anyhow::anyhow!("amx blocking `{spec}`: {reason}"))?;
            configs.push(Kernel::Amx(bl, spec));
        }
    }
    // each with its position among the levels: where its packed weights lie
    let indexed = |levels: &[String]| levels.iter().cloned().enumerate().collect::<Vec<_>>();
    let q8_pf: Vec<Option<usize>> = match env_or("FORKSCORE_BENCH_QPF", "").trim() {
        "" => vec![None],
        list => list
            .split(',')
            .map(|d| {
                d.trim()
                    .parse()
                    .map(Some)
                    .with_context(|| format!("FORKSCORE_BENCH_QPF: `{d}` is not a count"))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    for (i, l) in indexed(&q8_levels) {
        for &pf in &q8_pf {
            let label = match pf {
                Some(d) => format!("{l} pf={d}"),
                None => l.clone(),
            };
            configs.push(Kernel::Q8(label, i, pf));
        }
    }
    configs.extend(
        indexed(&q4_levels)
            .into_iter()
            .map(|(i, l)| Kernel::Q4(l, i)),
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "cpu_linear: isa {isa}, amx {amx}, {} rayon threads (of {threads} CPUs), {repeats} calls each",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "default".into())
    );
    let dev = Device::Cpu;
    let mut report = Vec::new();
    for &m in &rows {
        let mut layer_ms = vec![0f64; configs.len()];
        for sh in &shapes {
            let x = Tensor::randn(0f32, 1.0, (m, sh.inp), &dev)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            // `copies` weights of the shape, taken in turn (so they come from memory, as a
            // model's layers do, when together they outgrow the last-level cache)
            let mut pf = Vec::new();
            let (mut pq, mut p4, mut pa) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..copies {
                let w = Tensor::randn(0f32, 0.05, (sh.out, sh.inp), &dev)?;
                let rows = w.flatten_all()?.to_vec1::<f32>()?;
                pf.push(PackedWeight::from_rows(&rows, sh.out, sh.inp));
                // one packed weight per level, in the order of `q8_levels` / `q4_levels`
                for level in &q8_levels {
                    pq.push(quantize_q8(&w, level)?);
                }
                for level in &q4_levels {
                    p4.push(quantize_q4(&w, level)?);
                }
                if amx {
                    pa.push(AmxWeight::from_rows(&rows, sh.out, sh.inp));
                }
            }
            let mut call = 0usize;
            let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
            for rep in 0..=repeats {
                for (i, c) in configs.iter().enumerate() {
                    let at = call % copies;
                    call += 1;
                    let s = Instant::now();
                    let y = match c {
                        Kernel::F32(bl, _) => gemm::product(&x, m, &pf[at], level.f32_level(), bl)?,
                        Kernel::Amx(bl, _) => amx::product(&x, m, &pa[at], bl)?,
                        Kernel::Q8(_, l, pf) => {
                            if let Some(d) = pf {
                                qgemm::set_prefetch(*d);
                            }
                            let w = &pq[at * q8_levels.len() + l];
                            match q8_amx && w.isa() == Isa::Avx512 {
                                true => amx::q8_product(&x, m, w)?,
                                false => qgemm::product(&x, m, w)?,
                            }
                        }
                        Kernel::Q4(_, l) => q4gemm::product(&x, m, &p4[at * q4_levels.len() + l])?,
                    };
                    let t = s.elapsed().as_secs_f64() * 1e3;
                    drop(y);
                    if rep > 0 {
                        times[i].push(t); // the first round warms up
                    }
                }
            }
            let flop = 2.0 * (m * sh.out * sh.inp) as f64;
            for (i, t) in times.into_iter().enumerate() {
                let ms = median(t);
                layer_ms[i] += ms;
                let (kernel, blocking) = configs[i].label();
                let gflops = flop / ms / 1e6;
                println!(
                    "rows {m:>5} {:>8} {:>5}x{:<5} {kernel:>4} {blocking:<40} {ms:>8.3} ms {gflops:>7.1} GFLOP/s",
                    sh.name, sh.out, sh.inp
                );
                report.push(serde_json::json!({
                    "rows": m, "layer": sh.name, "out": sh.out, "in": sh.inp,
                    "kernel": kernel, "blocking": blocking, "ms": ms, "gflops": gflops,
                }));
            }
        }
        for (c, ms) in configs.iter().zip(&layer_ms) {
            let (kernel, blocking) = c.label();
            println!("rows {m:>5} one layer: {kernel:>4} {blocking:<40} {ms:>8.3} ms");
        }
    }
    let doc = serde_json::json!({ "isa": isa, "amx": amx, "repeats": repeats, "results": report });
    write_report("target/bench/cpu_linear.json", &doc)
}
