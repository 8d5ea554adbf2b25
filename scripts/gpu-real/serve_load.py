#!/usr/bin/env python3
"""Load generator for a running `forkscore serve`: closed loop (N clients, each sends its next
request when the previous answer arrives) or fixed arrival rate (Poisson arrivals, open loop),
varied context lengths, like vLLM's serving benchmark. Standard library only.

    python3 scripts/gpu-real/serve_load.py --url http://127.0.0.1:8080 --model DIR \
        --clients 1,16,64 [--rate 50,100] [--duration-s 20] [--warmup 8] [--fields 8] \
        [--words 150:250] [--peak-tflops 790] [--out load.json]

Per level it prints and records: decisions/s, prefix tokens/s (the sum of each answer's
`telemetry.prefix_tokens` over the measured window), p50 / p90 / p99 / max latency, errors by
HTTP status, the mean merged-call size the server reports, and MFU: achieved prefix FLOP/s divided
by `--peak-tflops`, with 2 x (the checkpoint's parameters without the embedding and output head)
FLOP per prefix token (read from the safetensors headers of `--model`, or `--flops-per-token`).
The schema is the first `--fields` fields of fixtures/examples/support_triage.json; contexts are
support tickets grown from seeded sentences to a word count drawn from `--words LO:HI`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import struct
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SENTENCES = [
    "The checkout API returns 502 errors for enterprise accounts since the last deploy.",
    "Our billing portal charges some customers twice and support cannot issue refunds.",
    "Single sign-on rejects valid credentials in the APAC region this morning.",
    "The reporting dashboard shows an empty page after the maintenance window.",
    "Webhook delivery is delayed by thirty minutes for every integration partner.",
    "Password reset emails arrive twice and the second link has already expired.",
    "The mobile app crashes on start for users who upgraded to the newest release.",
    "Legal asked for a written incident report before the end of the week.",
    "Nobody noticed until a customer called the sales team directly.",
    "The team found a workaround, but it needs a manual step for every order.",
    "Our auditors flagged the exported invoices as a possible data leak.",
    "Revenue is blocked because invoices cannot be generated for the new plan.",
]


def flops_per_token(model_dir: Path) -> float:
    """2 x parameters of the checkpoint's safetensors files, without embedding / output head."""
    params = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if "embed_tokens" in name or name.endswith("lm_head.weight"):
                continue
            if any(s in name for s in ("visual.", "mtp.")):
                continue
            count = 1
            for d in info["shape"]:
                count *= d
            params += count
    if params == 0:
        raise SystemExit(f"no safetensors tensors under {model_dir}")
    return 2.0 * params


def make_contexts(n: int, lo: int, hi: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        target = rng.randint(lo, hi)
        words: list[str] = [f"Ticket {i}:"]
        while len(words) < target:
            words.extend(rng.choice(SENTENCES).split())
        out.append(" ".join(words[:target]))
    return out


class Client:
    """One keep-alive HTTP/1.1 connection (reopened after an error)."""

    def __init__(self, url: str, timeout: float):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.timeout = timeout
        self.conn = None

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        for attempt in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                self.conn.request("POST", path, body, {"Content-Type": "application/json"})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, OSError):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt == 1:
                    return 0, b""
        return 0, b""


def get_json(url: str, path: str) -> dict | str:
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
    c.request("GET", path)
    data = c.getresponse().read().decode()
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        return data


