#!/usr/bin/env python3
"""Merge one gpu-real run into a markdown table per model and one JSON with everything.

    python3 scripts/gpu-real/report.py WORKDIR --md REPORT.md --json REPORT.json [--env ENV.json]

WORKDIR holds what run.sh wrote (every part optional):
  checkpoints.jsonl           write_checkpoints.py output lines ({"model", "dir", ...})
  modes-<model>.json          forkscore's modes bench (benches/benches/modes.rs)
  peer-<model>-<label>.json   peer.py runs (label nofla / fla)
  batch-<model>.json          batch_case.py
  mem-<step>.txt              nvidia-smi memory.used samples (MiB, one per line) during a step
ENV.json: {"commit", "gpu", "driver", "command", ...}, copied into the JSON.

Per model, per bench case: forkscore parallel (its telemetry prefill) / cached-serial /
independent ms; the peer's prefill / independent / cached-serial / batched ms ("no fla / fla"
where both ran); ratios peer ÷ forkscore parallel (peer prefill alone, and the peer's best way to
score all rows); the peer's peak torch allocation over its modes; and the FLOP floor
2 · parameters · prefix tokens / 790 TFLOP/s (parameters counted from the safetensors headers,
tied embeddings once).
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

PEAK_FLOPS = 790e12
PEER_MODES = ["prefill", "independent", "cached_serial", "batched"]


def load(p: Path):
    try:
        return json.loads(p.read_text())
    except Exception:  # noqa: BLE001
        return None


def count_parameters(folder: Path) -> int | None:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            size = 1
            for d in meta["shape"]:
                size *= d
            total += size
    return total


def fmt_ms(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def peer_ms(peer: dict | None, fields: int, words: int, mode: str):
    if not peer:
        return None
    for c in peer.get("cases", []):
        if c["fields"] == fields and c["context_words"] == words:
            e = c["modes"].get(mode) or {}
            if "ms" in e:
                return e["ms"]
            if "error" in e:
                return "error"
            if "skipped" in e:
                return "skipped"
    return None


def peer_case(peer: dict | None, fields: int, words: int):
    for c in (peer or {}).get("cases", []):
        if c["fields"] == fields and c["context_words"] == words:
            return c
    return None


def mem_max(work: Path, step: str):
    p = work / f"mem-{step}.txt"
    if not p.is_file():
        return None
    vals = []
    for line in p.read_text().split():
        try:
            vals.append(float(line.strip().rstrip(",")))
        except ValueError:
            pass
    return max(vals) if vals else None


def model_section(work: Path, model: str, ckpt: dict, md: list[str]) -> dict:
    modes = load(work / f"modes-{model}.json")
    peers = {}
    for p in sorted(work.glob(f"peer-{model}-*.json")):
        peers[p.stem[len(f"peer-{model}-"):]] = load(p)
    batch = load(work / f"batch-{model}.json")
    folder = Path(ckpt.get("dir", "")) if ckpt else None
    params = count_parameters(folder) if folder and folder.is_dir() else None
    labels = [l for l in ("nofla", "fla") if peers.get(l)] + [l for l in peers if l not in ("nofla", "fla") and peers[l]]
    out = {"model": model, "checkpoint": ckpt, "parameters": params, "modes": modes, "peers": peers,
           "batch": batch, "rows": []}
    md.append(f"## {model}" + (f" ({params / 1e9:.2f} B parameters)" if params else ""))
    md.append("")
    if modes:
        md.append(f"forkscore: {modes.get('device')} {modes.get('dtype')}, {modes.get('repeats')} repeats; "
                  f"peer runs: {', '.join(labels) or 'none'}"
                  + "".join(f"; {l}: fla used = {peers[l].get('fla', {}).get('fla_used')}" for l in labels))
        md.append("")
        lab = " / ".join(labels) if len(labels) > 1 else (labels[0] if labels else "")
        md.append(f"| fields | prefix | fs parallel (prefill) | fs cached-ser | fs indep | peer prefill ({lab}) "
                  f"| peer indep | peer cached-ser | peer batched | peer prefill ÷ fs | peer best ÷ fs | peer peak GiB | FLOP floor |")
        md.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in modes.get("rows", []):
            f, w, prefix = r["fields"], r["context_words"], r["prefix_tokens"]
            par = r.get("parallel_ms")
            pre = ((r.get("stages_ms") or {}).get("parallel") or {}).get("prefill")
            cells = {m: [peer_ms(peers[l], f, w, m) for l in labels] for m in PEER_MODES}
            nums = lambda xs: [x for x in xs if isinstance(x, (int, float))]  # noqa: E731
            best_prefill = min(nums(cells["prefill"]), default=None)
            best_score = min(nums(cells["independent"] + cells["cached_serial"] + cells["batched"]), default=None)
            peaks = [e.get("peak_bytes") for l in labels for e in ((peer_case(peers[l], f, w) or {}).get("modes") or {}).values()
                     if isinstance(e, dict) and e.get("peak_bytes")]
            floor = 2 * params * prefix / PEAK_FLOPS * 1e3 if params else None
            row = {"fields": f, "context_words": w, "prefix_tokens": prefix, "forkscore_parallel_ms": par,
                   "forkscore_prefill_ms": pre, "forkscore_cached_serial_ms": r.get("cached_serial_ms"),
                   "forkscore_independent_ms": r.get("independent_ms"),
                   "peer": {l: {m: peer_ms(peers[l], f, w, m) for m in PEER_MODES} for l in labels},
                   "peer_best_prefill_ms": best_prefill, "peer_best_score_ms": best_score,
                   "peer_prefill_over_forkscore": best_prefill / par if best_prefill and par else None,
                   "peer_best_over_forkscore": best_score / par if best_score and par else None,
                   "peer_peak_bytes": max(peaks) if peaks else None, "flop_floor_ms": floor}
            out["rows"].append(row)
            join = lambda xs: " / ".join(fmt_ms(x) for x in xs) if xs else "–"  # noqa: E731
            ratio = lambda x: f"{x:.2f}×" if x else "–"  # noqa: E731
            peak = f"{row['peer_peak_bytes'] / 2**30:.1f}" if row["peer_peak_bytes"] else "–"
            md.append(
                f"| {f} | {prefix:,} | {fmt_ms(par)} ({fmt_ms(pre)}) | {fmt_ms(r.get('cached_serial_ms'))} "
                f"| {fmt_ms(r.get('independent_ms'))} | {join(cells['prefill'])} | {join(cells['independent'])} "
                f"| {join(cells['cached_serial'])} | {join(cells['batched'])} "
                f"| {ratio(row['peer_prefill_over_forkscore'])} | {ratio(row['peer_best_over_forkscore'])} "
                f"| {peak} | {fmt_ms(floor)} |")
        md.append("")
        profiled = [r for r in modes.get("rows", []) if r.get("profile_parallel")]
        if profiled:
            md.append("Where forkscore's time goes (one extra parallel run per case, device synchronised "
                      "around every region, ms):")
            md.append("")
            names = sorted({k for r in profiled for k in r["profile_parallel"]["regions"]})
            md.append("| fields | prefix | synchronised wall | " + " | ".join(names) + " |")
            md.append("|---:|---:|---:|" + "---:|" * len(names))
            for r in profiled:
                reg = r["profile_parallel"]["regions"]
                md.append(f"| {r['fields']} | {r['prefix_tokens']:,} | {fmt_ms(r['profile_parallel']['wall_ms'])} | "
                          + " | ".join(fmt_ms((reg.get(n) or {}).get("ms")) for n in names) + " |")
            md.append("")
        mems = {s: mem_max(work, f"{s}-{model}") for s in ["bench", "peer-nofla", "peer-fla", "batch"]}
        mems = {k: v for k, v in mems.items() if v is not None}
        if mems:
            out["nvidia_smi_max_mib"] = mems
            md.append("GPU memory in use (nvidia-smi max per step, MiB): "
                      + ", ".join(f"{k} {v:,.0f}" for k, v in mems.items()))
            md.append("")
    for l in labels:
        agree = [(e.get("argmax_agree", 0), e.get("rows", 0), e.get("max_abs_logit_diff_vs_forkscore"))
                 for c in peers[l].get("cases", []) for m, e in c["modes"].items() if "argmax_agree" in e]
        if agree:
            a, n = sum(x[0] for x in agree), sum(x[1] for x in agree)
            d = max(x[2] or 0 for x in agree)
            vs = {m: max((c.get(f"{m}_vs_independent_max_abs") or 0) for c in peers[l].get("cases", []))
                  for m in ("batched", "cached_serial")}
            errs = sorted({f"{m}: {e['error'][:120]}" for c in peers[l].get("cases", [])
                           for m, e in c["modes"].items() if "error" in e})
            md.append(f"peer {l}: argmax agreement with forkscore {a}/{n} row-scorings, max |Δ logit| {d:.3g}, "
                      f"batched vs independent max |Δ| {vs['batched']:.3g}, cached-serial vs independent {vs['cached_serial']:.3g}" + (f"; errors: {'; '.join(errs)}" if errs else ""))
            md.append("")
    if batch:
        md.append(f"Batch: {batch['contexts']} contexts × {batch['fields']} fields, "
                  f"~{batch['context_tokens_mean']:.0f} context tokens each")
        md.append("")
        md.append("| batch mode | rc | wall s | job s | prefix tokens | tokens/s (job) | tokens/s (wall) | values ≠ first |")
        md.append("|---|---|---:|---:|---:|---:|---:|---:|")
        for m, e in batch.get("modes", {}).items():
            md.append(f"| {m} | {e.get('rc')} | {e.get('wall_s', 0):.1f} | {e.get('job_s', '–')} | {e.get('prefix_tokens', 0):,} "
                      f"| {e.get('prefix_tokens_per_s_job') or 0:,.0f} | {e.get('prefix_tokens_per_s_wall') or 0:,.0f} "
                      f"| {e.get('values_differing_from_first_mode', '–')} |")
        if batch.get("grouped_speedup_vs_direct_job"):
            md.append("")
            md.append(f"grouped ÷ direct speed-up (job seconds): {batch['grouped_speedup_vs_direct_job']:.2f}×")
        for m, e in batch.get("modes", {}).items():
            if e.get("max_abs_prob_diff_vs_first_mode") is not None:
                mm = e.get("differing_max_first_mode_margin")
                md.append("")
                md.append(f"{m} vs the first mode: max |Δp| {e['max_abs_prob_diff_vs_first_mode']:.3g} over all "
                          f"choices; the differing decisions had a top-1 − top-2 probability margin of at most "
                          f"{'–' if mm is None else f'{mm:.3g}'} in the first mode")
        md.append("")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--md", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--env", type=Path)
    args = ap.parse_args()
    env = load(args.env) if args.env else None
    ckpts = {}
    p = args.work / "checkpoints.jsonl"
    if p.is_file():
        for line in p.read_text().splitlines():
            try:
                c = json.loads(line)
                ckpts[c["model"]] = c
            except Exception:  # noqa: BLE001
                pass
    models = sorted({*ckpts, *(q.stem[len("modes-"):] for q in args.work.glob("modes-*.json"))})
    md = ["# forkscore vs transformers at real model sizes", ""]
    if env:
        md.append(f"commit {env.get('commit', '?')}, {env.get('gpu', '?')}, driver {env.get('driver', '?')}; "
                  f"ms are medians; peer cells are `no fla / fla` where both ran")
        md.append("")
    report = {"env": env, "models": []}
    for m in models:
        report["models"].append(model_section(args.work, m, ckpts.get(m, {}), md))
    args.md.write_text("\n".join(md) + "\n")
    args.json.write_text(json.dumps(report, indent=1))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
