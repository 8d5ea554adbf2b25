//! Modes side by side: parallel vs cached-serial vs independent (and field_batch_size), for
//! several field counts and context lengths, in ONE run, reported as ratios.
//!
//! `cargo bench -p forkscore-benches --bench modes` — writes target/bench/modes.json and prints
//! a table. Env: FORKSCORE_BENCH_MODEL=<HF folder> to measure a real checkpoint instead of the
//! seeded bench-size model; FORKSCORE_BENCH_REPEATS (default 5); FORKSCORE_BENCH_DEVICE
//! (default cpu); FORKSCORE_BENCH_DTYPE (f32 | bf16 | f16, default: the device's, f32 on CPU,
//! bf16 on GPUs); FORKSCORE_BENCH_OUT (report folder, default target/bench of the source tree).
//! Shape of the seeded model (Qwen2.5 layout): FORKSCORE_BENCH_HIDDEN (256), _LAYERS (4),
//! _HEADS (8), _KV_HEADS (2), _INTERMEDIATE (hidden * 11 / 4); head_dim = hidden / heads.

use forkscore_backends::candle::{ComputeDType, DeviceSpec, LoadOptions};
use forkscore_backends::Backend;
use forkscore_benches::{context_of, load_engine, median_ms, triage_subset};
use forkscore_engine::{Mode, ScoreOptions};
use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use std::path::PathBuf;

/// A usize knob from the environment, `default` when unset; an unparsable value is an error.
fn knob(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={v:?} is not a count: {e}")),
        Err(_) => Ok(default),
    }
}

fn parse_dtype(s: &str) -> anyhow::Result<ComputeDType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" => Ok(ComputeDType::F32),
        "bf16" => Ok(ComputeDType::Bf16),
        "f16" => Ok(ComputeDType::F16),
        other => anyhow::bail!("FORKSCORE_BENCH_DTYPE={other:?}: expected f32, bf16 or f16"),
    }
}

fn main() -> anyhow::Result<()> {
    let repeats: usize = std::env::var("FORKSCORE_BENCH_REPEATS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let device: DeviceSpec = std::env::var("FORKSCORE_BENCH_DEVICE")
        .unwrap_or_else(|_| "cpu".into())
        .parse()?;
    let (dir, label) = match std::env::var("FORKSCORE_BENCH_MODEL") {
        Ok(p) => (PathBuf::from(&p), p),
        Err(_) => {
            // Bench-size Qwen2.5 shape: big enough that compute, not overhead, dominates.
            let hidden = knob("FORKSCORE_BENCH_HIDDEN", 256)?;
            let layers = knob("FORKSCORE_BENCH_LAYERS", 4)?;
            let heads = knob("FORKSCORE_BENCH_HEADS", 8)?;
            let kv_heads = knob("FORKSCORE_BENCH_KV_HEADS", 2)?;
            let intermediate = knob("FORKSCORE_BENCH_INTERMEDIATE", hidden * 11 / 4)?;
            anyhow::ensure!(
                heads > 0 && hidden % heads == 0,
                "FORKSCORE_BENCH_HIDDEN ({hidden}) must be a multiple of FORKSCORE_BENCH_HEADS ({heads})"
            );
            let spec = TinySpec {
                hidden,
                layers,
                heads,
                kv_heads,
                head_dim: hidden / heads,
                intermediate,
                seed: 77,
                ..TinySpec::qwen25()
            };
            // The default shape keeps its historical folder name.
            let name = if (hidden, layers, heads, kv_heads, intermediate) == (256, 4, 8, 2, 704) {
                "forkscore-bench-qwen25-h256".to_string()
            } else {
                format!("forkscore-bench-qwen25-h{hidden}-l{layers}-a{heads}-kv{kv_heads}-i{intermediate}")
            };
            let dir = std::env::temp_dir().join(name);
            if !dir.join("config.json").is_file() {
                write_hf_folder(&dir, &spec)?;
            }
            (
                dir,
                format!(
                    "seeded qwen2.5 shape, hidden {hidden}, {layers} layers, {heads} heads / {kv_heads} kv, mlp {intermediate}"
                ),
            )
        }
    };
    let mut options = LoadOptions::for_device(device);
    if let Ok(d) = std::env::var("FORKSCORE_BENCH_DTYPE") {
        options.dtype = parse_dtype(&d)?;
    }
    let engine = load_engine(&dir, &options)?;
    let dtype = engine.backend().facts().dtype;
    let mut rows = Vec::new();
    println!("model: {label} on {device} ({dtype})");
    println!(
        "{:>6} {:>8} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "fields", "prefix", "parallel", "fbs=4", "cached-ser", "independent", "ind/par", "ser/par"
    );
    for &words in &[40usize, 600] {
        let context = context_of(words);
        for &fields in &[1usize, 3, 8, 28] {
            let schema = triage_subset(fields)?;
            let compiled = engine.compile(&schema)?;
            let run = |mode: Mode, fbs: Option<usize>| {
                let opts = ScoreOptions {
                    mode,
                    field_batch_size: fbs,
                    ..ScoreOptions::default()
                };
                median_ms(1, repeats, || {
                    engine.decide(&context, &compiled, &opts)?;
                    Ok(())
                })
            };
            let prefix = engine
                .prepare(&context, &compiled, usize::MAX)?
                .split()
                .prefix_ids
                .len();
            let par = run(Mode::Parallel, None)?;
            let fbs4 = run(Mode::Parallel, Some(4))?;
            let ser = run(Mode::CachedSerial, None)?;
            let ind = run(Mode::Independent, None)?;
            println!(
                "{fields:>6} {prefix:>8} {par:>10.1}ms {fbs4:>10.1}ms {ser:>10.1}ms {ind:>10.1}ms {:>9.2}x {:>9.2}x",
                ind / par,
                ser / par
            );
            rows.push(serde_json::json!({
                "fields": fields, "context_words": words, "prefix_tokens": prefix,
                "parallel_ms": par, "parallel_fbs4_ms": fbs4, "cached_serial_ms": ser, "independent_ms": ind,
                "speedup_vs_independent": ind / par, "speedup_vs_cached_serial": ser / par,
            }));
        }
    }
    let out = std::env::var("FORKSCORE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench"));
    std::fs::create_dir_all(&out)?;
    let report = serde_json::json!({"model": label, "device": device.to_string(), "dtype": dtype, "repeats": repeats, "rows": rows});
    std::fs::write(
        out.join("modes.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("report: {}", out.join("modes.json").display());
    Ok(())
}
