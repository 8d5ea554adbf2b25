//! GPU conformance: the candle backend on CUDA (f32 and bf16) against CPU f32, on the tiny
//! real-architecture Qwen2.5 (tied, q/k/v biases), Qwen3 (untied, q/k norm) and Qwen3.5
//! (hybrid: gated-delta-net linear attention + gated full attention) models.
//!
//! Compiled only with `--features cuda`; every test prints a skip message and passes when no
//! CUDA device opens (so the binary is harmless on a CPU-only machine). Build it here and run it
//! on a GPU machine: `scripts/build-cuda.sh tests`, then `carry/run.sh carry/gpu-tests
//! --test-threads=1 --nocapture` (see docs/GPU.md).
//!
//! Compared, per model and GPU dtype: `forward_full` logits over 4,096 candidate ids spread over
//! the vocabulary for prompts of several lengths; `prefill` + `score` over two prefixes of
//! different length and several suffixes (rows continuing different states are batched into one
//! call, so slot merging and padding run on the GPU); chunked prefill on the GPU; and the
//! GPU's own fork-vs-full agreement. Every comparison prints max |diff|, max |ref| and the
//! relative L2 error, and every changed argmax is printed with the reference top-2 margin; each
//! test ends with a per-group SUMMARY (worst figures) and only then fails, listing every
//! violation. An argmax may only change where the reference's top-2 margin is within twice the
//! tolerance (a near-tie).
#![cfg(feature = "cuda")]

mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use std::path::{Path, PathBuf};

use common::{candidates, ids, rows_over_states};
use forkscore_backends::candle::OpenDevice;
use forkscore_backends::{
    Backend, CandleBackend, ComputeDType, DeviceSpec, LoadOptions, PrefixState, ResolvedCheckpoint,
    ScoreRow,
};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;

/// Qwen2.5 / Qwen3 regular vocabulary (random ids stay below it: no special tokens).
const DENSE_VOCAB: usize = 151_643;
/// Qwen3.5 regular vocabulary.
const QWEN35_VOCAB: usize = 248_044;

/// One architecture loaded several ways: the CPU f32 reference and the CUDA variants.
struct Trio {
    name: &'static str,
    /// The checkpoint folder (tests that load it another way).
    dir: PathBuf,
    /// Random prompt ids are drawn below this.
    vocab: usize,
    /// Embedding rows (candidate ids are spread below this).
    rows: usize,
    cpu: CandleBackend,
    gpu_f32: CandleBackend,
    gpu_bf16: CandleBackend,
    /// CUDA f32 with a small prefill chunk, to run the chunked path on the GPU.
    gpu_f32_chunked: CandleBackend,
}

/// Chunk size of `gpu_f32_chunked` (prefixes below are longer, so several chunks run).
const SMALL_CHUNK: usize = 7;

fn load_on(dir: &Path, device: DeviceSpec, dtype: ComputeDType, chunk: usize) -> CandleBackend {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-gpu").expect("resolve tiny model");
    CandleBackend::load(
        &ckpt,
        &LoadOptions {
            device,
            dtype,
            prefill_chunk: chunk,
            ..LoadOptions::default()
        },
    )
    .expect("load tiny model")
}

/// The models, or `None` (after printing why) when no CUDA device opens.
fn trios() -> Option<&'static [Trio]> {
    static TRIOS: OnceLock<Option<Vec<Trio>>> = OnceLock::new();
    TRIOS
        .get_or_init(|| {
            let gpu = DeviceSpec::Cuda(0);
            if let Err(e) = gpu.open() {
                eprintln!("SKIPPED: no CUDA device ({e})");
                return None;
            }
            let chunk = LoadOptions::default().prefill_chunk;
            let qwen35: PathBuf = TinyQwen35::new(8, Qwen35Layout::Multimodal)
                .ensure()
                .expect("write tiny qwen3.5");
            // Linear-attention key dim 32 (value dim 24: a ragged column tile), so CUDA runs the
            // fused delta-rule kernel (dk ∈ {32, 64, 128, 256}) against the CPU's candle path.
            let qwen35_fused: PathBuf = TinyQwen35 {
                linear_key_dim: 32,
                linear_value_dim: 24,
                ..TinyQwen35::new(9, Qwen35Layout::TextOnly)
            }
            .ensure()
            .expect("write tiny qwen3.5 (dk 32)");
            let models = [
                (
                    "qwen2.5",
                    ensure_tiny_model(&TinySpec::qwen25()),
                    DENSE_VOCAB,
                ),
                ("qwen3", ensure_tiny_model(&TinySpec::qwen3()), DENSE_VOCAB),
                ("qwen3.5", qwen35, QWEN35_VOCAB),
                ("qwen3.5-dk32", qwen35_fused, QWEN35_VOCAB),
            ];
            Some(
                models
                    .into_iter()
                    .map(|(name, dir, vocab)| {
                        let cpu = load_on(&dir, DeviceSpec::Cpu, ComputeDType::F32, chunk);
                        Trio {
                            name,
                            dir: dir.clone(),
                            vocab,
                            rows: cpu.facts().vocab_size,
                            cpu,
                            gpu_f32: load_on(&dir, gpu, ComputeDType::F32, chunk),
                            gpu_bf16: load_on(&dir, gpu, ComputeDType::Bf16, chunk),
                            gpu_f32_chunked: load_on(&dir, gpu, ComputeDType::F32, SMALL_CHUNK),
                        }
                    })
                    .collect(),
            )
        })
        .as_deref()
}

/// 4,096 candidate ids spread evenly over the whole embedding of `rows` rows, for argmax checks.
fn wide_candidates(rows: usize) -> Vec<u32> {
    let step = (rows / 4096) as u32;
    (0..4096u32).map(|i| i * step).collect()
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv {
                (i, v)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// Top-1 minus top-2 of `x` (how far the reference argmax is from a tie).
fn top2_margin(x: &[f32]) -> f32 {
    let mut s = x.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    if s.len() < 2 {
        f32::INFINITY
    } else {
        s[0] - s[1]
    }
}

/// ‖got − want‖₂ / ‖want‖₂.
fn rel_l2(got: &[f32], want: &[f32]) -> f32 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den).sqrt() as f32
}

/// Worst figures of one comparison group (model, path, dtype).
#[derive(Default)]
struct Worst {
    rows: usize,
    max_diff: f32,
    max_ref: f32,
    rel_l2: f32,
    argmax_changed: usize,
    tolerance: Option<Tolerance>,
}

/// Every comparison of one test: each is printed as it runs, the worst figures are kept per
/// group, and violations are collected and asserted at the end, so one GPU run reports all
/// figures instead of stopping at the first one out of tolerance.
#[derive(Default)]
struct Report {
    groups: BTreeMap<String, Worst>,
    failures: Vec<String>,
}

