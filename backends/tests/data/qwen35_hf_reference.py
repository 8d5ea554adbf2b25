"""Reference logits for the tiny Qwen3.5 checkpoint from Hugging Face transformers (float32).

Usage: python qwen35_hf_reference.py EXPORT_DIR
EXPORT_DIR holds `model/` (written by testkit's TinyQwen35, text-only layout) and `prompts.json`
({"seed", "candidates", "prompts": [[ids]]}) as written by the ignored Rust test
`export_for_transformers` in backends/tests/qwen35_hf_reference.rs. Writes
EXPORT_DIR/hf_reference.json with the last-position logits of every prompt at the candidate ids.
Runs transformers' pure-torch paths (no flash-linear-attention / causal-conv1d kernels), eager
attention, float32 -- the plainest reference transformers offers.
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

export = sys.argv[1]
spec = json.load(open(f"{export}/prompts.json"))
model = AutoModelForCausalLM.from_pretrained(
    f"{export}/model", dtype=torch.float32, attn_implementation="eager"
).eval()
cands = spec["candidates"]
out = []
with torch.no_grad():
    for ids in spec["prompts"]:
        logits = model(torch.tensor([ids])).logits[0, -1]
        out.append([float(logits[c]) for c in cands])
# The composite (multimodal) layout of the same parameters, when exported.
multimodal = None
import os

if os.path.isdir(f"{export}/model_multimodal"):
    from transformers import Qwen3_5ForConditionalGeneration

    mm, info = Qwen3_5ForConditionalGeneration.from_pretrained(
        f"{export}/model_multimodal",
        dtype=torch.float32,
        attn_implementation="eager",
        output_loading_info=True,
        ignore_mismatched_sizes=True,
    )
    mm.eval()
    mm_out = []
    with torch.no_grad():
        for ids in spec["prompts"]:
            mm_out.append([float(x) for x in mm(input_ids=torch.tensor([ids])).logits[0, -1][cands]])
    multimodal = {
        "model_class": type(mm).__name__,
        "logits": mm_out,
        "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
    }
    print("multimodal loading info:", json.dumps(multimodal["loading_info"], indent=1)[:3000])

json.dump(
    {
        "generator": "backends/tests/data/qwen35_hf_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_class": type(model).__name__,
        "seed": spec["seed"],
        "candidates": cands,
        "prompts": spec["prompts"],
        "logits": out,
        "multimodal": multimodal,
    },
    open(f"{export}/hf_reference.json", "w"),
    indent=1,
)
print("wrote", len(out), "rows with", type(model).__name__, transformers.__version__)
