"""Rolling lanes: where waiting items sit, grouped so that a batch drawn from one lane pads little.

Inside each (model, shape) up to ``lane_budget`` lanes are kept sorted by representative length (the
longest item a lane has ever held; it only grows). A new item of length L binary-searches its two
neighbouring lanes and joins the one that pads it less. It opens a new lane instead when that padding
is above a threshold that rises as the shape's lane budget fills: while lanes are plentiful we spend
structure (a new lane) rather than waste (padding); once they are scarce we accept more padding. Two
bounds frame the threshold: padding at or below ``floor_tokens`` never opens a lane (so short prompts
don't spawn lanes over a few tokens), and padding above ``cap_tokens`` is never accepted while a lane
can still be opened or reclaimed.

A batch is cut from one lane (:meth:`LaneTable.take_batch`; which items go is core/cut.py). In
``cut="length"`` (the default) a lane keeps its items by length (:class:`ByLength`) and a batch takes
items of nearly equal length however the lane's range is spread, so lanes may be wide (few, and few
partial end batches) without padding more; ``cut="arrival"`` keeps them in arrival order.

Lanes are never merged. A lane that has been empty for ``idle_ms`` goes quiet: it leaves the sorted
order and its id returns to a pool, so ids stay below ``lane_budget`` and are reused.

Everything here is driven by the ``now_ms`` the caller passes in: no clock, no I/O.
"""

from __future__ import annotations

from bisect import insort
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence

from processor.core.contract import BatchRule
from processor.core.cut import cut_by_length, cut_in_arrival_order
from processor.core.item import Item
from processor.core.lane import DEQUE_AT, ByLength, Lane
from processor.core.lane_settings import CUT_ORDERS, LaneSettings
from processor.core.shape_lanes import LaneStats, ShapeKey, ShapeLanes, key_job, shape_key

__all__ = [
    "CUT_ORDERS",
    "LaneSettings",
    "LaneStats",
    "LaneTable",
    "ShapeKey",
    "ShapeLanes",
    "key_job",
    "shape_key",
]  # the settings and the shapes' lanes live in core/lane_settings.py and core/shape_lanes.py


