//! Checkpoints saved by Hugging Face transformers itself load and agree with transformers.
//!
//! `fixtures/hf_saved/<name>/` holds folders written by transformers' own `save_pretrained`
//! (`fixtures/scripts/make_hf_saved.py`, transformers 5.24.0): the config keys, weight names,
//! shared-tensor de-duplication, dtype and shard index exactly as transformers writes them, not
//! as forkscore's testkit writes them. Each folder's `expected.json` records the sha256 of every
//! file and transformers' float32 last-position logits for every vocabulary id on three prompts
//! (5, 40, 90 tokens; 90 crosses the 64-token Gated DeltaNet chunk).
//!
//! Per folder: the files match their recorded sha256 (fixture drift); the folder loads with
//! `ResolvedCheckpoint::from_folder` + `CandleBackend::load` (CPU f32; bf16-stored weights are
//! upcast exactly, and the reference was computed on the same upcast weights); every stored
//! tensor outside the vision tower / MTP head is read (a silently ignored bias or head would
//! otherwise pass a loose comparison by luck); the head is tied exactly when transformers ties
//! it (no `lm_head.weight` stored, or one stored equal to the embedding: the two `tiedcfg`
//! fixtures say `tie_word_embeddings: true` yet store a head, once an equal copy, once different
//! values that transformers uses untied); `forward_full` matches transformers within `Tolerance::VS_TRANSFORMERS_F32`; and
//! prefill + score (one state, several suffix rows in one call, plus a small prefill chunk)
//! matches `forward_full` (see [`fork_tolerance`]) and, at the full prompt, transformers.
//!
//! Measured maxima are printed: `cargo test -p forkscore-backends --test hf_saved -- --nocapture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use forkscore_backends::candle::{CandleBackend, LoadOptions, ResolvedCheckpoint};
use forkscore_backends::{Backend, ScoreRow};
use forkscore_testkit::tolerance::Tolerance;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Every fixture folder this test knows; `fixture_set_is_complete` fails on an unlisted one.
const FIXTURES: [&str; 13] = [
    "qwen2_tied_f32",
    "qwen2_tied_f16",
    "qwen2_untied_f32",
    "qwen2_tiedcfg_headcopy_f32",
    "qwen3_f32",
    "qwen3_tiedcfg_headdiff_f32",
    "qwen3_bf16",
    "qwen3_sharded_f32",
    "qwen35_text_f32",
    "qwen35_text_bf16",
    "qwen35_vl_sharded_f32",
    "qwen35_vl_tied_bf16",
    "qwen35_vl_mrope_f32",
];

/// Tensor name prefixes a text-only scorer never reads (vision tower, multi-token prediction).
const NOT_TEXT: [&str; 2] = ["model.visual.", "mtp."];

/// A prefill chunk small enough that the long prompts' prefixes are prefilled in several chunks.
const SMALL_PREFILL_CHUNK: usize = 7;

/// prefill + score vs forward_full. Dense models: `CPU_F32_LOGITS` (only summation order
/// differs). Qwen3.5: `VS_TRANSFORMERS_F32`, because a Gated DeltaNet prefix-then-continuation
/// is a different algorithm from one chunked pass (state carried across the split, products of
/// decays formed in another order), not a reordered sum: on these fixtures (|logit| <= ~14)
/// forkscore's fork vs full reached 4.6e-5 while BOTH stayed within 3e-5 of transformers, and
/// transformers' own cached continuation differs from its full forward by up to 2.9e-5
/// (measured with transformers 5.24.0 on `qwen35_text_f32`, 90 tokens split at 45).
fn fork_tolerance(model_class: &str) -> Tolerance {
    if model_class.starts_with("Qwen3_5") {
        Tolerance::VS_TRANSFORMERS_F32
    } else {
        Tolerance::CPU_F32_LOGITS
    }
}

#[derive(Debug, Deserialize)]
struct Expected {
    transformers: String,
    model_class: String,
    saved_dtype: String,
    files: BTreeMap<String, String>,
    prompts: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    ids: Vec<u32>,
    logits: Vec<f32>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf_saved")
}

