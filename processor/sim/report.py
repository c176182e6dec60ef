"""What a simulation measured, per policy and per consumer, and the table that prints it."""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.core.item import Batch
from processor.core.measures import budget_fill, padding_waste
from processor.sim.columns import fitted


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
    mixed_adapter_batches: int = 0
    """Batches holding items of more than one serving key (a baseline's, on a multi-LoRA server)."""
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
    def padding_waste(self) -> float:
        """The consumer's padding waste (0 before its first batch)."""
        return padding_waste(self.real_tokens, self.padded_tokens) or 0.0

    @property
    def kv_peak_fill(self) -> float:
        """The largest batch's KV bytes / memory_bytes (batches that are not oversized)."""
        return self.kv_bytes_peak / self.memory_bytes if self.memory_bytes else 0.0

    @property
    def kv_fill(self) -> float:
        """Mean KV bytes per batch / memory_bytes (batches that are not oversized)."""
        return self.kv_bytes / (self.kv_batches * self.memory_bytes) if self.kv_batches else 0.0


@dataclass(slots=True)
class JobFigures:
    """One job's side of a run: what it was routed, when it first arrived, first went out and was done.

    ``routed`` holds each batch's (dispatch ms, real tokens), so a benchmark can ask what share of the
    tokens a job received over any window (benchmarks/shares.py)."""

    items: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    weight: float = 1.0
    first_arrival_ms: int | None = None
    first_dispatch_ms: int | None = None
    done_ms: float = 0.0
    routed: list[tuple[int, int]] = field(default_factory=list)

    def tokens_between(self, start_ms: float, end_ms: float) -> int:
        """Real tokens of this job's batches dispatched in [start_ms, end_ms]."""
        return sum(t for ms, t in self.routed if start_ms <= ms <= end_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "batches": self.batches,
            "weight": self.weight,
            "first_arrival_ms": self.first_arrival_ms,
            "first_dispatch_ms": self.first_dispatch_ms,
            "done_ms": round(self.done_ms, 3),
        }


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
    mixed_adapter_batches: int = 0
    adapters: int = 0
    """Serving keys in the trace that name an adapter (``model@adapter``); 0: base-model work only."""
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
    jobs: dict[str, JobFigures] = field(default_factory=dict)
    """Per job (the trace's ``job`` field; "" for none)."""

    @property
    def padding_waste(self) -> float:
        """Over every consumer's batches (0 before the first)."""
        return padding_waste(self.tokens_routed, self.padded_tokens) or 0.0

    @property
    def budget_fill(self) -> float:
        """:func:`~processor.core.measures.budget_fill` over every consumer's batches (0 before the first)."""
        return budget_fill(self.fill_padded_tokens, self.budget_tokens) or 0.0

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
        """The ``q`` quantile of the waits, by nearest rank: the ``int(q * n)``-th smallest (0-based)
        of the ``n`` waits, the largest for ``q = 1``."""
        waits = self.waits_ms
        if not waits:
            return 0
        return kth_smallest(waits, min(len(waits) - 1, int(q * len(waits))))

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
            "mixed_adapter_batches": self.mixed_adapter_batches,
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
                "max": self.wait_percentile(1.0),
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
                    "padding_waste": round(f.padding_waste, 6),
                    "budget_fill": round(budget_fill(f.fill_padded_tokens, f.budget_tokens) or 0.0, 6),
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
            "jobs": {job: f.to_dict() for job, f in self.jobs.items()},
        }


_SAMPLE = 2048
"""Values :func:`kth_smallest` samples to bracket a rank (and the size below which it just sorts)."""
_MARGIN = 96
"""Sample ranks on each side of the rank's own in the bracket: a strided sample of 2,048 places a rank
within about 1% (one standard deviation) of its true fraction, so the bracket misses only when the
values' order is skewed, and the bracket keeps about a tenth of the values."""


