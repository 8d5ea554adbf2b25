//! The external oracle: forkscore's candle backend against Hugging Face transformers.
//!
//! Flow: `fixtures/reference/<preset>.json` (written by `fixtures/scripts/make_reference.py`,
//! transformers in float32 on the CPU) names a tiny testkit preset. Each test regenerates that
//! preset's Hugging Face folder with testkit (same seed, so byte-identical: the sha256 of
//! `config.json`, `model.safetensors` and the tokenizer files must equal the ones the JSON
//! records), loads it with `CandleBackend` (CPU, f32) and compares, at the candidate ids the
//! JSON stores (top-32 by logit plus 32 fixed ids):
//! - `forward_full(prompt)` against transformers' full forward;
//! - `prefill(prefix)` + `score(suffix)` against transformers' own prefix-then-suffix
//!   continuation and against its full forward (also with a small prefill chunk, and with all
//!   of a prompt's continuations scored in one multi-state call);
//! - the token ids stored by the generator against the Rust `tokenizers` crate on the rendered
//!   chat text.
//!
//! - the retained prefix state, layer by layer, against transformers' cache after the same
//!   prefix: attention K (after q/k norm and RoPE) and V values at the last position and their
//!   norms; Gated DeltaNet conv-state (last kernel−1 columns) and per-head recurrent-state norms.
//!
//! Per-layer hidden-state norms are stored in the JSON but not compared here: the candle backend
//! exposes no hidden states (not even test-only), and adding a hook would mean editing the
//! backend's model code. The prefix-state comparison above localises a layer bug instead.
//!
//! Measured maxima are printed (`cargo test -p forkscore-backends --test reference_transformers
//! -- --nocapture`). Absolute tolerance: `Tolerance::VS_TRANSFORMERS_F32` (1e-4).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::{DType, Tensor};
use forkscore_backends::candle::{
    CandleBackend, CandleState, DeviceSpec, LayerState, LoadOptions, ResolvedCheckpoint,
};
use forkscore_backends::{Backend, ScoreRow};
use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Largest |candle − transformers| accepted on a logit (CPU f32 both sides; 1e-4).
const TRANSFORMERS_ABS_TOL: f32 = Tolerance::VS_TRANSFORMERS_F32.abs;

/// Largest relative difference accepted on a prefix-state norm (K/V, conv, recurrent heads),
/// relative to max(1, |norm|).
const STATE_NORM_REL_TOL: f64 = 1e-5;

/// A prefill chunk small enough that every long prompt's prefix is prefilled in several chunks.
const SMALL_PREFILL_CHUNK: usize = 7;

#[derive(Debug, Deserialize)]
struct Reference {
    schema_version: u32,
    model_name: String,
    generator: Generator,
    files: BTreeMap<String, String>,
    config: RefConfig,
    prompts: Vec<RefPrompt>,
}

#[derive(Debug, Deserialize)]
struct Generator {
    transformers: String,
    torch: String,
    model_class: String,
}

#[derive(Debug, Deserialize)]
struct RefConfig {
    num_hidden_layers: usize,
    hidden_size: usize,
    vocab_size: usize,
}

#[derive(Debug, Deserialize)]
struct RefPrompt {
    name: String,
    rendered: String,
    token_ids: Vec<u32>,
    candidate_ids: Vec<u32>,
    full: RefFull,
    continuations: Vec<RefContinuation>,
}

#[derive(Debug, Deserialize)]
struct RefFull {
    logits: BTreeMap<u32, f64>,
    hidden_norms: Vec<f64>,
}

#[derive(Debug, Deserialize)]
struct RefContinuation {
    prefix_len: usize,
    suffix_len: usize,
    logits: BTreeMap<u32, f64>,
    prefix_state: Vec<RefLayerState>,
    max_abs_diff_vs_full_at_ids: f64,
}

