//! Checkpoint resolution and loading: folder and Hugging Face cache references, sharded and
//! single-file weights, tied and untied heads, and the typed error of every broken input.

mod common;

use std::path::{Path, PathBuf};

use forkscore_backends::candle::ModelConfig;
use forkscore_backends::{
    Backend, BackendError, CandleBackend, CandleError, CheckpointSource, LoadOptions,
    ResolvedCheckpoint, ScoreRow,
};
use forkscore_testkit::tiny_model::{
    config_json, tiny_tensors, write_hf_cache, write_hf_folder, write_safetensors, TinySpec,
    TinyTensor,
};
use forkscore_testkit::tolerance::Tolerance;
use safetensors::Dtype;

const REV: &str = "0123456789abcdef0123456789abcdef01234567";

/// A small-vocabulary spec so broken-checkpoint folders are cheap to write.
fn small(spec: TinySpec) -> TinySpec {
    TinySpec {
        vocab: 1000,
        tokenizer: false,
        ..spec
    }
}

fn load_dir(dir: &Path) -> Result<CandleBackend, CandleError> {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "test")?;
    CandleBackend::load(&ckpt, &LoadOptions::default())
}

/// A folder with `spec`'s config and the given tensors in `model.safetensors`.
fn folder_with(tmp: &Path, spec: &TinySpec, edit: impl FnOnce(&mut Vec<TinyTensor>)) -> PathBuf {
    let dir = tmp.join("ckpt");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("config.json"), config_json(spec).to_string()).expect("config");
    let mut tensors = tiny_tensors(spec).expect("tensors");
    edit(&mut tensors);
    let refs: Vec<&TinyTensor> = tensors.iter().collect();
    write_safetensors(&dir.join("model.safetensors"), &refs).expect("write");
    dir
}

fn logits(m: &CandleBackend) -> Vec<f32> {
    let ids = common::ids(5, 12, 1000);
    m.forward_full(&ids, &[1, 2, 3, 500, 999]).expect("forward")
}

#[test]
fn loads_both_architectures_with_truthful_facts() {
    for (spec, arch, family, tied) in [
        (TinySpec::qwen25(), "Qwen2ForCausalLM", "qwen2", true),
        (TinySpec::qwen3(), "Qwen3ForCausalLM", "qwen3", false),
    ] {
        let m = common::load(&spec);
        let f = m.facts();
        assert_eq!(
            (f.architecture.as_str(), f.family.map(|f| f.as_str())),
            (arch, Some(family))
        );
        assert_eq!(
            (f.vocab_size, f.num_layers, f.hidden_size),
            (151_936, spec.layers, spec.hidden)
        );
        assert_eq!(
            (f.dtype.as_str(), f.device.to_string().as_str()),
            ("f32", "cpu")
        );
        assert_eq!(m.tied_head(), tied);
    }
}

#[test]
fn sharded_index_loads_the_same_model() {
    let tmp = tempfile::tempdir().expect("tmp");
    for base in [TinySpec::qwen25(), TinySpec::qwen3()] {
        let spec = small(base);
        let single = tmp.path().join(format!("{:?}-single", spec.arch));
        let sharded = tmp.path().join(format!("{:?}-sharded", spec.arch));
        write_hf_folder(&single, &spec).expect("write");
        write_hf_folder(
            &sharded,
            &TinySpec {
                sharded: true,
                ..spec.clone()
            },
        )
        .expect("write");
        assert!(sharded.join("model.safetensors.index.json").is_file());
        assert!(!sharded.join("model.safetensors").exists());
        let a = logits(&load_dir(&single).expect("single"));
        let b = logits(&load_dir(&sharded).expect("sharded"));
        Tolerance::EXACT.assert_close("sharded vs single", &a, &b);
    }
}

#[test]
fn tied_and_untied_heads_and_config_styles_load() {
    use forkscore_testkit::tiny_model::{ConfigStyle, WeightDtype};
    let tmp = tempfile::tempdir().expect("tmp");
    let mut n = 0;
    for base in [TinySpec::qwen25(), TinySpec::qwen3()] {
        for tied in [true, false] {
            for style in [ConfigStyle::Legacy, ConfigStyle::Transformers5] {
                for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
                    let spec = TinySpec {
                        tied,
                        config_style: style,
                        dtype,
                        ..small(base.clone())
                    };
                    n += 1;
                    let dir = tmp.path().join(format!("m{n}"));
                    write_hf_folder(&dir, &spec).expect("write");
                    let m = load_dir(&dir).expect("load");
                    assert_eq!(m.tied_head(), tied, "{spec:?}");
                    assert!(logits(&m).iter().all(|x| x.is_finite()));
                    let cfg = ModelConfig::from_file(&dir.join("config.json")).expect("config");
                    assert_eq!(cfg.text.rope.theta, 1e6);
                }
            }
        }
    }
}

