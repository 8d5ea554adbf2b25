"""forkscore.ray.ForkscoreActor without Ray: its batch function gives exactly the records of
`forkscore batch` (same keys, error kinds and provenance; timings aside)."""

import json
import shutil

import pytest

from conftest import EXAMPLE_SCHEMA, run_cli, without_timings
from forkscore.ray import ForkscoreActor, batch_lines, numbered_lines

LINES = [
    {"id": "a", "context": "The payment service is down for every customer."},
    {"id": "b", "context": "One user forgot their password."},
    {"id": 3, "context": "Is the search page slow?", "question": "Is this urgent?"},
    {"id": "c", "context": "Disk full.", "schema": {"urgent": {"type": "boolean"}}},
    {"id": "a", "context": "A repeated id."},
    {"id": "d", "context": ""},
    {"id": "e", "context": "x", "schema": {"bad": {"type": "enum", "choices": []}}},
]


def input_bytes() -> bytes:
    text = "\n".join(json.dumps(line) for line in LINES)
    # a blank line, a line that is not JSON, and a line that is not UTF-8
    return (text + "\n\nnot json\n").encode() + b'{"id": "z", "context": "\xff"}\n'


@pytest.fixture(scope="module")
def cli_records(tmp_path_factory, demo_model):
    folder = tmp_path_factory.mktemp("batch")
    shutil.copy(EXAMPLE_SCHEMA, folder / "schema.json")
    (folder / "in.jsonl").write_bytes(input_bytes())
    run_cli(
        "batch", "--model", demo_model, "--revision", "demo", "--quiet",
        "--input", str(folder / "in.jsonl"), "--output", str(folder / "out.jsonl"),
        "--schema-file", str(folder / "schema.json"),
    )
    lines = (folder / "out.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], folder


@pytest.fixture(scope="module")
def actor(cli_records, demo_model):
    _, folder = cli_records
    return ForkscoreActor(
        model=demo_model, revision="demo", schema_file=str(folder / "schema.json")
    )


def test_actor_records_equal_forkscore_batch(cli_records, actor):
    expected, _ = cli_records
    batch = {k: [row[k] for row in numbered_lines(input_bytes())] for k in ("line", "text")}
    out = actor(batch)
    assert list(out) == ["record"]
    got = [json.loads(r) for r in out["record"]]
    assert without_timings(got) == without_timings(expected)
    kinds = [r["error"]["kind"] for r in got if "error" in r]
    assert kinds == ["duplicate_id", "empty_context", "invalid_schema", "invalid_json", "invalid_utf8"]
    assert got[0]["provenance"]["batch_mode"] == "grouped"
    assert got[0]["provenance"]["default_schema_hash"]


def test_actor_takes_parsed_rows_like_read_json(cli_records, actor):
    """Rows as `ray.data.read_json` gives them: one column per key, None where a row lacks it."""
    expected, _ = cli_records
    rows = LINES[:3]
    keys = ["id", "context", "question"]
    batch = {k: [row.get(k) for row in rows] for k in keys}
    got = [json.loads(r) for r in actor(batch)["record"]]
    assert [r["line"] for r in got] == [0, 0, 0]  # no line column: unknown
    for g, e in zip(got, expected[:3]):
        assert g["output"] == e["output"]
        assert g["fields"] == e["fields"]
        assert without_timings(g["provenance"]) == without_timings(e["provenance"])


def test_batch_lines_numbers_and_plain_values():
    rows = numbered_lines(b'\xef\xbb\xbf{"id": 1}\n\n  \n{"id": 2}\n', "f.jsonl")
    assert [(r["line"], r["text"]) for r in rows] == [(1, b'{"id": 1}'), (4, b'{"id": 2}')]
    assert batch_lines({"line": [7], "text": ['{"id": 1}']}) == [(7, '{"id": 1}')]
    pairs = batch_lines({"id": ["x"], "context": ["c"], "schema": [{"a": {"type": "boolean", "description": None}}]})
    assert pairs == [(0, '{"id": "x", "context": "c", "schema": {"a": {"type": "boolean"}}}')]
