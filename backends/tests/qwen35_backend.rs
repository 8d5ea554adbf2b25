//! Qwen3.5 on the CPU f32 candle backend, with tiny seeded checkpoints from the test kit:
//! scoring from a forked prefix state equals the independent full forward; parallel equals
//! one-at-a-time; the source state is never mutated; right padding and slot merges do not
//! change a row; chunked prefill equals one-shot; prompts cross the 64-token GDN chunk; both
//! checkpoint layouts load to the same model; vision / MTP tensors are never read.

use anyhow::Result;
use forkscore_backends::candle::{
    CandleBackend, CandleState, LayerState, LoadOptions, ResolvedCheckpoint,
};
use forkscore_backends::{Backend, PrefixState, ScoreRow};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;

const TOL: Tolerance = Tolerance::CPU_F32_STRICT;
/// Candidate ids: ordinary tokens, `<|endoftext|>`, `<|im_end|>`, the last padding row.
const CANDIDATES: [u32; 6] = [15, 1000, 90_000, 248_044, 248_046, 248_319];

fn load(seed: u64, layout: Qwen35Layout) -> Result<(std::path::PathBuf, CandleBackend)> {
    let dir = TinyQwen35::new(seed, layout).ensure()?;
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-qwen35")?;
    let backend = CandleBackend::load(&ckpt, &LoadOptions::default())?;
    Ok((dir, backend))
}

/// `n` deterministic token ids below the real vocabulary, starting with `<|im_start|>`.
fn ids(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i == 0 {
                248_045
            } else {
                ((x >> 33) % 248_000) as u32
            }
        })
        .collect()
}

fn cat(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().chain(b).copied().collect()
}

