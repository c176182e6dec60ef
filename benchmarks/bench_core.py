"""CPU cost of the scheduling core alone: lanes, dispatch and the ledger, no Kafka, no I/O, one thread.

    python benchmarks/bench_core.py             # 1,000,000 synthetic items
    python benchmarks/bench_core.py --smoke     # 20,000 items, for CI
    python benchmarks/bench_core.py --items N
    python benchmarks/bench_core.py --per-call --items 50000   # one-item submit, streaming per batch
    python benchmarks/bench_core.py --per-call --calls --items 20000   # the same, in calls made

Three measurements on the same deterministic synthetic trace (64 Zipf shapes, log-normal lengths of
16..32,000 tokens, two consumers shaped like the simulator's default 16 GB and 32 GB cards):

* backlog: every item submitted at t=0, then dispatch + complete until the lanes are empty;
* streaming: submit a chunk of 1,000 items, then dispatch + complete until the lanes are empty, repeat;
* items are submitted 1,000 at a time (``Scheduler.submit_many``), as the processor submits each
  poll's items and the simulator the arrivals between two dispatches;
* memory: the Python heap held by N waiting items, measured with ``tracemalloc`` (allocations traced
  by the interpreter; it excludes the interpreter itself and allocator slack, so RSS is higher).

``--per-call`` measures only the two per-call figures a library user pays (issue 25, part 3): CPU
microseconds per ``Scheduler.submit`` of one item (a fresh scheduler, every item at t=0), and per
batch of the streaming path (1,000 items submitted one at a time, untimed, then dispatch + complete
until nothing waits; CPU seconds of those calls over the batches they made). It uses only
``Scheduler.submit``, ``dispatch``, ``complete`` and ``tick``, so the same file runs unchanged in an
older tree (the first generation's, 96c9a12) for a side-by-side. ``--calls`` counts, instead of
CPU time, the Python-level calls those spans make (cProfile's count: Python functions and built-ins;
the profiler's own ``disable`` adds one per span, about one per 700 batches): a figure that does not
move with the machine's load, which the CPU times do.

Rates are ``time.process_time()`` CPU seconds of this process, so other load on the machine inflates
them less than wall time would. Item objects are built before each timed phase and not counted;
``check()`` runs after each phase, untimed, to prove nothing was lost.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import platform
import pstats
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.core.contract import Contract
from processor.core.item import Item
from processor.core.scheduler import Scheduler
from processor.sim.tracegen import synthetic_records
from processor.sim.traces import TraceRecord

CONTRACTS = (
    Contract("card16", "default", budget_tokens=16_384, max_items=64, pad_multiple=8, max_inflight=2),
    Contract("card32", "default", budget_tokens=32_768, max_items=128, pad_multiple=8, max_inflight=2),
)
CHUNK = 1_000
TICK_MS = 1_000


@dataclass
class Phase:
    name: str
    items: int
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.items / self.cpu_s if self.cpu_s else float("inf")


def new_scheduler() -> Scheduler:
    sched = Scheduler(batch_prefix="bench")
    for c in CONTRACTS:
        sched.set_contract(c)
    return sched


def make_items(records: Sequence[TraceRecord]) -> list[Item]:
    return [Item(r.id, r.model, r.shape, r.length, r.t_ms) for r in records]


def drain(sched: Scheduler, now_ms: int) -> tuple[int, int]:
    """Dispatch and complete until nothing waits; every round is 1 ms of scheduler time."""
    batches = 0
    while True:
        out = sched.dispatch(now_ms)
        if not out:
            return now_ms, batches
        batches += len(out)
        for b in out:
            sched.complete(b.batch_id, now_ms)
        now_ms += 1
        if now_ms % TICK_MS == 0:
            sched.tick(now_ms)


class CpuMeter:
    """CPU microseconds of the spans between ``start`` and ``stop``, summed."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.process_time()

    def stop(self) -> None:
        self.total += (time.process_time() - self._t0) * 1e6


