//! forkscore vs the autoregressive baseline: for each preset of fixtures/examples, the same
//! model WRITES the JSON answer (greedy, one forward per token over the cached state,
//! `Engine::generate`) and forkscore decides the same context and schema (`Engine::decide`), in
//! one process; reported as the speed-up = generation total / forkscore total (medians).
//!
//! `cargo bench -p forkscore-benches --bench generate` — writes target/bench/generate.json and
//! prints a table. Env (the modes bench's knobs): FORKSCORE_BENCH_MODEL=<HF folder> (default:
//! target/demo-qwen2.5 when it exists, else the same tiny demo checkpoint written to a temp
//! folder); FORKSCORE_BENCH_DEVICE (default cpu); FORKSCORE_BENCH_DTYPE (f32 | bf16 | f16, default
//! the device's); FORKSCORE_BENCH_QUANTIZE (q8_0 | q4k | bf16 | int8); FORKSCORE_BENCH_REPEATS (default 3,
//! after one warm-up run); FORKSCORE_BENCH_OUT (report folder); FORKSCORE_BENCH_PRESETS (default
//! fintech_fraud,code_security,support_triage,high_cardinality_255); FORKSCORE_BENCH_MAX_NEW_TOKENS
//! (default: each schema's own default, the longest answer object + 16).
//!
//! `high_cardinality_255` has 255 choices, over the 26 codes: forkscore scores it with literal
//! scoring (`Schema::from_json_str_with(text, Scoring::Literal(LiteralMethod::Exact))`); the other presets use codes.
//! On a random-weight model the generated text is garbage (it usually runs to max_new_tokens),
//! so each row also reports `answer_tokens` (the tokens of forkscore's own answer as compact
//! JSON: the least a model must write) and `speedup_at_answer_length`, the speed-up had the
//! baseline stopped after exactly that many tokens (its prefill + that many of its own
//! measured per-token steps) — an estimate, labelled as such in the report.

use forkscore_backends::candle::{ComputeDType, DeviceSpec, LoadOptions};
use forkscore_backends::Backend;
use forkscore_benches::{load_engine, median};
use forkscore_engine::generate::{eos_ids_from_folder, Baseline};
use forkscore_engine::schema::{LiteralMethod, Scoring};
use forkscore_engine::{GenerateOptions, Schema, ScoreOptions};
use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use std::path::PathBuf;

/// The presets, each with a context from fixtures/examples/decisions.jsonl.
const PRESETS: [(&str, &str, &str); 4] = [
    (
        "fintech_fraud",
        include_str!("../../fixtures/examples/fintech_fraud.json"),
        "New device in another country changed the password, then wired $9,800 to a new payee.",
    ),
    (
        "code_security",
        include_str!("../../fixtures/examples/code_security.json"),
        "query = \"SELECT * FROM users WHERE name = '\" + request.args['name'] + \"'\"",
    ),
    (
        "support_triage",
        include_str!("../../fixtures/examples/support_triage.json"),
        "Hi, I was charged twice for my Business plan this month. Please refund one charge. This is the third time!",
    ),
    (
        "high_cardinality_255",
        include_str!("../../fixtures/examples/high_cardinality_255.json"),
        "Frozen beef cuts.",
    ),
];

fn parse_dtype(s: &str) -> anyhow::Result<ComputeDType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" => Ok(ComputeDType::F32),
        "bf16" => Ok(ComputeDType::Bf16),
        "f16" => Ok(ComputeDType::F16),
        other => anyhow::bail!("FORKSCORE_BENCH_DTYPE={other:?}: expected f32, bf16 or f16"),
    }
}

