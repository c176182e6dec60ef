"""The share-group queue baseline on the broker (KIP-932, Kafka 4.4): cards in one share group, every
item completed once and acknowledged; a card that cannot write its completions releases its records,
and another card completes them."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from confluent_kafka import ShareConsumer

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.apps.sharequeue import ShareQueueApp, share_group
from processor.core.contract import Contract
from processor.engines.sim import SimEngine
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.sim.cardmodel import CardSpec
from processor.sim.tracegen import synthetic_records
from processor.wire.completions import decode_completions
from tests.broker.rig import Threads, new_topics, wait_for

pytestmark = pytest.mark.kafka

ITEMS = 200


@dataclass(frozen=True)
class _Unwritable(TopicNames):
    """A pipeline whose results topic name Kafka refuses: every completion fails to be written."""

    @property
    def results(self) -> str:
        return f"{self.prefix}.results with a space"


def _card(conf: dict[str, str], topics: TopicNames, name: str) -> ShareQueueApp:
    contract = Contract(name, "default", 2048, 16, 8, 1)
    engine = SimEngine(CardSpec(tokens_per_s=60_000, overhead_ms=1), 1.0)
    return ShareQueueApp(conf, topics, contract, engine, poll_timeout_s=0.2)


def _produce(conf: dict[str, str], topics: TopicNames) -> set[str]:
    records = synthetic_records(ITEMS, seed=9, shapes=5, min_len=16, max_len=400, rate_per_s=None)
    with TokenProducer(conf, topics, key_of=lambda rec: rec.item_id.encode()) as producer:
        for r in records:
            producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
    return {r.id for r in records}


def _completed(conf: dict[str, str], topics: TopicNames) -> Counter[str]:
    done: Counter[str] = Counter()
    for msg in read_topic(conf, topics.results):
        done.update(rec.item_id for rec in decode_completions(msg.value()))
    return done


def _run_until_done(conf: dict[str, str], topics: TopicNames, cards: list[ShareQueueApp]) -> Counter[str]:
    """Run the cards until every item has a completion; the completions per item."""
    runner = Threads()
    for card in cards:
        runner.start(card.run, card.contract.consumer)
    try:
        wait_for(lambda: len(_completed(conf, topics)) == ITEMS, 90, "every item completed")
    finally:
        runner.join()
    assert not runner.errors
    return _completed(conf, topics)


def test_two_cards_complete_every_item_once_and_acknowledge_it(kafka_bootstrap: str) -> None:
    conf, topics = new_topics(kafka_bootstrap, "s", [], ingest_partitions=2)
    ids = _produce(conf, topics)  # before any card joins: the group reads from the earliest record
    cards = [_card(conf, topics, name) for name in ("a", "b")]
    done = _run_until_done(conf, topics, cards)
    assert set(done) == ids and max(done.values()) == 1
    assert sum(card.stats.items for card in cards) == ITEMS and all(c.released == 0 for c in cards)
    assert _left_in_the_group(conf, topics) == 0  # every record ACCEPTed: none comes back


def _left_in_the_group(conf: dict[str, str], topics: TopicNames, wait_s: float = 8.0) -> int:
    """Records a new member of the share group still acquires (a closing member releases what it
    acquired and did not acknowledge, so those would come back here at once)."""
    consumer = ShareConsumer({**conf, "group.id": share_group(topics), "log_level": "3"})
    consumer.subscribe([topics.ingest])
    got = 0
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            got += sum(1 for m in consumer.poll(0.5) if m.error() is None)
    finally:
        consumer.close()
    return got


def test_a_card_that_cannot_write_releases_its_records_and_another_completes_them(
    kafka_bootstrap: str,
) -> None:
    conf, topics = new_topics(kafka_bootstrap, "s", [], ingest_partitions=2)
    ids = _produce(conf, topics)
    broken = _card(conf, _Unwritable(topics.prefix), "broken")
    stop = threading.Event()
    thread = threading.Thread(target=broken.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: broken.released > 0, 60, "the broken card released a batch")
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert _completed(conf, topics) == Counter()  # nothing was written
    done = _run_until_done(conf, topics, [_card(conf, topics, "healthy")])
    assert set(done) == ids and max(done.values()) == 1  # the released records, once each