class CallMeter:
    """Python-level calls made in the spans between ``start`` and ``stop`` (cProfile's count)."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()

    def start(self) -> None:
        self.profile.enable()

    def stop(self) -> None:
        self.profile.disable()

    @property
    def total(self) -> float:
        return float(pstats.Stats(self.profile).total_calls)  # type: ignore[attr-defined]


def per_call(records: Sequence[TraceRecord], meter: type[CpuMeter | CallMeter]) -> tuple[float, float, int]:
    """(``meter``'s figure per one-item ``submit``, per streaming batch dispatched and completed;
    batches): CPU microseconds, or calls made."""
    items = make_items(records)
    sched = new_scheduler()
    submit = sched.submit
    submits = meter()
    submits.start()
    for it in items:
        submit(it, 0)
    submits.stop()
    items = make_items(records)
    sched = new_scheduler()
    drains = meter()
    now = batches = 0
    for start in range(0, len(items), CHUNK):
        for it in items[start : start + CHUNK]:
            it.arrival_ms = now
            sched.submit(it, now)
        drains.start()
        now, b = drain(sched, now)
        drains.stop()
        batches += b
        now += 1
    verify(sched, len(items))
    return submits.total / len(items), drains.total / batches, batches


def verify(sched: Scheduler, n: int) -> None:
    sched.check()
    done = sched.view.total("completed")
    assert done.items == n and sched.view.waiting().items == 0, (done, sched.view.waiting().items)


def bench_backlog(records: Sequence[TraceRecord]) -> tuple[list[Phase], int]:
    items = make_items(records)
    sched = new_scheduler()
    t0 = time.process_time()
    for start in range(0, len(items), CHUNK):
        chunk = items[start : start + CHUNK]
        sched.submit_many(chunk, [0] * len(chunk))
    t1 = time.process_time()
    _now, batches = drain(sched, 0)
    t2 = time.process_time()
    verify(sched, len(items))
    n = len(items)
    return [
        Phase("backlog: submit", n, t1 - t0),
        Phase("backlog: dispatch + complete", n, t2 - t1),
        Phase("backlog: combined", n, t2 - t0),
    ], batches


def bench_streaming(records: Sequence[TraceRecord]) -> tuple[list[Phase], int]:
    items = make_items(records)
    sched = new_scheduler()
    submit_s = drain_s = 0.0
    now = 0
    batches = 0
    for start in range(0, len(items), CHUNK):
        chunk = items[start : start + CHUNK]
        for it in chunk:
            it.arrival_ms = now
        t0 = time.process_time()
        sched.submit_many(chunk, [now] * len(chunk))
        t1 = time.process_time()
        now, b = drain(sched, now)
        t2 = time.process_time()
        batches += b
        submit_s += t1 - t0
        drain_s += t2 - t1
        now += 1
    verify(sched, len(items))
    n = len(items)
    return [
        Phase(f"streaming ({CHUNK:,}/chunk): submit", n, submit_s),
        Phase(f"streaming ({CHUNK:,}/chunk): dispatch + complete", n, drain_s),
        Phase(f"streaming ({CHUNK:,}/chunk): combined", n, submit_s + drain_s),
    ], batches


def bench_memory(records: Sequence[TraceRecord]) -> dict[str, float]:
    """Bytes per waiting item: the Item objects (with their id strings), and the scheduler's structures."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    items = [Item(f"r{i}", r.model, r.shape, r.length, 0) for i, r in enumerate(records)]
    after_items = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    sched = new_scheduler()
    for it in items:
        sched.submit(it, 0)
    after_submit, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = len(items)
    assert sched.view.waiting().items == n
    return {
        "items": n,
        "item_b": (after_items - base) / n,
        "sched_b": (after_submit - after_items) / n,
        "sched_peak_b": (peak - after_items) / n,
        "total_mib": (after_submit - base) / 2**20,
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return (
        f"{platform.platform()} ({cpu}), {platform.python_implementation()} {platform.python_version()}, "
        f"GC {'on' if gc.isenabled() else 'off'}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=1_000_000, help="synthetic items (default: 1,000,000)")
    p.add_argument("--smoke", action="store_true", help="20,000 items: a quick run for CI")
    p.add_argument("--seed", type=int, default=1, help="trace seed (default: 1)")
    p.add_argument("--per-call", action="store_true", help="only one-item submit and streaming per batch")
    p.add_argument("--calls", action="store_true", help="with --per-call: Python calls made, not CPU time")
    args = p.parse_args(argv)
    n = 20_000 if args.smoke else args.items
    if n < 1:
        p.error(f"--items must be >= 1, got {n}")
    if args.calls and not args.per_call:
        p.error("--calls counts the --per-call figures: add --per-call")

    t = time.perf_counter()
    records = synthetic_records(n, seed=args.seed, shapes=64, min_len=16, max_len=32_000, rate_per_s=None)
    gen_s = time.perf_counter() - t
    tokens = sum(r.length for r in records)
    if args.per_call:
        unit = "calls" if args.calls else "us"
        submit_cost, batch_cost, batches = per_call(records, CallMeter if args.calls else CpuMeter)
        print(
            f"submit one item: {submit_cost:.2f} {unit}; streaming dispatch + complete: {batch_cost:.2f} "
            f"{unit} per batch"
        )
        print(f"({n:,} items, {batches:,} streaming batches, {'Python calls' if args.calls else 'CPU time'})")
        return 0

    backlog, backlog_batches = bench_backlog(records)
    streaming, streaming_batches = bench_streaming(records)
    mem = bench_memory(records)

    print("## Scheduling core benchmark\n")
    print(f"- machine: {machine()}")
    print(
        f"- trace: {n:,} synthetic items, {tokens:,} tokens, 64 shapes, seed {args.seed} "
        f"(generated in {gen_s:.1f} s wall, not counted)"
    )
    print(f"- consumers: {', '.join(f'{c.consumer} (budget {c.budget_tokens:,})' for c in CONTRACTS)}")
    print(f"- batches: backlog {backlog_batches:,}, streaming {streaming_batches:,}")
    print("- rates: items / `time.process_time()` CPU seconds, one thread\n")
    print("| phase | items | CPU s | items/s |")
    print("| --- | ---: | ---: | ---: |")
    for ph in backlog + streaming:
        print(f"| {ph.name} | {ph.items:,} | {ph.cpu_s:.2f} | {ph.rate:,.0f} |")
    print("\nMemory with every item waiting (tracemalloc: Python heap allocations, not RSS)\n")
    print("| waiting items | Item + id B/item | scheduler B/item (peak) | total MiB |")
    print("| ---: | ---: | ---: | ---: |")
    print(
        f"| {mem['items']:,} | {mem['item_b']:.0f} | {mem['sched_b']:.0f} ({mem['sched_peak_b']:.0f}) "
        f"| {mem['total_mib']:.1f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
