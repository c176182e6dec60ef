"""The lane log: what the processor records of each item's way through the lanes, so that a crash or
a handover loses none. One of the roles a delivery mode is made of (processor/state/modes.py).

Exactly-once logs it to the changelog (processor/state/changelog_writer.py), which a successor
restores from. At-least-once has no changelog: :class:`OffsetLog` only marks which ingest offsets
are safe to commit (processor/state/offsets.py), and an item not yet safe is read again after a
crash. Invariant (at-least-once): an ingest offset is committed only past items with their last
answer (their batch finished without sending them back, or an ending was delivered) or a delivered
dead letter: a retried or put-back item is read again if the process dies first.

:class:`InFlightLog` is what only a restorable log records (a batch's answers so far, items sent back
to wait); :class:`NoInFlightLog` is its null object, for a mode that restores nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from processor.core.item import Batch, Item
from processor.state.durability import Deliver
from processor.state.ingest import IngestItem
from processor.state.offsets import DeadMark, OffsetTracker
from processor.state.placement import Placement


class LaneLog(Protocol):
    """Each ingest message's fate, told as it happens; made durable by the next commit."""

    def item_seen(self, item: IngestItem) -> None:
        """A new item was read and submitted to the lanes."""
        ...

    def dead_letter(self, partition: int, offset: int) -> Deliver | None:
        """The message at ``offset`` carried no item and is dead-lettered; the delivery callback
        of the dead letter's produce (None: the durability's own)."""
        ...

    def batch_emitted(self, batch: Batch, placement: Placement | None) -> None:
        """A batch left the lanes for its consumer, placed by the slot placement."""
        ...

    def batch_finished(self, batch_id: str) -> None:
        """Every item of the batch has its answer."""
        ...

    def requeued(self, batch_id: str, items: Iterable[Item]) -> None:
        """The batch's unanswered ``items`` went back to the lanes (its consumer retired)."""
        ...

    def withdrawn(self, items: Iterable[Item]) -> Deliver | None:
        """Waiting items of a job that ended left the lanes, answered by the message this returns the
        delivery callback of (None: the durability's own): their waiting-set records go in the same
        transaction (exactly-once), or their ingest offsets may pass once it is delivered
        (at-least-once)."""
        ...


class InFlightLog(Protocol):
    """Changes to work in flight that a restorable log rewrites, so a successor resumes it exactly."""

    def batch_progress(self, batch_id: str) -> None:
        """Some of the batch's items were answered; it is still in flight."""
        ...

    def retried(self, items: Sequence[Item]) -> None:
        """Items that failed retriably went back to the lanes (``Scheduler.take_retried``; often
        none): exactly-once records them waiting again, in the transaction that checkpoints the
        ledger counting them ``retried``."""
        ...


class NoInFlightLog:
    """The null in-flight log: nothing is restored, so nothing in flight needs rewriting (at-least-once
    holds a retried item's offset through :class:`OffsetLog` until a batch carrying it finishes)."""

    def batch_progress(self, batch_id: str) -> None:
        return None

    def retried(self, items: Sequence[Item]) -> None:
        return None


class OffsetLog:
    """At-least-once: marks in ``offsets`` which ingest messages are safe (their offsets may commit)."""

    def __init__(self, offsets: OffsetTracker, failed: Deliver) -> None:
        self.offsets = offsets
        self._failed = failed
        """The durability's delivery callback: it remembers a failed delivery."""
        self._out: dict[str, list[tuple[Item, int]]] = {}  # batch in flight: (item, its attempt then)

    def item_seen(self, item: IngestItem) -> None:
        self.offsets.seen(item.partition, item)

    def dead_letter(self, partition: int, offset: int) -> Deliver | None:
        mark = DeadMark(offset)
        self.offsets.seen(partition, mark)

        def delivered(err: Any, msg: Any) -> None:
            self._failed(err, msg)
            mark.safe = err is None

        return delivered

    def batch_emitted(self, batch: Batch, placement: Placement | None) -> None:
        self._out[batch.batch_id] = [(item, item.attempt) for item in batch.items]

    def batch_finished(self, batch_id: str) -> None:
        """The batch's items are safe, except those a retriable failure sent back (their attempt
        moved on): they become safe when a later batch that carries them finishes."""
        for item, attempt in self._out.pop(batch_id, ()):
            if item.attempt == attempt:
                item.safe = True  # type: ignore[attr-defined]

    def requeued(self, batch_id: str, items: Iterable[Item]) -> None:
        """Put back in the lanes (its consumer retired): not safe until a later batch finishes."""
        self._out.pop(batch_id, None)

    def withdrawn(self, items: Iterable[Item]) -> Deliver | None:
        answered = list(items)

        def delivered(err: Any, msg: Any) -> None:
            self._failed(err, msg)
            if err is None:
                for item in answered:
                    item.safe = True  # type: ignore[attr-defined]

        return delivered
