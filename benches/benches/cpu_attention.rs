//! The CPU attention kernel alone, at a model's attention shapes, under several tile sizes in
//! one run: the harness the attention defaults are chosen with (`cpu_attention::TileSizes`).
//!
//! `cargo bench -p forkscore-benches --bench cpu_attention` — prints ms and GFLOP/s (the
//! causal products' multiply-adds × 2, only the keys each query sees) per (case, path), and
//! writes target/bench/cpu_attention.json. The paths are timed round-robin (one call of each
//! in turn, repeated), so a drift of the machine falls on all of them alike; the figure is the
//! median.
//!
//! Env:
//! - FORKSCORE_BENCH_SIZES: `;`-separated tile sizes (`query_block=16,tile_rows=128`; keys as
//!   `FORKSCORE_CPU_ATTENTION`, over the default; an empty spec is the default). Default: the
//!   default alone.
//! - FORKSCORE_BENCH_CASES: `;`-separated cases, `prefill:L` (one causal row of L tokens) or
//!   `score:B,L,P` (B rows of L tokens over a shared past of P). Default: Qwen2.5-0.5B's
//!   8- and 28-field decisions, `prefill:480;prefill:964;score:8,4,480;score:28,5,964`.
//! - FORKSCORE_BENCH_HEADS: `H,Hkv,hd` (default 14,2,64).
//! - FORKSCORE_BENCH_REPEATS: calls per path and case (default 7).

use anyhow::{bail, Context};
use candle_core::{Device, Tensor};
use forkscore_benches::{env_or, median, write_report};
use forkscore_kernels::cpu::attention::{self, NewKeys, Shape, TileSizes};
use std::time::Instant;

fn counts(s: &str, what: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .map(|c| {
            c.trim()
                .parse()
                .with_context(|| format!("{what}: `{c}` is not a count"))
        })
        .collect()
}

/// One timed shape: `rows` rows of `len` new tokens over a shared past of `past` tokens.
struct Case {
    name: String,
    rows: usize,
    len: usize,
    past: usize,
}

fn parse_case(s: &str) -> anyhow::Result<Case> {
    let (kind, dims) = s
        .trim()
        .split_once(':')
        .with_context(|| format!("case `{s}` is not prefill:L or score:B,L,P"))?;
    let (rows, len, past) = match (kind, counts(dims, s)?.as_slice()) {
        ("prefill", &[l]) => (1, l, 0),
        ("score", &[b, l, p]) => (b, l, p),
        _ => bail!("case `{s}` is not prefill:L or score:B,L,P"),
    };
    if rows == 0 || len == 0 {
        bail!("case `{s}`: rows and tokens must be at least 1");
    }
    Ok(Case {
        name: s.trim().to_string(),
        rows,
        len,
        past,
    })
}

fn main() -> anyhow::Result<()> {
    // the FORKSCORE_* switches (the kernels' level cap and prefetch among them), read and
    // checked as a model load does
    forkscore_backends::switches::Switches::current()
        .validate(|_, _| Ok(()))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let repeats: usize = env_or("FORKSCORE_BENCH_REPEATS", "7")
        .parse()
        .context("FORKSCORE_BENCH_REPEATS")?;
    if repeats == 0 {
        bail!("FORKSCORE_BENCH_REPEATS must be at least 1");
    }
    let heads = counts(
        &env_or("FORKSCORE_BENCH_HEADS", "14,2,64"),
        "FORKSCORE_BENCH_HEADS",
    )?;
    let &[h, hkv, hd] = heads.as_slice() else {
        bail!("FORKSCORE_BENCH_HEADS is H,Hkv,hd");
    };
    if hkv == 0 || hd == 0 || h % hkv != 0 {
        bail!("FORKSCORE_BENCH_HEADS: H must be a multiple of Hkv, both and hd at least 1");
    }
    let cases: Vec<Case> = env_or(
        "FORKSCORE_BENCH_CASES",
        "prefill:480;prefill:964;score:8,4,480;score:28,5,964",
    )
    .split(';')
    .filter(|s| !s.trim().is_empty())
    .map(parse_case)
    .collect::<anyhow::Result<_>>()?;
    let paths: Vec<(String, TileSizes)> = env_or("FORKSCORE_BENCH_SIZES", "")
        .split(';')
        .map(|spec| {
            let spec = spec.trim();
            let name = if spec.is_empty() { "default" } else { spec };
            let sizes = TileSizes::parse(spec)
                .map_err(|reason| anyhow::anyhow!("attention tile sizes `{spec}`: {reason}"))?;
            Ok((name.to_string(), sizes))
        })
        .collect::<anyhow::Result<_>>()?;
    println!(
        "cpu_attention: {} rayon threads, heads {h}/{hkv} × {hd}, {repeats} calls each",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "default".into())
    );
    let dev = Device::Cpu;
    let mut report = Vec::new();
    // random f32 values of a shape, row-major
    let randn = |dims: &[usize]| -> anyhow::Result<Vec<f32>> {
        Ok(Tensor::randn(0f32, 1.0, dims, &dev)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    };
    for c in &cases {
        // causal attention of the queries over the new keys and, when there is one, a past
        // every row sees whole (one slot): a prefill (one row, no past) or a scoring pass
        let q = randn(&[c.rows, h, c.len, hd])?;
        let k = randn(&[c.rows, hkv, c.len, hd])?;
        let v = randn(&[c.rows, hkv, c.len, hd])?;
        let pk = randn(&[hkv, 1, c.past, hd])?;
        let pv = randn(&[hkv, 1, c.past, hd])?;
        let shape = Shape {
            b: c.rows,
            h,
            hkv,
            l: c.len,
            hd,
            p: c.past,
            slots: 1,
        };
        let starts = vec![0; c.rows];
        let keys = match c.len > 1 {
            true => NewKeys::Causal,
            false => NewKeys::All,
        };
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
        for rep in 0..=repeats {
            for (i, (_, sizes)) in paths.iter().enumerate() {
                let s = Instant::now();
                let o = attention::attend(shape, (&q, &k, &v), (&pk, &pv), &starts, keys, *sizes)?;
                let t = s.elapsed().as_secs_f64() * 1e3;
                drop(o);
                if rep > 0 {
                    times[i].push(t); // the first round warms up
                }
            }
        }
        // multiply-adds: each query's visible keys (the whole past, new keys up to itself),
        // twice (scores and values), hd each, every query head
        let visible: usize = (0..c.len).map(|i| c.past + i + 1).sum();
        let flop = 2.0 * 2.0 * (c.rows * h * visible * hd) as f64;
        for (i, t) in times.into_iter().enumerate() {
            let ms = median(t);
            let gflops = flop / ms / 1e6;
            let name = &paths[i].0;
            println!(
                "{:<20} {name:<40} {ms:>9.3} ms {gflops:>7.1} GFLOP/s",
                c.name
            );
            report.push(serde_json::json!({
                "case": c.name, "rows": c.rows, "tokens": c.len, "past": c.past,
                "path": name, "ms": ms, "gflops": gflops,
            }));
        }
    }
    let doc = serde_json::json!({ "heads": [h, hkv, hd], "repeats": repeats, "results": report });
    write_report("target/bench/cpu_attention.json", &doc)
}
