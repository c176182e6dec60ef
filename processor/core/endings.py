"""Jobs that end before their items are dispatched: cancelled, or past their deadline.

A job ends once (the first ending sticks: a cancelled job does not later expire, an expired one is
not later cancelled) and for good: from then on none of its items waits. The scheduler withdraws
the items waiting in the job's lanes when it ends, and every item of it that arrives later (a
producer still writing, a restore adopting the changelog, a batch that comes back undone) as it
arrives; batches already in flight finish. The adapter answers each withdrawn item with a
completion of the ending's status (``Scheduler.take_ended``).

A deadline is an absolute time on the scheduler's clock (epoch milliseconds in the processor): the
job ends ``expired`` at the first dispatch or tick at or after it, so no item of it is dispatched
after its deadline. Pure: the times are the caller's ``now_ms``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from processor.core.item import Item

if TYPE_CHECKING:
    from processor.core.accounting import Ledger
    from processor.core.lanes import LaneTable, ShapeKey, ShapeLanes
    from processor.core.shares import Shares
    from processor.core.switch_order import SwitchOrder

Ending = Literal["cancelled", "expired"]
"""How a job ended; also the ledger stage its withdrawn items count in (``books.ENDINGS``)."""


class JobEndings:
    """Which jobs ended and how, the deadlines of those that have not, and the items withdrawn since
    the adapter last took them."""

    __slots__ = ("deadlines", "ended", "withdrawn")

    def __init__(self) -> None:
        self.ended: dict[str, Ending] = {}
        self.deadlines: dict[str, int] = {}
        """Deadline per job not ended yet, epoch ms: small (jobs with a deadline), read every dispatch."""
        self.withdrawn: list[tuple[Item, Ending]] = []

    def end(self, job: str, ending: Ending) -> bool:
        """Mark ``job`` ended; False when it had ended already (its first ending stays)."""
        if not job:
            raise ValueError("only a named job can end (items of no job have no job to cancel)")
        if job in self.ended:
            return False
        self.ended[job] = ending
        self.deadlines.pop(job, None)
        return True

    def set_deadline(self, job: str, deadline_ms: int | None) -> None:
        """``job``'s deadline (None: none); no effect on a job that has ended already."""
        if job in self.ended:
            return
        if deadline_ms is None:
            self.deadlines.pop(job, None)
        else:
            self.deadlines[job] = deadline_ms

    def due(self, now_ms: int) -> list[str]:
        """Jobs whose deadline is at or before ``now_ms`` (not ended yet)."""
        return [job for job, at in self.deadlines.items() if at <= now_ms]


class EndingJobs:
    """The scheduler's side of jobs that end: withdrawing their waiting items, and the deadlines.

    A mixin of :class:`~processor.core.scheduler.Scheduler`; the state below is the scheduler's (set
    in ``Scheduler.__init__``), named here for the type checker."""

    _table: LaneTable
    _shares: Shares
    _ledger: Ledger
    _active: dict[str, dict[ShapeKey, ShapeLanes]]
    _order: SwitchOrder
    _endings: JobEndings

    def end_job(self, job: str, ending: Ending, now_ms: int) -> int:
        """``job`` is cancelled (or expired): its waiting items leave the lanes now, and any that
        arrives later leaves as it arrives; batches in flight finish. Returns how many items left
        now (0 as well when the job had ended already). The adapter answers them: :meth:`take_ended`."""
        if not self._endings.end(job, ending):
            return 0
        self._shares.track(job)  # its items get lanes of their own, so that they can leave as a job
        return self._withdraw_job(job, ending, now_ms)

    def set_deadline(self, job: str, deadline_ms: int | None, now_ms: int) -> None:
        """``job`` ends ``expired`` at ``deadline_ms`` (None: no deadline); at once if that has passed."""
        self._endings.set_deadline(job, deadline_ms)
        self.expire(now_ms)

    def expire(self, now_ms: int) -> int:
        """End every job whose deadline has come; returns how many items that withdrew."""
        return sum(self.end_job(job, "expired", now_ms) for job in self._endings.due(now_ms))

    def take_ended(self) -> list[tuple[Item, Ending]]:
        """The items withdrawn since the last call, with how their job ended, in the order they left."""
        out, self._endings.withdrawn = self._endings.withdrawn, []
        return out

    def _withdraw_job(self, job: str, ending: Ending, now_ms: int) -> int:
        withdrawn = 0
        for sl in [sl for sl in self._table.shapes.values() if sl.job == job and sl.waiting_items]:
            model, tokens = sl.key[0], sl.waiting_tokens
            items = self._table.withdraw(sl, now_ms)
            self._order.taken_from(sl)
            del self._active[model][sl.key]
            self._shares.lanes_changed(model, job, -1)
            self._ledger.ended(model, job, ending, len(items), tokens)
            self._endings.withdrawn += [(item, ending) for item in items]
            withdrawn += len(items)
        return withdrawn
