//! Byte-identity and layout tests of the tiny dense checkpoints.

const PINNED_DIGESTS: [&str; 2] = [
    "fc5d28faeb605c0b463603f34c6c8ec9364ef2eb15f7431af1e2f5846367687c",
    "1f977f94bc34a1a56d293487e14b5ad1754c689cc3d7871d59265aaddf602399",
];
use super::*;

#[test]
fn draws_are_deterministic_and_in_range() {
    let a = draw_values(
        7,
        "x",
        1000,
        Draw {
            center: 1.0,
            half: 0.5,
        },
    );
    assert_eq!(
        a,
        draw_values(
            7,
            "x",
            1000,
            Draw {
                center: 1.0,
                half: 0.5
            }
        )
    );
    assert_ne!(
        a,
        draw_values(
            7,
            "y",
            1000,
            Draw {
                center: 1.0,
                half: 0.5
            }
        )
    );
    assert!(a.iter().all(|x| (0.5..1.5).contains(x)));
}

/// Pinned digests of every tensor byte: the files are the same on every machine, and a
/// change to the generator shows here (then bump GENERATOR_VERSION and the digests).
#[test]
fn tensor_bytes_are_pinned() {
    let digest = |spec: &TinySpec| {
        let mut h = Sha256::new();
        for t in tiny_tensors(spec).expect("tensors") {
            h.update(t.name.as_bytes());
            h.update(&t.bytes);
        }
        hex::encode(h.finalize())
    };
    let small = |s: TinySpec| TinySpec { vocab: 1000, ..s };
    let got = [
        digest(&small(TinySpec::qwen25())),
        digest(&small(TinySpec::qwen3())),
    ];
    assert_eq!(got, PINNED_DIGESTS);
}

#[test]
fn qwen25_spec_rejects_inconsistent_head_dim() {
    let spec = TinySpec {
        head_dim: 16,
        ..TinySpec::qwen25()
    };
    assert!(spec.validate().is_err());
    assert!(TinySpec::qwen3().validate().is_ok());
}

#[test]
fn config_has_real_keys() {
    let c = config_json(&TinySpec::qwen25());
    assert_eq!(c["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(c["rope_theta"], 1_000_000.0);
    assert_eq!(c["torch_dtype"], "float32");
    let c = config_json(&TinySpec::qwen3());
    assert_eq!(c["rope_parameters"]["rope_theta"], 1_000_000.0);
    assert_eq!(c["head_dim"], 16);
    assert_eq!(c["tie_word_embeddings"], false);
}

#[test]
fn folder_is_complete_with_real_tokenizer() {
    let dir = std::env::temp_dir().join(format!("forkscore-tiny-test-{}", std::process::id()));
    let spec = TinySpec {
        vocab: 1000,
        sharded: true,
        ..TinySpec::qwen3()
    };
    write_hf_folder(&dir, &spec).expect("write");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer");
    let ids = tok
        .encode("<|im_start|>user", false)
        .expect("encode")
        .get_ids()
        .to_vec();
    assert_eq!(ids, vec![151644, 872]);
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("tokenizer_config.json")).expect("read"),
    )
    .expect("json");
    assert!(cfg["chat_template"]
        .as_str()
        .is_some_and(|t| t.contains("<|im_start|>")));
    let _ = std::fs::remove_dir_all(&dir);
}
