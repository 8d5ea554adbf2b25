#!/usr/bin/env python3
"""The transformers peer: score EXACTLY the token ids forkscore's modes bench fed its model
(the bench's FORKSCORE_BENCH_DUMP file) with transformers on the same checkpoint folder, in the
ways a transformers user would, and time each.

    python3 scripts/gpu-real/peer.py --dump DUMP.json --model DIR --out PEER.json
        [--label nofla] [--device cuda] [--dtype bfloat16] [--repeats 5]
        [--budget-s 4] [--deadline-s 150] [--modes prefill,independent,cached_serial,batched]
        [--cases 8:600,28:40]   (fields:context_words; default every case of the dump)

Per case (one shared prefix, R rows = one suffix per field, candidate code ids per row):
  prefill        prefix ids -> decoder forward with use_cache (no vocabulary projection)
  independent    each row's full prompt (prefix ++ suffix) on its own, one forward per row,
                 last position projected by lm_head, logits read at the row's code ids
  cached_serial  prefill once, then per row a deep copy of the cache extended by the suffix
  batched        all R full prompts as one right-padded batch with an attention mask; each row's
                 last real position projected
  prefix_batched prefill once, the cache repeated to R rows, then every row's suffix in ONE
                 right-padded batch over it (attention mask, positions after the prefix): one
                 prefill + one scoring pass, transformers' counterpart of forkscore's parallel
                 mode (dense models; a Gated DeltaNet cache is not repeated here)
Timing: torch.cuda.synchronize around each run; 1 warm-up (a prefill whose warm-up exceeds
--budget-s, e.g. a Triton compile for a new length, gets a second one), then up to --repeats runs (fewer
when one run is slow: at most --budget-s seconds of timed runs per mode; a mode whose warm-up
run alone exceeds --budget-s is measured by that run, `runs_ms` then holds it alone); median ms.
Peak memory: torch.cuda.max_memory_allocated per mode (reset before each). Once --deadline-s
seconds have passed since start, the remaining modes are skipped (recorded as "skipped"), so the
step always finishes and writes its JSON (also rewritten after every case).
Agreement: per mode, each row's argmax code vs the dump's (forkscore's) argmax, and the largest
|peer logit - forkscore logit| over the rows' code ids; batched and cached_serial are also
compared with independent (`<mode>_vs_independent_max_abs`).
The JSON records whether transformers resolved Qwen3.5's chunked Gated DeltaNet to
flash-linear-attention (`fla`), so a "with fla" run that silently fell back is visible.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers


def kernel_impl(fn) -> str | None:
    """The module.function a transformers kernel wrapper resolved to, when it is not torch's own
    reference (walks the wrapper closures; `use_kernel_func_from_hub_with_fallback`)."""
    seen, stack = set(), [fn]
    while stack:
        f = stack.pop()
        for cell in getattr(f, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if callable(v) and id(v) not in seen:
                seen.add(id(v))
                mod = getattr(v, "__module__", "") or ""
                if mod.startswith("fla") or mod.startswith("causal_conv1d") or mod.startswith("kernels"):
                    return f"{mod}.{getattr(v, '__name__', '?')}"
                stack.append(v)
    return None


def fla_report() -> dict:
    out = {"fla_importable": importlib.util.find_spec("fla") is not None}
    try:
        from transformers.utils.import_utils import is_flash_linear_attention_available

        out["is_flash_linear_attention_available"] = bool(is_flash_linear_attention_available())
    except Exception as e:  # noqa: BLE001
        out["is_flash_linear_attention_available"] = f"error: {e}"
    try:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m

        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                     "causal_conv1d_fn", "causal_conv1d_update"):
            out[f"impl.{name}"] = kernel_impl(getattr(m, name)) or "torch reference"
    except Exception as e:  # noqa: BLE001
        out["impl_error"] = str(e)
    if out["fla_importable"]:
        try:
            import fla

            out["fla_version"] = getattr(fla, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            out["fla_import_error"] = f"{type(e).__name__}: {e}"
    out["fla_used"] = str(out.get("impl.torch_chunk_gated_delta_rule", "")).startswith("fla")
    return out


class Peer:
    def __init__(self, model, device):
        self.model = model
        self.decoder = model.model
        self.lm_head = model.lm_head
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def ids(self, rows):
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def project(self, hidden_rows, code_ids):
        """hidden_rows: [R, H] -> per row, logits at that row's code ids (lists of floats)."""
        logits = self.lm_head(hidden_rows).float()
        return [logits[i, c].tolist() for i, c in enumerate(code_ids)]

    def prefill(self, case):
        out = self.decoder(input_ids=self.ids([case["prefix_ids"]]), use_cache=True)
        return out.past_key_values

    def independent(self, case):
        hs = []
        for row in case["rows"]:
            out = self.decoder(input_ids=self.ids([case["prefix_ids"] + row["suffix_ids"]]), use_cache=False)
            hs.append(out.last_hidden_state[0, -1])
        return self.project(torch.stack(hs), [r["code_ids"] for r in case["rows"]])

    def cached_serial(self, case):
        cache = self.prefill(case)
        hs = []
        for row in case["rows"]:
            out = self.decoder(input_ids=self.ids([row["suffix_ids"]]),
                               past_key_values=copy.deepcopy(cache), use_cache=True)
            hs.append(out.last_hidden_state[0, -1])
        return self.project(torch.stack(hs), [r["code_ids"] for r in case["rows"]])

    def prefix_batched(self, case):
        cache = self.prefill(case)
        rows = case["rows"]
        cache.batch_repeat_interleave(len(rows))
        p = len(case["prefix_ids"])
        width = max(len(r["suffix_ids"]) for r in rows)
        ids = self.ids([r["suffix_ids"] + [0] * (width - len(r["suffix_ids"])) for r in rows])
        mask = self.ids([[1] * (p + len(r["suffix_ids"])) + [0] * (width - len(r["suffix_ids"])) for r in rows])
        pos = torch.arange(p, p + width, device=self.device).unsqueeze(0).expand(len(rows), -1)
        out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        last = torch.tensor([len(r["suffix_ids"]) - 1 for r in rows], device=self.device)
        h = out.last_hidden_state[torch.arange(len(rows), device=self.device), last]
        return self.project(h, [r["code_ids"] for r in rows])

    def batched(self, case):
        fulls = [case["prefix_ids"] + r["suffix_ids"] for r in case["rows"]]
        width = max(map(len, fulls))
        ids = self.ids([f + [0] * (width - len(f)) for f in fulls])
        mask = self.ids([[1] * len(f) + [0] * (width - len(f)) for f in fulls])
        out = self.decoder(input_ids=ids, attention_mask=mask, use_cache=False)
        last = torch.tensor([len(f) - 1 for f in fulls], device=self.device)
        h = out.last_hidden_state[torch.arange(len(fulls), device=self.device), last]
        return self.project(h, [r["code_ids"] for r in case["rows"]])