fn state_values(s: &CandleState) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    for l in s.layers() {
        let (a, b) = match l {
            LayerState::Attention { k, v } => (k, v),
            LayerState::Linear { conv, recurrent } => (conv, recurrent),
        };
        out.push(a.flatten_all()?.to_vec1::<f32>()?);
        out.push(b.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

#[test]
fn config_and_facts() -> Result<()> {
    let (_dir, b) = load(1, Qwen35Layout::Multimodal)?;
    let f = b.facts();
    assert_eq!(
        (f.family.map(|f| f.as_str()), f.architecture.as_str()),
        (Some("qwen3_5"), "Qwen3_5ForConditionalGeneration")
    );
    assert_eq!(
        (f.vocab_size, f.num_layers, f.hidden_size),
        (248_320, 4, 32)
    );
    assert!(b.tied_head());
    assert_eq!(b.config().text.rotary_dim(), 4);
    Ok(())
}

#[test]
fn vision_and_mtp_tensors_are_never_read() -> Result<()> {
    let (dir, b) = load(2, Qwen35Layout::Multimodal)?;
    let read = b.tensors_read();
    assert!(!read.is_empty());
    assert!(
        read.iter().all(|n| n.starts_with("model.language_model.")),
        "{read:?}"
    );
    // Every text tensor of the file was read, nothing else.
    let bytes = std::fs::read(dir.join("model.safetensors"))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let mut text: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| n.starts_with("model.language_model."))
        .map(str::to_string)
        .collect();
    text.sort();
    assert_eq!(read, text.as_slice());
    assert!(st.names().iter().any(|n| n.starts_with("model.visual.")));
    assert!(st.names().iter().any(|n| n.starts_with("mtp.")));
    Ok(())
}

#[test]
fn both_layouts_load_the_same_model() -> Result<()> {
    let (_d1, mm) = load(3, Qwen35Layout::Multimodal)?;
    let (_d2, text) = load(3, Qwen35Layout::TextOnly)?;
    assert_eq!(text.facts().architecture.as_str(), "Qwen3_5ForCausalLM");
    assert!(text.tensors_read().iter().all(|n| n.starts_with("model.")));
    let prompt = ids(30, 80);
    Tolerance::EXACT.assert_close(
        "multimodal vs text-only layout",
        &mm.forward_full(&prompt, &CANDIDATES)?,
        &text.forward_full(&prompt, &CANDIDATES)?,
    );
    Ok(())
}

#[test]
fn score_equals_forward_full_and_parallel_equals_one_at_a_time() -> Result<()> {
    let (_dir, b) = load(4, Qwen35Layout::Multimodal)?;
    let suffixes: Vec<Vec<u32>> = [1usize, 3, 9, 66]
        .iter()
        .enumerate()
        .map(|(i, &n)| ids(100 + i as u64, n))
        .collect();
    let mut worst = 0f32;
    for (pi, &plen) in [1usize, 5, 70, 150].iter().enumerate() {
        let prefix = ids(pi as u64, plen);
        let state = b.prefill(&prefix)?;
        assert_eq!(state.len(), plen);
        let before = state_values(&state)?;
        let rows: Vec<ScoreRow<'_>> = suffixes
            .iter()
            .map(|s| ScoreRow {
                state: 0,
                suffix: s,
            })
            .collect();
        let all = b.score_rows(&[&state], &rows, &CANDIDATES)?;
        for (r, s) in suffixes.iter().enumerate() {
            let full = b.forward_full(&cat(&prefix, s), &CANDIDATES)?;
            let what = format!("prefix {plen}, suffix {}: score vs forward_full", s.len());
            TOL.assert_close(&what, all.row(r), &full);
            worst = worst.max(Tolerance::max_abs_diff(all.row(r), &full));
            let alone = b.score_rows(&[&state], &rows[r..r + 1], &CANDIDATES)?;
            let what = format!("prefix {plen}, suffix {}: parallel vs alone", s.len());
            TOL.assert_close(&what, all.row(r), alone.row(0));
        }
        assert_eq!(
            state_values(&state)?,
            before,
            "scoring mutated the prefix state"
        );
    }
    println!("score vs forward_full: max |diff| = {worst:e}");
    Ok(())
}

#[test]
fn slot_merge_of_prefixes_with_different_lengths() -> Result<()> {
    let (_dir, b) = load(5, Qwen35Layout::Multimodal)?;
    let prefixes = [ids(50, 23), ids(51, 97), ids(52, 2)];
    let states: Vec<CandleState> = prefixes
        .iter()
        .map(|p| b.prefill(p))
        .collect::<Result<_, _>>()?;
    let refs: Vec<&CandleState> = states.iter().collect();
    let suffixes = [ids(60, 4), ids(61, 1), ids(62, 70), ids(63, 7), ids(64, 2)];
    let plan = [(1usize, 0usize), (0, 1), (2, 2), (1, 3), (0, 4), (2, 0)];
    let rows: Vec<ScoreRow<'_>> = plan
        .iter()
        .map(|&(s, x)| ScoreRow {
            state: s,
            suffix: &suffixes[x],
        })
        .collect();
    let merged = b.score_rows(&refs, &rows, &CANDIDATES)?;
    let mut worst = 0f32;
    for (r, &(s, x)) in plan.iter().enumerate() {
        let full = b.forward_full(&cat(&prefixes[s], &suffixes[x]), &CANDIDATES)?;
        TOL.assert_close(&format!("merged row {r}"), merged.row(r), &full);
        worst = worst.max(Tolerance::max_abs_diff(merged.row(r), &full));
        let alone = b.score_rows(
            &refs[s..s + 1],
            &[ScoreRow {
                state: 0,
                suffix: &suffixes[x],
            }],
            &CANDIDATES,
        )?;
        TOL.assert_close(
            &format!("merged row {r} vs its slot alone"),
            merged.row(r),
            alone.row(0),
        );
    }
    println!("slot merge vs forward_full: max |diff| = {worst:e}");
    Ok(())
}

#[test]
fn chunked_prefill_equals_one_shot() -> Result<()> {
    let (_dir, b) = load(6, Qwen35Layout::Multimodal)?;
    let prefix = ids(70, 150);
    let one = b.prefill_chunked(&prefix, 1000)?;
    let suffixes = [ids(71, 3), ids(72, 1)];
    let rows: Vec<ScoreRow<'_>> = suffixes
        .iter()
        .map(|s| ScoreRow {
            state: 0,
            suffix: s,
        })
        .collect();
    let want = b.score_rows(&[&one], &rows, &CANDIDATES)?;
    let one_vals = state_values(&one)?;
    let mut worst = 0f32;
    for chunk in [1usize, 7, 64, 65] {
        let st = b.prefill_chunked(&prefix, chunk)?;
        for (a, w) in state_values(&st)?.iter().zip(&one_vals) {
            TOL.assert_close(&format!("state, chunk {chunk}"), a, w);
            worst = worst.max(Tolerance::max_abs_diff(a, w));
        }
        let got = b.score_rows(&[&st], &rows, &CANDIDATES)?;
        TOL.assert_close(&format!("logits, chunk {chunk}"), &got.data, &want.data);
        worst = worst.max(Tolerance::max_abs_diff(&got.data, &want.data));
    }
    println!("chunked vs one-shot prefill: max |diff| = {worst:e}");
    Ok(())
}

/// bf16 compute on CPU (the accelerator dtype path: bf16 projections, f32 GDN core and states)
/// tracks f32, and its forked scoring tracks its own full forward.
#[test]
fn bf16_compute_tracks_f32() -> Result<()> {
    use forkscore_backends::ComputeDType;
    let dir = TinyQwen35::new(8, Qwen35Layout::Multimodal).ensure()?;
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-qwen35")?;
    let f32m = CandleBackend::load(&ckpt, &LoadOptions::default())?;
    let bf16 = CandleBackend::load(
        &ckpt,
        &LoadOptions {
            dtype: ComputeDType::Bf16,
            ..LoadOptions::default()
        },
    )?;
    let prompt = ids(80, 120);
    let a = f32m.forward_full(&prompt, &CANDIDATES)?;
    let b = bf16.forward_full(&prompt, &CANDIDATES)?;
    let st = bf16.prefill(&prompt[..90])?;
    let c = bf16.score_rows(
        &[&st],
        &[ScoreRow {
            state: 0,
            suffix: &prompt[90..],
        }],
        &CANDIDATES,
    )?;
    println!(
        "bf16 vs f32: {:e}; bf16 fork vs bf16 full: {:e}",
        Tolerance::max_abs_diff(&a, &b),
        Tolerance::max_abs_diff(&b, c.row(0))
    );
    BF16_VS_F32.assert_close("bf16 vs f32", &a, &b);
    BF16_VS_F32.assert_close("bf16 fork vs bf16 full", &b, c.row(0));
    Ok(())
}

/// bf16 weights and activations vs f32 on this model's logits (|logit| up to ~10).
const BF16_VS_F32: Tolerance = Tolerance {
    name: "cpu-bf16-vs-f32-qwen35-logits",
    abs: 0.25,
};

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]
        /// Any two prefixes and any suffix lengths: each merged, right-padded row equals the
        /// independent forward of its own prompt.
        #[test]
        fn merged_rows_equal_their_independent_forward(
            p0 in 1usize..90, p1 in 1usize..90,
            lens in proptest::collection::vec((0usize..2, 1usize..20), 1..5),
            seed in 0u64..1000,
        ) {
            let run = || -> Result<f32> {
                static MODEL: std::sync::OnceLock<CandleBackend> = std::sync::OnceLock::new();
                let b = match MODEL.get() {
                    Some(b) => b,
                    None => {
                        let (_, loaded) = load(9, Qwen35Layout::Multimodal)?;
                        MODEL.get_or_init(|| loaded)
                    }
                };
                let prefixes = [ids(seed, p0), ids(seed + 1, p1)];
                let states = [b.prefill(&prefixes[0])?, b.prefill(&prefixes[1])?];
                let suffixes: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &(_, n))| ids(seed + 10 + i as u64, n)).collect();
                let rows: Vec<ScoreRow<'_>> = lens.iter().zip(&suffixes).map(|(&(s, _), x)| ScoreRow { state: s, suffix: x }).collect();
                let got = b.score_rows(&[&states[0], &states[1]], &rows, &CANDIDATES)?;
                let mut worst = 0f32;
                for (r, &(s, _)) in lens.iter().enumerate() {
                    let full = b.forward_full(&cat(&prefixes[s], &suffixes[r]), &CANDIDATES)?;
                    worst = worst.max(Tolerance::max_abs_diff(got.row(r), &full));
                }
                Ok(worst)
            };
            let worst = run().map_err(|e| TestCaseError::fail(e.to_string()))?;
            // Raw logits of random prompts: one f32 ulp near 32-64 is 3.8e-6, and the merged
            // rows sum in another order than the independent forward (measured up to 1.4e-5).
            let tol = Tolerance::CPU_F32_LOGITS;
            prop_assert!(worst <= tol.abs, "max |diff| {:e} over {}", worst, tol.name);
        }
    }
}
