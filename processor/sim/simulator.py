"""Replay a request trace through a scheduling policy in virtual time.

Events are arrivals (from the trace, or all at t=0 for a backlog) and batch completions (each card
runs its batches one after another, ``CardModel.batch_ms`` each). After every event the policy fills
free in-flight slots. No threads, no wall clock: the same trace, consumers and seed give the same
figures on any machine, which is what makes the policy comparison in docs/ reproducible.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any, Protocol

from processor.core.accounting import Ledger
from processor.core.contract import BatchRule, Contract
from processor.core.item import Batch, Item
from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings, Scheduler
from processor.sim.baselines import FifoPolicy, OraclePolicy, SortedWindowPolicy
from processor.sim.cardmodel import CardModel, CardSpec
from processor.sim.traces import TraceRecord

POLICIES = ("lanes", "fifo", "sorted-window", "oracle")
TICK_MS = 1000


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    contract: Contract
    card: CardSpec


DEFAULT_CONSUMERS = (
    # A 16 GB card: room for 16k padded tokens per forward pass.
    "card16:model=default,budget=16384,items=64,pad=8,inflight=2,tps=25000,overhead_ms=5,cache=4",
    # A 32 GB card: twice the budget and about twice the speed.
    "card32:model=default,budget=32768,items=128,pad=8,inflight=2,tps=50000,overhead_ms=5,cache=4",
)

_INT_KEYS = {
    "budget": "budget_tokens",
    "items": "max_items",
    "pad": "pad_multiple",
    "inflight": "max_inflight",
    "memory_bytes": "memory_bytes",
    "kv_bytes_per_token": "kv_bytes_per_token",
    "default_output_tokens": "default_output_tokens",
}
_CARD_KEYS = {"tps": "tokens_per_s", "overhead_ms": "overhead_ms", "cache": "cache", "jitter": "jitter"}


def parse_consumer_spec(text: str, defaults: Mapping[str, Any] | None = None) -> ConsumerSpec:
    """``NAME:model=M,budget=16384,items=64,pad=8,inflight=2,tps=50000,overhead_ms=5,cache=4``, plus
    ``batching=rows|tokens|memory``, ``memory_bytes``, ``kv_bytes_per_token`` and
    ``default_output_tokens``. ``defaults`` (contract field -> value, from the command line's
    ``--batching`` and its numbers) apply where the spec does not name the key."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise ValueError(
            f"--consumer {text!r}: expected NAME:key=value,... (e.g. card16:model=default,budget=16384)"
        )
    contract_args: dict[str, Any] = {"consumer": name, "model": "default"}
    card_args: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"--consumer {text!r}: {part!r} is not key=value")
        try:
            if key in ("model", "batching"):
                contract_args[key] = value
            elif key in _INT_KEYS:
                contract_args[_INT_KEYS[key]] = int(value)
            elif key in _CARD_KEYS:
                card_args[_CARD_KEYS[key]] = int(value) if key == "cache" else float(value)
            else:
                known = ", ".join(["model", "batching", *_INT_KEYS, *_CARD_KEYS])
                raise ValueError(f"--consumer {text!r}: unknown key {key!r} (known: {known})")
        except ValueError as exc:
            if "unknown key" in str(exc):
                raise
            raise ValueError(f"--consumer {text!r}: {key}={value!r} is not a number") from None
    base = {"budget_tokens": 16384, "max_items": 64, "pad_multiple": 8, "max_inflight": 2}
    try:
        contract = Contract(**{**base, **(defaults or {}), **contract_args})
        card = CardSpec(**card_args)
    except ValueError as exc:
        raise ValueError(f"--consumer {text!r}: {exc}") from None
    return ConsumerSpec(contract, card)


class Policy(Protocol):
    ledger: Ledger
    oversized: int

    def set_contract(self, contract: Contract) -> None: ...
    def submit(self, item: Item, now_ms: int) -> None: ...
    def dispatch(self, now_ms: int) -> list[Batch]: ...
    def complete(self, batch_id: str, now_ms: int) -> Batch | None: ...
    def tick(self, now_ms: int) -> int: ...


