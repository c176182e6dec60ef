"""An in-memory Kafka for tests: the client methods tokenfabric uses, with Kafka's semantics.

:class:`MemoryKafka` is one cluster; :meth:`MemoryKafka.clients` is a
:class:`~processor.kafka.factory.ClientFactory` whose consumers, producers and admin clients read and
write it. Like Bytewax's ``testing`` module it ships with the package, so a user's tests of code
built on tokenfabric's apps need no broker either.

What it keeps faithful (each has a test in tests/kafka/test_memory.py; the properties the adapters
rely on are also run against the real broker by tests/kafka/contract.py, so the fake cannot drift):

- Partitioned logs with offsets; a message's partition is the one asked, else a hash of its key.
- Transactions: what a transactional producer writes is pending until ``commit_transaction``;
  ``read_committed`` consumers read only up to the last stable offset (the first pending message)
  and never see an aborted message; offsets sent with ``send_offsets_to_transaction`` become the
  group's committed offsets only when the transaction commits. Watermarks asked by a
  ``read_committed`` consumer end at the last stable offset, as the broker's ListOffsets does.
- Fencing: ``init_transactions`` under a transactional id aborts the previous producer's open
  transaction, and that producer's next transactional call raises a fatal ``_FENCED``.
- The broker's own abort of a transaction open past ``transaction.timeout.ms``
  (:meth:`MemoryKafka.expire_transactions`, on the cluster's clock): its producer is fenced too.
- Delivery reports run from ``poll``/``flush``/``commit_transaction``, never from ``produce``;
  with ``delivery.report.only.error`` only failures are reported.
- Consumer groups: subscribed members share the partitions (a static member, ``group.instance.id``,
  takes the place of an older member with its id, which is fenced), rebalances call ``on_revoke`` then
  ``on_assign`` from inside ``consume`` (as librdkafka does from ``poll``), committed offsets decide
  where a new owner starts, ``enable.partition.eof`` reports each partition's end once.
  ``commit(message=m)`` commits ``m``'s partition at ``m.offset() + 1`` only, as the client does.
- Errors are real ``KafkaException(KafkaError(...))`` objects, so code classifies them as it would
  the client's (processor.kafka.exits).

Faults are scripted: :meth:`MemoryKafka.fail_next` makes the next call of a method raise a given
error, :meth:`MemoryKafka.fail_deliveries` fails the deliveries to a topic. Not modelled: control
records taking offsets, replication, quotas, message size limits, wall-clock timeouts (a call that
"times out" is a scripted fault), and headers.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    KafkaError,
    KafkaException,
)

from processor.kafka.factory import Settings
from processor.kafka.topics import TopicSpec

if TYPE_CHECKING:
    from processor.kafka.memory_clients import MemoryConsumer, MemoryProducer

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
    members: list[MemoryConsumer] = field(default_factory=list)
    generation: int = 0


def error(
    code: int, reason: str = "", *, fatal: bool = False, retriable: bool = False, abortable: bool = False
) -> KafkaError:
    """A ``KafkaError`` as librdkafka would raise it (``abortable``: ``txn_requires_abort``)."""
    return KafkaError(code, reason or None, fatal=fatal, retriable=retriable, txn_requires_abort=abortable)


class MemoryKafka:
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
        self.open_transactions: list[MemoryProducer] = []
        """Transactional producers with a transaction open (fencing and expiry find them here)."""
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

    def clients(self) -> MemoryClients:
        """A client factory over this cluster."""
        return MemoryClients(self)

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


class MemoryClients:
    """The :class:`~processor.kafka.factory.ClientFactory` of a :class:`MemoryKafka`."""

    def __init__(self, cluster: MemoryKafka) -> None:
        self.cluster = cluster

    def consumer(self, settings: Settings) -> MemoryConsumer:
        from processor.kafka.memory_clients import MemoryConsumer

        return MemoryConsumer(self.cluster, settings)

    def producer(self, settings: Settings) -> MemoryProducer:
        from processor.kafka.memory_clients import MemoryProducer

        return MemoryProducer(self.cluster, settings)

    def admin(self, settings: Settings) -> MemoryAdmin:
        return MemoryAdmin(self.cluster)


class MemoryAdmin:
    def __init__(self, cluster: MemoryKafka) -> None:
        self.cluster = cluster

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.cluster._call("list_topics")
        return self.cluster.metadata(topic)

    def create_topics(self, new_topics: list[Any], **kwargs: Any) -> dict[str, Any]:
        """Futures per topic name, as the real admin client returns: ``TOPIC_ALREADY_EXISTS`` for one
        that exists (its settings are left alone)."""
        self.cluster._call("create_topics")
        out: dict[str, Any] = {}
        for new in new_topics:
            future: Future[Any] = Future()
            if new.topic in self.cluster.topics:
                future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
            else:
                self.cluster.create_topic(new.topic, new.num_partitions, dict(new.config))
                future.set_result(None)
            out[new.topic] = future
        return out

    def describe_consumer_groups(self, group_ids: list[str], **kwargs: Any) -> dict[str, Any]:
        self.cluster._call("describe_consumer_groups")
        out: dict[str, Any] = {}
        for group in group_ids:
            future: Future[Any] = Future()
            members = [
                SimpleNamespace(group_instance_id=m.settings.get("group.instance.id"))
                for m in self.cluster.groups[group].members
            ]
            future.set_result(SimpleNamespace(group_id=group, members=members))
            out[group] = future
        return out
