"""Backpressure: past the cap on waiting tokens the processor stops reading ingest, and nothing is lost."""

from __future__ import annotations

import time

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.core.contract import Contract
from processor.sim.tracegen import synthetic_records
from tests.broker.rig import in_process, new_topics

pytestmark = pytest.mark.kafka

CAP = 20_000
MAX_LEN = 600
CONSUME_BATCH = 100


def test_ingest_pauses_at_the_cap_and_every_item_completes_once_a_consumer_comes(
    kafka_bootstrap: str,
) -> None:
    contract = Contract("late", "default", budget_tokens=8192, max_items=32)
    conf, topics = new_topics(kafka_bootstrap, "b", [contract.consumer])
    records = synthetic_records(2_000, seed=9, shapes=5, min_len=16, max_len=MAX_LEN, rate_per_s=None)
    with TokenProducer(conf, topics) as producer:
        for r in records:
            producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
    total = sum(r.length for r in records)
    assert total > 3 * CAP

    rig = in_process(
        kafka_bootstrap,
        [],  # no consumer yet: it comes once ingest has paused
        topics=(conf, topics),
        instance="bp",
        max_waiting_tokens=CAP,
        consume_batch=CONSUME_BATCH,
    )
    service, errors = rig.processor, rig.errors  # a thread's exception, re-raised below
    rig.start()
    try:
        deadline = time.monotonic() + 60
        while not service.ingest_paused:
            assert time.monotonic() < deadline, "ingest never paused"
            assert not errors, errors
            time.sleep(0.2)
        time.sleep(2)  # paused: nothing more comes in while no consumer drains the lanes
        waiting = service.core.view.waiting().tokens
        assert CAP <= waiting < CAP + CONSUME_BATCH * MAX_LEN  # one consume call may overshoot
        assert service.core.view.total("received").tokens == waiting  # nothing dropped, nothing routed
        rig.add_consumer(contract)
        deadline = time.monotonic() + 180
        while service.core.view.total("completed").tokens < total:
            assert time.monotonic() < deadline, "the backlog never drained"
            assert not errors, errors
            time.sleep(0.5)
    finally:
        rig.close()
    assert not errors, errors
    service.core.check(deep=False)
    ledger = service.core.view
    assert ledger.total("received").items == ledger.total("completed").items == len(records)
    assert service.counters.backpressure_pauses >= 1
    assert not service.ingest_paused
