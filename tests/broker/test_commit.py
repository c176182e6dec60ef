"""The delivery modes' roles (processor/state/modes.py) against the session broker.

Exactly-once: what a step produced (batches, changelog records, the checkpoint) and the ingest offsets
become visible to ``read_committed`` readers together, when the transaction commits; a transaction a
crash left open shows nothing, and the replacement that fences it leaves the zombie unable to commit.
At-least-once: an ingest offset is committed only once the batch carrying its item was answered
(one test per mode: the rest of the delivery modes' paths, a failed delivery included, run over the
in-memory Kafka in tests/state/test_committers.py).

The roles are driven the way ProcessorService drives them, with the same client settings
(processor/kafka/clients.py), but without the service: each test decides what was consumed, emitted
and answered.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processor.core.item import Batch
from processor.kafka.clients import batch_producer_settings, control_settings, ingest_settings
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.state import changelog, modes
from processor.state.durability import CommitClients, Transactions
from processor.state.ingest import IngestItem
from processor.state.placement import Placement
from processor.wire.heads import decode_item_head
from processor.wire.items import decode_batch, encode_batch, encode_token_item
from processor.wire.records import new_token_item
from tests.broker.rig import new_topics

pytestmark = pytest.mark.kafka

CONSUMER = "card"
SNAPSHOT = b"checkpoint"  # the durability writes whatever bytes the snapshot callable returns


@pytest.fixture
def topics(kafka_bootstrap: str) -> tuple[dict[str, str], TopicNames]:
    return new_topics(kafka_bootstrap, "k", [CONSUMER], ingest_partitions=2)


def produce_items(conf: dict[str, str], topics: TopicNames, partition: int, ids: list[str]) -> None:
    producer = Producer(conf)
    for item_id in ids:
        rec = new_token_item(item_id, "m", [1, 2, 3, 4], 0, shape_components=["sys"])
        producer.produce(topics.ingest, encode_token_item(rec), item_id.encode(), partition=partition)
    assert producer.flush(30) == 0


def consume(ingest: Consumer, n: int) -> list[IngestItem]:
    """The next ``n`` ingest messages as the service makes items of them."""
    items: list[IngestItem] = []
    deadline = time.monotonic() + 30
    while len(items) < n:
        assert time.monotonic() < deadline, f"consumed {len(items)} of {n} ingest messages"
        for msg in ingest.consume(num_messages=n - len(items), timeout=0.5):
            assert msg.error() is None, msg.error()
            head = decode_item_head(msg.value())
            items.append(IngestItem.from_head(head, 0, msg.partition(), msg.offset()))
    return items


def batch_of(batch_id: str, items: list[IngestItem]) -> Batch:
    for it in items:
        it.dispatched = True
    return Batch(batch_id, CONSUMER, "m", items[0].shape, 0, 8, 8, list(items), 1_000)


def committed_offsets(conf: dict[str, str], topic: str, group: str) -> dict[int, int]:
    reader = Consumer({**conf, "group.id": group, "isolation.level": "read_committed"})
    try:
        tps = reader.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=30)
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}


def uncommitted_values(conf: dict[str, str], topic: str) -> list[bytes]:
    """Every value in ``topic``, aborted transactions included (read_uncommitted)."""
    reader = Consumer(
        {
            **conf,
            "group.id": f"uncommitted-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_uncommitted",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    values: list[bytes] = []
    try:
        partitions = len(reader.list_topics(topic, timeout=30).topics[topic].partitions)
        reader.subscribe([topic])
        deadline, at_end = time.monotonic() + 30, 0
        while at_end < partitions:
            assert time.monotonic() < deadline, f"end of {topic} not reached"
            msg = reader.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end += 1
                continue
            values.append(msg.value())
    finally:
        reader.close()
    return values


class Killed(Exception):
    """The process died here."""


class DiesBeforeCommitting:
    """A producer whose process is killed between sending its offsets and committing."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def __getattr__(self, name: str) -> object:
        return getattr(self._producer, name)

    def commit_transaction(self, *_args: object) -> None:
        raise Killed


class Clients:
    """The ingest and control consumers and the producer of one processor instance."""

    def __init__(self, conf: dict[str, str], group: str, transactional_id: str | None) -> None:
        self.ingest = Consumer(ingest_settings(conf, group, 6000, transactional_id or f"{group}-member"))
        self.control = Consumer(control_settings(conf, f"{group}-control"))
        self.producer = Producer(batch_producer_settings(conf, transactional_id, 10_000))

    def close(self) -> None:
        self.ingest.close()
        self.control.close()


@pytest.fixture
def clients() -> Iterator[list[Clients]]:
    made: list[Clients] = []
    yield made
    for c in made:
        c.close()


def transactional(
    conf: dict[str, str], topics: TopicNames, group: str, made: list[Clients], in_flight: set[str]
) -> modes.DeliveryMode:
    c = Clients(conf, group, f"{group}-p0")
    made.append(c)
    c.ingest.assign([TopicPartition(topics.ingest, p, 0) for p in (0, 1)])
    options = modes.ExactlyOnceOptions(in_flight.__contains__, lambda _batch_id: [], eager_ms=50)
    return modes.exactly_once(CommitClients(c.producer, c.ingest, c.control), topics, "p0", 100, options)


def emit(mode: modes.DeliveryMode, topics: TopicNames, batch: Batch) -> None:
    """What the service does with a batch the core emitted: the slot's partition, then the produce."""
    mode.lane_log.batch_emitted(batch, Placement(1, 0, ((0, 0),)))
    deliver = mode.durability.batch_delivery()
    mode.durability.produce(topics.batches(CONSUMER), encode_batch(batch), batch.batch_id.encode(), deliver)


