"""Ownership: whether lane state moves with ingest partitions, which decides what the rebalance
hooks mean. One of the roles a delivery mode is made of (processor/state/modes.py); the handover
(processor/state/handover.py) asks it instead of asking which mode it runs in.

:class:`MovesWithPartitions` (exactly-once): lane state belongs to ingest partitions; at start the
ledger resumes before any is assigned, a revocation lets go of the revoked partitions' lane state
(the partitions kept keep theirs, in memory) and an assignment restores the assigned partitions'
changelog into the :class:`Restorable` lane log. :class:`StaysWithInstance`
(at-least-once): there is no changelog to hand lane state over by; the next owner of a revoked
partition reads it again from its committed offset, so only its offsets are forgotten here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from confluent_kafka import TopicPartition

from processor.core.item import Batch, Item
from processor.state.changelog import BatchEntry, ChangelogState
from processor.state.ingest import IngestItem
from processor.state.offsets import OffsetTracker
from processor.state.results import ResultsCursor


class Restorable(Protocol):
    """What the handover adopts restored lane state into (the exactly-once lane log)."""

    def adopt(self, item: IngestItem, home: int) -> None:
        """A restored waiting item, whose changelog record is already committed in ``home``."""
        ...

    def adopt_waiting(self, state: ChangelogState) -> None:
        """The committed waiting sets and seen ids, so that later changes rewrite them."""
        ...

    def adopt_batch(self, batch: Batch, partition: int, entry: BatchEntry) -> None:
        """A restored in-flight batch, whose record lives in changelog ``partition``."""
        ...

    def requeued(self, batch_id: str, items: Iterable[Item]) -> None:
        """A restored batch whose consumer is gone: its unanswered ``items`` wait again."""
        ...

    def reset(self) -> None:
        """Forget everything tracked (the partitions were handed over)."""
        ...

    def let_go(self, partitions: Collection[int]) -> list[str]:
        """Forget what ``partitions`` hold (handed over while others stay); returns the ids of the
        in-flight batches whose records live there."""
        ...


TakeOver = Callable[[Restorable, list[int]], None]
"""Restores the lane state of some partitions into a restorable lane log (the handover's)."""
LetGo = Callable[[Restorable, list[int]], None]
"""Lets go of the lane state of some partitions, held in a restorable lane log (the handover's)."""


class Ownership(Protocol):
    """What start, a revocation and an assignment mean for lane state."""

    def on_start(self, resume: Callable[[], None]) -> None:
        """Before the group assigns partitions: call ``resume`` (load the ledger checkpoint, read
        results from the topic's end) when lane state moves with partitions."""
        ...

    def results_assignment(
        self, topic: str, partitions: list[int], cursor: ResultsCursor
    ) -> list[TopicPartition]:
        """Where the results reader starts: the cursor's positions, or the group's committed ones."""
        ...

    def revoked(self, partitions: list[int], let_go: LetGo) -> None:
        """After the forced commit of a revocation: what letting go of ``partitions`` means here."""
        ...

    def assigned(self, partitions: list[int], take_over: TakeOver) -> None:
        """An assignment: restore the partitions' lane state through ``take_over``, or nothing."""
        ...


class MovesWithPartitions:
    """Exactly-once: lane state is restored into, and reset from, ``lanes``."""

    def __init__(self, lanes: Restorable) -> None:
        self.lanes = lanes

    def on_start(self, resume: Callable[[], None]) -> None:
        """Lane state moves with partitions: resume the ledger before any is assigned."""
        resume()

    def results_assignment(
        self, topic: str, partitions: list[int], cursor: ResultsCursor
    ) -> list[TopicPartition]:
        """From the cursor: completions of batches restored later are found by rewinding it."""
        return [TopicPartition(topic, p, o) for p, o in cursor.next.items()]

    def revoked(self, partitions: list[int], let_go: LetGo) -> None:
        """The revoked partitions' lane state goes (committed just before: their next owner restores
        it), in the core and in ``lanes``; the partitions kept keep theirs."""
        let_go(self.lanes, partitions)

    def assigned(self, partitions: list[int], take_over: TakeOver) -> None:
        take_over(self.lanes, partitions)


class StaysWithInstance:
    """At-least-once: lane state stays; revoked partitions' offsets are forgotten from ``offsets``."""

    def __init__(self, offsets: OffsetTracker) -> None:
        self.offsets = offsets

    def on_start(self, resume: Callable[[], None]) -> None:
        """Nothing to resume: without a changelog, lane state starts empty and the ledger from 0."""

    def results_assignment(
        self, topic: str, partitions: list[int], cursor: ResultsCursor
    ) -> list[TopicPartition]:
        """From the group's committed position: completions are applied at least once."""
        return [TopicPartition(topic, p) for p in partitions]

    def revoked(self, partitions: list[int], let_go: LetGo) -> None:
        """Lane state stays (there is no changelog to hand it over by): the next owner reads the
        revoked partitions again from their committed offsets, so only their offsets are forgotten."""
        for p in partitions:
            self.offsets.drop(p)

    def assigned(self, partitions: list[int], take_over: TakeOver) -> None:
        """Nothing to restore: the assigned partitions are read from their committed offsets."""
