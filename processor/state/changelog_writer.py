"""The exactly-once lane log: every change to the lanes and in-flight batches becomes changelog
records (processor/state/changelog.py) in the transaction that commits the offsets that caused it,
so a restore (processor/state/restore.py) rebuilds exactly what the last commit checkpointed.

:class:`ChangelogWriter` is told what happens as it happens (the :class:`~processor.state.lane_log.LaneLog`
and :class:`~processor.state.lane_log.InFlightLog` roles), and gives the records at each commit
(:meth:`ChangelogWriter.changes`, called by :class:`~processor.state.durability.Transactions`). At an
assignment the handover adopts restored state through it (the
:class:`~processor.state.ownership.Restorable` role); at a revocation it forgets the state of the
partitions that go (:meth:`ChangelogWriter.let_go`), or all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import cast

from processor.core.item import Batch, Item
from processor.state import changelog
from processor.state.dedupe import Dedupe
from processor.state.durability import ChangelogRecord, Deliver
from processor.state.ingest import IngestItem
from processor.state.placement import Placement


@dataclass(slots=True)
class _LoggedBatch:
    partition: int
    entry: changelog.BatchEntry
    batch: Batch


def changelog_attempts(items: Iterable[Item]) -> tuple[int, ...]:
    """A batch record's ``attempts``: each item's, or none when all are on their first."""
    attempts = tuple(it.attempt for it in items)
    return attempts if any(a != 1 for a in attempts) else ()


def _entry(batch: Batch, items: list[IngestItem], placement: Placement) -> changelog.BatchEntry:
    """A new in-flight batch's first record."""
    return changelog.BatchEntry(
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


class ChangelogWriter:
    """What changed since the last commit, as changelog records. Invariant: an item is ``logged``
    exactly while a committed or pending waiting-set record holds it (its ``home`` partition)."""

    def __init__(
        self, is_in_flight: Callable[[str], bool], done_items: Callable[[str], list[str]], dedupe: Dedupe
    ) -> None:
        self._is_in_flight = is_in_flight
        self._done_items = done_items
        self.dedupe = dedupe
        """Its seen-id records go in the same commit, after the lanes' (processor/state/dedupe.py)."""
        self._new_items: list[IngestItem] = []
        self._emitted: list[tuple[Batch, Placement]] = []
        self._finished: list[str] = []
        self._progressed: set[str] = set()
        self._withdrawn: list[IngestItem] = []
        self._logged_batches: dict[str, _LoggedBatch] = {}
        self._waiting = changelog.WaitingSets()

    # -- the lane log ----------------------------------------------------------------------------

    def item_seen(self, item: IngestItem) -> None:
        self._new_items.append(item)

    def dead_letter(self, partition: int, offset: int) -> Deliver | None:
        """Nothing to log: the dead letter commits with the transaction that commits its offset."""
        return None

    def batch_emitted(self, batch: Batch, placement: Placement | None) -> None:
        if placement is None:
            raise ValueError(f"batch {batch.batch_id}: exactly-once needs its changelog placement")
        self._emitted.append((batch, placement))

    def batch_finished(self, batch_id: str) -> None:
        self._finished.append(batch_id)

    def requeued(self, batch_id: str, items: Iterable[Item]) -> None:
        self._finished.append(batch_id)
        self._new_items.extend(cast(Iterable[IngestItem], items))

    def withdrawn(self, items: Iterable[Item]) -> Deliver | None:
        self._withdrawn.extend(cast(Iterable[IngestItem], items))
        return None

    # -- in flight -------------------------------------------------------------------------------

    def batch_progress(self, batch_id: str) -> None:
        self._progressed.add(batch_id)

    def retried(self, items: Sequence[Item]) -> None:
        if items:
            self._new_items.extend(cast(Sequence[IngestItem], items))

    # -- restored state --------------------------------------------------------------------------

    def adopt(self, item: IngestItem, home: int) -> None:
        """A restored waiting item: its changelog record is already committed, in ``home``."""
        item.logged = True
        item.home = home

    def adopt_waiting(self, state: changelog.ChangelogState) -> None:
        """The committed waiting sets and seen ids restore read, so that later changes rewrite them."""
        self._waiting.load(state)
        self.dedupe.load(state.seen)

    def adopt_batch(self, batch: Batch, partition: int, entry: changelog.BatchEntry) -> None:
        for item in batch.items:
            cast(IngestItem, item).home = partition  # if they go back to lanes, their records go here
        self._logged_batches[batch.batch_id] = _LoggedBatch(partition, entry, batch)

    def reset(self) -> None:
        """Forget everything tracked (after a commit, when the partitions are handed over)."""
        self._clear_pending()
        self._logged_batches.clear()
        self._waiting.clear()
        self.dedupe.clear()

    def let_go(self, partitions: Collection[int]) -> list[str]:
        """Forget what the changelog partitions ``partitions`` hold (they were handed over, just after
        the commit that made them durable; the partitions kept stay tracked as they are). Returns the
        ids of the in-flight batches whose records live there, for the core to let go of too.

        A batch kept may carry items of a partition that goes: they are homed in the batch's
        partition now, as a restore of it would home them, so that if they go back to the lanes
        their records are written where this instance still owns them."""
        pending = (self._new_items, self._withdrawn, self._emitted, self._finished, self._progressed)
        if any(pending):
            raise RuntimeError("the lane log lets go of partitions only just after a commit")
        gone = [b for b, logged in self._logged_batches.items() if logged.partition in partitions]
        for batch_id in gone:
            del self._logged_batches[batch_id]
        for logged in self._logged_batches.values():
            for item in logged.batch.items:
                cast(IngestItem, item).home = logged.partition
        self._waiting.forget(partitions)
        self.dedupe.forget(partitions)
        return gone

    def _clear_pending(self) -> None:
        self._new_items.clear()
        self._withdrawn.clear()
        self._emitted.clear()
        self._finished.clear()
        self._progressed.clear()

    # -- the records of a commit -----------------------------------------------------------------

    def changes(self) -> list[ChangelogRecord]:
        """The records of everything told since the last call, in the order they must be written."""
        out: list[ChangelogRecord] = []
        waiting = self._waiting
        fresh = [item for item in self._new_items if not item.dispatched and not item.logged]
        waiting.add_all(fresh)
        for item in fresh:
            item.logged = True
        self._log_attempts(fresh, True, out)
        ended = [it for it in self._withdrawn if it.logged]  # withdrawn items are marked dispatched
        self._unlog(ended, out)
        for batch, placement in self._emitted:
            items = cast(list[IngestItem], batch.items)
            self._unlog([it for it in items if it.logged], out)
            if self._is_in_flight(batch.batch_id):
                entry = _entry(batch, items, placement)
                self._logged_batches[batch.batch_id] = _LoggedBatch(placement.partition, entry, batch)
                self._progressed.add(batch.batch_id)
        for batch_id in self._finished:
            self._progressed.discard(batch_id)
            logged = self._logged_batches.pop(batch_id, None)
            if logged is not None:
                out.append((logged.partition, changelog.batch_key(batch_id), None))
        for batch_id in self._progressed:
            self._log_batch(batch_id, out)
        out.extend(waiting.flush())
        out.extend(self.dedupe.changes())
        self._clear_pending()
        return out

    def _unlog(self, gone: list[IngestItem], out: list[ChangelogRecord]) -> None:
        """Items that stopped waiting: out of their waiting set."""
        self._waiting.discard_all(gone)
        for it in gone:
            it.logged = False
        self._log_attempts(gone, False, out)

    @staticmethod
    def _log_attempts(items: Iterable[IngestItem], waiting: bool, out: list[ChangelogRecord]) -> None:
        """The ``A`` record of each item past its first attempt that starts (``waiting``) or stops
        waiting, beside its bit in the waiting set (processor/state/changelog.py)."""
        for it in items:
            if it.attempt != 1:
                value = changelog.attempt_value(it.attempt) if waiting else None
                out.append((it.home, changelog.attempt_key(it.partition, it.offset), value))

    def _log_batch(self, batch_id: str, out: list[ChangelogRecord]) -> None:
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
            out.append((logged.partition, changelog.batch_key(batch_id), logged.entry.value()))