#[test]
fn hf_cache_snapshot_resolves_offline() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen3());
    let snap = write_hf_cache(tmp.path(), "tiny-org/Tiny-Qwen3", REV, &spec).expect("cache");
    let ckpt = ResolvedCheckpoint::from_hf_cache("tiny-org/Tiny-Qwen3", REV, Some(tmp.path()))
        .expect("resolve");
    assert_eq!(ckpt.dir, snap);
    assert_eq!(
        (ckpt.model_id.as_str(), ckpt.revision.as_str()),
        ("tiny-org/Tiny-Qwen3", REV)
    );
    assert_eq!(ckpt.source, CheckpointSource::HfCache);
    assert!(ckpt.fingerprint.starts_with("sha256:") && ckpt.fingerprint.len() == 7 + 64);
    // the same bytes as a plain folder have the same fingerprint
    let folder = ResolvedCheckpoint::from_folder(&snap, "label").expect("folder");
    assert_eq!(folder.fingerprint, ckpt.fingerprint);
    assert_eq!(folder.source, CheckpointSource::Folder);
    let m = CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load");
    assert_eq!(m.facts().architecture.as_str(), "Qwen3ForCausalLM");

    // a revision that is not downloaded, and a model that is not cached
    let other = "f".repeat(40);
    let err =
        ResolvedCheckpoint::from_hf_cache("tiny-org/Tiny-Qwen3", &other, Some(tmp.path())).err();
    assert!(
        matches!(&err, Some(CandleError::MissingFile { reason, .. }) if reason.contains("not downloaded")),
        "{err:?}"
    );
    let err = ResolvedCheckpoint::from_hf_cache("tiny-org/Absent", REV, Some(tmp.path())).err();
    assert!(
        matches!(&err, Some(CandleError::MissingFile { reason, .. }) if reason.contains("not in the Hugging Face cache")),
        "{err:?}"
    );

    // the environment's cache root is used when none is given (the only test touching HF_HUB_CACHE)
    std::env::set_var("HF_HUB_CACHE", tmp.path());
    let via_env = ResolvedCheckpoint::resolve("tiny-org/Tiny-Qwen3", REV).expect("resolve via env");
    assert_eq!(via_env.dir, snap);
}

#[test]
fn bad_revisions_and_references_are_rejected() {
    let tmp = tempfile::tempdir().expect("tmp");
    for rev in ["main", "0123456", &REV.to_uppercase(), &format!("{REV}0")] {
        let err = ResolvedCheckpoint::from_hf_cache("Qwen/Qwen3-0.6B", rev, Some(tmp.path())).err();
        assert!(
            matches!(&err, Some(CandleError::InvalidModelRef { reason }) if reason.contains("not reproducible")),
            "{rev}: {err:?}"
        );
    }
    let err = ResolvedCheckpoint::from_hf_cache("not-a-hub-id", REV, Some(tmp.path())).err();
    assert!(matches!(err, Some(CandleError::InvalidModelRef { .. })));
    let err = ResolvedCheckpoint::from_folder(tmp.path(), "  ").err();
    assert!(matches!(err, Some(CandleError::InvalidModelRef { .. })));
    let err = ResolvedCheckpoint::from_folder(&tmp.path().join("absent"), "x").err();
    assert!(matches!(err, Some(CandleError::MissingFile { .. })));
}

#[test]
fn missing_files_are_named() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen25());
    let dir = tmp.path().join("m");
    write_hf_folder(&dir, &spec).expect("write");
    std::fs::remove_file(dir.join("model.safetensors")).expect("rm");
    let err = load_dir(&dir).err();
    assert!(
        matches!(&err, Some(CandleError::MissingFile { path, .. }) if path.ends_with("model.safetensors")),
        "{err:?}"
    );
    std::fs::remove_file(dir.join("config.json")).expect("rm");
    let err = load_dir(&dir).err();
    assert!(
        matches!(&err, Some(CandleError::MissingFile { path, .. }) if path.ends_with("config.json")),
        "{err:?}"
    );

    // a shard named by the index is absent
    let sharded = tmp.path().join("s");
    write_hf_folder(
        &sharded,
        &TinySpec {
            sharded: true,
            ..spec
        },
    )
    .expect("write");
    std::fs::remove_file(sharded.join("model-00002-of-00002.safetensors")).expect("rm");
    let err = load_dir(&sharded).err();
    assert!(
        matches!(&err, Some(CandleError::MissingFile { path, .. }) if path.ends_with("model-00002-of-00002.safetensors")),
        "{err:?}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen3());
    let dir = folder_with(tmp.path(), &spec, |t| {
        t.retain(|t| t.name != "model.layers.1.self_attn.k_norm.weight")
    });
    let err = load_dir(&dir).err();
    assert!(
        matches!(&err, Some(CandleError::MissingTensor { name, .. }) if name == "model.layers.1.self_attn.k_norm.weight"),
        "{err:?}"
    );
    // untied config without lm_head.weight
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = folder_with(tmp.path(), &spec, |t| {
        t.retain(|t| t.name != "lm_head.weight")
    });
    let err = load_dir(&dir).err();
    assert!(
        matches!(&err, Some(CandleError::MissingTensor { name, .. }) if name == "lm_head.weight"),
        "{err:?}"
    );
}