def test_a_committed_transaction_shows_its_batches_changelog_and_offsets_and_an_open_one_nothing(
    kafka_bootstrap: str, topics: tuple[dict[str, str], TopicNames], clients: list[Clients]
) -> None:
    conf, names = topics
    group = f"{names.prefix}-proc"
    produce_items(conf, names, 0, ["a0", "a1", "a2"])
    produce_items(conf, names, 1, ["b0", "b1", "b2"])
    in_flight = {"batch-1"}
    mode = transactional(conf, names, group, clients, in_flight)
    committer = mode.durability
    assert isinstance(committer, Transactions)
    committer.start(None)
    items = consume(committer.ingest, 6)
    for it in items:
        mode.lane_log.item_seen(it)
    by_id = {it.id: it for it in items}
    emit(mode, names, batch_of("batch-1", [by_id["a0"], by_id["b0"]]))
    assert committer.commit(lambda: SNAPSHOT) >= 0

    (batch,) = [decode_batch(m.value()) for m in read_topic(conf, names.batches(CONSUMER))]
    assert [it.item_id for it in batch.items] == ["a0", "b0"]
    assert [m.value() for m in read_topic(conf, names.accounting)] == [SNAPSHOT]
    assert committed_offsets(conf, names.ingest, group) == {0: 3, 1: 3}  # with the batch, not before
    state = changelog.ChangelogState()
    for m in read_topic(conf, names.changelog):
        state.apply(m.key(), m.value(), m.partition())
    # the four items not dispatched wait, each in its own partition's chunk; the batch is in partition 1
    assert state.waiting == {(0, 1): 0, (0, 2): 0, (1, 1): 1, (1, 2): 1}
    assert state.homes == {"batch-1": 1}
    entry = state.batches["batch-1"]
    assert (entry.consumer, entry.refs, entry.slot, entry.results_from) == (
        CONSUMER,
        ((0, 0), (1, 0)),
        0,
        ((0, 0),),
    )

    # a second step: everything goes into the transaction, then the process dies before it commits
    produce_items(conf, names, 0, ["a3", "a4"])
    later = consume(committer.ingest, 2)
    for it in later:
        mode.lane_log.item_seen(it)
    in_flight.add("batch-2")
    emit(mode, names, batch_of("batch-2", later))
    zombie = committer.producer
    committer.producer = DiesBeforeCommitting(zombie)  # type: ignore[assignment]
    with pytest.raises(Killed):
        committer.commit(lambda: b"never committed")
    assert zombie.flush(30) == 0  # its batch, changelog record and checkpoint did reach the log

    replacement = transactional(conf, names, group, clients, set())
    replacement.durability.start(
        None
    )  # the same transactional id: aborts the open transaction and fences the old one
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)

    assert [decode_batch(m.value()).batch_id for m in read_topic(conf, names.batches(CONSUMER))] == [
        "batch-1"
    ]
    assert [m.value() for m in read_topic(conf, names.accounting)] == [SNAPSHOT]
    assert committed_offsets(conf, names.ingest, group) == {0: 3, 1: 3}  # a restart reads a3, a4 again
    assert sorted(uncommitted_values(conf, names.accounting)) == sorted([SNAPSHOT, b"never committed"])
    again = changelog.ChangelogState()
    for m in read_topic(conf, names.changelog):
        again.apply(m.key(), m.value(), m.partition())
    assert again.waiting == state.waiting and again.batches == state.batches
    # the aborted batch did reach the log: only read_committed hides it
    raw = [decode_batch(v).batch_id for v in uncommitted_values(conf, names.batches(CONSUMER))]
    assert sorted(raw) == ["batch-1", "batch-2"]


def test_at_least_once_commits_an_offset_only_after_the_batch_holding_its_item_is_answered(
    kafka_bootstrap: str, topics: tuple[dict[str, str], TopicNames], clients: list[Clients]
) -> None:
    conf, names = topics
    group = f"{names.prefix}-proc"
    c = Clients(conf, group, None)
    clients.append(c)
    c.ingest.assign([TopicPartition(names.ingest, 0, 0)])
    mode = modes.at_least_once(CommitClients(c.producer, c.ingest, c.control), names, "p0", 100)
    committer = mode.durability
    produce_items(conf, names, 0, ["a0", "a1", "a2", "a3"])
    items = consume(c.ingest, 4)
    for it in items:
        mode.lane_log.item_seen(it)
    batch = batch_of("batch-1", items[:2])
    emit(mode, names, batch)
    dead = mode.lane_log.dead_letter(0, 4)  # offset 4 carried no item: dead-lettered, acknowledged below

    committer.commit(lambda: SNAPSHOT)  # nothing delivered yet: the first item is not safe
    assert committed_offsets(conf, names.ingest, group) == {0: 0}

    assert c.producer.flush(30) == 0  # delivered, not yet answered: still read again after a crash
    committer.commit(lambda: SNAPSHOT)
    assert committed_offsets(conf, names.ingest, group) == {0: 0}
    mode.lane_log.batch_finished("batch-1")  # answered: a0 and a1 are safe, a2 still waits
    committer.commit(lambda: SNAPSHOT)
    assert committed_offsets(conf, names.ingest, group) == {0: 2}

    items[2].safe = items[3].safe = True  # as if dispatched, delivered and answered
    committer.commit(lambda: SNAPSHOT)
    assert committed_offsets(conf, names.ingest, group) == {0: 4}  # the dead letter is not yet acknowledged
    assert dead is not None
    dead(None, None)
    committer.commit(lambda: SNAPSHOT)
    assert committed_offsets(conf, names.ingest, group) == {0: 5}
    committer.check_delivered()  # nothing failed