def kth_smallest(values: Sequence[int], k: int) -> int:
    """The ``k``-th smallest of ``values`` (0-based), exactly, without sorting them all.

    Sorting a million-item run's waits took a twentieth of the run, for three ranks. Instead a
    strided sample brackets the rank, one pass counts the values below the bracket and keeps those
    inside it, and only those are sorted. When the bracket misses the rank (the sample did not
    represent the values: say, they repeat with the stride's period), all of them are sorted, so
    the answer is always the one ``sorted(values)[k]`` gives.
    """
    n = len(values)
    if not 0 <= k < n:
        raise IndexError(f"rank {k} of {n} values")
    if k == n - 1:
        return max(values)
    if k == 0:
        return min(values)
    if n <= 4 * _SAMPLE:
        return sorted(values)[k]
    sample = sorted(values[:: n // _SAMPLE])
    at = k * len(sample) // n
    lo = sample[max(0, at - _MARGIN)]
    hi = sample[min(len(sample) - 1, at + _MARGIN)]
    below = sum(map(operator.lt, values, itertools.repeat(lo)))
    inside = [v for v in values if lo <= v <= hi]
    if below <= k < below + len(inside):
        inside.sort()
        return inside[k - below]
    return sorted(values)[k]


def batch_line(batch: Batch) -> str:
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


def render_table(reports: Iterable[SimReport], width: int = 10_000) -> str:
    """A human table: one column per policy (per policy and batching mode when the run chose modes),
    in parts that fit ``width`` (processor/sim/columns.py)."""
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
        *(  # a trace with adapters: how many batches a baseline's multi-LoRA server ran mixed
            [("mixed-adapter batches", lambda r: f"{r.mixed_adapter_batches:,}")]
            if any(r.adapters for r in reports)
            else []
        ),
        ("shape switches", lambda r: f"{r.shape_switches:,}"),
        ("cache hit rate", lambda r: f"{r.cache_hit_rate:.1%}"),
        ("lanes in use (peak)", lambda r: f"{r.lanes_in_use_peak:,}"),
        ("lane pressure (peak)", lambda r: f"{r.lane_pressure_peak:.3f}"),
        ("lane reuses / new lanes", lambda r: f"{r.lane_reuses:,} / {r.new_lanes:,}"),
        ("oversized", lambda r: f"{r.oversized:,}"),
        (
            "wait p50 / p99 / max ms",
            lambda r: (
                f"{r.wait_percentile(0.5):,} / {r.wait_percentile(0.99):,} / {r.wait_percentile(1.0):,}"
            ),
        ),
        ("makespan (virtual s)", lambda r: f"{r.makespan_ms / 1000:,.1f}"),
        ("tokens/s (virtual)", lambda r: f"{r.tokens_per_s:,.0f}"),
    ]
    rows += _job_rows(reports)
    if any(f.memory_bytes for r in reports for f in r.consumers.values()):
        rows += [
            ("KV bytes peak / memory_bytes", lambda r: f"{r.kv_peak_fill:.1%}"),
            ("batches over memory_bytes", lambda r: f"{r.over_memory:,}"),
        ]
    table = [["", *(r.label for r in reports)], *([name, *(fmt(r) for r in reports)] for name, fmt in rows)]
    return "\n".join(fitted(table, width))


def _job_rows(reports: list[SimReport]) -> list[tuple[str, Callable[[SimReport], str]]]:
    """Per-job rows, when a run had more than one job: tokens, and first batch / done after arrival."""
    names = sorted({job for r in reports for job in r.jobs})
    if len(names) < 2:
        return []

    def cell(job: str, what: str) -> Callable[[SimReport], str]:
        def fmt(r: SimReport) -> str:
            f = r.jobs.get(job)
            if f is None:
                return "-"
            if what == "tokens":
                return f"{f.real_tokens:,} (w {f.weight:g})"
            start = f.first_arrival_ms or 0
            first = "-" if f.first_dispatch_ms is None else f"{(f.first_dispatch_ms - start) / 1000:,.1f}"
            return f"{first} / {(f.done_ms - start) / 1000:,.1f}"

        return fmt

    rows: list[tuple[str, Callable[[SimReport], str]]] = []
    for job in names:
        label = job or "(no job)"
        rows.append((f"job {label}: tokens", cell(job, "tokens")))
        rows.append((f"job {label}: first / done s", cell(job, "times")))
    return rows