#[test]
fn wrong_shape_names_tensor_and_both_shapes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen25());
    let dir = folder_with(tmp.path(), &spec, |ts| {
        for t in ts
            .iter_mut()
            .filter(|t| t.name == "model.layers.0.mlp.up_proj.weight")
        {
            t.shape = vec![t.shape[1], t.shape[0]];
        }
    });
    let err = load_dir(&dir).err();
    match &err {
        Some(CandleError::WrongShape {
            name,
            expected,
            actual,
        }) => {
            assert_eq!(name, "model.layers.0.mlp.up_proj.weight");
            assert_eq!(
                (expected.as_slice(), actual.as_slice()),
                (&[64, 32][..], &[32, 64][..])
            );
            let msg = err.as_ref().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                msg.contains("[32, 64]") && msg.contains("[64, 32]"),
                "{msg}"
            );
        }
        other => panic!("expected WrongShape, got {other:?}"),
    }
}

#[test]
fn wrong_dtype_is_named() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen25());
    let dir = folder_with(tmp.path(), &spec, |ts| {
        for t in ts.iter_mut().filter(|t| t.name == "model.norm.weight") {
            t.dtype = Dtype::I32;
        }
    });
    let err = load_dir(&dir).err();
    assert!(
        matches!(&err, Some(CandleError::WrongDtype { name, actual, .. }) if name == "model.norm.weight" && actual == "I32"),
        "{err:?}"
    );
}

#[test]
fn truncated_and_corrupt_files_are_rejected() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen25());
    let dir = tmp.path().join("m");
    write_hf_folder(&dir, &spec).expect("write");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).expect("read");
    std::fs::write(&path, &bytes[..bytes.len() - 100]).expect("truncate");
    let err = load_dir(&dir).err();
    assert!(
        matches!(&err, Some(CandleError::InvalidCheckpoint { path: p, reason }) if p == &path && reason.contains("truncated")),
        "{err:?}"
    );
    std::fs::write(&path, &bytes[..4]).expect("truncate header");
    assert!(matches!(
        load_dir(&dir),
        Err(CandleError::InvalidCheckpoint { .. })
    ));
    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!").expect("garbage");
    assert!(matches!(
        load_dir(&dir),
        Err(CandleError::InvalidCheckpoint { .. })
    ));
}

#[test]
fn unknown_architecture_and_bad_config_are_rejected() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen25());
    let dir = tmp.path().join("m");
    write_hf_folder(&dir, &spec).expect("write");
    let mut cfg = config_json(&spec);
    cfg["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    std::fs::write(dir.join("config.json"), cfg.to_string()).expect("config");
    let err = load_dir(&dir).err();
    assert!(
        matches!(&err, Some(CandleError::UnsupportedArchitecture { name, supported }) if name == "MistralForCausalLM" && supported.contains("Qwen3ForCausalLM")),
        "{err:?}"
    );
    cfg["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    cfg["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0});
    std::fs::write(dir.join("config.json"), cfg.to_string()).expect("config");
    assert!(matches!(
        load_dir(&dir),
        Err(CandleError::InvalidConfig { .. })
    ));
    std::fs::write(dir.join("config.json"), "{ not json").expect("config");
    assert!(matches!(
        load_dir(&dir),
        Err(CandleError::InvalidConfig { .. })
    ));
}

