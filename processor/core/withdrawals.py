"""Withdrawing the items of jobs that end: the scheduler's part in a cancellation or a deadline.

What ending means (once, for good; a deadline on the scheduler's clock) is core/endings.py's, with
the record of which jobs ended. :class:`Withdrawals` acts on it over the scheduler's state, which it
is handed as a :class:`~processor.core.context.SchedulerContext`: the scheduler's ``end_job``,
``set_deadline``, ``expire`` and ``take_ended`` are its methods, and the scheduler calls
:meth:`Withdrawals.withdraw_job` for the items of an ended job that arrive later.
"""

from __future__ import annotations

from collections.abc import Callable

from processor.core.context import SchedulerContext
from processor.core.endings import Ending
from processor.core.item import Item
from processor.core.lanes import ShapeLanes


class Withdrawals:
    """Ends jobs and takes their waiting items out of the lanes, counted in the ledger as the ending
    says; the items wait in the record (``JobEndings.withdrawn``) until the adapter takes them."""

    __slots__ = ("_context",)

    def __init__(self, context: SchedulerContext) -> None:
        self._context = context

    def end_job(self, job: str, ending: Ending, now_ms: int) -> int:
        """``job`` is cancelled (or expired): its waiting items leave the lanes now, and any that
        arrives later leaves as it arrives; batches in flight finish. Returns how many items left
        now (0 as well when the job had ended already). The adapter answers them: :meth:`take_ended`."""
        ctx = self._context
        if not ctx.endings.end(job, ending):
            return 0
        ctx.shares.track(job)  # its items get lanes of their own, so that they can leave as a job
        return self.withdraw_job(job, ending, now_ms)

    def set_deadline(self, job: str, deadline_ms: int | None, now_ms: int) -> None:
        """``job`` ends ``expired`` at ``deadline_ms`` (None: no deadline); at once if that has passed."""
        self._context.endings.set_deadline(job, deadline_ms)
        self.expire(now_ms)

    def expire(self, now_ms: int) -> int:
        """End every job whose deadline has come; returns how many items that withdrew."""
        return sum(self.end_job(job, "expired", now_ms) for job in self._context.endings.due(now_ms))

    def take_ended(self) -> list[tuple[Item, Ending]]:
        """The items withdrawn since the last call, with how their job ended, in the order they left."""
        endings = self._context.endings
        out, endings.withdrawn = endings.withdrawn, []
        return out

    def withdraw_job(self, job: str, ending: Ending, now_ms: int) -> int:
        """Take every waiting item of ``job`` (which ended so) out of its lanes; returns how many."""
        ctx = self._context
        table = ctx.table
        withdrawn = 0
        for sl in [sl for sl in table.shapes.values() if sl.job == job and sl.waiting_items]:
            items, tokens = take_waiting(ctx, sl, now_ms)
            ctx.ledger.ended(sl.key[0], job, ending, len(items), tokens)
            ctx.endings.withdrawn += [(item, ending) for item in items]
            withdrawn += len(items)
        return withdrawn


def take_waiting(
    ctx: SchedulerContext, sl: ShapeLanes, now_ms: int, which: Callable[[Item], bool] | None = None
) -> tuple[list[Item], int]:
    """Take the waiting items ``which`` picks (None: every one) out of ``sl``, with the switch order
    and the shares told, and the shape no longer active once nothing waits there. Returns them and
    their tokens; what the ledger counts them as is the caller's (an ending, a release)."""
    tokens = sl.waiting_tokens
    items = ctx.table.withdraw(sl, now_ms, which)
    if items:
        ctx.order.taken_from(sl)
        if not sl.waiting_items:
            del ctx.active[sl.key[0]][sl.key]
            ctx.shares.lanes_changed(sl.key[0], sl.job, -1)
    return items, tokens - sl.waiting_tokens
