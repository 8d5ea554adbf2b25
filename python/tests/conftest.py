"""Shared fixtures: the `forkscore` binary (FORKSCORE_BIN, default the cargo target dir's debug
build), a demo checkpoint it writes once per session, and one Scorer loaded from it."""

import json
import os
import subprocess
from pathlib import Path

import pytest

import forkscore

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SCHEMA = REPO / "fixtures" / "examples" / "parallel_schema.json"
TIMING_KEYS = ("timings_ms",)


def forkscore_bin() -> str:
    if os.environ.get("FORKSCORE_BIN"):
        return os.environ["FORKSCORE_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return str(target / "debug" / "forkscore")


def run_cli(*args: str) -> str:
    out = subprocess.run(
        [forkscore_bin(), *args], check=True, capture_output=True, text=True, timeout=300
    )
    return out.stdout


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("models") / "demo-qwen2.5"
    run_cli("demo-model", str(folder))
    return str(folder)


@pytest.fixture(scope="session")
def scorer(demo_model) -> forkscore.Scorer:
    return forkscore.Scorer.load(demo_model, "demo")


@pytest.fixture(scope="session")
def example_schema() -> dict:
    return json.loads(EXAMPLE_SCHEMA.read_text())


def same_build(commit):
    """A `forkscore_commit` without its `-dirty` mark: the CLI and the wheel may be built at the
    same commit, one of them while the work tree had uncommitted edits (never in CI's clean clone)."""
    return commit.removesuffix("-dirty") if isinstance(commit, str) else commit


def without_timings(value):
    """A result or record with its wall-clock timings removed (everything else is deterministic)."""
    if isinstance(value, dict):
        return {k: (same_build(v) if k == "forkscore_commit" else without_timings(v))
                for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value