def merged_contexts(url: str) -> tuple[float, float]:
    """(sum, count) of the server's contexts-per-merged-call histogram, from /metrics."""
    text = get_json(url, "/metrics")
    total = count = 0.0
    if isinstance(text, str):
        for line in text.splitlines():
            if line.startswith("forkscore_merged_contexts_sum"):
                total = float(line.split()[-1])
            elif line.startswith("forkscore_merged_contexts_count"):
                count = float(line.split()[-1])
    return total, count


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(args, schema, contexts, clients: int, rate: float | None) -> dict:
    lock = threading.Lock()
    lat: list[float] = []
    prefix_tokens = 0
    computed_tokens = 0.0
    errors: dict[str, int] = {}
    stop_at = time.monotonic() + args.duration_s
    counter = [0]

    def one(cl: Client, measure: bool) -> None:
        nonlocal prefix_tokens, computed_tokens
        with lock:
            i = counter[0]
            counter[0] += 1
        req = {"context": contexts[i % len(contexts)], "schema": schema}
        if args.options:
            req["options"] = args.options
        body = json.dumps(req).encode()
        t = time.monotonic()
        status, data = cl.post("/v1/score", body)
        dt = time.monotonic() - t
        if not measure:
            return
        with lock:
            if status == 200:
                lat.append(dt)
                try:
                    tel = json.loads(data)["telemetry"]
                    prefix_tokens += tel["prefix_tokens"]
                    # tokens taken from the cached prompt head: counted per group, so per
                    # decision the group's total over its size
                    size = (tel.get("group") or {}).get("size") or 1
                    computed_tokens += tel["prefix_tokens"] - tel.get("reused_prefix_tokens", 0) / size
                except (ValueError, KeyError):
                    errors["bad_body"] = errors.get("bad_body", 0) + 1
            else:
                errors[str(status)] = errors.get(str(status), 0) + 1

    # warm-up requests (not measured): kernel compile, caches
    warm = Client(args.url, args.timeout_s)
    for _ in range(args.warmup):
        one(warm, False)

    before = merged_contexts(args.url)
    t0 = time.monotonic()
    stop_at = t0 + args.duration_s
    threads = []
    if rate is None:
        def loop():
            cl = Client(args.url, args.timeout_s)
            while time.monotonic() < stop_at:
                one(cl, True)
        threads = [threading.Thread(target=loop) for _ in range(clients)]
        for th in threads:
            th.start()
    else:
        rng = random.Random(1)
        pool: list[Client] = []
        pool_lock = threading.Lock()

        def fire():
            with pool_lock:
                cl = pool.pop() if pool else Client(args.url, args.timeout_s)
            one(cl, True)
            with pool_lock:
                pool.append(cl)

        nxt = t0
        while nxt < stop_at:
            now = time.monotonic()
            if now < nxt:
                time.sleep(nxt - now)
            th = threading.Thread(target=fire)
            th.start()
            threads.append(th)
            nxt += rng.expovariate(rate)
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    after = merged_contexts(args.url)
    done = len(lat)
    tps = prefix_tokens / wall
    merged = (after[0] - before[0]) / (after[1] - before[1]) if after[1] > before[1] else None
    row = {
        "clients": clients if rate is None else None,
        "rate_per_s": rate,
        "wall_s": round(wall, 2),
        "decisions": done,
        "decisions_per_s": round(done / wall, 2),
        "prefix_tokens_per_s": round(tps),
        "mean_prefix_tokens": round(prefix_tokens / done, 1) if done else None,
        "computed_prefix_tokens_per_s": round(computed_tokens / wall),
        "p50_ms": round(pct(lat, 50) * 1000, 1),
        "p90_ms": round(pct(lat, 90) * 1000, 1),
        "p99_ms": round(pct(lat, 99) * 1000, 1),
        "max_ms": round(max(lat) * 1000, 1) if lat else None,
        "errors": errors,
        "mean_contexts_per_merged_call": round(merged, 2) if merged else None,
    }
    if args.fpt:
        # prefix tokens served per second (what a user gets), and the FLOP actually computed
        # (prefix tokens less those continued from the cached prompt head)
        row["mfu"] = round(tps * args.fpt / (args.peak_tflops * 1e12), 4)
        row["mfu_computed"] = round(computed_tokens / wall * args.fpt / (args.peak_tflops * 1e12), 4)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", type=Path, help="checkpoint folder (for FLOP per token)")
    ap.add_argument("--flops-per-token", type=float)
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 peak of the GPU")
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--rate", default="", help="comma list of arrival rates (requests/s), open loop")
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--fields", type=int, default=8)
    ap.add_argument("--words", default="150:250")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--ready-s", type=float, default=300.0, help="wait this long for /health")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--options", type=json.loads, default=None,
                    help='the requests\' options object, e.g. \'{"layout": "fields-first"}\'')
    args = ap.parse_args()
    deadline = time.monotonic() + args.ready_s
    while True:  # wait for the server to answer /health
        try:
            get_json(args.url, "/health")
            break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.url} did not answer /health within {args.ready_s} s")
            time.sleep(0.5)
    args.fpt = args.flops_per_token or (flops_per_token(args.model) if args.model else None)
    full = json.loads((REPO / "fixtures/examples/support_triage.json").read_text())
    schema = dict(list(full.items())[: args.fields])
    lo, hi = (int(x) for x in args.words.split(":"))
    contexts = make_contexts(4096, lo, hi, seed=11)
    rows = []
    levels = [(int(c), None) for c in args.clients.split(",") if c] + [
        (0, float(r)) for r in args.rate.split(",") if r
    ]
    for clients, rate in levels:
        row = run_level(args, schema, contexts, clients, rate)
        row["label"] = args.label
        rows.append(row)
        print("LOAD " + json.dumps(row), flush=True)
        if args.out:
            args.out.write_text(json.dumps({"flops_per_token": args.fpt, "peak_tflops": args.peak_tflops, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
