"""A read-only view of a scheduler: the figures status, metrics, checkpoints and the partition
handover show, without reaching into the lane table or the consumers' state.

Every figure is copied into a frozen value when asked for, so what a caller keeps does not change
under it and cannot change the scheduler (a consumer's batches are the ``Batch`` values dispatch
returned, shared rather than copied). Cheap enough for every commit and every scrape: the totals
and lane counters are O(1), per-consumer figures O(consumers + batches in flight), per model and per
shape O(shapes holding lanes).

Observers on other threads (the metrics endpoint) may call it: each figure is read from the owner
thread's objects without locking (a dict copied with one C call cannot see the dict change size, and
an ``int`` read is atomic), so two figures may be a step apart, never torn. ``check`` of the
scheduler is what proves them consistent.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from processor.core.accounting import ConsumerBook, JobBook, Ledger, ModelBook, Tally
from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.core.shares import JobPolicy

if TYPE_CHECKING:
    from processor.core.context import SchedulerContext
    from processor.core.endings import Ending
    from processor.core.inflight import ConsumerState

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Waiting:
    """Items waiting in lanes (not yet dispatched), and their prompt tokens."""

    items: int
    tokens: int


@dataclass(frozen=True, slots=True)
class LaneSnapshot:
    """The lane table: what exists now, and the counters of lane activity since the start (they
    carry on over a partition handover, which only forgets the lanes)."""

    lanes_in_use: int
    lanes_in_use_peak: int
    lane_budget: int
    """Most lanes one (model, shape) may hold (``LaneSettings.lane_budget``)."""
    shapes: int
    """Shapes holding lanes now: (model, shape), and (model, shape, job) for a named job's items."""
    reuses: int
    """Items placed in an existing lane."""
    new_lanes: int
    id_reuses: int
    """Lanes opened under the id of a reclaimed one."""
    idle_reclaims: int
    lane_pressure_peak: float


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    """One consumer as the scheduler sees it."""

    contract: Contract
    slots: int
    """The batches it may hold from this scheduler: its share of ``max_inflight`` (several processor
    instances share a consumer), or all of ``max_inflight`` when it has no share."""
    batches: tuple[Batch, ...]
    """The batches it holds, oldest first."""
    shape_switches: int
    """Times it was moved to another shape (each costs its prefix cache)."""

    @property
    def in_flight(self) -> int:
        """How many batches it holds."""
        return len(self.batches)

    @property
    def free_slots(self) -> int:
        """Batches it may still be sent (negative after its share shrank under what it holds)."""
        return self.slots - len(self.batches)


