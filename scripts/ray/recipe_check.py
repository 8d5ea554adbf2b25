"""The README's Ray recipe on a local CPU Ray cluster, checked against `forkscore batch`.

Usage: python scripts/ray/recipe_check.py FORKSCORE_BIN WORKDIR
Writes a demo checkpoint and an input file into WORKDIR, runs `forkscore batch`, then the recipe
(read_jsonl -> map_batches(ForkscoreActor, compute=ActorPoolStrategy(size=2), num_gpus=0) -> write_jsonl), and
compares the records (timings aside). Exits non-zero on any difference.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import ray

from forkscore.ray import ForkscoreActor, read_jsonl, write_jsonl

REPO = Path(__file__).resolve().parents[2]
# lines per actor call and per `forkscore batch --window`: the same groups, so the same floats
# (a context's f32 logits depend slightly on the group it is merged with)
BATCH = 8


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "timings_ms"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def main() -> int:
    binary, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    model = work / "demo-qwen2.5"
    if not model.exists():
        subprocess.run([binary, "demo-model", str(model)], check=True)
    schema = work / "schema.json"
    shutil.copy(REPO / "fixtures" / "examples" / "parallel_schema.json", schema)
    lines = []
    for i in range(40):
        if i % 7 == 3:
            lines.append(json.dumps({"id": i, "context": f"Ticket {i}", "question": "Is it urgent?"}))
        else:
            lines.append(json.dumps({"id": f"t{i}", "context": f"Ticket {i}: the service is slow for {i} users."}))
    lines.insert(10, "not json")
    lines.insert(20, "")
    (work / "in.jsonl").write_text("\n".join(lines) + "\n")
    subprocess.run(
        [binary, "batch", "--model", str(model), "--revision", "demo", "--quiet", "--force",
         "--input", str(work / "in.jsonl"), "--output", str(work / "cli.jsonl"),
         "--schema-file", str(schema), "--window", str(BATCH)],
        check=True,
    )

    # logical CPUs: 2 actors of 1 CPU each, and room for the read task beside them
    ray.init(num_cpus=4, include_dashboard=False)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds = read_jsonl(str(work / "in.jsonl"))
    out = ds.map_batches(
        ForkscoreActor,
        fn_constructor_kwargs={"model": str(model), "revision": "demo", "schema_file": str(schema)},
        compute=ray.data.ActorPoolStrategy(size=2),  # Ray >= 2.51: `concurrency=` is deprecated
        num_gpus=0,
        num_cpus=1,
        batch_size=BATCH,
    )
    n = write_jsonl(out, str(work / "ray.jsonl"))

    # ray.data.read_json: parsed rows (string ids, some with a question), no line numbers
    parsed = [json.loads(l) for l in lines if l.startswith("{") and '"id": "' in l]
    (work / "parsed.jsonl").write_text("\n".join(json.dumps(p) for p in parsed) + "\n")
    out2 = ray.data.read_json(str(work / "parsed.jsonl")).map_batches(
        ForkscoreActor,
        fn_constructor_kwargs={"model": str(model), "revision": "demo", "schema_file": str(schema)},
        compute=ray.data.ActorPoolStrategy(size=1),
        num_gpus=0,
        num_cpus=1,
        batch_size=BATCH,
    )
    n2 = write_jsonl(out2, str(work / "ray-parsed.jsonl"))
    ray.shutdown()

    cli = [json.loads(l) for l in (work / "cli.jsonl").read_text().splitlines()]
    got = [json.loads(l) for l in (work / "ray.jsonl").read_text().splitlines()]
    print(f"ray records: {n}, forkscore batch records: {len(cli)}")
    if [r["line"] for r in got] != [r["line"] for r in cli]:
        print("line order differs", [r["line"] for r in got])
        return 1
    bad = [(a["line"], a, b) for a, b in zip(got, cli) if without_timings(a) != without_timings(b)]
    for line, a, b in bad[:3]:
        print(f"line {line} differs:\n  ray: {a}\n  cli: {b}")
    if bad or n != len(cli):
        return 1
    by_id = {r["id"]: r for r in cli}
    parsed_got = [json.loads(l) for l in (work / "ray-parsed.jsonl").read_text().splitlines()]
    if n2 != len(parsed) or any(
        r["line"] != 0 or r["output"] != by_id[r["id"]]["output"] for r in parsed_got
    ):
        print("read_json path: records differ", parsed_got[:2])
        return 1
    print(f"read_json path: {n2} records, same outputs as forkscore batch (line 0: unknown)")
    print("ray recipe: all records equal forkscore batch --window 8's (timings aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