impl Report {
    /// Compare one row of logits (`got` on the GPU, `want` the reference) in `group`.
    fn check(&mut self, tol: Tolerance, group: &str, detail: &str, got: &[f32], want: &[f32]) {
        let d = Tolerance::max_abs_diff(got, want);
        let max_ref = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let rel = rel_l2(got, want);
        eprintln!(
            "{group} {detail}: max|diff| {d:.3e} (tolerance {} {:.1e}), max|ref| {max_ref:.1}, rel-L2 {rel:.2e}",
            tol.name, tol.abs
        );
        let w = self.groups.entry(group.to_string()).or_default();
        w.rows += 1;
        w.max_diff = w.max_diff.max(d);
        w.max_ref = w.max_ref.max(max_ref);
        w.rel_l2 = w.rel_l2.max(rel);
        w.tolerance = Some(tol);
        let (ag, aw) = (argmax(got), argmax(want));
        if ag != aw {
            w.argmax_changed += 1;
            let margin = top2_margin(want);
            eprintln!(
                "ARGMAX CHANGED {group} {detail}: gpu picks candidate #{ag} ({:.4}), reference #{aw} ({:.4}); reference top-2 margin {margin:.4e}",
                got[ag], want[aw]
            );
            if margin > 2.0 * tol.abs {
                self.failures.push(format!(
                    "{group} {detail}: argmax changed with a reference top-2 margin {margin:e} > 2 x {} ({:e})",
                    tol.name, tol.abs
                ));
            }
        }
        if d > tol.abs {
            self.failures.push(format!(
                "{group} {detail}: max |diff| {d:e} exceeds {} ({:e})",
                tol.name, tol.abs
            ));
        }
    }