#[test]
fn fingerprint_tracks_config_weights_layout_and_tokenizer() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen25());
    let dir = tmp.path().join("m");
    write_hf_folder(&dir, &spec).expect("write");
    let fp = |d: &Path| {
        ResolvedCheckpoint::from_folder(d, "x")
            .expect("resolve")
            .fingerprint
    };
    let a = fp(&dir);
    assert_eq!(a, fp(&dir), "stable");
    std::fs::write(dir.join("tokenizer.json"), "{}").expect("tok");
    let b = fp(&dir);
    assert_ne!(a, b, "tokenizer.json counts");
    let other = tmp.path().join("o");
    write_hf_folder(
        &other,
        &TinySpec {
            hidden: 16,
            heads: 2,
            ..spec
        },
    )
    .expect("write");
    std::fs::write(other.join("tokenizer.json"), "{}").expect("tok");
    assert_ne!(b, fp(&other), "weights layout counts");
    std::fs::write(dir.join("chat_template.jinja"), "{{ messages }}").expect("template");
    assert_ne!(b, fp(&dir), "the chat template counts");
}

#[test]
fn an_index_without_tensors_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("m");
    write_hf_folder(&dir, &small(TinySpec::qwen25())).expect("write");
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {}}"#,
    )
    .expect("index");
    let err = ResolvedCheckpoint::from_folder(&dir, "x").expect_err("empty index");
    assert!(err.to_string().contains("weight_map"), "{err}");
}

#[test]
fn a_missing_folder_is_named_as_such() {
    let err =
        ResolvedCheckpoint::resolve("target/no-such-demo-folder", "demo").expect_err("missing");
    let msg = err.to_string();
    assert!(
        msg.contains("not a local checkpoint folder") && msg.contains("no-such-demo-folder"),
        "{msg}"
    );
}

#[test]
fn token_ids_beyond_the_embedding_are_rejected() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("m");
    write_hf_folder(&dir, &small(TinySpec::qwen3())).expect("write");
    let m = load_dir(&dir).expect("load");
    let err = m.forward_full(&[1, 1000], &[1]).err();
    assert!(
        matches!(
            err,
            Some(BackendError::TokenOutOfRange {
                id: 1000,
                vocab_size: 1000
            })
        ),
        "{err:?}"
    );
    let st = m.prefill(&[1, 2]).expect("prefill");
    let err = m
        .score_rows(
            &[&st],
            &[ScoreRow {
                state: 0,
                suffix: &[3],
            }],
            &[1000],
        )
        .err();
    assert!(
        matches!(err, Some(BackendError::TokenOutOfRange { id: 1000, .. })),
        "{err:?}"
    );
}

#[test]
fn unrequested_tensors_are_ignored() {
    // multimodal checkpoints also hold vision and MTP tensors; only requested names are read
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small(TinySpec::qwen25());
    let plain = tmp.path().join("plain");
    write_hf_folder(&plain, &spec).expect("write");
    let dir = folder_with(tmp.path(), &spec, |ts| {
        for name in ["model.visual.blocks.0.attn.qkv.weight", "mtp.fc.weight"] {
            ts.push(TinyTensor {
                name: name.into(),
                shape: vec![3, 5],
                dtype: Dtype::I64,
                bytes: vec![0; 120],
            });
        }
    });
    let a = logits(&load_dir(&plain).expect("plain"));
    let b = logits(&load_dir(&dir).expect("with extras"));
    Tolerance::EXACT.assert_close("extra tensors", &a, &b);
}

/// bf16 compute on CPU runs the accelerator dtype path (casts around the f32 softmax and head).
#[test]
fn bf16_compute_tracks_f32() {
    use forkscore_backends::ComputeDType;
    for spec in [TinySpec::qwen25(), TinySpec::qwen3()] {
        let dir = forkscore_testkit::tiny_model::ensure_tiny_model(&spec);
        let ckpt = ResolvedCheckpoint::from_folder(&dir, "t").expect("resolve");
        let f32m = CandleBackend::load(&ckpt, &LoadOptions::default()).expect("f32");
        let bf16 = CandleBackend::load(
            &ckpt,
            &LoadOptions {
                dtype: ComputeDType::Bf16,
                ..LoadOptions::default()
            },
        )
        .expect("bf16");
        assert_eq!(bf16.facts().dtype.as_str(), "bf16");
        let ids = common::ids(77, 40, 151_643);
        let cands = common::candidates();
        let a = f32m.forward_full(&ids, &cands).expect("f32");
        let b = bf16.forward_full(&ids, &cands).expect("bf16");
        let st = bf16.prefill(&ids[..30]).expect("prefill");
        let c = bf16
            .score_rows(
                &[&st],
                &[ScoreRow {
                    state: 0,
                    suffix: &ids[30..],
                }],
                &cands,
            )
            .expect("score");
        let max = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        eprintln!(
            "{:?}: bf16 vs f32 max |diff| {:e} (max |logit| {max}); bf16 fork vs full {:e}",
            spec.arch,
            Tolerance::max_abs_diff(&a, &b),
            Tolerance::max_abs_diff(&b, c.row(0))
        );
        BF16_VS_F32.assert_close("bf16 vs f32", &a, &b);
        BF16_VS_F32.assert_close("bf16 fork vs bf16 full", &b, c.row(0));
    }
}

