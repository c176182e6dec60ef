"""What each item asks, through the ``openai`` engine to a stand-in server (fake_completions.py):
bodies per item, grouping by settings, rejections without a request, the JSON output, and one bad
row failing alone while a server that is down fails a request at once.

tests/local/test_llm_requests.py runs the same against a real llama-server.
"""

from __future__ import annotations

import json
import random
import socket
from dataclasses import replace

import pytest

from processor.engines.openai_http import OpenAICompletionsEngine, parse_options
from processor.wire.records import BatchRecord
from processor.wire.request import GenerationRequest
from tests.engines.fake_completions import FakeCompletions, Reply
from tests.engines.test_openai_http import batch, item

SCHEMA = '{"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}, "required": ["c"]}'
BAD_ID = 666
"""The stand-in refuses any request holding this id, as llama.cpp refuses an id outside its vocabulary."""


def engine(
    server: FakeCompletions, sleeps: list[float] | None = None, /, **options: str
) -> OpenAICompletionsEngine:
    settings = parse_options({"url": server.url, "backoff_ms": "1", "backoff_max_ms": "2", **options})
    recorded = sleeps if sleeps is not None else []
    return OpenAICompletionsEngine(settings, sleep=recorded.append, rng=random.Random(3))


def run(server: FakeCompletions, work: BatchRecord, /, **options: str) -> list[tuple[str, str, str]]:
    e = engine(server, **options)
    try:
        return [(r.item_id, r.status, r.reason or r.output.decode()) for r in e.run(work)]
    finally:
        e.close()


def bodies(server: FakeCompletions) -> list[dict[str, object]]:
    """The received bodies without their prompts, ordered by the prompts (requests run concurrently)."""
    received = sorted(server.received, key=lambda r: json.dumps(r.body["prompt"]))
    return [
        {k: v for k, v in r.body.items() if k != "prompt"} | {"n_prompts": len(r.body["prompt"])}
        for r in received
    ]


# --------------------------------------------------------------------------------------------------
# Bodies and grouping


def test_each_items_request_goes_in_its_own_body(server: FakeCompletions) -> None:
    work = batch(
        item("plain", [1]),
        item("schema", [2], request=GenerationRequest(json_schema=SCHEMA, seed=5)),
        item("choice", [3], request=GenerationRequest(choices=("yes", "no"), temperature=0.8)),
    )
    assert [status for _, status, _ in run(server, work, server="llamacpp")] == ["ok", "ok", "ok"]

    base = {"model": "m", "max_tokens": 8, "n": 1, "stream": False, "n_prompts": 1}
    assert bodies(server) == [
        base | {"temperature": 0.0},
        base | {"temperature": 0.0, "seed": 5, "json_schema": json.loads(SCHEMA)},
        base | {"temperature": 0.8, "grammar": 'root ::= "yes" | "no"'},
    ]


def test_requests_settings_puts_equal_settings_in_one_request_and_others_apart(
    server: FakeCompletions,
) -> None:
    red = GenerationRequest(json_schema=SCHEMA, seed=1)
    work = batch(
        item("a", [1], request=red),
        item("b", [2], request=GenerationRequest(choices=("x", "y"))),
        item("c", [3], request=replace(red)),  # equal, not the same object
        item("d", [4]),
        item("e", [5], request=GenerationRequest()),  # asks nothing: the same body as no request
        item("f", [6], budget=3, request=red),  # another budget: another request
    )
    results = run(server, work, server="vllm", requests="settings")

    assert [(i, s) for i, s, _ in results] == [(i, "ok") for i in "abcdef"]
    assert sorted(r.body["prompt"] for r in server.received) == [[[1], [3]], [[2]], [[4], [5]], [[6]]]
    # each prompt's choice came back to its own item
    assert [o for _, _, o in results] == [f"sum={n} n=1 max={3 if n == 6 else 8}" for n in range(1, 7)]


def test_budget_mode_sends_the_same_groups_one_after_the_other(server: FakeCompletions) -> None:
    server.hold_s = 0.05
    work = batch(*(item(f"i{n}", [n], request=GenerationRequest(seed=n % 3)) for n in range(1, 7)))
    assert all(s == "ok" for _, s, _ in run(server, work, requests="budget"))
    assert len(server.received) == 3 and server.most_in_flight == 1


def test_an_item_its_server_cannot_be_told_is_rejected_and_the_rest_are_sent(server: FakeCompletions) -> None:
    work = batch(
        item("a", [1]), item("regex", [2], request=GenerationRequest(regex="[a-z]+")), item("c", [3])
    )
    results = run(server, work, server="llamacpp", requests="settings")

    assert [(i, s) for i, s, _ in results] == [("a", "ok"), ("regex", "rejected"), ("c", "ok")]
    assert "regex cannot be sent to server=llamacpp" in results[1][2]
    assert [r.body["prompt"] for r in server.received] == [[[1], [3]]]


