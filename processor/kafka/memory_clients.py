"""The clients of :mod:`processor.kafka.memory`: a producer and a consumer with confluent-kafka's
method names, reading and writing one :class:`~processor.kafka.memory_cluster.MemoryCluster` (a
:class:`~processor.kafka.memory.MemoryKafka`).

Kept apart from the cluster so each file holds one idea: the cluster's logs, groups and faults
there, what one client does with them here. The semantics they keep are listed in the cluster's
module docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from processor.kafka.factory import Settings
from processor.kafka.memory_cluster import ABORTED, COMMITTED, PENDING, Group, MemoryCluster, Record, error


class MemoryProducer:
    """A producer; transactional when its settings name a ``transactional.id``."""

    def __init__(self, cluster: MemoryCluster, settings: Settings) -> None:
        self.cluster = cluster
        self.settings = dict(settings)
        self.transactional_id: str | None = self.settings.get("transactional.id")
        only_errors = self.settings.get("delivery.report.only.error", False)
        if not isinstance(only_errors, bool):  # confluent-kafka reads this one itself, and wants a bool
            raise TypeError(
                f"Expected delivery.report.only.error to be bool type, not {type(only_errors).__name__}"
            )
        self.only_errors = only_errors
        self._session = cluster.new_session(None)
        self._epoch = 0
        self._began_ms: int | None = None
        self._fenced = False
        self._reports: list[tuple[Callable[[Any, Any], None] | None, KafkaError | None, Message]] = []
        self._offsets: dict[str, dict[tuple[str, int], int]] = {}

    @property
    def in_transaction(self) -> bool:
        return self._began_ms is not None

    def _check_fenced(self) -> None:
        tid = self.transactional_id
        if tid is not None and self._epoch and (self._fenced or self.cluster.epoch(tid) != self._epoch):
            self._fenced = True
            raise KafkaException(error(KafkaError._FENCED, "Producer fenced by newer instance", fatal=True))

    def init_transactions(self, timeout: float = -1) -> None:
        self.cluster._call("init_transactions")
        if self.transactional_id is None:
            raise KafkaException(error(KafkaError._NOT_CONFIGURED, "transactional.id not set"))
        # A newer session with this id: whatever the previous one left open is aborted.
        for producer in list(self.cluster.open_transactions):
            if producer.transactional_id == self.transactional_id and producer is not self:
                self.cluster._abort(producer._session)
                producer._began_ms = None
                self.cluster.open_transactions.remove(producer)
        self._session = self.cluster.new_session(self.transactional_id)
        self._epoch = self.cluster.epoch(self.transactional_id)

    def begin_transaction(self) -> None:
        self.cluster._call("begin_transaction")
        self._check_fenced()
        if self.in_transaction:
            raise KafkaException(error(KafkaError._STATE, "transaction already in progress"))
        self._began_ms = self.cluster.clock_ms()
        self._offsets.clear()
        self.cluster.open_transactions.append(self)

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Callable[[Any, Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        self.cluster._call("produce")
        callback = on_delivery or kwargs.get("callback")
        if self.transactional_id is not None:
            self._check_fenced()
            if not self.in_transaction:
                raise KafkaException(error(KafkaError._STATE, "Operation not valid in state Ready"))
        if topic not in self.cluster.topics:
            err = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            self._reports.append((callback, err, Message(topic=topic, value=value, key=key)))
            return
        if partition is None or partition < 0:
            partition = self.cluster.partition_for(topic, key)
        fault = self.cluster._delivery_faults.get(topic)
        if fault is not None:
            self._reports.append(
                (callback, fault, Message(topic=topic, partition=partition, key=key, value=value))
            )
            return
        state = PENDING if self.in_transaction else COMMITTED
        record = Record(key, value, self.cluster.clock_ms(), state, self._session)
        offset = self.cluster.append(topic, partition, record)
        msg = Message(
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            value=value,
            timestamp=(1, record.timestamp_ms),
        )
        self._reports.append((callback, None, msg))

    def _report(self) -> int:
        reports, self._reports = self._reports, []
        for callback, err, msg in reports:
            if callback is not None and (err is not None or not self.only_errors):
                callback(err, msg)
        return len(reports)

    def poll(self, timeout: float = -1) -> int:
        self.cluster._call("poll")
        return self._report()

    def flush(self, timeout: float = -1) -> int:
        self.cluster._call("flush")
        self._report()
        return 0

    def __len__(self) -> int:
        return len(self._reports)

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self.cluster._call("send_offsets_to_transaction")
        self._check_fenced()
        if not self.in_transaction:
            raise KafkaException(error(KafkaError._STATE, "no transaction in progress"))
        group = self._offsets.setdefault(group_metadata.group_id, {})
        for tp in positions:
            group[(tp.topic, tp.partition)] = tp.offset

    def commit_transaction(self, timeout: float = -1) -> None:
        self.cluster._call("commit_transaction")
        self._check_fenced()
        if not self.in_transaction:
            raise KafkaException(error(KafkaError._STATE, "no transaction in progress"))
        failed = [err for _cb, err, _msg in self._reports if err is not None]
        self._report()
        if failed:  # a failed delivery makes the transaction abortable, as librdkafka does
            raise KafkaException(error(failed[0].code(), failed[0].str(), abortable=True))
        self.cluster._commit(self._session)
        for group, offsets in self._offsets.items():
            self.cluster.groups[group].committed.update(offsets)
        self._end()

    def abort_transaction(self, timeout: float = -1) -> None:
        self.cluster._call("abort_transaction")
        self._check_fenced()
        self.cluster._abort(self._session)
        self._reports.clear()
        self._end()

    def _end(self) -> None:
        self._began_ms = None
        self._offsets.clear()
        opened = self.cluster.open_transactions
        if self in opened:
            opened.remove(self)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.cluster._call("list_topics")
        return self.cluster.metadata(topic)


class MemoryConsumer:
    """A consumer: assigned by hand (``assign``) or a member of its group (``subscribe``)."""

    def __init__(self, cluster: MemoryCluster, settings: Settings) -> None:
        self.cluster = cluster
        self.settings = dict(settings)
        self.group_id: str = self.settings.get("group.id", "")
        self.committed_only = self.settings.get("isolation.level", "read_committed") == "read_committed"
        self.eof = str(self.settings.get("enable.partition.eof", "false")).lower() == "true"
        self.reset = self.settings.get("auto.offset.reset", "latest")
        self._positions: dict[tuple[str, int], int] = {}
        self._paused: set[tuple[str, int]] = set()
        self._eof_sent: set[tuple[str, int]] = set()
        self._subscribed: list[str] = []
        self._on_assign: Callable[[Any, list[TopicPartition]], None] | None = None
        self._on_revoke: Callable[[Any, list[TopicPartition]], None] | None = None
        self._generation = -1
        self.closed = False
        self.fenced = False
        """A newer member took this one's ``group.instance.id``: its next consume fails, fatally."""

    # -- assignment ----------------------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Any, list[TopicPartition]], None] | None = None,
        on_revoke: Callable[[Any, list[TopicPartition]], None] | None = None,
        on_lost: Callable[[Any, list[TopicPartition]], None] | None = None,
    ) -> None:
        self.cluster._call("subscribe")
        self._subscribed = list(topics)
        self._on_assign, self._on_revoke = on_assign, on_revoke
        group = self.cluster.groups[self.group_id]
        static = self.settings.get("group.instance.id")
        for i, member in enumerate(group.members):
            if (
                static is not None
                and member is not self
                and member.settings.get("group.instance.id") == static
            ):
                member.fenced = True  # a static member's id taken over: the older one is fenced
                group.members[i] = self
        if self not in group.members:
            group.members.append(self)
        group.generation += 1

    def _rebalance_if_due(self) -> None:
        if not self._subscribed:
            return
        group = self.cluster.groups[self.group_id]
        if self._generation == group.generation:
            return
        self._generation = group.generation
        owned = [TopicPartition(t, p) for t, p in sorted(self._positions)]
        if owned and self._on_revoke is not None:
            self._on_revoke(self, owned)
        self._positions.clear()
        self._paused.clear()
        mine = self._share(group)
        for tp in mine:
            self._positions[(tp.topic, tp.partition)] = self._start(tp.topic, tp.partition)
        if self._on_assign is not None:
            self._on_assign(self, mine)

    def _share(self, group: Group) -> list[TopicPartition]:
        """Round-robin over the members in join order: this member's partitions."""
        index = group.members.index(self)
        parts = [
            (t, p)
            for t in self._subscribed
            if t in self.cluster.topics
            for p in range(len(self.cluster.topics[t]))
        ]
        return [TopicPartition(t, p) for i, (t, p) in enumerate(parts) if i % len(group.members) == index]

    def _start(self, topic: str, partition: int, offset: int = OFFSET_INVALID) -> int:
        if offset >= 0:
            return offset
        if offset == OFFSET_BEGINNING:
            return 0
        if offset == OFFSET_END:
            return self._end(topic, partition)
        committed = self.cluster.groups[self.group_id].committed.get((topic, partition))
        if committed is not None:
            return committed
        return 0 if self.reset in ("earliest", "smallest", "beginning") else self._end(topic, partition)

    def _end(self, topic: str, partition: int) -> int:
        if self.committed_only:
            return self.cluster.stable_end(topic, partition)
        return len(self.cluster.topics[topic][partition])

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.cluster._call("assign")
        self._positions = {
            (tp.topic, tp.partition): self._start(tp.topic, tp.partition, tp.offset) for tp in partitions
        }
        self._eof_sent.clear()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """Inside ``on_assign``, as the consumer protocol's callback may: the group already set the
        members' positions, so only partitions it did not are added."""
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key not in self._positions:
                self._positions[key] = self._start(tp.topic, tp.partition, tp.offset)

    def assignment(self) -> list[TopicPartition]:
        self._rebalance_if_due()
        return [TopicPartition(t, p) for t, p in sorted(self._positions)]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._paused.update((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._paused.difference_update((tp.topic, tp.partition) for tp in partitions)

    def seek(self, partition: TopicPartition) -> None:
        self._positions[(partition.topic, partition.partition)] = partition.offset

    # -- reading -------------------------------------------------------------------------------

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self.cluster._call("consume")
        if self.closed:
            raise RuntimeError("Consumer closed")
        if self.fenced:
            raise KafkaException(
                error(KafkaError.FENCED_INSTANCE_ID, "static member fenced by a newer member", fatal=True)
            )
        self._rebalance_if_due()
        out: list[Any] = []
        for topic in sorted({t for t, _p in self._positions}):
            while self.cluster._message_errors.get(topic):
                out.append(Message(topic=topic, error=self.cluster._message_errors[topic].pop(0)))
        for (topic, partition), position in sorted(self._positions.items()):
            if (topic, partition) in self._paused:
                continue
            log = self.cluster.topics[topic][partition]
            end = self._end(topic, partition)
            offset = position
            while offset < end and len(out) < num_messages:
                record = log[offset]
                if record.state == COMMITTED or (not self.committed_only and record.state != ABORTED):
                    out.append(
                        Message(
                            topic=topic,
                            partition=partition,
                            offset=offset,
                            key=record.key,
                            value=record.value,
                            timestamp=(1, record.timestamp_ms),
                        )
                    )
                offset += 1
            self._positions[(topic, partition)] = offset
            if offset < end:
                self._eof_sent.discard((topic, partition))
            elif self.eof and (topic, partition) not in self._eof_sent and len(out) < num_messages:
                self._eof_sent.add((topic, partition))
                out.append(
                    Message(
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        error=KafkaError(KafkaError._PARTITION_EOF),
                    )
                )
            if len(out) >= num_messages:
                break
        return out

    def poll(self, timeout: float = -1) -> Any:
        """One message (or partition end, or error), or None: ``consume`` of one."""
        found = self.consume(1, timeout)
        return found[0] if found else None

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self._positions.get((tp.topic, tp.partition), OFFSET_INVALID)
            )
            for tp in partitions
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.cluster._call("get_watermark_offsets")
        if partition.topic not in self.cluster.topics:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return 0, self._end(partition.topic, partition.partition)

    def commit(
        self, message: Any = None, offsets: list[TopicPartition] | None = None, asynchronous: bool = True
    ) -> list[TopicPartition] | None:
        self.cluster._call("commit")
        if offsets is None and message is not None:  # the message's partition only, past the message
            offsets = [TopicPartition(message.topic(), message.partition(), message.offset() + 1)]
        if offsets is None:
            offsets = [TopicPartition(t, p, o) for (t, p), o in self._positions.items()]
        if not offsets:
            raise KafkaException(KafkaError(KafkaError._NO_OFFSET))
        committed = self.cluster.groups[self.group_id].committed
        for tp in offsets:
            committed[(tp.topic, tp.partition)] = tp.offset
        return None if asynchronous else offsets

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        self.cluster._call("committed")
        committed = self.cluster.groups[self.group_id].committed
        return [
            TopicPartition(tp.topic, tp.partition, committed.get((tp.topic, tp.partition), OFFSET_INVALID))
            for tp in partitions
        ]

    def consumer_group_metadata(self) -> Any:
        return SimpleNamespace(group_id=self.group_id)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.cluster._call("list_topics")
        return self.cluster.metadata(topic)

    def close(self) -> None:
        self.cluster._call("close")
        self.closed = True
        group = self.cluster.groups.get(self.group_id)
        if group is not None and self in group.members:
            group.members.remove(self)
            group.generation += 1
