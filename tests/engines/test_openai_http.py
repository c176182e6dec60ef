"""The ``openai`` engine against a real HTTP server that speaks the ``/v1/completions`` shape.

The fake server (tests/engines/fake_completions.py) answers each prompt with ``sum=<sum of its ids>
n=<len> max=<max_tokens>``, so a test can tell which prompt a choice belongs to and catch a choice
mapped to the wrong item. Each test scripts the server's next replies (status, delay, shuffled or
dropped choices) and reads back the requests it received. Backoff sleeps are recorded, not slept;
jitter comes from a seeded RNG.

The mapping, retry and failure tests run the engine with ``requests=budget`` (several prompts in one
request: the mapping of choices to items is what they test); "One request per item" tests the
default, one prompt per request sent concurrently, against this server, and
tests/broker/test_llm_engine.py against a real llama.cpp server.
"""

from __future__ import annotations

import random
import socket

import pytest

from processor.engines.base import make_engine
from processor.engines.openai_http import OpenAICompletionsEngine, from_options, parse_options
from processor.wire.records import BatchRecord, TokenItemRecord, tokens_from_ids
from processor.wire.request import GenerationRequest
from tests.engines.fake_completions import FakeCompletions, Reply


def item(
    item_id: str, ids: list[int], budget: int | None = 8, request: GenerationRequest | None = None
) -> TokenItemRecord:
    return TokenItemRecord(
        item_id=item_id,
        model="m",
        shape=1,
        token_count=len(ids),
        tokens=tokens_from_ids(ids),
        produced_ms=0,
        output_budget=budget,
        request=request,
    )


def batch(*items: TokenItemRecord) -> BatchRecord:
    return BatchRecord(
        batch_id="b1",
        consumer="c1",
        model="m",
        shape=1,
        lane=0,
        padded_length=16,
        pad_multiple=8,
        created_ms=0,
        items=list(items),
    )


THREE = (item("a", [1, 2, 3]), item("b", [10, 20]), item("c", [100, 200, 300, 400]))


class Harness:
    """An engine on ``server`` whose sleeps are recorded and whose jitter is seeded; several prompts
    per request (``requests=budget``) unless ``options`` say otherwise."""

    def __init__(self, server: FakeCompletions, **options: str) -> None:
        self.sleeps: list[float] = []
        defaults = {"url": server.url, "requests": "budget", "backoff_ms": "10", "backoff_max_ms": "25"}
        settings = parse_options({**defaults, **options})
        self.engine = OpenAICompletionsEngine(settings, sleep=self.sleeps.append, rng=random.Random(7))


# --------------------------------------------------------------------------------------------------
# Mapping


def test_happy_path_sends_token_ids_and_maps_every_choice(server: FakeCompletions) -> None:
    results = Harness(server).engine.run(batch(*THREE))

    assert len(server.received) == 1
    sent = server.received[0].body
    assert sent["model"] == "m"  # the batch's model when the option is absent
    assert sent["prompt"] == [[1, 2, 3], [10, 20], [100, 200, 300, 400]]
    assert sent["max_tokens"] == 8 and sent["stream"] is False and sent["temperature"] == 0.0
    assert [r.item_id for r in results] == ["a", "b", "c"]
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert [r.output for r in results] == [b"sum=6 n=3 max=8", b"sum=30 n=2 max=8", b"sum=1000 n=4 max=8"]
    assert [r.output_tokens for r in results] == [3, 2, 4]
    assert not any(r.cache_hit for r in results)


def test_shuffled_choices_are_matched_by_index_not_position(server: FakeCompletions) -> None:
    server.script = [Reply(order="reversed")]
    results = Harness(server).engine.run(batch(*THREE))

    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert [r.output.split()[0] for r in results] == [b"sum=6", b"sum=30", b"sum=1000"]


def test_missing_choice_fails_that_item_only(server: FakeCompletions) -> None:
    server.script = [Reply(drop=(1,))]
    results = Harness(server).engine.run(batch(*THREE))

    assert [r.status for r in results] == ["ok", "failed", "ok"]
    assert results[1].output == b"" and results[1].output_tokens == 0
    assert "no choice with index 1" in (results[1].reason or "")


def test_duplicate_or_aborted_choices_fail_their_items(server: FakeCompletions) -> None:
    server.script = [Reply(duplicate=(0,), finish={2: "abort"})]
    results = Harness(server).engine.run(batch(*THREE))

    assert [r.status for r in results] == ["failed", "ok", "failed"]
    assert "more than one choice with index 0" in (results[0].reason or "")
    assert "abort" in (results[2].reason or "")


def test_model_option_overrides_the_batch_model(server: FakeCompletions) -> None:
    Harness(server, model="served-name").engine.run(batch(*THREE))
    assert server.received[0].body["model"] == "served-name"


