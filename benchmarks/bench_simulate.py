"""``tokenfabric simulate`` end to end against a plain Python FIFO packer reading the same file.

    python benchmarks/bench_simulate.py                    # 1,000,000 items, 3 repetitions
    python benchmarks/bench_simulate.py --items 50000 --reps 1 --json FILE

The trace is :func:`processor.sim.tracegen.synthetic_records` (64 Zipf shapes, log-normal lengths of
16..8,000 tokens, Poisson arrivals at 1,000/s: the default cards fall behind, so lanes fill), written
once in the native ``jsonl`` format. Each repetition runs, one after the other and each in a child
process of its own (one interpreter, one core):

* ``simulate``: ``python -m processor simulate --trace FILE`` (read, schedule with the default two
  cards in virtual time, print the report);
* ``plain``: this script's ``--plain FILE``: ``json.loads`` per line, one FIFO per model, batches cut
  in arrival order to the same two contracts taking turns, and a one-line summary. No shapes, no
  lanes, no virtual time: the floor a Python program reading the file pays.

Reported: items per CPU second (the child's user + system time, ``resource.getrusage``) of each,
medians over repetitions, and their ratio. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTRACTS = ((16_384, 64), (32_768, 128))  # the simulator's default card16 and card32
PAD = 8


def plain(path: str) -> int:
    """The plain packer: FIFO per model, batches cut while ``n x round_up(longest) <= budget``."""
    queues: dict[str, deque[int]] = {}
    items = batches = padded = real = 0
    turn = 0
    with open(path, "rb") as f:
        for line in f:
            obj = json.loads(line)
            q = queues.get(obj["model"])
            if q is None:
                q = queues[obj["model"]] = deque()
            q.append(obj["length"])
            items += 1
            budget, max_items = CONTRACTS[turn]
            while len(q) >= max_items:
                longest = n = 0
                while q and n < max_items:
                    m = max(longest, q[0])
                    if (n + 1) * (-(-m // PAD) * PAD) > budget and n:
                        break
                    real += q.popleft()
                    longest, n = m, n + 1
                padded += n * (-(-longest // PAD) * PAD)
                batches += 1
                turn = 1 - turn
                budget, max_items = CONTRACTS[turn]
    for q in queues.values():
        while q:
            real += q.popleft()
            batches += 1
    waste = (padded - real) / max(padded, 1)
    print(f"plain FIFO: {items:,} items, {batches:,} batches, padding waste {waste:.3%}")
    return 0


def child_cpu(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process run to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=1_000_000, help="trace size (default: 1,000,000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions, alternating (default: 3)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--plain", metavar="TRACE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plain:
        return plain(args.plain)
    if args.items < 1 or args.reps < 1:
        p.error("--items and --reps must be >= 1")

    from processor.sim.tracegen import synthetic_records, write_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        records = synthetic_records(
            args.items, seed=args.seed, shapes=64, min_len=16, max_len=8000, rate_per_s=1000.0
        )
        write_jsonl(records, trace)
        del records
        commands = {
            "simulate": [sys.executable, "-m", "processor", "simulate", "--trace", str(trace)],
            "plain": [sys.executable, str(Path(__file__).resolve()), "--plain", str(trace)],
        }
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        wall: dict[str, list[float]] = {name: [] for name in commands}
        for rep in range(args.reps):
            order = list(commands) if rep % 2 == 0 else list(reversed(commands))
            for name in order:
                c, w = child_cpu(commands[name])
                cpu[name].append(c)
                wall[name].append(w)

    rate = {name: args.items / statistics.median(v) for name, v in cpu.items()}
    ratio = statistics.median(cpu["simulate"]) / statistics.median(cpu["plain"])
    print("## tokenfabric simulate against a plain FIFO packer, same file\n")
    print(f"- trace: {args.items:,} synthetic items (jsonl), seed {args.seed}; {args.reps} repetitions")
    print("- rates: items / child CPU second (user + system), medians\n")
    print("| program | CPU s (median) | wall s (median) | items/s |")
    print("|---|---:|---:|---:|")
    for name in commands:
        print(
            f"| {name} | {statistics.median(cpu[name]):.2f} | {statistics.median(wall[name]):.2f} "
            f"| {rate[name]:,.0f} |"
        )
    print(f"\nsimulate / plain: **{ratio:.2f}x** CPU")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"items": args.items, "cpu_s": cpu, "wall_s": wall, "ratio": ratio}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
