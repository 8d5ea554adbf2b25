//! Modes side by side: parallel vs cached-serial vs independent (and field_batch_size), for
//! several field counts and context lengths, in ONE run, reported as ratios.
//!
//! `cargo bench -p forkscore-benches --bench modes` — writes target/bench/modes.json and prints
//! a table. Env: FORKSCORE_BENCH_MODEL=<HF folder> to measure a real checkpoint instead of the
//! seeded bench-size model; FORKSCORE_BENCH_REPEATS (default 5); FORKSCORE_BENCH_DEVICE
//! (default cpu).

use forkscore_backends::candle::{DeviceSpec, LoadOptions};
use forkscore_benches::{context_of, load_engine, median_ms, triage_subset};
use forkscore_engine::{Mode, ScoreOptions};
use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use std::path::PathBuf;

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
            let spec = TinySpec {
                hidden: 256,
                layers: 4,
                heads: 8,
                kv_heads: 2,
                head_dim: 32,
                intermediate: 704,
                seed: 77,
                ..TinySpec::qwen25()
            };
            let dir = std::env::temp_dir().join("forkscore-bench-qwen25-h256");
            if !dir.join("config.json").is_file() {
                write_hf_folder(&dir, &spec)?;
            }
            (
                dir,
                "seeded qwen2.5 shape, hidden 256, 4 layers".to_string(),
            )
        }
    };
    let engine = load_engine(&dir, &LoadOptions::for_device(device))?;
    let mut rows = Vec::new();
    println!("model: {label} on {device}");
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
                    engine.score(&context, &compiled, &opts)?;
                    Ok(())
                })
            };
            let prefix = engine
                .prepare(&context, &compiled, usize::MAX)?
                .split
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
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out)?;
    let report = serde_json::json!({"model": label, "device": device.to_string(), "repeats": repeats, "rows": rows});
    std::fs::write(
        out.join("modes.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("report: {}", out.join("modes.json").display());
    Ok(())
}
