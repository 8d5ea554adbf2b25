"""forkscore.Scorer on the demo checkpoint: result shape, parity with the CLI, typed errors,
decide_many, and the GIL released while scoring."""

import json
import threading
import time
from pathlib import Path

import pytest

import forkscore
from conftest import EXAMPLE_SCHEMA, run_cli, without_timings

CONTEXT = (
    "Our production payment service is completely down for every customer, "
    "and no one can complete a purchase."
)


def test_score_has_the_cli_result_shape(scorer, example_schema):
    result = scorer.score(CONTEXT, example_schema)
    assert list(result) == ["output", "fields", "temperature", "telemetry", "provenance"]
    assert list(result["output"]) == list(example_schema)
    for name, field in result["fields"].items():
        assert result["output"][name] == field["value"]
        assert abs(sum(field["scores"].values()) - 1.0) < 1e-9
    assert result["provenance"]["model_id"]
    assert result["provenance"]["revision"] == "demo"
    assert result["provenance"]["mode"] == "parallel"


def test_score_equals_the_cli_output(scorer, demo_model, example_schema):
    cli = json.loads(
        run_cli(
            "score", "--model", demo_model, "--revision", "demo",
            "--schema-file", str(EXAMPLE_SCHEMA), "--context", CONTEXT,
        )
    )
    py = scorer.score(CONTEXT, example_schema)
    assert py["output"] == cli["output"]
    for name in cli["fields"]:
        assert py["fields"][name]["scores"] == cli["fields"][name]["scores"]  # exact floats
    assert without_timings(py) == without_timings(cli)


def test_options_are_keyword_arguments(scorer, demo_model, example_schema):
    cli = json.loads(
        run_cli(
            "score", "--model", demo_model, "--revision", "demo",
            "--schema-file", str(EXAMPLE_SCHEMA), "--context", CONTEXT,
            "--mode", "independent", "--temperature", "0.5", "--include-prompt",
        )
    )
    py = scorer.score(
        CONTEXT, example_schema, mode="independent", temperature=0.5, include_prompt=True
    )
    assert without_timings(py) == without_timings(cli)
    assert py["temperature"]["value"] == 0.5


def test_schema_as_json_text_or_dict(scorer, example_schema):
    a = scorer.score(CONTEXT, example_schema)
    b = scorer.score(CONTEXT, EXAMPLE_SCHEMA.read_text())
    assert without_timings(a) == without_timings(b)


def test_bad_schema_raises_schema_error_with_the_json_path(scorer):
    with pytest.raises(forkscore.SchemaError) as e:
        scorer.score(CONTEXT, {"risk": {"type": "enum", "choices": ["low", 2]}})
    assert e.value.path == "risk.choices[1]"
    assert "risk.choices[1]" in str(e.value)
    assert e.value.kind == "invalid_schema"
    assert isinstance(e.value, forkscore.Error)
    with pytest.raises(forkscore.SchemaError) as e:
        scorer.score(CONTEXT, '{"a": {"type": "enum", "choices": ["x"], "choices": ["y"]}}')
    assert e.value.path == "a"  # a JSON text keeps its duplicate keys for the strict parser
    assert "duplicate key `choices`" in e.value.rule
    with pytest.raises(forkscore.SchemaError) as e:
        scorer.score(CONTEXT, {"a": {"type": "enum", "choices": [float("nan")]}})
    assert e.value.path == "<root>"


def test_missing_model_folder_raises_model_load_error(tmp_path):
    with pytest.raises(forkscore.ModelLoadError) as e:
        forkscore.Scorer.load(str(tmp_path / "no-such-model"), "x")
    assert isinstance(e.value, forkscore.Error)
    assert e.value.kind == "model_load"


def test_a_folder_without_revision_is_recorded_as_unlabelled(demo_model):
    scorer = forkscore.Scorer.load(demo_model)
    assert scorer.provenance["revision"] == "unlabelled"


def test_bad_device_raises_options_error(demo_model):
    with pytest.raises(forkscore.OptionsError, match="device"):
        forkscore.Scorer.load(demo_model, "demo", device="tpu")


def test_empty_context_raises_empty_context(scorer, example_schema):
    with pytest.raises(forkscore.EmptyContext) as e:
        scorer.score("", example_schema)
    assert isinstance(e.value, forkscore.ContextError)
    assert e.value.kind == "empty_context"


def test_too_many_tokens(scorer, example_schema):
    with pytest.raises(forkscore.TooManyTokens) as e:
        scorer.score(CONTEXT, example_schema, max_input_tokens=20)
    assert e.value.kind == "too_many_tokens"
    assert isinstance(e.value, forkscore.ContextError)
    # over the byte bound: refused before tokenizing, same exception
    with pytest.raises(forkscore.TooManyTokens):
        scorer.score("x" * 10_000, example_schema, max_input_tokens=20)


def test_bad_options_raise_options_error(scorer, example_schema):
    with pytest.raises(forkscore.OptionsError, match="mode"):
        scorer.score(CONTEXT, example_schema, mode="fast")
    with pytest.raises(forkscore.OptionsError, match="max-input-tokens"):
        scorer.score(CONTEXT, example_schema, max_input_tokens=0)
    with pytest.raises(forkscore.OptionsError, match="temperature"):
        scorer.score(CONTEXT, example_schema, temperature=-1.0)


def test_decide_many_returns_results_and_exceptions_in_order(scorer, example_schema):
    contexts = [CONTEXT, "", "A single user cannot log in.", "x" * 10_000]
    results = scorer.decide_many(contexts, example_schema, max_input_tokens=1000)
    assert len(results) == 4
    assert isinstance(results[1], forkscore.EmptyContext)
    assert isinstance(results[3], forkscore.TooManyTokens)
    for i in (0, 2):
        single = scorer.score(contexts[i], example_schema, max_input_tokens=1000)
        assert results[i]["output"] == single["output"]
        for name in single["fields"]:
            assert results[i]["fields"][name]["scores"] == pytest.approx(
                single["fields"][name]["scores"], abs=1e-5
            )
        assert results[i]["provenance"] == single["provenance"]
    with pytest.raises(forkscore.SchemaError):
        scorer.decide_many(contexts, {})


def test_other_threads_run_while_scoring(scorer, example_schema):
    """The GIL is released during scoring: the main thread keeps running (and records times)
    inside the interval in which a worker thread is in `decide_many`."""
    contexts = [CONTEXT * 5 + f" ({i})" for i in range(8)]
    window = {}

    def work():
        window["start"] = time.perf_counter()
        scorer.decide_many(contexts, example_schema, mode="independent")
        window["end"] = time.perf_counter()

    worker = threading.Thread(target=work)
    stamps = []
    worker.start()
    while worker.is_alive():
        stamps.append(time.perf_counter())
    worker.join()
    start, end = window["start"], window["end"]
    assert end - start > 0.05, "scoring too short to tell"
    first_half = [t for t in stamps if start < t < start + (end - start) / 2]
    # with the GIL held, this thread could not run until decide_many returned
    assert len(first_half) > 100, (end - start, len(first_half))
    print(f"decide_many took {end - start:.3f} s; this thread ran {len(first_half)} loops in its first half")


def test_provenance_and_stub_files(scorer):
    assert scorer.provenance["revision"] == "demo"
    assert "Scorer(" in repr(scorer)
    package = Path(forkscore.__file__).parent
    stub = (package / "__init__.pyi").read_text()
    assert (package / "py.typed").exists()
    for name in forkscore.__all__:
        assert name in stub, name