fn read_expected(dir: &Path) -> Result<Expected> {
    let p = dir.join("expected.json");
    let text = std::fs::read_to_string(&p).with_context(|| p.display().to_string())?;
    serde_json::from_str(&text).with_context(|| p.display().to_string())
}

/// Every file but expected.json has the recorded sha256, and no file is unrecorded.
fn check_files(dir: &Path, exp: &Expected) -> Result<()> {
    let mut present = BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name != "expected.json" {
            present.insert(name);
        }
    }
    let recorded: BTreeSet<String> = exp.files.keys().cloned().collect();
    ensure!(
        present == recorded,
        "{}: files {present:?} != recorded {recorded:?}",
        dir.display()
    );
    for (name, want) in &exp.files {
        let got = hex::encode(Sha256::digest(std::fs::read(dir.join(name))?));
        ensure!(
            &got == want,
            "{}/{name}: sha256 {got} != recorded {want}; regenerate with make_hf_saved.py",
            dir.display()
        );
    }
    Ok(())
}

/// Names of all tensors stored in the folder's safetensors files.
fn stored_tensors(dir: &Path, exp: &Expected) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for file in exp.files.keys().filter(|n| n.ends_with(".safetensors")) {
        let bytes = std::fs::read(dir.join(file))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .with_context(|| format!("{file}: not safetensors"))?;
        names.extend(st.names().into_iter().map(str::to_string));
    }
    Ok(names)
}

/// `None` when no `lm_head.weight` is stored, else whether its bytes equal the embedding's.
fn stored_head_equals_embedding(dir: &Path, exp: &Expected) -> Result<Option<bool>> {
    let mut head = None;
    let mut embed = None;
    for file in exp.files.keys().filter(|n| n.ends_with(".safetensors")) {
        let bytes = std::fs::read(dir.join(file))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)?;
        for (n, view) in st.tensors() {
            if n == "lm_head.weight" {
                head = Some(view.data().to_vec());
            } else if n.ends_with("embed_tokens.weight") && !n.starts_with("mtp.") {
                embed = Some(view.data().to_vec());
            }
        }
    }
    Ok(head.map(|h| Some(&h) == embed.as_ref()))
}

