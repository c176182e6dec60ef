"""Restore speed: how fast a restarted processor rebuilds its waiting items from Kafka.

    python benchmarks/bench_restore.py                   # 1,000,000 items of ~100 tokens, 3 restores
    python benchmarks/bench_restore.py --smoke           # 2,000 items, 1 restore
    python benchmarks/bench_restore.py --items N --tokens T --reps R

Why it matters: in exactly-once mode nothing is dispatched until ``ProcessorService.start()`` has read
the changelog to its end, read back from ingest every message a "waiting" record refers to, and put
those items back in lanes (docs/reliability.md). A processor holding a large backlog is unavailable
for that long after every restart.

The state is made the way production makes it: items of a model no consumer serves are produced to a
fresh ingest topic, a processor (``workers.py fill``, exactly-once) consumes them all, holds them
waiting, commits and stops cleanly. Then, ``--reps`` times, a fresh process times a new
``ProcessorService`` with the same instance id (``workers.py restore``) from ``start()`` until its
lanes hold every item again: fencing, reading the changelog and the ingest messages it names (timed
on its own by the processor as ``restore_seconds``), the lanes, the deep ledger check, and, where
restore waits for the group to assign the ingest partitions, that wait. The restored processor then
leaves without committing, so every repetition restores the same state.

Its ceiling, measured before each restore in a process of its own (``workers.py scan``): every message
of the same ingest topic read with the same reader (``replay.read_topic``), each value touched and
nothing decoded. The ratio ready / plain read is taken per repetition.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    RunTopics,
    Spread,
    Worker,
    delete_topics,
    make_topics,
    produce_items,
    unique,
    write_json,
)

from processor.kafka.topics import topic_specs

MODEL = "bench-unserved"
FULL_ITEMS = 1_000_000
SMOKE_ITEMS = 2_000


def bench(
    conf: dict[str, str], items: int, tokens: int, reps: int, shapes: int, timeout_s: float, log: Any = print
) -> dict[str, Any]:
    prefix = unique("bench-restore")
    topics = RunTopics(prefix)
    names = [s.name for s in topic_specs(topics)]
    make_topics(conf, topic_specs(topics))
    try:
        source = produce_items(conf, topics.ingest, items=items, tokens=tokens, model=MODEL, shapes=shapes)
        log(f"produced {items:,} items ({source.tokens:,} tokens) in {source.seconds:.1f} s (not measured)")
        common = {
            "bootstrap": conf["bootstrap.servers"],
            "prefix": prefix,
            "source": topics.ingest,
            "instance": f"{prefix}-p",
            "group": f"{prefix}-group",
            "expected": items,
            "timeout_s": timeout_s,
        }
        filled = _run(Worker("fill", common), timeout_s)
        if (filled["items"], filled["tokens"]) != (items, source.tokens):
            raise RuntimeError(f"fill: {filled['items']:,} items waiting, expected {items:,}")
        log(
            f"filled: {items:,} waiting after {filled['seconds']:.1f} s "
            f"({items / filled['seconds']:,.0f} items/s)"
        )
        restores, scans = [], []
        for rep in range(reps):
            scanned = _run(Worker("scan", common), timeout_s)
            if scanned["messages"] != items:
                raise RuntimeError(f"scan {rep + 1}: read {scanned['messages']:,} of {items:,} messages")
            scans.append(scanned)
            r = _run(Worker("restore", common), timeout_s)
            if (r["restored_items"], r["waiting_items"], r["waiting_tokens"]) != (
                items,
                items,
                source.tokens,
            ):
                raise RuntimeError(f"restore {rep + 1}: {r}")
            restores.append(r)
            log(
                f"  restore {rep + 1}: ready after {r['seconds']:.1f} s "
                f"= {items / r['seconds']:,.0f} items/s; "
                f"restore() read {r['read_seconds']:.1f} s; peak RSS {r['peak_rss_mib']:,.0f} MiB; "
                f"plain read of the ingest topic {items / scanned['seconds']:,.0f} messages/s"
            )
    finally:
        delete_topics(conf, names)
    return {
        "items": items,
        "tokens_per_item": tokens,
        "input_tokens": source.tokens,
        "fill": filled,
        "restores": restores,
        "start_items_per_s": asdict(Spread.of([items / r["seconds"] for r in restores])),
        "read_items_per_s": asdict(Spread.of([items / r["read_seconds"] for r in restores])),
        "start_cpu_us_per_item": asdict(Spread.of([r["cpu_s"] / items * 1e6 for r in restores])),
        "scan_items_per_s": asdict(Spread.of([items / s["seconds"] for s in scans])),
        "ratio_to_scan": asdict(
            Spread.of([sc["seconds"] / r["seconds"] for sc, r in zip(scans, restores, strict=True)])
        ),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in restores),
    }


def _run(worker: Worker, timeout_s: float) -> dict[str, Any]:
    try:
        return worker.result(timeout_s + 60)
    finally:
        worker.stop()


def table(result: dict[str, Any]) -> str:
    s = {k: Spread(**v) for k, v in result.items() if isinstance(v, dict) and "median" in v}
    return "\n".join(
        [
            "| waiting items | tokens/item | ready items/s (`start()` to all waiting) "
            "| `restore()` read items/s | plain read of the ingest topic, messages/s "
            "| **ready / plain read** | CPU us/item (to ready) | peak RSS MiB "
            "| fill items/s (ingest, all waiting) |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {result['items']:,} | ~{result['tokens_per_item']:,} | {s['start_items_per_s'].fmt()} "
            f"| {s['read_items_per_s'].fmt()} | {s['scan_items_per_s'].fmt()} "
            f"| **{s['ratio_to_scan'].fmt('.2f')}** | {s['start_cpu_us_per_item'].fmt('.1f')} "
            f"| {result['peak_rss_mib']:,.0f} | {result['items'] / result['fill']['seconds']:,.0f} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", help="host:port (default: $KAFKA_BOOTSTRAP or the local broker)")
    p.add_argument("--smoke", action="store_true", help=f"{SMOKE_ITEMS:,} items, one restore")
    p.add_argument("--items", type=int, help=f"waiting items (default {FULL_ITEMS:,})")
    p.add_argument("--tokens", type=int, default=100, help="tokens per item, +-10%% (default 100)")
    p.add_argument("--reps", type=int, help="restores to time (default 3; smoke 1)")
    p.add_argument("--shapes", type=int, default=8, help="shape signatures (default 8)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one step may take")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    from processor.kafka.config import client_config
    from processor.local.broker import local_bootstrap

    items = args.items or (SMOKE_ITEMS if args.smoke else FULL_ITEMS)
    reps = args.reps or (1 if args.smoke else 3)
    conf = client_config(args.bootstrap, fallback=local_bootstrap)
    result = bench(conf, items, args.tokens, reps, args.shapes, args.timeout)
    print()
    print(table(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
