"""Dispatch on a templated backlog: today's defaults against the first generation and the offline packer.

    python benchmarks/bench_backlog.py               # 200,000 items (about a minute)
    python benchmarks/bench_backlog.py --items 20000 --json FILE
    python benchmarks/bench_backlog.py --lanes cut_ratio=0.01,floor_tokens=0   # other settings, first row

The backlog (issue 18, section 1) is :func:`processor.sim.tracegen.templated_records`: 40 prompt
templates with Zipf(1.1) popularity, prefixes of 150-2,500 tokens, the 20 most popular on ``model-a``
and the rest on ``model-b``; each request is its template's prefix plus a user part whose length is
drawn from the Azure conversation trace's context lengths (data/traces/AzureLLMInferenceTrace_conv.csv.gz).
Every item is present at t=0. Three cards: ``a16`` (model-a, 16,384 padded tokens, 64 items, 25k
tokens/s), ``a32`` (model-a, 32,768, 128 items, 50k tokens/s) and ``b16`` (model-b, as a16); pad 8,
two in flight, 5 ms overhead, a prefix cache of 4 shapes. Each card's engine runs its batches one
after another (the simulator's virtual time), so the makespan is the last card's finish.

Rows, all through the same simulator and contracts:

* ``lanes (defaults)``: the scheduler as shipped;
* ``lanes (first generation)``: the previous defaults, ``floor_tokens=0, cap_tokens=256,
  cut=arrival, deadline=absolute, spread=False``;
* ``lanes (first generation, no deadline)``: the same with ``max_wait_ms`` beyond the makespan;
* ``oracle``: the shape-sorted offline packer (:class:`processor.sim.baselines.OraclePolicy`), which
  sorts each model's backlog by (shape, length) once and packs it in that order.

Compulsory switches: a card's first shape is free, so visiting every shape of its model once costs
``shapes - 1`` switches per card ("one per shape per card", summed); the strict lower bound is
``shapes - cards`` per model (every shape needs one visit by some card). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings
from processor.sim.report import SimReport
from processor.sim.simulator import ConsumerSpec, parse_consumer_spec, simulate
from processor.sim.tracegen import templated_records
from processor.sim.traces import TraceRecord, read_shipped

CARDS = (
    "a16:model=model-a,budget=16384,items=64,pad=8,inflight=2,tps=25000,overhead_ms=5,cache=4",
    "a32:model=model-a,budget=32768,items=128,pad=8,inflight=2,tps=50000,overhead_ms=5,cache=4",
    "b16:model=model-b,budget=16384,items=64,pad=8,inflight=2,tps=25000,overhead_ms=5,cache=4",
)
FIRST_GENERATION_LANES = LaneSettings(floor_tokens=0, cap_tokens=256, cut="arrival")
FIRST_GENERATION_DISPATCH = DispatchSettings(deadline="absolute", spread=False)
NO_DEADLINE = DispatchSettings(max_wait_ms=10**12, deadline="absolute", spread=False)
TARGETS = (
    "padding waste <= 0.30%, fill >= 0.85, cache hit >= 99.8%, switches <= 1.5x compulsory, "
    "makespan <= 1.02x oracle"
)


def backlog(n: int, seed: int) -> list[TraceRecord]:
    users = [r.length for r in read_shipped("azure_conv")]
    return templated_records(n, seed=seed, user_lengths=users)


def compulsory(records: list[TraceRecord], specs: list[ConsumerSpec]) -> tuple[int, int]:
    """("one per shape per card", the strict lower bound) for these records and cards."""
    shapes: dict[str, set[int]] = defaultdict(set)
    for r in records:
        shapes[r.model].add(r.shape)
    cards: dict[str, int] = defaultdict(int)
    for s in specs:
        cards[s.contract.model] += 1
    per_card = sum(len(shapes[s.contract.model]) - 1 for s in specs)
    bound = sum(max(0, len(shapes[m]) - c) for m, c in cards.items())
    return per_card, bound


def lane_settings(text: str | None) -> LaneSettings | None:
    """``KEY=VALUE,...`` of :class:`LaneSettings` fields (numbers or ``cut``'s word), or None."""
    if not text:
        return None
    fields: dict[str, Any] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        fields[key] = value if key == "cut" else float(value) if "." in value else int(value)
    return LaneSettings(**fields)


def runs(
    records: list[TraceRecord], specs: list[ConsumerSpec], ours: LaneSettings | None = None
) -> list[tuple[str, SimReport, float]]:
    out = []
    for label, policy, lanes, dispatch in (
        ("lanes (defaults)" if ours is None else "lanes (--lanes)", "lanes", ours, None),
        ("lanes (first generation)", "lanes", FIRST_GENERATION_LANES, FIRST_GENERATION_DISPATCH),
        ("lanes (first generation, no deadline)", "lanes", FIRST_GENERATION_LANES, NO_DEADLINE),
        ("oracle (shape-sorted offline)", "oracle", None, None),
    ):
        t0 = time.process_time()
        report = simulate(records, specs, policy, backlog=True, lanes=lanes, dispatch=dispatch)
        out.append((label, report, time.process_time() - t0))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=200_000, help="backlog size (default: 200,000)")
    p.add_argument("--seed", type=int, default=1, help="trace seed (default: 1)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--lanes", metavar="K=V,...", help="LaneSettings of the first row (default: the defaults)")
    args = p.parse_args(argv)
    if args.items < 1:
        p.error(f"--items must be >= 1, got {args.items}")
    records = backlog(args.items, args.seed)
    specs = [parse_consumer_spec(s) for s in CARDS]
    per_card, bound = compulsory(records, specs)
    try:
        ours = lane_settings(args.lanes)
    except (TypeError, ValueError) as exc:
        p.error(f"--lanes {args.lanes!r}: {exc}")
    results = runs(records, specs, ours)
    oracle_ms = results[-1][1].makespan_ms

    print("## Templated backlog: dispatch against the offline packer\n")
    models = defaultdict(int)
    for r in records:
        models[r.model] += 1
    print(
        f"- backlog: {len(records):,} items, {sum(r.length for r in records):,} tokens, seed {args.seed}, "
        + ", ".join(f"{m} {n:,} items" for m, n in sorted(models.items()))
    )
    cards = ", ".join(f"{c.consumer} ({c.model}, {c.budget_tokens:,})" for c in (s.contract for s in specs))
    print(f"- cards: {cards}, pad 8, cache 4 shapes (see the docstring)")
    print(f"- compulsory switches: {per_card} (one per shape per card), lower bound {bound}")
    print(f"- targets: {TARGETS}\n")
    print(
        "| policy | padding waste | budget fill | cache hit | shape switches | / compulsory | lanes opened "
        "| batches | makespan s | / oracle | CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    payload: dict[str, Any] = {"items": len(records), "compulsory": per_card, "lower_bound": bound}
    rows: dict[str, Any] = {}
    payload["rows"] = rows
    for label, r, cpu in results:
        print(
            f"| {label} | {r.padding_waste:.3%} | {r.budget_fill:.3f} | {r.cache_hit_rate:.2%} "
            f"| {r.shape_switches} | {r.shape_switches / per_card:.2f}x | {r.new_lanes:,} | {r.batches:,} "
            f"| {r.makespan_ms / 1000:,.1f} | {r.makespan_ms / oracle_ms:.4f} | {cpu:.1f} |"
        )
        rows[label] = {
            "padding_waste": r.padding_waste,
            "budget_fill": r.budget_fill,
            "cache_hit_rate": r.cache_hit_rate,
            "shape_switches": r.shape_switches,
            "new_lanes": r.new_lanes,
            "batches": r.batches,
            "makespan_ms": r.makespan_ms,
            "makespan_vs_oracle": r.makespan_ms / oracle_ms,
        }
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