fn main() -> anyhow::Result<()> {
    let repeats: usize = match std::env::var("FORKSCORE_BENCH_REPEATS") {
        Ok(v) => v
            .parse()
            .map_err(|e| anyhow::anyhow!("FORKSCORE_BENCH_REPEATS={v:?}: {e}"))?,
        Err(_) => 3,
    };
    anyhow::ensure!(repeats > 0, "FORKSCORE_BENCH_REPEATS must be at least 1");
    let device: DeviceSpec = std::env::var("FORKSCORE_BENCH_DEVICE")
        .unwrap_or_else(|_| "cpu".into())
        .parse()?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let (dir, label) = match std::env::var("FORKSCORE_BENCH_MODEL") {
        Ok(p) => (PathBuf::from(&p), p),
        Err(_) => {
            let demo = repo.join("target/demo-qwen2.5");
            if demo.join("config.json").is_file() {
                (
                    demo,
                    "target/demo-qwen2.5 (forkscore demo-model, random weights)".to_string(),
                )
            } else {
                let dir = std::env::temp_dir().join("forkscore-bench-demo-qwen25");
                if !dir.join("config.json").is_file() {
                    write_hf_folder(&dir, &TinySpec::qwen25())?;
                }
                (
                    dir,
                    "the qwen2.5 demo model (random weights), in a temp folder".to_string(),
                )
            }
        }
    };
    let mut options = LoadOptions::for_device(device);
    if let Ok(d) = std::env::var("FORKSCORE_BENCH_DTYPE") {
        options.dtype = parse_dtype(&d)?;
    }
    if let Ok(q) = std::env::var("FORKSCORE_BENCH_QUANTIZE") {
        options.quantization = Some(
            q.parse()
                .map_err(|e| anyhow::anyhow!("FORKSCORE_BENCH_QUANTIZE={q:?}: {e}"))?,
        );
    }
    let presets: Vec<String> = match std::env::var("FORKSCORE_BENCH_PRESETS") {
        Ok(v) => v.split(',').map(|p| p.trim().to_string()).collect(),
        Err(_) => PRESETS.iter().map(|p| p.0.to_string()).collect(),
    };
    for p in &presets {
        anyhow::ensure!(
            PRESETS.iter().any(|(n, _, _)| *n == p.as_str()),
            "FORKSCORE_BENCH_PRESETS: unknown preset {p:?}"
        );
    }
    let max_new_tokens: Option<usize> = match std::env::var("FORKSCORE_BENCH_MAX_NEW_TOKENS") {
        Ok(v) => Some(
            v.parse()
                .map_err(|e| anyhow::anyhow!("FORKSCORE_BENCH_MAX_NEW_TOKENS={v:?}: {e}"))?,
        ),
        Err(_) => None,
    };
    let out = std::env::var("FORKSCORE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo.join("target/bench"));
    std::fs::create_dir_all(&out)?;

    let engine = load_engine(&dir, &options)?;
    let dtype = engine.backend().facts().dtype;
    let gen_opts = GenerateOptions {
        max_new_tokens,
        eos_ids: eos_ids_from_folder(&dir),
        ..GenerateOptions::default()
    };
    let score_opts = ScoreOptions::default();
    println!("model: {label} on {device} ({dtype}), {repeats} repeats after 1 warm-up");
    println!(
        "{:<22} {:>7} {:>9} {:>8} {:>11} {:>12} {:>11} {:>9} {:>6} {:>9}",
        "preset",
        "fields",
        "gen tok",
        "stop",
        "forkscore",
        "generate",
        "prefill",
        "decode/t",
        "speedup",
        "est@ans"
    );
    let mut rows = Vec::new();
    for name in &presets {
        let (_, text, context) = PRESETS
            .iter()
            .find(|p| p.0 == name.as_str())
            .copied()
            .unwrap_or_default();
        let scoring = if *name == "high_cardinality_255" {
            Scoring::Literal(LiteralMethod::Exact)
        } else {
            Scoring::Code
        };
        let schema = Schema::from_json_str_with(text, scoring)?;
        let compiled = engine.compile(&schema)?;
        let mut runs: Vec<Baseline> = Vec::with_capacity(repeats);
        engine.generate_baseline(context, &compiled, &score_opts, &gen_opts)?; // warm-up
        for _ in 0..repeats {
            runs.push(engine.generate_baseline(context, &compiled, &score_opts, &gen_opts)?);
        }
        let g = |f: fn(&Baseline) -> f64| median(runs.iter().map(f).collect());
        let forkscore_ms = g(|b| b.forkscore.total_ms);
        let generate_ms = g(|b| b.generation.timings_ms.total_ms);
        let prefill_ms =
            g(|b| b.generation.timings_ms.prefill_ms + b.generation.timings_ms.prompt_ms);
        let per_step_ms = g(|b| {
            let t = &b.generation.timings_ms;
            t.decode_ms / (b.generation.decode_steps.saturating_sub(1)).max(1) as f64
        });
        let first = &runs[0];
        let answer = serde_json::to_string(&first.forkscore.output)?;
        let answer_tokens = engine.tokenizer().encode(&answer)?.len();
        // the baseline stopped right after the shortest valid answer: its prompt + prefill, then
        // (answer_tokens − 1) steps at its own measured per-step time
        let estimate_ms = prefill_ms + per_step_ms * answer_tokens.saturating_sub(1) as f64;
        let speedup = generate_ms / forkscore_ms;
        let speedup_at_answer = estimate_ms / forkscore_ms;
        let gen = &first.generation;
        println!(
            "{:<22} {:>7} {:>9} {:>8} {:>9.1}ms {:>10.1}ms {:>9.1}ms {:>7.2}ms {:>5.1}x {:>8.1}x",
            name,
            schema.fields().len(),
            gen.generated_tokens,
            format!("{:?}", gen.stop_reason),
            forkscore_ms,
            generate_ms,
            prefill_ms,
            per_step_ms,
            speedup,
            speedup_at_answer
        );
        rows.push(serde_json::json!({
            "preset": name, "scoring": scoring.name(),
            "fields": schema.fields().len(), "context": context,
            "forkscore_ms": forkscore_ms, "forkscore_input_tokens": first.forkscore.input_tokens,
            "generate_ms": generate_ms, "generate_prompt_and_prefill_ms": prefill_ms,
            "generate_decode_ms": g(|b| b.generation.timings_ms.decode_ms),
            "generate_ms_per_token": per_step_ms,
            "prompt_tokens": gen.prompt_tokens, "generated_tokens": gen.generated_tokens,
            "max_new_tokens": gen.max_new_tokens, "stop_reason": gen.stop_reason,
            "valid": gen.valid, "reason": gen.reason, "agree": first.agreement.agree,
            "disagree": first.agreement.disagree,
            "speedup": speedup,
            "answer_tokens": answer_tokens, "estimated_generate_ms_at_answer_length": estimate_ms,
            "speedup_at_answer_length": speedup_at_answer,
            "runs_ms": runs.iter().map(|b| serde_json::json!({"forkscore": b.forkscore.total_ms, "generate": b.generation.timings_ms.total_ms})).collect::<Vec<_>>(),
        }));
        let report = serde_json::json!({
            "model": label, "device": device.to_string(), "dtype": dtype,
            "quantization": options.quantization.map(|q| q.to_string()),
            "repeats": repeats, "warmup": 1,
            "speedup": "median generate total / median forkscore total (Engine::generate vs Engine::decide, same process, same context and schema)",
            "speedup_at_answer_length": "estimate: median (prompt + prefill) + (answer_tokens - 1) x the baseline's median ms per decode step, over the median forkscore total",
            "rows": rows,
        });
        std::fs::write(
            out.join("generate.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
    }
    println!("report: {}", out.join("generate.json").display());
    Ok(())
}