    /// Print the per-group summary, then fail listing every violation.
    fn finish(self, test: &str) {
        eprintln!("SUMMARY {test}: group | rows | max|diff| | max|ref| | max rel-L2 | argmax changed | tolerance");
        for (g, w) in &self.groups {
            let tol = w
                .tolerance
                .map_or(String::new(), |t| format!("{} {:.1e}", t.name, t.abs));
            eprintln!(
                "SUMMARY {test}: {g} | {} | {:.3e} | {:.1} | {:.2e} | {} | {tol}",
                w.rows, w.max_diff, w.max_ref, w.rel_l2, w.argmax_changed
            );
        }
        assert!(
            self.failures.is_empty(),
            "{test}: {} comparison(s) out of tolerance:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

fn gpu_tolerance(dtype: ComputeDType) -> Tolerance {
    match dtype {
        ComputeDType::Bf16 => Tolerance::GPU_BF16_TINY_LOGITS,
        _ => Tolerance::GPU_F32_LOGITS,
    }
}

fn concat(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().chain(b).copied().collect()
}

#[test]
fn cuda_forward_full_tracks_cpu_f32() {
    let Some(trios) = trios() else { return };
    let mut report = Report::default();
    for t in trios {
        let cands = wide_candidates(t.rows);
        for (seed, len) in [(1u64, 1usize), (2, 24), (3, 97), (4, 300)] {
            let prompt = ids(seed, len, t.vocab);
            let want = t.cpu.forward_full(&prompt, &cands).expect("cpu forward");
            for (dtype, gpu) in [
                (ComputeDType::F32, &t.gpu_f32),
                (ComputeDType::Bf16, &t.gpu_bf16),
            ] {
                let got = gpu.forward_full(&prompt, &cands).expect("gpu forward");
                report.check(
                    gpu_tolerance(dtype),
                    &format!("{} forward_full cuda {dtype:?} vs cpu f32", t.name),
                    &format!("len {len}"),
                    &got,
                    &want,
                );
            }
        }
    }
    report.finish("forward_full");
}

/// Two prefixes of different length, rows of varied suffix length continuing either one, all in
/// one `score` call; compared row by row with CPU `score` of the same call.
#[test]
fn cuda_prefill_score_tracks_cpu_f32() {
    let Some(trios) = trios() else { return };
    let mut report = Report::default();
    for t in trios {
        for cands in [candidates(), wide_candidates(t.rows)] {
            let prefixes = [ids(20, 45, t.vocab), ids(21, 19, t.vocab)];
            let suffixes: Vec<Vec<u32>> = (0..6)
                .map(|i| ids(30 + i, 1 + i as usize * 3, t.vocab))
                .collect();
            let rows: Vec<ScoreRow> = suffixes
                .iter()
                .enumerate()
                .map(|(i, s)| ScoreRow {
                    state: i % 2,
                    suffix: s,
                })
                .collect();
            let run = |m: &CandleBackend| {
                let states: Vec<_> = prefixes
                    .iter()
                    .map(|p| m.prefill(p).expect("prefill"))
                    .collect();
                let refs: Vec<_> = states.iter().collect();
                m.score_rows(&refs, &rows, &cands).expect("score")
            };
            let want = run(&t.cpu);
            let gpus = [
                (ComputeDType::F32, "", &t.gpu_f32),
                (ComputeDType::Bf16, "", &t.gpu_bf16),
                (ComputeDType::F32, " chunked", &t.gpu_f32_chunked),
            ];
            for (dtype, tag, gpu) in gpus {
                let got = run(gpu);
                for r in 0..rows.len() {
                    report.check(
                        gpu_tolerance(dtype),
                        &format!("{} prefill+score cuda {dtype:?}{tag} vs cpu f32", t.name),
                        &format!("({} cands) row {r}", cands.len()),
                        got.row(r),
                        want.row(r),
                    );
                }
            }
        }
    }
    report.finish("prefill+score");
}

/// Packed prefill on the GPU (several prefixes in one pass; on Qwen3.5 the fused Gated DeltaNet
/// kernels run the segments as one right-padded batch) scores like one CPU f32 prefill per prefix.
#[test]
fn cuda_packed_prefill_tracks_cpu_f32() {
    let Some(trios) = trios() else { return };
    let mut report = Report::default();
    let cands = candidates();
    for t in trios {
        let prefixes = [
            ids(60, 45, t.vocab),
            ids(61, 3, t.vocab),
            ids(62, 70, t.vocab),
            ids(63, 19, t.vocab),
        ];
        let refs: Vec<&[u32]> = prefixes.iter().map(Vec::as_slice).collect();
        let suffix = ids(64, 4, t.vocab);
        let row = [ScoreRow {
            state: 0,
            suffix: &suffix,
        }];
        for (dtype, gpu) in [
            (ComputeDType::F32, &t.gpu_f32),
            (ComputeDType::Bf16, &t.gpu_bf16),
        ] {
            let packed = gpu.prefill_packed(&refs).expect("packed prefill");
            for (i, p) in refs.iter().enumerate() {
                let cpu_state = t.cpu.prefill(p).expect("cpu prefill");
                let want = t
                    .cpu
                    .score_rows(&[&cpu_state], &row, &cands)
                    .expect("cpu score");
                let got = gpu
                    .score_rows(&[&packed[i]], &row, &cands)
                    .expect("gpu score");
                report.check(
                    gpu_tolerance(dtype),
                    &format!("{} packed prefill cuda {dtype:?} vs cpu f32", t.name),
                    &format!("prefix {i} ({} tokens)", p.len()),
                    got.row(0),
                    want.row(0),
                );
            }
        }
    }
    report.finish("packed prefill");
}

/// Several suffixes continuing one head (`extend_many`: padded rows over the shared past on the
/// GPU, longer than the delta rule's chunk so the chunked kernel reads the shared state through
/// its row map) track the CPU's whole prefill of head ++ suffix.
#[test]
fn cuda_extend_many_over_a_shared_head_tracks_cpu_f32() {
    let Some(trios) = trios() else { return };
    let mut report = Report::default();
    let cands = candidates();
    for t in trios {
        let head = ids(70, 37, t.vocab);
        let suffixes = [
            ids(71, 90, t.vocab),
            ids(72, 3, t.vocab),
            ids(73, 66, t.vocab),
            ids(74, 1, t.vocab),
        ];
        let refs: Vec<&[u32]> = suffixes.iter().map(Vec::as_slice).collect();
        let probe = ids(75, 4, t.vocab);
        let row = [ScoreRow {
            state: 0,
            suffix: &probe,
        }];
        for (dtype, gpu) in [
            (ComputeDType::F32, &t.gpu_f32),
            (ComputeDType::Bf16, &t.gpu_bf16),
        ] {
            let start = gpu.prefill(&head).expect("gpu head");
            let many = gpu.extend_many(&start, &refs);
            assert_eq!(many.len(), refs.len());
            for (i, (s, got)) in refs.iter().zip(&many).enumerate() {
                let got = got.as_ref().expect("gpu extend_many");
                assert_eq!(got.len(), head.len() + s.len());
                let whole = t.cpu.prefill(&concat(&head, s)).expect("cpu prefill");
                let want = t
                    .cpu
                    .score_rows(&[&whole], &row, &cands)
                    .expect("cpu score");
                let got = gpu.score_rows(&[got], &row, &cands).expect("gpu score");
                report.check(
                    gpu_tolerance(dtype),
                    &format!("{} extend_many cuda {dtype:?} vs cpu f32", t.name),
                    &format!("suffix {i} ({} tokens)", s.len()),
                    got.row(0),
                    want.row(0),
                );
            }
        }
    }
    report.finish("extend_many");
}

/// On the GPU itself, in each dtype: forked scoring equals the full forward of the same prompt.
#[test]
fn cuda_score_equals_cuda_forward_full() {
    let Some(trios) = trios() else { return };
    let mut report = Report::default();
    for t in trios {
        let cands = wide_candidates(t.rows);
        let prefix = ids(40, 33, t.vocab);
        let suffixes: Vec<Vec<u32>> = (0..3)
            .map(|i| ids(41 + i, 2 + i as usize * 4, t.vocab))
            .collect();
        let rows: Vec<ScoreRow> = suffixes
            .iter()
            .map(|s| ScoreRow {
                state: 0,
                suffix: s,
            })
            .collect();
        for (dtype, gpu) in [
            (ComputeDType::F32, &t.gpu_f32),
            (ComputeDType::Bf16, &t.gpu_bf16),
        ] {
            let state = gpu.prefill(&prefix).expect("prefill");
            let got = gpu.score_rows(&[&state], &rows, &cands).expect("score");
            for (r, s) in suffixes.iter().enumerate() {
                let full = gpu.forward_full(&concat(&prefix, s), &cands).expect("full");
                report.check(
                    gpu_tolerance(dtype),
                    &format!("{} cuda {dtype:?} score vs cuda forward_full", t.name),
                    &format!("row {r}"),
                    got.row(r),
                    &full,
                );
            }
        }
    }
    report.finish("gpu fork vs full");
}

/// The device and dtype the GPU backends report.
#[test]
fn cuda_facts_name_the_device() {
    let Some(trios) = trios() else { return };
    for t in trios {
        assert_eq!(t.gpu_f32.facts().device.to_string(), "cuda:0", "{}", t.name);
        assert_eq!(t.gpu_f32.facts().dtype.as_str(), "f32", "{}", t.name);
        assert_eq!(t.gpu_bf16.facts().dtype.as_str(), "bf16", "{}", t.name);
    }
}

/// The fused delta-rule kernel against the candle recurrence and chunked forms, layer by layer
/// on CUDA f32: key dims 64, 128 and 256, non-zero start states, a ragged right-padded batch
/// and a prefill long enough to cross many staged chunks.
#[test]
fn cuda_fused_delta_rule_equals_candle_forms() {
    use candle_core::{DType, Tensor};
    use forkscore_backends::candle::gated_deltanet::{
        fused, DeltaRule, GdnDims, GdnLayer, GdnState, GdnWeights, RightPadding,
    };
    if trios().is_none() {
        return;
    }
    let dev = DeviceSpec::Cuda(0).open().expect("cuda");
    let mut seed = 0x5eed_u64;
    let mut rand = |shape: &[usize], scale: f32| -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect();
        Tensor::from_vec(v, shape, &dev).expect("tensor")
    };
    let max_diff = |a: &Tensor, b: &Tensor| -> f32 {
        a.sub(b)
            .and_then(|d| d.abs())
            .and_then(|d| d.flatten_all())
            .and_then(|d| d.max(0))
            .and_then(|d| d.to_scalar::<f32>())
            .expect("diff")
    };
    // the recurrent kernel is f32 throughout; the chunked one multiplies on the tensor cores in
    // TF32, so it is held to its own bound (and dv 40 is not whole tiles: it falls back)
    let (mut worst, mut worst_tf32) = (0f32, 0f32);
    let tf32 = Tolerance::GPU_TF32_DELTA_RULE;
    for (dk, dv, hk, hv) in [
        (64, 40, 2, 4),
        (128, 128, 2, 4),
        (64, 48, 1, 3),
        (256, 64, 1, 2),
    ] {
        let dims = GdnDims {
            hidden: 64,
            key_heads: hk,
            value_heads: hv,
            key_dim: dk,
            value_dim: dv,
            conv_kernel: 4,
            rms_norm_eps: 1e-6,
        };
        assert!(
            fused::supports(&dims, &dev),
            "fused kernel must take dk {dk}"
        );
        let (d, cc, cv) = (64, dims.conv_channels(), dims.value_channels());
        let s = 1.0 / (d as f32).sqrt();
        let w = GdnWeights {
            in_proj_qkv: rand(&[cc, d], s),
            in_proj_z: rand(&[cv, d], s),
            in_proj_b: rand(&[hv, d], s),
            in_proj_a: rand(&[hv, d], s),
            conv1d: rand(&[cc, 1, 4], 0.5),
            a_log: rand(&[hv], 1.0),
            dt_bias: rand(&[hv], 1.0),
            norm: (rand(&[dv], 0.5) + 1.0).expect("norm"),
            out_proj: rand(&[d, cv], s),
        };
        let layer = GdnLayer::new(dims, w, DType::F32).expect("layer");
        // both CUDA forms of long calls: token by token, and the chunked WY kernels
        for form in [fused::PrefillForm::Recurrent, fused::PrefillForm::Chunked] {
            fused::set_prefill_form(form);
            let tensor_cores = form == fused::PrefillForm::Chunked && dk <= 128 && dv % 16 == 0;
            for (b, l, lengths) in [(2usize, 150usize, Some(vec![150usize, 97])), (1, 700, None)] {
                let x = rand(&[b, l, d], 2.0);
                let st = GdnState {
                    conv: rand(&[b, 3, cc], 1.0),
                    recurrent: rand(&[b, hv, dk, dv], 0.5),
                };
                let pad = lengths.map(|ls| RightPadding::new(ls, l).expect("padding"));
                let (y_f, s_f) = layer
                    .forward_with(&x, &st, None, pad.as_ref(), DeltaRule::Fused)
                    .expect("fused");
                let (y_c, s_c) = layer
                    .forward_with(&x, &st, None, pad.as_ref(), DeltaRule::Chunked(64))
                    .expect("chunked");
                let (y_r, s_r) = layer
                    .forward_with(&x, &st, None, pad.as_ref(), DeltaRule::Recurrent)
                    .expect("recurrent");
                // Padded positions' outputs are unspecified: compare the real prefix of each row.
                let rows: Vec<usize> = match &pad {
                    Some(p) => p.lengths().to_vec(),
                    None => vec![l; b],
                };
                for (row, len) in rows.iter().enumerate() {
                    let cut = |t: &Tensor| {
                        t.narrow(0, row, 1)
                            .and_then(|t| t.narrow(1, 0, *len))
                            .expect("cut")
                    };
                    let (ey_r, ey_c) = (
                        max_diff(&cut(&y_f), &cut(&y_r)),
                        max_diff(&cut(&y_f), &cut(&y_c)),
                    );
                    if tensor_cores {
                        worst_tf32 = worst_tf32.max(ey_r).max(ey_c);
                    } else {
                        worst = worst.max(ey_r).max(ey_c);
                    }
                    println!("{form:?} dk {dk} dv {dv} B {b} L {l} row {row}: |fused - recurrent| {ey_r:e}, |fused - chunked| {ey_c:e}");
                }
                // Rows continuing retained states through a slot map (read in place by the
                // kernels) equal the same rows from a gathered copy, bit for bit.
                // each row's real tokens of two outputs equal, bit for bit
                let rows_equal = |a: &Tensor, b: &Tensor, what: &str| {
                    for (row, len) in rows.iter().enumerate() {
                        let cut = |t: &Tensor| {
                            t.narrow(0, row, 1)
                                .and_then(|t| t.narrow(1, 0, *len))
                                .expect("cut")
                        };
                        assert_eq!(max_diff(&cut(a), &cut(b)), 0.0, "{what} row {row}");
                    }
                };
                for slots in [vec![0u32; b], (0..b as u32).rev().collect::<Vec<_>>()] {
                    let (y_m, s_m) = layer
                        .forward_with(&x, &st, Some(&slots), pad.as_ref(), DeltaRule::Fused)
                        .expect("fused from slots");
                    let gathered = st.select_rows(&slots).expect("gather");
                    let (y_g, s_g) = layer
                        .forward_with(&x, &gathered, None, pad.as_ref(), DeltaRule::Fused)
                        .expect("fused from a gathered state");
                    rows_equal(&y_m, &y_g, &format!("slots {slots:?}"));
                    assert_eq!(
                        max_diff(&s_m.recurrent, &s_g.recurrent),
                        0.0,
                        "slots {slots:?}"
                    );
                    // a call whose new state nobody keeps (a scoring pass): the kernels skip
                    // the final states, the outputs stay the same bit for bit
                    let (y_d, s_d) = layer
                        .forward_discarding(&x, &st, Some(&slots), pad.as_ref())
                        .expect("fused, state discarded");
                    rows_equal(&y_d, &y_m, &format!("discarding: slots {slots:?}"));
                    assert_eq!(s_d.recurrent.dims(), &[b, hv, 0, dv]);
                    assert_eq!(max_diff(&s_m.conv, &s_g.conv), 0.0, "slots {slots:?}");
                }
                let es = max_diff(&s_f.recurrent, &s_r.recurrent)
                    .max(max_diff(&s_f.recurrent, &s_c.recurrent));
                let ec = max_diff(&s_f.conv, &s_r.conv);
                println!("{form:?} dk {dk} dv {dv} B {b} L {l}: state {es:e}, conv state {ec:e}");
                if tensor_cores {
                    worst_tf32 = worst_tf32.max(es);
                } else {
                    worst = worst.max(es);
                }
                worst = worst.max(ec);
            }
        }
    }
    fused::set_prefill_form(fused::PrefillForm::Auto);
    println!(
        "SUMMARY fused delta rule: f32 forms worst max |diff| {worst:e}; TF32 chunked form {worst_tf32:e} (bound {})",
        tf32.abs
    );
    assert!(
        worst <= 1e-4,
        "fused kernel differs from the candle forms by {worst:e}"
    );
    assert!(
        worst_tf32 <= tf32.abs,
        "chunked tensor-core kernel differs from the candle forms by {worst_tf32:e} ({})",
        tf32.name
    );
    assert!(
        worst_tf32 > 0.0,
        "the chunked tensor-core kernel did not run"
    );
}

/// The flash attention kernel against the candle attention path, both in bf16 on CUDA, on
/// random inputs of the real head shapes: prefill (head dims 64, 128, 256 with GQA), a chunk over
/// a past, forked rows over one shared prefix, rows over several left-padded slots, and
/// one-token rows.
#[test]
fn cuda_flash_attention_equals_candle_path() {
    use candle_core::{DType, Tensor};
    use forkscore_backends::candle::attention::{
        attend, set_kernel, takes_flash, AttentionKernel, AttnMasks, PastKv,
    };
    use forkscore_backends::candle::mask;
    let Ok(dev) = DeviceSpec::Cuda(0).open() else {
        eprintln!("SKIPPED: no CUDA device");
        return;
    };
    let mut seed = 0xf1a5_u64;
    let mut rand = |shape: &[usize]| -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(v, shape, &dev)
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("tensor")
    };
    let tol = Tolerance::GPU_BF16_ATTENTION;
    let mut worst = 0f32;
    // One call through the flash kernel (which must take it) and through the candle path:
    // max |difference| of the outputs.
    let flash_vs_candle = |name: &str,
                           q: &Tensor,
                           kn: &Tensor,
                           vn: &Tensor,
                           past: Option<&(Tensor, Tensor)>,
                           masks: &AttnMasks<'_>|
     -> f32 {
        let pkv = || past.map(|(k, v)| PastKv { k, v });
        assert!(
            takes_flash(q, kn, pkv().as_ref(), masks),
            "{name}: the flash kernel must take this call"
        );
        set_kernel(Some(AttentionKernel::Fastest));
        let flash = attend(q, kn, vn, pkv(), masks).expect("flash");
        set_kernel(Some(AttentionKernel::Candle));
        let reference = attend(q, kn, vn, pkv(), masks).expect("candle");
        set_kernel(None);
        let flat = |t: &Tensor| -> Vec<f32> {
            t.to_dtype(DType::F32)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1())
                .expect("to host")
        };
        let (got, want) = (flat(&flash), flat(&reference));
        assert_eq!(got.len(), want.len(), "{name}: output sizes");
        let d = Tolerance::max_abs_diff(&got, &want);
        println!("{name}: max |flash - candle| {d:e}");
        d
    };
    // (name, B, H, Hkv, L, hd, S, P, past lengths per row (None: all see the whole past))
    type Case = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        Option<Vec<usize>>,
    );
    let cases: Vec<Case> = vec![
        ("prefill hd256 16/4", 1, 16, 4, 300, 256, 0, 0, None),
        ("prefill hd128 12/2", 1, 12, 2, 333, 128, 0, 0, None),
        ("prefill hd64 6/3 two rows", 2, 6, 3, 45, 64, 0, 0, None),
        ("chunk over a past", 1, 12, 2, 150, 128, 1, 201, None),
        ("28 rows over one prefix", 28, 12, 2, 9, 128, 1, 257, None),
        (
            "6 rows over 2 ragged slots",
            6,
            16,
            4,
            13,
            256,
            2,
            120,
            Some(vec![120, 7, 64, 1, 119, 120]),
        ),
        (
            "one-token rows",
            4,
            16,
            4,
            1,
            256,
            4,
            50,
            Some(vec![50, 3, 49, 20]),
        ),
    ];
    for (name, b, h, hkv, l, hd, slots, p, lens) in cases {
        let q = rand(&[b, h, l, hd]);
        let (kn, vn) = (rand(&[b, hkv, l, hd]), rand(&[b, hkv, l, hd]));
        let past = (p > 0).then(|| (rand(&[hkv, slots, p, hd]), rand(&[hkv, slots, p, hd])));
        let causal = (l > 1).then(|| mask::NewKeysMask::causal(l, &dev));
        let (past_mask, past_start) = match &lens {
            Some(ls) => (
                Some(mask::left_padding(ls, p, &dev).expect("mask")),
                Some(mask::past_starts(ls, p, &dev).expect("starts")),
            ),
            None => (None, None),
        };
        let masks = AttnMasks {
            new_keys: causal.as_ref(),
            past: past_mask.as_ref(),
            past_start: past_start.as_ref(),
            precision: Default::default(),
        };
        worst = worst.max(flash_vs_candle(name, &q, &kn, &vn, past.as_ref(), &masks));
    }
    // Token trees packed into one sequence over a shared prefix (tree mode): the kernel reads
    // the tree's u8 visibility. (name, H, Hkv, hd, P, parents)
    let trees: Vec<(&str, usize, usize, usize, usize, Vec<Option<usize>>)> = vec![
        (
            "tree: 3 roots, shared internal nodes, depth 3",
            12,
            2,
            128,
            300,
            vec![
                None,
                Some(0),
                Some(1),
                Some(1),
                None,
                Some(4),
                Some(5),
                Some(5),
                Some(4),
                None,
            ],
        ),
        (
            "tree: 70 nodes (two key tiles), hd256",
            16,
            4,
            256,
            97,
            (0..70)
                .map(|i: usize| (i % 7 != 0).then(|| i - 1 - (i % 3).min(i % 7 - 1)))
                .collect(),
        ),
        (
            "tree: chains only (= causal)",
            6,
            3,
            64,
            0,
            vec![None, Some(0), Some(1), Some(2)],
        ),
    ];
    for (name, h, hkv, hd, p, parents) in trees {
        let l = parents.len();
        let q = rand(&[1, h, l, hd]);
        let (kn, vn) = (rand(&[1, hkv, l, hd]), rand(&[1, hkv, l, hd]));
        let past = (p > 0).then(|| (rand(&[hkv, 1, p, hd]), rand(&[hkv, 1, p, hd])));
        let tree = mask::NewKeysMask::tree(&parents, &dev).expect("tree mask");
        let masks = AttnMasks {
            new_keys: Some(&tree),
            past: None,
            past_start: None,
            precision: Default::default(),
        };
        worst = worst.max(flash_vs_candle(name, &q, &kn, &vn, past.as_ref(), &masks));
    }
    println!(
        "SUMMARY flash attention: worst max |diff| {worst:e} ({})",
        tol.name
    );
    assert!(
        worst <= tol.abs,
        "flash attention differs from candle by {worst:e} > {}",
        tol.abs
    );
}

