"""The official `openai` client against `forkscore serve` on the demo model: a chat completion
with a JSON-schema response format returns the decision as the assistant message's JSON content
(with the `forkscore` extension field and log-probs), `models.list()` names the served model,
and refusals arrive as the client's typed errors.

Self-contained (no fixture of conftest.py): it needs only the `forkscore` binary (FORKSCORE_BIN,
default the cargo target dir's debug build) and the `openai` package."""

import enum
import json
import math
import os
import re
import subprocess
import time
from pathlib import Path

import openai
import pydantic
import pytest

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {
    "type": "object",
    "properties": {
        "risk_level": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
        "requires_review": {"type": "boolean"},
    },
    "required": ["risk_level", "requires_review"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "incident", "schema": SCHEMA, "strict": True}}
MESSAGES = [
    {"role": "system", "content": "Classify the incident."},
    {"role": "user", "content": "The payment service is down for every customer."},
]


def binary() -> str:
    if os.environ.get("FORKSCORE_BIN"):
        return os.environ["FORKSCORE_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return str(target / "debug" / "forkscore")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`forkscore serve` on a fresh demo model and a free port: (base URL, model id)."""
    folder = tmp_path_factory.mktemp("openai") / "demo-qwen2.5"
    subprocess.run([binary(), "demo-model", str(folder)], check=True, capture_output=True, timeout=300)
    proc = subprocess.Popen(
        [binary(), "serve", "--model", str(folder), "--revision", "demo", "--port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 300
        url = None
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


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_models_list_names_the_served_model(client):
    models = client.models.list().data
    assert len(models) == 1
    assert models[0].object == "model"
    assert models[0].owned_by == "forkscore"
    assert models[0].id  # the served model's provenance id
    assert models[0].created > 1_600_000_000


def test_a_chat_completion_is_the_decision_as_json_content(client, model):
    done = client.chat.completions.create(
        model=model, messages=MESSAGES, response_format=RESPONSE_FORMAT,
        logprobs=True, top_logprobs=4,
    )
    assert done.object == "chat.completion"
    assert done.model == model
    choice = done.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    decision = json.loads(choice.message.content)
    assert list(decision) == ["risk_level", "requires_review"]
    assert decision["risk_level"] in SCHEMA["properties"]["risk_level"]["enum"]
    assert isinstance(decision["requires_review"], bool)
    # the extension field: the /v1/score result, probabilities per field and choice
    extra = done.model_extra["forkscore"]
    assert extra["output"] == decision
    for name, field in extra["fields"].items():
        assert math.isclose(sum(field["scores"].values()), 1.0, rel_tol=1e-6), name
    # logprobs: one entry per field, the chosen value first among its alternatives
    entries = choice.logprobs.content
    assert [e.token for e in entries] == [
        decision["risk_level"], json.dumps(decision["requires_review"])
    ]
    for entry, (name, field) in zip(entries, extra["fields"].items()):
        assert math.isclose(entry.logprob, math.log(field["scores"][entry.token]), rel_tol=1e-9)
        assert len(entry.top_logprobs) == min(4, len(field["choices"]))
        assert entry.top_logprobs[0].token == entry.token, name
    assert done.usage.completion_tokens == 0
    assert done.usage.prompt_tokens == done.usage.total_tokens > 0


def test_the_same_request_twice_is_the_same_decision(client, model):
    first, second = (
        client.chat.completions.create(model=model, messages=MESSAGES, response_format=RESPONSE_FORMAT)
        for _ in range(2)
    )
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.id != second.id


class Risk(str, enum.Enum):
    low = "low"
    high = "high"


class Incident(pydantic.BaseModel):
    risk: Risk  # pydantic writes an Enum class as a $ref into $defs
    requires_review: bool = pydantic.Field(description="Whether a human must look now.")


def test_parse_with_a_pydantic_model_returns_the_parsed_decision(client, model):
    done = client.chat.completions.parse(model=model, messages=MESSAGES, response_format=Incident)
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, Incident)
    assert parsed.model_dump(mode="json") == done.model_extra["forkscore"]["output"]


def test_refusals_are_the_clients_typed_errors(client, model):
    with pytest.raises(openai.NotFoundError) as wrong_model:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, response_format=RESPONSE_FORMAT)
    assert wrong_model.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as text:
        client.chat.completions.create(model=model, messages=MESSAGES)
    assert text.value.code == "missing_response_format"
    free_text = {"type": "json_schema", "json_schema": {"name": "note", "schema": {
        "type": "object", "properties": {"note": {"type": "string"}}}}}
    with pytest.raises(openai.BadRequestError) as schema:
        client.chat.completions.create(model=model, messages=MESSAGES, response_format=free_text)
    assert schema.value.code == "invalid_schema"
    assert schema.value.param == "response_format.json_schema.schema.properties.note"
    with pytest.raises(openai.BadRequestError) as stream:
        client.chat.completions.create(
            model=model, messages=MESSAGES, response_format=RESPONSE_FORMAT, stream=True)
    assert stream.value.code == "unsupported_parameter"
