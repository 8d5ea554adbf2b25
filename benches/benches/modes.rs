//! Modes side by side: parallel vs cached-serial vs independent vs tree (and field_batch_size), for
//! several field counts and context lengths, in ONE run, reported as ratios.
//!
//! `cargo bench -p forkscore-benches --bench modes` — writes target/bench/modes.json and prints
//! a table. Env: FORKSCORE_BENCH_MODEL=<HF folder> to measure a real checkpoint instead of the
//! seeded bench-size model; FORKSCORE_BENCH_REPEATS (default 5); FORKSCORE_BENCH_DEVICE
//! (default cpu); FORKSCORE_BENCH_DTYPE (f32 | bf16 | f16, default: the device's, f32 on CPU,
//! bf16 on GPUs; through the command line's precision policy, so on a CPU bf16 runs as
//! `--quantize bf16` where a fast bf16 kernel exists, unless FORKSCORE_BENCH_RAW_DTYPE=1 loads
//! the dtype as given); FORKSCORE_BENCH_OUT (report folder, default target/bench of the source tree);
//! FORKSCORE_BENCH_DUMP=<file> also writes, per case, exactly what the model is fed (prefix ids,
//! each row's suffix ids and code ids) and each row's candidate logits and argmax code, so that a
//! peer (scripts/gpu-real/peer.py) can score the same token ids.
//! FORKSCORE_BENCH_FIELDS (field counts, default 1,3,8,28), FORKSCORE_BENCH_WORDS (context
//! lengths in words, default 40,600) and FORKSCORE_BENCH_MODES (default
//! parallel,fbs4,cached-serial,independent,tree; a mode left out is null in the report) select
//! cases. FORKSCORE_BENCH_PRESETS (e.g.
//! fintech_fraud,code_security,support_triage,high_cardinality_255) runs each named preset of
//! fixtures/examples whole instead of the field counts (`high_cardinality_255` with literal
//! scoring: its 255 choices exceed the 26 codes).
//! Each row also carries, per mode, the branch memory of one decision (`branch`: backbone passes,
//! token positions run, branch K/V bytes and the peak of one pass — branch K/V + one layer's f32
//! attention scores + masks + any merged past copy, `forkscore_backends::BranchFootprint`).
//! modes.json (and the dump) are rewritten after every case.
//! Each row of modes.json carries the median per-stage telemetry timings of every mode
//! (`stages_ms`: render, split, prefill, score, assemble, total).
//! FORKSCORE_BENCH_QUANTIZE (q8_0 | q4k | bf16 | int8) loads the linear weights quantized; the report then
//! records the scheme, what each linear weight became, the load time and the resident memory.
//! FORKSCORE_BENCH_PREFILL_CHUNK (prefix tokens per prefill pass; default the device's, 512 on
//! CPU) for the chunk-size A/B.
//! FORKSCORE_BENCH_PROFILE=1 adds, per case, one extra parallel run with the per-layer-kind
//! profile on (`profile_parallel` in the report; the timed runs stay unprofiled).
//! Shape of the seeded model (Qwen2.5 layout): FORKSCORE_BENCH_HIDDEN (256), _LAYERS (4),
//! _HEADS (8), _KV_HEADS (2), _INTERMEDIATE (hidden * 11 / 4); head_dim = hidden / heads.

use forkscore_backends::candle::{profile, ComputeDType, DeviceSpec, LoadOptions};
use forkscore_backends::{Backend, BranchFootprint};
use forkscore_benches::{case_dump, context_of, load_engine, median_stages, triage_subset};
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

/// A comma-separated list of counts from the environment, `default` when unset.
fn counts(name: &str, default: &[usize]) -> anyhow::Result<Vec<usize>> {
    match std::env::var(name) {
        Ok(v) => v
            .split(',')
            .map(|c| {
                c.trim()
                    .parse()
                    .map_err(|e| anyhow::anyhow!("{name}={v:?}: {c:?} is not a count: {e}"))
            })
            .collect(),
        Err(_) => Ok(default.to_vec()),
    }
}

/// The modes to time (FORKSCORE_BENCH_MODES, default all five).
fn bench_modes() -> anyhow::Result<Vec<String>> {
    const ALL: [&str; 5] = ["parallel", "fbs4", "cached-serial", "independent", "tree"];
    let Ok(v) = std::env::var("FORKSCORE_BENCH_MODES") else {
        return Ok(ALL.iter().map(|m| m.to_string()).collect());
    };
    v.split(',')
        .map(|m| {
            let m = m.trim();
            anyhow::ensure!(
                ALL.contains(&m),
                "FORKSCORE_BENCH_MODES={v:?}: unknown mode {m:?} (expected {})",
                ALL.join(", ")
            );
            Ok(m.to_string())
        })
        .collect()
}

