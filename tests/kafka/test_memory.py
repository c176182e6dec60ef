"""The in-memory Kafka stand-in keeps the semantics the apps rely on (processor/kafka/memory.py):
transactions and read_committed, fencing, the broker's transaction timeout, delivery reports, groups
and rebalances, scripted faults. Each property below is one that a committer test depends on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.kafka.memory import MemoryKafka, error


@pytest.fixture
def mk() -> MemoryKafka:
    cluster = MemoryKafka()
    cluster.create_topic("t", partitions=2)
    return cluster


def reader(mk: MemoryKafka, committed: bool = True, **extra: str):  # type: ignore[no-untyped-def]
    consumer = mk.clients().consumer(
        {"group.id": "r", "isolation.level": "read_committed" if committed else "read_uncommitted", **extra}
    )
    consumer.assign([TopicPartition("t", 0, OFFSET_BEGINNING), TopicPartition("t", 1, OFFSET_BEGINNING)])
    return consumer


def values(consumer) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [m.value() for m in consumer.consume(100, 0) if m.error() is None]


def txn_producer(mk: MemoryKafka, tid: str = "tx", timeout_ms: int = 10_000):  # type: ignore[no-untyped-def]
    producer = mk.clients().producer({"transactional.id": tid, "transaction.timeout.ms": str(timeout_ms)})
    producer.init_transactions()
    producer.begin_transaction()
    return producer


def test_a_transaction_is_invisible_to_read_committed_until_it_commits(mk: MemoryKafka) -> None:
    producer = txn_producer(mk)
    producer.produce("t", b"a", partition=0)
    committed, uncommitted = reader(mk), reader(mk, committed=False)
    assert values(committed) == [] and values(uncommitted) == [b"a"]
    producer.commit_transaction()
    assert values(committed) == [b"a"]


def test_an_aborted_transaction_is_never_read(mk: MemoryKafka) -> None:
    producer = txn_producer(mk)
    producer.produce("t", b"lost", partition=0)
    producer.abort_transaction()
    producer.begin_transaction()
    producer.produce("t", b"kept", partition=0)
    producer.commit_transaction()
    assert values(reader(mk)) == [b"kept"] and values(reader(mk, committed=False)) == [b"kept"]


def test_read_committed_watermarks_end_at_the_first_open_transaction(mk: MemoryKafka) -> None:
    plain = mk.clients().producer({})
    plain.produce("t", b"x", partition=0)
    producer = txn_producer(mk)
    producer.produce("t", b"y", partition=0)
    assert reader(mk).get_watermark_offsets(TopicPartition("t", 0)) == (0, 1)
    assert reader(mk, committed=False).get_watermark_offsets(TopicPartition("t", 0)) == (0, 2)


def test_offsets_sent_to_a_transaction_count_only_once_it_commits(mk: MemoryKafka) -> None:
    producer = txn_producer(mk)
    group = SimpleNamespace(group_id="g")
    producer.send_offsets_to_transaction([TopicPartition("t", 0, 5)], group)
    assert mk.groups["g"].committed == {}
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition("t", 0, 7)], group)
    producer.commit_transaction()
    assert mk.groups["g"].committed == {("t", 0): 7}


def test_a_newer_producer_with_the_same_id_fences_the_older_and_aborts_its_transaction(
    mk: MemoryKafka,
) -> None:
    old = txn_producer(mk)
    old.produce("t", b"zombie", partition=0)
    new = txn_producer(mk)
    with pytest.raises(KafkaException) as caught:
        old.commit_transaction()
    assert caught.value.args[0].code() == KafkaError._FENCED and caught.value.args[0].fatal()
    new.commit_transaction()
    assert values(reader(mk)) == []  # the zombie's message was aborted when the newer one started


def test_the_broker_aborts_a_transaction_past_its_timeout_and_fences_its_producer(mk: MemoryKafka) -> None:
    producer = txn_producer(mk, timeout_ms=1_000)
    producer.produce("t", b"slow", partition=0)
    mk.advance(999)
    mk.expire_transactions()
    assert producer.in_transaction  # not past the timeout yet
    mk.advance(2)
    mk.expire_transactions()
    with pytest.raises(KafkaException, match="fenced"):
        producer.commit_transaction()
    assert values(reader(mk, committed=False)) == []


def test_delivery_reports_come_from_poll_and_only_errors_when_asked(mk: MemoryKafka) -> None:
    reports: list[tuple[object, int]] = []
    producer = mk.clients().producer({})
    producer.produce("t", b"v", key=b"k", on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert reports == [] and len(producer) == 1
    producer.poll(0)
    assert reports == [(None, 0)]
    quiet = mk.clients().producer({"delivery.report.only.error": True})
    quiet.produce("t", b"v", on_delivery=lambda err, msg: reports.append((err, -1)))
    mk.fail_deliveries("t", error(KafkaError.MSG_SIZE_TOO_LARGE))
    quiet.produce("t", b"big", on_delivery=lambda err, msg: reports.append((err.code(), -2)))
    quiet.flush()
    assert reports[1:] == [(KafkaError.MSG_SIZE_TOO_LARGE, -2)]


def test_a_failed_delivery_makes_the_transaction_fail_to_commit_and_abortable(mk: MemoryKafka) -> None:
    producer = txn_producer(mk)
    mk.fail_deliveries("t", error(KafkaError.REQUEST_TIMED_OUT, retriable=True))
    producer.produce("t", b"v", partition=1)
    with pytest.raises(KafkaException) as caught:
        producer.commit_transaction()
    assert caught.value.args[0].txn_requires_abort()


def test_scripted_faults_raise_once_from_the_named_call(mk: MemoryKafka) -> None:
    producer = txn_producer(mk)
    mk.fail_next("commit_transaction", error(KafkaError._TIMED_OUT, retriable=True))
    with pytest.raises(KafkaException):
        producer.commit_transaction()
    producer.commit_transaction()  # the fault was used up
    mk.fail_next("produce", BufferError("queue full"))
    with pytest.raises(BufferError):
        mk.clients().producer({}).produce("t", b"v")


def test_group_members_share_partitions_and_rebalance_through_the_callbacks(mk: MemoryKafka) -> None:
    events: list[tuple[str, str, list[int]]] = []

    def member(name: str):  # type: ignore[no-untyped-def]
        c = mk.clients().consumer({"group.id": "g", "auto.offset.reset": "earliest"})
        c.subscribe(
            ["t"],
            on_assign=lambda _c, tps: events.append((name, "assign", [tp.partition for tp in tps])),
            on_revoke=lambda _c, tps: events.append((name, "revoke", [tp.partition for tp in tps])),
        )
        return c

    a = member("a")
    a.consume(1, 0)
    assert events == [("a", "assign", [0, 1])]
    b = member("b")
    a.consume(1, 0)
    b.consume(1, 0)
    assert events[1:] == [("a", "revoke", [0, 1]), ("a", "assign", [0]), ("b", "assign", [1])]
    b.close()
    a.consume(1, 0)
    assert events[-2:] == [("a", "revoke", [0]), ("a", "assign", [0, 1])]


def test_a_new_owner_starts_at_the_committed_offset(mk: MemoryKafka) -> None:
    producer = mk.clients().producer({})
    for v in (b"0", b"1", b"2"):
        producer.produce("t", v, partition=0)
    first = mk.clients().consumer({"group.id": "g", "auto.offset.reset": "earliest"})
    first.subscribe(["t"])
    assert [m.value() for m in first.consume(2, 0)] == [b"0", b"1"]
    first.commit(asynchronous=False)
    first.close()
    second = mk.clients().consumer({"group.id": "g", "auto.offset.reset": "earliest"})
    second.subscribe(["t"])
    assert [m.value() for m in second.consume(10, 0)] == [b"2"]


def test_partition_eof_is_reported_once_per_end(mk: MemoryKafka) -> None:
    consumer = reader(mk, **{"enable.partition.eof": "true"})
    eofs = [m for m in consumer.consume(10, 0) if m.error() is not None]
    assert sorted(m.partition() for m in eofs) == [0, 1]
    assert all(m.error().code() == KafkaError._PARTITION_EOF for m in eofs)
    assert consumer.consume(10, 0) == []


def test_list_topics_says_when_a_topic_is_missing(mk: MemoryKafka) -> None:
    meta = mk.clients().admin({}).list_topics("nope")
    assert meta.topics["nope"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert sorted(mk.clients().admin({}).list_topics().topics["t"].partitions) == [0, 1]