class LaneTable:
    """Every shape's lanes, plus the bookkeeping that reclaims quiet lanes.

    Owned by one thread (the scheduler's); nothing here locks.
    """

    def __init__(self, settings: LaneSettings | None = None) -> None:
        self.settings = settings or LaneSettings()
        self.by_length = self.settings.cut == "length"
        self.shapes: dict[ShapeKey, ShapeLanes] = {}
        self.stats = LaneStats()
        self.waiting_items = 0
        self.waiting_tokens = 0
        self._runs = 0  # place_many calls so far
        # Empty lanes in the order they emptied: the front is the first to go quiet.
        self._quiet: OrderedDict[tuple[ShapeKey, int], int] = OrderedDict()

    # -- placement ------------------------------------------------------------------------------

    def place(self, item: Item, now_ms: int) -> ShapeLanes:
        """Put ``item`` in a lane of its shape; returns the shape's lanes."""
        return self.place_many((item,), (now_ms,))[0][0]

    def place_many(self, items: Sequence[Item], times: Sequence[int]) -> list[tuple[ShapeLanes, int, int]]:
        """Put each item in a lane of its shape, in order, each at its own ``times[i]``: the same lanes
        as one :meth:`place` after another. Returns every shape touched, in the order first touched,
        with the (items, tokens) it held before: what the scheduler counts and activates once per run.

        This is the scheduler's hot path (a simulated million items pass here), so the common case,
        a shape's one lane (``ShapeLanes.sole``) or a length whose lane is remembered
        (``ShapeLanes.choices``), is written out in the loop; the rest is :meth:`_choose_lane`. A
        lane's ``tokens`` is 0 exactly when it is empty, since every item has a length of at least 1
        (``Scheduler.submit`` refuses the others; ``check`` recounts).
        """
        shapes = self.shapes
        quiet = self._quiet
        pm = self.settings.pad_multiple
        keep_below = self.settings.floor_tokens // pm * pm  # a length that pads to at most the floor
        touched: list[tuple[ShapeLanes, int, int]] = []
        self._runs += 1
        run = self._runs  # a shape whose ``run`` is this one is in ``touched`` already
        chosen = 0  # items :meth:`_choose_lane` placed (it counts its own reuses)
        tokens = 0
        for item, now_ms in zip(items, times, strict=True):
            job = item.job
            key: ShapeKey = (item.model, item.shape, job) if job else (item.model, item.shape)
            sl = shapes.get(key)
            if sl is None:
                sl = shapes[key] = ShapeLanes(key)
            if sl.run != run:
                sl.run = run
                touched.append((sl, sl.waiting_items, sl.waiting_tokens))
            length = item.length
            lane = sl.sole if length <= keep_below else None
            if lane is None:
                lane = sl.choices.get(length)
            if lane is None:
                lane = self._choose_lane(sl, length, now_ms)
                # Choosing may reclaim idle lanes, this shape's last one included, which drops the shape.
                shapes[key] = sl
                chosen += 1
            if not lane.tokens:
                sl.ready[lane.id] = lane
                quiet.pop((key, lane.id), None)
            if length > lane.rep:
                sl.order.remove((lane.rep, lane.id))
                sl.order.add((length, lane.id))
                if len(sl.lanes) > 1 or length > keep_below:
                    sl.choices.clear()
                    sl.sole = None
                # else the shape's one lane pads no length by more than floor_tokens: every
                # remembered choice (that lane, within the threshold) still holds
                lane.rep = length
            lane_items = lane.items
            if isinstance(lane_items, ByLength):  # ByLength's add, written out: the hottest lines here
                buckets = lane_items.buckets
                bucket = buckets.get(length)
                if bucket is None:
                    buckets[length] = [item]
                    insort(lane_items.lengths, length)
                else:
                    bucket.append(item)
                    if type(bucket) is list and len(bucket) > DEQUE_AT:
                        buckets[length] = deque(bucket)
                lane_items.n += 1
            else:
                lane_items.append(item)
            if item.arrival_ms > sl.newest_ms:
                sl.newest_ms = item.arrival_ms
            lane.tokens += length
            item.lane = lane.id
            sl.waiting_items += 1
            sl.waiting_tokens += length
            tokens += length
        self.stats.reuses += len(items) - chosen
        self.waiting_items += len(items)
        self.waiting_tokens += tokens
        return touched

    def _choose_lane(self, sl: ShapeLanes, length: int, now_ms: int) -> Lane:
        lane = sl.choices.get(length)
        if lane is None:
            best, fits = self._nearest(sl, length)
            if best is None or not (fits or not self._has_room(sl, now_ms)):
                return self._open(sl, length, now_ms)
            lane = best
        self.stats.reuses += 1
        return lane

    def _nearest(self, sl: ShapeLanes, length: int) -> tuple[Lane | None, bool]:
        """The lane that pads an item of ``length`` least, and whether joining it is within the
        threshold (else a new lane opens if there is room).

        Both depend only on the length and the shape's lanes (their representatives and how many
        there are), so a lane within the threshold is remembered for the length until a lane
        opens, grows or retires: most items then skip the binary search (a seventh of restoring
        an item, docs/benchmarks.md). ``check`` recomputes every remembered choice.
        """
        s = self.settings
        pm = s.pad_multiple
        padded = -(-length // pm) * pm
        if len(sl.lanes) == 1 and padded <= s.floor_tokens:
            (lane,) = sl.lanes.values()
            if -(-lane.rep // pm) * pm <= s.floor_tokens:  # both pad to at most the floor: it joins
                sl.choices[length] = lane
                sl.sole = lane  # as does every length that pads to at most the floor
                return lane, True
        order = sl.order
        i = order.bisect_left((length, -1))
        best: Lane | None = None
        best_cost = 0
        if i < len(order):  # the lane at or above: the item pads up to its representative
            rep, lane_id = order[i]
            best = sl.lanes[lane_id]
            best_cost = -(-rep // pm) * pm - padded
        if i > 0:  # the lane below: it would grow to this item's length
            rep, lane_id = order[i - 1]
            cost = padded - -(-rep // pm) * pm
            if best is None or cost < best_cost:
                best = sl.lanes[lane_id]
                best_cost = cost
        if best is None:
            return None, False
        fits = best_cost <= s.floor_tokens or not (
            best_cost > s.cap_tokens or best_cost > s.threshold_tokens(length, len(sl.lanes))
        )
        if fits:
            sl.choices[length] = best
        return best, fits

    def _has_room(self, sl: ShapeLanes, now_ms: int) -> bool:
        if len(sl.lanes) < self.settings.lane_budget:
            return True
        self.reclaim_idle(now_ms)
        return len(sl.lanes) < self.settings.lane_budget

    def _open(self, sl: ShapeLanes, length: int, now_ms: int) -> Lane:
        lane_id, recycled = sl._new_id()
        lane = Lane(lane_id, length, self.by_length)
        sl.lanes[lane_id] = lane
        sl.order.add((length, lane_id))
        sl.choices.clear()
        sl.sole = None
        st = self.stats
        st.new_lanes += 1
        st.id_reuses += recycled
        st.lanes_in_use += 1
        if st.lanes_in_use > st.lanes_in_use_peak:
            st.lanes_in_use_peak = st.lanes_in_use
        self._note_pressure()
        return lane

    # -- removal --------------------------------------------------------------------------------

    def take(
        self, sl: ShapeLanes, lane: Lane, budget_tokens: int, max_items: int, pad_multiple: int, now_ms: int
    ) -> tuple[list[Item], int]:
        """:meth:`take_batch` under a tokens-mode rule (``n x round_up(longest, pad) <= budget``)."""
        rule = BatchRule(max_items, pad_multiple, "tokens", budget_tokens)
        return self.take_batch(sl, lane, rule, now_ms)

    def take_batch(
        self,
        sl: ShapeLanes,
        lane: Lane,
        rule: BatchRule,
        now_ms: int,
        anchor: Item | None = None,
        leave_longer: bool = False,
    ) -> tuple[list[Item], int]:
        """Pop one batch's worth of items from ``lane``, cut as ``settings.cut`` says (core/cut.py:
        while the batch still ``rule.fits``; an item that fits not even alone leaves alone, oversized);
        returns the items and the padded length, and marks the items dispatched.

        ``anchor``, an item of the lane, goes first whatever the order (the deadline's overdue item).
        ``leave_longer`` (cut by length): the batch starts at the longest item that fits ``rule``
        alone, leaving the longer ones in the lane for a bigger consumer of the model (the scheduler
        asks only when one fits).
        """
        items = lane.items  # a ByLength exactly when the table cuts by length (no cast: a call per batch)
        if isinstance(items, ByLength):
            taken, padded_length = cut_by_length(items, rule, self.settings, anchor, leave_longer)
        else:
            taken, padded_length = cut_in_arrival_order(items, rule, anchor)
        tokens = 0
        for item in taken:
            item.dispatched = True
            tokens += item.length
        n = len(taken)
        lane.tokens -= tokens
        sl.waiting_items -= n
        sl.waiting_tokens -= tokens
        self.waiting_items -= n
        self.waiting_tokens -= tokens
        if not lane.tokens:  # empty (every item has a length of at least 1)
            del sl.ready[lane.id]
            self._quiet[(sl.key, lane.id)] = now_ms
        return taken, padded_length

    def withdraw(
        self, sl: ShapeLanes, now_ms: int, which: Callable[[Item], bool] | None = None
    ) -> list[Item]:
        """Take the waiting items ``which`` picks (None: every one) out of ``sl``'s lanes, undispatched
        (their job ended: cancelled or expired; their ingest partition was handed over); returns them,
        marked ``dispatched`` so the arrival queues and the changelog pass over them as they pass over
        dispatched ones. The lanes stay, and one left empty goes quiet as lanes a batch emptied do."""
        out: list[Item] = []
        for lane in sl.lanes.values():
            if not lane.tokens:
                continue
            out += lane.take_out(which)
            if not lane.tokens:
                del sl.ready[lane.id]
                self._quiet[(sl.key, lane.id)] = now_ms
        tokens = 0
        for item in out:
            item.dispatched = True
            tokens += item.length
        self.waiting_items -= len(out)
        self.waiting_tokens -= tokens
        sl.waiting_items -= len(out)
        sl.waiting_tokens -= tokens
        return out

    def reclaim_idle(self, now_ms: int) -> int:
        """Retire every lane that has been empty for ``idle_ms``; returns how many went quiet."""
        idle_ms = self.settings.idle_ms
        quiet = self._quiet
        reclaimed = 0
        while quiet:
            (key, lane_id), since = next(iter(quiet.items()))
            if now_ms - since < idle_ms:
                break
            del quiet[(key, lane_id)]
            sl = self.shapes[key]
            lane = sl.lanes.pop(lane_id)
            sl.order.remove((lane.rep, lane_id))
            sl.choices.clear()
            sl.sole = None
            sl.release_id(lane_id)
            reclaimed += 1
            if not sl.lanes:
                del self.shapes[key]
        self.stats.idle_reclaims += reclaimed
        self.stats.lanes_in_use -= reclaimed
        if reclaimed:
            self._note_pressure()
        return reclaimed

    # -- views ----------------------------------------------------------------------------------

    def waiting(self) -> Iterator[Item]:
        """Every waiting item, shape by shape, lane by lane (for checkpoints and checks)."""
        for sl in self.shapes.values():
            for lane in sl.lanes.values():
                yield from lane.items

    def lane_pressure(self) -> float:
        """Lanes in use / (shapes x lane budget): how close the busiest configuration is to full."""
        if not self.shapes:
            return 0.0
        return self.stats.lanes_in_use / (len(self.shapes) * self.settings.lane_budget)

    def _note_pressure(self) -> None:
        pressure = self.lane_pressure()
        if pressure > self.stats.lane_pressure_peak:
            self.stats.lane_pressure_peak = pressure

    def _check_choices(self, sl: ShapeLanes) -> None:
        sole = sl.sole
        if sole is not None:
            pm = self.settings.pad_multiple
            if list(sl.lanes.values()) != [sole] or -(-sole.rep // pm) * pm > self.settings.floor_tokens:
                raise AssertionError(
                    f"shape {sl.key}: lane {sole.id} is taken as its one lane, but it has lanes "
                    f"{sorted(sl.lanes)} and that one's representative is {sole.rep}"
                )
        remembered = dict(sl.choices)
        sl.choices.clear()
        try:
            for length, lane in remembered.items():
                now = self._nearest(sl, length)
                if now != (lane, True):
                    raise AssertionError(
                        f"shape {sl.key}: length {length} remembered lane {lane.id}, choosing now gives "
                        f"{None if now[0] is None else now[0].id} (within threshold: {now[1]})"
                    )
        finally:
            sl.choices.clear()
            sl.choices.update(remembered)
            sl.sole = sole

    def check(self) -> None:
        """Recount the waiting items and compare with the running totals (raises on a mismatch)."""
        items = tokens = lanes = 0
        for sl in self.shapes.values():
            s_items = s_tokens = 0
            for lane in sl.lanes.values():
                lengths = [it.length for it in lane.items]  # one pass in Python, the rest in C
                n = len(lengths)
                t = sum(lengths)
                if t != lane.tokens:
                    raise AssertionError(f"lane {sl.key}/{lane.id}: holds {t} tokens, counted {lane.tokens}")
                if lengths and max(lengths) > lane.rep:
                    raise AssertionError(f"lane {sl.key}/{lane.id}: an item is longer than rep {lane.rep}")
                if isinstance(lane.items, ByLength) and (
                    lane.items.lengths != sorted(lane.items.buckets)
                    or not all(lane.items.buckets.values())
                    or lengths != sorted(lengths)
                ):
                    raise AssertionError(f"lane {sl.key}/{lane.id}: cut by length, but not sorted by length")
                s_items += n
                s_tokens += t
                lanes += 1
            if (s_items, s_tokens) != (sl.waiting_items, sl.waiting_tokens):
                raise AssertionError(
                    f"shape {sl.key}: holds {s_items} items / {s_tokens} tokens, "
                    f"counted {sl.waiting_items} / {sl.waiting_tokens}"
                )
            if len(sl.lanes) > self.settings.lane_budget:
                raise AssertionError(f"shape {sl.key}: {len(sl.lanes)} lanes > budget")
            self._check_choices(sl)
            items += s_items
            tokens += s_tokens
        if (items, tokens) != (self.waiting_items, self.waiting_tokens):
            raise AssertionError(
                f"lanes hold {items} items / {tokens} tokens, "
                f"counted {self.waiting_items} / {self.waiting_tokens}"
            )
        if lanes != self.stats.lanes_in_use:
            raise AssertionError(f"{lanes} lanes exist, counted {self.stats.lanes_in_use}")
