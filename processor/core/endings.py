"""Jobs that end before their items are dispatched: cancelled, or past their deadline.

A job ends once (the first ending sticks: a cancelled job does not later expire, an expired one is
not later cancelled) and for good: from then on none of its items waits. The scheduler withdraws
the items waiting in the job's lanes when it ends, and every item of it that arrives later (a
producer still writing, a restore adopting the changelog, a batch that comes back undone) as it
arrives; batches already in flight finish. The adapter answers each withdrawn item with a
completion of the ending's status (``Scheduler.take_ended``). This module holds the record of
endings (:class:`JobEndings`); the withdrawing is core/withdrawals.py's.

A deadline is an absolute time on the scheduler's clock (epoch milliseconds in the processor): the
job ends ``expired`` at the first dispatch or tick at or after it, so no item of it is dispatched
after its deadline. Pure: the times are the caller's ``now_ms``.
"""

from __future__ import annotations

from typing import Literal

from processor.core.item import Item

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