def test_items_with_different_budgets_go_in_one_request_per_budget(server: FakeCompletions) -> None:
    items = (item("a", [1], 4), item("b", [2], 2), item("c", [3], 4), item("d", [4], None))
    results = Harness(server, max_tokens="16").engine.run(batch(*items))

    assert [(r.body["max_tokens"], r.body["prompt"]) for r in server.received] == [
        (4, [[1], [3]]),
        (2, [[2]]),
        (16, [[4]]),
    ]
    assert [r.output for r in results] == [
        b"sum=1 n=1 max=4",
        b"sum=2 n=1 max=2",
        b"sum=3 n=1 max=4",
        b"sum=4 n=1 max=16",
    ]


def test_budget_below_one_is_rejected_without_a_request(server: FakeCompletions) -> None:
    results = Harness(server).engine.run(batch(item("a", [1], 0), item("b", [2], 3)))

    assert [r.status for r in results] == ["rejected", "ok"]
    assert "output_budget=0" in (results[0].reason or "")
    assert server.prompts(0) == [[2]]


def test_output_tokens_without_token_ids_split_usage_and_trust_length(server: FakeCompletions) -> None:
    server.script = [Reply(token_ids=False)]
    # budget 3: "a" (3 ids) stops at length (exact: 3); "b" and "c" share usage's remaining 2 + 2.
    results = Harness(server).engine.run(
        batch(item("a", [1, 2, 3], 3), item("b", [5, 6], 3), item("c", [7, 8], 3))
    )

    assert [r.output_tokens for r in results] == [3, 2, 2]


def test_cached_tokens_in_usage_mean_cache_hit(server: FakeCompletions) -> None:
    server.script = [Reply(cached_tokens=16), Reply(cached_tokens=0)]
    harness = Harness(server)

    assert all(r.cache_hit for r in harness.engine.run(batch(*THREE)))
    assert not any(r.cache_hit for r in harness.engine.run(batch(*THREE)))


# --------------------------------------------------------------------------------------------------
# One request per item (the default)


def test_each_item_goes_in_a_request_of_its_own_and_keeps_its_order(server: FakeCompletions) -> None:
    results = from_options({"url": server.url}).run(batch(*THREE))

    assert sorted(r.body["prompt"] for r in server.received) == [
        [[1, 2, 3]],
        [[10, 20]],
        [[100, 200, 300, 400]],
    ]
    assert [r.item_id for r in results] == ["a", "b", "c"]
    assert [r.output for r in results] == [b"sum=6 n=3 max=8", b"sum=30 n=2 max=8", b"sum=1000 n=4 max=8"]
    assert [r.output_tokens for r in results] == [3, 2, 4]


def test_each_items_cached_tokens_are_its_own_requests_usage(server: FakeCompletions) -> None:
    server.cache = lambda prompt: len(prompt) - 1  # all but the last token, as llama.cpp reports a repeat
    results = Harness(server, requests="item").engine.run(batch(*THREE))

    assert [r.cached_tokens for r in results] == [2, 1, 3]
    assert all(r.cache_hit for r in results)


def test_llama_cpp_timings_cache_n_counts_when_usage_has_no_details(server: FakeCompletions) -> None:
    server.cache, server.cache_field = (lambda prompt: 1 if prompt[0] == 10 else 0), "timings"
    results = Harness(server, requests="item").engine.run(batch(*THREE))

    assert [(r.cached_tokens, r.cache_hit) for r in results] == [(0, False), (1, True), (0, False)]


def test_a_cached_count_above_the_prompt_is_held_to_the_prompt(server: FakeCompletions) -> None:
    server.script = [Reply(cached_tokens=99)]
    (result,) = Harness(server, requests="item").engine.run(batch(item("a", [1, 2, 3])))
    assert result.cached_tokens == 3


def test_without_usage_details_nothing_counts_as_cached(server: FakeCompletions) -> None:
    results = Harness(server, requests="item").engine.run(batch(*THREE))
    assert [(r.cached_tokens, r.cache_hit) for r in results] == [(0, False)] * 3


def test_a_request_of_several_prompts_reports_no_cached_tokens_per_item(server: FakeCompletions) -> None:
    """Its usage is the request's (llama.cpp: the first prompt's), so no item gets a count; the old
    per-request flag stays."""
    server.script = [Reply(cached_tokens=16)]
    results = Harness(server, requests="budget").engine.run(batch(*THREE))
    assert [(r.cached_tokens, r.cache_hit) for r in results] == [(0, True)] * 3


