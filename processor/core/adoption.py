"""The scheduler's part in a partition handover: taking back what a restore rebuilt (waiting items,
batches in flight, the ledger's checkpoint) and letting go of everything when the partitions move.

A mixin of :class:`~processor.core.scheduler.Scheduler`, kept apart because it runs once per
rebalance, not per item: the hot path (submit, dispatch, complete) lives in core/scheduler.py. The
processor's side of the handover (reading the changelog, fencing, the order of the steps) is
processor/state/handover.py; docs/reliability.md tells the whole story.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Literal

from processor.core.accounting import Ledger
from processor.core.contract import Contract
from processor.core.inflight import ConsumerState, InFlight, per_job
from processor.core.item import Batch, Item
from processor.core.lanes import LaneTable

if TYPE_CHECKING:
    from collections import deque

    from processor.core.inflight import InFlightTable
    from processor.core.lanes import ShapeKey, ShapeLanes
    from processor.core.shares import Shares
    from processor.core.switch_order import SwitchOrder


class HandoverAdoption:
    """Adopting restored work and releasing it: the methods a partition handover calls.

    The state below is the scheduler's (set in ``Scheduler.__init__``), named here for the type
    checker; so are the two scheduler methods these call."""

    _table: LaneTable
    _shares: Shares
    _ledger: Ledger
    _consumers: dict[str, ConsumerState]
    _active: dict[str, dict[ShapeKey, ShapeLanes]]
    _arrivals: dict[str, deque[Item]]
    _order: SwitchOrder
    _flights: InFlightTable

    def _enqueue_many(self, items: Sequence[Item], times: Sequence[int], count: Literal["adopted"]) -> None:
        raise NotImplementedError  # Scheduler._enqueue_many

    def requeue(self, batch_id: str, now_ms: int) -> list[Item]:
        raise NotImplementedError  # Scheduler.requeue

    def adopt_waiting(self, item: Item, now_ms: int) -> None:
        """Take in an item restored from the changelog (counted as adopted, not received)."""
        self.adopt_waiting_many((item,), (now_ms,))

    def adopt_waiting_many(self, items: Sequence[Item], times: Sequence[int]) -> None:
        """:meth:`adopt_waiting` for each item in turn, in one pass (a restore takes millions)."""
        self._enqueue_many(items, times, "adopted")

    def adopt_in_flight(self, batch: Batch, now_ms: int, done: Collection[str] = ()) -> bool:
        """Re-register a batch restored from the changelog; ``done`` names items already answered
        (counted where they were answered), the rest are adopted as in flight.

        The batch's items are marked dispatched in the batch's lane here (as :meth:`dispatch` leaves
        the items it emits), so a caller hands over items as it rebuilt them; items already marked so
        stay as they are.

        Returns False if its consumer has no contract any more: the outstanding items then go back to
        their lanes, counted as redelivered.
        """
        track = self._shares.track
        lane = batch.lane
        for it in batch.items:
            it.job = track(it.job)
            it.dispatched = True
            it.lane = lane
        jobs = {it.job for it in batch.items}
        flight = InFlight(batch, jobs.pop() if len(jobs) == 1 else None)
        if done:
            flight.pending = {it.id: it for it in batch.items if it.id not in done}
        outstanding = flight.outstanding()
        self._ledger.adopted_in_flight(
            batch.model, batch.consumer, len(outstanding), sum(it.length for it in outstanding)
        )
        for job, (n, tokens) in per_job(outstanding).items():
            self._ledger.job_adopted_in_flight(job, n, tokens)
        state = self._consumers.get(batch.consumer)
        if state is None:
            self._flights.hold(ConsumerState(Contract(batch.consumer, batch.model, 1, 1)), flight)
            self.requeue(batch.batch_id, now_ms)
            return False
        self._flights.hold(state, flight)
        return True

    def release_slots(self) -> None:
        """Every known consumer holds no slots here until :meth:`set_contract` gives it a share again.

        After this instance hands its ingest partitions over, the in-flight slots of each consumer
        belong to whichever instances own partitions now (processor/state/credits.py deals them out);
        dispatching on a stale share would send a consumer more batches than its ``max_inflight``.
        Contracts stay, so a later share needs no new announcement.
        """
        for state in self._consumers.values():
            state.slots = 0

    def release_all(self) -> None:
        """Forget every waiting item and in-flight batch (their ingest partitions are being handed
        over, or restored afresh); the ledger moves their counts to ``released``. Contracts stay."""
        stats = self._table.stats
        stats.lanes_in_use = 0  # the counters of lane activity carry on; only the lanes go
        self._table = LaneTable(self._table.settings)
        self._table.stats = stats
        self._active.clear()
        self._order.clear()
        self._shares.reset_waiting()
        self._arrivals.clear()
        self._flights.clear()
        for state in self._consumers.values():
            state.in_flight.clear()
            state.shape = None
        self._ledger.release_all()

    def done_items(self, batch_id: str) -> list[str]:
        """Ids of the items of an in-flight batch that have been answered already."""
        entry = self._flights.get(batch_id)
        if entry is None:
            raise KeyError(batch_id)
        return entry[1].done_ids()

    def resume_ledger(self, snapshot: dict[str, int]) -> None:
        """Continue from a checkpointed ledger (:meth:`Ledger.snapshot`); only before any item arrives."""
        self._ledger = Ledger.restore(snapshot)
        self._ledger.adopt_unbooked_jobs()
        self._shares.resume(self._ledger)
