"""Replay a request trace through a scheduling policy in virtual time.

Events are arrivals (from the trace, or all at t=0 for a backlog) and batch completions (each card
runs its batches one after another, ``CardModel.batch_ms`` each). After every event the policy fills
free in-flight slots. No threads, no wall clock: the same trace, consumers and seed give the same
figures on any machine, which is what makes the policy comparison in docs/ reproducible.

Adapters: an item of a trace record with an ``adapter`` is scheduled by its serving key
(``model@adapter``, processor/core/serving.py), as the processor does; a consumer serves the key its
contract names (``adapter=`` in its spec). Consumers that name one ``server=`` share one card: its
engine time and its prefix cache, which holds a prefix per adapter (a batch's cache keys are
``(serving key, shape)`` once adapters are about). The baselines model a multi-LoRA server fed by a
plain queue: they key by the base model and mix adapters in a batch (processor/sim/baselines.py).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
from collections import Counter
from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import IO

from processor.core.item import Item
from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings, Scheduler
from processor.core.serving import SEPARATOR, serving_key
from processor.core.shares import Shares
from processor.sim.baselines import FifoPolicy, OraclePolicy, SortedWindowPolicy
from processor.sim.consumer_spec import DEFAULT_CONSUMERS, ConsumerSpec, parse_consumer_spec
from processor.sim.replay import TICK_MS, Card, Policy, Replay, Server, sample, waits
from processor.sim.report import ConsumerFigures, JobFigures, SimReport
from processor.sim.traces import TraceRecord

__all__ = [
    "DEFAULT_CONSUMERS",
    "POLICIES",
    "TICK_MS",
    "ConsumerSpec",
    "Policy",
    "make_policy",
    "parse_consumer_spec",
    "simulate",
]

POLICIES = ("lanes", "fifo", "sorted-window", "oracle")

_EXACT = 1 << 53
"""Integers below this magnitude survive ``int(t / 1.0)`` unchanged (a float's 53-bit mantissa)."""


def make_policy(
    name: str,
    lanes: LaneSettings | None = None,
    dispatch: DispatchSettings | None = None,
    window: int = 1024,
    shares: Shares | None = None,
) -> Policy:
    if name == "lanes":
        return Scheduler(lanes, dispatch, batch_prefix="sim", shares=shares)
    if name == "fifo":
        return FifoPolicy()
    if name == "sorted-window":
        return SortedWindowPolicy(window)
    if name == "oracle":
        return OraclePolicy()
    raise ValueError(f"--policy {name!r}: choose one of {', '.join(POLICIES)}")


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
    shares: Shares | None = None,
) -> SimReport:
    """Run ``records`` through ``policy`` with ``consumers``; returns the figures.

    Each item's output budget is the trace's ``output_length`` where it has one (memory batching
    counts it; the others ignore it). ``batching`` only labels the report. ``shares`` gives the job
    weights and quotas (the lanes policy only; the baselines ignore jobs); each run starts from a
    fresh copy of its settings and policies, so one object can configure several runs.
    """
    with _cycle_collection_paused():
        return _simulate(
            records, consumers, policy, backlog, speed, lanes, dispatch, window, seed, emit, batching, shares
        )


