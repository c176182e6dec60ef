"""Retries of failed items inside the pipeline, against a real broker (docs/jobs.md, "Retries inside
the pipeline").

A processor and a consumer app run in threads; the consumer's engine fails the first attempt of
every even row retriably (a server that went away), row ``r1`` for good (a refusal: not retried) and
row ``r3`` retriably on every attempt. The even rows complete on their second dispatch, each batch
telling the consumer the attempt (``Batch.attempts``) and each completion carrying it; ``r3`` ends
failed at attempt 3 (the default ``max_attempts``); the ledger counts the retries (``retried``) and
the audit re-derives them from the topics without a difference.

The kills while a retried row waits (exactly-once: restored from the changelog on its next attempt;
at-least-once: read again from ingest) are tested without a broker: tests/apps/test_service_retries.py
and tests/apps/test_broker_twins.py (docs/testing.md).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from processor.apps.consumer import ConsumerApp
from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.core.contract import Contract
from processor.core.retries import DEFAULT_MAX_ATTEMPTS
from processor.engines.base import Engine, ItemResult
from processor.engines.sim import SimEngine
from processor.jobs.collect import provisional
from processor.kafka.reader import read_topic
from processor.ops.audit import audit
from processor.ops.status import gather
from processor.sim.cardmodel import CardSpec
from processor.wire.completions import decode_completions
from processor.wire.items import decode_batch
from processor.wire.records import BatchRecord, CompletionRecord
from tests.broker.rig import QUICK, in_process, wait_for

pytestmark = pytest.mark.kafka

JOB = "flaky"
ROWS = 16
CARD = Contract("card", "default", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=2)
WENT_AWAY = "ConnectionRefusedError: server went away (gave up after 3 attempt(s))"


class FlakyEngine(Engine):
    """The sim engine, but the first run of each row in ``first_fails`` and every run of each row in
    ``always_fails`` fail retriably, and ``r1`` always fails, not retriably (its server refused it: a
    4xx). It counts its runs of each row, and notes any batch whose attempt disagrees with them."""

    name = "flaky"

    def __init__(
        self, first_fails: set[str], always_fails: frozenset[str] = frozenset(), batch_s: float = 0.0
    ) -> None:
        self.sim = SimEngine(CardSpec(tokens_per_s=1e9, overhead_ms=0), 0.0)
        self.first_fails, self.always_fails, self.batch_s = first_fails, always_fails, batch_s
        self.runs: Counter[str] = Counter()
        self.wrong_attempts: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        time.sleep(self.batch_s)
        out = []
        for i, (it, result) in enumerate(zip(batch.items, self.sim.run(batch), strict=True)):
            with self.lock:
                self.runs[it.item_id] += 1
                first = self.runs[it.item_id] == 1
                if batch.attempt(i) != self.runs[it.item_id]:  # a restart may run a batch again
                    self.wrong_attempts.append((it.item_id, batch.attempt(i), self.runs[it.item_id]))
            if it.item_id == "r1":
                out.append(ItemResult(it.item_id, "failed", b"", 0, "HTTP 400: refused (not retried)", False))
            elif it.item_id in self.always_fails or (first and it.item_id in self.first_fails):
                out.append(ItemResult(it.item_id, "failed", b"", 0, WENT_AWAY, False, 0, True))
            else:
                out.append(result)
        return out


def completions(conf: dict[str, str], topic: str) -> dict[str, list[CompletionRecord]]:
    """Each item's completions, by attempt (the topic's partitions hold them in no common order)."""
    out: dict[str, list[CompletionRecord]] = {}
    for msg in read_topic(conf, topic):
        for c in decode_completions(msg.value()):
            out.setdefault(c.item_id, []).append(c)
    return {item_id: sorted(cs, key=lambda c: c.attempt) for item_id, cs in out.items()}


def finals(done: dict[str, list[CompletionRecord]]) -> dict[str, list[CompletionRecord]]:
    """Each item's completions that are its result (no later attempt follows them)."""
    return {i: [c for c in cs if not provisional(c, DEFAULT_MAX_ATTEMPTS)] for i, cs in done.items()}


def test_rows_failed_retriably_complete_on_a_later_attempt_and_the_audit_is_clean(
    kafka_bootstrap: str,
) -> None:
    rig = in_process(kafka_bootstrap, [], letter="r", instance="retries", commit_interval_ms=300)
    flaky = {f"r{n}" for n in range(0, ROWS, 2)}
    engine = FlakyEngine(flaky, frozenset({"r3"}))
    rig.apps.append(ConsumerApp(rig.conf, rig.topics, CARD, engine, QUICK))
    ids = [f"r{n}" for n in range(ROWS)]
    rig.start()
    try:
        with TokenProducer(rig.conf, rig.topics) as producer:
            for n, item_id in enumerate(ids):
                producer.send(item_id, "default", synthetic_tokens(item_id, 20 + n), shape=7, job_id=JOB)

        def finished() -> bool:
            return all(finals(completions(rig.conf, rig.topics.results)).get(i) for i in ids)

        wait_for(finished, 120, "every row answered for good")
        view = lambda: gather(rig.conf, rig.topics, f"{rig.topics.prefix}-proc")  # noqa: E731
        wait_for(lambda: view().total("failed_items") == 2, 30, "a checkpoint counting them")
    finally:
        rig.close()
    assert not rig.errors, rig.errors
    assert engine.wrong_attempts == []

    by_item = completions(rig.conf, rig.topics.results)
    for item_id, done in by_item.items():
        told = [(c.status, c.retriable, c.attempt) for c in done]
        if item_id == "r3":  # failed retriably on every attempt: the last failure is its result
            assert told == [("failed", True, n) for n in (1, 2, 3)], item_id
            assert not provisional(done[-1], DEFAULT_MAX_ATTEMPTS)
        elif item_id in flaky:  # failed retriably, then ok from another batch
            assert told == [("failed", True, 1), ("ok", False, 2)], item_id
            assert len({c.batch_id for c in done}) == 2
        else:
            assert told == [("failed" if item_id == "r1" else "ok", False, 1)], item_id
    dispatched: Counter[str] = Counter()
    attempts: dict[str, list[int]] = {}
    for msg in read_topic(rig.conf, rig.topics.batches(CARD.consumer)):
        batch = decode_batch(msg.value())
        dispatched.update(it.item_id for it in batch.items)
        for i, it in enumerate(batch.items):
            attempts.setdefault(it.item_id, []).append(batch.attempt(i))
    assert dispatched == Counter({i: 3 if i == "r3" else 2 if i in flaky else 1 for i in ids})  # r1: once
    assert attempts["r3"] == [1, 2, 3] and all(attempts[i] == [1, 2] for i in flaky)
    retried = len(flaky) + 2  # r3 twice
    t = gather(rig.conf, rig.topics, f"{rig.topics.prefix}-proc").total
    assert (t("retried_items"), t("failed_items"), t("completed_items")) == (retried, 2, ROWS - 2)
    assert t("routed_items") == ROWS + retried and t("queued_items") == t("in_flight_items") == 0
    report = audit(rig.conf, rig.topics, f"{rig.topics.prefix}-proc")
    assert report.clean, "\n".join(report.lines())
    assert (report.retried_items, report.completed_items, report.failed_items) == (retried, ROWS - 2, 2)
