"""The ``openai`` engine against a real generation server: consumer apps whose batches run on llama.cpp's
``llama-server`` (processor/local/llm/, a random-weight model with MiniLM's WordPiece vocabulary), fed
by a processor on the broker.

* every item goes as its own token ids, its completion carries its own choice (its text, as the server
  gives it for that prompt alone, and its own ``max_tokens`` as output tokens) and its usage, and items
  sharing a prefix are served from the slots' prompt cache (``cached_tokens``, measured by the server);
* a server killed mid-run: the batches sent to it end ``failed`` with the endpoint and the error, every
  item is answered once, the audit is clean; the server started again on its port: the same consumer
  process carries on, ``ok``.

The stand-in server of tests/engines/test_openai_http.py keeps the failure paths a real server cannot
be made to produce (5xx, 429, bodies that are not completions, timeouts). Small prompts and at most five
output tokens keep the module under a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import random
import signal
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from processor.apps.consumer import ConsumerApp
from processor.apps.producer import TokenProducer
from processor.core.contract import Contract
from processor.core.retries import DEFAULT_MAX_ATTEMPTS
from processor.engines.base import make_engine
from processor.kafka.reader import read_topic
from processor.local.llm.build import build_server
from processor.local.llm.model import ensure_model
from processor.local.llm.server import ServerInfo, ServerSettings, server_status, start_server, stop_server
from processor.local.pipeline import Pipeline, child_env
from processor.ops.audit import audit
from processor.ops.status import gather, report
from processor.wire.completions import decode_completions
from processor.wire.records import CompletionRecord, tokens_from_ids
from tests.broker.rig import QUICK, InProcess, in_process, new_topics, wait_for
from tests.local.test_llm_server import llm_home  # noqa: F401 (the module's fixture: a temporary home)

pytestmark = [pytest.mark.kafka, pytest.mark.llm]

MODEL = "tiny-llama"
PREFIX_TOKENS = 48
TAIL_TOKENS = 8


@dataclass(frozen=True)
class Prompt:
    item_id: str
    shape: str
    ids: list[int]
    budget: int


def prompts(prefix: str, shapes: int, per_shape: int, seed: int) -> list[Prompt]:
    """``shapes`` shared prefixes of ``PREFIX_TOKENS`` WordPiece ids (ordinary words, 1,000 and up),
    each followed by its own tail per item; budgets of 1 to 5 tokens, so each completion's output count
    tells whose request it answered."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1000, 29000) for _ in range(PREFIX_TOKENS)] for _ in range(shapes)]
    return [
        Prompt(
            f"{prefix}-s{s}-{n}",
            f"{prefix}-shape-{s}",
            heads[s] + [rng.randrange(1000, 29000) for _ in range(TAIL_TOKENS)],
            1 + (s * per_shape + n) % 5,
        )
        for s in range(shapes)
        for n in range(per_shape)
    ]


def produce(conf: dict[str, str], rig_topics: Any, items: list[Prompt]) -> None:
    with TokenProducer(conf, rig_topics) as producer:
        for p in items:
            producer.send(
                p.item_id, MODEL, tokens_from_ids(p.ids), components=[p.shape], output_budget=p.budget
            )


def completions(conf: dict[str, str], topics: Any) -> list[CompletionRecord]:
    return [c for msg in read_topic(conf, topics.results) for c in decode_completions(msg.value())]


def complete_alone(url: str, p: Prompt) -> dict[str, Any]:
    """The server's answer to ``p`` sent on its own, outside the pipeline: the reference."""
    body = {"model": MODEL, "prompt": [p.ids], "max_tokens": p.budget, "temperature": 0.0, "n": 1}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def contract(consumer: str) -> Contract:
    return Contract(consumer, MODEL, budget_tokens=256, max_items=4, pad_multiple=1, max_inflight=2)


def serve(name: str, slots: int, port: int | None = None) -> ServerInfo:
    return start_server(
        build_server().binary, ensure_model(), name=name, port=port,
        settings=ServerSettings(slots=slots, ctx_tokens=slots * 512, threads=1),
    )  # fmt: skip


@pytest.fixture(scope="module")
def llm(llm_home: Path) -> Iterator[ServerInfo]:  # noqa: F811 (the imported fixture)
    info = serve("pytest-llm-engine", slots=4)
    yield info
    stop_server(info.name)


def running(bootstrap: str, consumer: str) -> InProcess:
    """A processor in a thread on a fresh prefix with ``consumer``'s batch topic; no consumer app yet."""
    return in_process(bootstrap, [], topics=new_topics(bootstrap, "l", [consumer]), commit_interval_ms=200)


