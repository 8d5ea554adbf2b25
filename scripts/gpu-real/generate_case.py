#!/usr/bin/env python3
"""forkscore vs the autoregressive baseline on the GPU machine (issue 11), through the CLI:
`forkscore generate` on each of the four presets, per checkpoint, with the same contexts as
`cargo bench --bench generate` (benches/benches/generate.rs). Each call decodes greedily with a
KV cache (one forward per token) and decides the same context with forkscore in the same
process; this script runs one warm-up and REPEATS timed calls per preset and prints a table.

  python3 scripts/gpu-real/generate_case.py --forkscore "<run.sh> <forkscore>" --model DIR \
      [--device cuda --dtype bf16 --repeats 3] > table.md

On seeded random weights the generated text is not JSON (the run stops at max_new_tokens), so the
table also gives the speed-up had the baseline stopped after forkscore's own answer length
(`answer_tokens`: its prefill + that many of its measured per-token steps) — an estimate.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRESETS = [
    ("fintech_fraud", "New device in another country changed the password, then wired $9,800 to a new payee."),
    ("code_security", "query = \"SELECT * FROM users WHERE name = '\" + request.args['name'] + \"'\""),
    ("support_triage", "Hi, I was charged twice for my Business plan this month. Please refund one charge. This is the third time!"),
    ("high_cardinality_255", "Frozen beef cuts."),
]


def dig(d, *keys, default=None):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forkscore", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=60)
    ap.add_argument("--raw", type=Path)
    a = ap.parse_args()
    rows, raw = [], {}
    for name, context in PRESETS:
        cmd = shlex.split(a.forkscore) + [
            "generate", "--model", a.model, "--revision", "bench", "--device", a.device, "--dtype", a.dtype,
            "--schema-file", str(REPO / "fixtures" / "examples" / f"{name}.json"), "--context", context]
        if name == "high_cardinality_255":
            cmd += ["--scoring", "literal"]
        runs = []
        for i in range(a.repeats + 1):
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s)
            if p.returncode != 0:
                print(f"[generate] {name}: exit {p.returncode}: {p.stderr[-800:]}", file=sys.stderr)
                break
            if i > 0:  # the first call warms the process-independent caches (driver JIT)
                runs.append(json.loads(p.stdout))
        raw[name] = runs
        if not runs:
            rows.append(f"| {name} | failed | | | | | | |")
            continue
        med = lambda f: statistics.median(f(r) for r in runs)
        g = runs[0]["generation"]
        gen_ms = med(lambda r: dig(r, "generation", "timings_ms", "total_ms", default=0.0))
        fs_ms = med(lambda r: dig(r, "forkscore", "total_ms", default=0.0))
        toks = dig(g, "generated_tokens", default="?")
        tps = med(lambda r: dig(r, "generation", "decode_tokens_per_s", default=0.0) or 0.0)
        valid = dig(g, "valid", default="?")
        agree = f'{dig(runs[0], "agreement", "agree", default="?")} agree / {dig(runs[0], "agreement", "disagree", default="?")} not' 
        rows.append(f"| {name} | {gen_ms:.1f} | {toks} | {tps:.0f} | {valid} | {fs_ms:.1f} | "
                    f"{gen_ms / fs_ms if fs_ms else float('nan'):.1f}× | {agree} |")
    print(f"model {a.model}, {a.device} {a.dtype}, medians of {a.repeats} after one warm-up call\n")
    print("| preset | generate total ms | generated tokens | tokens/s | valid JSON | forkscore decide ms | speed-up | agreement |")
    print("|---|---:|---:|---:|---|---:|---:|---|")
    print("\n".join(rows))
    if a.raw:
        a.raw.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
