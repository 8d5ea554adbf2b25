#!/usr/bin/env python3
"""Report of one scripts/gpu-real/quantized.sh run: per model and scheme, parallel-mode time
beside the unquantized run of the same model, peak GPU memory while the bench ran (nvidia-smi
samples, whole device), what each linear weight became, load time, and fidelity (argmax
agreement and max |Δp| over each field's code softmax, scripts/quant_fidelity.py).

    python3 scripts/gpu-real/quantized_report.py WORK --md report.md --json report.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quant_fidelity import cases_by_fields, compare_case  # noqa: E402


def load(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def peak_mib(p: Path):
    try:
        vals = [int(x) for x in p.read_text().split() if x.strip().isdigit()]
    except OSError:
        return None
    return max(vals) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--md", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    env = load(a.work / "env.json") or {}
    models = [m for m in env.get("models", "").split(",") if m]
    schemes = ["none"] + [s for s in env.get("schemes", "").split(",") if s]
    lines = [f"# Quantized scoring on the GPU ({env.get('gpu')}, driver {env.get('driver')}, commit {env.get('commit')})",
             "", f"Command: `{env.get('command')}`; bf16 compute, parallel mode, median of {env.get('repeats')} runs.",
             "Fidelity is against the unquantized bf16 run of the same model on the same token ids.", "",
             "| model | scheme | fields | prefix tokens | parallel ms | vs unquantized | peak GPU MiB | load ms | linear weights | argmax agreement | max abs Δp |",
             "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|"]
    rows = []
    for m in models:
        ref_modes = load(a.work / f"bench-{m}-none" / "modes.json") or {}
        ref_dump = cases_by_fields(load(a.work / f"dump-{m}-none.json"))
        ref_ms = {(r["fields"], r["prefix_tokens"]): r.get("parallel_ms") for r in ref_modes.get("rows", [])}
        for s in schemes:
            modes = load(a.work / f"bench-{m}-{s}" / "modes.json")
            if not modes:
                lines.append(f"| {m} | {s} | — | — | no result (see bench-{m}-{s}.log) | | | | | | |")
                continue
            dump = cases_by_fields(load(a.work / f"dump-{m}-{s}.json"))
            weights = ", ".join(f"{k} {v}" for k, v in (modes.get("linear_weights") or {}).items()) or "dense"
            mem = peak_mib(a.work / f"mem-{m}-{s}.txt")
            for r in modes.get("rows", []):
                key = (r["fields"], r["prefix_tokens"])
                fid = compare_case(ref_dump.get(key), dump.get(key)) if s != "none" else None
                base = ref_ms.get(key)
                ratio = f"{base / r['parallel_ms']:.2f}× faster" if s != "none" and base and r.get("parallel_ms") else "—"
                rows.append({"model": m, "scheme": s, "fields": key[0], "prefix_tokens": key[1],
                             "parallel_ms": r.get("parallel_ms"), "unquantized_ms": base,
                             "peak_gpu_mib": mem, "load_ms": modes.get("load_ms"),
                             "linear_weights": modes.get("linear_weights"), "fidelity": fid})
                agree = f"{fid['agree']}/{fid['rows']}" if fid else "—"
                dp = f"{fid['max_abs_dp']:.4f}" if fid else "—"
                pm = r.get("parallel_ms")
                lines.append(f"| {m} | {s} | {key[0]} | {key[1]} | {pm:,.1f} | {ratio} | {mem if mem is not None else '—'} "
                             f"| {modes.get('load_ms') or 0:,.0f} | {weights} | {agree} | {dp} |" if pm else
                             f"| {m} | {s} | {key[0]} | {key[1]} | — | | | | | | |")
    a.md.write_text("\n".join(lines) + "\n")
    a.json.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