def test_each_item_gets_its_own_choice_and_shared_prefixes_come_from_the_cache(
    kafka_bootstrap: str, llm: ServerInfo
) -> None:
    rig = running(kafka_bootstrap, "gpu-llm")
    engine = make_engine("openai", {"url": llm.url, "timeout_s": "30", "concurrency": "4"})
    rig.apps.append(ConsumerApp(rig.conf, rig.topics, contract("gpu-llm"), engine, QUICK))
    items = prompts("a", shapes=3, per_shape=8, seed=31)
    rig.start()
    try:
        produce(rig.conf, rig.topics, items)
        ledger = rig.processor.core.view
        wait_for(lambda: ledger.total("completed").items + ledger.total("failed").items == len(items), 60,
                 "every item answered")  # fmt: skip
    finally:
        rig.close()
    assert not rig.errors, rig.errors

    done = completions(rig.conf, rig.topics)
    assert Counter(c.item_id for c in done) == Counter({p.item_id: 1 for p in items})
    by_id = {c.item_id: c for c in done}
    for p in items:
        c, alone = by_id[p.item_id], complete_alone(llm.url, p)
        assert (c.status, c.reason, c.input_tokens) == ("ok", None, len(p.ids))
        # its own choice: the text the server gives this prompt on its own, and its own max_tokens
        assert c.output.decode() == alone["choices"][0]["text"] != ""
        assert c.output_tokens == p.budget == alone["usage"]["completion_tokens"]
        assert 0 <= c.cached_tokens < len(p.ids) and c.cache_hit == (c.cached_tokens > 0)
    for s in {p.shape for p in items}:
        # after a shape's first batch, its prefix is in the slots' cache (measured by the server)
        assert max(by_id[p.item_id].cached_tokens for p in items if p.shape == s) >= PREFIX_TOKENS
    cached = sum(c.cached_tokens for c in done)

    audited = audit(rig.conf, rig.topics, rig.processor.settings.group_id)
    assert audited.clean, "\n".join(audited.lines())
    assert (audited.completed_items, audited.lost_items) == (len(items), 0)
    assert (audited.cached_prompt_tokens, audited.prefill_tokens) == (
        cached,
        sum(len(p.ids) for p in items) - cached,
    )
    status = report(gather(rig.conf, rig.topics, rig.processor.settings.group_id), rig.topics)
    # The processor books the cached counts (its scheduler is given them): the audit compared them
    # with the checkpoints (clean above), and status shows the measured figures.
    assert rig.processor.core.view.prompts_counted()
    assert audited.prompts_compared and status.prompts.counted
    assert (status.prompts.cached_tokens, status.prompts.prefill_tokens) == (
        audited.cached_prompt_tokens,
        audited.prefill_tokens,
    )


@pytest.mark.usefixtures("llm_home")
def test_a_killed_server_fails_its_batches_and_the_consumer_carries_on_when_it_is_back(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The consumer is a real ``tokenfabric consumer --engine openai`` process; the server is SIGKILLed
    between two waves of items and started again on its port before a third. The second wave's
    failures are retriable (a refused connection), so each of its items is tried max_attempts times
    in all while the server is down, and ends failed on the last."""
    name = "pytest-llm-killed"
    server = serve(name, slots=2)
    rig = running(kafka_bootstrap, "gpu-k")
    c = contract("gpu-k")
    pipeline = Pipeline(tmp_path)
    pipeline.spawn(
        "consumer",
        [
            "consumer", "--topic-prefix", rig.topics.prefix, "--id", c.consumer, "--model", c.model,
            "--budget", str(c.budget_tokens), "--items", str(c.max_items), "--pad", "1", "--inflight", "2",
            "--engine", "openai", "--engine-opt", f"url={server.url}", "--engine-opt", "retries=1",
            "--engine-opt", "backoff_ms=50", "--engine-opt", "timeout_s=5", "--engine-opt", "deadline_s=10",
            "--metrics-port", "0",
        ],
        child_env(kafka_bootstrap),
    )  # fmt: skip
    waves = [prompts(wave, shapes=2, per_shape=4, seed=n) for n, wave in enumerate(("k1", "k2", "k3"))]
    ledger = rig.processor.core.view

    def answered() -> int:
        return ledger.total("completed").items + ledger.total("failed").items

    rig.start()
    try:
        produce(rig.conf, rig.topics, waves[0])
        wait_for(lambda: answered() == 8, 60, "the first wave answered")
        os.kill(server.pid, signal.SIGKILL)
        wait_for(lambda: server_status(name) is None, 10, "the killed server gone")
        produce(rig.conf, rig.topics, waves[1])
        wait_for(lambda: answered() == 16, 60, "the second wave answered")
        serve(name, slots=2, port=server.port)
        produce(rig.conf, rig.topics, waves[2])
        wait_for(lambda: answered() == 24, 60, "the third wave answered")
    finally:
        rig.close()
        codes = pipeline.stop()
        stop_server(name)
    assert not rig.errors, rig.errors
    assert codes["consumer"] == 0, (tmp_path / "consumer.log").read_text()[-2000:]

    # A refused connection is retriable: the processor sends each item of the second wave again,
    # up to the default max_attempts, while the server stays down; the last attempt is the row's.
    done = completions(rig.conf, rig.topics)
    attempts: dict[str, list[int]] = {}
    for done_item in done:
        attempts.setdefault(done_item.item_id, []).append(done_item.attempt)
    expected = {p.item_id: [1] for p in waves[0] + waves[2]}
    expected |= {p.item_id: list(range(1, DEFAULT_MAX_ATTEMPTS + 1)) for p in waves[1]}
    assert {item_id: sorted(seen) for item_id, seen in attempts.items()} == expected
    last = {c.item_id: c for c in done if c.attempt == max(attempts[c.item_id])}
    assert {last[p.item_id].status for p in waves[0] + waves[2]} == {"ok"}
    second_wave = {p.item_id for p in waves[1]}
    for failed in (c for c in done if c.item_id in second_wave):
        assert failed.status == "failed" and failed.retriable, failed
        assert failed.output == b"" and failed.cached_tokens == 0
        reason = failed.reason or ""
        assert server.url not in reason and "ConnectionRefusedError" in reason, reason
        assert "gave up after 2 attempt(s)" in reason, reason
    audited = audit(rig.conf, rig.topics, rig.processor.settings.group_id)
    assert audited.clean, "\n".join(audited.lines())
    assert (audited.completed_items, audited.failed_items, audited.lost_items) == (16, 8, 0)
    assert audited.retried_items == 8 * (DEFAULT_MAX_ATTEMPTS - 1)
