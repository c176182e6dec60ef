"""Sizing on paper: the fleet that carries a given number of prompt tokens a day, and what breaks first.

    python benchmarks/sizing.py                          # 10^10 tokens a day, at 100 and 1,000 tokens an item
    python benchmarks/sizing.py --tokens-per-day 1e11 --tokens-per-item 1000
    python benchmarks/sizing.py --markdown               # the tables of docs/operations.md, "Sizing"

Every figure comes from a :class:`Measured` default, each with where it was measured (docs/benchmarks.md)
or said to be a model; change one with its flag. The fleet (:func:`fleet`) is the smallest that
carries the peak with each part at most ``headroom`` busy; the limits (:func:`limits`) say, for each
thing that grows with the load, at how many times this load it runs out: the smallest breaks first.
A model: nothing here is timed. tests/benchmarks/test_sizing.py checks that docs/operations.md shows
what this prints.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace

DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class Measured:
    """Per-instance figures the sizing starts from."""

    processor_items_per_s_100: float = 91_458
    """One processor, exactly-once, 100 tokens an item (docs/benchmarks.md, pipeline table, median)."""
    processor_items_per_s_1000: float = 40_089
    """The same at 1,000 tokens an item."""
    restore_items_per_s: float = 183_498
    """Waiting items a processor restores per second at a hand-back (docs/benchmarks.md, Targets:
    restore, 1,000,000 items)."""
    wire_bytes_per_token: float = 4.06
    """An ingest or batch message's bytes per prompt token (encode_token_item: 4,058 B at 1,000)."""
    gpu_tokens_per_s: float = 50_000
    """A modelled card's prompt tokens a second (processor/sim/cardmodel.py's default): a model, not
    a measurement; put your engine's own figure here."""
    broker_mb_per_s: float = 100
    """Bytes a broker takes in a second, replication included: a planning figure, not measured."""
    partitions_per_broker: int = 4_000
    """Kafka's usual guidance for partition replicas a broker leads and follows: a planning figure."""
    completion_bytes_per_item: float = 60
    """A completion's share of a results message (one ``CompletionBatch`` per batch)."""


@dataclass(frozen=True, slots=True)
class Load:
    tokens_per_day: float = 1e10
    tokens_per_item: int = 1_000
    peak_factor: float = 4.0
    """Peak over the day's mean rate."""
    headroom: float = 0.5
    """Each part at most this busy at the peak."""
    backlog_s: float = 3_600
    """The waiting work a hand-back may have to restore: this much of the peak."""
    max_inflight: int = 8
    """Batches each consumer holds (its contract)."""
    replication: int = 3
    items_per_batch: int = 16


@dataclass(frozen=True, slots=True)
class Fleet:
    peak_tokens_per_s: float
    peak_items_per_s: float
    processors: int
    partitions: int
    consumers: int
    topics: int
    topic_partitions: int
    broker_mb_per_s: float
    brokers: int
    restore_s: float


def processor_items_per_s(m: Measured, tokens_per_item: int) -> float:
    """One processor's items a second at ``tokens_per_item``: measured at 100 and 1,000, linear in
    the item's size between and beyond (log-log), never above the 100-token figure."""
    lo, hi = m.processor_items_per_s_100, m.processor_items_per_s_1000
    slope = math.log(hi / lo) / math.log(10)
    return min(lo, lo * (tokens_per_item / 100) ** slope)


def fleet(load: Load, m: Measured) -> Fleet:
    """The smallest fleet that carries ``load``'s peak with every part at most ``headroom`` busy.

    Processors: at least 2 (one may restart); partitions: 4 per processor (room to scale out without
    repartitioning), at most ``max_inflight`` so that every processor owns a slot of every consumer
    (processor/state/credits.py). Topics: the seven a pipeline makes plus one batch topic a consumer;
    the changelog has as many partitions as ingest."""
    tokens_s = load.tokens_per_day / DAY_S * load.peak_factor
    items_s = tokens_s / load.tokens_per_item
    processors = max(2, math.ceil(items_s / (processor_items_per_s(m, load.tokens_per_item) * load.headroom)))
    partitions = max(processors, min(4 * processors, max(load.max_inflight, processors)))
    consumers = math.ceil(tokens_s / (m.gpu_tokens_per_s * load.headroom))
    topics = 7 + consumers
    topic_partitions = 2 * partitions + consumers + 5
    batches_s = items_s / load.items_per_batch
    written = tokens_s * m.wire_bytes_per_token * 2 + items_s * m.completion_bytes_per_item  # ingest, batches
    written += batches_s * 200  # the changelog's records and the checkpoints: small, per batch
    mb_s = written * load.replication / 1e6
    brokers = max(load.replication, math.ceil(mb_s / (m.broker_mb_per_s * load.headroom)))
    restore_s = items_s * load.backlog_s / partitions / m.restore_items_per_s
    return Fleet(
        tokens_s,
        items_s,
        processors,
        partitions,
        consumers,
        topics,
        topic_partitions,
        mb_s,
        brokers,
        restore_s,
    )


