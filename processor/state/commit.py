"""How the processor makes its progress durable: two strategies behind one small interface.

``TransactionalCommitter`` (exactly-once, the default): everything a step produces (batches, dead
letters, changelog records, the ledger checkpoint) and the ingest offsets go out in one Kafka
transaction, committed every ``commit_interval_ms``. A crash anywhere loses the open transaction
whole; readers (``read_committed``) never see its batches, and restore (``processor/state/restore.py``)
starts from the last commit, where changelog, ledger and offsets agree. The transactional id is
stable per instance, so a replacement fences the process it replaces: a zombie's commit fails.

``AtLeastOnceCommitter``: plain produces; the ingest offset committed is the first one whose item is
not yet safely in a delivered batch (``processor/state/offsets.py``). Nothing is lost, but a crash may
dispatch again items that were already dispatched. Cheaper; kept for measurement and for clusters
without transactions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.core.item import Batch, Item
from processor.kafka.exits import DeliveryFailed, age_s, now_stamp, purged
from processor.kafka.factory import ConsumerClient, ProducerClient
from processor.kafka.topics import TopicNames
from processor.kafka.watchdog import SEND_OFFSETS_TIMEOUT_S, CallWatchdog, guarded
from processor.state import changelog
from processor.state.committer import Deliver, Placement, TakeOver
from processor.state.credits import CreditBook
from processor.state.ingest import IngestItem
from processor.state.offsets import DeadMark, OffsetTracker
from processor.state.results import ResultsCursor
from processor.state.seen import SeenBook

log = logging.getLogger("tokenfabric.processor")


class _Base:
    def __init__(
        self,
        producer: ProducerClient,
        ingest: ConsumerClient,
        control: ConsumerClient,
        topics: TopicNames,
        instance: str,
        interval_ms: int,
    ) -> None:
        self.producer = producer
        self.ingest = ingest
        self.control = control
        self.topics = topics
        self.instance = instance
        self.interval_ms = interval_ms
        self.undelivered: KafkaError | None = None  # the first failed delivery
        self.batches_delivered = 0
        self.watchdog: CallWatchdog | None = None
        """Guards a commit call that may block for ever (librdkafka#5456); the service sets it."""
        self._last_ms = -1 << 62

    def remembered_ids(self) -> int:
        """How many item ids the dedupe window holds (0: no dedupe)."""
        return 0

    def due(self, now_ms: int) -> bool:
        if now_ms - self._last_ms >= self.interval_ms:
            self._last_ms = now_ms
            return True
        return False

    def _failed(self, err: Any, _msg: Any) -> None:
        if err is not None and self.undelivered is None:
            self.undelivered = err

    def check_delivered(self) -> None:
        """Raise if a produce failed: what it carried is lost, so nothing more may be committed."""
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
        kwargs: dict[str, Any] = {"value": value, "key": key, "on_delivery": on_delivery or self._failed}
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

    def _commit_control(self) -> None:
        """Results offsets move only after the step that processed them is durable."""
        try:
            self.control.commit(asynchronous=True)
        except KafkaException as exc:  # nothing consumed yet, or a transient error: next commit retries
            log.debug("results offset commit skipped: %s", exc)


class AtLeastOnceCommitter(_Base):
    """No transactions, no changelog. Invariant: an ingest offset is committed only past items with
    their last answer (their batch finished without sending them back, or an ending was delivered)
    or a delivered dead letter: a retried or put-back item is read again if the process dies first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offsets = OffsetTracker()
        self._out: dict[str, list[tuple[Item, int]]] = {}  # batch in flight: (item, its attempt then)

    def start(self) -> None:
        return None

    def on_start(self, resume: Callable[[], None]) -> None:
        """Nothing to resume: without a changelog, lane state starts empty and the ledger from 0."""

    def results_assignment(
        self, topic: str, partitions: list[int], cursor: ResultsCursor
    ) -> list[TopicPartition]:
        """From the group's committed position: completions are applied at least once."""
        return [TopicPartition(topic, p) for p in partitions]

    def slot_share(self, credits: CreditBook, max_inflight: int) -> int | None:
        return None  # one instance holds every slot: nothing moves between instances

    def place(
        self, batch: Batch, credits: CreditBook, max_inflight: int, cursor: ResultsCursor
    ) -> Placement | None:
        return None

    def revoked(self, partitions: list[int], let_go: Callable[[], None]) -> None:
        """Lane state stays (there is no changelog to hand it over by): the next owner reads the
        revoked partitions again from their committed offsets, so only their offsets are forgotten."""
        for p in partitions:
            self.offsets.drop(p)

    def assigned(self, partitions: list[int], take_over: TakeOver) -> None:
        """Nothing to restore: the assigned partitions are read from their committed offsets."""

    def transaction_age_s(self) -> float:
        return 0.0

    def item_seen(self, item: IngestItem) -> None:
        self.offsets.seen(item.partition, item)

    def first_seen(self, partition: int, item_id: str) -> bool:
        """No dedupe: without a changelog, a re-read after a rebalance would look like a repeat."""
        return True

    def dead_letter(self, partition: int, offset: int) -> Deliver:
        mark = DeadMark(offset)
        self.offsets.seen(partition, mark)

        def delivered(err: Any, msg: Any) -> None:
            self._failed(err, msg)
            mark.safe = err is None

        return delivered

    def batch_emitted(self, batch: Batch, placement: Placement | None = None) -> Deliver:
        self._out[batch.batch_id] = [(item, item.attempt) for item in batch.items]

        def delivered(err: Any, msg: Any) -> None:
            self._failed(err, msg)
            if err is None:
                self.batches_delivered += 1

        return delivered

    def batch_finished(self, batch_id: str) -> None:
        """The batch's items are safe, except those a retriable failure sent back (their attempt
        moved on): they become safe when a later batch that carries them finishes."""
        for item, attempt in self._out.pop(batch_id, ()):
            if item.attempt == attempt:
                item.safe = True  # type: ignore[attr-defined]

    def batch_progress(self, batch_id: str) -> None:
        return None

    def requeued(self, batch_id: str, items: Iterable[Item]) -> None:
        """Put back in the lanes (its consumer retired): not safe until a later batch finishes."""
        self._out.pop(batch_id, None)

    def retried(self, items: Sequence[Item]) -> None:
        return None

    def withdrawn(self, items: Iterable[Item]) -> Deliver:
        answered = list(items)

        def delivered(err: Any, msg: Any) -> None:
            self._failed(err, msg)
            if err is None:
                for item in answered:
                    item.safe = True  # type: ignore[attr-defined]

        return delivered

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


@dataclass(slots=True)
class _LoggedBatch:
    partition: int
    entry: changelog.BatchEntry
    batch: Batch


def changelog_attempts(items: Iterable[Item]) -> tuple[int, ...]:
    """A batch record's ``attempts``: each item's, or none when all are on their first."""
    attempts = tuple(it.attempt for it in items)
    return attempts if any(a != 1 for a in attempts) else ()


class TransactionalCommitter(_Base):
    def __init__(
        self,
        *args: Any,
        is_in_flight: Callable[[str], bool],
        done_items: Callable[[str], list[str]],
        eager_ms: int,
        dedupe_window_ms: int = 0,
        dedupe_max_ids: int = 0,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        stamp: Callable[[], tuple[float, float]] = now_stamp,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._stamp = stamp
        """Monotonic and wall-clock time now (processor.kafka.exits.now_stamp): a transaction's age."""
        self.seen = SeenBook(dedupe_window_ms, dedupe_max_ids) if dedupe_window_ms > 0 else None
        """The item ids each owned ingest partition took within the window (None: no dedupe)."""
        self._wall_ms = wall_ms
        self._is_in_flight = is_in_flight
        self._done_items = done_items
        self.eager_ms = eager_ms
        self._new_items: list[IngestItem] = []
        self._emitted: list[tuple[Batch, Placement]] = []
        self._finished: list[str] = []
        self._progressed: set[str] = set()
        self._withdrawn: list[IngestItem] = []
        self._logged_batches: dict[str, _LoggedBatch] = {}
        self._waiting = changelog.WaitingSets()
        self.in_transaction = False
        self._uncommitted_batches = 0  # emitted in the open transaction: delivered when it commits
        self._began = (0.0, 0.0)  # monotonic and wall-clock time the open transaction began

    def start(self) -> None:
        self.producer.init_transactions(60)
        self._begin()

    def _begin(self) -> None:
        self.producer.begin_transaction()
        self.in_transaction = True
        self._began = self._stamp()

    def remembered_ids(self) -> int:
        return 0 if self.seen is None else len(self.seen)

    def on_start(self, resume: Callable[[], None]) -> None:
        """Lane state moves with partitions: resume the ledger before any is assigned."""
        resume()

    def results_assignment(
        self, topic: str, partitions: list[int], cursor: ResultsCursor
    ) -> list[TopicPartition]:
        """From the cursor: completions of batches restored later are found by rewinding it."""
        return [TopicPartition(topic, p, o) for p, o in cursor.next.items()]

    def slot_share(self, credits: CreditBook, max_inflight: int) -> int | None:
        """Slots are split between instances by the ingest partitions each owns (state/credits.py)."""
        return credits.share(max_inflight)

    def place(
        self, batch: Batch, credits: CreditBook, max_inflight: int, cursor: ResultsCursor
    ) -> Placement | None:
        """A batch holds one of its consumer's slots, which decides the changelog partition its
        record goes to (the slot moves with that partition), and records where its completions can
        first appear (the results cursor now)."""
        slot, partition = credits.take(batch.consumer, max_inflight, batch.batch_id)
        return Placement(partition, slot, cursor.positions())

    def revoked(self, partitions: list[int], let_go: Callable[[], None]) -> None:
        """The protocol is eager: every partition goes, so all lane state goes with it (committed just
        before; the next owner restores it), and nothing tracked here belongs to this instance now."""
        let_go()
        self.reset()

    def assigned(self, partitions: list[int], take_over: TakeOver) -> None:
        take_over(self, partitions)

    def transaction_age_s(self) -> float:
        """How long the open transaction has been open (0 without one): past ``transaction.timeout.ms``
        the broker may have aborted it itself (processor.kafka.exits)."""
        return age_s(self._began, self._stamp()) if self.in_transaction else 0.0

    def check_delivered(self) -> None:
        """As :meth:`_Base.check_delivered`, except for a purged message: librdkafka purges only when
        the transaction is aborted or the producer is fatally fenced, so that transaction cannot
        commit and its commit raises the cause, which decides the exit code (a purge alone would read
        as a transient failure and restart a process that a newer twin has fenced)."""
        if self.undelivered is not None and purged(self.undelivered):
            return
        super().check_delivered()

    def due(self, now_ms: int) -> bool:
        """A batch reaches its consumer only when its transaction commits: commit early when one waits."""
        elapsed = now_ms - self._last_ms
        if elapsed >= self.interval_ms or (self._emitted and elapsed >= self.eager_ms):
            self._last_ms = now_ms
            return True
        return False

    def adopt(self, item: IngestItem, home: int) -> None:
        """A restored waiting item: its changelog record is already committed, in ``home``."""
        item.logged = True
        item.home = home

    def adopt_waiting(self, state: changelog.ChangelogState) -> None:
        """The committed waiting sets and seen ids restore read, so that later changes rewrite them."""
        self._waiting.load(state)
        if self.seen is not None:
            self.seen.load(state.seen)

    def adopt_batch(self, batch: Batch, partition: int, entry: changelog.BatchEntry) -> None:
        for item in batch.items:
            cast(IngestItem, item).home = partition  # if they go back to lanes, their records go here
        self._logged_batches[batch.batch_id] = _LoggedBatch(partition, entry, batch)

    def reset(self) -> None:
        """Forget everything tracked (after a commit, when the partitions are handed over)."""
        self._new_items.clear()
        self._emitted.clear()
        self._finished.clear()
        self._progressed.clear()
        self._withdrawn.clear()
        self._logged_batches.clear()
        self._waiting.clear()
        if self.seen is not None:
            self.seen.clear()

    def item_seen(self, item: IngestItem) -> None:
        self._new_items.append(item)

    def first_seen(self, partition: int, item_id: str) -> bool:
        """False for a repeat of an id the partition took within the dedupe window. Remembered in
        memory now and in the changelog at the commit that also commits this message's offset, so
        a crash before it forgets both together (the restarted processor reads the message again)."""
        return self.seen is None or self.seen.first(partition, item_id, self._wall_ms())

    def dead_letter(self, partition: int, offset: int) -> Deliver:
        return self._failed

    def batch_emitted(self, batch: Batch, placement: Placement | None = None) -> Deliver:
        if placement is None:
            raise ValueError(f"batch {batch.batch_id}: exactly-once needs its changelog placement")
        self._emitted.append((batch, placement))
        self._uncommitted_batches += 1
        return self._failed

    def batch_finished(self, batch_id: str) -> None:
        self._finished.append(batch_id)

    def batch_progress(self, batch_id: str) -> None:
        self._progressed.add(batch_id)

    def requeued(self, batch_id: str, items: Iterable[Item]) -> None:
        self._finished.append(batch_id)
        self._new_items.extend(cast(Iterable[IngestItem], items))

    def retried(self, items: Sequence[Item]) -> None:
        if items:
            self._new_items.extend(cast(Sequence[IngestItem], items))

    def withdrawn(self, items: Iterable[Item]) -> Deliver:
        self._withdrawn.extend(cast(Iterable[IngestItem], items))
        return self._failed

    def _log_changes(self) -> None:
        cl = self.topics.changelog
        waiting = self._waiting
        fresh = [item for item in self._new_items if not item.dispatched and not item.logged]
        waiting.add_all(fresh)
        for item in fresh:
            item.logged = True
        self._log_attempts(fresh, True)
        ended = [it for it in self._withdrawn if it.logged]  # withdrawn items are marked dispatched
        waiting.discard_all(ended)
        for it in ended:
            it.logged = False
        self._log_attempts(ended, False)
        for batch, placement in self._emitted:
            items = cast(list[IngestItem], batch.items)
            gone = [it for it in items if it.logged]
            waiting.discard_all(gone)
            for it in gone:
                it.logged = False
            self._log_attempts(gone, False)
            if self._is_in_flight(batch.batch_id):
                entry = changelog.BatchEntry(
                    batch.batch_id,
                    batch.consumer,
                    batch.lane,
                    batch.padded_length,
                    batch.pad_multiple,
                    batch.created_ms,
                    batch.oversized,
                    tuple((it.partition, it.offset) for it in items),
                    placement.slot,
                    (),
                    placement.results_from,
                    changelog_attempts(items),
                )
                self._logged_batches[batch.batch_id] = _LoggedBatch(placement.partition, entry, batch)
                self._progressed.add(batch.batch_id)
        for batch_id in self._finished:
            self._progressed.discard(batch_id)
            logged = self._logged_batches.pop(batch_id, None)
            if logged is not None:
                self.produce(cl, None, changelog.batch_key(batch_id), partition=logged.partition)
        for batch_id in self._progressed:
            self._log_batch(batch_id)
        for home, key, value in waiting.flush():
            self.produce(cl, value, key, partition=home)
        if self.seen is not None:
            for home, key, value in self.seen.flush(self._wall_ms()):
                self.produce(cl, value, key, partition=home)
        self._new_items.clear()
        self._withdrawn.clear()
        self._emitted.clear()
        self._finished.clear()
        self._progressed.clear()

    def _log_attempts(self, items: Iterable[IngestItem], waiting: bool) -> None:
        """The ``A`` record of each item past its first attempt that starts (``waiting``) or stops
        waiting, beside its bit in the waiting set (processor/state/changelog.py)."""
        for it in items:
            if it.attempt != 1:
                value = changelog.attempt_value(it.attempt) if waiting else None
                key = changelog.attempt_key(it.partition, it.offset)
                self.produce(self.topics.changelog, value, key, partition=it.home)

    def _log_batch(self, batch_id: str) -> None:
        """(Re)write a batch's record with the items answered so far, so the ledger this transaction
        checkpoints and the batch a restore rebuilds agree on what is still outstanding."""
        logged = self._logged_batches.get(batch_id)
        if logged is None or not self._is_in_flight(batch_id):
            return
        done_ids = self._done_items(batch_id)
        if done_ids:
            answered = set(done_ids)
            done = tuple(i for i, it in enumerate(logged.batch.items) if it.id in answered)
        else:
            done = ()  # a batch just emitted: its first record
        if done != logged.entry.done or done == ():
            logged.entry = replace(logged.entry, done=done)
            self.produce(
                self.topics.changelog,
                logged.entry.value(),
                changelog.batch_key(batch_id),
                partition=logged.partition,
            )

    def commit(self, snapshot: Callable[[], bytes]) -> float:
        started = time.monotonic()
        self._log_changes()
        self.produce(self.topics.accounting, snapshot(), self.instance.encode())
        assignment = self.ingest.assignment()
        if assignment:
            positions = [tp for tp in self.ingest.position(assignment) if tp.offset >= 0]
            if positions:
                with guarded(self.watchdog, "send_offsets_to_transaction", SEND_OFFSETS_TIMEOUT_S):
                    self.producer.send_offsets_to_transaction(
                        positions, self.ingest.consumer_group_metadata(), SEND_OFFSETS_TIMEOUT_S
                    )
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
