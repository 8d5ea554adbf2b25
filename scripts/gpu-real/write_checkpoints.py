#!/usr/bin/env python3
"""Write seeded checkpoints of the REAL Qwen3.5-4B (text part) and Qwen2.5-1.5B-Instruct shapes
with transformers' own `save_pretrained`, plus the family's tokenizer files from
fixtures/tokenizers/, so that forkscore and the transformers peer load the same folder.

    python3 scripts/gpu-real/write_checkpoints.py OUTDIR [--models qwen35-4b,qwen25-1.5b]
        [--device cuda] [--dtype bfloat16] [--tiny]

Writes OUTDIR/<model>/ (config.json, model*.safetensors, tokenizer.json, tokenizer_config.json,
chat_template.jinja) and prints one JSON line per model: {"model", "dir", "parameters",
"seconds"}. Weights: transformers' own initialisation under `torch.manual_seed(0)`, built under
`with torch.device(DEVICE)`, cast to DTYPE, saved. `--tiny` keeps the architecture and the real
vocabulary but shrinks every other dimension (a CPU smoke test of the pipeline). A folder whose
`.done` marker exists is kept as it is.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
TOKENIZERS = REPO / "fixtures" / "tokenizers"


def qwen35_4b(tiny: bool):
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (1 if tiny else 8)
    dims = dict(
        hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
        num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=32,
        mrope_section=[11, 11, 10],
    )
    if tiny:
        dims = dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            mrope_section=[2, 1, 1],
        )
    mrope_section = dims.pop("mrope_section")
    config = transformers.Qwen3_5TextConfig(
        vocab_size=248320,
        layer_types=layer_types,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": mrope_section,
            "mrope_interleaved": True,
        },
        **dims,
    )
    return transformers.Qwen3_5ForCausalLM, config, "qwen3.5"


def qwen25_1_5b(tiny: bool):
    dims = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                num_attention_heads=12, num_key_value_heads=2)
    if tiny:
        dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    config = transformers.Qwen2Config(
        vocab_size=151936,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False,
        **dims,
    )
    return transformers.Qwen2ForCausalLM, config, "qwen2.5"


def qwen25_0_5b(tiny: bool):
    """Qwen2.5-0.5B-Instruct (494 M parameters): the CPU bench's model."""
    dims = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2)
    if tiny:
        dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    config = transformers.Qwen2Config(
        vocab_size=151936,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False,
        **dims,
    )
    return transformers.Qwen2ForCausalLM, config, "qwen2.5"


MODELS = {"qwen35-4b": qwen35_4b, "qwen25-1.5b": qwen25_1_5b, "qwen25-0.5b": qwen25_0_5b}


def copy_tokenizer(family: str, out: Path) -> None:
    src = TOKENIZERS / family
    with gzip.open(src / "tokenizer.json.gz", "rb") as f, open(out / "tokenizer.json", "wb") as g:
        shutil.copyfileobj(f, g)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(src / name, out / name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--models", default="qwen35-4b,qwen25-1.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--tiny", action="store_true", help="small dimensions, real vocabulary (CPU smoke test)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    for name in [m for m in args.models.split(",") if m]:
        if name not in MODELS:
            sys.exit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        out = args.outdir / name
        if (out / ".done").is_file():
            print(json.dumps({"model": name, "dir": str(out), "kept": True}), flush=True)
            continue
        t0 = time.time()
        cls, config, family = MODELS[name](args.tiny)
        torch.manual_seed(0)
        with torch.device(args.device):
            model = cls(config)
        model = model.to(dtype)
        parameters = sum(p.numel() for p in model.parameters())
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        copy_tokenizer(family, out)
        (out / ".done").write_text("")
        print(json.dumps({"model": name, "dir": str(out), "parameters": parameters,
                          "seconds": round(time.time() - t0, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
