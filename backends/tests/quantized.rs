//! In-memory quantization at load time (`LoadOptions::quantization`) on the tiny models of all
//! three architectures, CPU: what each linear weight becomes (ggml type, documented fallbacks),
//! logits against the same checkpoint loaded unquantized, fork == full under quantization,
//! and the clear error for a weight that cannot be read as floats.

mod common;

use std::path::Path;

use forkscore_backends::{
    Backend, CandleBackend, CandleError, LoadOptions, Quantization, ResolvedCheckpoint,
};
use forkscore_testkit::tiny_model::{
    config_json, ensure_tiny_model, tiny_tensors, write_safetensors, TinySpec,
};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use safetensors::Dtype;

fn load(dir: &Path, quantization: Option<Quantization>) -> Result<CandleBackend, CandleError> {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "quant-test")?;
    CandleBackend::load(
        &ckpt,
        &LoadOptions {
            quantization,
            ..LoadOptions::default()
        },
    )
}

fn count(m: &CandleBackend, key: &str) -> usize {
    m.quant_summary().by_type.get(key).copied().unwrap_or(0)
}

/// The three architectures' tiny checkpoints (hidden 32: every projection's input width is a
/// multiple of 32, none of 256).
fn tiny_dirs() -> Vec<(&'static str, std::path::PathBuf, usize)> {
    let q35 = TinyQwen35::new(35, Qwen35Layout::Multimodal)
        .ensure()
        .expect("qwen3.5 tiny");
    vec![
        ("qwen2.5", ensure_tiny_model(&TinySpec::qwen25()), 151_643),
        ("qwen3", ensure_tiny_model(&TinySpec::qwen3()), 151_643),
        ("qwen3.5", q35, 151_643),
    ]
}

#[test]
fn q8_0_quantizes_every_projection_and_tracks_f32() {
    for (name, dir, vocab) in tiny_dirs() {
        let plain = load(&dir, None).expect("f32");
        let q8 = load(&dir, Some(Quantization::Q8_0)).expect("q8_0");
        assert_eq!(q8.facts().quantization, Some(Quantization::Q8_0), "{name}");
        assert_eq!(plain.facts().quantization, None, "{name}");
        assert_eq!(
            count(&plain, "dense"),
            plain.quant_summary().by_type.values().sum::<usize>()
        );
        assert_eq!(count(&q8, "dense"), 0, "{name}: {:?}", q8.quant_summary());
        assert!(count(&q8, "q8_0") > 0, "{name}");
        let (a, _) = common::full_and_fork(&plain, vocab);
        let (b, b_fork) = common::full_and_fork(&q8, vocab);
        eprintln!(
            "{name}: q8_0 vs f32 max |diff| {:e}; q8_0 fork vs full {:e}",
            Tolerance::max_abs_diff(&a, &b),
            Tolerance::max_abs_diff(&b, &b_fork)
        );
        Tolerance::Q8_0_TINY_LOGITS.assert_close(name, &a, &b);
        // Activations are quantized row by row, so forking changes only summation order.
        Tolerance::CPU_F32_LOGITS.assert_close(name, &b, &b_fork);
    }
}