class SchedulerView:
    """Read-only figures of one :class:`~processor.core.scheduler.Scheduler` (``Scheduler.view``),
    read from the state it is handed (the scheduler's :class:`~processor.core.context.SchedulerContext`)."""

    __slots__ = ("_context",)

    def __init__(self, context: SchedulerContext) -> None:
        self._context = context

    # -- waiting work ----------------------------------------------------------------------------

    def waiting(self) -> Waiting:
        """Everything waiting in lanes."""
        table = self._context.table
        return Waiting(table.waiting_items, table.waiting_tokens)

    def waiting_by_model(self) -> dict[str, Waiting]:
        """What waits per model; models with nothing waiting are left out."""
        out: dict[str, tuple[int, int]] = {}
        for (model, _shape), (items, tokens) in self._by_shape().items():
            had_items, had_tokens = out.get(model, (0, 0))
            out[model] = (had_items + items, had_tokens + tokens)
        return {model: Waiting(*n) for model, n in out.items()}

    def waiting_by_shape(self) -> dict[tuple[str, int], Waiting]:
        """What waits per (model, shape), a shape's jobs together; shapes with nothing waiting left out."""
        return {key: Waiting(*n) for key, n in self._by_shape().items()}

    def waiting_list(self) -> list[Item]:
        """The items waiting in lanes, lane by lane (the items themselves, not copies: for tests and
        tools; linear in what waits)."""
        return list(self._context.table.waiting())

    def oldest_waiting_ms(self, model: str, scan_limit: int) -> int | None:
        """Arrival time of ``model``'s oldest item not yet dispatched, looking at most ``scan_limit``
        items into its arrival queue (dispatched items leave it lazily, so the first is nearly always
        at the front); None when none of those waits.

        For observers on other threads: the owner thread may change the queue meanwhile, and then
        this raises ``RuntimeError`` ("deque mutated during iteration"); ask again.
        """
        arrivals = self._context.arrivals.get(model)
        if not arrivals:
            return None
        first = next((it for it in itertools.islice(arrivals, scan_limit) if not it.dispatched), None)
        return None if first is None else first.arrival_ms

    def unserved(self) -> dict[str, tuple[int, int]]:
        """(items, tokens) waiting per model that no consumer has a contract for: work nobody can take
        until one announces. Models with nothing waiting are left out. Read by the processor's log
        (once per model, processor/apps/observe.py) and metrics; from another thread the figures
        may be a step old."""
        ctx = self._context
        return {
            model: (book.queued.items, book.queued.tokens)
            for model, book in list(ctx.ledger.models.items())
            if book.queued.items > 0 and not ctx.by_model.get(model)
        }

    def _by_shape(self) -> dict[tuple[str, int], tuple[int, int]]:
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for sl in list(self._context.table.shapes.values()):
            if sl.waiting_items:
                key = (sl.model, sl.shape)
                items, tokens = out.get(key, (0, 0))
                out[key] = (items + sl.waiting_items, tokens + sl.waiting_tokens)
        return out

    # -- lanes and dispatch ----------------------------------------------------------------------

    def lanes(self) -> LaneSnapshot:
        table = self._context.table
        st = table.stats
        return LaneSnapshot(
            lanes_in_use=st.lanes_in_use,
            lanes_in_use_peak=st.lanes_in_use_peak,
            lane_budget=table.settings.lane_budget,
            shapes=len(table.shapes),
            reuses=st.reuses,
            new_lanes=st.new_lanes,
            id_reuses=st.id_reuses,
            idle_reclaims=st.idle_reclaims,
            lane_pressure_peak=st.lane_pressure_peak,
        )

    def shape_switches(self) -> int:
        """Shape switches of every consumer known now (a retired consumer's go with it)."""
        return sum(c.shape_switches for c in list(self._context.consumers.values()))

    def oversized(self) -> int:
        """Single-item batches sent although they exceed their consumer's batching rule."""
        return self._context.oversized

    # -- consumers -------------------------------------------------------------------------------

    def consumers(self) -> dict[str, ConsumerSnapshot]:
        """Every consumer with a contract, in the order they announced."""
        return {name: _snapshot(state) for name, state in list(self._context.consumers.items())}

    def consumer(self, name: str) -> ConsumerSnapshot | None:
        """One consumer's figures; None when it has no contract."""
        state = self._context.consumers.get(name)
        return None if state is None else _snapshot(state)

    def contract(self, name: str) -> Contract | None:
        """A consumer's contract (cheaper than :meth:`consumer`); None when it has none."""
        state = self._context.consumers.get(name)
        return None if state is None else state.contract

    # -- the ledger's books ----------------------------------------------------------------------
    # The books are the ledger's live objects, not copies (a scrape reads thousands of counters):
    # read them, never write them; copy what you keep. The scheduler is the ledger's only writer.

    def total(self, stage: str) -> Tally:
        """A ledger stage (``received``, ``queued``, ``completed``...) summed over every model, a copy."""
        return self._context.ledger.total(stage)

    def cached_total(self) -> Tally:
        """Cached prompt tokens over every model (``tokens``; ``items`` is 0)."""
        return self._context.ledger.cached_total()

    def model_books(self) -> list[tuple[str, ModelBook]]:
        """(model, its book) for every model the ledger counted, in the order they first came."""
        return _items(self._context.ledger.models)

    def consumer_books(self) -> list[tuple[str, ConsumerBook]]:
        """(consumer, its book) for every consumer the ledger counted (retired ones too)."""
        return _items(self._context.ledger.consumers)

    def job_books(self) -> list[tuple[str, JobBook]]:
        """(job, its book) for every job the ledger counted."""
        return _items(self._context.ledger.jobs)

    def job_book(self, job: str) -> JobBook:
        """``job``'s book; an empty one, not kept, when the ledger never counted it."""
        return self._context.ledger.jobs.get(job) or JobBook.empty()

    def consumer_book(self, consumer: str) -> ConsumerBook:
        """``consumer``'s book; an empty one, not kept, when the ledger never counted it."""
        return self._context.ledger.consumers.get(consumer) or ConsumerBook.empty()

    def model_book(self, model: str) -> ModelBook:
        """``model``'s book; an empty one, not kept, when the ledger never counted it."""
        return self._context.ledger.models.get(model) or ModelBook.empty()

    def prompts_counted(self) -> bool:
        """Whether any consumer reported cached prompt tokens (else the prompt counters mean nothing)."""
        return self._context.ledger.prompts_counted

    def counted_before(self) -> Ledger:
        """The counts the ledger resumed from (empty when it started from nothing): not this
        process's events. Read-only for callers."""
        return self._context.counted_before

    def dead_lettered(self) -> int:
        """Inputs that never became items (undecodable, invalid or duplicates)."""
        return self._context.ledger.dead_lettered

    def ledger_snapshot(self) -> dict[str, int]:
        """The ledger's counters as a checkpoint holds them (``Ledger.snapshot``)."""
        return self._context.ledger.snapshot()

    def handover_delta(self) -> dict[str, tuple[int, int]]:
        """What a partition handover moved so far, per stage (``Ledger.handover_delta``)."""
        return self._context.ledger.handover_delta()

    # -- jobs ------------------------------------------------------------------------------------

    def policy(self, job: str) -> JobPolicy:
        """``job``'s share policy (the default one when none was set)."""
        return self._context.shares.policy(job)

    def share_jobs(self) -> list[str]:
        """Every job with a policy, a quota state or a virtual time (core/shares.py)."""
        return list(self._context.shares.jobs())

    def capped_now(self, job: str, now_ms: int) -> bool:
        """Whether a quota holds ``job``'s items back at ``now_ms``."""
        return self._context.shares.capped_now(job, now_ms)

    def ended(self, job: str) -> Ending | None:
        """How ``job`` ended (cancelled or expired); None while it has not."""
        return self._context.endings.ended.get(job)


def _items(d: dict[K, V]) -> list[tuple[K, V]]:
    """``d``'s items copied in one C call (str keys: it cannot see the owner thread add a key)."""
    return list(d.items())


def _snapshot(state: ConsumerState) -> ConsumerSnapshot:
    return ConsumerSnapshot(
        contract=state.contract,
        slots=state.slot_limit,
        batches=tuple(flight.batch for flight in list(state.in_flight.values())),
        shape_switches=state.shape_switches,
    )
