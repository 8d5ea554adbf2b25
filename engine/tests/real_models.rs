//! The engine on tiny real-architecture checkpoints (CPU f32, candle backend): every mode
//! (tree mode packed on Qwen2.5 / Qwen3, the reference rows on Qwen3.5) and every
//! field_batch_size agree within the strict CPU tolerance, the selections are identical,
//! and scoring a context twice gives identical results (no state leaks between calls).

use forkscore_backends::candle::checkpoint::ResolvedCheckpoint;
use forkscore_backends::candle::{CandleBackend, LoadOptions};
use forkscore_backends::Backend;
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Decision, Engine, Mode, Schema,
    ScoreOptions,
};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use proptest::prelude::*;
use std::sync::OnceLock;

fn engine_for(dir: &std::path::Path) -> Engine<CandleBackend> {
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
}

fn engines() -> &'static [(&'static str, Engine<CandleBackend>)] {
    static E: OnceLock<Vec<(&'static str, Engine<CandleBackend>)>> = OnceLock::new();
    E.get_or_init(|| {
        let q35 = TinyQwen35::new(35, Qwen35Layout::Multimodal)
            .ensure()
            .unwrap();
        vec![
            (
                "qwen2.5",
                engine_for(&ensure_tiny_model(&TinySpec::qwen25())),
            ),
            ("qwen3", engine_for(&ensure_tiny_model(&TinySpec::qwen3()))),
            ("qwen3.5", engine_for(&q35)),
        ]
    })
}

fn logits(d: &Decision) -> Vec<f32> {
    d.fields
        .values()
        .flat_map(|f| f.logits.values().copied())
        .collect()
}

fn probs(d: &Decision) -> Vec<f32> {
    d.fields
        .values()
        .flat_map(|f| f.scores.values().map(|&p| p as f32))
        .collect()
}

fn check_modes(
    engine: &Engine<CandleBackend>,
    name: &str,
    schema: &Schema,
    context: &str,
    fbs: usize,
) {
    let compiled = engine.compile(schema).unwrap();
    let run = |mode, field_batch_size| {
        engine
            .decide(
                context,
                &compiled,
                &ScoreOptions {
                    mode,
                    field_batch_size,
                    ..ScoreOptions::default()
                },
            )
            .unwrap()
    };
    let reference = run(Mode::Independent, None);
    for (label, d) in [
        ("parallel", run(Mode::Parallel, None)),
        ("cached-serial", run(Mode::CachedSerial, None)),
        ("field-batch", run(Mode::Parallel, Some(fbs))),
        ("tree", run(Mode::Tree, None)),
    ] {
        Tolerance::CPU_F32_LOGITS.assert_close(
            &format!("{name} {label} logits vs independent"),
            &logits(&d),
            &logits(&reference),
        );
        Tolerance::CPU_F32_STRICT.assert_close(
            &format!("{name} {label} probabilities vs independent"),
            &probs(&d),
            &probs(&reference),
        );
        assert_eq!(
            d.output, reference.output,
            "{name} {label}: selections differ"
        );
    }
    // tree mode: the same decision as parallel, and the telemetry names the packing that ran
    let (tree, parallel) = (run(Mode::Tree, None), run(Mode::Parallel, None));
    Tolerance::CPU_F32_STRICT.assert_close(
        &format!("{name} tree probabilities vs parallel"),
        &probs(&tree),
        &probs(&parallel),
    );
    assert_eq!(tree.output, parallel.output, "{name}: tree vs parallel");
    let want = if name == "qwen3.5" {
        "row-per-leaf"
    } else {
        "packed"
    };
    assert_eq!(tree.telemetry.tree_packing, Some(want), "{name}");
    assert_eq!(
        (tree.telemetry.tree_calls, tree.telemetry.score_calls),
        (1, 0),
        "{name}"
    );
    // Scoring again reuses nothing stale.
    let again = run(Mode::Parallel, None);
    assert_eq!(logits(&again), logits(&run(Mode::Parallel, None)));
}

#[test]
fn example_schemas_agree_across_modes_on_tiny_models() {
    // Long enough (> 64 tokens of prefix) to cross the Gated DeltaNet chunk size.
    let context = "Our production payment service is completely down for every customer, and no one can complete a purchase. \
                   The on-call engineer has been paged twice; status page still says operational.";
    for (name, engine) in engines() {
        for file in [
            "parallel_schema.json",
            "fintech_fraud.json",
            "support_triage.json",
        ] {
            let text = std::fs::read_to_string(format!(
                "{}/../fixtures/examples/{file}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            check_modes(
                engine,
                name,
                &Schema::from_json_str(&text).unwrap(),
                context,
                5,
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn generated_contexts_agree_across_modes(context in "[a-zA-Z0-9 ,.!?\\n]{1,300}", fbs in 1usize..4, which in 0usize..3) {
        prop_assume!(!context.trim().is_empty());
        let (name, engine) = &engines()[which];
        let schema = Schema::from_json_str(
            r#"{"a": {"type": "enum", "choices": ["x", "y", "z"]}, "b": {"type": "boolean"}, "c": {"type": "enum", "choices": ["one", "two"]}}"#,
        ).unwrap();
        check_modes(engine, name, &schema, &context, fbs);
    }
}

#[test]
fn facts_report_the_fixed_linear_attention_state() {
    use forkscore_backends::PrefixState;
    for (name, engine) in engines() {
        let fixed = engine.backend().facts().fixed_state_bytes;
        let state = engine.backend().prefill(&[1, 2, 3, 4, 5]).unwrap();
        let state2 = engine
            .backend()
            .prefill(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
            .unwrap();
        // nbytes grows linearly with the prefix (attention K/V) on top of the fixed part.
        let per_token = (state2.nbytes() - state.nbytes()) / 5;
        assert_eq!(state.nbytes() - 5 * per_token, fixed, "{name}");
        assert_eq!(fixed > 0, *name == "qwen3.5", "{name}: {fixed}");
    }
}

#[test]
fn extending_a_retained_state_equals_prefilling_the_whole_prefix() {
    use forkscore_backends::{PrefixState, ScoreRow};
    let ids: Vec<u32> = (0..150u32).map(|i| 100 + (i * 37) % 5000).collect();
    let rows = [
        ScoreRow {
            state: 0,
            suffix: &[11, 12, 13],
        },
        ScoreRow {
            state: 0,
            suffix: &[14],
        },
    ];
    let candidates = [1u32, 2, 3, 500, 9000];
    for (name, engine) in engines() {
        let b = engine.backend();
        let whole = b.prefill(&ids).unwrap();
        let base = b.prefill(&ids[..70]).unwrap();
        let extended = b.extend(&base, &ids[70..]).unwrap();
        assert_eq!(extended.len(), whole.len());
        let want = b.score_rows(&[&whole], &rows, &candidates).unwrap();
        let got = b.score_rows(&[&extended], &rows, &candidates).unwrap();
        Tolerance::CPU_F32_LOGITS.assert_close(
            &format!("{name} extend vs prefill"),
            &got.data,
            &want.data,
        );
        // The base is untouched: extending it again gives the same state.
        let again = b
            .score_rows(&[&b.extend(&base, &ids[70..]).unwrap()], &rows, &candidates)
            .unwrap();
        assert_eq!(again.data, got.data, "{name}");
        assert_eq!(base.len(), 70);
    }
}