def test_an_adapter_batch_sends_the_base_model_name_and_the_adapter_in_its_field(
    server: FakeCompletions,
) -> None:
    tone = GenerationRequest(adapter="tone")
    work = replace(batch(item("a", [1], request=tone)), model="m@tone")  # Batch.model is the serving key
    run(server, work, server="sglang")
    assert server.received[0].body["model"] == "m" and server.received[0].body["lora_path"] == "tone"
    run(server, work, server="vllm")
    assert server.received[1].body["model"] == "tone"


# --------------------------------------------------------------------------------------------------
# Output


def test_an_item_asking_for_logprobs_gets_the_json_output(server: FakeCompletions) -> None:
    work = batch(item("text", [1, 2]), item("probs", [3], request=GenerationRequest(logprobs=2)))
    results = run(server, work)

    assert results[0][2] == "sum=3 n=2 max=8"
    assert json.loads(results[1][2]) == {
        "text": "sum=3 n=1 max=8",
        "finish_reason": "stop",
        "output_tokens": 1,
        "logprobs": None,
    }
    assert next(r.body for r in server.received if r.body["prompt"] == [[3]])["logprobs"] == 2


def test_output_json_gives_every_item_the_json_object(server: FakeCompletions) -> None:
    (result,) = run(server, batch(item("a", [1, 2, 3], budget=2)), output="json")
    assert json.loads(result[2]) == {
        "text": "sum=6 n=3 max=2",
        "finish_reason": "length",
        "output_tokens": 2,
        "logprobs": None,
    }


# --------------------------------------------------------------------------------------------------
# One bad row fails alone


@pytest.mark.parametrize("status", [400, 413, 422])
def test_one_refused_row_of_a_multi_prompt_request_fails_alone(server: FakeCompletions, status: int) -> None:
    server.refuse = {BAD_ID: status}
    work = batch(*(item(f"i{n}", [n + 1, BAD_ID] if n == 5 else [n + 1]) for n in range(8)))
    results = run(server, work, requests="settings")

    assert [s for _, s, _ in results] == ["ok"] * 5 + ["rejected"] + ["ok"] * 2
    reason = results[5][2]
    assert reason == (
        f"HTTP {status}: token {BAD_ID} refused (not retried) (isolated from a request of 8 prompts)"
    )
    assert len(server.received) <= 7  # 1 + 2 per halving of 8
    assert [[6, BAD_ID]] in [r.body["prompt"] for r in server.received]
    assert [o for _, s, o in results if s == "ok"] == [f"sum={n + 1} n=1 max=8" for n in range(8) if n != 5]


def test_a_refused_item_of_its_own_request_says_the_servers_message(server: FakeCompletions) -> None:
    server.refuse = {BAD_ID: 400}
    results = run(server, batch(item("a", [1]), item("bad", [BAD_ID])))
    assert results[1] == (
        "bad",
        "rejected",
        f"HTTP 400: token {BAD_ID} refused (not retried)",
    )
    assert results[0][1] == "ok"


def test_a_server_failing_a_multi_prompt_request_with_5xx_is_not_split(server: FakeCompletions) -> None:
    server.script = [Reply(status=503)] * 3
    sleeps: list[float] = []
    e = engine(server, sleeps, requests="settings", retries="2")
    results = e.run(batch(*(item(f"i{n}", [n + 1]) for n in range(6))))

    assert len(server.received) == 3 and all(len(r.body["prompt"]) == 6 for r in server.received)
    assert [r.status for r in results] == ["failed"] * 6
    assert "HTTP 503: scripted 503" in (results[0].reason or "") and "3 attempt(s)" in (
        results[0].reason or ""
    )


def test_a_server_that_is_down_fails_a_multi_prompt_request_at_once_without_splitting() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the block ends
    sleeps: list[float] = []
    settings = parse_options(
        {"url": f"http://127.0.0.1:{port}", "requests": "settings", "retries": "1", "backoff_ms": "1"}
    )
    results = OpenAICompletionsEngine(settings, sleep=sleeps.append).run(
        batch(*(item(f"i{n}", [n + 1]) for n in range(8)))
    )

    assert [r.status for r in results] == ["failed"] * 8
    assert all(
        "ConnectionRefusedError" in (r.reason or "") and "2 attempt(s)" in (r.reason or "") for r in results
    )
    assert len(sleeps) == 1  # one request's retries: no halves were sent


def test_a_vllm_style_error_body_gives_its_message(server: FakeCompletions) -> None:
    server.script = [
        Reply(status=400, raw=json.dumps({"object": "error", "message": "max_model_len is 8"}).encode())
    ]
    (result,) = run(server, batch(item("a", [1])))
    assert result[2].endswith("HTTP 400: max_model_len is 8 (not retried)")


def test_an_error_body_without_a_message_is_quoted_as_it_is(server: FakeCompletions) -> None:
    server.script = [Reply(status=422, raw=b"<html>unprocessable</html>")]
    (result,) = run(server, batch(item("a", [1])))
    assert result[2].endswith("HTTP 422: <html>unprocessable</html> (not retried)")