def agreement(case, logits) -> dict:
    agree, max_abs = 0, 0.0
    for row, got in zip(case["rows"], logits):
        best = max(range(len(got)), key=lambda i: (got[i], -i))
        agree += row["code_ids"][best] == row["argmax_code_id"]
        if row.get("logits"):
            max_abs = max(max_abs, max(abs(a - b) for a, b in zip(got, row["logits"])))
    return {"argmax_agree": agree, "rows": len(case["rows"]), "max_abs_logit_diff_vs_forkscore": max_abs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--label", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=4.0)
    ap.add_argument("--deadline-s", type=float, default=1e9)
    ap.add_argument("--modes", default="prefill,independent,cached_serial,batched")
    ap.add_argument("--cases", default="", help="fields:context_words,... in this order (default: all)")
    args = ap.parse_args()
    start = time.time()
    device = torch.device(args.device)
    dump = json.loads(args.dump.read_text())
    cases = dump["cases"]
    if args.cases:
        order = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")]
        by_key = {(c["fields"], c["context_words"]): c for c in cases}
        cases = [by_key[k] for k in order if k in by_key]
    modes = [m for m in args.modes.split(",") if m]

    report = {
        "label": args.label, "model_dir": str(args.model), "device": str(device), "dtype": args.dtype,
        "attn_implementation": args.attn, "repeats": args.repeats, "budget_s": args.budget_s,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "argv": sys.argv,
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "fla": fla_report(), "cases": [],
    }

    def write():
        args.out.write_text(json.dumps(report, indent=1))

    t0 = time.time()
    kw = dict(dtype=getattr(torch, args.dtype), attn_implementation=args.attn)
    try:  # straight onto the device; plain .to() where device_map is not available
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, device_map=str(device), **kw)
    except Exception as e:  # noqa: BLE001
        report["device_map_error"] = f"{type(e).__name__}: {e}"[:300]
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, **kw).to(device)
    model.eval()
    peer = Peer(model, device)
    report["model_class"] = type(model).__name__
    report["load_s"] = round(time.time() - t0, 2)
    # The class may resolve kernels lazily: look again once the model is built.
    report["fla"] = fla_report()
    print(f"[peer {args.label}] {report['model_class']} loaded in {report['load_s']} s; "
          f"fla used: {report['fla']['fla_used']}", flush=True)

    with torch.inference_mode():
        # Global warm-up (kernel JIT / autotune) on the first case.
        if cases:
            t0 = time.time()
            try:
                peer.prefill(cases[0])
                peer.cached_serial({**cases[0], "rows": cases[0]["rows"][:1]})
            except Exception as e:  # noqa: BLE001
                report["warmup_error"] = f"{type(e).__name__}: {e}"
            peer.sync()
            report["warmup_s"] = round(time.time() - t0, 2)
        for case in cases:
            res = {"fields": case["fields"], "context_words": case["context_words"],
                   "prefix_tokens": len(case["prefix_ids"]),
                   "suffix_tokens": [len(r["suffix_ids"]) for r in case["rows"]], "modes": {}}
            logits_by_mode = {}
            for mode in modes:
                if time.time() - start > args.deadline_s:
                    res["modes"][mode] = {"skipped": "deadline"}
                    continue
                fn = getattr(peer, mode)
                entry = {}
                try:
                    if peer.cuda:
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                    peer.sync()
                    t = time.perf_counter()
                    out = fn(case)
                    peer.sync()
                    warm = time.perf_counter() - t
                    warmups = [round(warm * 1e3, 3)]
                    if warm > args.budget_s and mode == "prefill":
                        # A first prefill of a new length can be a kernel compile (Triton
                        # autotunes flash-linear-attention per shape): warm up once more.
                        peer.sync()
                        t = time.perf_counter()
                        out = fn(case)
                        peer.sync()
                        warm = time.perf_counter() - t
                        warmups.append(round(warm * 1e3, 3))
                    # A slow mode: the warm-up run is the only measurement (after the global
                    # warm-up it is a steady-state run); else up to --repeats within the budget.
                    n = 0 if warm > args.budget_s else max(1, min(args.repeats, int(args.budget_s / max(warm, 1e-6))))
                    times = [] if n else [warm * 1e3]
                    for _ in range(n):
                        peer.sync()
                        t = time.perf_counter()
                        out = fn(case)
                        peer.sync()
                        times.append((time.perf_counter() - t) * 1e3)
                    entry = {"ms": statistics.median(times), "runs_ms": [round(x, 3) for x in times],
                             "warmup_ms": warm * 1e3, "warmups_ms": warmups, "warmup_only": n == 0}
                    if peer.cuda:
                        entry["peak_bytes"] = torch.cuda.max_memory_allocated()
                    if mode != "prefill":
                        logits_by_mode[mode] = out
                        entry.update(agreement(case, out))
                except Exception as e:  # noqa: BLE001
                    entry = {"error": f"{type(e).__name__}: {e}"[:500]}
                    if peer.cuda:
                        torch.cuda.empty_cache()
                res["modes"][mode] = entry
                print(f"[peer {args.label}] fields {case['fields']:>2} prefix {res['prefix_tokens']:>5} "
                      f"{mode:<14} {entry.get('ms', float('nan')):10.1f} ms "
                      f"{entry.get('error', '')}", flush=True)
            ref = logits_by_mode.get("independent")
            for mode in ("batched", "cached_serial", "prefix_batched"):
                if ref and logits_by_mode.get(mode):
                    res[f"{mode}_vs_independent_max_abs"] = max(
                        abs(x - y) for ra, rb in zip(logits_by_mode[mode], ref) for x, y in zip(ra, rb))
            report["cases"].append(res)
            write()
    report["wall_s"] = round(time.time() - start, 2)
    write()
    print(f"[peer {args.label}] wrote {args.out} in {report['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