@dataclass(slots=True)
class ConsumerFigures:
    batches: int = 0
    items: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    budget_tokens: int = 0
    fill_padded_tokens: int = 0
    cache_hits: int = 0
    shape_switches: int = 0
    mixed_shape_batches: int = 0
    oversized: int = 0
    busy_ms: float = 0.0
    batching: str = "tokens"
    # KV memory, measured when the card's contract gives memory_bytes and kv_bytes_per_token (in any
    # batching mode, so tokens and rows batching can be shown overflowing what memory batching keeps).
    memory_bytes: int = 0
    kv_batches: int = 0
    kv_bytes: int = 0
    kv_bytes_peak: int = 0
    over_memory: int = 0
    """Batches whose KV bytes exceed memory_bytes, not counting the contract's own oversized ones."""

    @property
    def kv_peak_fill(self) -> float:
        """The largest batch's KV bytes / memory_bytes (batches that are not oversized)."""
        return self.kv_bytes_peak / self.memory_bytes if self.memory_bytes else 0.0

    @property
    def kv_fill(self) -> float:
        """Mean KV bytes per batch / memory_bytes (batches that are not oversized)."""
        return self.kv_bytes / (self.kv_batches * self.memory_bytes) if self.kv_batches else 0.0


@dataclass(slots=True)
class Sample:
    t_ms: int
    waiting_items: int
    waiting_tokens: int
    lanes_in_use: int


