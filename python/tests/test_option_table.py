"""One option set on every surface: the request options table (`forkscore.OPTIONS`, the engine's
`request_options::OPTIONS`) walked across the CLI (`forkscore score` and `forkscore batch`
flags), the service (`/v1/score`'s `options`), the Python package (keyword arguments of
`Scorer.score` / `decide_many` / `batch_records`) and batch lines (`Scorer.batch_records`, the
in-memory `forkscore batch`). Each option takes the same good value everywhere and refuses the
same bad value everywhere, naming the option (its name, or its flag on the command line)."""

import inspect
import json
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import forkscore
from conftest import EXAMPLE_SCHEMA, forkscore_bin

CONTEXT = "The payment service is down for every customer."

# name -> (good value, bad value); booleans' bad value is a string (not a boolean)
VALUES = {
    "scoring": ("literal", "best"),
    "mode": ("tree", "packed"),
    "field_batch_size": (2, 0),
    "temperature": (0.5, -1.0),
    "allow_uncalibrated": (True, "yes"),
    "max_input_tokens": (2048, 0),
    "include_prompt": (True, "yes"),
    "allowed_mass": (True, "yes"),
    "top_k": (3, 5000),
    "literal_value": ("greedy", "best"),
    "layout": ("fields-first", "schema-first"),
}
# options that need another one beside them
WITH = {"top_k": {"allowed_mass": True}}


def cli_args(spec, value):
    """The flags that set option `spec` to `value` on the command line."""
    flag = spec["flag"]
    if isinstance(value, bool):
        return [flag]
    if isinstance(value, str) and VALUES[spec["name"]][0] is True:
        return [f"{flag}={value}"]  # a value given to a flag that takes none
    extra = ["--allowed-mass"] if spec["name"] in WITH else []
    return extra + [f"{flag}={value}"]


def test_the_table_is_the_one_every_test_walks():
    names = [o["name"] for o in forkscore.OPTIONS]
    assert sorted(names) == sorted(VALUES), "an option without values in this test"
    for o in forkscore.OPTIONS:
        assert o["flag"] == "--" + o["name"].replace("_", "-")


def test_python_takes_every_option_by_name(scorer, example_schema):
    for method in (forkscore.Scorer.score, forkscore.Scorer.decide_many, forkscore.Scorer.batch_records):
        params = inspect.signature(method).parameters
        for o in forkscore.OPTIONS:
            assert o["name"] in params, f"{method.__name__} lacks {o['name']}"
    for o in forkscore.OPTIONS:
        good, bad = VALUES[o["name"]]
        kw = {**WITH.get(o["name"], {}), o["name"]: good}
        assert "fields" in scorer.score(CONTEXT, example_schema, **kw), o["name"]
        kw[o["name"]] = bad
        with pytest.raises((forkscore.Error, TypeError, ValueError)) as e:
            scorer.score(CONTEXT, example_schema, **kw)
        assert o["name"] in str(e.value) or o["flag"] in str(e.value), (o["name"], str(e.value))


def test_batch_lines_take_every_option(scorer, example_schema):
    line = json.dumps({"id": "a", "context": CONTEXT})
    for o in forkscore.OPTIONS:
        good, bad = VALUES[o["name"]]
        kw = {**WITH.get(o["name"], {}), o["name"]: good}
        [record] = scorer.batch_records([(1, line)], example_schema, **kw)
        assert "error" not in record or record["error"] is None, (o["name"], record)
        kw[o["name"]] = bad
        with pytest.raises((forkscore.Error, TypeError, ValueError)) as e:
            scorer.batch_records([(1, line)], example_schema, **kw)
        assert o["name"] in str(e.value) or o["flag"] in str(e.value), (o["name"], str(e.value))


def run(*args):
    return subprocess.run([forkscore_bin(), *args], capture_output=True, text=True, timeout=300)


def test_the_cli_takes_every_option_by_its_flag(demo_model, tmp_path):
    score = ["score", "--model", demo_model, "--schema-file", str(EXAMPLE_SCHEMA), "--context", CONTEXT]
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "a", "context": CONTEXT}) + "\n")
    for o in forkscore.OPTIONS:
        good, bad = VALUES[o["name"]]
        out = run(*score, *cli_args(o, good))
        assert out.returncode == 0, (o["name"], out.stderr)
        out = run(*score, *cli_args(o, bad))
        assert out.returncode != 0 and o["flag"] in out.stderr, (o["name"], out.stderr)
        batch = ["batch", "--model", demo_model, "--schema-file", str(EXAMPLE_SCHEMA),
                 "--input", str(lines), "--output", str(tmp_path / f"{o['name']}.jsonl")]
        out = run(*batch, *cli_args(o, good))
        assert out.returncode == 0, (o["name"], out.stderr)
        out = run(*batch, "--force", *cli_args(o, bad))
        assert out.returncode != 0 and o["flag"] in out.stderr, (o["name"], out.stderr)


@pytest.fixture(scope="module")
def server(demo_model):
    proc = subprocess.Popen([forkscore_bin(), "serve", "--model", demo_model, "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, url = time.monotonic() + 300, None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"forkscore serve exited with {proc.returncode}")
            found = re.search(r"serving on (http://\S+?)/? ", line)
            url = found.group(1) if found else None
        assert url, "forkscore serve printed no address"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()


def post(url, body):
    req = urllib.request.Request(url + "/v1/score", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_service_takes_every_option_by_name(server, example_schema):
    for o in forkscore.OPTIONS:
        good, bad = VALUES[o["name"]]
        options = {**WITH.get(o["name"], {}), o["name"]: good}
        status, body = post(server, {"context": CONTEXT, "schema": example_schema, "options": options})
        assert status == 200, (o["name"], body)
        options[o["name"]] = bad
        status, body = post(server, {"context": CONTEXT, "schema": example_schema, "options": options})
        assert status == 400 and f"options.{o['name']}" in json.dumps(body), (o["name"], body)
