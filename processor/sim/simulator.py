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

import bisect
import contextlib
import gc
import heapq
import itertools
import math
import operator
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import IO, Any, Protocol

from processor.core.contract import BatchRule, Contract
from processor.core.item import Batch, Item
from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings, Scheduler
from processor.core.serving import SEPARATOR, serving_key
from processor.core.shares import Shares
from processor.sim.baselines import FifoPolicy, OraclePolicy, SortedWindowPolicy, Totals
from processor.sim.cardmodel import CardModel, CardSpec
from processor.sim.report import ConsumerFigures, JobFigures, Sample, SimReport, batch_line
from processor.sim.traces import TraceRecord

POLICIES = ("lanes", "fifo", "sorted-window", "oracle")

TICK_MS = 1000

_EXACT = 1 << 53
"""Integers below this magnitude survive ``int(t / 1.0)`` unchanged (a float's 53-bit mantissa)."""


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    contract: Contract
    card: CardSpec
    server: str = ""
    """The card this consumer shares with the others naming it ("": a card of its own): several
    adapters on one server are several consumers against it (docs/consumers.md, Adapters)."""


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
    ``default_output_tokens``, ``adapter=A`` (the one LoRA adapter of the model it serves: its
    contract's model is ``M@A``) and ``server=S`` (the card it shares with the consumers naming S).
    ``defaults`` (contract field -> value, from the command line's ``--batching`` and its numbers)
    apply where the spec does not name the key."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise ValueError(
            f"--consumer {text!r}: expected NAME:key=value,... (e.g. card16:model=default,budget=16384)"
        )
    contract_args: dict[str, Any] = {"consumer": name, "model": "default"}
    card_args: dict[str, Any] = {}
    placing = {"adapter": "", "server": ""}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"--consumer {text!r}: {part!r} is not key=value")
        try:
            if key in ("model", "batching"):
                contract_args[key] = value
            elif key in placing:
                placing[key] = value
            elif key in _INT_KEYS:
                contract_args[_INT_KEYS[key]] = int(value)
            elif key in _CARD_KEYS:
                card_args[_CARD_KEYS[key]] = int(value) if key == "cache" else float(value)
            else:
                known = ", ".join(["model", "batching", *placing, *_INT_KEYS, *_CARD_KEYS])
                raise ValueError(f"--consumer {text!r}: unknown key {key!r} (known: {known})")
        except ValueError as exc:
            if "unknown key" in str(exc):
                raise
            raise ValueError(f"--consumer {text!r}: {key}={value!r} is not a number") from None
    for key in ("model", "adapter"):
        if SEPARATOR in (contract_args if key == "model" else placing)[key]:
            raise ValueError(f"--consumer {text!r}: {key} must not contain {SEPARATOR!r}")
    contract_args["model"] = serving_key(contract_args["model"], placing["adapter"])
    base = {"budget_tokens": 16384, "max_items": 64, "pad_multiple": 8, "max_inflight": 2}
    try:
        contract = Contract(**{**base, **(defaults or {}), **contract_args})
        card = CardSpec(**card_args)
    except ValueError as exc:
        raise ValueError(f"--consumer {text!r}: {exc}") from None
    return ConsumerSpec(contract, card, placing["server"])


class Policy(Protocol):
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


class _Server:
    """A card: its cost and prefix-cache model, and when its engine is next free. Consumers that name
    one ``server`` share it (their batches run one after another on it)."""

    def __init__(self, card: CardSpec, seed: int) -> None:
        self.card = card
        self.model = CardModel(card, seed)
        self.free_at = 0.0


