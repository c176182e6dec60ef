"""Dispatch cost per batch against the number of consumer contracts: 1 to 256 cards of one model.

    python benchmarks/bench_consumers.py                 # 1, 4, 16, 64, 256 consumers
    python benchmarks/bench_consumers.py --consumers 1 256 --batches 5000 --json OUT.json
    python benchmarks/bench_consumers.py --smoke         # small, for CI: the figures exist

A busy fleet, as the processor sees one: every consumer holds its ``max_inflight`` batches, and each
loop round one batch is answered (the oldest) and ``dispatch`` runs, so it must find the one free slot
among all the consumers' and fill it. Items wait all along (20,000 of 8 shapes, refilled as they
go), so every round can emit. Per batch: CPU microseconds (``time.process_time``, noisy on a shared
machine) and Python calls made (cProfile's count, which the machine's load does not move): flat
from 1 to 256 consumers means a consumer costs nothing while it is busy. The core alone (what the
simulator drives); the pipeline's drainer announces one contract (bench_pipeline.py).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import consumer_sweep_args, write_json

from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.core.scheduler import Scheduler

WAITING = 20_000
SHAPES = 8
MAX_INFLIGHT = 2


def fleet(consumers: int) -> Scheduler:
    sched = Scheduler(batch_prefix="bench")
    for n in range(consumers):
        sched.set_contract(
            Contract(
                f"gpu-{n:03d}",
                "m",
                budget_tokens=4_096,
                max_items=16,
                pad_multiple=8,
                max_inflight=MAX_INFLIGHT,
            )
        )
    return sched


def refill(sched: Scheduler, next_id: int, now_ms: int) -> int:
    """Items up to ``WAITING`` waiting again; returns the next item number."""
    short = WAITING - sched.view.waiting().items
    if short <= 0:
        return next_id
    items = [Item(f"i{n}", "m", n % SHAPES, 100 + n % 157, now_ms) for n in range(next_id, next_id + short)]
    sched.submit_many(items, [now_ms] * len(items))
    return next_id + short


def run(consumers: int, batches: int, meter: str) -> float:
    """``meter`` ("cpu" or "calls") per batch, over ``batches`` rounds of answer-one, dispatch."""
    sched = fleet(consumers)
    next_id = refill(sched, 0, 0)
    held: deque[Batch] = deque(sched.dispatch(0))  # every consumer's slots filled
    now = 1
    made = 0
    profile = cProfile.Profile() if meter == "calls" else None
    cpu = 0.0
    while made < batches:
        next_id = refill(sched, next_id, now)  # untimed: the ingest side
        t0 = time.process_time()
        if profile is not None:
            profile.enable()
        oldest = held.popleft()
        sched.complete(oldest.batch_id, now)
        out = sched.dispatch(now)
        if profile is not None:
            profile.disable()
        cpu += time.process_time() - t0
        held.extend(out)
        made += len(out)
        now += 1
    sched.check(deep=True)
    if profile is not None:
        return pstats.Stats(profile).total_calls / made  # type: ignore[attr-defined, no-any-return]
    return cpu * 1e6 / made


def main(argv: list[str] | None = None) -> int:
    args = consumer_sweep_args(__doc__, 20_000, ([1, 64], 500), argv)
    rows = []
    print("| consumers | CPU us/batch | Python calls/batch |")
    print("| ---: | ---: | ---: |")
    for n in args.consumers:
        row = {
            "consumers": n,
            "cpu_us_per_batch": run(n, args.batches, "cpu"),
            "calls_per_batch": run(n, args.batches, "calls"),
        }
        rows.append(row)
        print(f"| {n} | {row['cpu_us_per_batch']:.1f} | {row['calls_per_batch']:.1f} |", flush=True)
    write_json(args.json, {"batches": args.batches, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
