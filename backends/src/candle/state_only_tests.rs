//! A prefill's last layer computes its state update only (`Backbone::forward_state`):
//! the retained state must be exactly what the full forward retains, on every architecture
//! (Qwen2.5 with biased q/k/v, Qwen3 with q/k norms, the Qwen3.5 hybrid whose layers
//! alternate Gated DeltaNet and gated attention), in one chunk and over several chunks.
use super::*;
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};

fn load(dir: &std::path::Path) -> CandleBackend {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-test").expect("resolve");
    CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load")
}

fn host(state: &CandleState) -> Vec<Vec<f32>> {
    state
        .layers()
        .iter()
        .flat_map(|l| match l {
            state::LayerState::Attention { k, v } => [k.clone(), v.clone()],
            state::LayerState::Linear { conv, recurrent } => [conv.clone(), recurrent.clone()],
        })
        .map(|t| {
            t.flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .expect("state to host")
        })
        .collect()
}

/// The tiny models of the three architectures, by name.
fn tiny_models() -> [(&'static str, CandleBackend); 3] {
    [
        ("qwen2.5", load(&ensure_tiny_model(&TinySpec::qwen25()))),
        ("qwen3", load(&ensure_tiny_model(&TinySpec::qwen3()))),
        (
            "qwen3.5",
            load(
                &TinyQwen35::new(8, Qwen35Layout::TextOnly)
                    .ensure()
                    .expect("tiny qwen3.5"),
            ),
        ),
    ]
}

#[test]
fn state_only_prefill_keeps_exactly_the_full_forward_state() {
    let models = tiny_models();
    let ids: Vec<u32> = (0..45u32).map(|i| (i * 7919 + 13) % 500).collect();
    for (name, backend) in &models {
        for chunk in [45usize, 16] {
            let full = backend
                .run_chunks(None, &ids, chunk, Some(&mut |_, _| Ok(())))
                .expect("full forward");
            let state_only = backend
                .run_chunks(None, &ids, chunk, None)
                .expect("state only");
            assert_eq!(full.len(), state_only.len());
            assert_eq!(
                host(&full),
                host(&state_only),
                "{name}, chunk {chunk}: the state-only prefill changed the state"
            );
        }
    }
}

/// A scoring pass drops each layer's branch state as soon as the layer is done
/// (`Backbone::forward_branch`): its hidden states must be exactly the full forward's, and its
/// K/V summary the sum over the full forward's attention updates.
#[test]
fn branch_forward_equals_the_full_forward() {
    let models = tiny_models();
    let prefix: Vec<u32> = (0..30u32).map(|i| (i * 7919 + 13) % 500).collect();
    // two rows of 5 and 3 tokens over the prefix, right-padded to 5
    let ids: Vec<u32> = vec![11, 12, 13, 14, 15, 21, 22, 23, 0, 0];
    for (name, backend) in &models {
        let b = &backend.backbone;
        let state = backend.prefill(&prefix).expect("prefill");
        let pasts: Vec<state::LayerPast> = state
            .layers()
            .iter()
            .map(state::LayerPast::whole)
            .collect::<Result<_, _>>()
            .expect("pasts");
        let step =
            Step::new(&b.rope, &[30, 30], &[5, 3], 5, None, b.dtype, &b.device).expect("step");
        let (full, updates) = b.forward(&ids, &pasts, &step).expect("forward");
        let (branch, kv) = b.forward_branch(&ids, &pasts, &step).expect("branch");
        let flat = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&full), flat(&branch), "{name}: hidden states differ");
        let mut expected = 0;
        let mut layers = 0;
        for u in &updates {
            if let state::LayerUpdate::Attention { k, v } = u {
                expected += (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes();
                layers += 1;
            }
        }
        assert_eq!(
            (kv.bytes, kv.attention_layers),
            (expected, layers),
            "{name}"
        );
        assert!(layers > 0, "{name}: no attention layer");
    }
}
