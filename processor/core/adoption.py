"""The scheduler's part in a partition handover: taking back what a restore rebuilt (batches in
flight, the ledger's checkpoint) and letting go of everything when the partitions move.

Kept apart from core/scheduler.py because it runs once per rebalance, not per item: the hot path
(submit, dispatch, complete) is the scheduler's own, and so is taking in restored waiting items
(``Scheduler.adopt_waiting_many``, the same placement as ``submit``). :class:`Adoption` is handed
the scheduler's state as a :class:`~processor.core.context.SchedulerContext` and the one scheduler
step it needs (``requeue``); replacing the lane table or the ledger, it rebinds them there, so the
scheduler and its other parts see the new ones. The processor's side of the handover (reading the
changelog, fencing, the order of the steps) is processor/state/handover.py; docs/reliability.md
tells the whole story.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from processor.core.accounting import Ledger
from processor.core.context import SchedulerContext
from processor.core.contract import Contract
from processor.core.inflight import ConsumerState, InFlight, per_job
from processor.core.item import Batch, Item
from processor.core.lanes import LaneTable

Requeue = Callable[[str, int], list[Item]]
"""``Scheduler.requeue``: a batch's outstanding items back to their lanes, counted as redelivered."""


class Adoption:
    """Adopting restored work and releasing it: what the scheduler's handover methods call."""

    __slots__ = ("_context", "_requeue")

    def __init__(self, context: SchedulerContext, requeue: Requeue) -> None:
        self._context = context
        self._requeue = requeue

    def adopt_in_flight(self, batch: Batch, now_ms: int, done: Collection[str] = ()) -> bool:
        """Re-register a batch restored from the changelog; ``done`` names items already answered
        (counted where they were answered), the rest are adopted as in flight.

        The batch's items are marked dispatched in the batch's lane here (as ``Scheduler.dispatch``
        leaves the items it emits), so a caller hands over items as it rebuilt them; items already
        marked so stay as they are.

        Returns False if its consumer has no contract any more: the outstanding items then go back to
        their lanes, counted as redelivered.
        """
        ctx = self._context
        track = ctx.shares.track
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
        ledger = ctx.ledger
        ledger.adopted_in_flight(
            batch.model, batch.consumer, len(outstanding), sum(it.length for it in outstanding)
        )
        for job, (n, tokens) in per_job(outstanding).items():
            ledger.job_adopted_in_flight(job, n, tokens)
        state = ctx.consumers.get(batch.consumer)
        if state is None:
            ctx.flights.hold(ConsumerState(Contract(batch.consumer, batch.model, 1, 1)), flight)
            self._requeue(batch.batch_id, now_ms)
            return False
        ctx.flights.hold(state, flight)
        return True

    def release_slots(self) -> None:
        """Every known consumer holds no slots here until ``Scheduler.set_contract`` gives it a share
        again.

        After this instance hands its ingest partitions over, the in-flight slots of each consumer
        belong to whichever instances own partitions now (processor/state/credits.py deals them out);
        dispatching on a stale share would send a consumer more batches than its ``max_inflight``.
        Contracts stay, so a later share needs no new announcement.
        """
        for state in self._context.consumers.values():
            state.slots = 0
        self._context.flights.free.clear()

    def release_all(self) -> None:
        """Forget every waiting item and in-flight batch (their ingest partitions are being handed
        over, or restored afresh); the ledger moves their counts to ``released``. Contracts stay.

        The lane table is replaced by an empty one (in the context: every part sees it), its
        counters of lane activity carried on."""
        ctx = self._context
        stats = ctx.table.stats
        stats.lanes_in_use = 0  # the counters of lane activity carry on; only the lanes go
        ctx.table = LaneTable(ctx.table.settings)
        ctx.table.stats = stats
        ctx.active.clear()
        ctx.order.clear()
        ctx.shares.reset_waiting()
        ctx.arrivals.clear()
        ctx.flights.clear()
        for state in ctx.consumers.values():
            state.in_flight.clear()
            state.shape = None
        ctx.flights.recount(ctx.consumers.values())
        ctx.ledger.release_all()

    def done_items(self, batch_id: str) -> list[str]:
        """Ids of the items of an in-flight batch that have been answered already."""
        entry = self._context.flights.get(batch_id)
        if entry is None:
            raise KeyError(batch_id)
        return entry[1].done_ids()

    def resume_ledger(self, snapshot: dict[str, int]) -> None:
        """Continue from a checkpointed ledger (``Ledger.snapshot``); only before any item arrives.
        The restored ledger replaces the context's (every part writes to it from now on)."""
        ctx = self._context
        ctx.ledger = ledger = Ledger.restore(snapshot)
        ledger.adopt_unbooked_jobs()
        ctx.counted_before = before = Ledger.restore(snapshot)
        before.adopt_unbooked_jobs()
        ctx.shares.resume(ledger)
