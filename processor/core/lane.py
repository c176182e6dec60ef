"""One lane: the waiting items of similar length within one shape, kept in the order batches take
them (the lane table, core/lanes.py, decides which lane an item joins; core/cut.py which items of a
lane leave together).

Cut by length (the default), a lane keeps its items in a :class:`ByLength`: one FIFO per distinct
length and the lengths sorted, plus the *sweep*, the length at or below which its next batch starts
(core/cut.py states the rule). Cut in arrival order, a deque.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import cast

from processor.core.item import Item

DEQUE_AT = 32
"""A length's FIFO turns from a list into a deque when it holds more items than this."""

SWEEP_TOP = 1 << 62
"""A sweep above every length: the lane's next batch starts at its longest item."""


class ByLength:
    """A lane's items cut by length: one FIFO per distinct length, and the lengths sorted.

    Placing an item is a dict lookup and an append (a new length also a binary-search insert into the
    short list of lengths), written out in :meth:`LaneTable.place_many`; a batch pops from the
    longest lengths down. Equal lengths leave oldest
    first. A length's FIFO is a list (56 bytes and a pointer per item: most lengths hold an item or
    two) until it holds more than ``DEQUE_AT`` items, then a deque (about 600 bytes, but popping its
    head costs nothing however many wait).

    ``sweep``: the next batch not cut around an anchor starts at the longest length at or below it
    (``SWEEP_TOP`` when the lane is new: at the longest); core/cut.py moves it down as batches leave
    and wraps it to the top when nothing waits at or below it.
    """

    __slots__ = ("buckets", "lengths", "n", "sweep")

    def __init__(self) -> None:
        self.lengths: list[int] = []  # ascending, each with a non-empty bucket
        self.buckets: dict[int, list[Item] | deque[Item]] = {}
        self.n = 0
        self.sweep = SWEEP_TOP

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[Item]:
        for length in self.lengths:
            yield from self.buckets[length]

    def remove(self, item: Item) -> None:
        bucket = self.buckets[item.length]
        bucket.remove(item)
        self.n -= 1
        if not bucket:
            self._drop(item.length)

    def _drop(self, length: int) -> None:
        del self.buckets[length]
        del self.lengths[bisect_left(self.lengths, length)]

    def head(self) -> Item:
        return self.buckets[self.lengths[-1]][0]

    def shortest(self) -> Item:
        return self.buckets[self.lengths[0]][0]

    def in_cut_order(self) -> list[Item]:
        return [it for length in reversed(self.lengths) for it in self.buckets[length]]

    def take_out(self, which: Callable[[Item], bool]) -> list[Item]:
        """Remove the items ``which`` picks (the rest keep their order and the sweep); returns them."""
        out: list[Item] = []
        for length in list(self.lengths):
            bucket = self.buckets[length]
            gone, kept = split(bucket, which)
            if gone:
                out += gone
                if kept:
                    self.buckets[length] = type(bucket)(kept)
                else:
                    self._drop(length)
        self.n -= len(out)
        return out


class Lane:
    """Waiting items of similar length within one shape.

    Cut in arrival order, ``items`` is a deque in arrival order; cut by length, a :class:`ByLength`.
    """

    __slots__ = ("by_length", "id", "items", "rep", "tokens")

    def __init__(self, lane_id: int, rep: int, by_length: bool = False) -> None:
        self.id = lane_id
        self.rep = rep
        self.by_length = by_length
        self.items: ByLength | deque[Item] = ByLength() if by_length else deque()
        self.tokens = 0

    def head(self) -> Item:
        """Cut by length, the longest waiting item (where the next batch starts unless the sweep has
        passed its length); else the oldest."""
        items = self.items
        return items.head() if isinstance(items, ByLength) else items[0]

    def shortest(self) -> Item:
        """Cut by length: the shortest waiting item."""
        return cast(ByLength, self.items).shortest()

    def in_cut_order(self) -> list[Item]:
        """The waiting items in the order batches take them (without an anchor)."""
        items = self.items
        return items.in_cut_order() if isinstance(items, ByLength) else list(items)

    def take_out(self, which: Callable[[Item], bool] | None = None) -> list[Item]:
        """Remove the waiting items ``which`` picks (None: all of them), the rest kept in their order;
        returns them. Once per handover or ended job, never per batch."""
        items = self.items
        if which is None:
            out = list(items)
            self.items = ByLength() if self.by_length else deque()
        elif isinstance(items, ByLength):
            out = items.take_out(which)
        else:
            out, kept = split(items, which)
            if out:
                self.items = deque(kept)
        self.tokens -= sum(it.length for it in out)
        return out


def split(items: Iterable[Item], which: Callable[[Item], bool]) -> tuple[list[Item], list[Item]]:
    """(the items ``which`` picks, the rest), each in their order."""
    picked: list[Item] = []
    rest: list[Item] = []
    for it in items:
        (picked if which(it) else rest).append(it)
    return picked, rest