/// The GPU top-K kernel (`vocab_rows` on CUDA f32, K = 0, 1, 5, 128, 256) on every model's real
/// vocabulary: its top K equals, bit for bit, the plain path (full log-softmax with the kernel's
/// own logsumexp, fully sorted) on the same device's logits, and its logsumexp is within 2 ulps
/// of the host's. The forced host path (`FORKSCORE_VOCAB_TOPK=host` semantics) is the CPU run.
#[test]
fn cuda_vocab_top_k_is_exact() {
    use forkscore_backends::VocabRequest;
    use forkscore_seam::topk::{logsumexp, top_k_reference_with_lse};
    let Some(trios) = trios() else { return };
    let mut failures = Vec::new();
    let mut worst_ulps = 0i64;
    for t in trios {
        let prompt = ids(77, 40, t.vocab);
        let logits = t.gpu_f32.full_logits(&prompt).expect("full logits");
        for k in [0usize, 1, 5, 128, 256] {
            let req = VocabRequest::new(&prompt, 0..prompt.len(), k).expect("request");
            let rows = t.gpu_f32.vocab_rows(&req).expect("vocab rows on CUDA");
            assert_eq!(rows.len(), prompt.len());
            for (p, r) in rows.iter().enumerate() {
                let want =
                    top_k_reference_with_lse(&logits[p], k, r.vocab.logsumexp).expect("finite");
                let got: Vec<(u32, u32)> = r
                    .vocab
                    .top
                    .iter()
                    .map(|e| (e.id, e.logprob.to_bits()))
                    .collect();
                let exp: Vec<(u32, u32)> = want
                    .top
                    .iter()
                    .map(|e| (e.id, e.logprob.to_bits()))
                    .collect();
                if got != exp {
                    failures.push(format!("{} k {k} position {p}: top-K differs", t.name));
                }
                let host = logsumexp(&logits[p]).expect("finite");
                let ulps = (i64::from(host.to_bits() as i32)
                    - i64::from(r.vocab.logsumexp.to_bits() as i32))
                .abs();
                worst_ulps = worst_ulps.max(ulps);
                if ulps > 2 {
                    failures.push(format!(
                        "{} k {k} position {p}: logsumexp {} vs host {host} ({ulps} ulps)",
                        t.name, r.vocab.logsumexp
                    ));
                }
                if let (Some(next), Some(&id)) = (r.next, prompt.get(p + 1)) {
                    let lp = logits[p][id as usize] - r.vocab.logsumexp;
                    if next.id != id || next.logprob.to_bits() != lp.to_bits() {
                        failures.push(format!("{} k {k} position {p}: next-token logprob", t.name));
                    }
                }
            }
        }
    }
    eprintln!("SUMMARY top-K on CUDA: worst logsumexp difference to the host {worst_ulps} ulps, {} failures", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The stacked products (the CUDA default: gate|up with the fused SwiGLU kernel, q|k|v on
/// the Qwen2 family, the four Gated DeltaNet input projections on Qwen3.5) against separate
/// products and candle's SiLU and product (`fusion::set_gate_up(false)`, `fusion::set_qkv(false)`,
/// `fusion::set_gdn_projections(Some(false))`), whole models, f32 and bf16:
/// `forward_full` logits over 4,096 candidates.
#[test]
fn cuda_stacked_gate_up_equals_separate_products() {
    use forkscore_backends::candle::fusion;
    let Some(trios) = trios() else { return };
    let mut report = Report::default();
    for t in trios {
        fusion::set_gate_up(false);
        fusion::set_qkv(false);
        fusion::set_gdn_projections(Some(false));
        let chunk = LoadOptions::default().prefill_chunk;
        let sep_f32 = load_on(&t.dir, DeviceSpec::Cuda(0), ComputeDType::F32, chunk);
        let sep_bf16 = load_on(&t.dir, DeviceSpec::Cuda(0), ComputeDType::Bf16, chunk);
        fusion::set_gate_up(true);
        fusion::set_qkv(true);
        // the opt-in forms too (stacked GDN projections at load, the stacked q|k|v heads'
        // fused kernel at call time): the "fused" side of the comparison
        fusion::set_gdn_projections(Some(true));
        let stk_f32 = load_on(&t.dir, DeviceSpec::Cuda(0), ComputeDType::F32, chunk);
        let stk_bf16 = load_on(&t.dir, DeviceSpec::Cuda(0), ComputeDType::Bf16, chunk);
        fusion::set_gdn_projections(None);
        let cands = wide_candidates(t.rows);
        let prompt = ids(91, 57, t.vocab);
        for (dtype, fused, separate) in [
            (ComputeDType::F32, &stk_f32, &sep_f32),
            (ComputeDType::Bf16, &stk_bf16, &sep_bf16),
        ] {
            let want = separate.forward_full(&prompt, &cands).expect("separate");
            fusion::set_qkv_heads(true);
            let got = fused.forward_full(&prompt, &cands).expect("stacked");
            report.check(
                gpu_tolerance(dtype),
                &format!("{} {dtype:?} stacked vs separate gate|up, q|k|v", t.name),
                "forward_full 57 tokens",
                &got,
                &want,
            );
        }
    }
    report.finish("cuda_stacked_gate_up_equals_separate_products");
}

/// In-memory q8_0 on CUDA against q8_0 on the CPU, same checkpoint, f32 compute: a 57-token
/// forward (more rows than the GPU's matrix-vector kernels serve, so the weight is dequantized
/// for the dense GEMM) and prefill + a 3-token fork (the quantized kernels). Both sides hold the
/// same blocks; they differ by where activations are rounded to 8 bits, bounded by the q8_0
/// tolerance the CPU tests hold against f32. bf16 compute must pick the same argmax except at
/// near-ties.
#[test]
fn cuda_quantized_q8_0_tracks_cpu_q8_0() {
    use forkscore_backends::Quantization;
    let Some(trios) = trios() else { return };
    let mut report = Report::default();
    let load_q = |dir: &Path, device: DeviceSpec, dtype: ComputeDType| {
        let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-gpu-q8").expect("resolve");
        CandleBackend::load(
            &ckpt,
            &LoadOptions {
                device,
                dtype,
                quantization: Some(Quantization::Q8_0),
                ..LoadOptions::default()
            },
        )
        .expect("load quantized")
    };
    for t in trios {
        let cpu = load_q(&t.dir, DeviceSpec::Cpu, ComputeDType::F32);
        let cands = wide_candidates(t.rows);
        let prompt = ids(92, 57, t.vocab);
        for dtype in [ComputeDType::F32, ComputeDType::Bf16] {
            let gpu = load_q(&t.dir, DeviceSpec::Cuda(0), dtype);
            assert_eq!(
                gpu.quant_summary(),
                cpu.quant_summary(),
                "{}: the same weights are quantized",
                t.name
            );
            let tol = match dtype {
                ComputeDType::F32 => Tolerance::Q8_0_TINY_LOGITS,
                _ => gpu_tolerance(dtype),
            };
            let want = cpu.forward_full(&prompt, &cands).expect("cpu q8_0");
            let got = gpu.forward_full(&prompt, &cands).expect("cuda q8_0");
            report.check(
                tol,
                &format!("{} {dtype:?} q8_0 cuda vs cpu", t.name),
                "forward_full 57 tokens (dequantized GEMM)",
                &got,
                &want,
            );
            let small = [cands[7], cands[100], cands[2000]];
            let want = prefill_and_fork(&cpu, &prompt, 54, &small);
            let got = prefill_and_fork(&gpu, &prompt, 54, &small);
            report.check(
                tol,
                &format!("{} {dtype:?} q8_0 cuda vs cpu", t.name),
                "prefill 54 + fork of 3 (quantized kernels)",
                &got,
                &want,
            );
        }
    }
    report.finish("cuda_quantized_q8_0_tracks_cpu_q8_0");
}

/// `prompt[..at]` prefilled, then one row continuing it with `prompt[at..]`, scored over
/// `candidates`: the candidate logits of that row.
fn prefill_and_fork(b: &CandleBackend, prompt: &[u32], at: usize, candidates: &[u32]) -> Vec<f32> {
    let state = b.prefill(&prompt[..at]).expect("prefill");
    let row = ScoreRow {
        state: 0,
        suffix: &prompt[at..],
    };
    b.score_rows(&[&state], &[row], candidates)
        .expect("score")
        .data
}

/// The tiny GGUF fixtures (`fixtures/gguf/`: the tiny Qwen2.5 and Qwen3 as F32 and Q8_0 files)
/// loaded on CUDA track the same files on the CPU: the Q8_0 linear weights come to the GPU as
/// blocks (`Linear::from_blocks`), the F32 ones dense. The fixtures are found beside the sources
/// (a build's own checkout) or under the working directory (the GPU machine runs from a copy of
/// the repository root); a run that finds neither says so and fails.
#[test]
fn cuda_gguf_tracks_cpu_gguf() {
    if trios().is_none() {
        return;
    }
    let dir = [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf"),
        PathBuf::from("fixtures/gguf"),
    ]
    .into_iter()
    .find(|d| d.join("qwen25_q8_0.gguf").is_file())
    .expect("fixtures/gguf/*.gguf beside the sources or under the working directory");
    let mut report = Report::default();
    let load = |file: &str, device: DeviceSpec, dtype: ComputeDType| {
        let ckpt = ResolvedCheckpoint::from_gguf(&dir.join(file), "tiny-gguf").expect("resolve");
        CandleBackend::load(
            &ckpt,
            &LoadOptions {
                device,
                dtype,
                ..LoadOptions::default()
            },
        )
        .expect("load GGUF")
    };
    // the fixtures keep the first 2,048 embedding rows: ids and candidates stay below them
    let prompt: Vec<u32> = (0..57u32).map(|i| (i * 331 + 17) % 2048).collect();
    let cands: Vec<u32> = (0..512u32).map(|i| (i * 13 + 5) % 2048).collect();
    for file in [
        "qwen25_f32.gguf",
        "qwen25_q8_0.gguf",
        "qwen3_f32.gguf",
        "qwen3_q8_0.gguf",
    ] {
        let cpu = load(file, DeviceSpec::Cpu, ComputeDType::F32);
        for dtype in [ComputeDType::F32, ComputeDType::Bf16] {
            let gpu = load(file, DeviceSpec::Cuda(0), dtype);
            assert_eq!(
                gpu.quant_summary(),
                cpu.quant_summary(),
                "{file}: the same weights stay quantized"
            );
            let tol = match dtype {
                ComputeDType::F32 if file.contains("q8_0") => Tolerance::Q8_0_TINY_LOGITS,
                _ => gpu_tolerance(dtype),
            };
            let want = cpu.forward_full(&prompt, &cands).expect("cpu");
            let got = gpu.forward_full(&prompt, &cands).expect("cuda");
            report.check(
                tol,
                &format!("{file} {dtype:?} cuda vs cpu"),
                "forward_full 57 tokens",
                &got,
                &want,
            );
            let want = prefill_and_fork(&cpu, &prompt, 50, &cands[..3]);
            let got = prefill_and_fork(&gpu, &prompt, 50, &cands[..3]);
            report.check(
                tol,
                &format!("{file} {dtype:?} cuda vs cpu"),
                "prefill 50 + fork of 1",
                &got,
                &want,
            );
        }
    }
    report.finish("cuda_gguf_tracks_cpu_gguf");
}

/// `shape` values uniform on `[offset − scale, offset + scale)` from an LCG at `seed` (advanced),
/// in `dtype` on `dev`: the kernel tests' fixed inputs.
fn seeded_uniform(
    seed: &mut u64,
    shape: &[usize],
    scale: f32,
    offset: f32,
    dtype: candle_core::DType,
    dev: &candle_core::Device,
) -> candle_core::Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale + offset
        })
        .collect();
    candle_core::Tensor::from_vec(v, shape, dev)
        .and_then(|t| t.to_dtype(dtype))
        .expect("tensor")
}

