"""Token shares between jobs: a small job submitted behind a large backlog of the same model.

The scenario of issue 18 section 2: a backlog of ``--backlog-items`` items (job ``backlog``, all at
t=0) and a job of ``--job-items`` items (job ``small``) arriving ``--arrive-s`` later, on two cards
of one model (the simulator's default 16 GB and 32 GB cards). For each weight of the small job and
each ``slack_tokens`` it prints, side by side with jobs switched off (every item of job ""):

- when the small job's first batch went out and when it was done, after its arrival;
- its *fair-share time*: its tokens over (its weight's fraction x the fleet's token rate), the
  fleet's rate being the run's own (completed tokens / makespan); and done / fair-share time
  (target <= 2);
- the backlog's share of the tokens routed while the small job was in the system (target >= 30%);
- shape switches, cache hit rate and padding waste of the whole run, the cost of sharing.

Run: ``python benchmarks/bench_shares.py`` (about a minute per row on one core). Figures in
docs/shares.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from msgspec.structs import replace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from processor.core.shares import JobPolicy, Shares, ShareSettings  # noqa: E402
from processor.sim.report import SimReport  # noqa: E402
from processor.sim.simulator import DEFAULT_CONSUMERS, parse_consumer_spec, simulate  # noqa: E402
from processor.sim.tracegen import synthetic_records, synthetic_shape  # noqa: E402
from processor.sim.traces import TraceRecord  # noqa: E402


def scenario(backlog_items: int, job_items: int, arrive_ms: int, shared_shapes: bool) -> list[TraceRecord]:
    """The backlog (40 Zipf shapes) at t=0 and the small job at ``arrive_ms``; with ``shared_shapes``
    the small job draws from the backlog's shapes, else from 4 shapes of its own."""
    common = {"min_len": 64, "max_len": 8192, "rate_per_s": None}
    backlog = synthetic_records(backlog_items, seed=1, shapes=40, **common)
    small = synthetic_records(job_items, seed=2, shapes=40 if shared_shapes else 4, **common)
    own = {synthetic_shape(k): synthetic_shape(1000 + k) for k in range(4)}  # shapes no backlog item has
    out = [replace(r, job="backlog") for r in backlog]
    for i, r in enumerate(small):
        shape = r.shape if shared_shapes else own[r.shape]
        out.append(
            replace(r, job="small", t_ms=arrive_ms, id=f"s{i}", shape=shape, line=backlog_items + i + 1)
        )
    return out


def measure(records: list[TraceRecord], shares: Shares | None, weight: float) -> dict[str, float]:
    consumers = [parse_consumer_spec(s) for s in DEFAULT_CONSUMERS]
    r: SimReport = simulate(records, consumers, "lanes", shares=shares)
    small, backlog = r.jobs["small"], r.jobs["backlog"]
    arrive = small.first_arrival_ms or 0
    rate = r.tokens_per_s
    fraction = weight / (weight + 1)
    fair_s = small.real_tokens / (fraction * rate)
    done_s = (small.done_ms - arrive) / 1000
    window = (arrive, small.done_ms)
    mine = backlog.tokens_between(*window)
    theirs = small.tokens_between(*window)
    return {
        "first_s": ((small.first_dispatch_ms or 0) - arrive) / 1000,
        "done_s": done_s,
        "fair_s": fair_s,
        "ratio": done_s / fair_s,
        "backlog_share": mine / (mine + theirs) if mine + theirs else 0.0,
        "switches": r.shape_switches,
        "cache": r.cache_hit_rate,
        "waste": r.padding_waste,
        "makespan_s": r.makespan_ms / 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backlog-items", type=int, default=120_000)
    p.add_argument("--job-items", type=int, default=3_000)
    p.add_argument("--arrive-s", type=float, default=120.0)
    p.add_argument("--weights", default="1,4")
    p.add_argument("--slacks", default="65536")
    p.add_argument("--shared-shapes", action="store_true", help="the small job uses the backlog's shapes")
    a = p.parse_args()
    records = scenario(a.backlog_items, a.job_items, int(a.arrive_s * 1000), a.shared_shapes)
    small_tokens = sum(r.length for r in records if r.job == "small")
    print(
        f"backlog {a.backlog_items:,} items, small job {a.job_items:,} items / {small_tokens:,} tokens "
        f"arriving at {a.arrive_s:g} s, shapes {'shared' if a.shared_shapes else 'its own'}, two cards"
    )
    print()
    print(
        "| run | weight | slack | first batch s | done s | fair-share s | done / fair | backlog share "
        "| switches | cache hits | padding waste | makespan s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows: list[tuple[str, float, int | None, Shares | None]] = [("no shares (one job)", 1.0, None, None)]
    for w in (float(x) for x in a.weights.split(",")):
        for slack in (int(x) for x in a.slacks.split(",")):
            shares = Shares(ShareSettings(slack_tokens=slack))
            shares.set_policy("small", JobPolicy(weight=w))
            rows.append(("shares", w, slack, shares))
    for label, w, slack, shares in rows:
        recs = records if shares is not None else [replace(r, job="") for r in records]
        m = measure_unshared(recs, records) if shares is None else measure(recs, shares, w)
        print(
            f"| {label} | {w:g} | {'-' if slack is None else f'{slack:,}'} | {m['first_s']:,.1f} | "
            f"{m['done_s']:,.1f} | {m['fair_s']:,.1f} | {m['ratio']:.2f} | {m['backlog_share']:.1%} | "
            f"{m['switches']:,.0f} | {m['cache']:.2%} | {m['waste']:.3%} | {m['makespan_s']:,.1f} |",
            flush=True,
        )


def measure_unshared(plain: list[TraceRecord], tagged: list[TraceRecord]) -> dict[str, float]:
    """Today's behaviour: jobs unknown to the scheduler (every item of job ""); the small job's items
    are found again by id in the emitted batches."""
    import io
    import json

    consumers = [parse_consumer_spec(s) for s in DEFAULT_CONSUMERS]
    out = io.StringIO()
    r = simulate(plain, consumers, "lanes", emit=out)
    small_ids = {t.id for t in tagged if t.job == "small"}
    arrive = next(t.t_ms for t in tagged if t.job == "small")
    batches = [json.loads(line) for line in out.getvalue().splitlines()]
    first = last = None
    for b in batches:
        if any(i in small_ids for i, _ in b["items"]):
            first = b["t_ms"] if first is None else first
            last = b["t_ms"]
    tokens_small = tokens_window = 0
    for b in batches:
        if first is not None and last is not None and arrive <= b["t_ms"] <= last:
            for i, n in b["items"]:
                tokens_window += n
                tokens_small += n if i in small_ids else 0
    last_dispatch = last or 0
    rate = r.tokens_per_s
    fair_s = sum(t.length for t in tagged if t.job == "small") / (0.5 * rate)
    done_s = (last_dispatch - arrive) / 1000  # the last batch's dispatch: a lower bound on done
    return {
        "first_s": ((first or 0) - arrive) / 1000,
        "done_s": done_s,
        "fair_s": fair_s,
        "ratio": done_s / fair_s,
        "backlog_share": 1 - tokens_small / tokens_window if tokens_window else 0.0,
        "switches": r.shape_switches,
        "cache": r.cache_hit_rate,
        "waste": r.padding_waste,
        "makespan_s": r.makespan_ms / 1000,
    }


if __name__ == "__main__":
    main()
