"""What each item asks, against a real llama-server (processor/local/llm/: a random-weight llama with
MiniLM's WordPiece vocabulary), through the ``openai`` engine with ``server=llamacpp``.

* rows with different settings in one batch (two JSON schemas, two choice lists, a stop string,
  sampling settings, logprobs, none at all) all complete, and every output is valid against its own
  row's schema or choice list: the server ran each row under its own constraint;
* rows with different seeds at temperature 0, and rows with one seed at temperature 1, give the same
  outputs on a second run (grouped into multi-prompt requests one run, one request per item the other);
* one batch with a row holding an id outside the vocabulary and a row longer than a slot's context:
  llama-server refuses the multi-prompt request (400), the engine splits it, and only those two rows
  fail, each with the server's status and message; the others complete.

No broker: the engine runs batches built here. One server for the module (4 slots of 256 positions),
prompts of 8 ids and at most 32 output tokens keep it to seconds on 2 cores. The stand-in server of
tests/engines/ keeps the paths a real server cannot be made to produce (5xx, timeouts).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from processor.engines.base import ItemResult, make_engine
from processor.local.llm.build import build_server
from processor.local.llm.model import ensure_model
from processor.local.llm.server import ServerInfo, ServerSettings, start_server, stop_server
from processor.wire.records import BatchRecord, TokenItemRecord
from processor.wire.request import GenerationRequest
from tests.engines.test_openai_http import batch as engine_test_batch
from tests.engines.test_openai_http import item
from tests.local.test_llm_server import llm_home  # noqa: F401 (the module's fixture: a temporary home)

pytestmark = pytest.mark.llm

MODEL = "tiny-llama"
SLOT_TOKENS = 256
VOCABULARY = 30522
"""MiniLM's WordPiece vocabulary, the model's: id 30522 and up are refused."""

COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"]}
SIZE = {"type": "object", "properties": {"size": {"enum": ["small", "large", "huge"]}}, "required": ["size"]}


@pytest.fixture(scope="module")
def llm(llm_home: Path) -> Iterator[ServerInfo]:  # noqa: F811 (the imported fixture)
    settings = ServerSettings(slots=4, ctx_tokens=4 * SLOT_TOKENS, threads=1)
    info = start_server(build_server().binary, ensure_model(), name="pytest-llm-requests", settings=settings)
    yield info
    stop_server(info.name)


def prompt(rng: random.Random, length: int = 8) -> list[int]:
    """Ordinary WordPiece ids (1,000 and up: words, not specials)."""
    return [rng.randrange(1000, 29000) for _ in range(length)]


def batch(*items: TokenItemRecord) -> BatchRecord:
    """A batch of the model's items (the engine tests' builders: the model is all that differs)."""
    return replace(engine_test_batch(*items), model=MODEL)


def run(url: str, work: BatchRecord, **options: str) -> dict[str, ItemResult]:
    engine = make_engine("openai", {"url": url, "server": "llamacpp", "timeout_s": "30", **options})
    try:
        return {r.item_id: r for r in engine.run(work)}
    finally:
        engine.close()


def test_rows_with_different_settings_complete_each_valid_against_its_own_constraint(llm: ServerInfo) -> None:
    rng = random.Random(5)
    rows = {
        "colour-1": GenerationRequest(json_schema=json.dumps(COLOUR)),
        "colour-2": GenerationRequest(json_schema=json.dumps(COLOUR)),
        "colour-seeded": GenerationRequest(json_schema=json.dumps(COLOUR), temperature=1.0, seed=3),
        "size-1": GenerationRequest(json_schema=json.dumps(SIZE)),
        "size-2": GenerationRequest(json_schema=json.dumps(SIZE), top_k=20, top_p=0.9),
        "yes-no": GenerationRequest(choices=("yes", "no")),
        "greek": GenerationRequest(choices=("alpha", "beta", "gamma")),
        "greek-hot": GenerationRequest(choices=("alpha", "beta", "gamma"), temperature=1.0, seed=9),
        "probs": GenerationRequest(logprobs=2),
        "plain": None,
    }
    work = batch(*(item(name, prompt(rng), 32, request) for name, request in rows.items()))
    results = run(llm.url, work, requests="settings", concurrency="4")

    assert {name: (r.status, r.reason) for name, r in results.items()} == {
        name: ("ok", None) for name in rows
    }
    for name, request in rows.items():
        text = results[name].output.decode()
        if request is not None and request.json_schema is not None:
            jsonschema.validate(json.loads(text), json.loads(request.json_schema))
        elif request is not None and request.choices:
            assert text in request.choices, (name, text)
    probs = json.loads(results["probs"].output)
    assert set(probs) == {"text", "finish_reason", "output_tokens", "logprobs"}
    assert (
        probs["output_tokens"] == results["probs"].output_tokens == 32 and probs["finish_reason"] == "length"
    )
    # llama.cpp's shape: one entry per generated token, each with the asked-for alternatives
    assert len(probs["logprobs"]["content"]) == 32
    assert all(len(t["top_logprobs"]) == 2 for t in probs["logprobs"]["content"])


def test_seeded_rows_reproduce_on_a_second_run(llm: ServerInfo) -> None:
    rng = random.Random(8)
    rows = [
        ("greedy-seed-1", GenerationRequest(temperature=0.0, seed=1)),
        ("greedy-seed-2", GenerationRequest(temperature=0.0, seed=2)),
        ("greedy-seed-3", GenerationRequest(temperature=0.0, seed=3)),
        ("hot-a", GenerationRequest(temperature=1.0, seed=7)),
        ("hot-b", GenerationRequest(temperature=1.0, seed=7)),
        ("hot-other-seed", GenerationRequest(temperature=1.0, seed=8)),
    ]
    work = batch(*(item(name, prompt(rng), 12, request) for name, request in rows))
    first = run(llm.url, work, requests="settings")
    second = run(llm.url, work, requests="item")

    assert all(r.status == "ok" and r.output_tokens > 0 for r in first.values()), first
    assert {k: r.output for k, r in second.items()} == {k: r.output for k, r in first.items()}


def test_rows_the_server_refuses_are_rejected_alone_with_its_status_and_message(llm: ServerInfo) -> None:
    rng = random.Random(13)
    ids = {f"row-{n}": prompt(rng) for n in range(8)}
    ids["row-2"] = [*ids["row-2"][:4], VOCABULARY + 5, *ids["row-2"][4:]]  # not a token of the model
    ids["row-6"] = prompt(rng, SLOT_TOKENS + 40)  # longer than a slot's context
    work = batch(*(item(name, p, 3, GenerationRequest(seed=1)) for name, p in ids.items()))
    results = run(llm.url, work, requests="settings")

    assert {name: r.status for name, r in results.items()} == {
        name: "rejected" if name in ("row-2", "row-6") else "ok" for name in ids
    }
    assert not any(r.retriable for r in results.values())  # a refusal is the prompt's: never run again
    isolated = "(not retried) (isolated from a request of 8 prompts)"
    assert results["row-2"].reason == f"HTTP 400: Prompt contains invalid tokens {isolated}"
    reason = results["row-6"].reason or ""
    assert reason.startswith(f"HTTP 400: request ({SLOT_TOKENS + 40} tokens) exceeds the available")
    assert reason.endswith(isolated)
    assert all(r.output_tokens == 3 for r in results.values() if r.status == "ok")