def test_requests_overlap_up_to_the_concurrency_and_no_further(server: FakeCompletions) -> None:
    server.hold_s = 0.15
    items = [item(f"i{n}", [n + 1]) for n in range(6)]
    engine = Harness(server, requests="item", concurrency="3").engine
    try:
        results = engine.run(batch(*items))
    finally:
        engine.close()

    assert [r.status for r in results] == ["ok"] * 6
    assert [r.output for r in results] == [f"sum={n + 1} n=1 max=8".encode() for n in range(6)]
    assert server.most_in_flight == 3


def test_one_items_failed_request_leaves_the_others_ok(server: FakeCompletions) -> None:
    server.script = [Reply(status=400)]  # the first request to arrive, whichever item it carries
    results = Harness(server, requests="item", concurrency="1").engine.run(batch(*THREE))

    assert [r.status for r in results] == ["rejected", "ok", "ok"]  # a refusal is the prompt's
    assert "HTTP 400" in (results[0].reason or "") and "not retried" in (results[0].reason or "")
    assert not results[0].retriable  # a refusal: the pipeline does not retry it either


# --------------------------------------------------------------------------------------------------
# Retries and failures


def test_503_twice_then_200_succeeds_after_two_backoffs(server: FakeCompletions) -> None:
    server.script = [Reply(status=503), Reply(status=503)]
    harness = Harness(server)
    results = harness.engine.run(batch(*THREE))

    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert len(server.received) == 3
    assert len(harness.sleeps) == 2
    assert 0.005 <= harness.sleeps[0] < 0.010 and 0.010 <= harness.sleeps[1] < 0.020


def test_always_500_fails_every_item_after_retries_plus_one_attempts(server: FakeCompletions) -> None:
    server.script = [Reply(status=500)] * 10
    harness = Harness(server, retries="3")
    results = harness.engine.run(batch(*THREE))

    assert len(server.received) == 4
    assert [r.status for r in results] == ["failed", "failed", "failed"]
    reason = results[0].reason or ""
    assert "HTTP 500" in reason and "scripted 500" in reason and "4 attempt(s)" in reason
    assert server.url not in reason and "127.0.0.1" not in reason  # no internal address in a row's error
    assert all(r.retriable for r in results)  # a server error: the pipeline may try the items again
    # exponential, capped at backoff_max_ms=25 ms, jittered into [half, full) of the cap
    caps = [0.010, 0.020, 0.025]
    assert [cap / 2 <= s < cap for s, cap in zip(harness.sleeps, caps, strict=True)] == [True, True, True]


def test_429_waits_for_retry_after_within_the_cap(server: FakeCompletions) -> None:
    server.script = [Reply(status=429, headers={"Retry-After": "1"})]
    harness = Harness(server)
    results = harness.engine.run(batch(*THREE))

    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert harness.sleeps == [0.025]  # 1 s asked, capped at backoff_max_ms


def test_timeout_is_retried_then_fails(server: FakeCompletions) -> None:
    server.script = [Reply(delay_s=2.0), Reply(delay_s=2.0)]
    harness = Harness(server, timeout_s="0.1", retries="1")
    results = harness.engine.run(batch(*THREE))

    assert len(server.received) == 2
    assert [r.status for r in results] == ["failed", "failed", "failed"]
    assert "no response within 0.1 s" in (results[0].reason or "")
    assert "2 attempt(s)" in (results[0].reason or "")
    assert all(r.retriable for r in results)


def test_connection_refused_is_retried_then_fails() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    sleeps: list[float] = []
    settings = parse_options(
        {"url": f"http://127.0.0.1:{port}", "requests": "budget", "retries": "2", "backoff_ms": "1"}
    )
    results = OpenAICompletionsEngine(settings, sleep=sleeps.append).run(batch(*THREE))

    assert [r.status for r in results] == ["failed", "failed", "failed"]
    assert all(r.retriable for r in results)
    assert "ConnectionRefusedError" in (results[0].reason or "") and "3 attempt(s)" in (
        results[0].reason or ""
    )
    assert len(sleeps) == 2


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_4xx_that_is_no_prompts_fault_is_neither_retried_nor_split(
    server: FakeCompletions, status: int
) -> None:
    """(400 was here before requests were split: a 400 now isolates its prompts, below.)"""
    server.script = [Reply(status=status)]
    harness = Harness(server)
    results = harness.engine.run(batch(*THREE))

    assert len(server.received) == 1 and harness.sleeps == []
    assert [r.status for r in results] == ["failed", "failed", "failed"]
    assert f"HTTP {status}: scripted {status}" in (results[0].reason or "")
    assert "not retried" in (results[0].reason or "")


def test_a_200_that_is_not_a_completion_fails_without_retry(server: FakeCompletions) -> None:
    server.script = [Reply(raw=b"<html>proxy error</html>")]
    harness = Harness(server)
    results = harness.engine.run(batch(*THREE))

    assert len(server.received) == 1
    assert [r.status for r in results] == ["failed", "failed", "failed"]
    assert "not JSON" in (results[0].reason or "")


