"""Durability: how the processor's progress becomes durable, one of the roles a delivery mode is made
of (processor/state/modes.py), like Kafka Streams' ``StreamsProducer``.

:class:`Transactions` (exactly-once, the default): everything a step produces (batches, dead letters,
changelog records, the ledger checkpoint) and the ingest offsets go out in one Kafka transaction,
committed every ``commit_interval_ms``. A crash anywhere loses the open transaction whole; readers
(``read_committed``) never see its batches, and restore (``processor/state/restore.py``) starts from
the last commit, where changelog, ledger and offsets agree. The transactional id is stable per
instance, so a replacement fences the process it replaces: a zombie's commit fails.

:class:`PlainCommits` (at-least-once): plain produces; the ingest offset committed is the first one
whose item is not yet safely answered (``processor/state/offsets.py``, fed by the lane log's
:class:`~processor.state.lane_log.OffsetLog`). Nothing is lost, but a crash may dispatch again items
that were already dispatched. Cheaper; kept for measurement and for clusters without transactions.

Invariant of both: once a produce has failed (``check_delivered`` raises), nothing more is committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.kafka.exits import DeliveryFailed, age_s, now_stamp, purged
from processor.kafka.factory import ConsumerClient, ProducerClient
from processor.kafka.topics import TopicNames
from processor.kafka.watchdog import SEND_OFFSETS_TIMEOUT_S, CallWatchdog, guarded
from processor.state.offsets import OffsetTracker

log = logging.getLogger("tokenfabric.processor")

Deliver = Callable[[Any, Any], None]
"""A produce's delivery callback: ``(error or None, message)``."""

ChangelogRecord = tuple[int, bytes, bytes | None]
"""(changelog partition, key, value) of one record a commit carries (value None: a tombstone)."""


class Durability(Protocol):
    """How produces and progress become durable (a transaction, or plain produces and commits)."""

    batches_delivered: int
    """Batches known to have reached their topic: at their delivery report (at-least-once) or when
    their transaction commits (exactly-once)."""

    def start(self, watchdog: CallWatchdog | None) -> None:
        """Before the first produce; ``watchdog`` guards a commit call that may block for ever
        (librdkafka#5456)."""
        ...

    def failed(self, err: Any, msg: Any) -> None:
        """The default delivery callback: remembers the first failed delivery."""
        ...

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: Deliver | None = None,
        partition: int | None = None,
    ) -> None:
        """Produce in the open transaction, if any (``on_delivery`` None: :meth:`failed`)."""
        ...

    def batch_delivery(self) -> Deliver:
        """The delivery callback of a new batch's produce: it counts in ``batches_delivered``."""
        ...

    def check_delivered(self) -> None:
        """Raise if a produce failed: what it carried is lost, so nothing more may be committed."""
        ...

    def due(self, now_ms: int) -> bool:
        """Whether to commit now (and if so, the interval starts again)."""
        ...

    def commit(self, snapshot: Callable[[], bytes]) -> float:
        """Make everything so far durable with the ledger checkpoint ``snapshot`` returns; seconds."""
        ...

    def transaction_age_s(self) -> float:
        """How long the open transaction has been open (0 without transactions)."""
        ...


@dataclass(frozen=True, slots=True)
class CommitClients:
    """The clients a durability commits through: the batch producer, the ingest consumer (whose
    offsets commit) and the control consumer (whose results offsets follow the commit)."""

    producer: ProducerClient
    ingest: ConsumerClient
    control: ConsumerClient


class _Produces:
    """What both modes share: produce with back-pressure, the first failed delivery, the interval."""

    def __init__(self, clients: CommitClients, topics: TopicNames, instance: str, interval_ms: int) -> None:
        self.producer = clients.producer
        self.ingest = clients.ingest
        self.control = clients.control
        self.topics = topics
        self.instance = instance
        self.interval_ms = interval_ms
        self.undelivered: KafkaError | None = None  # the first failed delivery
        self.batches_delivered = 0
        self.watchdog: CallWatchdog | None = None
        self._last_ms = -1 << 62

    def failed(self, err: Any, _msg: Any) -> None:
        if err is not None and self.undelivered is None:
            self.undelivered = err

    def check_delivered(self) -> None:
        if self.undelivered is not None:
            raise DeliveryFailed(
                f"processor {self.instance}: a produce failed: {self.undelivered.str()}", self.undelivered
            )

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: Deliver | None = None,
        partition: int | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"value": value, "key": key, "on_delivery": on_delivery or self.failed}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException:  # _STATE: the transaction failed, a delivery report may say why
                self.producer.poll(0)
                self.check_delivered()
                raise

    def _interval_passed(self, now_ms: int, early_ms: int | None = None) -> bool:
        """The interval since the last commit passed (or ``early_ms`` did, where given)."""
        elapsed = now_ms - self._last_ms
        if elapsed >= self.interval_ms or (early_ms is not None and elapsed >= early_ms):
            self._last_ms = now_ms
            return True
        return False


