"""The scheduler's part in a partition handover: taking back what a restore rebuilt (batches in
flight, the ledger's checkpoint) and letting go of it when partitions move: all of it, or only what
belongs to the partitions that go (a partial revocation under the consumer protocol).

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

from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

from processor.core.accounting import Ledger, Released, ReleasedInFlight
from processor.core.context import SchedulerContext
from processor.core.contract import Contract
from processor.core.inflight import ConsumerState, InFlight, per_job
from processor.core.item import Batch, Item
from processor.core.lanes import LaneTable
from processor.core.withdrawals import take_waiting

_K = TypeVar("_K")

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

    def release(
        self, waiting: Callable[[Item], bool], batch_ids: Iterable[str], now_ms: int
    ) -> tuple[int, int]:
        """Forget the waiting items ``waiting`` picks and the in-flight batches ``batch_ids`` (their
        ingest partitions are handed over while this instance keeps others, whose work stays as it
        is); the ledger moves exactly their counts to ``released``, per model, consumer and job.
        Returns the waiting items and batches let go.

        A shape left empty leaves the switch order and its job's active shapes; the batches are
        remembered as handed over (``InFlightTable.handed_over``), their holders' slots free."""
        ctx = self._context
        queued: Released = {}
        released = 0
        for sl in [sl for sl in ctx.table.shapes.values() if sl.waiting_items]:
            items, tokens = take_waiting(ctx, sl, now_ms, waiting)
            if items:
                _count(queued, (sl.key[0], sl.job), len(items), tokens)
                released += len(items)
        if released:  # released items are marked dispatched: they leave their arrival queues now
            for model in list(ctx.arrivals):
                ctx.arrivals[model] = deque(it for it in ctx.arrivals[model] if not it.dispatched)
        in_flight: ReleasedInFlight = {}
        batches = 0
        for batch_id in batch_ids:
            entry = ctx.flights.let_go(batch_id)
            if entry is not None:
                batches += 1
                batch, outstanding = entry[1].batch, entry[1].outstanding()
                tokens = sum(it.length for it in outstanding)
                _count(in_flight, (batch.model, batch.consumer, None), len(outstanding), tokens)
                for job, (n, t) in per_job(outstanding).items():
                    _count(in_flight, (None, None, job), n, t)
        ctx.ledger.release(queued, in_flight)
        return released, batches

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


def _count(out: dict[_K, tuple[int, int]], key: _K, items: int, tokens: int) -> None:
    """Add (items, tokens) to ``out[key]``."""
    n, t = out.get(key, (0, 0))
    out[key] = (n + items, t + tokens)
