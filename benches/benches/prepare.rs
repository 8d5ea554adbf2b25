//! The prepare stage (render + exact prefix / suffix split) with the exact fast encoder against
//! the same stage encoding with Hugging Face `tokenizers` (the reference), side by side.
//!
//! `cargo bench -p forkscore-benches --bench prepare` — for field counts × context lengths, the
//! median wall time of `Engine::prepare`'s split with each encoder, and of one plain encode of
//! the rendered prompt with each (the peer: `tokenizers`' `encode_fast`). Round-robin: each
//! repeat runs both sides on the same context. Writes target/bench/prepare.json.
//! Env: FORKSCORE_BENCH_FIELDS (default 8,28), FORKSCORE_BENCH_WORDS (default 40,600),
//! FORKSCORE_BENCH_REPEATS (default 21), FORKSCORE_BENCH_TEXT=<file> (each repeat's context cut
//! from the next words of this text, so the per-word caches of both encoders see new words,
//! instead of the repeated support ticket), FORKSCORE_BENCH_OUT.

use forkscore_backends::candle::{DeviceSpec, LoadOptions};
use forkscore_benches::{
    context_of, env_or, load_engine, load_engine_with, median, triage_subset, write_report,
};
use forkscore_engine::ChatTokenizer;
use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use forkscore_testkit::tokenizers::Family;
use std::time::Instant;

fn counts(name: &str, default: &str) -> anyhow::Result<Vec<usize>> {
    env_or(name, default)
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|e| anyhow::anyhow!("{name}: {s:?} is not a count: {e}"))
        })
        .collect()
}

/// Context `index` of about `words` words: the `index`-th run of `words` words of `text`
/// (wrapping) when given, else the repeated support ticket.
fn context(text: Option<&[&str]>, words: usize, index: usize) -> String {
    match text {
        Some(t) if !t.is_empty() => (0..words)
            .map(|k| t[(index * words + k) % t.len()])
            .collect::<Vec<_>>()
            .join(" "),
        _ => context_of(words),
    }
}

fn main() -> anyhow::Result<()> {
    let fields = counts("FORKSCORE_BENCH_FIELDS", "8,28")?;
    let words = counts("FORKSCORE_BENCH_WORDS", "40,600")?;
    let repeats = counts("FORKSCORE_BENCH_REPEATS", "21")?[0].max(1);
    let text = match std::env::var("FORKSCORE_BENCH_TEXT") {
        Ok(p) => Some(std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("{p}: {e}"))?),
        Err(_) => None,
    };
    let dir = std::env::temp_dir().join("forkscore-bench-prepare-qwen25");
    if !dir.join("config.json").is_file() {
        write_hf_folder(&dir, &TinySpec::qwen25())?;
    }
    let words_of: Option<Vec<&str>> = text.as_deref().map(|t| t.split_whitespace().collect());
    let options = LoadOptions::for_device(DeviceSpec::Cpu);
    let fast = load_engine(&dir, &options)?;
    let reference = load_engine_with(&dir, &options, |t| t.with_fast_encoder(false))?;
    anyhow::ensure!(
        fast.tokenizer().fast_encoder(),
        "the bench tokenizer does not take the fast encoder"
    );
    // the fast encoder's tables are built on first use: time that once, on a fresh tokenizer
    let fresh = ChatTokenizer::for_model(&dir, Some(Family::Qwen2))?;
    let t = Instant::now();
    fresh.encode("warm up")?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    println!("fast encoder built in {build_ms:.1} ms");
    println!(
        "{:>6} {:>6} {:>8} {:>11} {:>11} {:>7} {:>11} {:>11} {:>7}",
        "fields",
        "words",
        "prefix",
        "split ref",
        "split fast",
        "ratio",
        "encode ref",
        "enc fast",
        "ratio"
    );
    let mut rows = Vec::new();
    for &f in &fields {
        let schema = triage_subset(f)?;
        let (cf, cr) = (fast.compile(&schema)?, reference.compile(&schema)?);
        for &w in &words {
            let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            let mut prefix = 0;
            for r in 0..repeats {
                let ctx = context(words_of.as_deref(), w, r);
                let pr = reference.prepare(&ctx, &cr, usize::MAX)?;
                let pf = fast.prepare(&ctx, &cf, usize::MAX)?;
                anyhow::ensure!(
                    pr.split().prefix_ids == pf.split().prefix_ids
                        && pr.split().suffix_ids == pf.split().suffix_ids,
                    "the two encoders split context {r} differently"
                );
                t[0].push(pr.split_ms());
                t[1].push(pf.split_ms());
                prefix = pf.split().prefix_ids.len();
                let text = &pf.split().prefix_text;
                for (k, tok) in [(2, reference.tokenizer()), (3, fast.tokenizer())] {
                    // a context of its own for the plain encode, so no word cache is warmed by
                    // the split just before
                    let other = context(words_of.as_deref(), w, r + repeats);
                    let text = text.replace(&ctx, &other);
                    let start = Instant::now();
                    std::hint::black_box(tok.encode(&text)?);
                    t[k].push(start.elapsed().as_secs_f64() * 1e3);
                }
            }
            let [sr, sf, er, ef] = t.map(median);
            println!(
                "{f:>6} {w:>6} {prefix:>8} {sr:>9.3}ms {sf:>9.3}ms {:>6.1}× {er:>9.3}ms {ef:>9.3}ms {:>6.1}×",
                sr / sf,
                er / ef
            );
            rows.push(serde_json::json!({
                "fields": f, "context_words": w, "prefix_tokens": prefix,
                "split_reference_ms": sr, "split_fast_ms": sf, "split_speedup": sr / sf,
                "encode_reference_ms": er, "encode_fast_ms": ef, "encode_speedup": er / ef,
            }));
        }
    }
    write_report(
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench/prepare.json"),
        &serde_json::json!({
            "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "repeats": repeats, "fast_encoder_build_ms": build_ms, "text": std::env::var("FORKSCORE_BENCH_TEXT").ok(), "rows": rows,
        }),
    )
}
