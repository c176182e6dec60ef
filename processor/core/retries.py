"""Retries of failed items inside the pipeline: which failed answer sends its item back to the lanes.

An item's ``attempt`` (``Item.attempt``, 1 for its first dispatch) grows by one each time it goes
back. The consumer that ran it says whether a failure is worth another try (``Completion.retriable``:
the engine timed out, the server answered 5xx, went away or refused the connection; not a rejected
item, a 4xx refusal or a broken contract). The scheduler retries such an item while its attempt is
below its job's ``max_attempts`` (``JobShare.max_attempts``, :data:`DEFAULT_MAX_ATTEMPTS` when the
job's record names none) and the job has not ended; otherwise the failure is the item's last answer.

The rule is one function, :meth:`RetryPolicy.retries`, so the scheduler and anything that reads
results (a reader deciding whether a failed completion is final) decide alike. Pure: no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from processor.core.item import Item

DEFAULT_MAX_ATTEMPTS = 3
"""Attempts an item gets in all (the first included) when its job's record names none."""


def check_max_attempts(max_attempts: int) -> int:
    """``max_attempts`` when valid (at least 1: one attempt, no retry), else ``ValueError``."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
    return max_attempts


def may_retry(attempt: int, max_attempts: int) -> bool:
    """Whether an item that failed retriably on ``attempt`` goes back for attempt ``attempt + 1``."""
    return attempt < max_attempts


class RetryPolicy:
    """Each job's ``max_attempts``; jobs not named have :data:`DEFAULT_MAX_ATTEMPTS`."""

    __slots__ = ("default", "max_attempts")

    def __init__(self, default: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.default = check_max_attempts(default)
        self.max_attempts: dict[str, int] = {}

    def set(self, job: str, max_attempts: int | None) -> None:
        """``job``'s attempts in all; None puts it back to the default."""
        if max_attempts is None:
            self.max_attempts.pop(job, None)
        else:
            self.max_attempts[job] = check_max_attempts(max_attempts)

    def of(self, job: str) -> int:
        return self.max_attempts.get(job, self.default)

    def retries(self, job: str, attempt: int) -> bool:
        """An item of ``job`` that failed retriably on ``attempt`` is tried again."""
        return may_retry(attempt, self.max_attempts.get(job, self.default))

    def split(
        self, answered: Sequence[tuple[bool, Item]], retriable: Collection[str]
    ) -> tuple[list[Item], list[tuple[bool, Item]]]:
        """The failed items of ``answered`` named in ``retriable`` that get another attempt (their
        ``attempt`` moved on and marked undispatched, ready for their lanes), and the other answers."""
        again: list[Item] = []
        rest: list[tuple[bool, Item]] = []
        for ok, it in answered:
            if not ok and it.id in retriable and self.retries(it.job, it.attempt):
                it.attempt += 1
                it.dispatched = False
                again.append(it)
            else:
                rest.append((ok, it))
        return again, rest
