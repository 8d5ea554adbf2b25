//! Tensor names: the Hugging Face names the model loaders ask for, and llama.cpp's GGUF names
//! of the same tensors (Qwen2 / Qwen3 layouts, as `convert_hf_to_gguf.py` writes them).
//!
//! llama.cpp's converter writes Qwen2 / Qwen3 q/k weights unpermuted (only its Llama-family
//! converter permutes q/k for the interleaved RoPE; Qwen runs the rotate-half "NEOX" RoPE that
//! transformers runs), so a mapped tensor is used exactly as stored.

/// Top-level tensors: (Hugging Face name, GGUF name).
const TOP: &[(&str, &str)] = &[
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// Per-layer tensors under `model.layers.N.` / `blk.N.`: (Hugging Face suffix, GGUF suffix).
const LAYER: &[(&str, &str)] = &[
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.o_proj.bias", "attn_output.bias"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// The GGUF name of the Hugging Face tensor `hf`, `None` for a name outside the layout.
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some(&(_, g)) = TOP.iter().find(|(h, _)| *h == hf) {
        return Some(g.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let &(_, g) = LAYER.iter().find(|(h, _)| *h == suffix)?;
    Some(format!("blk.{layer}.{g}"))
}

/// The Hugging Face name of the GGUF tensor `gguf`, `None` for a name outside the layout.
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some(&(h, _)) = TOP.iter().find(|(_, g)| *g == gguf) {
        return Some(h.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let &(h, _) = LAYER.iter().find(|(_, g)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{h}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        for (hf, g) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias"),
            (
                "model.layers.27.mlp.down_proj.weight",
                "blk.27.ffn_down.weight",
            ),
            (
                "model.layers.3.self_attn.k_norm.weight",
                "blk.3.attn_k_norm.weight",
            ),
            (
                "model.layers.1.post_attention_layernorm.weight",
                "blk.1.ffn_norm.weight",
            ),
        ] {
            assert_eq!(gguf_name(hf).as_deref(), Some(g), "{hf}");
            assert_eq!(hf_name(g).as_deref(), Some(hf), "{g}");
        }
        for outside in [
            "model.layers.x.mlp.up_proj.weight",
            "model.layers.0.linear_attn.in_proj_qkvz.weight",
            "rope_freqs.weight",
            "blk.0.ssm_a",
        ] {
            assert_eq!(gguf_name(outside), None, "{outside}");
            assert_eq!(hf_name(outside), None, "{outside}");
        }
    }
}