/// bf16 weights and activations vs f32 on logits reaching |50| (bf16 keeps 8 bits of mantissa).
const BF16_VS_F32: Tolerance = Tolerance {
    name: "cpu-bf16-vs-f32-logits",
    abs: 1.5,
};

#[test]
fn prefill_chunk_option_drives_prefill() {
    let dir = forkscore_testkit::tiny_model::ensure_tiny_model(&TinySpec::qwen3());
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "t").expect("resolve");
    let chunked = CandleBackend::load(
        &ckpt,
        &LoadOptions {
            prefill_chunk: 4,
            ..LoadOptions::default()
        },
    )
    .expect("load");
    assert_eq!(chunked.prefill_chunk(), 4);
    let plain = CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load");
    let ids = common::ids(3, 19, 151_643);
    let suffix = common::ids(4, 3, 151_643);
    let cands = common::candidates();
    let score = |m: &CandleBackend| {
        let st = m.prefill(&ids).expect("prefill");
        m.score_rows(
            &[&st],
            &[ScoreRow {
                state: 0,
                suffix: &suffix,
            }],
            &cands,
        )
        .expect("score")
        .data
    };
    Tolerance::CPU_F32_LOGITS.assert_close("chunk 4 vs one shot", &score(&chunked), &score(&plain));
    let zero = CandleBackend::load(
        &ckpt,
        &LoadOptions {
            prefill_chunk: 0,
            ..LoadOptions::default()
        },
    )
    .err();
    assert!(matches!(zero, Some(CandleError::InvalidRequest { .. })));
}

/// The head is tied exactly when transformers ties it: `tie_word_embeddings: false` never
/// ties; otherwise (true or absent) a stored `lm_head.weight` is used unless its bytes equal
/// the embedding's, and without one the embedding is the head.
#[test]
fn head_tying_follows_transformers() {
    let untied = TinySpec {
        tied: false,
        ..small(TinySpec::qwen3())
    };
    let tmp = tempfile::tempdir().expect("tmp");
    // the untied model as written (flag false): the reference for a stored, distinct head
    let reference_untied =
        logits(&load_dir(&folder_with(tmp.path(), &untied, |_| {})).expect("load"));
    let with_flag = |dir: &Path, flag: Option<bool>| {
        let mut c = config_json(&untied);
        match flag {
            Some(f) => c["tie_word_embeddings"] = serde_json::json!(f),
            None => {
                c.as_object_mut().map(|o| o.remove("tie_word_embeddings"));
            }
        }
        std::fs::write(dir.join("config.json"), c.to_string()).expect("config");
    };
    // a distinct stored head with the flag true or absent is used, not the embedding
    for flag in [Some(true), None] {
        let t = tempfile::tempdir().expect("tmp");
        let dir = folder_with(t.path(), &untied, |_| {});
        with_flag(&dir, flag);
        let m = load_dir(&dir).expect("load");
        assert!(!m.tied_head(), "{flag:?}");
        Tolerance::EXACT.assert_close("distinct stored head", &logits(&m), &reference_untied);
    }
    // a stored head equal to the embedding is tied (flag true or absent), untied when false
    for (flag, tied) in [(Some(true), true), (None, true), (Some(false), false)] {
        let t = tempfile::tempdir().expect("tmp");
        let dir = folder_with(t.path(), &untied, |ts| {
            let embed = ts
                .iter()
                .find(|x| x.name == "model.embed_tokens.weight")
                .map(|x| x.bytes.clone())
                .expect("embedding");
            if let Some(h) = ts.iter_mut().find(|x| x.name == "lm_head.weight") {
                h.bytes = embed;
            }
        });
        with_flag(&dir, flag);
        let m = load_dir(&dir).expect("load");
        assert_eq!(m.tied_head(), tied, "{flag:?}");
        assert!(m.tensors_read().iter().any(|n| n == "lm_head.weight"));
    }
    // no stored head, flag absent: tied
    let t = tempfile::tempdir().expect("tmp");
    let dir = folder_with(t.path(), &untied, |ts| {
        ts.retain(|x| x.name != "lm_head.weight")
    });
    with_flag(&dir, None);
    assert!(load_dir(&dir).expect("load").tied_head());
}
