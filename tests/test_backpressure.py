"""Backpressure: past the cap on waiting tokens the processor stops reading ingest, and nothing is lost."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from processor.apps.consumer import ConsumerApp
from processor.apps.observe import ProcessorSettings
from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.apps.service import ProcessorService
from processor.core.contract import Contract
from processor.engines.sim import SimEngine
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.sim.cardmodel import CardSpec
from processor.sim.tracegen import synthetic_records

pytestmark = pytest.mark.kafka

CAP = 20_000
MAX_LEN = 600
CONSUME_BATCH = 100


def test_ingest_pauses_at_the_cap_and_every_item_completes_once_a_consumer_comes(
    kafka_bootstrap: str,
) -> None:
    conf = {"bootstrap.servers": kafka_bootstrap}
    topics = TopicNames(f"b{uuid.uuid4().hex[:8]}")
    contract = Contract("late", "default", budget_tokens=8192, max_items=32)
    create_topics(conf, topic_specs(topics, ingest_partitions=3, consumers=[contract.consumer]))
    records = synthetic_records(2_000, seed=9, shapes=5, min_len=16, max_len=MAX_LEN, rate_per_s=None)
    with TokenProducer(conf, topics) as producer:
        for r in records:
            producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
    total = sum(r.length for r in records)
    assert total > 3 * CAP

    service = ProcessorService(
        conf,
        topics,
        ProcessorSettings(
            instance="bp",
            group_id=f"{topics.prefix}-proc",
            max_waiting_tokens=CAP,
            consume_batch=CONSUME_BATCH,
        ),
    )
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(target) -> None:  # type: ignore[no-untyped-def]
        try:
            target(stop)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(service.run,))]
    threads[0].start()
    try:
        deadline = time.monotonic() + 60
        while not service.ingest_paused:
            assert time.monotonic() < deadline, "ingest never paused"
            assert not errors, errors
            time.sleep(0.2)
        time.sleep(2)  # paused: nothing more comes in while no consumer drains the lanes
        waiting = service.core.table.waiting_tokens
        assert CAP <= waiting < CAP + CONSUME_BATCH * MAX_LEN  # one consume call may overshoot
        assert service.core.ledger.total("received").tokens == waiting  # nothing dropped, nothing routed
        app = ConsumerApp(
            conf,
            topics,
            contract,
            SimEngine(CardSpec(tokens_per_s=1e9, overhead_ms=0), 0.0),
            poll_timeout_s=0.05,
        )
        threads.append(threading.Thread(target=run, args=(app.run,)))
        threads[1].start()
        deadline = time.monotonic() + 180
        while service.core.ledger.total("completed").tokens < total:
            assert time.monotonic() < deadline, "the backlog never drained"
            assert not errors, errors
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    ledger = service.core.ledger
    ledger.check()
    assert ledger.total("received").items == ledger.total("completed").items == len(records)
    assert service.counters.backpressure_pauses >= 1
    assert not service.ingest_paused
