"""Dedupe: whether an ingest message's item id is a producer's repeat within the window. One of the
roles a delivery mode is made of (processor/state/modes.py).

:class:`WindowDedupe` remembers the ids each owned ingest partition took (processor/state/seen.py)
in memory now and in the changelog at the commit that also commits the message's offset, so a crash
before it forgets both together (the restarted processor reads the message again). It needs the
changelog, so it exists only in exactly-once mode with a window set; otherwise :class:`NoDedupe`, the
null object: without a changelog, a re-read after a rebalance or a crash would look like a repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from processor.state.durability import ChangelogRecord
from processor.state.seen import SeenBook


class Dedupe(Protocol):
    """The ids seen per ingest partition: asked per message, written and restored with the changelog."""

    def first_seen(self, partition: int, item_id: str) -> bool:
        """False for a repeat of an id the partition took within the window."""
        ...

    def poll_check(self) -> Callable[[int, str], bool] | None:
        """``first_seen`` for one poll's messages, the wall clock read once for them all (they
        arrived together, so they share a bucket); None when every id is a first (no window)."""
        ...

    def remembered_ids(self) -> int:
        """How many item ids the window holds (0: no dedupe)."""
        ...

    def changes(self) -> list[ChangelogRecord]:
        """The changelog records of what changed since the last call (for the commit)."""
        ...

    def load(self, seen: dict[tuple[int, int, int], bytes]) -> None:
        """The ids a restore read from the changelog (processor.state.changelog.ChangelogState.seen)."""
        ...

    def clear(self) -> None:
        """Forget everything (the partitions were handed over)."""
        ...

    def forget(self, partitions: Iterable[int]) -> None:
        """Forget what ``partitions`` took (they were handed over; the others stay)."""
        ...


class WindowDedupe:
    def __init__(self, window_ms: int, max_ids: int, wall_ms: Callable[[], int]) -> None:
        self.seen = SeenBook(window_ms, max_ids)
        self._wall_ms = wall_ms

    def first_seen(self, partition: int, item_id: str) -> bool:
        return self.seen.first(partition, item_id, self._wall_ms())

    def poll_check(self) -> Callable[[int, str], bool]:
        return self.seen.first_at(self._wall_ms())

    def remembered_ids(self) -> int:
        return len(self.seen)

    def changes(self) -> list[ChangelogRecord]:
        return self.seen.flush(self._wall_ms())

    def load(self, seen: dict[tuple[int, int, int], bytes]) -> None:
        self.seen.load(seen)

    def clear(self) -> None:
        self.seen.clear()

    def forget(self, partitions: Iterable[int]) -> None:
        self.seen.forget(partitions)


class NoDedupe:
    """Every id is a first: nothing is remembered, written or restored."""

    def first_seen(self, partition: int, item_id: str) -> bool:
        return True

    def poll_check(self) -> None:
        return None

    def remembered_ids(self) -> int:
        return 0

    def changes(self) -> list[ChangelogRecord]:
        return []

    def load(self, seen: dict[tuple[int, int, int], bytes]) -> None:
        return None

    def clear(self) -> None:
        return None

    def forget(self, partitions: Iterable[int]) -> None:
        return None
