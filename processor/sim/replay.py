"""The simulator's event loop: arrivals, completions and ticks in virtual time, and what each batch
costs on its card (processor/sim/simulator.py sets a run up and totals it)."""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import IO, Protocol

from processor.core.contract import BatchRule, Contract
from processor.core.item import Batch, Item
from processor.core.scheduler import Scheduler
from processor.core.serving import SEPARATOR
from processor.sim.baselines import Totals
from processor.sim.cardmodel import CardModel, CardSpec
from processor.sim.consumer_spec import ConsumerSpec
from processor.sim.report import ConsumerFigures, Sample, SimReport, batch_line

TICK_MS = 1000


class Policy(Protocol):
    """What the replay drives: the lanes scheduler or a baseline (processor/sim/baselines.py)."""

    oversized: int

    @property
    def view(self) -> Totals: ...  # the scheduler's view, a baseline's ledger
    def check(self) -> None: ...

    def set_contract(self, contract: Contract) -> None: ...
    def submit(self, item: Item, now_ms: int) -> None: ...
    def submit_many(self, items: Sequence[Item], times: Sequence[int]) -> None: ...
    def dispatch(self, now_ms: int) -> list[Batch]: ...
    def complete(self, batch_id: str, now_ms: int) -> Batch | None: ...
    def tick(self, now_ms: int) -> int: ...


class Server:
    """A card: its cost and prefix-cache model, and when its engine is next free. Consumers that name
    one ``server`` share it (their batches run one after another on it)."""

    def __init__(self, card: CardSpec, seed: int) -> None:
        self.card = card
        self.model = CardModel(card, seed)
        self.free_at = 0.0


class Card:
    """A consumer in the simulation: its contract, its server, and the cache keys of its last batch.

    ``kv`` is the contract's rule in memory batching when the contract gives the KV numbers, whatever
    mode it batches in: it measures every batch's KV bytes with the same rule memory batching packs by.
    """

    def __init__(self, spec: ConsumerSpec, server: Server) -> None:
        self.spec = spec
        self.server = server
        self.last_shapes: frozenset[Hashable] | None = None
        rule = spec.contract.rule
        has_kv = rule.memory_bytes > 0 and rule.kv_bytes_per_token > 0
        self.kv: BatchRule | None = replace(rule, batching="memory") if has_kv else None


class Replay:
    """The event loop: arrivals, completions and ticks in virtual time, the policy asked to fill free
    slots after each.

    Every batch in flight has exactly one entry in ``completions``: when they fill every consumer's
    slots, dispatch would emit nothing, so it is not asked, and the arrivals before the next
    completion and the next tick are submitted in one run (the same batches, far fewer calls when the
    cards are busy and arrivals keep coming).
    """

    def __init__(
        self,
        pol: Policy,
        cards: dict[str, Card],
        times: list[int],
        items: list[Item],
        report: SimReport,
        emit: IO[str] | None,
    ) -> None:
        self.pol = pol
        self.cards = cards
        self.times = times
        self.items = items
        self.report = report
        self.emit = emit
        self.scheduler = pol if isinstance(pol, Scheduler) else None
        self.completions: list[tuple[float, int, str]] = []
        self.next_arrival = 0
        self.next_tick = 0
        self.seq = 0
        self.slots = sum(card.spec.contract.max_inflight for card in cards.values())

    def run(self) -> int:
        """Replay every event; returns the time of the last."""
        times, completions, n_arrivals, slots = self.times, self.completions, len(self.items), self.slots
        arrive, complete_due, tick = self._arrive, self._complete_due, self._tick
        dispatch, submit_while_busy = self._dispatch, self._submit_while_busy
        now = 0
        while self.next_arrival < n_arrivals or completions:
            t_arr = times[self.next_arrival] if self.next_arrival < n_arrivals else math.inf
            t_done = completions[0][0] if completions else math.inf
            now = math.ceil(min(t_arr, t_done))
            if t_arr <= now:
                arrive(now)
            if completions and completions[0][0] <= now:
                complete_due(now)
            if now >= self.next_tick:
                tick(now)
            if len(completions) < slots:
                dispatch(now)
            if len(completions) >= slots:  # every slot is taken until the next completion
                submit_while_busy()
        return now

    def _arrive(self, now: int) -> None:
        """Submit the items arriving at ``now`` (or before it: ``now`` is rounded up)."""
        start = self.next_arrival
        upto = bisect.bisect_right(self.times, now, start)
        self.pol.submit_many(self.items[start:upto], [now] * (upto - start))
        self.next_arrival = upto

    def _complete_due(self, now: int) -> None:
        completions = self.completions
        while completions and completions[0][0] <= now:
            _, _, batch_id = heapq.heappop(completions)
            self.pol.complete(batch_id, now)

    def _tick(self, now: int) -> None:
        self.pol.tick(now)
        sample(self.report, self.pol, self.scheduler, now)
        self.next_tick = now + TICK_MS

    def _dispatch(self, now: int) -> None:
        """Run each batch the policy dispatches now on its card; write its line where asked."""
        emit = self.emit
        for batch in self.pol.dispatch(now):
            self.seq += 1
            done_at = run_batch(self.report, self.cards[batch.consumer], batch, now)
            heapq.heappush(self.completions, (done_at, self.seq, batch.batch_id))
            if emit is not None:
                emit.write(batch_line(batch) + "\n")

    def _submit_while_busy(self) -> None:
        """Every slot is taken: submit, at their own times, the arrivals before the next completion
        and the next tick (nothing can be dispatched until then)."""
        start, times = self.next_arrival, self.times
        upto = bisect.bisect_left(times, min(math.ceil(self.completions[0][0]), self.next_tick), start)
        if upto > start:
            self.pol.submit_many(self.items[start:upto], times[start:upto])
            self.next_arrival = upto


