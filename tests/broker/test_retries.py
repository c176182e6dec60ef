"""Retries of failed items inside the pipeline, against a real broker (docs/jobs.md, "Retries inside
the pipeline").

A processor and a consumer app run in threads; the consumer's engine fails the first attempt of
every even row retriably (a server that went away) and row ``r1`` for good (a refusal). Every row
but ``r1`` still completes, on its second dispatch for the even rows; the retried rows' failed
completions are followed by their ok ones, the ledger counts the retries (``retried``), and the
audit re-derives them from the topics without a difference.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from processor.apps.consumer import ConsumerApp
from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.core.contract import Contract
from processor.engines.base import Engine, ItemResult
from processor.engines.sim import SimEngine
from processor.kafka.reader import read_topic
from processor.ops.audit import audit
from processor.ops.status import gather
from processor.sim.cardmodel import CardSpec
from processor.wire.completions import decode_completions
from processor.wire.items import decode_batch
from processor.wire.records import BatchRecord, CompletionRecord
from tests.broker.rig import in_process, wait_for

pytestmark = pytest.mark.kafka

JOB = "flaky"
ROWS = 40
CARD = Contract("card", "default", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=2)


class FlakyEngine(Engine):
    """The sim engine, but each even row's first run fails retriably and ``r1`` always fails, not
    retriably (its server refused it: a 4xx)."""

    name = "flaky"

    def __init__(self) -> None:
        self.sim = SimEngine(CardSpec(tokens_per_s=1e9, overhead_ms=0), 0.0)
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        out = []
        for it, result in zip(batch.items, self.sim.run(batch), strict=True):
            with self.lock:
                first = it.item_id not in self.seen
                self.seen.add(it.item_id)
            n = int(it.item_id[1:])
            if it.item_id == "r1":
                out.append(ItemResult(it.item_id, "failed", b"", 0, "HTTP 400: refused (not retried)", False))
            elif n % 2 == 0 and first:
                reason = "ConnectionRefusedError: server went away (gave up after 3 attempt(s))"
                out.append(ItemResult(it.item_id, "failed", b"", 0, reason, False, 0, True))
            else:
                out.append(result)
        return out


def completions(conf: dict[str, str], topic: str) -> list[CompletionRecord]:
    return [c for msg in read_topic(conf, topic) for c in decode_completions(msg.value())]


def test_rows_failed_retriably_complete_on_a_later_attempt_and_the_audit_is_clean(
    kafka_bootstrap: str,
) -> None:
    rig = in_process(kafka_bootstrap, [], letter="r", instance="retries", commit_interval_ms=300)
    rig.apps.append(ConsumerApp(rig.conf, rig.topics, CARD, FlakyEngine(), poll_timeout_s=0.05))
    ids = [f"r{n}" for n in range(ROWS)]
    rig.start()
    try:
        with TokenProducer(rig.conf, rig.topics) as producer:
            for n, item_id in enumerate(ids):
                producer.send(item_id, "default", synthetic_tokens(item_id, 20 + n), shape=7, job_id=JOB)

        def finished() -> bool:
            done = completions(rig.conf, rig.topics.results)
            return {c.item_id for c in done if c.status == "ok"} == set(ids) - {"r1"}

        wait_for(finished, 120, "every row but r1 completed")
        view = lambda: gather(rig.conf, rig.topics, f"{rig.topics.prefix}-proc")  # noqa: E731
        wait_for(lambda: view().total("completed_items") == ROWS - 1, 30, "a checkpoint counting them")
    finally:
        rig.close()
    assert not rig.errors, rig.errors

    by_item: dict[str, list[CompletionRecord]] = {}
    for c in completions(rig.conf, rig.topics.results):
        by_item.setdefault(c.item_id, []).append(c)
    flaky = {f"r{n}" for n in range(0, ROWS, 2)}
    for item_id, done in by_item.items():
        if item_id in flaky:  # failed retriably, then ok from another batch
            assert sorted((c.status, c.retriable) for c in done) == [("failed", True), ("ok", False)], item_id
            assert len({c.batch_id for c in done}) == 2
        else:
            assert [(c.status, c.retriable) for c in done] == [("failed" if item_id == "r1" else "ok", False)]
    dispatched: Counter[str] = Counter()
    for msg in read_topic(rig.conf, rig.topics.batches(CARD.consumer)):
        dispatched.update(it.item_id for it in decode_batch(msg.value()).items)
    assert dispatched == Counter({i: 2 if i in flaky else 1 for i in ids})  # r1: not retried
    t = gather(rig.conf, rig.topics, f"{rig.topics.prefix}-proc").total
    assert (t("retried_items"), t("failed_items"), t("completed_items")) == (len(flaky), 1, ROWS - 1)
    assert t("routed_items") == ROWS + len(flaky) and t("queued_items") == t("in_flight_items") == 0
    report = audit(rig.conf, rig.topics, f"{rig.topics.prefix}-proc")
    assert report.clean, "\n".join(report.lines())
    assert (report.retried_items, report.completed_items, report.failed_items) == (len(flaky), ROWS - 1, 1)