/// `(max |a − b|, max |b|)` in f32.
fn max_abs(a: &candle_core::Tensor, b: &candle_core::Tensor) -> (f32, f32) {
    use candle_core::DType;
    let f = |t: &candle_core::Tensor| t.to_dtype(DType::F32).expect("f32");
    let d = (f(a) - f(b))
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("diff");
    let r = f(b)
        .abs()
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("max");
    (d, r)
}

/// The fused residual add + RMSNorm kernel against candle's add then rmsnorm, in f32 and bf16,
/// over the hidden sizes of the supported models' shapes and one-row calls.
#[test]
fn cuda_add_rms_norm_equals_add_then_norm() {
    use candle_core::{DType, Tensor};
    use forkscore_backends::candle::residual_norm::{add_rms_norm, reference};
    let Ok(dev) = DeviceSpec::Cuda(0).open() else {
        eprintln!("SKIPPED: no CUDA device");
        return;
    };
    let mut seed = 0xadd_u64;
    let mut rand = |shape: &[usize], scale: f32, dtype: DType| -> Tensor {
        seeded_uniform(&mut seed, shape, scale, 0.0, dtype, &dev)
    };
    for dtype in [DType::F32, DType::BF16] {
        for shape in [
            [3usize, 17, 2560],
            [1, 5, 896],
            [2, 1, 1536],
            [1, 300, 4096],
        ] {
            let d = shape[2];
            let x = rand(&shape, 4.0, dtype);
            let m = rand(&shape, 2.0, dtype);
            let w = rand(&[d], 1.5, dtype);
            let (s_f, n_f) = add_rms_norm(&x, &m, &w, 1e-6).expect("fused");
            let (s_r, n_r) = reference(&x, &m, &w, 1e-6).expect("reference");
            assert_eq!(s_f.dims(), &shape);
            assert_eq!(n_f.dims(), &shape);
            let (ds, rs) = max_abs(&s_f, &s_r);
            let (dn, rn) = max_abs(&n_f, &n_r);
            println!(
                "add_rms_norm {dtype:?} {shape:?}: |Δsum| {ds:e} (max {rs:.2}), |Δnormed| {dn:e} (max {rn:.2})"
            );
            // the sum is the same rounding of the same values; the norm differs only in the
            // f32 summation order of mean(x²): f32 to ~1e-6 relative, bf16 to one ulp
            let (sum_tol, norm_tol) = match dtype {
                DType::F32 => (0.0, 1e-5 * rn),
                _ => (rs / 128.0, rn / 64.0),
            };
            assert!(
                ds <= sum_tol,
                "{dtype:?} {shape:?}: sum {ds:e} > {sum_tol:e}"
            );
            assert!(
                dn <= norm_tol,
                "{dtype:?} {shape:?}: normed {dn:e} > {norm_tol:e}"
            );
        }
    }
}

