"""Dispatch cost as the number of distinct shapes grows (issue 25, part 4).

    python benchmarks/bench_shapes.py                        # 10^3 .. 10^6 shapes, 1M items each
    python benchmarks/bench_shapes.py --shapes 1000,100000 --items 100000 --json FILE

For each shape count S, ``max(--items, S)`` items with shapes ``i % S`` (every shape appears, all
equally often: the worst case for rule 3, which must pick among S waiting shapes) and log-normal
lengths go through the scheduling core and, on the same items, a plain FIFO packer
(``processor/sim/baselines.py``'s ``FifoPolicy``: one queue per model, no shapes), with two cards:

* backlog: every item submitted at t=0, then dispatch + complete until nothing waits;
* streaming: 1,000 items submitted, then dispatch + complete until nothing waits, repeated.

Reported: per-batch dispatch cost (``dispatch()`` CPU time / batches: the figure that grew linearly
with S before rule 3's order was kept, core/switch_order.py), items/s end to end (submit, dispatch and
complete), and the Python heap the scheduler holds with every item waiting, per waiting item and per
shape (``tracemalloc``: excludes the Item objects themselves, which are built before). CPU seconds are
``time.process_time()``. The ratio column is each S's per-batch dispatch cost over the smallest S's,
measured in the same run; nothing here is an assertion (issue 25's target, the largest S within 2x
of the smallest, is read off the last lines). After each timed run the packer's ledger is checked,
untimed: every item completed once, nothing waits.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.core.scheduler import Scheduler
from processor.sim.baselines import FifoPolicy, Totals
from processor.sim.tracegen import synthetic_records

CONTRACTS = (
    Contract("card16", "default", budget_tokens=16_384, max_items=64, pad_multiple=8, max_inflight=2),
    Contract("card32", "default", budget_tokens=32_768, max_items=128, pad_multiple=8, max_inflight=2),
)
CHUNK = 1_000


class Packer(Protocol):
    @property
    def view(self) -> Totals: ...  # the scheduler's view, the FIFO packer's ledger

    def check(self) -> None: ...
    def submit_many(self, items: Sequence[Item], times: Sequence[int]) -> None: ...
    def dispatch(self, now_ms: int) -> list[Batch]: ...
    def complete(self, batch_id: str, now_ms: int) -> Batch | None: ...


@dataclass
class Run:
    """One packer's pass over the items: CPU seconds in each step, and the batches it made."""

    submit_s: float = 0.0
    dispatch_s: float = 0.0
    complete_s: float = 0.0
    batches: int = 0

    @property
    def per_batch_us(self) -> float:
        return self.dispatch_s / self.batches * 1e6 if self.batches else 0.0

    def items_per_s(self, n: int) -> float:
        total = self.submit_s + self.dispatch_s + self.complete_s
        return n / total if total else float("inf")


def lanes() -> Scheduler:
    sched = Scheduler(batch_prefix="bench")
    for c in CONTRACTS:
        sched.set_contract(c)
    return sched


def fifo() -> FifoPolicy:
    policy = FifoPolicy()
    for c in CONTRACTS:
        policy.set_contract(c)
    return policy


def make_items(n: int, shapes: int, lengths: Sequence[int]) -> list[Item]:
    return [Item(str(i), "default", i % shapes, lengths[i], 0) for i in range(n)]


def drain(packer: Packer, run: Run, now_ms: int) -> int:
    """Dispatch and complete until a dispatch emits nothing (every batch completes at once)."""
    clock = time.process_time
    while True:
        t0 = clock()
        out = packer.dispatch(now_ms)
        t1 = clock()
        for b in out:
            packer.complete(b.batch_id, now_ms)
        run.dispatch_s += t1 - t0
        run.complete_s += clock() - t1
        run.batches += len(out)
        now_ms += 1
        if not out:
            return now_ms


def backlog(new: Callable[[], Packer], items: list[Item]) -> tuple[Run, Packer]:
    packer, run = new(), Run()
    t0 = time.process_time()
    packer.submit_many(items, [0] * len(items))
    run.submit_s = time.process_time() - t0
    drain(packer, run, 0)
    return run, packer


def streaming(new: Callable[[], Packer], items: list[Item]) -> tuple[Run, Packer]:
    packer, run, now = new(), Run(), 0
    for start in range(0, len(items), CHUNK):
        chunk = items[start : start + CHUNK]
        t0 = time.process_time()
        packer.submit_many(chunk, [now] * len(chunk))
        run.submit_s += time.process_time() - t0
        now = drain(packer, run, now)
    return run, packer


def held_bytes(new: Callable[[], Packer], items: list[Item]) -> int:
    """Python heap the packer holds with every item waiting (the items themselves not counted)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    packer = new()
    packer.submit_many(items, [0] * len(items))
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del packer
    return held


def verify(packer: Packer, n: int) -> None:
    """Every item completed once and nothing waits (the ledger's own check, untimed)."""
    packer.check()
    done, queued = packer.view.total("completed"), packer.view.total("queued")
    assert done.items == n and queued.items == 0, (done, queued)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shapes", default="1000,10000,100000,1000000", help="comma list of distinct shape counts"
    )
    p.add_argument("--items", type=int, default=1_000_000, help="items per run, at least one per shape")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args(argv)
    counts = [int(s) for s in args.shapes.split(",")]
    n_max = max([args.items, *counts])
    records = synthetic_records(n_max, seed=args.seed, shapes=1, min_len=16, max_len=32_000, rate_per_s=None)
    lengths = [r.length for r in records]

    print("## Dispatch cost by distinct shapes\n")
    print(f"- consumers: {', '.join(f'{c.consumer} (budget {c.budget_tokens:,})' for c in CONTRACTS)}")
    print("- CPU seconds (`time.process_time()`), one thread; memory by tracemalloc (Python heap)\n")
    print(
        "| shapes | items | run | packer | batches | dispatch us/batch | x smallest | items/s "
        "| B/waiting item | B/shape |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")
    first: dict[tuple[str, str], float] = {}
    rows: list[dict[str, object]] = []
    for shapes in counts:
        n = max(args.items, shapes)
        for packer_name, new in (("lanes", lanes), ("fifo", fifo)):
            held = held_bytes(new, make_items(n, shapes, lengths))
            for run_name, how in (("backlog", backlog), ("streaming", streaming)):
                run, packer = how(new, make_items(n, shapes, lengths))
                verify(packer, n)
                del packer
                base = first.setdefault((packer_name, run_name), run.per_batch_us)
                row = {
                    "shapes": shapes,
                    "items": n,
                    "run": run_name,
                    "packer": packer_name,
                    "batches": run.batches,
                    "dispatch_us_per_batch": run.per_batch_us,
                    "vs_smallest": run.per_batch_us / base,
                    "items_per_s": run.items_per_s(n),
                    "bytes_per_waiting_item": held / n,
                    "bytes_per_shape": held / shapes,
                }
                rows.append(row)
                print(
                    f"| {shapes:,} | {n:,} | {run_name} | {packer_name} | {run.batches:,} "
                    f"| {run.per_batch_us:.1f} | {run.per_batch_us / base:.2f} | {run.items_per_s(n):,.0f} "
                    f"| {held / n:.0f} | {held / shapes:.0f} |"
                )
    print()
    for run_name in ("backlog", "streaming"):
        lanes_rows = [r for r in rows if r["packer"] == "lanes" and r["run"] == run_name]
        print(
            f"- lanes, {run_name}: dispatch per batch at {counts[-1]:,} shapes is "
            f"{lanes_rows[-1]['vs_smallest']:.2f}x its cost at {counts[0]:,}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"shapes": counts, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