@dataclass(slots=True)
class SimReport:
    policy: str
    batching: str | None = None
    """The batching mode every consumer was run in, when the command line chose one."""
    items: int = 0
    batches: int = 0
    tokens_received: int = 0
    tokens_routed: int = 0
    tokens_completed: int = 0
    padded_tokens: int = 0
    budget_tokens: int = 0
    fill_padded_tokens: int = 0
    mixed_shape_batches: int = 0
    shape_switches: int = 0
    cache_hits: int = 0
    lanes_in_use_peak: int = 0
    lane_pressure_peak: float = 0.0
    lane_reuses: int = 0
    new_lanes: int = 0
    idle_reclaims: int = 0
    oversized: int = 0
    makespan_ms: float = 0.0
    waits_ms: list[int] = field(default_factory=list)
    consumers: dict[str, ConsumerFigures] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)

    @property
    def padding_waste(self) -> float:
        return (self.padded_tokens - self.tokens_routed) / self.padded_tokens if self.padded_tokens else 0.0

    @property
    def budget_fill(self) -> float:
        """Padded tokens / (batches x budget), over batches that are not single oversized items."""
        return self.fill_padded_tokens / self.budget_tokens if self.budget_tokens else 0.0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hits / self.batches if self.batches else 0.0

    @property
    def label(self) -> str:
        """The policy, with the batching mode when the run chose one (``lanes/memory``)."""
        return self.policy if self.batching is None else f"{self.policy}/{self.batching}"

    @property
    def kv_peak_fill(self) -> float:
        """The worst consumer's largest batch, in KV bytes / its memory_bytes (0 without KV numbers)."""
        return max((f.kv_peak_fill for f in self.consumers.values()), default=0.0)

    @property
    def over_memory(self) -> int:
        return sum(f.over_memory for f in self.consumers.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_completed * 1000.0 / self.makespan_ms if self.makespan_ms else 0.0

    def wait_percentile(self, q: float) -> int:
        if not self.waits_ms:
            return 0
        ordered = sorted(self.waits_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "batching": self.batching,
            "items": self.items,
            "batches": self.batches,
            "tokens_received": self.tokens_received,
            "tokens_routed": self.tokens_routed,
            "tokens_completed": self.tokens_completed,
            "padded_tokens": self.padded_tokens,
            "padding_waste": round(self.padding_waste, 6),
            "budget_fill": round(self.budget_fill, 6),
            "mixed_shape_batches": self.mixed_shape_batches,
            "shape_switches": self.shape_switches,
            "cache_hit_rate": round(self.cache_hit_rate, 6),
            "lanes_in_use_peak": self.lanes_in_use_peak,
            "lane_pressure_peak": round(self.lane_pressure_peak, 6),
            "lane_reuses": self.lane_reuses,
            "new_lanes": self.new_lanes,
            "idle_reclaims": self.idle_reclaims,
            "wait_ms": {
                "p50": self.wait_percentile(0.5),
                "p99": self.wait_percentile(0.99),
                "max": max(self.waits_ms, default=0),
            },
            "makespan_ms": round(self.makespan_ms, 3),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "oversized": self.oversized,
            "kv_peak_fill": round(self.kv_peak_fill, 6),
            "over_memory_batches": self.over_memory,
            "consumers": {
                name: {
                    "batches": f.batches,
                    "items": f.items,
                    "real_tokens": f.real_tokens,
                    "padded_tokens": f.padded_tokens,
                    "padding_waste": round((f.padded_tokens - f.real_tokens) / f.padded_tokens, 6)
                    if f.padded_tokens
                    else 0.0,
                    "budget_fill": round(f.fill_padded_tokens / f.budget_tokens, 6)
                    if f.budget_tokens
                    else 0.0,
                    "cache_hit_rate": round(f.cache_hits / f.batches, 6) if f.batches else 0.0,
                    "shape_switches": f.shape_switches,
                    "oversized": f.oversized,
                    "busy_ms": round(f.busy_ms, 3),
                    "batching": f.batching,
                    "memory_bytes": f.memory_bytes,
                    "kv_bytes_peak": f.kv_bytes_peak,
                    "kv_peak_fill": round(f.kv_peak_fill, 6),
                    "kv_fill": round(f.kv_fill, 6),
                    "over_memory_batches": f.over_memory,
                }
                for name, f in self.consumers.items()
            },
        }


def make_policy(
    name: str, lanes: LaneSettings | None = None, dispatch: DispatchSettings | None = None, window: int = 1024
) -> Policy:
    if name == "lanes":
        return Scheduler(lanes, dispatch, batch_prefix="sim")
    if name == "fifo":
        return FifoPolicy()
    if name == "sorted-window":
        return SortedWindowPolicy(window)
    if name == "oracle":
        return OraclePolicy()
    raise ValueError(f"--policy {name!r}: choose one of {', '.join(POLICIES)}")


class _Card:
    """A consumer in the simulation: its contract, its card model, and when its engine is next free.

    ``kv`` is the contract's rule in memory batching when the contract gives the KV numbers, whatever
    mode it batches in: it measures every batch's KV bytes with the same rule memory batching packs by.
    """

    def __init__(self, spec: ConsumerSpec, seed: int) -> None:
        self.spec = spec
        self.model = CardModel(spec.card, seed)
        self.free_at = 0.0
        self.last_shapes: frozenset[int] | None = None
        rule = spec.contract.rule
        has_kv = rule.memory_bytes > 0 and rule.kv_bytes_per_token > 0
        self.kv: BatchRule | None = replace(rule, batching="memory") if has_kv else None


def simulate(
    records: Sequence[TraceRecord],
    consumers: Sequence[ConsumerSpec],
    policy: str = "lanes",
    *,
    backlog: bool = False,
    speed: float = 1.0,
    lanes: LaneSettings | None = None,
    dispatch: DispatchSettings | None = None,
    window: int = 1024,
    seed: int = 0,
    emit: IO[str] | None = None,
    batching: str | None = None,
) -> SimReport:
    """Run ``records`` through ``policy`` with ``consumers``; returns the figures.

    Each item's output budget is the trace's ``output_length`` where it has one (memory batching
    counts it; the others ignore it). ``batching`` only labels the report.
    """
    if not consumers:
        raise ValueError("simulate: at least one consumer is needed")
    if speed <= 0:
        raise ValueError(f"--speed must be > 0, got {speed}")
    pol = make_policy(policy, lanes, dispatch, window)
    cards: dict[str, _Card] = {}
    for i, spec in enumerate(consumers):
        if spec.contract.consumer in cards:
            raise ValueError(f"--consumer {spec.contract.consumer!r} is given twice")
        pol.set_contract(spec.contract)
        cards[spec.contract.consumer] = _Card(spec, seed * 1_000_003 + i)
    models = {spec.contract.model for spec in consumers}
    unserved = {r.model for r in records} - models
    if unserved:
        raise ValueError(
            f"no consumer serves model(s) {', '.join(sorted(unserved))}: add a --consumer for each"
        )

    report = SimReport(
        policy,
        batching,
        consumers={
            name: ConsumerFigures(
                batching=c.spec.contract.batching, memory_bytes=c.kv.memory_bytes if c.kv else 0
            )
            for name, c in cards.items()
        },
    )
    arrivals = [
        (
            0 if backlog else int(r.t_ms / speed),
            Item(r.id, r.model, r.shape, r.length, 0, None, r.output_length),
        )
        for r in records
    ]
    arrivals.sort(key=lambda a: a[0])
    for t, item in arrivals:
        item.arrival_ms = t
    completions: list[tuple[float, int, str]] = []
    next_arrival = 0
    next_tick = 0
    now = 0
    seq = 0
    scheduler = pol if isinstance(pol, Scheduler) else None

    while next_arrival < len(arrivals) or completions:
        t_arr = arrivals[next_arrival][0] if next_arrival < len(arrivals) else float("inf")
        t_done = completions[0][0] if completions else float("inf")
        now = math.ceil(min(t_arr, t_done))
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= now:
            pol.submit(arrivals[next_arrival][1], now)
            next_arrival += 1
        while completions and completions[0][0] <= now:
            _, _, batch_id = heapq.heappop(completions)
            pol.complete(batch_id, now)
        if now >= next_tick:
            pol.tick(now)
            _sample(report, pol, scheduler, now)
            next_tick = now + TICK_MS
        for batch in pol.dispatch(now):
            seq += 1
            done_at = _run(report, cards[batch.consumer], batch, now)
            heapq.heappush(completions, (done_at, seq, batch.batch_id))
            if emit is not None:
                emit.write(_batch_line(batch) + "\n")
        if scheduler is not None:
            _lane_peaks(report, scheduler)

    report.items = len(records)
    total = pol.ledger.total
    report.tokens_received = total("received").tokens
    report.tokens_routed = total("routed").tokens
    report.tokens_completed = total("completed").tokens
    report.oversized = pol.oversized
    report.shape_switches = sum(f.shape_switches for f in report.consumers.values())
    if scheduler is not None:
        scheduler.check()
        st = scheduler.table.stats
        report.lane_reuses, report.new_lanes, report.idle_reclaims = st.reuses, st.new_lanes, st.idle_reclaims
        report.lanes_in_use_peak = max(report.lanes_in_use_peak, st.lanes_in_use_peak)
    else:
        pol.ledger.check()
    first = arrivals[0][0] if arrivals else 0
    report.makespan_ms = max((c.free_at for c in cards.values()), default=0.0) - first
    _sample(report, pol, scheduler, now)
    return report


def _run(report: SimReport, card: _Card, batch: Batch, now: int) -> float:
    """Queue ``batch`` on its card; record its figures; return when it completes."""
    f = report.consumers[batch.consumer]
    shapes = frozenset(it.shape for it in batch.items)
    hit = card.model.cache.serve(shapes)
    mixed = len(shapes) > 1
    padded = batch.padded_tokens
    real = batch.real_tokens
    for rec in (f, report):
        rec.batches += 1
        rec.padded_tokens += padded
        if not batch.oversized:  # an oversized batch overfills by definition; it would hide the rest
            rec.fill_padded_tokens += padded
            rec.budget_tokens += card.spec.contract.budget_tokens
        rec.cache_hits += hit
        rec.mixed_shape_batches += mixed
    f.items += len(batch.items)
    f.real_tokens += real
    f.oversized += batch.oversized
    if card.last_shapes is not None and shapes != card.last_shapes:
        f.shape_switches += 1
    card.last_shapes = shapes
    report.waits_ms.extend(now - it.arrival_ms for it in batch.items)
    if card.kv is not None:
        _kv_figures(f, card.kv, batch)
    ms = card.model.batch_ms(padded)
    f.busy_ms += ms
    start = max(float(now), card.free_at)
    card.free_at = start + ms
    return card.free_at


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


def _sample(report: SimReport, pol: Policy, scheduler: Scheduler | None, now: int) -> None:
    if scheduler is not None:
        t = scheduler.table
        report.samples.append(Sample(now, t.waiting_items, t.waiting_tokens, t.stats.lanes_in_use))
    else:
        report.samples.append(
            Sample(now, getattr(pol, "waiting_items", 0), getattr(pol, "waiting_tokens", 0), 0)
        )


def _lane_peaks(report: SimReport, scheduler: Scheduler) -> None:
    pressure = scheduler.table.lane_pressure()
    if pressure > report.lane_pressure_peak:
        report.lane_pressure_peak = pressure


def _batch_line(batch: Batch) -> str:
    return json.dumps(
        {
            "batch_id": batch.batch_id,
            "consumer": batch.consumer,
            "model": batch.model,
            "shape": batch.shape,
            "lane": batch.lane,
            "t_ms": batch.created_ms,
            "padded_length": batch.padded_length,
            "items": [[it.id, it.length] for it in batch.items],
        },
        separators=(",", ":"),
    )


def render_table(reports: Iterable[SimReport]) -> str:
    """A human table: one column per policy (per policy and batching mode when the run chose modes)."""
    reports = list(reports)
    rows: list[tuple[str, Callable[[SimReport], str]]] = [
        ("items", lambda r: f"{r.items:,}"),
        ("batches", lambda r: f"{r.batches:,}"),
        ("tokens received", lambda r: f"{r.tokens_received:,}"),
        ("tokens routed", lambda r: f"{r.tokens_routed:,}"),
        ("padded tokens", lambda r: f"{r.padded_tokens:,}"),
        ("padding waste", lambda r: f"{r.padding_waste:.3%}"),
        ("budget fill", lambda r: f"{r.budget_fill:.1%}"),
        ("mixed-shape batches", lambda r: f"{r.mixed_shape_batches:,}"),
        ("shape switches", lambda r: f"{r.shape_switches:,}"),
        ("cache hit rate", lambda r: f"{r.cache_hit_rate:.1%}"),
        ("lanes in use (peak)", lambda r: f"{r.lanes_in_use_peak:,}"),
        ("lane pressure (peak)", lambda r: f"{r.lane_pressure_peak:.3f}"),
        ("lane reuses / new lanes", lambda r: f"{r.lane_reuses:,} / {r.new_lanes:,}"),
        ("oversized", lambda r: f"{r.oversized:,}"),
        (
            "wait p50 / p99 / max ms",
            lambda r: (
                f"{r.wait_percentile(0.5):,} / {r.wait_percentile(0.99):,} / {max(r.waits_ms, default=0):,}"
            ),
        ),
        ("makespan (virtual s)", lambda r: f"{r.makespan_ms / 1000:,.1f}"),
        ("tokens/s (virtual)", lambda r: f"{r.tokens_per_s:,.0f}"),
    ]
    if any(f.memory_bytes for r in reports for f in r.consumers.values()):
        rows += [
            ("KV bytes peak / memory_bytes", lambda r: f"{r.kv_peak_fill:.1%}"),
            ("batches over memory_bytes", lambda r: f"{r.over_memory:,}"),
        ]
    width = max(len(name) for name, _ in rows)
    cols = [[fmt(r) for _, fmt in rows] for r in reports]
    col_w = [max(len(r.label), *(len(v) for v in col)) for r, col in zip(reports, cols, strict=True)]
    lines = [
        "".ljust(width) + "  " + "  ".join(r.label.rjust(w) for r, w in zip(reports, col_w, strict=True))
    ]
    for i, (name, _) in enumerate(rows):
        lines.append(
            name.ljust(width) + "  " + "  ".join(col[i].rjust(w) for col, w in zip(cols, col_w, strict=True))
        )
    return "\n".join(lines)