/// The fused heads kernel (per-head RMSNorm + RoPE + head-major layout in one pass) against the
/// candle form on the same bf16 inputs: the query half of a gated layer's `q | gate` read in
/// place, keys, full and partial rotary dims, with and without the norm, several rows.
#[test]
fn cuda_fused_heads_equal_candle_form() {
    use candle_core::{DType, Tensor, D};
    use forkscore_backends::candle::cuda::heads::{norm_rope, reference, takes};
    let Ok(dev) = DeviceSpec::Cuda(0).open() else {
        eprintln!("SKIPPED: no CUDA device");
        return;
    };
    let mut seed = 0x4ead_u64;
    let mut rand = |shape: &[usize], scale: f32, offset: f32| -> Tensor {
        seeded_uniform(&mut seed, shape, scale, offset, DType::BF16, &dev)
    };
    // (rows, len, heads, hd, rotary dim, gated: read through q | gate, norm)
    for (b, l, h, hd, rot, gated, norm) in [
        (1usize, 300usize, 16usize, 256usize, 64usize, true, true),
        (1, 300, 4, 256, 64, false, true),
        (3, 17, 8, 128, 128, false, true),
        (2, 9, 2, 64, 64, false, false),
        (28, 12, 16, 256, 64, true, true),
    ] {
        let width = if gated { 2 * hd } else { hd };
        let proj = rand(&[b, l, h * width], 3.0, 0.0);
        let x = proj
            .reshape((b, l, h, width))
            .and_then(|t| t.narrow(D::Minus1, 0, hd))
            .expect("view");
        let w = rand(&[hd], 0.5, 1.0);
        let angles = rand(&[b, l, rot / 2], 3.0, 0.0)
            .to_dtype(DType::F32)
            .expect("f32");
        let cos = angles
            .cos()
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("cos");
        let sin = angles
            .sin()
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("sin");
        let norm = norm.then_some((&w, 1e-6f32));
        assert!(
            takes(&x, norm.map(|(w, _)| w), &cos, &sin),
            "{b} {l} {h} {hd}"
        );
        let fused = norm_rope(&x, norm, &cos, &sin).expect("fused");
        let want = reference(&x, norm, &cos, &sin).expect("reference");
        assert_eq!(fused.dims(), &[b, h, l, hd]);
        let (d, r) = max_abs(&fused, &want);
        println!(
            "fused heads ({b}, {l}, {h}, {hd}) rot {rot} gated {gated}: |Δ| {d:e} (max {r:.2})"
        );
        // the candle form rounds the rope's products to bf16, the kernel once at the end
        assert!(
            d <= r / 64.0,
            "({b}, {l}, {h}, {hd}): {d:e} > {:e}",
            r / 64.0
        );
    }
}

