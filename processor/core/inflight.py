"""In-flight bookkeeping: the batches consumers hold, which of their items are still outstanding, and
what an answer finishes.

Apart from the dispatch rules (core/scheduler.py) because it is another idea: the rules decide what
a consumer gets next; this module remembers what it holds until it answers. The one ledger writer
here is :func:`book_finished`, which the scheduler calls with its ledger when an answer finishes
items (so the scheduler and its parts stay the ledger's only writers).

Invariant (``Scheduler.check`` recounts it): a batch is in :class:`InFlightTable` exactly when it is
in its holder's ``ConsumerState.in_flight``, and its outstanding items are what the ledger counts as
in flight.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from processor.core.books import LedgerImbalance
from processor.core.contract import Contract
from processor.core.item import Batch, Item, Outcome
from processor.core.lanes import ShapeKey

if TYPE_CHECKING:
    from processor.core.accounting import Ledger

Answers = list[tuple[bool, Item]]
"""Items just answered, each with whether it succeeded, in the order the answers came."""


class InFlight:
    """A batch a consumer holds, and which of its items are still outstanding."""

    __slots__ = ("batch", "job", "pending", "tokens")

    def __init__(self, batch: Batch, job: str | None, tokens: int | None = None) -> None:
        self.batch = batch
        self.pending: dict[str, Item] | None = None  # built on the first per-item completion
        self.job = job  # the job of all its items; None for a batch restored from before lanes had jobs
        self.tokens = batch.real_tokens if tokens is None else tokens  # of all its items

    def outstanding(self) -> Collection[Item]:
        """The items not answered yet (all of them until a per-item completion arrives)."""
        return self.pending.values() if self.pending is not None else self.batch.items

    def done_ids(self) -> list[str]:
        """Ids of the items answered already, in batch order."""
        pending = self.pending
        if pending is None:
            return []
        return [it.id for it in self.batch.items if it.id not in pending]

    def finish(self, failed: Collection[str]) -> Answers | None:
        """Every outstanding item is answered, those in ``failed`` as failed. Returns them, or None in
        the common case (nothing failed and nothing answered before: the whole batch succeeded, and
        its ``tokens`` are known without another pass over its items)."""
        if not failed and self.pending is None:
            return None
        return [(it.id not in failed, it) for it in self.outstanding()]

    def answer(self, results: Sequence[Outcome]) -> tuple[Answers, bool]:
        """Apply one results message: the items of ``results`` still outstanding (the others are
        duplicates) and whether nothing is outstanding after them. A message answering the whole
        batch in order, the common case, builds no per-item index."""
        items = self.batch.items
        if (
            self.pending is None
            and len(results) == len(items)
            and all(r[0] == it.id for r, it in zip(results, items, strict=True))
        ):
            return [(r[1], it) for r, it in zip(results, items, strict=True)], True
        if self.pending is None:
            self.pending = {it.id: it for it in items}
        pending = self.pending
        answered: Answers = []
        for item_id, ok, _hit in results:
            found = pending.get(item_id)
            if found is not None:
                del pending[item_id]
                answered.append((ok, found))
        return answered, not pending


class ConsumerState:
    """A consumer as the scheduler sees it: its contract, its share of slots, what it holds and the
    shape it is on (the dispatch rules' stickiness)."""

    __slots__ = (
        "contract",
        "in_flight",
        "last_shape",
        "rank",
        "shape",
        "shape_switches",
        "slots",
        "switched_ms",
    )

    def __init__(self, contract: Contract, slots: int | None = None, rank: int = -1) -> None:
        self.contract = contract
        self.rank = rank
        """Its place in the order consumers announced (dispatch's turns); -1: not one of the
        scheduler's consumers (a stand-in holding an adopted batch of a consumer that is gone)."""
        self.slots = slots  # this instance's share of max_inflight (processor/state/credits.py); None: all
        self.in_flight: dict[str, InFlight] = {}
        self.shape: ShapeKey | None = None
        self.last_shape: ShapeKey | None = None
        self.switched_ms = 0
        self.shape_switches = 0

    @property
    def slot_limit(self) -> int:
        """The batches it may hold from this scheduler: its share, else its whole ``max_inflight``."""
        return self.contract.max_inflight if self.slots is None else self.slots

    @property
    def free_slots(self) -> int:
        """``slot_limit`` less what it holds (the limit written out: asked per consumer and round)."""
        return (self.contract.max_inflight if self.slots is None else self.slots) - len(self.in_flight)


#: How many handed-over batch ids an :class:`InFlightTable` remembers (the oldest go first): far more
#: than a fleet's processor holds in flight, so a late completion of one is still told apart.
HANDED_OVER_KEPT = 1 << 16


class InFlightTable:
    """Every batch in flight by id, with the consumer state that holds it (which lists it too).

    Also the ids of the batches it let go at the last hand-backs (:meth:`clear`), until one comes
    back (:meth:`hold`): a completion of such a batch belongs to the instance that adopted it, and
    is no sign of a consumer running a batch again (``ServiceCounters.missed``)."""

    __slots__ = ("_by_id", "_handed", "free")

    def __init__(self) -> None:
        self._by_id: dict[str, tuple[ConsumerState, InFlight]] = {}
        self._handed: dict[str, None] = {}  # insertion-ordered: the oldest are dropped first
        self.free: dict[ConsumerState, None] = {}
        """The consumers with a free slot, kept as batches are held and let go (:meth:`recount`
        after a change of contracts or shares): dispatch looks at these only, so a busy fleet's
        consumers cost nothing per dispatch (benchmarks/bench_consumers.py)."""

    def hold(self, state: ConsumerState, flight: InFlight) -> None:
        batch_id = flight.batch.batch_id
        state.in_flight[batch_id] = flight
        self._by_id[batch_id] = (state, flight)
        if state.free_slots <= 0:
            self.free.pop(state, None)
        if self._handed:
            self._handed.pop(batch_id, None)

    def get(self, batch_id: str) -> tuple[ConsumerState, InFlight] | None:
        return self._by_id.get(batch_id)

    def pop(self, batch_id: str) -> tuple[ConsumerState, InFlight] | None:
        """Forget the batch (answered, or handed back); None if it was not in flight."""
        entry = self._by_id.pop(batch_id, None)
        if entry is not None:
            state = entry[0]
            del state.in_flight[batch_id]
            if state.rank >= 0 and state.free_slots > 0:
                self.free[state] = None
        return entry

    def recount(self, states: Iterable[ConsumerState]) -> None:
        """:attr:`free` from scratch: after contracts, shares or holdings changed wholesale."""
        self.free = {s: None for s in states if s.free_slots > 0}

    def recount_one(self, state: ConsumerState) -> None:
        """:attr:`free` after ``state``'s contract or share changed."""
        if state.free_slots > 0:
            self.free[state] = None
        else:
            self.free.pop(state, None)

    def forget(self, state: ConsumerState) -> None:
        """``state``'s consumer retired: it is no scheduler's consumer any more (its ``rank`` -1)."""
        self.free.pop(state, None)
        state.rank = -1

    def check_free(self, states: Iterable[ConsumerState]) -> None:
        """Raise if :attr:`free` is not exactly the consumers of ``states`` with a free slot."""
        free = {s for s in states if s.free_slots > 0}
        if free != set(self.free):
            names = sorted(s.contract.consumer for s in free)
            raise LedgerImbalance(
                f"consumers with a free slot: {names}, but dispatch looks at {self.names()}"
            )

    def names(self) -> list[str]:
        return sorted(s.contract.consumer for s in self.free)

    def free_in_turn(self) -> list[ConsumerState]:
        """The consumers with a free slot, in the order they announced."""
        free = self.free
        if len(free) < 2:
            return list(free)
        return sorted(free, key=_rank)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._by_id

    def batches(self) -> Iterator[Batch]:
        return (flight.batch for _, flight in self._by_id.values())

    def clear(self) -> None:
        """Forget every batch, remembering their ids as handed over (the holders' own lists are the
        caller's to clear)."""
        self._remember(self._by_id)
        self._by_id.clear()

    def let_go(self, batch_id: str) -> tuple[ConsumerState, InFlight] | None:
        """Forget one batch as :meth:`pop` does (its holder's list too), remembering it as handed
        over (its ingest partition went to another instance, which adopts it); None if unknown."""
        entry = self.pop(batch_id)
        if entry is not None:
            self._remember((batch_id,))
        return entry

    def _remember(self, batch_ids: Iterable[str]) -> None:
        handed = self._handed
        handed.update(dict.fromkeys(batch_ids))
        while len(handed) > HANDED_OVER_KEPT:
            del handed[next(iter(handed))]

    def handed_over(self, batch_id: str) -> bool:
        """Whether ``batch_id`` was in flight here when it was let go, and has not come back."""
        return batch_id in self._handed

    def outstanding(self) -> tuple[int, int]:
        """Items and tokens not answered yet, recounted item by item (for ``check``)."""
        items = tokens = 0
        for _, flight in self._by_id.values():
            for it in flight.outstanding():
                items += 1
                tokens += it.length
        return items, tokens


def _rank(state: ConsumerState) -> int:
    return state.rank


def cached_by_id(results: Sequence[Outcome], cached_tokens: Sequence[int]) -> dict[str, int]:
    """Each ok result's cached prompt tokens by item id (``cached_tokens`` in ``results``' order)."""
    return {r[0]: n for r, n in zip(results, cached_tokens, strict=True) if r[1] and n}


def count_answers(answered: Answers) -> tuple[int, int, int, int]:
    """(ok items, ok tokens, failed items, failed tokens) of ``answered``."""
    ok_items = ok_tokens = bad_items = bad_tokens = 0
    for ok, item in answered:
        if ok:
            ok_items += 1
            ok_tokens += item.length
        else:
            bad_items += 1
            bad_tokens += item.length
    return ok_items, ok_tokens, bad_items, bad_tokens


def per_job(items: Iterable[Item]) -> dict[str, tuple[int, int]]:
    """Items and tokens per job."""
    out: dict[str, tuple[int, int]] = {}
    for it in items:
        n, tokens = out.get(it.job, (0, 0))
        out[it.job] = (n + 1, tokens + it.length)
    return out


def book_finished(
    ledger: Ledger,
    flight: InFlight,
    counts: tuple[int, int, int, int],
    answered: Answers | None,
    cached: dict[str, int] | None = None,
) -> None:
    """Book answered items of ``flight`` in ``ledger``: ``counts`` is (ok items, ok tokens, failed
    items, failed tokens); ``answered`` lists them (None: every item of the batch, all ok); ``cached``
    the prompt tokens the engine served from its cache, by item id (None: not reported, all computed).
    A batch restored from before lanes had jobs may mix jobs: its job books are written item by item."""
    batch, job, both = flight.batch, flight.job, answered
    if both is None and (cached is not None or job is None):  # every item of the batch, all ok
        both = [(True, it) for it in batch.items]
    total = None if cached is None or both is None else sum(cached.get(it.id, 0) for ok, it in both if ok)
    ok_items, ok_tokens, bad_items, bad_tokens = counts  # passed by position: no tuple call (per batch)
    ledger.batch_finished(batch.model, batch.consumer, job, ok_items, ok_tokens, bad_items, bad_tokens, total)
    if job is None and both is not None:
        for ok, it in both:
            n = it.length
            mine = None if cached is None else cached.get(it.id, 0) if ok else 0
            ledger.job_finished(it.job, int(ok), n if ok else 0, int(not ok), 0 if ok else n, mine)