fn check_fixture(name: &str) -> Result<()> {
    let dir = root().join(name);
    let exp = read_expected(&dir)?;
    check_files(&dir, &exp)?;
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "hf-saved")?;
    let backend = CandleBackend::load(&ckpt, &LoadOptions::default())
        .with_context(|| format!("{name}: CandleBackend::load"))?;
    let vocab = backend.facts().vocab_size;
    let all_ids: Vec<u32> = (0..vocab as u32).collect();

    // Loader coverage: every stored text tensor is read, nothing else.
    let stored = stored_tensors(&dir, &exp)?;
    let text: BTreeSet<&String> = stored
        .iter()
        .filter(|n| !NOT_TEXT.iter().any(|p| n.starts_with(p)))
        .collect();
    let read: BTreeSet<&String> = backend.tensors_read().iter().collect();
    let unread: Vec<_> = text.difference(&read).collect();
    let foreign: Vec<_> = read.difference(&text).collect();
    ensure!(
        unread.is_empty() && foreign.is_empty(),
        "{name}: stored text tensors never read {unread:?}; read but not stored {foreign:?}"
    );
    // Tied exactly when transformers ties: no `lm_head.weight` stored, or one stored equal to
    // the embedding (a stored head that differs is used as is, whatever the config says).
    let want_tied = stored_head_equals_embedding(&dir, &exp)?.unwrap_or(true);
    ensure!(
        backend.tied_head() == want_tied,
        "{name}: tied head {} but transformers ties: {want_tied}",
        backend.tied_head()
    );

    let mut worst_ref = 0f32;
    let mut worst_fork = 0f32;
    for (p, case) in exp.prompts.iter().enumerate() {
        ensure!(
            case.logits.len() == vocab,
            "{name}: logits per prompt != vocab"
        );
        let full = backend.forward_full(&case.ids, &all_ids)?;
        let d = Tolerance::max_abs_diff(&full, &case.logits);
        worst_ref = worst_ref.max(d);
        Tolerance::VS_TRANSFORMERS_F32.assert_close(
            &format!(
                "{name} prompt {p} ({} tokens): forward_full vs transformers",
                case.ids.len()
            ),
            &full,
            &case.logits,
        );

        // One prefix state, several suffix rows of different lengths in one call; each row
        // must equal forward_full on prefix + its suffix.
        let n = case.ids.len();
        let k = n / 2;
        let ends: Vec<usize> = [n, k + 1, (k + n).div_ceil(2)]
            .into_iter()
            .filter(|&e| e > k && e <= n)
            .collect();
        for chunk in [None, Some(SMALL_PREFILL_CHUNK)] {
            let state = match chunk {
                None => backend.prefill(&case.ids[..k])?,
                Some(c) => backend.prefill_chunked(&case.ids[..k], c)?,
            };
            let rows: Vec<ScoreRow<'_>> = ends
                .iter()
                .map(|&e| ScoreRow {
                    state: 0,
                    suffix: &case.ids[k..e],
                })
                .collect();
            let scored = backend.score_rows(&[&state], &rows, &all_ids)?;
            for (r, &e) in ends.iter().enumerate() {
                let want = if e == n {
                    full.clone()
                } else {
                    backend.forward_full(&case.ids[..e], &all_ids)?
                };
                let got = scored.row(r);
                worst_fork = worst_fork.max(Tolerance::max_abs_diff(got, &want));
                fork_tolerance(&exp.model_class).assert_close(
                    &format!("{name} prompt {p}: prefill {k} (chunk {chunk:?}) + score to {e}"),
                    got,
                    &want,
                );
                if e == n {
                    Tolerance::VS_TRANSFORMERS_F32.assert_close(
                        &format!("{name} prompt {p}: prefill + score vs transformers"),
                        got,
                        &case.logits,
                    );
                }
            }
        }
    }
    println!(
        "{name}: {} (saved {} by transformers {}), {} tensors stored, {} read, tied {}: \
         max |forward_full - transformers| = {worst_ref:e}, max |prefill+score - forward_full| = {worst_fork:e}",
        exp.model_class,
        exp.saved_dtype,
        exp.transformers,
        stored.len(),
        backend.tensors_read().len(),
        backend.tied_head(),
    );
    Ok(())
}

#[test]
fn fixture_set_is_complete() -> Result<()> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(root())? {
        let entry = entry?;
        if entry.path().join("config.json").is_file() {
            found.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    let listed: BTreeSet<String> = FIXTURES.iter().map(|s| s.to_string()).collect();
    ensure!(
        found == listed,
        "fixtures on disk {found:?} != tested {listed:?}"
    );
    Ok(())
}

macro_rules! fixture_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() -> Result<()> {
                check_fixture($name)
            }
        )*
    };
}

fixture_tests! {
    qwen2_tied_f32 => "qwen2_tied_f32",
    qwen2_tied_f16 => "qwen2_tied_f16",
    qwen2_untied_f32 => "qwen2_untied_f32",
    qwen3_f32 => "qwen3_f32",
    qwen2_tiedcfg_headcopy_f32 => "qwen2_tiedcfg_headcopy_f32",
    qwen3_tiedcfg_headdiff_f32 => "qwen3_tiedcfg_headdiff_f32",
    qwen3_bf16 => "qwen3_bf16",
    qwen3_sharded_f32 => "qwen3_sharded_f32",
    qwen35_text_f32 => "qwen35_text_f32",
    qwen35_text_bf16 => "qwen35_text_bf16",
    qwen35_vl_sharded_f32 => "qwen35_vl_sharded_f32",
    qwen35_vl_tied_bf16 => "qwen35_vl_tied_bf16",
    qwen35_vl_mrope_f32 => "qwen35_vl_mrope_f32",
}