/// The fused heads kernel with a projection's bias (the Qwen2 family's stacked q|k|v, whose
/// product leaves its bias to the kernel) against candle's bias add, head-major copy and rope on
/// the same bf16 inputs: query / key heads read as views of the stacked product and rotated,
/// value heads only laid out head-major, and the bias add equal bit for bit where nothing rotates.
#[test]
fn cuda_fused_biased_heads_equal_candle_form() {
    use candle_core::{DType, Tensor};
    use forkscore_backends::candle::cuda::heads::{bias_rope, reference_biased, takes_biased};
    let Ok(dev) = DeviceSpec::Cuda(0).open() else {
        eprintln!("SKIPPED: no CUDA device");
        return;
    };
    let mut seed = 0xb1a5_u64;
    let mut rand = |shape: &[usize], scale: f32, offset: f32| -> Tensor {
        seeded_uniform(&mut seed, shape, scale, offset, DType::BF16, &dev)
    };
    // (rows, len, query heads, kv heads, hd)
    for (b, l, h, hkv, hd) in [
        (1usize, 300usize, 12usize, 2usize, 128usize),
        (28, 5, 12, 2, 128),
        (3, 17, 14, 2, 64),
        (2, 9, 4, 4, 32),
    ] {
        let n = h + 2 * hkv;
        let product = rand(&[b, l, n * hd], 3.0, 0.0)
            .reshape((b, l, n, hd))
            .expect("heads");
        let bias = rand(&[n * hd], 2.0, 0.0);
        let angles = rand(&[b, l, hd / 2], 3.0, 0.0)
            .to_dtype(DType::F32)
            .expect("f32");
        let cos = angles
            .cos()
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("cos");
        let sin = angles
            .sin()
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("sin");
        for (name, start, count, rotate) in [
            ("q", 0, h, true),
            ("k", h, hkv, true),
            ("v", h + hkv, hkv, false),
        ] {
            let x = product.narrow(2, start, count).expect("part");
            let bx = bias.narrow(0, start * hd, count * hd).expect("bias part");
            let rope = rotate.then_some((&cos, &sin));
            assert!(
                takes_biased(&x, &bx, rope),
                "{name} ({b}, {l}, {count}, {hd})"
            );
            let fused = bias_rope(&x, &bx, rope).expect("fused");
            let want = reference_biased(&x, &bx, rope).expect("reference");
            assert_eq!(fused.dims(), &[b, count, l, hd]);
            let (d, r) = max_abs(&fused, &want);
            println!("biased heads {name} ({b}, {l}, {count}, {hd}): |Δ| {d:e} (max {r:.2})");
            if rotate {
                // the candle form rounds the rope's products to bf16, the kernel once at the end
                assert!(
                    d <= r / 64.0,
                    "{name} ({b}, {l}, {count}, {hd}): {d:e} > {:e}",
                    r / 64.0
                );
            } else {
                assert_eq!(
                    d, 0.0,
                    "{name} ({b}, {l}, {count}, {hd}): the bias add differs"
                );
            }
        }
        // a bias of the wrong width is not taken
        let x = product.narrow(2, 0, h).expect("q");
        let short = bias.narrow(0, 0, h * hd - 2).expect("short");
        assert!(!takes_biased(&x, &short, Some((&cos, &sin))));
    }
}