/// Resident set size of this process in MiB (Linux `/proc/self/statm`), `None` elsewhere.
fn resident_mib() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0 / (1024.0 * 1024.0))
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
    if let Ok(c) = std::env::var("FORKSCORE_BENCH_PREFILL_CHUNK") {
        options.prefill_chunk = c.parse().ok().filter(|&c: &usize| c > 0).ok_or_else(|| {
            anyhow::anyhow!("FORKSCORE_BENCH_PREFILL_CHUNK={c:?}: not a token count > 0")
        })?;
    }
    if let Ok(q) = std::env::var("FORKSCORE_BENCH_QUANTIZE") {
        options.quantization = Some(
            q.parse()
                .map_err(|e| anyhow::anyhow!("FORKSCORE_BENCH_QUANTIZE={q:?}: {e}"))?,
        );
    }
    // the CLI's precision policy (`--dtype bf16` on a CPU runs as `--quantize bf16` where a fast
    // bf16 kernel exists), so a dtype asked here measures what the command line runs; with
    // FORKSCORE_BENCH_RAW_DTYPE=1 the dtype is loaded as given (the bf16 tensor model)
    if std::env::var("FORKSCORE_BENCH_RAW_DTYPE").as_deref() != Ok("1") {
        let bf16_kernel = match device {
            DeviceSpec::Cpu => forkscore_backends::candle::cpu::bf16_kernel(),
            _ => None,
        };
        let precision = forkscore_frontend::precision::resolve(
            device,
            Some(options.dtype),
            options.quantization,
            bf16_kernel,
        )?;
        options.dtype = precision.dtype;
        options.quantization = precision.quantization;
    }
    let load_start = std::time::Instant::now();
    let engine = load_engine(&dir, &options)?;
    let load_ms = load_start.elapsed().as_secs_f64() * 1e3;
    let dtype = engine.backend().facts().dtype;
    let quantization = options.quantization.map(|q| q.to_string());
    let quant_summary = engine.backend().quant_summary().by_type;
    let rss_mib = resident_mib();
    let fields_list = counts("FORKSCORE_BENCH_FIELDS", &[1, 3, 8, 28])?;
    let words_list = counts("FORKSCORE_BENCH_WORDS", &[40, 600])?;
    let modes = bench_modes()?;
    let out = std::env::var("FORKSCORE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench"));
    std::fs::create_dir_all(&out)?;
    let dump_path = std::env::var_os("FORKSCORE_BENCH_DUMP").map(PathBuf::from);
    let mut rows = Vec::new();
    let mut dump = Vec::new();
    // Rewritten after every case, so a run cut short by a timeout still leaves its rows.
    let write = |rows: &Vec<serde_json::Value>,
                 dump: &Vec<serde_json::Value>|
     -> anyhow::Result<()> {
        let report = serde_json::json!({"model": label, "device": device.to_string(), "dtype": dtype, "quantization": quantization, "linear_weights": quant_summary, "load_ms": load_ms, "rss_after_load_mib": rss_mib, "cpu_kernel_isa": forkscore_backends::candle::cpu_kernel_isa(), "repeats": repeats, "rows": rows});
        std::fs::write(
            out.join("modes.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
        if let Some(path) = &dump_path {
            let report = serde_json::json!({"model": label, "model_dir": dir, "device": device.to_string(), "dtype": dtype, "quantization": quantization, "cases": dump});
            std::fs::write(path, serde_json::to_string(&report)?)?;
        }
        Ok(())
    };
    println!(
        "model: {label} on {device} ({dtype}, quantization {}, CPU kernels {}), loaded in {load_ms:.0} ms, resident {} MiB",
        quantization.as_deref().unwrap_or("none"),
        forkscore_backends::candle::cpu_kernel_isa().unwrap_or("none"),
        rss_mib.map_or("?".to_string(), |m| format!("{m:.0}"))
    );
    println!(
        "{:>6} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "fields",
        "prefix",
        "parallel",
        "fbs=4",
        "cached-ser",
        "independent",
        "tree",
        "ind/par",
        "ser/par",
        "tree/par",
        "par peak",
        "tree peak"
    );
    // FORKSCORE_BENCH_PROFILE=1: per case, one extra parallel run with the per-layer-kind
    // profile (embed / attention / linear_attention / mlp / head), reported beside the timings.
    let profile_cases = std::env::var("FORKSCORE_BENCH_PROFILE").is_ok_and(|v| v == "1");
    // FORKSCORE_BENCH_PRESETS=<names of fixtures/examples/*.json>: each preset's whole schema is a
    // case (instead of the first N support-triage fields); `high_cardinality_255` (over the 26
    // codes) is scored with literal scoring.
    let cases: Vec<(Option<String>, forkscore_engine::Schema)> =
        match std::env::var("FORKSCORE_BENCH_PRESETS") {
            Ok(names) => names
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| Ok((Some(n.to_string()), preset_schema(n)?)))
                .collect::<anyhow::Result<_>>()?,
            Err(_) => fields_list
                .iter()
                .map(|&n| Ok((None, triage_subset(n)?)))
                .collect::<anyhow::Result<_>>()?,
        };
    for &words in &words_list {
        let context = context_of(words);
        for (preset, schema) in &cases {
            let fields = schema.fields().len();
            let compiled = engine.compile(schema)?;
            // Per selected mode: the median wall ms, the median of each telemetry stage over
            // the timed runs and the branch memory of one decision (None when not selected).
            // The timed runs interleave the modes (one decision of each mode per round), so a
            // drift of the machine's speed falls on every mode alike instead of on whichever ran
            // during a slow stretch.
            let wanted: Vec<(&str, Mode, Option<usize>)> = [
                ("parallel", Mode::Parallel, None),
                ("fbs4", Mode::Parallel, Some(4)),
                ("cached-serial", Mode::CachedSerial, None),
                ("independent", Mode::Independent, None),
                ("tree", Mode::Tree, None),
            ]
            .into_iter()
            .filter(|(key, _, _)| modes.iter().any(|m| m == key))
            .collect();
            let opts_of = |mode: Mode, fbs: Option<usize>| ScoreOptions {
                mode,
                field_batch_size: fbs,
                ..ScoreOptions::default()
            };
            let mut branches = Vec::with_capacity(wanted.len());
            for &(_, mode, fbs) in &wanted {
                // one untimed decision, alone, for its branch footprint (also the warm-up)
                engine.backend().take_branch_footprint();
                engine.decide(&context, &compiled, &opts_of(mode, fbs))?;
                branches.push(engine.backend().take_branch_footprint());
            }
            let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(repeats); wanted.len()];
            let mut stages: Vec<Vec<_>> = vec![Vec::with_capacity(repeats); wanted.len()];
            for _ in 0..repeats {
                for (i, &(_, mode, fbs)) in wanted.iter().enumerate() {
                    let t = std::time::Instant::now();
                    let d = engine.decide(&context, &compiled, &opts_of(mode, fbs))?;
                    times[i].push(t.elapsed().as_secs_f64() * 1e3);
                    stages[i].push(d.telemetry.timings_ms);
                }
            }
            let result = |key: &str| -> Option<(f64, serde_json::Value, BranchFootprint)> {
                let i = wanted.iter().position(|(k, _, _)| *k == key)?;
                let mut t = times[i].clone();
                t.sort_by(f64::total_cmp);
                Some((t[t.len() / 2], median_stages(&stages[i]), branches[i]))
            };
            let prefix = engine
                .prepare(&context, &compiled, usize::MAX)?
                .split()
                .prefix_ids
                .len();
            let par = result("parallel");
            let fbs4 = result("fbs4");
            let ser = result("cached-serial");
            let ind = result("independent");
            let tree = result("tree");
            if dump_path.is_some() {
                let opts = ScoreOptions {
                    include_prompt: true,
                    ..ScoreOptions::default()
                };
                let decision = engine.decide(&context, &compiled, &opts)?;
                let mut case = case_dump(&compiled, &decision)?;
                case["fields"] = fields.into();
                case["context_words"] = words.into();
                dump.push(case);
            }
            // One more parallel run with the per-layer-kind profile on (device synchronised around
            // every region, so it is slower than the timed runs above, which ran without it).
            let profile = if profile_cases {
                profile::take();
                profile::set_enabled(true);
                let t0 = std::time::Instant::now();
                let d = engine.decide(&context, &compiled, &ScoreOptions::default());
                let wall = t0.elapsed().as_secs_f64() * 1e3;
                profile::set_enabled(false);
                d?;
                let regions: serde_json::Map<String, serde_json::Value> = profile::take()
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            serde_json::json!({"calls": v.calls, "ms": v.total.as_secs_f64() * 1e3}),
                        )
                    })
                    .collect();
                eprintln!("profile {fields} fields, {prefix} prefix tokens (parallel, synchronised, {wall:.1} ms): {}", serde_json::Value::Object(regions.clone()));
                Some(serde_json::json!({"wall_ms": wall, "regions": regions}))
            } else {
                None
            };
            type Timed = Option<(f64, serde_json::Value, BranchFootprint)>;
            let ms = |r: &Timed| r.as_ref().map(|(m, _, _)| *m);
            let st = |r: &Timed| r.as_ref().map(|(_, s, _)| s.clone());
            let br = |r: &Timed| {
                r.as_ref().map(|(_, _, b)| {
                    serde_json::json!({"passes": b.passes, "tokens": b.tokens, "kv_bytes": b.kv_bytes, "peak_bytes": b.peak_bytes})
                })
            };
            let peak = |r: &Timed| {
                r.as_ref().map_or("-".to_string(), |(_, _, b)| {
                    format!("{:.2}MiB", b.peak_bytes as f64 / (1024.0 * 1024.0))
                })
            };
            let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
            let cell =
                |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v:.1}{unit}"));
            let (par_ms, ser_ms, ind_ms, tree_ms) = (ms(&par), ms(&ser), ms(&ind), ms(&tree));
            println!(
                "{fields:>6} {prefix:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>12} {:>12}",
                cell(par_ms, "ms"),
                cell(ms(&fbs4), "ms"),
                cell(ser_ms, "ms"),
                cell(ind_ms, "ms"),
                cell(tree_ms, "ms"),
                ratio(ind_ms, par_ms).map_or("-".into(), |r| format!("{r:.2}x")),
                ratio(ser_ms, par_ms).map_or("-".into(), |r| format!("{r:.2}x")),
                ratio(tree_ms, par_ms).map_or("-".into(), |r| format!("{r:.2}x")),
                peak(&par),
                peak(&tree),
            );
            rows.push(serde_json::json!({
                "preset": preset, "fields": fields, "context_words": words, "prefix_tokens": prefix,
                "parallel_ms": par_ms, "parallel_fbs4_ms": ms(&fbs4), "cached_serial_ms": ser_ms, "independent_ms": ind_ms, "tree_ms": tree_ms,
                "speedup_vs_independent": ratio(ind_ms, par_ms), "speedup_vs_cached_serial": ratio(ser_ms, par_ms), "tree_vs_parallel": ratio(tree_ms, par_ms),
                "tree_packing": engine.backend().tree_packing().name(),
                "stages_ms": {"parallel": st(&par), "parallel_fbs4": st(&fbs4), "cached_serial": st(&ser), "independent": st(&ind), "tree": st(&tree)},
                "branch": {"parallel": br(&par), "parallel_fbs4": br(&fbs4), "cached_serial": br(&ser), "independent": br(&ind), "tree": br(&tree)},
                "profile_parallel": profile,
            }));
            write(&rows, &dump)?;
        }
    }
    println!("report: {}", out.join("modes.json").display());
    if let Some(path) = &dump_path {
        println!("dump: {}", path.display());
    }
    Ok(())
}

/// The preset `name` of fixtures/examples as a schema; `high_cardinality_255` scored literally.
fn preset_schema(name: &str) -> anyhow::Result<forkscore_engine::Schema> {
    use forkscore_engine::schema::{LiteralMethod, Scoring};
    let text = match name {
        "fintech_fraud" => include_str!("../../fixtures/examples/fintech_fraud.json"),
        "code_security" => include_str!("../../fixtures/examples/code_security.json"),
        "support_triage" => include_str!("../../fixtures/examples/support_triage.json"),
        "high_cardinality_255" => include_str!("../../fixtures/examples/high_cardinality_255.json"),
        other => anyhow::bail!(
            "FORKSCORE_BENCH_PRESETS: unknown preset {other:?} (expected fintech_fraud, code_security, support_triage or high_cardinality_255)"
        ),
    };
    let scoring = if name == "high_cardinality_255" {
        Scoring::Literal(LiteralMethod::Exact)
    } else {
        Scoring::Code
    };
    Ok(forkscore_engine::Schema::from_json_str_with(text, scoring)?)
}
