"""Gather what ``tokenfabric status`` shows: contracts, the latest ledger checkpoints, and ingest lag.

Everything comes from topics, not from a processor's memory, so status works against any cluster and
shows the same figures an audit would start from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

from processor.core.contract import Contract
from processor.kafka.rdlog import with_kafka_logger
from processor.kafka.reader import passing, read_topic, watermarks
from processor.kafka.topics import TopicNames
from processor.wire.control import decode_contract, decode_ledger_snapshot
from processor.wire.records import LedgerSnapshotRecord


@dataclass(slots=True)
class StatusView:
    contracts: dict[str, Contract] = field(default_factory=dict)
    checkpoints: dict[str, LedgerSnapshotRecord] = field(default_factory=dict)
    ingest_lag: int | None = None
    ingest_end: int = 0

    def total(self, key: str) -> int:
        return sum(cp.counters.get(key, 0) for cp in self.checkpoints.values())

    def held(self, key: str) -> int:
        """``queued_*`` or ``in_flight_*`` summed over instances, less what was counted twice: state a
        crashed instance's last checkpoint still claims and another instance has adopted since
        (processor/core/accounting.py)."""
        stage, _, unit = key.rpartition("_")
        twice = self.total(f"adopted_{stage}_{unit}") - self.total(f"released_{stage}_{unit}")
        return self.total(key) - twice

    def consumer_total(self, consumer: str, key: str) -> int:
        return sum(cp.counters.get(f"{key}#{consumer}", 0) for cp in self.checkpoints.values())

    def consumer_gauge(self, consumer: str, key: str) -> int:
        return sum(cp.per_consumer.get(consumer, {}).get(key, 0) for cp in self.checkpoints.values())


def ingest_lag(
    conf: Mapping[str, str], topic: str, group: str, timeout_s: float = 10.0
) -> tuple[int | None, int]:
    """(messages the group has not committed past, messages ever written) on ``topic``."""
    consumer = Consumer(with_kafka_logger({**conf, "group.id": group, "enable.auto.commit": "false"}))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return None, 0
        tps = [TopicPartition(topic, p) for p in meta.partitions]
        try:
            committed: list[TopicPartition] | None = consumer.committed(tps, timeout=timeout_s)
        except KafkaException as exc:
            if not passing(exc):
                raise
            committed = None  # coordinator moving, or offsets held by an open transaction: unknown for now
        lag = end = 0
        for tp in committed if committed is not None else tps:
            low, high = watermarks(consumer, TopicPartition(topic, tp.partition), timeout_s)
            end += high
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return (lag if committed is not None else None), end
    finally:
        consumer.close()


def gather(conf: Mapping[str, str], topics: TopicNames, group: str = "") -> StatusView:
    view = StatusView()
    for msg in read_topic(conf, topics.contracts):
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            view.contracts.pop(key, None)
        else:
            view.contracts[key] = decode_contract(msg.value()).contract
    # The latest checkpoint of every live processor is near the end; an audit reads it all.
    for msg in read_topic(conf, topics.accounting, tail=2000):
        cp = decode_ledger_snapshot(msg.value())
        previous = view.checkpoints.get(cp.instance)
        if previous is None or (cp.taken_ms, cp.sequence) >= (previous.taken_ms, previous.sequence):
            view.checkpoints[cp.instance] = cp
    view.ingest_lag, view.ingest_end = ingest_lag(conf, topics.ingest, group or topics.processor_group)
    return view
