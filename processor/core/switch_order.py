"""Rule 3's order of shapes, kept up to date as waiting tokens change, so that a switch costs
O(log S) in the shapes S a model has waiting instead of a scan of all of them.

Rule 3 of dispatch (core/dispatch.py) moves a consumer whose shape drained to the shape of its model
with the most waiting tokens (within the most owed job, under shares), preferring shapes no other
consumer is on (``spread``), ties going to the shape that became active first. Every batch of a
stream of mostly distinct shapes is a switch, so a scan made dispatch O(S) per batch (issue 25: 39 s
for 20,000 items of about 9,000 shapes).

The order is one binary heap per (model, job) of ``(-waiting tokens, activation number, version,
shape)`` entries with lazy invalidation: every change of a shape's waiting tokens pushes a new entry
and bumps the shape's ``order_version``; an entry whose version is not its shape's current one is
stale and is dropped when it reaches the top, or when stale entries outnumber live ones (the heap is
then rebuilt, so it holds at most about twice the live shapes). A shape's ``order_seq`` numbers its
activations in the order the scheduler saw them: the order rule 3's scan met shapes in (the
scheduler's ``active`` dict keeps insertion order), so ties break exactly as the scan's ``max`` and
stable ``sorted`` did.

Invariants (tests/core/test_switch_order.py checks them against the reference scan on random
states): for every active shape exactly one entry of its (model, job) heap carries its current
version, and that entry holds its current waiting tokens; a drained shape's version is 0, which no
entry carries. The scheduler is the only caller of :meth:`SwitchOrder.placed` and
:meth:`SwitchOrder.taken_from` and calls one of them after every change of a shape's waiting tokens.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection
from typing import TypeVar

from processor.core.lanes import ShapeKey, ShapeLanes

T = TypeVar("T")

Entry = tuple[int, int, int, ShapeLanes]
"""(-waiting tokens, activation number, version, shape): the heap's order is rule 3's order."""

_SLACK = 64
"""A heap (or activation queue) is compacted when it holds more than twice its live shapes plus this."""


class JobShapes:
    """The active shapes of one (model, job): the heap in rule 3's order, and the activations in the
    order they happened (the front, once drained shapes are dropped from it, is the job's oldest
    active shape: where rule 3's scan met the job first)."""

    __slots__ = ("activations", "count", "heap")

    def __init__(self) -> None:
        self.heap: list[Entry] = []
        self.activations: deque[tuple[int, ShapeLanes]] = deque()
        self.count = 0  # active shapes

    def first_seq(self) -> int:
        """The activation number of the job's oldest active shape (there is one while it is kept)."""
        activations = self.activations
        while activations[0][1].order_seq != activations[0][0]:
            activations.popleft()
        return activations[0][0]

    def compact(self) -> None:
        """Drop every stale entry and activation (amortized: runs once stale ones outnumber live)."""
        self.heap = [e for e in self.heap if e[3].order_version == e[2]]
        heapq.heapify(self.heap)
        self.activations = deque(a for a in self.activations if a[1].order_seq == a[0])


class SwitchOrder:
    """Per model and job, the active shapes in rule 3's order (module docstring)."""

    __slots__ = ("_models", "_seq", "_version")

    def __init__(self) -> None:
        self._models: dict[str, dict[str, JobShapes]] = {}
        self._seq = 0
        self._version = 0

    def placed(self, sl: ShapeLanes, was_empty: bool) -> None:
        """Items were placed in ``sl``; ``was_empty``: it had none waiting before (it becomes active,
        after every shape active now)."""
        if was_empty:
            jobs = self._models.get(sl.key[0])
            if jobs is None:
                jobs = self._models[sl.key[0]] = {}
            js = jobs.get(sl.job)
            if js is None:
                js = jobs[sl.job] = JobShapes()
            self._seq += 1
            sl.order_seq = self._seq
            js.count += 1
            js.activations.append((self._seq, sl))
        else:
            js = self._models[sl.key[0]][sl.job]
        self._push(js, sl)

    def taken_from(self, sl: ShapeLanes) -> None:
        """A batch left ``sl``; when nothing waits there any more the shape leaves the order."""
        if sl.waiting_items:
            self._push(self._models[sl.key[0]][sl.job], sl)
            return
        sl.order_seq = 0
        sl.order_version = 0
        jobs = self._models[sl.key[0]]
        js = jobs[sl.job]
        js.count -= 1
        if not js.count:
            del jobs[sl.job]
            if not jobs:
                del self._models[sl.key[0]]
        elif len(js.activations) > 2 * js.count + _SLACK:
            js.compact()

    def _push(self, js: JobShapes, sl: ShapeLanes) -> None:
        self._version += 1
        sl.order_version = self._version
        heapq.heappush(js.heap, (-sl.waiting_tokens, sl.order_seq, self._version, sl))
        if len(js.heap) > 2 * js.count + _SLACK:
            js.compact()

    def clear(self) -> None:
        """Nothing waits any more (the scheduler released every waiting item with its lane table)."""
        self._models.clear()

    def jobs(self, model: str) -> dict[str, JobShapes]:
        """The jobs with active shapes of ``model``, in the order rule 3's scan met them (by their
        oldest active shape)."""
        jobs = self._models.get(model)
        if not jobs:
            return {}
        if len(jobs) == 1:
            return jobs
        return dict(sorted(jobs.items(), key=lambda kv: kv[1].first_seq()))

    def first(
        self,
        model: str,
        job: str,
        taken: Collection[ShapeKey],
        pick: Callable[[ShapeLanes], T | None],
    ) -> T | None:
        """``pick`` on the job's active shapes in rule 3's order (most waiting tokens first, the shapes
        in ``taken`` after all others), returning its first answer that is not None (None when it
        has none). Costs O((k + 1) log S) for ``k`` shapes passed over: ``pick``'s refusals, the
        ``taken`` ones met first, and stale entries (each dropped once)."""
        jobs = self._models.get(model)
        js = None if jobs is None else jobs.get(job)
        if js is None:
            return None
        heap = js.heap
        popped: list[Entry] = []
        deferred: list[ShapeLanes] = []
        try:
            while heap:
                entry = heap[0]
                sl = entry[3]
                if sl.order_version != entry[2]:
                    heapq.heappop(heap)
                    continue
                if sl.key in taken:
                    deferred.append(sl)
                else:
                    found = pick(sl)
                    if found is not None:
                        return found
                popped.append(heapq.heappop(heap))
            for sl in deferred:
                found = pick(sl)
                if found is not None:
                    return found
            return None
        finally:
            for entry in popped:
                heapq.heappush(heap, entry)

    def check(self) -> None:
        """Raise if an active shape lacks its one live entry or its entry holds stale tokens."""
        for model, jobs in self._models.items():
            for job, js in jobs.items():
                live = [e for e in js.heap if e[3].order_version == e[2]]
                if len(live) != js.count or len({id(e[3]) for e in live}) != js.count:
                    raise AssertionError(
                        f"switch order {model}/{job!r}: {len(live)} live entries for {js.count} active shapes"
                    )
                for tokens, seq, _, sl in live:
                    if (-tokens, seq) != (sl.waiting_tokens, sl.order_seq) or not sl.waiting_items:
                        raise AssertionError(
                            f"switch order {model}/{job!r}: shape {sl.key} entered with {-tokens} tokens "
                            f"(activation {seq}), holds {sl.waiting_tokens} (activation {sl.order_seq})"
                        )