/// The SwiGLU taken inside the packed kernels' tiles (the default on x86 CPUs) gives the same
/// logits, bit for bit, as the stacked gate|up product followed by the SwiGLU pass
/// (`fusion::set_gate_up_in_tiles(false)`): unquantized (the f32 kernel, block by block), q8_0,
/// q4k (Q4_0 here, and Q4_K on a wide model) and bf16 (the AMX tiles' SwiGLU where AMX runs;
/// elsewhere bf16 has no in-tile form and both sides are the same path), full forward and fork. (Other tests loading
/// models meanwhile get one path or the other: both give the same numbers.)
#[test]
fn swiglu_in_the_tiles_equals_the_stacked_product_and_pass() {
    use forkscore_backends::candle::fusion;
    let wide = ensure_tiny_model(&TinySpec {
        hidden: 256,
        intermediate: 512,
        head_dim: 16,
        vocab: 1000,
        tokenizer: false,
        seed: 44,
        ..TinySpec::qwen3()
    });
    let mut dirs = tiny_dirs();
    dirs.push(("wide qwen3", wide, 1000));
    for (name, dir, vocab) in dirs {
        for q in [
            None,
            Some(Quantization::Q8_0),
            Some(Quantization::Q4K),
            Some(Quantization::Bf16),
            Some(Quantization::Int8),
        ] {
            if q == Some(Quantization::Int8) && !forkscore_kernels::cpu::amx::q8_available() {
                continue; // int8 runs only on the AMX-INT8 tiles
            }
            fusion::set_gate_up_in_tiles(false);
            let stacked = load(&dir, q);
            fusion::set_gate_up_in_tiles(true);
            let (stacked, tiles) = (stacked.expect("stacked"), load(&dir, q).expect("tiles"));
            assert_eq!(
                stacked.quant_summary(),
                tiles.quant_summary(),
                "{name} {q:?}"
            );
            let (a, a_fork) = common::full_and_fork(&stacked, vocab);
            let (b, b_fork) = common::full_and_fork(&tiles, vocab);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&a) == bits(&b), "{name} {q:?}: full forward differs");
            assert!(bits(&a_fork) == bits(&b_fork), "{name} {q:?}: fork differs");
        }
    }
}

/// `--quantize int8` (per-channel int8 weights, per-row int8 activations, AMX-INT8 tiles):
/// every projection is int8, logits track f32 within [`Tolerance::INT8_TINY_LOGITS`], a fork
/// equals the full forward within f32 rounding (a row's rounding depends on that row alone).
/// Where AMX-INT8 does not run the load is refused with a message naming the alternatives.
#[test]
fn int8_quantizes_every_projection_and_tracks_f32() {
    let mut dirs = tiny_dirs();
    dirs.push(("qwen3 head dim 64", head_dim_64(), 1000));
    for (name, dir, vocab) in dirs {
        if !forkscore_kernels::cpu::amx::q8_available() {
            let err = load(&dir, Some(Quantization::Int8)).err().expect("refused");
            let text = err.to_string();
            assert!(text.contains("AMX-INT8") && text.contains("q8_0"), "{text}");
            continue;
        }
        let plain = load(&dir, None).expect("f32");
        let i8 = load(&dir, Some(Quantization::Int8)).expect("int8");
        assert_eq!(i8.facts().quantization, Some(Quantization::Int8), "{name}");
        assert_eq!(count(&i8, "dense"), 0, "{name}: {:?}", i8.quant_summary());
        assert!(count(&i8, "int8") > 0, "{name}");
        let (a, _) = common::full_and_fork(&plain, vocab);
        let (b, b_fork) = common::full_and_fork(&i8, vocab);
        eprintln!(
            "{name}: int8 vs f32 max |diff| {:e}; int8 fork vs full {:e}",
            Tolerance::max_abs_diff(&a, &b),
            Tolerance::max_abs_diff(&b, &b_fork)
        );
        Tolerance::INT8_TINY_LOGITS.assert_close(name, &a, &b);
        // attention on the AMX bf16 tiles (head dim 64) rounds each key block's softmax
        // weights against the running maximum, which depends on how the keys are split
        // (the prefix's past, then the suffix, against one prefill): bf16 noise, which the
        // activations' int8 rounding can amplify
        let fork = match name == "qwen3 head dim 64" {
            true => Tolerance::INT8_TINY_LOGITS,
            false => Tolerance::CPU_F32_LOGITS,
        };
        fork.assert_close(name, &b, &b_fork);
    }
}

