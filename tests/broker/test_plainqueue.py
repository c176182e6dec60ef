"""The plain queue baseline on the broker: one group, a card joining mid-stream, every item once."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest

from processor.apps.plainqueue import PlainQueueApp
from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.core.contract import Contract
from processor.engines.sim import SimEngine
from processor.kafka.reader import read_topic
from processor.sim.cardmodel import CardSpec
from processor.sim.tracegen import synthetic_records
from processor.wire.completions import decode_completions
from tests.broker.rig import Threads, new_topics, wait_for

pytestmark = pytest.mark.kafka


def _card(conf: dict[str, str], topics, name: str, budget: int) -> PlainQueueApp:  # type: ignore[no-untyped-def]
    contract = Contract(name, "default", budget, 16, 8, 1)
    engine = SimEngine(CardSpec(tokens_per_s=30_000, overhead_ms=1), 1.0)  # ~60 ms a batch
    return PlainQueueApp(conf, topics, contract, engine, linger_ms=20, poll_timeout_s=0.1)


def test_a_card_joining_mid_stream_leaves_every_item_completed_once(kafka_bootstrap: str) -> None:
    conf, topics = new_topics(kafka_bootstrap, "q", [], ingest_partitions=4)
    records = synthetic_records(600, seed=5, shapes=6, min_len=16, max_len=500, rate_per_s=None)
    runner = Threads()
    runner.start(_card(conf, topics, "small", 2048).run, "small")
    try:
        with TokenProducer(conf, topics, key_of=lambda rec: rec.item_id.encode()) as producer:
            for i, r in enumerate(records):
                producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
                if i == 200:
                    producer.flush()
                    runner.start(_card(conf, topics, "large", 4096).run, "large")  # a rebalance
                if i % 50 == 0:
                    time.sleep(0.1)

        done: Counter[str] = Counter()

        def all_done() -> bool:
            done.clear()
            for msg in read_topic(conf, topics.results):
                done.update(rec.item_id for rec in decode_completions(msg.value()))
            return len(done) == len(records)

        wait_for(all_done, 90, "every item completed")
    finally:
        runner.join()
    assert not runner.errors
    assert set(done) == {r.id for r in records}
    assert max(done.values()) == 1  # exactly once, through the rebalance
    batches: dict[str, list] = defaultdict(list)
    for msg in read_topic(conf, topics.results):
        for rec in decode_completions(msg.value()):
            batches[rec.batch_id].append(rec)
    by_card = Counter(recs[0].consumer for recs in batches.values())
    assert set(by_card) == {"small", "large"}
    budgets = {"small": 2048, "large": 4096}
    for recs in batches.values():
        n, padded = len(recs), recs[0].padded_tokens
        assert n <= 16 and padded % 8 == 0
        assert n == 1 or n * padded <= budgets[recs[0].consumer]  # packed to the card's contract
        assert padded == -(-max(r.input_tokens for r in recs) // 8) * 8
    assert any(len(recs) > 1 for recs in batches.values())