def test_deadline_stops_retries_early(server: FakeCompletions) -> None:
    server.script = [Reply(status=503)] * 10
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    settings = parse_options(
        {
            "url": server.url,
            "requests": "budget",
            "retries": "9",
            "backoff_ms": "400",
            "backoff_max_ms": "400",
            "deadline_s": "1",
        }
    )
    engine = OpenAICompletionsEngine(settings, sleep=sleep, clock=lambda: now[0], rng=random.Random(1))
    results = engine.run(batch(*THREE))

    assert 2 <= len(server.received) < 5  # each wait is 200-400 ms of the 1 s deadline
    assert "deadline_s" in (results[0].reason or "")


def test_one_failed_group_leaves_the_other_ok(server: FakeCompletions) -> None:
    server.script = [Reply(status=400)]
    results = Harness(server).engine.run(batch(item("a", [1], 4), item("b", [2], 2)))

    assert [r.status for r in results] == ["rejected", "ok"]


# --------------------------------------------------------------------------------------------------
# Options


def test_api_key_env_is_sent_as_bearer_token_and_kept_out_of_repr(
    server: FakeCompletions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_TEST_OPENAI_KEY", "sk-not-a-real-key")
    engine = from_options({"url": server.url, "api_key_env": "TF_TEST_OPENAI_KEY"})
    engine.run(batch(*THREE))

    assert server.received[0].headers["Authorization"] == "Bearer sk-not-a-real-key"
    assert "sk-not-a-real-key" not in repr(engine.settings)


def test_no_authorization_header_without_api_key_env(server: FakeCompletions) -> None:
    from_options({"url": server.url}).run(batch(*THREE))
    assert "Authorization" not in server.received[0].headers


@pytest.mark.parametrize(
    "url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/completions"]
)
def test_url_may_be_the_base_the_v1_root_or_the_endpoint(url: str) -> None:
    assert parse_options({"url": url}).endpoint == "http://h:8000/v1/completions"


def test_registry_builds_the_engine() -> None:
    engine = make_engine("openai", {"url": "http://127.0.0.1:1", "retries": "0"})
    assert isinstance(engine, OpenAICompletionsEngine) and engine.name == "openai"


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({}, "url"),
        ({"url": "vllm:8000"}, "url"),
        ({"url": "ftp://h/x"}, "url"),
        ({"url": "http://user:pw@h:8000"}, "api_key_env"),
        ({"url": "http://h", "retries": "-1"}, "retries"),
        ({"url": "http://h", "retries": "two"}, "retries"),
        ({"url": "http://h", "timeout_s": "0"}, "timeout_s"),
        ({"url": "http://h", "timeout_s": "nan"}, "timeout_s"),
        ({"url": "http://h", "deadline_s": "inf"}, "deadline_s"),
        ({"url": "http://h", "max_tokens": "0"}, "max_tokens"),
        ({"url": "http://h", "temperature": "-1"}, "temperature"),
        ({"url": "http://h", "backoff_ms": "100", "backoff_max_ms": "50"}, "backoff_max_ms"),
        ({"url": "http://h", "api_key_env": "TF_TEST_SURELY_UNSET_VAR"}, "api_key_env"),
        ({"url": "http://h", "api_key": "sk-123"}, "api_key"),
        ({"url": "http://h", "requests": "batch"}, "requests"),
        ({"url": "http://h", "concurrency": "0"}, "concurrency"),
        ({"url": "http://h", "server": "tgi"}, "server"),
        ({"url": "http://h", "output": "xml"}, "output"),
        ({"url": "http://h", "lora_ids": "tone:0"}, "lora_ids"),  # llama.cpp only
        ({"url": "http://h", "server": "llamacpp", "lora_ids": "tone"}, "lora_ids"),
        ({"url": "http://h", "server": "llamacpp", "lora_ids": "tone:0,tone:1"}, "lora_ids"),
        ({"url": "http://h", "server": "llamacpp", "lora_ids": "tone:-1"}, "lora_ids"),
    ],
)
def test_bad_options_raise_one_line_naming_the_option(options: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError) as caught:
        from_options(options)
    message = str(caught.value)
    assert names in message and "\n" not in message and message.startswith("openai engine: ")


def test_server_lora_ids_and_output_options_parse() -> None:
    settings = parse_options(
        {"url": "http://h", "server": "llamacpp", "lora_ids": "tone:1, legal:0", "output": "json"}
    )
    assert (settings.server, settings.lora_ids, settings.output) == (
        "llamacpp",
        {"tone": 1, "legal": 0},
        "json",
    )
    assert (parse_options({"url": "http://h"}).server, parse_options({"url": "http://h"}).output) == (
        "openai",
        "text",
    )