#[test]
fn q4k_falls_back_to_q4_0_on_narrow_inputs_and_uses_q4k_on_wide_ones() {
    // hidden 32: no input width is a multiple of 256, so every weight takes the Q4_0 fallback
    for (name, dir, vocab) in tiny_dirs() {
        let plain = load(&dir, None).expect("f32");
        let q4 = load(&dir, Some(Quantization::Q4K)).expect("q4k");
        assert_eq!(count(&q4, "dense") + count(&q4, "q4k"), 0, "{name}");
        assert!(count(&q4, "q4_0") > 0, "{name}");
        let (a, _) = common::full_and_fork(&plain, vocab);
        let (b, b_fork) = common::full_and_fork(&q4, vocab);
        eprintln!(
            "{name}: q4k(q4_0) vs f32 max |diff| {:e}",
            Tolerance::max_abs_diff(&a, &b)
        );
        Tolerance::Q4_TINY_LOGITS.assert_close(name, &a, &b);
        Tolerance::CPU_F32_LOGITS.assert_close(name, &b, &b_fork);
    }
    // hidden 256, MLP 512: q/k/v/gate/up/down read 256- or 512-wide inputs -> Q4_K; o_proj
    // reads heads * head_dim = 4 * 16 = 64 -> Q4_0.
    let spec = TinySpec {
        hidden: 256,
        intermediate: 512,
        head_dim: 16,
        vocab: 1000,
        tokenizer: false,
        seed: 44,
        ..TinySpec::qwen3()
    };
    let dir = ensure_tiny_model(&spec);
    let q4 = load(&dir, Some(Quantization::Q4K)).expect("q4k wide");
    let layers = spec.layers;
    assert_eq!(count(&q4, "q4k"), 6 * layers, "{:?}", q4.quant_summary());
    assert_eq!(count(&q4, "q4_0"), layers, "{:?}", q4.quant_summary());
    let plain = load(&dir, None).expect("f32 wide");
    let (a, _) = common::full_and_fork(&plain, 1000);
    let (b, b_fork) = common::full_and_fork(&q4, 1000);
    eprintln!(
        "wide qwen3: q4k vs f32 max |diff| {:e}",
        Tolerance::max_abs_diff(&a, &b)
    );
    Tolerance::Q4_TINY_LOGITS.assert_close("wide q4k", &a, &b);
    Tolerance::CPU_F32_LOGITS.assert_close("wide q4k fork", &b, &b_fork);
}

/// A Qwen3 of head dim 64 (the real models' width): its attention takes the AMX bf16 tiles
/// under `bf16` and `int8` where AMX runs (head dims that are not whole 32-dim steps keep the
/// f32 forms), so the two tests below hold that form to f32 end to end as well.
fn head_dim_64() -> std::path::PathBuf {
    ensure_tiny_model(&TinySpec {
        hidden: 128,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 256,
        vocab: 1000,
        tokenizer: false,
        seed: 46,
        ..TinySpec::qwen3()
    })
}