class _Card:
    """A consumer in the simulation: its contract, its server, and the cache keys of its last batch.

    ``kv`` is the contract's rule in memory batching when the contract gives the KV numbers, whatever
    mode it batches in: it measures every batch's KV bytes with the same rule memory batching packs by.
    """

    def __init__(self, spec: ConsumerSpec, server: _Server) -> None:
        self.spec = spec
        self.server = server
        self.last_shapes: frozenset[Hashable] | None = None
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
    if not consumers:
        raise ValueError("simulate: at least one consumer is needed")
    if speed <= 0:
        raise ValueError(f"--speed must be > 0, got {speed}")
    if shares is not None:
        fresh = Shares(shares.settings)
        for name, job_policy in shares.policies.items():
            fresh.set_policy(name, job_policy)
        shares = fresh
    pol = make_policy(policy, lanes, dispatch, window, shares)
    cards: dict[str, _Card] = {}
    servers: dict[str, _Server] = {}
    for i, spec in enumerate(consumers):
        name = spec.contract.consumer
        if name in cards:
            raise ValueError(f"--consumer {name!r} is given twice")
        pol.set_contract(spec.contract)
        server = servers.setdefault(spec.server or name, _Server(spec.card, seed * 1_000_003 + i))
        if server.card != spec.card:
            raise ValueError(f"--consumer {name!r}: server {spec.server!r} is given two different cards")
        cards[name] = _Card(spec, server)
    models = {spec.contract.model for spec in consumers}
    keys = set(map(_serving_key, records))
    unserved = keys - models
    if unserved:
        raise ValueError(
            f"no consumer serves model(s) {', '.join(sorted(unserved))}: add a --consumer for each "
            "(with adapter=A for a model@A)"
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
    if backlog:
        times = [0] * len(records)
    else:
        times = [r.t_ms for r in records]
        if speed != 1.0 or (times and max(map(abs, times)) >= _EXACT):  # as int(t / 1.0) would give
            times = [int(t / speed) for t in times]
    report.adapters = sum(SEPARATOR in key for key in keys)
    items = [  # the payload, which the core never reads, is where ``_run`` leaves the dispatch time
        Item(r.id, _serving_key(r), r.shape, r.length, t, None, r.output_length, r.job)
        for r, t in zip(records, times, strict=True)
    ]
    if any(map(operator.gt, times, itertools.islice(times, 1, None))):  # not in time order
        order = sorted(range(len(times)), key=times.__getitem__)  # stable: ties keep trace order
        times = [times[i] for i in order]
        items = [items[i] for i in order]
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
    completions: list[tuple[float, int, str]] = []
    next_arrival = 0
    next_tick = 0
    now = 0
    seq = 0
    scheduler = pol if isinstance(pol, Scheduler) else None
    # Every batch in flight has exactly one entry in ``completions``: when they fill every consumer's
    # slots, dispatch would emit nothing, so it is not asked, and the arrivals before the next
    # completion and the next tick are submitted in one run (the same batches, far fewer calls when
    # the cards are busy and arrivals keep coming).
    slots = sum(spec.contract.max_inflight for spec in consumers)
    submit_many = pol.submit_many
    n_arrivals = len(items)

    while next_arrival < n_arrivals or completions:
        t_arr = times[next_arrival] if next_arrival < n_arrivals else math.inf
        t_done = completions[0][0] if completions else math.inf
        now = math.ceil(min(t_arr, t_done))
        if t_arr <= now:
            upto = bisect.bisect_right(times, now, next_arrival)
            submit_many(items[next_arrival:upto], [now] * (upto - next_arrival))
            next_arrival = upto
        while completions and completions[0][0] <= now:
            _, _, batch_id = heapq.heappop(completions)
            pol.complete(batch_id, now)
        if now >= next_tick:
            pol.tick(now)
            _sample(report, pol, scheduler, now)
            next_tick = now + TICK_MS
        if len(completions) < slots:
            for batch in pol.dispatch(now):
                seq += 1
                done_at = _run(report, cards[batch.consumer], batch, now)
                heapq.heappush(completions, (done_at, seq, batch.batch_id))
                if emit is not None:
                    emit.write(batch_line(batch) + "\n")
        if len(completions) >= slots:  # every slot is taken until the next completion
            upto = bisect.bisect_left(times, min(math.ceil(completions[0][0]), next_tick), next_arrival)
            if upto > next_arrival:
                submit_many(items[next_arrival:upto], times[next_arrival:upto])
                next_arrival = upto

    report.items = len(records)
    total = pol.view.total
    report.tokens_received = total("received").tokens
    report.tokens_routed = total("routed").tokens
    report.tokens_completed = total("completed").tokens
    report.oversized = pol.oversized
    figures = report.consumers.values()
    report.shape_switches = sum(f.shape_switches for f in figures)
    for name in _RUN_TOTALS:  # the run's totals are its consumers' sums (``_run`` counts per consumer)
        setattr(report, name, sum(getattr(f, name) for f in figures))
    if scheduler is not None:
        scheduler.check()
        st = scheduler.view.lanes()
        report.lane_reuses, report.new_lanes, report.idle_reclaims = st.reuses, st.new_lanes, st.idle_reclaims
        report.lanes_in_use_peak = max(report.lanes_in_use_peak, st.lanes_in_use_peak)
        report.lane_pressure_peak = st.lane_pressure_peak
    else:
        pol.check()
    report.waits_ms = _waits(items)
    first = times[0] if times else 0
    report.makespan_ms = max((s.free_at for s in servers.values()), default=0.0) - first
    _sample(report, pol, scheduler, now)
    return report


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


def _waits(items: list[Item]) -> list[int]:
    """Each dispatched item's wait, from the dispatch time ``_run`` left in its ``payload``.

    Counted in arrival order once the run ends rather than as each batch leaves: an item's arrival
    time is an int object of its own, and batches take items in no order that memory likes."""
    return [it.payload - it.arrival_ms for it in items if it.payload is not None]


def _run(report: SimReport, card: _Card, batch: Batch, now: int) -> float:
    """Queue ``batch`` on its card; record its figures; return when it completes."""
    f = report.consumers[batch.consumer]
    items = batch.items
    real = 0
    for it in items:
        real += it.length
        it.payload = now  # its dispatch time: the waits are counted once the run ends (_waits)
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


def _sample(report: SimReport, pol: Policy, scheduler: Scheduler | None, now: int) -> None:
    if scheduler is not None:
        w = scheduler.view.waiting()
        report.samples.append(Sample(now, w.items, w.tokens, scheduler.view.lanes().lanes_in_use))
    else:
        report.samples.append(
            Sample(now, getattr(pol, "waiting_items", 0), getattr(pol, "waiting_tokens", 0), 0)
        )
