"""One (model, shape)'s lanes (:class:`ShapeLanes`), the key they are kept under, and the counters
of lane activity (:class:`LaneStats`): the structures the lane table (core/lanes.py) is made of.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

from sortedcontainers import SortedList

from processor.core.lane import Lane

ShapeKey = tuple[str, int] | tuple[str, int, str]
"""(model, shape), or (model, shape, job) for an item of a named job: a job's items get lanes of their
own, so a batch holds one job's items (core/shares.py); items of no job keep the two-part key."""


def shape_key(model: str, shape: int, job: str) -> ShapeKey:
    return (model, shape, job) if job else (model, shape)


def key_job(key: ShapeKey) -> str:
    """The job of a shape key ("" for none)."""
    return key[2] if len(key) == 3 else ""


class ShapeLanes:
    """All lanes of one (model, shape), and what is waiting in them."""

    __slots__ = (
        "_free_ids",
        "_next_id",
        "choices",
        "job",
        "key",
        "lanes",
        "newest_ms",
        "order",
        "order_dirty",
        "order_seq",
        "order_version",
        "ready",
        "run",
        "sole",
        "waiting_items",
        "waiting_tokens",
    )

    def __init__(self, key: ShapeKey) -> None:
        self.key = key
        self.job = key_job(key)  # "" for items of no job
        self.lanes: dict[int, Lane] = {}
        self.order: SortedList = SortedList()  # (rep, lane id)
        # length -> the lane an item of that length joins, while ``order`` stays as it is
        self.choices: dict[int, Lane] = {}
        # the shape's one lane while every length that pads to at most floor_tokens joins it (the
        # default settings keep one lane per shape); None otherwise. Cleared with ``choices``.
        self.sole: Lane | None = None
        self.ready: OrderedDict[int, Lane] = OrderedDict()  # non-empty lanes, oldest first
        self.waiting_items = 0
        self.waiting_tokens = 0
        self.newest_ms = 0  # latest arrival_ms placed here (the overtaking deadline reads it)
        self.run = 0  # the last LaneTable.place_many that placed an item here
        self.order_seq = 0  # rule 3's order (core/switch_order.py): activation number, 0 when idle
        self.order_version = 0  # ... and the version of its one live heap entry, 0 when idle
        self.order_dirty = False  # ... and whether its waiting tokens changed since that entry
        self._free_ids: list[int] = []
        self._next_id = 0

    @property
    def model(self) -> str:
        return self.key[0]

    @property
    def shape(self) -> int:
        return self.key[1]

    def _new_id(self) -> tuple[int, bool]:
        if self._free_ids:
            return heapq.heappop(self._free_ids), True
        lane_id = self._next_id
        self._next_id += 1
        return lane_id, False

    def release_id(self, lane_id: int) -> None:
        heapq.heappush(self._free_ids, lane_id)


@dataclass(slots=True)
class LaneStats:
    """Counters of lane activity; ``reuses`` counts items placed in an existing lane."""

    reuses: int = 0
    new_lanes: int = 0
    id_reuses: int = 0
    idle_reclaims: int = 0
    lanes_in_use: int = 0
    lanes_in_use_peak: int = 0
    lane_pressure_peak: float = 0.0
    """The highest :meth:`LaneTable.lane_pressure` reached (it changes only as lanes open or retire)."""