/// `bf16` rounds every linear weight, whatever its input width (no block to fit: the hidden-40
/// model's 40-wide projections too), records the scheme, tracks f32, and keeps fork == full.
#[test]
fn bf16_rounds_every_projection_and_tracks_f32() {
    let narrow = ensure_tiny_model(&TinySpec {
        hidden: 40,
        vocab: 1000,
        tokenizer: false,
        seed: 45,
        ..TinySpec::qwen3()
    });
    let mut dirs = tiny_dirs();
    dirs.push(("qwen3 hidden 40", narrow, 1000));
    dirs.push(("qwen3 head dim 64", head_dim_64(), 1000));
    for (name, dir, vocab) in dirs {
        let plain = load(&dir, None).expect("f32");
        let bf = load(&dir, Some(Quantization::Bf16)).expect("bf16");
        assert_eq!(bf.facts().quantization, Some(Quantization::Bf16), "{name}");
        assert_eq!(count(&bf, "dense"), 0, "{name}: {:?}", bf.quant_summary());
        assert_eq!(
            count(&bf, "bf16"),
            plain.quant_summary().by_type.values().sum::<usize>(),
            "{name}: {:?}",
            bf.quant_summary()
        );
        let (a, _) = common::full_and_fork(&plain, vocab);
        let (b, b_fork) = common::full_and_fork(&bf, vocab);
        eprintln!(
            "{name}: bf16 vs f32 max |diff| {:e}; bf16 fork vs full {:e}",
            Tolerance::max_abs_diff(&a, &b),
            Tolerance::max_abs_diff(&b, &b_fork)
        );
        Tolerance::BF16_WEIGHTS_TINY_LOGITS.assert_close(name, &a, &b);
        // The bf16 kernel rounds activations element by element and sums in f32, so forking
        // changes only the summation order; candle's bf16 matmul (CPUs without AVX-512 BF16)
        // also rounds every product's output to bf16, which the order can flip.
        // (Attention on the AMX bf16 tiles, head dim 64, rounds each key block's softmax
        // weights against the running maximum, so how the keys are split moves them too.)
        let fork = match bf16_kernel_runs() && name != "qwen3 head dim 64" {
            true => Tolerance::CPU_F32_LOGITS,
            false => Tolerance::BF16_WEIGHTS_TINY_LOGITS,
        };
        fork.assert_close(name, &b, &b_fork);
    }
}

/// Whether `bf16` layers take the AVX-512 BF16 kernel in this test process (no variable
/// capping the CPU kernels).
fn bf16_kernel_runs() -> bool {
    let unset = ["FORKSCORE_CPU_ISA", "FORKSCORE_CPU_GEMM"]
        .iter()
        .all(|v| std::env::var_os(v).is_none());
    #[cfg(target_arch = "x86_64")]
    let cpu = std::arch::is_x86_feature_detected!("avx512bf16")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    let cpu = false;
    unset && cpu
}

#[test]
fn input_width_not_a_multiple_of_32_stays_dense() {
    // hidden 40 (q/k/v/gate/up read 40 wide: no ggml block fits) -> dense; o_proj reads
    // 4 * 16 = 64 and down_proj 64 -> quantized.
    let spec = TinySpec {
        hidden: 40,
        vocab: 1000,
        tokenizer: false,
        seed: 45,
        ..TinySpec::qwen3()
    };
    let dir = ensure_tiny_model(&spec);
    let q8 = load(&dir, Some(Quantization::Q8_0)).expect("q8_0");
    assert_eq!(
        count(&q8, "dense"),
        5 * spec.layers,
        "{:?}",
        q8.quant_summary()
    );
    assert_eq!(
        count(&q8, "q8_0"),
        2 * spec.layers,
        "{:?}",
        q8.quant_summary()
    );
    let plain = load(&dir, None).expect("f32");
    let (a, _) = common::full_and_fork(&plain, 1000);
    let (b, _) = common::full_and_fork(&q8, 1000);
    Tolerance::Q8_0_TINY_LOGITS.assert_close("hidden 40", &a, &b);
}

#[test]
fn integer_weight_is_a_clear_error_under_quantization() {
    let spec = TinySpec {
        vocab: 1000,
        tokenizer: false,
        ..TinySpec::qwen25()
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("ckpt");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("config.json"), config_json(&spec).to_string()).expect("config");
    let mut tensors = tiny_tensors(&spec).expect("tensors");
    let target = "model.layers.0.mlp.up_proj.weight";
    let t = tensors
        .iter_mut()
        .find(|t| t.name == target)
        .expect("up_proj");
    t.dtype = Dtype::I32;
    let refs: Vec<_> = tensors.iter().collect();
    write_safetensors(&dir.join("model.safetensors"), &refs).expect("write");
    for q in Quantization::ALL {
        let err = load(&dir, Some(q)).err().expect("must fail");
        let text = err.to_string();
        assert!(
            matches!(err, CandleError::WrongDtype { ref name, .. } if name == target),
            "{q}: {text}"
        );
        assert!(text.contains(target) && text.contains("I32"), "{text}");
    }
}