class PlainCommits(_Produces):
    """At-least-once: plain produces; the ingest offsets committed are the ``offsets`` tracker's
    (shared with the lane log, which marks what is safe)."""

    def __init__(
        self,
        clients: CommitClients,
        topics: TopicNames,
        instance: str,
        interval_ms: int,
        offsets: OffsetTracker,
    ) -> None:
        super().__init__(clients, topics, instance, interval_ms)
        self.offsets = offsets

    def start(self, watchdog: CallWatchdog | None) -> None:
        """Nothing to fence: without a transactional id no older process is cut off."""
        self.watchdog = watchdog

    def batch_delivery(self) -> Deliver:
        def delivered(err: Any, msg: Any) -> None:
            self.failed(err, msg)
            if err is None:
                self.batches_delivered += 1

        return delivered

    def due(self, now_ms: int) -> bool:
        return self._interval_passed(now_ms)

    def transaction_age_s(self) -> float:
        return 0.0  # no transaction

    def commit(self, snapshot: Callable[[], bytes]) -> float:
        started = time.monotonic()
        self.produce(self.topics.accounting, snapshot(), self.instance.encode())
        offsets = self.offsets.committable()
        if offsets:
            tps = [TopicPartition(self.topics.ingest, p, o) for p, o in offsets.items()]
            try:
                self.ingest.commit(offsets=tps, asynchronous=False)
                self.offsets.committed(offsets)
            except KafkaException as exc:
                log.warning("ingest commit failed (will retry): %s", exc)
        self._commit_control()
        return time.monotonic() - started

    def _commit_control(self) -> None:
        """Results offsets move only after the step that processed them is durable."""
        try:
            self.control.commit(asynchronous=True)
        except KafkaException as exc:  # nothing consumed yet, or a transient error: next commit retries
            log.debug("results offset commit skipped: %s", exc)


class Transactions(_Produces):
    """Exactly-once: one transaction per commit, carrying the changelog records ``changes`` returns
    (the lane log's and the dedupe window's, in that order), the checkpoint and the ingest offsets."""

    def __init__(
        self,
        clients: CommitClients,
        topics: TopicNames,
        instance: str,
        interval_ms: int,
        *,
        eager_ms: int,
        changes: Callable[[], Iterable[ChangelogRecord]],
        stamp: Callable[[], tuple[float, float]] = now_stamp,
    ) -> None:
        super().__init__(clients, topics, instance, interval_ms)
        self.eager_ms = eager_ms
        self._changes = changes
        self._stamp = stamp
        """Monotonic and wall-clock time now (processor.kafka.exits.now_stamp): a transaction's age."""
        self.in_transaction = False
        self._uncommitted_batches = 0  # emitted in the open transaction: delivered when it commits
        self._began = (0.0, 0.0)  # monotonic and wall-clock time the open transaction began

    def start(self, watchdog: CallWatchdog | None) -> None:
        """Fence older sessions of this transactional id, then open the first transaction."""
        self.watchdog = watchdog
        self.producer.init_transactions(60)
        self._begin()

    def _begin(self) -> None:
        self.producer.begin_transaction()
        self.in_transaction = True
        self._began = self._stamp()

    def batch_delivery(self) -> Deliver:
        """A batch is delivered when its transaction commits, not at its delivery report."""
        self._uncommitted_batches += 1
        return self.failed

    def transaction_age_s(self) -> float:
        """How long the open transaction has been open (0 without one): past ``transaction.timeout.ms``
        the broker may have aborted it itself (processor.kafka.exits)."""
        return age_s(self._began, self._stamp()) if self.in_transaction else 0.0

    def check_delivered(self) -> None:
        """As :meth:`Durability.check_delivered`, except for a purged message: librdkafka purges only
        when the transaction is aborted or the producer is fatally fenced, so that transaction cannot
        commit and its commit raises the cause, which decides the exit code (a purge alone would read
        as a transient failure and restart a process that a newer twin has fenced)."""
        if self.undelivered is not None and purged(self.undelivered):
            return
        super().check_delivered()

    def due(self, now_ms: int) -> bool:
        """A batch reaches its consumer only when its transaction commits: commit early when one waits."""
        return self._interval_passed(now_ms, self.eager_ms if self._uncommitted_batches else None)

    def commit(self, snapshot: Callable[[], bytes]) -> float:
        started = time.monotonic()
        for partition, key, value in self._changes():
            self.produce(self.topics.changelog, value, key, partition=partition)
        self.produce(self.topics.accounting, snapshot(), self.instance.encode())
        self._send_offsets()
        try:
            self.producer.commit_transaction(60)
        except KafkaException:
            self.producer.poll(0)  # the delivery reports that explain it, if a produce failed
            self.check_delivered()  # the cause, classified (processor.kafka.exits), rather than its effect
            raise
        self.in_transaction = False
        self.batches_delivered += self._uncommitted_batches
        self._uncommitted_batches = 0
        self.check_delivered()
        self._begin()
        return time.monotonic() - started

    def _send_offsets(self) -> None:
        """The ingest consumer's positions go in the transaction: they commit with what they caused."""
        assignment = self.ingest.assignment()
        if assignment:
            positions = [tp for tp in self.ingest.position(assignment) if tp.offset >= 0]
            if positions:
                with guarded(self.watchdog, "send_offsets_to_transaction", SEND_OFFSETS_TIMEOUT_S):
                    self.producer.send_offsets_to_transaction(
                        positions, self.ingest.consumer_group_metadata(), SEND_OFFSETS_TIMEOUT_S
                    )