/// `--deterministic` in bf16 on the GPU: the backend asks for one context per call
/// (`contexts_alone`, so the engine never packs or merges contexts), and a context computed alone
/// is bit-identical from run to run — prefill, a one-prefix packed prefill (what a group of one
/// runs) and its rows scored together. The default path still merges; how many of its logits
/// move between packed+merged and alone is printed.
#[test]
fn cuda_bf16_deterministic_is_batch_invariant() {
    let Some(trios) = trios() else { return };
    let cands = candidates();
    for t in trios {
        let ckpt = ResolvedCheckpoint::from_folder(&t.dir, "tiny-gpu").expect("resolve");
        let det = CandleBackend::load(
            &ckpt,
            &LoadOptions {
                device: DeviceSpec::Cuda(0),
                dtype: ComputeDType::Bf16,
                deterministic: true,
                ..LoadOptions::default()
            },
        )
        .expect("load deterministic");
        assert!(
            det.contexts_alone(),
            "{}: deterministic merges contexts",
            t.name
        );
        assert!(
            !t.gpu_bf16.contexts_alone(),
            "{}: default keeps contexts apart",
            t.name
        );
        let prefixes = [
            ids(70, 45, t.vocab),
            ids(72, 70, t.vocab),
            ids(73, 19, t.vocab),
        ];
        let suffixes = [ids(74, 4, t.vocab), ids(75, 2, t.vocab)];
        let rows = rows_over_states(1, &suffixes); // every suffix over one state
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (i, p) in prefixes.iter().enumerate() {
            let runs: Vec<Vec<u32>> = (0..3)
                .map(|run| {
                    let state = if run == 1 {
                        let mut s = det.prefill_many(&[p.as_slice()]);
                        s.pop().expect("one state").expect("packed prefill of one")
                    } else {
                        det.prefill(p).expect("prefill")
                    };
                    let scored = det.score_rows(&[&state], &rows, &cands).expect("score");
                    (0..rows.len()).flat_map(|r| bits(scored.row(r))).collect()
                })
                .collect();
            assert_eq!(
                runs[0], runs[2],
                "{}: context {i} differs between two runs",
                t.name
            );
            assert_eq!(
                runs[0], runs[1],
                "{}: context {i}: a packed prefill of one differs from prefill",
                t.name
            );
        }
        // the default path, merged: reported, held to nothing beyond the other tests
        let refs: Vec<&[u32]> = prefixes.iter().map(Vec::as_slice).collect();
        let packed = t.gpu_bf16.prefill_packed(&refs).expect("packed prefill");
        let states: Vec<_> = packed.iter().collect();
        let merged_rows = rows_over_states(refs.len(), &suffixes);
        let merged = t
            .gpu_bf16
            .score_rows(&states, &merged_rows, &cands)
            .expect("merged");
        let mut moved = 0;
        for (i, p) in refs.iter().enumerate() {
            let solo_state = t.gpu_bf16.prefill(p).expect("solo prefill");
            let solo = t
                .gpu_bf16
                .score_rows(&[&solo_state], &rows, &cands)
                .expect("solo");
            for r in 0..rows.len() {
                moved += merged
                    .row(i * rows.len() + r)
                    .iter()
                    .zip(solo.row(r))
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count();
            }
        }
        eprintln!(
            "{} bf16 default: {moved} logits differ between packed+merged and alone",
            t.name
        );
    }
}
