"""Rule 3's order of shapes, kept up to date as waiting tokens change, so that a switch costs
O(log S) in the shapes S a model has waiting instead of a scan of all of them.

Rule 3 of dispatch (core/dispatch.py) moves a consumer whose shape drained to the shape of its model
with the most waiting tokens (within the most owed job, under shares), preferring shapes no other
consumer is on (``spread``), ties going to the shape that became active first. Every batch of a
stream of mostly distinct shapes is a switch, so a scan made dispatch O(S) per batch (issue 25: 39 s
for 20,000 items of about 9,000 shapes).

The order is one binary heap per (model, job) of ``(-waiting tokens, activation number, version,
shape)`` entries with lazy invalidation: a shape whose waiting tokens changed is noted in its job's
``dirty`` list (once, however many items it took meanwhile: a submit costs O(1) here), and before the
heap is read every noted shape still active pushes a new entry and bumps its ``order_version``; an
entry whose version is not its shape's current one is stale and is dropped when it reaches the top,
or when stale entries outnumber live ones (the heap is then rebuilt, so it holds at most about twice
the live shapes). A shape's ``order_seq`` numbers its
activations in the order the scheduler saw them: the order rule 3's scan met shapes in (the
scheduler's ``active`` dict keeps insertion order), so ties break exactly as the scan's ``max`` and
stable ``sorted`` did.

Invariants (tests/core/test_switch_order.py checks them against the reference scan on random
states): for every active shape exactly one entry of its (model, job) heap carries its current
version, and that entry holds its current waiting tokens, except for shapes in the job's ``dirty``
list (``ShapeLanes.order_dirty``), which are pushed before the heap is read; a drained shape's
version is 0, which no entry carries. The scheduler is the only caller of :meth:`SwitchOrder.placed` and
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

    __slots__ = ("activations", "count", "dirty", "heap", "parked")

    def __init__(self) -> None:
        self.heap: list[Entry] = []
        self.activations: deque[tuple[int, ShapeLanes]] = deque()
        self.dirty: list[ShapeLanes] = []  # shapes whose waiting tokens changed since their last push
        # threshold -> heap of shapes a consumer of that longest-alone may take no lane of (``first``)
        self.parked: dict[int, list[Entry]] = {}
        self.count = 0  # active shapes

    def entries(self) -> int:
        return len(self.heap) + sum(len(h) for h in self.parked.values())

    def first_seq(self) -> int:
        """The activation number of the job's oldest active shape (there is one while it is kept)."""
        activations = self.activations
        while activations[0][1].order_seq != activations[0][0]:
            activations.popleft()
        return activations[0][0]

    def compact(self) -> None:
        """Drop every stale entry and activation (amortized: runs once stale ones outnumber live)."""
        self.heap = _live(self.heap)
        self.parked = {t: live for t, h in self.parked.items() if (live := _live(h))}
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
        elif sl.order_dirty:
            return
        else:
            js = self._models[sl.key[0]][sl.job]
        self._note(js, sl)

    def taken_from(self, sl: ShapeLanes) -> None:
        """A batch left ``sl``; when nothing waits there any more the shape leaves the order."""
        if sl.waiting_items:
            if not sl.order_dirty:  # else noted already (:meth:`_note`), asked here without a call
                self._note(self._models[sl.key[0]][sl.job], sl)
            return
        sl.order_seq = 0
        sl.order_version = 0
        jobs = self._models[sl.key[0]]
        js = jobs[sl.job]
        js.count -= 1
        if not js.count:  # every shape it noted has drained: nothing to push
            for noted in js.dirty:
                noted.order_dirty = False
            del jobs[sl.job]
            if not jobs:
                del self._models[sl.key[0]]
        elif len(js.activations) > 2 * js.count + _SLACK:
            js.compact()

    def _note(self, js: JobShapes, sl: ShapeLanes) -> None:
        """``sl``'s waiting tokens changed: its entry is pushed at the next read (each shape is noted
        once; a flag set means it is in ``js.dirty`` already). Past twice the active shapes the
        notes are pushed now, so they stay bounded however long nothing reads the order."""
        if sl.order_dirty:
            return
        sl.order_dirty = True
        js.dirty.append(sl)
        if len(js.dirty) > 2 * js.count + _SLACK:
            self._flush(js)

    def _flush(self, js: JobShapes) -> None:
        """Push the current entry of every noted shape that is still active (a drained one has
        ``order_seq`` 0 and no entry to push; one drained and active again is noted again)."""
        heap = js.heap
        push = heapq.heappush
        for sl in js.dirty:
            if sl.order_dirty:
                sl.order_dirty = False
                if sl.order_seq:
                    self._version += 1
                    sl.order_version = self._version
                    push(heap, (-sl.waiting_tokens, sl.order_seq, self._version, sl))
        js.dirty.clear()
        if js.entries() > 2 * js.count + _SLACK:
            js.compact()

    def clear(self) -> None:
        """Nothing waits any more (the scheduler released every waiting item with its lane table)."""
        self._models.clear()

    def unpark(self, model: str) -> None:
        """The model's consumers changed (a contract set or retired): which shapes a consumer may take
        depends on its peers, so every parked shape goes back to the order every consumer reads."""
        for js in self._models.get(model, {}).values():
            if js.parked:
                for h in js.parked.values():
                    js.heap.extend(h)
                js.parked.clear()
                heapq.heapify(js.heap)

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
        pick: Callable[[ShapeLanes], T | Ineligible | None],
        threshold: int | None = None,
    ) -> T | None:
        """``pick`` on the job's active shapes in rule 3's order (most waiting tokens first, the shapes
        in ``taken`` after all others), returning its first answer that is neither None nor
        ``INELIGIBLE`` (None when it has none). Costs O((k + 1) log S) for ``k`` shapes passed over:
        ``pick``'s refusals, the ``taken`` ones met first, and stale entries (each dropped once).

        ``pick`` answers ``INELIGIBLE`` when the consumer may take no lane of the shape at all. With
        ``threshold``, the consumer's ``BatchRule.longest_alone`` (rows and tokens mode), such a shape
        is *parked* for that threshold: a consumer whose threshold is no larger may take no lane of it
        either (``DispatchRules._may_take`` refuses a lane only for items longer than the threshold
        that a peer holds), so its reads skip it, and only bigger consumers still meet it. Without
        parking a small card would pass over every shape only a big card holds on each switch (a
        backlog of a million one-item shapes: 3x the per-batch cost of a thousand shapes). A shape
        leaves its parking when its waiting tokens change (its new entry is in the main heap) or
        when the model's consumers change (:meth:`unpark`)."""
        jobs = self._models.get(model)
        js = None if jobs is None else jobs.get(job)
        if js is None:
            return None
        if js.dirty:
            self._flush(js)
        heaps = [js.heap]
        heaps += [h for t, h in js.parked.items() if threshold is None or t < threshold]
        back: list[tuple[list[Entry], Entry]] = []  # popped, to be pushed back where they came from
        deferred: list[tuple[list[Entry], Entry]] = []  # the ``taken`` ones, asked after the others
        parked: list[Entry] = []

        def ask(top: list[Entry], entry: Entry) -> T | None:
            """``pick``'s answer for one entry, the entry parked or kept to be pushed back."""
            found = pick(entry[3])
            if isinstance(found, Ineligible):
                if threshold is not None:
                    parked.append(entry)
                    return None
                found = None
            back.append((top, entry))
            return found

        try:
            while (top := _top(heaps)) is not None:
                entry = heapq.heappop(top)
                if entry[3].key in taken:
                    deferred.append((top, entry))
                elif (found := ask(top, entry)) is not None:
                    return found
            deferred.reverse()  # popped from the end: the first met is asked first
            while deferred:
                if (found := ask(*deferred.pop())) is not None:
                    return found
            return None
        finally:
            back += deferred
            for h, entry in back:
                heapq.heappush(h, entry)
            if parked and threshold is not None:
                h = js.parked.setdefault(threshold, [])
                for entry in parked:
                    heapq.heappush(h, entry)

    def check(self) -> None:
        """Raise if an active shape lacks its one live entry or its entry holds stale tokens."""
        for model, jobs in self._models.items():
            for job, js in jobs.items():
                self._flush(js)  # what the next read would push first
                live = _live([*js.heap, *(e for h in js.parked.values() for e in h)])
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


class Ineligible:
    """The type of :data:`INELIGIBLE`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "INELIGIBLE"


INELIGIBLE = Ineligible()
"""What a :meth:`SwitchOrder.first` pick answers for a shape the consumer may take no lane of."""


def _live(entries: list[Entry]) -> list[Entry]:
    """The entries that carry their shape's current version, as a heap."""
    live = [e for e in entries if e[3].order_version == e[2]]
    heapq.heapify(live)
    return live


def _top(heaps: list[list[Entry]]) -> list[Entry] | None:
    """The heap whose top comes first in rule 3's order, stale tops dropped on the way; None when
    every heap is empty."""
    best: list[Entry] | None = None
    for h in heaps:
        while h and h[0][3].order_version != h[0][2]:
            heapq.heappop(h)
        if h and (best is None or h[0] < best[0]):
            best = h
    return best