def waits(items: list[Item]) -> list[int]:
    """Each dispatched item's wait, from the dispatch time ``run_batch`` left in its ``payload``.

    Counted in arrival order once the run ends rather than as each batch leaves: an item's arrival
    time is an int object of its own, and batches take items in no order that memory likes."""
    return [it.payload - it.arrival_ms for it in items if it.payload is not None]


def run_batch(report: SimReport, card: Card, batch: Batch, now: int) -> float:
    """Queue ``batch`` on its card; record its figures; return when it completes."""
    f = report.consumers[batch.consumer]
    items = batch.items
    real = 0
    for it in items:
        real += it.length
        it.payload = now  # its dispatch time: the waits are counted once the run ends (waits)
    shapes = frozenset([it.shape for it in items])
    served = frozenset([it.model for it in items])
    # A prefix is cached per adapter: once adapters are about, the cache holds (serving key, shape).
    keys: frozenset[Hashable] = shapes
    if any(SEPARATOR in key for key in served):
        keys = frozenset([(it.model, it.shape) for it in items])
    server = card.server
    hit = server.model.cache.serve(keys)
    padded = batch.padded_length * len(items)
    f.batches += 1
    f.padded_tokens += padded
    if not batch.oversized:  # an oversized batch overfills by definition; it would hide the rest
        f.fill_padded_tokens += padded
        f.budget_tokens += card.spec.contract.budget_tokens
    f.cache_hits += hit
    f.mixed_shape_batches += len(shapes) > 1
    f.mixed_adapter_batches += len(served) > 1
    f.items += len(items)
    f.real_tokens += real
    f.oversized += batch.oversized
    job = report.jobs.get(items[0].job)  # a lanes batch is one job's; a baseline's may mix
    if job is not None:
        job.batches += 1
        job.padded_tokens += padded
        job.real_tokens += real
        job.routed.append((now, real))
        if job.first_dispatch_ms is None:
            job.first_dispatch_ms = now
    if card.last_shapes is not None and keys != card.last_shapes:
        f.shape_switches += 1
    card.last_shapes = keys
    if card.kv is not None:
        _kv_figures(f, card.kv, batch)
    ms = server.model.batch_ms(padded)
    f.busy_ms += ms
    start = max(float(now), server.free_at)
    server.free_at = start + ms
    if job is not None and server.free_at > job.done_ms:
        job.done_ms = server.free_at
    return server.free_at


def _kv_figures(f: ConsumerFigures, kv: BatchRule, batch: Batch) -> None:
    """KV bytes of ``batch`` against the card's memory, by the memory-batching rule (a batch that is
    the contract's own oversized item is left out: it overfills by definition)."""
    if batch.oversized:
        return
    items = batch.items
    outputs = sum(kv.output_tokens(it.output_budget) for it in items)
    longest = max(it.length for it in items)
    if not kv.fits(len(items), longest, outputs):
        f.over_memory += 1
    load = kv.load(len(items), longest, outputs)
    f.kv_batches += 1
    f.kv_bytes += load
    if load > f.kv_bytes_peak:
        f.kv_bytes_peak = load


def sample(report: SimReport, pol: Policy, scheduler: Scheduler | None, now: int) -> None:
    if scheduler is not None:
        w = scheduler.view.waiting()
        report.samples.append(Sample(now, w.items, w.tokens, scheduler.view.lanes().lanes_in_use))
    else:
        report.samples.append(
            Sample(now, getattr(pol, "waiting_items", 0), getattr(pol, "waiting_tokens", 0), 0)
        )
