#!/usr/bin/env python3
"""Batch throughput case: N contexts x an F-field schema through `forkscore batch`, grouped vs
direct, on one checkpoint folder.

    python3 scripts/gpu-real/batch_case.py --forkscore "carry/run.sh /tmp/bin/forkscore" \
        --model DIR --out BATCH.json [--contexts 64] [--fields 8] [--tokens 830]
        [--device cuda] [--dtype bf16] [--modes grouped,direct] [--timeout-s 150] [--work /tmp/fs-batch]

Inputs (deterministic): the first F fields of fixtures/examples/support_triage.json as the
schema; N support-ticket contexts built from seeded sentences, each grown until it is at least
--tokens tokens long with the folder's own tokenizer.json (so every line's context differs and no
prefix is shared across lines beyond the instructions). Per batch mode it records the wall time
of the whole process (model load included), the job seconds forkscore prints (load excluded),
the sum of telemetry.prefix_tokens over the output lines, prefix tokens/s on both, errors, and
how many field values differ from the first mode's output.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SUBJECTS = ["The checkout API", "Our billing portal", "The mobile app", "Single sign-on", "The reporting dashboard",
            "The EU database cluster", "Webhook delivery", "Password reset", "The invoice exporter", "Search"]
PROBLEMS = ["returns 502 errors", "times out after thirty seconds", "shows an empty page", "charges customers twice",
            "rejects valid credentials", "loses the last hour of data", "is slow for enterprise accounts",
            "crashes on start", "sends duplicate emails", "leaks another tenant's order ids"]
SINCE = ["since the last deploy", "since this morning", "for three days", "after the maintenance window",
         "intermittently this week", "only in the APAC region", "for every customer", "for one user"]
IMPACT = ["We cannot bill our own customers.", "Our support queue has doubled.", "Nobody noticed until a customer called.",
          "It is a minor annoyance for now.", "Legal wants a written incident report.", "Revenue is blocked.",
          "The team found a workaround.", "Our auditors flagged it as a security risk."]
ASKS = ["Please fix it today or we cancel the contract.", "Can you look at it this week?", "Is this on your roadmap?",
        "We need a refund for the affected invoices.", "Please escalate to your security team.", "Just letting you know."]


def context(rng: random.Random, tok, tokens: int) -> str:
    parts = []
    while True:
        parts.append(f"{rng.choice(SUBJECTS)} {rng.choice(PROBLEMS)} {rng.choice(SINCE)}. "
                     f"{rng.choice(IMPACT)} {rng.choice(ASKS)}")
        text = " ".join(parts)
        if len(tok.encode(text, add_special_tokens=False).ids) >= tokens:
            return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forkscore", required=True, help="command prefix that runs the forkscore binary")
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--contexts", type=int, default=64)
    ap.add_argument("--fields", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=830)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--modes", default="grouped,direct")
    ap.add_argument("--timeout-s", type=float, default=150)
    ap.add_argument("--work", type=Path, default=Path("/tmp/fs-batch"))
    ap.add_argument("--extra", default="", help="more forkscore batch flags, e.g. '--prefill-chunk 8192'")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    triage = json.loads((REPO / "fixtures/examples/support_triage.json").read_text())
    schema = dict(list(triage.items())[: args.fields])
    schema_path = args.work / "schema.json"
    schema_path.write_text(json.dumps(schema, indent=1))
    rng = random.Random(830)
    inp = args.work / "in.jsonl"
    ctx_tokens = []
    with inp.open("w") as f:
        for i in range(args.contexts):
            text = context(rng, tok, args.tokens)
            ctx_tokens.append(len(tok.encode(text, add_special_tokens=False).ids))
            f.write(json.dumps({"id": f"c{i:03d}", "context": text}) + "\n")
    report = {"model_dir": str(args.model), "contexts": args.contexts, "fields": args.fields,
              "context_tokens_mean": sum(ctx_tokens) / len(ctx_tokens), "device": args.device,
              "dtype": args.dtype, "modes": {}}
    first = None
    for mode in [m for m in args.modes.split(",") if m]:
        out = args.work / f"out-{mode}.jsonl"
        out.unlink(missing_ok=True)
        cmd = shlex.split(args.forkscore) + [
            "batch", "--model", str(args.model), "--revision", "bench", "--device", args.device,
            "--dtype", args.dtype, "--input", str(inp), "--output", str(out),
            "--schema-file", str(schema_path), "--batch-mode", mode] + shlex.split(args.extra)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
            rc, stderr = p.returncode, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, stderr = "timeout", (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        wall = time.time() - t0
        entry = {"rc": rc, "wall_s": round(wall, 3), "stderr_tail": stderr[-1500:], "command": shlex.join(cmd)}
        m = re.search(r"forkscore batch: (\d+) lines written \((\d+) errors\), (\d+) rows in ([0-9.]+) s", stderr)
        if m:
            entry.update(lines=int(m[1]), errors=int(m[2]), rows=int(m[3]), job_s=float(m[4]))
        lines = [json.loads(x) for x in out.read_text().splitlines()] if out.is_file() else []
        ok = [x for x in lines if "error" not in x]
        prefix = sum(x["telemetry"]["prefix_tokens"] for x in ok)
        entry.update(output_lines=len(lines), error_lines=len(lines) - len(ok), prefix_tokens=prefix,
                     prefix_tokens_per_s_wall=prefix / wall if wall else None)
        if entry.get("job_s"):
            entry["prefix_tokens_per_s_job"] = prefix / entry["job_s"]
        groups = sorted({x["telemetry"].get("group", {}).get("size") for x in ok} - {None})
        entry["group_sizes"] = groups
        values = {x["id"]: x["output"] for x in ok}
        scores = {x["id"]: {f: r.get("scores", {}) for f, r in x.get("fields", {}).items()} for x in ok}
        if first is None:
            first, first_scores = values, scores
        else:
            differing = [(k, f) for k, v in values.items() for f, val in v.items()
                         if first.get(k, {}).get(f) != val]
            entry["values_differing_from_first_mode"] = len(differing)
            # How close to a tie the differing decisions were in the first mode (top-1 minus
            # top-2 probability), and the largest probability difference over all choices.
            def margin(p):
                top = sorted(p.values(), reverse=True)
                return top[0] - top[1] if len(top) > 1 else 1.0
            margins = [margin(first_scores[k][f]) for k, f in differing if first_scores.get(k, {}).get(f)]
            entry["differing_max_first_mode_margin"] = max(margins) if margins else None
            entry["max_abs_prob_diff_vs_first_mode"] = max(
                (abs(p - first_scores.get(k, {}).get(f, {}).get(c, p))
                 for k, fs in scores.items() for f, ps in fs.items() for c, p in ps.items()),
                default=None)
        report["modes"][mode] = entry
        print(f"[batch] {mode}: rc {rc}, wall {wall:.1f} s, job {entry.get('job_s')} s, "
              f"{prefix} prefix tokens, {entry.get('prefix_tokens_per_s_job') or 0:.0f} tok/s (job)", flush=True)
        args.out.write_text(json.dumps(report, indent=1))
    g, d = report["modes"].get("grouped", {}), report["modes"].get("direct", {})
    if g.get("job_s") and d.get("job_s"):
        report["grouped_speedup_vs_direct_job"] = d["job_s"] / g["job_s"]
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