@contextlib.contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """A run allocates millions of objects that live until it ends (items, batches, figures) and
    makes no cyclic garbage worth collecting meanwhile, so the cyclic collector would only walk them
    again and again: about a fifth of a million-item run. It is paused for the run and back on, as
    it was, when the run ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _simulate(
    records: Sequence[TraceRecord],
    consumers: Sequence[ConsumerSpec],
    policy: str,
    backlog: bool,
    speed: float,
    lanes: LaneSettings | None,
    dispatch: DispatchSettings | None,
    window: int,
    seed: int,
    emit: IO[str] | None,
    batching: str | None,
    shares: Shares | None,
) -> SimReport:
    """The run in its steps: check the arguments, seat the consumers, lay out the arrivals, replay
    the events, then total the figures. Each step is a function of its own below."""
    if not consumers:
        raise ValueError("simulate: at least one consumer is needed")
    if speed <= 0:
        raise ValueError(f"--speed must be > 0, got {speed}")
    shares = _fresh_shares(shares)
    pol = make_policy(policy, lanes, dispatch, window, shares)
    cards, servers = _seat_consumers(consumers, pol, seed)
    keys = _served_keys(records, consumers)
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
    times, items = _arrivals(records, backlog, speed)
    report.adapters = sum(SEPARATOR in key for key in keys)
    _open_jobs(report, times, items, shares)
    replay = Replay(pol, cards, times, items, report, emit)
    now = replay.run()
    _total(report, pol, replay.scheduler, len(records))
    report.waits_ms = waits(items)
    first = times[0] if times else 0
    report.makespan_ms = max((s.free_at for s in servers.values()), default=0.0) - first
    sample(report, pol, replay.scheduler, now)
    return report


def _fresh_shares(shares: Shares | None) -> Shares | None:
    """A copy of ``shares``'s settings and job policies with none of its books, so one object can
    configure several runs."""
    if shares is None:
        return None
    fresh = Shares(shares.settings)
    for name, job_policy in shares.policies.items():
        fresh.set_policy(name, job_policy)
    return fresh


def _seat_consumers(
    consumers: Sequence[ConsumerSpec], pol: Policy, seed: int
) -> tuple[dict[str, Card], dict[str, Server]]:
    """Each consumer's card and the servers they run on, its contract given to ``pol``. A consumer
    named twice, or a server given two different cards, is an error."""
    cards: dict[str, Card] = {}
    servers: dict[str, Server] = {}
    for i, spec in enumerate(consumers):
        name = spec.contract.consumer
        if name in cards:
            raise ValueError(f"--consumer {name!r} is given twice")
        pol.set_contract(spec.contract)
        server = servers.setdefault(spec.server or name, Server(spec.card, seed * 1_000_003 + i))
        if server.card != spec.card:
            raise ValueError(f"--consumer {name!r}: server {spec.server!r} is given two different cards")
        cards[name] = Card(spec, server)
    return cards, servers


def _served_keys(records: Sequence[TraceRecord], consumers: Sequence[ConsumerSpec]) -> set[str]:
    """The serving keys of ``records``; an error if a consumer serves none of some of them."""
    models = {spec.contract.model for spec in consumers}
    keys = set(map(_serving_key, records))
    unserved = keys - models
    if unserved:
        raise ValueError(
            f"no consumer serves model(s) {', '.join(sorted(unserved))}: add a --consumer for each "
            "(with adapter=A for a model@A)"
        )
    return keys


def _arrivals(records: Sequence[TraceRecord], backlog: bool, speed: float) -> tuple[list[int], list[Item]]:
    """Each record's item and its arrival time, in time order (ties in trace order): all at 0 for a
    backlog, else the trace's times divided by ``speed``."""
    if backlog:
        times = [0] * len(records)
    else:
        times = [r.t_ms for r in records]
        if speed != 1.0 or (times and max(map(abs, times)) >= _EXACT):  # as int(t / 1.0) would give
            times = [int(t / speed) for t in times]
    items = [  # the payload, which the core never reads, is where ``run_batch`` leaves the dispatch time
        Item(r.id, _serving_key(r), r.shape, r.length, t, None, r.output_length, r.job)
        for r, t in zip(records, times, strict=True)
    ]
    if any(map(operator.gt, times, itertools.islice(times, 1, None))):  # not in time order
        order = sorted(range(len(times)), key=times.__getitem__)  # stable: ties keep trace order
        times = [times[i] for i in order]
        items = [items[i] for i in order]
    return times, items


def _open_jobs(report: SimReport, times: list[int], items: list[Item], shares: Shares | None) -> None:
    """A figures row per job, in order of its first arrival, with its weight and item count."""
    per_job = Counter(map(attrgetter("job"), items))
    first_arrival: dict[str, int] = {}
    for t, item in zip(times, items, strict=True):
        if len(first_arrival) == len(per_job):
            break
        first_arrival.setdefault(item.job, t)
    for name in sorted(per_job, key=first_arrival.__getitem__):  # in order of first arrival
        weight = shares.policy(name).weight if shares is not None else 1.0
        report.jobs[name] = JobFigures(
            weight=weight, first_arrival_ms=first_arrival[name], items=per_job[name]
        )


def _total(report: SimReport, pol: Policy, scheduler: Scheduler | None, n_records: int) -> None:
    """The run's totals once it ends: the ledger's, the consumers' sums and the lanes' stats."""
    report.items = n_records
    total = pol.view.total
    report.tokens_received = total("received").tokens
    report.tokens_routed = total("routed").tokens
    report.tokens_completed = total("completed").tokens
    report.oversized = pol.oversized
    figures = report.consumers.values()
    report.shape_switches = sum(f.shape_switches for f in figures)
    for name in _RUN_TOTALS:  # the run's totals are its consumers' sums (``run_batch`` counts per consumer)
        setattr(report, name, sum(getattr(f, name) for f in figures))
    if scheduler is not None:
        scheduler.check()
        st = scheduler.view.lanes()
        report.lane_reuses, report.new_lanes, report.idle_reclaims = st.reuses, st.new_lanes, st.idle_reclaims
        report.lanes_in_use_peak = max(report.lanes_in_use_peak, st.lanes_in_use_peak)
        report.lane_pressure_peak = st.lane_pressure_peak
    else:
        pol.check()


_RUN_TOTALS = (
    "batches",
    "padded_tokens",
    "fill_padded_tokens",
    "budget_tokens",
    "cache_hits",
    "mixed_shape_batches",
    "mixed_adapter_batches",
)


def _serving_key(record: TraceRecord) -> str:
    """The key ``record``'s item is scheduled by (the model alone for base-model work, the common case)."""
    return serving_key(record.model, record.adapter) if record.adapter else record.model
