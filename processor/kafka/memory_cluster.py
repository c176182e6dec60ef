"""The in-memory cluster behind :class:`~processor.kafka.memory.MemoryKafka`: partitioned logs of
records, transactions' pending records and their outcome, groups with their committed offsets and
members, scripted faults. The clients (processor/kafka/memory_clients.py) read and write it; this
module imports neither them nor the factory, so the three sit in one line: ``memory`` (the face and
the client factory) over ``memory_clients`` over ``memory_cluster``. What is kept faithful, and what
is not modelled, is in processor/kafka/memory.py's docstring.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from processor.kafka.topics import TopicSpec

__all__ = ["ABORTED", "COMMITTED", "PENDING", "Group", "MemoryCluster", "Record", "error"]

PENDING, COMMITTED, ABORTED = "pending", "committed", "aborted"


@dataclass(slots=True)
class Record:
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    state: str = COMMITTED
    owner: int = 0  # the producer session (transactional id + epoch) that wrote a pending record


@dataclass(slots=True)
class Group:
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    members: list[Any] = field(default_factory=list)  # its MemoryConsumers, in join order
    generation: int = 0


def error(
    code: int, reason: str = "", *, fatal: bool = False, retriable: bool = False, abortable: bool = False
) -> KafkaError:
    """A ``KafkaError`` as librdkafka would raise it (``abortable``: ``txn_requires_abort``)."""
    return KafkaError(code, reason or None, fatal=fatal, retriable=retriable, txn_requires_abort=abortable)


class MemoryCluster:
    """One in-memory cluster. Not thread-safe: tests drive it from one thread, like the apps' loops.

    ``clock_ms`` is the cluster's clock (message timestamps, transaction expiry); tests advance it.
    """

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._time = 1_000_000
        self.clock_ms = clock_ms or (lambda: self._time)
        self.topics: dict[str, list[list[Record]]] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.groups: dict[str, Group] = defaultdict(Group)
        self._epochs: dict[str, int] = {}
        self._sessions = 0
        self._faults: dict[str, list[KafkaError | Exception]] = defaultdict(list)
        self._delivery_faults: dict[str, KafkaError] = {}
        self._message_errors: dict[str, list[KafkaError]] = defaultdict(list)
        self.open_transactions: list[Any] = []
        r"""Transactional producers with a transaction open (fencing and expiry find them here): the
        clients module's ``MemoryProducer``\ s, typed ``Any`` because that module sits above this one."""
        self.calls: list[str] = []
        """Every client call's method name, in order (for tests that assert on the order of a commit)."""

    # -- the cluster ---------------------------------------------------------------------------

    def advance(self, ms: int) -> None:
        """Move the default clock on."""
        self._time += ms

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        if name not in self.topics:
            self.topics[name] = [[] for _ in range(partitions)]
            self.configs[name] = dict(config or {})

    def create_topics(self, specs: Iterable[TopicSpec]) -> None:
        """Create a pipeline's topics as ``tokenfabric topics create`` would (processor.kafka.topics)."""
        for spec in specs:
            self.create_topic(spec.name, spec.partitions, dict(spec.config))

    def fail_next(self, method: str, err: KafkaError | Exception, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (a client method name, e.g. ``commit_transaction``)
        on any client raise ``KafkaException(err)`` (or ``err`` itself when it is an exception, such
        as the ``BufferError`` of a full producer queue) instead of doing anything."""
        self._faults[method].extend([err] * times)

    def fail_deliveries(self, topic: str, err: KafkaError | None) -> None:
        """Every later delivery to ``topic`` fails with ``err`` (None: deliveries succeed again)."""
        if err is None:
            self._delivery_faults.pop(topic, None)
        else:
            self._delivery_faults[topic] = err

    def error_message(self, topic: str, err: KafkaError) -> None:
        """The next consume of a consumer reading ``topic`` returns a message carrying ``err`` (how
        librdkafka reports a consumer's errors, fatal ones included)."""
        self._message_errors[topic].append(err)

    def _call(self, method: str) -> None:
        self.calls.append(method)
        queued = self._faults.get(method)
        if queued:
            fault = queued.pop(0)
            raise fault if isinstance(fault, Exception) else KafkaException(fault)

    def rebalance(self, group: str) -> None:
        """Make every member of ``group`` revoke and re-receive its partitions at its next consume."""
        self.groups[group].generation += 1

    def expire_transactions(self, timeout_ms_default: int = 60_000) -> None:
        """The broker's transaction timeout: abort every transaction open longer than its producer's
        ``transaction.timeout.ms`` on the cluster's clock, and fence that producer."""
        for producer in list(self.open_transactions):
            if producer._began_ms is not None:
                limit = int(producer.settings.get("transaction.timeout.ms", timeout_ms_default))
                if self.clock_ms() - producer._began_ms > limit:
                    self._abort(producer._session)
                    producer._end()
                    producer._fenced = True
                    self._epochs[producer.transactional_id or ""] += 1

    def partition_for(self, topic: str, key: bytes | None) -> int:
        n = len(self.topics[topic])
        return 0 if key is None else zlib.crc32(key) % n

    def append(self, topic: str, partition: int, record: Record) -> int:
        log = self.topics[topic][partition]
        log.append(record)
        return len(log) - 1

    def stable_end(self, topic: str, partition: int) -> int:
        """The last stable offset: the first pending record, else the log's end."""
        log = self.topics[topic][partition]
        for offset, record in enumerate(log):
            if record.state == PENDING:
                return offset
        return len(log)

    def _abort(self, session: int) -> None:
        for partitions in self.topics.values():
            for log in partitions:
                for record in log:
                    if record.state == PENDING and record.owner == session:
                        record.state = ABORTED

    def _commit(self, session: int) -> None:
        for partitions in self.topics.values():
            for log in partitions:
                for record in log:
                    if record.state == PENDING and record.owner == session:
                        record.state = COMMITTED

    def new_session(self, transactional_id: str | None) -> int:
        self._sessions += 1
        if transactional_id is not None:
            self._epochs[transactional_id] = self._epochs.get(transactional_id, 0) + 1
        return self._sessions

    def epoch(self, transactional_id: str) -> int:
        return self._epochs.get(transactional_id, 0)

    def metadata(self, topic: str | None) -> Any:
        """What ``list_topics`` returns: ``.topics[name].partitions`` and ``.error``."""
        names = list(self.topics) if topic is None else [topic]
        topics = {}
        for name in names:
            if name in self.topics:
                parts = {p: SimpleNamespace(id=p, leader=1) for p in range(len(self.topics[name]))}
                topics[name] = SimpleNamespace(topic=name, partitions=parts, error=None)
            else:
                topics[name] = SimpleNamespace(
                    topic=name, partitions={}, error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
                )
        return SimpleNamespace(topics=topics, brokers={1: "memory"})

    def records(self, topic: str, committed_only: bool = True) -> list[tuple[int, int, Record]]:
        """Every record of ``topic`` as (partition, offset, record); by default what a
        ``read_committed`` reader would ever see."""
        out = []
        for p, log in enumerate(self.topics.get(topic, [])):
            for offset, record in enumerate(log):
                if not committed_only or record.state == COMMITTED:
                    out.append((p, offset, record))
        return out