def limits(load: Load, m: Measured) -> dict[str, float]:
    """For each limit, at how many times ``load`` it is reached, the fleet's partitions and brokers
    kept as :func:`fleet` sized them and processors and consumers added as the load grows; sorted,
    so the first breaks first.

    * restore pause: a hand-back restores a moved partition's backlog; past 60 s work stalls;
    * consumer slots: each processor must own a slot of every consumer, so processors <= max_inflight;
    * ingest partitions: one processor per partition at most;
    * results read by every processor: each reads every completion message; taken to cost what an
      item costs, the whole results stream alone fills a processor;
    * broker throughput and partition replicas: the brokers :func:`fleet` sized."""
    f = fleet(load, m)
    per_processor = processor_items_per_s(m, load.tokens_per_item) * load.headroom
    items_s = f.peak_items_per_s
    fixed = f.topic_partitions - f.consumers  # the pipeline's own; each consumer adds one
    replicas = m.partitions_per_broker * f.brokers / load.replication
    out = {
        "restore pause at a hand-back (60 s)": 60 / f.restore_s,
        "consumer slots (processors <= max_inflight)": load.max_inflight * per_processor / items_s,
        "ingest partitions (a processor each)": f.partitions * per_processor / items_s,
        "results read by every processor": per_processor * load.items_per_batch / items_s,
        "broker throughput": f.brokers * m.broker_mb_per_s * load.headroom / f.broker_mb_per_s,
        "broker partition replicas": (replicas - fixed) / f.consumers,
    }
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def fleet_table(loads: list[Load], m: Measured) -> str:
    rows = [
        ("peak prompt tokens/s", lambda f: f"{f.peak_tokens_per_s:,.0f}"),
        ("peak items/s", lambda f: f"{f.peak_items_per_s:,.0f}"),
        ("processors", lambda f: f"{f.processors}"),
        ("ingest partitions", lambda f: f"{f.partitions}"),
        ("consumers (GPUs, modelled)", lambda f: f"{f.consumers}"),
        ("topics (partitions)", lambda f: f"{f.topics} ({f.topic_partitions})"),
        ("broker MB/s in, replicated", lambda f: f"{f.broker_mb_per_s:,.1f}"),
        ("brokers", lambda f: f"{f.brokers}"),
        ("restore at a hand-back, s", lambda f: f"{f.restore_s:,.1f}"),
    ]
    fleets = [fleet(load, m) for load in loads]
    head = "| | " + " | ".join(f"{load.tokens_per_item:,} tokens/item" for load in loads) + " |"
    lines = [head, "|---|" + "---:|" * len(loads)]
    lines += [f"| {name} | " + " | ".join(show(f) for f in fleets) + " |" for name, show in rows]
    return "\n".join(lines)


def limits_table(loads: list[Load], m: Measured) -> str:
    found = [limits(load, m) for load in loads]
    head = (
        "| limit: reached at x times the load | " + " | ".join(f"{x.tokens_per_item:,}" for x in loads) + " |"
    )
    lines = [head, "|---|" + "---:|" * len(loads)]
    for name in found[0]:
        lines.append(f"| {name} | " + " | ".join(f"{f[name]:,.1f}" for f in found) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens-per-day", type=float, default=Load().tokens_per_day)
    ap.add_argument("--tokens-per-item", type=int, nargs="+", default=[100, 1_000])
    ap.add_argument("--peak-factor", type=float, default=Load().peak_factor)
    ap.add_argument("--max-inflight", type=int, default=Load().max_inflight)
    ap.add_argument("--gpu-tokens-per-s", type=float, default=Measured().gpu_tokens_per_s)
    ap.add_argument("--markdown", action="store_true", help="only the two tables, as docs/operations.md")
    args = ap.parse_args(argv)
    if args.tokens_per_day <= 0 or min(args.tokens_per_item) <= 0:
        ap.error("--tokens-per-day and --tokens-per-item must be > 0")
    m = replace(Measured(), gpu_tokens_per_s=args.gpu_tokens_per_s)
    loads = [
        Load(args.tokens_per_day, n, args.peak_factor, max_inflight=args.max_inflight)
        for n in args.tokens_per_item
    ]
    if not args.markdown:
        print(
            f"{args.tokens_per_day:.3g} prompt tokens a day, peak {args.peak_factor} x the mean (a model)\n"
        )
    print(fleet_table(loads, m))
    print()
    print(limits_table(loads, m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
