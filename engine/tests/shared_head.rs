//! The shared prompt head of grouped decisions (`engine::head`) on tiny real-architecture
//! checkpoints (CPU f32, candle backend): decisions continuing the cached head equal the
//! whole-prompt prefill within f32 rounding with identical selections, the head is prefilled once
//! and reused (telemetry), a context's result does not depend on its group (bit for bit), and
//! independent mode and the switch-off engine never use it.

use forkscore_backends::candle::checkpoint::ResolvedCheckpoint;
use forkscore_backends::candle::{CandleBackend, LoadOptions};
use forkscore_backends::Backend;
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Decision, Engine, GroupBudget, Mode,
    Schema, ScoreOptions,
};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use std::path::Path;

/// Head continued vs whole prompt: the same tokens; the prefill's chunk boundaries differ.
const HEAD_VS_WHOLE: Tolerance = Tolerance::CPU_F32_LOGITS;

fn engine_for(dir: &Path, shared_head: bool) -> Engine<CandleBackend> {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "test").unwrap();
    let backend = CandleBackend::load(
        &ckpt,
        &LoadOptions {
            prefill_chunk: 48,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let tok = ChatTokenizer::for_model(dir, backend.facts().family).unwrap();
    Engine::new(
        backend,
        tok,
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    )
    .unwrap()
    .with_shared_head(shared_head)
}

fn dirs() -> Vec<(&'static str, std::path::PathBuf)> {
    vec![
        ("qwen2.5", ensure_tiny_model(&TinySpec::qwen25())),
        (
            "qwen3.5",
            TinyQwen35::new(36, Qwen35Layout::TextOnly)
                .ensure()
                .unwrap(),
        ),
    ]
}

fn schema(name: &str) -> Schema {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/examples")
        .join(name);
    Schema::from_json_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const CONTEXTS: [&str; 4] = [
    "The payment service is down for every customer and nobody can check out since this morning; we are losing money by the minute.",
    "Could you add a dark mode to the dashboard?",
    "\nI was charged twice for my subscription.",
    "  Login fails with error 500 on the mobile app after the update, for our whole team of forty people.",
];

fn logits(d: &Decision) -> Vec<f32> {
    d.fields
        .values()
        .flat_map(|f| f.logits.values().copied())
        .collect()
}

fn bits(d: &Decision) -> Vec<u32> {
    logits(d).into_iter().map(f32::to_bits).collect()
}

fn run(
    engine: &Engine<CandleBackend>,
    schema: &Schema,
    opts: &ScoreOptions,
    budget: &GroupBudget,
) -> Vec<Decision> {
    let compiled = engine.compile(schema).unwrap();
    engine
        .decide_many(&CONTEXTS, &compiled, opts, budget)
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// One context per group.
fn direct() -> GroupBudget {
    GroupBudget {
        max_prefix_tokens: 1,
        ..GroupBudget::default()
    }
}

#[test]
fn decisions_continuing_the_head_equal_the_whole_prompt_and_reuse_it() {
    for (name, dir) in dirs() {
        let on = engine_for(&dir, true);
        let off = engine_for(&dir, false);
        assert!(on.shared_head() && !off.shared_head());
        for file in ["support_triage.json", "fintech_fraud.json"] {
            let schema = schema(file);
            for mode in [Mode::Parallel, Mode::Tree] {
                let opts = ScoreOptions {
                    mode,
                    ..ScoreOptions::default()
                };
                let head = run(&on, &schema, &opts, &GroupBudget::default());
                let whole = run(&off, &schema, &opts, &GroupBudget::default());
                for (i, (h, w)) in head.iter().zip(&whole).enumerate() {
                    let what = format!("{name} {file} {mode:?} context {i}");
                    HEAD_VS_WHOLE.assert_close(&what, &logits(h), &logits(w));
                    assert_eq!(h.output, w.output, "{what}: selections");
                    assert_eq!(
                        h.telemetry.prefix_tokens, w.telemetry.prefix_tokens,
                        "{what}: the same prompt"
                    );
                    assert_eq!(w.telemetry.reused_prefix_tokens, 0, "{what}: off");
                    // every context here starts after the head, the newline-led one included
                    // or not: reuse is all or nothing per context
                    // the group's reused tokens, per context
                    let size = h.telemetry.group.as_ref().unwrap().size;
                    let reused = h.telemetry.reused_prefix_tokens / size;
                    assert!(
                        reused == 0 || (16..h.telemetry.prefix_tokens).contains(&reused),
                        "{what}: reused {reused}"
                    );
                    if i != 2 {
                        assert!(reused >= 16, "{what}: the head was not continued");
                    }
                }
            }
        }
        // prefilled once whatever the schema, the mode and the number of groups
        // both schemas are code-only: the same instructions and context opening, one head
        assert_eq!(on.cached_heads(), 1, "{name}");
        assert_eq!(off.cached_heads(), 0, "{name}");
    }
}

#[test]
fn a_context_continuing_the_head_does_not_depend_on_its_group() {
    for (name, dir) in dirs() {
        let engine = engine_for(&dir, true);
        let schema = schema("support_triage.json");
        let opts = ScoreOptions::default();
        let grouped = run(&engine, &schema, &opts, &GroupBudget::default());
        let alone = run(&engine, &schema, &opts, &direct());
        for (i, (g, a)) in grouped.iter().zip(&alone).enumerate() {
            assert_eq!(bits(g), bits(a), "{name} context {i}: grouped vs direct");
            assert_eq!(g.output, a.output, "{name} context {i}");
        }
        // and the cached head gives what a fresh engine's first group gives
        let fresh = engine_for(&dir, true);
        let first = run(&fresh, &schema, &opts, &direct());
        for (i, (f, a)) in first.iter().zip(&alone).enumerate() {
            assert_eq!(bits(f), bits(a), "{name} context {i}: fresh engine");
        }
    }
}

#[test]
fn independent_mode_never_uses_the_head() {
    let (_, dir) = &dirs()[0];
    let engine = engine_for(dir, true);
    let opts = ScoreOptions {
        mode: Mode::Independent,
        ..ScoreOptions::default()
    };
    let out = run(
        &engine,
        &schema("fintech_fraud.json"),
        &opts,
        &GroupBudget::default(),
    );
    assert!(out.iter().all(|d| d.telemetry.reused_prefix_tokens == 0));
    assert_eq!(engine.cached_heads(), 0);
}

#[test]
fn fields_first_decisions_continuing_the_catalogue_head_equal_the_whole_prompt() {
    let (name, dir) = dirs().pop().unwrap();
    let on = engine_for(&dir, true);
    let off = engine_for(&dir, false);
    let schema = schema("support_triage.json");
    let opts = ScoreOptions {
        layout: forkscore_engine::Layout::FieldsFirst,
        ..ScoreOptions::default()
    };
    let head = run(&on, &schema, &opts, &GroupBudget::default());
    let whole = run(&off, &schema, &opts, &GroupBudget::default());
    let alone = run(&on, &schema, &opts, &direct());
    for (i, ((h, w), a)) in head.iter().zip(&whole).zip(&alone).enumerate() {
        let what = format!("{name} fields-first context {i}");
        HEAD_VS_WHOLE.assert_close(&what, &logits(h), &logits(w));
        assert_eq!(h.output, w.output, "{what}: selections");
        assert_eq!(bits(h), bits(a), "{what}: grouped vs direct");
        // the head holds the catalogue: most of the prompt
        let size = h.telemetry.group.as_ref().unwrap().size;
        let reused = h.telemetry.reused_prefix_tokens / size;
        assert!(
            2 * reused > h.telemetry.prefix_tokens,
            "{what}: head {reused}"
        );
    }
}
