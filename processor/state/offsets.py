"""Which ingest offsets may be committed: only those below the oldest message not yet safe.

A message is *safe* once what it carried lives somewhere other than this process's memory: its item
has its last answer (a batch carrying it finished without sending it back, or the processor's own
ending was acknowledged), or it was dead-lettered and that was acknowledged. Items waiting in lanes
or in flight are not safe, so the committed offset never passes them: after a crash they are read
again. (Items *after* the oldest unsafe one that were already dispatched are read again
too: at-least-once. docs/reliability.md says how replays are deduplicated.)

Pure bookkeeping, no Kafka import: the service feeds it partitions and offsets.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol


class Mark(Protocol):
    offset: int
    safe: bool


class DeadMark:
    """The mark of a message that carried no item (dead-lettered)."""

    __slots__ = ("offset", "safe")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.safe = False


class OffsetTracker:
    def __init__(self) -> None:
        self._marks: dict[int, deque[Mark]] = {}
        self._next: dict[int, int] = {}  # one past the highest offset seen, per partition
        self._committed: dict[int, int] = {}

    def seen(self, partition: int, mark: Mark) -> None:
        self._marks.setdefault(partition, deque()).append(mark)
        self._next[partition] = mark.offset + 1

    def committable(self) -> dict[int, int]:
        """Per partition, the offset to commit (the first unsafe one), where it moved since last time."""
        out: dict[int, int] = {}
        for partition, marks in self._marks.items():
            while marks and marks[0].safe:
                marks.popleft()
            offset = marks[0].offset if marks else self._next[partition]
            if self._committed.get(partition) != offset:
                out[partition] = offset
        return out

    def committed(self, offsets: dict[int, int]) -> None:
        self._committed.update(offsets)

    def drop(self, partition: int) -> None:
        """Forget a partition (it was revoked)."""
        self._marks.pop(partition, None)
        self._next.pop(partition, None)
        self._committed.pop(partition, None)

    def unsafe(self) -> int:
        return sum(1 for marks in self._marks.values() for m in marks if not m.safe)