/// transformers' prefix cache, per layer (see `state_summary` in make_reference.py).
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum RefLayerState {
    Attention {
        len: usize,
        k_norm: f64,
        v_norm: f64,
        k_last: Vec<f32>,
        v_last: Vec<f32>,
    },
    Linear {
        conv_channels: usize,
        conv_columns: usize,
        conv_norm_last: f64,
        recurrent_head_norms: Vec<f64>,
    },
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load_reference(name: &str) -> Result<Reference> {
    let path = repo_root()
        .join("fixtures/reference")
        .join(format!("{name}.json"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let r: Reference =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    ensure!(
        r.schema_version == 1,
        "{}: unknown schema_version {}",
        path.display(),
        r.schema_version
    );
    ensure!(
        r.model_name == name,
        "{}: model_name {} != {name}",
        path.display(),
        r.model_name
    );
    Ok(r)
}

/// Logits of `map` in the order of `ids`, as f32 (they were f32 in transformers).
fn ordered(map: &BTreeMap<u32, f64>, ids: &[u32]) -> Result<Vec<f32>> {
    ids.iter()
        .map(|id| {
            map.get(id)
                .map(|&v| v as f32)
                .ok_or_else(|| anyhow!("no stored logit for id {id}"))
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    Tolerance::max_abs_diff(a, b)
}

fn sha256_hex(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// Seed of the tiny Qwen3.5 presets (as in the example).
const QWEN35_SEED: u64 = 35;

/// Write the tiny testkit preset `name` (the same table as `testkit/examples/write_tiny_models.rs`).
fn write_preset(name: &str, dir: &Path) -> Result<()> {
    match name {
        "qwen25" => write_hf_folder(dir, &TinySpec::qwen25())?,
        "qwen3" => write_hf_folder(dir, &TinySpec::qwen3())?,
        "qwen35" => drop(TinyQwen35::new(QWEN35_SEED, Qwen35Layout::Multimodal).write(dir)?),
        "qwen35_text" => drop(TinyQwen35::new(QWEN35_SEED, Qwen35Layout::TextOnly).write(dir)?),
        other => bail!("no tiny preset named {other}"),
    }
    Ok(())
}

/// Regenerate the preset's folder and prove it is the folder the reference was made from.
fn regenerate(reference: &Reference, dir: &Path) -> Result<()> {
    write_preset(&reference.model_name, dir)?;
    for (file, want) in &reference.files {
        let got = sha256_hex(&dir.join(file))?;
        ensure!(
            &got == want,
            "{}: {file} sha256 {got} differs from the {want} recorded in fixtures/reference/{}.json. \
             testkit's tiny-model generator (or the tokenizer fixture) drifted since the reference was \
             made: either restore the generator or regenerate the reference with \
             fixtures/scripts/make_reference.py (see its header) and review the change",
            reference.model_name,
            reference.model_name
        );
    }
    Ok(())
}

fn f64_norm(t: &Tensor) -> Result<f64> {
    let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(v.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt())
}

fn rel_diff(got: f64, want: f64) -> f64 {
    (got - want).abs() / want.abs().max(1.0)
}

/// Compare candle's retained prefix state with transformers' cache, layer by layer. Returns the
/// largest absolute difference on K/V values at the last position and the largest relative
/// difference on norms.
fn compare_state(
    state: &CandleState,
    want: &[RefLayerState],
    prefix_len: usize,
) -> Result<(f32, f64)> {
    ensure!(
        state.layers().len() == want.len(),
        "layer count {} != {}",
        state.layers().len(),
        want.len()
    );
    let (mut abs, mut rel) = (0f32, 0f64);
    for (i, (got, want)) in state.layers().iter().zip(want).enumerate() {
        match (got, want) {
            (
                LayerState::Attention { k, v },
                RefLayerState::Attention {
                    len,
                    k_norm,
                    v_norm,
                    k_last,
                    v_last,
                },
            ) => {
                // (1, Hkv, T, hd)
                let t = k.dim(2)?;
                ensure!(
                    t == *len && t == prefix_len,
                    "layer {i}: K/V length {t}, transformers {len}"
                );
                // (1, Hkv, T, hd) -> (Hkv, hd) at T - 1 -> flat, head-major
                let last = |x: &Tensor| -> Result<Vec<f32>> {
                    Ok(x.narrow(2, t - 1, 1)?
                        .to_dtype(DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()?)
                };
                abs = abs
                    .max(max_abs_diff(&last(k)?, k_last))
                    .max(max_abs_diff(&last(v)?, v_last));
                rel = rel
                    .max(rel_diff(f64_norm(k)?, *k_norm))
                    .max(rel_diff(f64_norm(v)?, *v_norm));
            }
            (
                LayerState::Linear { conv, recurrent },
                RefLayerState::Linear {
                    conv_channels,
                    conv_columns,
                    conv_norm_last,
                    recurrent_head_norms,
                },
            ) => {
                // conv state, channels-last (1, Kc, C) or channels-first (1, C, Kc): compare the
                // last kernel - 1 positions, all the next step reads
                let keep = conv_columns - 1;
                let (d1, d2) = (conv.dim(1)?, conv.dim(2)?);
                let last = if d2 == *conv_channels && d1 >= keep {
                    conv.narrow(1, d1 - keep, keep)?
                } else if d1 == *conv_channels && d2 >= keep {
                    conv.narrow(2, d2 - keep, keep)?
                } else {
                    bail!("layer {i}: conv state (1, {d1}, {d2}) vs {conv_channels} channels, kernel {conv_columns}");
                };
                rel = rel.max(rel_diff(f64_norm(&last)?, *conv_norm_last));
                // recurrent (1, Hv, dk, dv) -> per head
                let hv = recurrent.dim(1)?;
                ensure!(
                    hv == recurrent_head_norms.len(),
                    "layer {i}: {hv} value heads"
                );
                for (h, want) in recurrent_head_norms.iter().enumerate() {
                    rel = rel.max(rel_diff(f64_norm(&recurrent.narrow(1, h, 1)?)?, *want));
                }
            }
            _ => bail!("layer {i}: state kind differs from transformers' cache"),
        }
    }
    Ok((abs, rel))
}

/// Measured maxima for one model, printed for the report.
#[derive(Debug, Default)]
struct Measured {
    full: f32,
    continuation_vs_ref_continuation: f32,
    continuation_vs_ref_full: f32,
    chunked_vs_ref_full: f32,
    batched_vs_ref_continuation: f32,
    state_values: f32,
    state_norms_rel: f64,
    transformers_own: f64,
    max_abs_logit: f32,
}

fn compare_model(name: &str) -> Result<Measured> {
    let reference = load_reference(name)?;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join(name);
    regenerate(&reference, &dir)?;
    let checkpoint = ResolvedCheckpoint::from_folder(&dir, "testkit")?;
    let backend = CandleBackend::load(&checkpoint, &LoadOptions::for_device(DeviceSpec::Cpu))?;
    let facts = backend.facts();
    ensure!(
        facts.vocab_size == reference.config.vocab_size,
        "vocab_size differs"
    );
    ensure!(
        facts.num_layers == reference.config.num_hidden_layers,
        "num_layers differs"
    );
    ensure!(
        facts.hidden_size == reference.config.hidden_size,
        "hidden_size differs"
    );
    ensure!(
        reference.prompts.iter().any(|p| p.token_ids.len() > 64),
        "{name}: the reference needs a prompt longer than 64 tokens"
    );

    let mut m = Measured::default();
    for p in &reference.prompts {
        let cand = &p.candidate_ids;
        let want_full = ordered(&p.full.logits, cand)?;
        m.max_abs_logit = want_full
            .iter()
            .fold(m.max_abs_logit, |a, x| a.max(x.abs()));
        ensure!(
            p.full.hidden_norms.len() == reference.config.num_hidden_layers + 1,
            "hidden norm count"
        );

        let got_full = backend.forward_full(&p.token_ids, cand)?;
        let d = max_abs_diff(&got_full, &want_full);
        m.full = m.full.max(d);
        ensure!(
            d <= TRANSFORMERS_ABS_TOL,
            "{name}/{}: forward_full differs from transformers by {d:e}",
            p.name
        );

        for c in &p.continuations {
            ensure!(
                c.prefix_len + c.suffix_len == p.token_ids.len(),
                "bad continuation split"
            );
            m.transformers_own = m.transformers_own.max(c.max_abs_diff_vs_full_at_ids);
            let want_cont = ordered(&c.logits, cand)?;
            let (prefix, suffix) = p.token_ids.split_at(c.prefix_len);
            let row = [ScoreRow { state: 0, suffix }];

            let state = backend.prefill(prefix)?;
            let (abs, rel) =
                compare_state(&state, &c.prefix_state, c.prefix_len).with_context(|| {
                    format!("{name}/{} prefix {}: prefix state", p.name, c.prefix_len)
                })?;
            m.state_values = m.state_values.max(abs);
            m.state_norms_rel = m.state_norms_rel.max(rel);
            ensure!(
                abs <= TRANSFORMERS_ABS_TOL && rel <= STATE_NORM_REL_TOL,
                "{name}/{} prefix {}: prefix state differs from transformers' cache: values by {abs:e}, \
                 norms by {rel:e} (relative)",
                p.name,
                c.prefix_len
            );
            let got = backend.score_rows(&[&state], &row, cand)?;
            let got = got.row(0);
            let d_cont = max_abs_diff(got, &want_cont);
            let d_full = max_abs_diff(got, &want_full);
            m.continuation_vs_ref_continuation = m.continuation_vs_ref_continuation.max(d_cont);
            m.continuation_vs_ref_full = m.continuation_vs_ref_full.max(d_full);
            ensure!(
                d_cont <= TRANSFORMERS_ABS_TOL && d_full <= TRANSFORMERS_ABS_TOL,
                "{name}/{} prefix {}: prefill+score differs from transformers' continuation by {d_cont:e} \
                 and from its full forward by {d_full:e}",
                p.name,
                c.prefix_len
            );

            let state = backend.prefill_chunked(prefix, SMALL_PREFILL_CHUNK)?;
            let got = backend.score_rows(&[&state], &row, cand)?;
            let d_chunk = max_abs_diff(got.row(0), &want_full);
            m.chunked_vs_ref_full = m.chunked_vs_ref_full.max(d_chunk);
            ensure!(
                d_chunk <= TRANSFORMERS_ABS_TOL,
                "{name}/{} prefix {} (prefill chunk {SMALL_PREFILL_CHUNK}): differs from transformers by {d_chunk:e}",
                p.name,
                c.prefix_len
            );
        }

        // All continuations of the prompt in ONE score call: several states merged into slots,
        // suffixes of different lengths right-padded.
        let states = p
            .continuations
            .iter()
            .map(|c| backend.prefill(&p.token_ids[..c.prefix_len]))
            .collect::<Result<Vec<_>, _>>()?;
        let state_refs: Vec<_> = states.iter().collect();
        let rows: Vec<ScoreRow<'_>> = p
            .continuations
            .iter()
            .enumerate()
            .map(|(i, c)| ScoreRow {
                state: i,
                suffix: &p.token_ids[c.prefix_len..],
            })
            .collect();
        let got = backend.score_rows(&state_refs, &rows, cand)?;
        for (i, c) in p.continuations.iter().enumerate() {
            let d = max_abs_diff(got.row(i), &ordered(&c.logits, cand)?);
            m.batched_vs_ref_continuation = m.batched_vs_ref_continuation.max(d);
            ensure!(
                d <= TRANSFORMERS_ABS_TOL,
                "{name}/{} prefix {} scored in one batch of {} rows: differs from transformers by {d:e}",
                p.name,
                c.prefix_len,
                rows.len()
            );
        }
    }
    // Spread logits make attention / RoPE / norm errors visible at this tolerance.
    ensure!(
        m.max_abs_logit > 10.0,
        "{name}: reference logits are degenerate (max |logit| {})",
        m.max_abs_logit
    );
    eprintln!(
        "{name} (transformers {}, torch {}, {}): max |candle - transformers| forward_full {:.3e}, \
         prefill+score vs continuation {:.3e}, vs full {:.3e}, chunked prefill vs full {:.3e}, \
         multi-state batch vs continuation {:.3e}; \
         prefix state: K/V values {:.3e}, norms {:.3e} (relative); \
         transformers' own continuation vs full {:.3e}; max |logit| {:.2}",
        reference.generator.transformers,
        reference.generator.torch,
        reference.generator.model_class,
        m.full,
        m.continuation_vs_ref_continuation,
        m.continuation_vs_ref_full,
        m.chunked_vs_ref_full,
        m.batched_vs_ref_continuation,
        m.state_values,
        m.state_norms_rel,
        m.transformers_own,
        m.max_abs_logit
    );
    Ok(m)
}

/// The ids the generator stored are what the Rust `tokenizers` crate makes of the rendered text.
fn compare_tokenizer(name: &str) -> Result<()> {
    let reference = load_reference(name)?;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join(name);
    regenerate(&reference, &dir)?;
    let tok =
        tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| anyhow!("{e}"))?;
    for p in &reference.prompts {
        let enc = tok
            .encode(p.rendered.as_str(), false)
            .map_err(|e| anyhow!("{e}"))?;
        if enc.get_ids() != p.token_ids.as_slice() {
            bail!(
                "{name}/{}: Rust tokenizers ids differ from transformers' for the rendered prompt",
                p.name
            );
        }
    }
    Ok(())
}

#[test]
fn qwen25_matches_transformers() -> Result<()> {
    compare_model("qwen25").map(|_| ())
}

#[test]
fn qwen3_matches_transformers() -> Result<()> {
    compare_model("qwen3").map(|_| ())
}

#[test]
fn qwen25_reference_ids_match_rust_tokenizers() -> Result<()> {
    compare_tokenizer("qwen25")
}

#[test]
fn qwen3_reference_ids_match_rust_tokenizers() -> Result<()> {
    compare_tokenizer("qwen3")
}

#[test]
fn qwen35_matches_transformers() -> Result<()> {
    compare_model("qwen35").map(|_| ())
}

#[test]
fn qwen35_text_only_layout_matches_transformers() -> Result<()> {
    compare_model("qwen35_text").map(|_| ())
}

#[test]
fn qwen35_reference_ids_match_rust_tokenizers() -> Result<()> {
    compare_tokenizer("qwen35")
}

/// Negative control: the same comparison on a model with other weights (another seed) must fail
/// by far, so the passing comparisons above are not vacuous.
fn other_weights_are_rejected(
    name: &str,
    write_other: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let reference = load_reference(name)?;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("other");
    write_other(&dir)?;
    let checkpoint = ResolvedCheckpoint::from_folder(&dir, "testkit")?;
    let backend = CandleBackend::load(&checkpoint, &LoadOptions::for_device(DeviceSpec::Cpu))?;
    let p = &reference.prompts[0];
    let got = backend.forward_full(&p.token_ids, &p.candidate_ids)?;
    let d = max_abs_diff(&got, &ordered(&p.full.logits, &p.candidate_ids)?);
    ensure!(
        d > 1000.0 * TRANSFORMERS_ABS_TOL,
        "{name}: a model with other weights differs by only {d:e}"
    );
    Ok(())
}

#[test]
fn qwen3_reference_rejects_other_weights() -> Result<()> {
    other_weights_are_rejected("qwen3", |dir| {
        Ok(write_hf_folder(
            dir,
            &TinySpec {
                seed: 4,
                ..TinySpec::qwen3()
            },
        )?)
    })
}

#[test]
fn qwen35_reference_rejects_other_weights() -> Result<()> {
    other_weights_are_rejected("qwen35", |dir| {
        TinyQwen35::new(QWEN35_SEED + 1, Qwen35Layout::Multimodal).write(dir)?;
        Ok(())
    })
}
