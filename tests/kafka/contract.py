"""The in-memory Kafka's contract: properties the adapters rely on, run against both sides.

tests/kafka/test_memory_contract.py runs every ``check_*`` below over ``MemoryKafka``;
tests/broker/test_memory_contract.py runs the same functions over the real broker (marked ``kafka``).
One body per property, two fixtures: if the fake drifts from the broker, the broker run fails where
the memory run passes. The module is not collected itself (no ``test_`` prefix).

A :class:`Side` hides only what must differ: how a topic is made, which factory builds clients, and
how long a read may wait (the memory side answers at once; the broker side polls until its deadline).
Nothing here asserts an exact offset after a transaction: the broker's commit markers take offsets,
the fake's do not (processor/kafka/memory.py lists what it does not model).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from processor.kafka import exits
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient, ProducerClient
from processor.kafka.memory import MemoryKafka

Msg = Any


@dataclass
class Side:
    """One Kafka to check: ``factory`` builds its clients, ``make_topic`` its topics."""

    name: str
    factory: ClientFactory
    make_topic: Callable[[str, int, dict[str, str]], None]
    base: dict[str, str]
    wait_s: float
    """How long a read waits for what it expects (0 on the memory side: everything is there at once)."""
    closing: list[Any] = field(default_factory=list)

    def topic(self, partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"contract-{uuid.uuid4().hex[:10]}"
        self.make_topic(name, partitions, dict(config or {}))
        return name

    def producer(self, **settings: Any) -> ProducerClient:
        return self.factory.producer({**self.base, **settings})

    def txn(self, tid: str | None = None, **settings: str) -> ProducerClient:
        """A transactional producer, initialised, no transaction open."""
        producer = self.producer(**{"transactional.id": tid or f"tx-{uuid.uuid4().hex[:8]}", **settings})
        producer.init_transactions(30)
        return producer

    def consumer(self, group: str | None = None, **settings: str) -> ConsumerClient:
        conf = {
            "group.id": group or f"g-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": "false",
            **settings,
        }
        consumer = self.factory.consumer({**self.base, **conf})
        self.closing.append(consumer)
        return consumer

    def reader(self, topic: str, partitions: int = 1, **settings: str) -> ConsumerClient:
        consumer = self.consumer(**settings)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        return consumer

    def read(self, consumer: ConsumerClient, until: Callable[[list[Msg]], bool]) -> list[Msg]:
        """Consume (data messages and partition ends) until ``until(messages)`` holds; the memory side
        stops at its first empty answer, the broker side at ``wait_s``."""
        got: list[Msg] = []
        deadline = time.monotonic() + self.wait_s
        while not until(got):
            batch = consumer.consume(100, 0.2 if self.wait_s else 0)
            got.extend(m for m in batch if m.error() is None or m.error().code() == KafkaError._PARTITION_EOF)
            if (not batch and not self.wait_s) or time.monotonic() > deadline:
                break
        return got

    def values(self, consumer: ConsumerClient, n: int) -> list[bytes]:
        """The values of the next ``n`` data messages (fewer if they never come)."""
        return [m.value() for m in data(self.read(consumer, lambda got: len(data(got)) >= n))]

    def close(self) -> None:
        for consumer in self.closing:
            with contextlib.suppress(RuntimeError, KafkaException):
                consumer.close()


def data(messages: list[Msg]) -> list[Msg]:
    return [m for m in messages if m.error() is None]


def ends(messages: list[Msg]) -> set[int]:
    return {m.partition() for m in messages if m.error() is not None}


def memory_side() -> Iterator[Side]:
    cluster = MemoryKafka()
    side = Side("memory", cluster.clients(), cluster.create_topic, {}, 0.0)
    yield side
    side.close()


def broker_side(bootstrap: str) -> Iterator[Side]:
    from confluent_kafka.admin import NewTopic

    base = {"bootstrap.servers": bootstrap}
    admin = KAFKA.admin(base)

    def make_topic(name: str, partitions: int, config: dict[str, str]) -> None:
        futures = admin.create_topics([NewTopic(name, partitions, 1, config=config)])
        futures[name].result(30)

    side = Side("broker", KAFKA, make_topic, base, 20.0)
    yield side
    side.close()


# -- logs and partitions --------------------------------------------------------------------------


def check_each_partition_reads_in_the_order_written(side: Side) -> None:
    topic = side.topic(partitions=2)
    producer = side.producer()
    for i in range(30):
        producer.produce(topic, f"{i}".encode(), partition=i % 2)
    producer.flush(10)
    got = data(side.read(side.reader(topic, 2), lambda got: len(data(got)) >= 30))
    for p in (0, 1):
        mine = [m for m in got if m.partition() == p]
        assert [int(m.value()) for m in mine] == list(range(p, 30, 2))
        assert [m.offset() for m in mine] == list(range(15))


def check_a_key_goes_to_the_partition_memory_kafka_computes(side: Side) -> None:
    topic = side.topic(partitions=3)
    producer = side.producer()
    keys = [f"key-{i}".encode() for i in range(24)]
    for key in keys:
        producer.produce(topic, b"v", key=key)
    producer.flush(10)
    got = data(side.read(side.reader(topic, 3), lambda got: len(data(got)) >= len(keys)))
    reference = MemoryKafka()
    reference.create_topic("ref", 3)
    assert {m.key(): m.partition() for m in got} == {k: reference.partition_for("ref", k) for k in keys}


def check_delivery_reports_come_from_poll_or_flush_not_produce(side: Side) -> None:
    topic = side.topic()
    reports: list[tuple[Any, Msg]] = []
    producer = side.producer()
    producer.produce(topic, b"a", on_delivery=lambda err, msg: reports.append((err, msg)))
    assert reports == []
    producer.flush(10)
    [(err, msg)] = reports
    assert err is None and msg.offset() == 0 and msg.value() == b"a"
    quiet = side.producer(**{"delivery.report.only.error": True})
    quiet.produce(topic, b"b", on_delivery=lambda err, msg: reports.append((err, msg)))
    quiet.flush(10)
    assert len(reports) == 1


def check_a_tombstone_reads_back_as_none_and_the_last_value_per_key_wins(side: Side) -> None:
    """What the compacted topics' readers rely on (jobs, contracts, shares): they read the topic whole
    and keep the last value per key; a None value retires the key. Compaction itself may or may not
    have run, so nothing depends on it."""
    topic = side.topic(config={"cleanup.policy": "compact"})
    producer = side.producer()
    for key, value in [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"b", None)]:
        producer.produce(topic, value, key=key)
    producer.flush(10)
    latest: dict[bytes, bytes | None] = {}
    for m in data(side.read(side.reader(topic), lambda got: len(data(got)) >= 4)):
        latest[m.key()] = m.value()
    assert latest == {b"a": b"2", b"b": None}


# -- transactions ---------------------------------------------------------------------------------


def check_read_committed_hides_an_open_transaction_and_what_follows_it(side: Side) -> None:
    topic = side.topic()
    plain = side.producer()
    plain.produce(topic, b"before", partition=0)
    plain.flush(10)
    txn = side.txn()
    txn.begin_transaction()
    txn.produce(topic, b"open", partition=0)
    txn.flush(10)
    plain.produce(topic, b"after", partition=0)
    plain.flush(10)
    committed = side.reader(topic, **{"enable.partition.eof": "true"})
    seen = side.read(committed, lambda got: 0 in ends(got))
    assert [m.value() for m in data(seen)] == [b"before"] and 0 in ends(seen)
    assert committed.get_watermark_offsets(TopicPartition(topic, 0), 10)[1] == 1
    uncommitted = side.reader(topic, **{"isolation.level": "read_uncommitted"})
    assert side.values(uncommitted, 3) == [b"before", b"open", b"after"]
    txn.commit_transaction(30)
    assert side.values(committed, 2) == [b"open", b"after"]


def check_an_aborted_transaction_is_never_read(side: Side) -> None:
    topic = side.topic()
    txn = side.txn()
    txn.begin_transaction()
    txn.produce(topic, b"lost", partition=0)
    txn.abort_transaction(30)
    txn.begin_transaction()
    txn.produce(topic, b"kept", partition=0)
    txn.commit_transaction(30)
    assert side.values(side.reader(topic), 1) == [b"kept"]
    assert side.values(side.reader(topic, **{"isolation.level": "read_uncommitted"}), 1) == [b"kept"]


def check_commit_transaction_delivers_the_reports(side: Side) -> None:
    topic = side.topic()
    reports: list[Any] = []
    txn = side.txn()
    txn.begin_transaction()
    txn.produce(topic, b"x", on_delivery=lambda err, msg: reports.append(err))
    txn.commit_transaction(30)
    assert reports == [None]


def check_offsets_sent_to_a_transaction_count_only_once_it_commits(side: Side) -> None:
    topic = side.topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    meta = side.consumer(group).consumer_group_metadata()
    txn = side.txn()
    txn.begin_transaction()
    txn.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], meta, 30)
    txn.abort_transaction(30)
    assert side.consumer(group).committed([TopicPartition(topic, 0)], 10)[0].offset == OFFSET_INVALID
    txn.begin_transaction()
    txn.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], meta, 30)
    txn.commit_transaction(30)
    assert side.consumer(group).committed([TopicPartition(topic, 0)], 10)[0].offset == 7


def check_a_transaction_cannot_begin_twice_nor_produce_outside_one(side: Side) -> None:
    topic = side.topic()
    txn = side.txn()
    with pytest.raises(KafkaException) as outside:
        txn.produce(topic, b"x")
    assert outside.value.args[0].code() == KafkaError._STATE
    txn.begin_transaction()
    with pytest.raises(KafkaException) as twice:
        txn.begin_transaction()
    assert twice.value.args[0].code() == KafkaError._STATE
    txn.abort_transaction(30)


def check_a_second_producer_with_the_same_id_fences_the_first(side: Side) -> None:
    topic = side.topic()
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    old = side.txn(tid)
    old.begin_transaction()
    old.produce(topic, b"old", partition=0)
    old.flush(10)
    new = side.txn(tid)  # aborts what the old one left open
    new.begin_transaction()
    new.produce(topic, b"new", partition=0)
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as fenced:
        old.produce(topic, b"late", partition=0)
        old.flush(10)
        old.commit_transaction(30)
    assert exits.producer_fenced(fenced.value) and exits.fatal(fenced.value.args[0])
    assert side.values(side.reader(topic), 1) == [b"new"]  # "old" (offset 0) would come first


# -- consumers and groups -------------------------------------------------------------------------


def check_committed_offsets_decide_where_a_new_member_starts(side: Side) -> None:
    topic = side.topic()
    producer = side.producer()
    for i in range(5):
        producer.produce(topic, f"{i}".encode(), partition=0)
    producer.flush(10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = side.consumer(group)
    first.assign([TopicPartition(topic, 0)])
    got = data(side.read(first, lambda got: len(data(got)) >= 5))
    assert first.position([TopicPartition(topic, 0)])[0].offset == 5
    first.commit(message=got[2], asynchronous=False)  # what the consumer app does: up to one message
    assert first.committed([TopicPartition(topic, 0)], 10)[0].offset == 3
    first.close()
    second = side.consumer(group)
    second.subscribe([topic])
    assert side.values(second, 2) == [b"3", b"4"]


def check_assign_at_an_offset_reads_from_there(side: Side) -> None:
    topic = side.topic()
    producer = side.producer()
    for i in range(4):
        producer.produce(topic, f"{i}".encode(), partition=0)
    producer.flush(10)
    consumer = side.consumer()
    consumer.assign([TopicPartition(topic, 0, 2)])
    assert side.values(consumer, 2) == [b"2", b"3"]


def check_members_share_the_partitions_through_revoke_and_assign(side: Side) -> None:
    topic = side.topic(partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    calls: dict[str, list[tuple[str, set[int]]]] = {"a": [], "b": []}

    def member(name: str) -> ConsumerClient:
        consumer = side.consumer(group, **{"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"})
        consumer.subscribe(
            [topic],
            on_assign=lambda c, tps: calls[name].append(("assign", {tp.partition for tp in tps})),
            on_revoke=lambda c, tps: calls[name].append(("revoke", {tp.partition for tp in tps})),
        )
        return consumer

    def owned(name: str) -> set[int]:
        mine: set[int] = set()
        for what, parts in calls[name]:
            mine = mine - parts if what == "revoke" else mine | parts
        return mine

    a = member("a")
    side.read(a, lambda _got: owned("a") == {0, 1})
    assert owned("a") == {0, 1}
    b = member("b")
    deadline = time.monotonic() + side.wait_s
    while not (len(owned("a")) == 1 and len(owned("b")) == 1):
        a.consume(10, 0.1 if side.wait_s else 0)
        b.consume(10, 0.1 if side.wait_s else 0)
        if time.monotonic() > deadline:
            break
    assert owned("a") | owned("b") == {0, 1} and len(owned("a")) == len(owned("b")) == 1
    assert any(what == "revoke" for what, _ in calls["a"])  # the callbacks the committers hang on
    b.close()
    side.read(a, lambda _got: owned("a") == {0, 1})
    assert owned("a") == {0, 1}


# -- errors the adapters classify -----------------------------------------------------------------


def check_an_unknown_topic_is_reported_in_its_metadata(side: Side) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    meta = side.producer().list_topics(missing, 10)
    assert meta.topics[missing].error is not None
    assert meta.topics[missing].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    known = side.topic(partitions=2)
    assert sorted(side.producer().list_topics(known, 10).topics[known].partitions) == [0, 1]


def check_a_static_member_is_fenced_by_a_newer_one_with_its_id(side: Side) -> None:
    topic = side.topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    static = {"group.instance.id": f"i-{uuid.uuid4().hex[:6]}", "session.timeout.ms": "6000",
              "heartbeat.interval.ms": "500"}  # fmt: skip
    old = side.consumer(group, **static)
    old.subscribe([topic])
    side.read(old, lambda _got: bool(old.assignment()))
    new = side.consumer(group, **static)
    new.subscribe([topic])
    side.read(new, lambda _got: bool(new.assignment()))
    problem: BaseException | None = None
    deadline = time.monotonic() + side.wait_s
    while problem is None:
        try:
            for m in old.consume(10, 0.2 if side.wait_s else 0):
                if m.error() is not None and m.error().code() != KafkaError._PARTITION_EOF:
                    problem = KafkaException(m.error())
        except KafkaException as exc:
            problem = exc
        if time.monotonic() > deadline:
            break
    assert problem is not None and exits.instance_fenced(problem)


CHECKS = {name: fn for name, fn in dict(globals()).items() if name.startswith("check_")}
"""Every property, by name: the two test modules turn each into a test."""


def as_tests(namespace: dict[str, Any]) -> None:
    """Define ``test_<property>`` in ``namespace`` (a test module's globals) for every check, each taking
    the module's ``side`` fixture."""
    for name, check in CHECKS.items():

        def test(side: Side, check: Callable[[Side], None] = check) -> None:
            check(side)

        test.__name__ = "test_" + name.removeprefix("check_")
        test.__doc__ = check.__doc__
        namespace[test.__name__] = test


__all__ = ["Side", "as_tests", "broker_side", "memory_side"]
