"""``tokenfabric demo``: the whole pipeline on a real trace, ending in a printed report."""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from processor.cli.options import check_plot
from processor.cli.status import ledger_table
from processor.kafka.topics import TopicNames
from processor.local.pipeline import (
    DEFAULT_CARDS,
    Card,
    Pipeline,
    TopicReadback,
    child_env,
    log_dir,
    read_back,
    unique_prefix,
    wait_until_done,
)
from processor.ops.status import StatusView, gather
from processor.sim.traces import SHIPPED, TraceError, TraceRecord, read_trace, shipped_trace


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        default="mooncake_synthetic",
        help=f"a shipped trace ({', '.join(SHIPPED)}) or a file path (default: mooncake_synthetic)",
    )
    p.add_argument("--format", default=None, help="format of a trace file (shipped traces know theirs)")
    p.add_argument(
        "--shape-blocks", type=int, default=1, help="mooncake: hash ids that make a shape (default: 1)"
    )
    p.add_argument("--limit", type=int, default=2000, help="items to replay (default: 2000; 0 = all)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.02,
        help="simulated engine time multiplier (default: 0.02, i.e. cards 50x faster than modelled)",
    )
    p.add_argument("--timeout-s", type=float, default=600, help="give up after this long (default: 600)")
    p.add_argument("--bootstrap", help="use this cluster instead of starting a local broker")
    p.add_argument(
        "--plot",
        default="tokenfabric-demo.png",
        metavar="FILE.png",
        help="chart of the same trace through every policy, simulated (default: tokenfabric-demo.png; "
        "'' for none)",
    )


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        if args.trace in SHIPPED:
            path, fmt = shipped_trace(args.trace), SHIPPED[args.trace][1]
        else:
            path, fmt = Path(args.trace), args.format or "jsonl"
        records = read_trace(path, fmt, shape_blocks=args.shape_blocks, limit=args.limit or None)
        if args.plot:
            check_plot(args.plot, need_matplotlib=False)  # without it the report stands alone
    except (TraceError, ValueError) as exc:
        print(f"tokenfabric demo: error: {exc}", file=sys.stderr)
        return 2
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    state = None
    if not bootstrap:
        from processor.local.broker import start_broker

        state = log_dir() / "kafka"
        console.print("starting a local Kafka broker (the first run downloads its jars with Maven)...")
        bootstrap = start_broker(state, heap_mb=512).bootstrap
    try:
        return _run(args, console, records, path, bootstrap)
    finally:
        if state is not None:
            from processor.local.broker import stop_broker

            stop_broker(state)


def _run(args: argparse.Namespace, console: Console, records: list, path: Path, bootstrap: str) -> int:
    from processor.apps.producer import TokenProducer, synthetic_tokens
    from processor.kafka.config import client_config
    from processor.kafka.topics import TopicNames, create_topics, topic_specs

    conf = client_config(bootstrap)
    topics = TopicNames(unique_prefix())
    cards = DEFAULT_CARDS
    create_topics(conf, topic_specs(topics, consumers=[c.name for c in cards]))
    logs = log_dir()
    env = child_env(bootstrap)
    pipeline = Pipeline(logs)
    prefix = ["--topic-prefix", topics.prefix]
    # Child processes serve no metrics: the demo runs three of them side by side on one machine.
    quiet = ["--metrics-port", "0"]
    pipeline.spawn("processor", ["processor", *prefix, *quiet], env)
    model = records[0].model if records else "default"
    for card in cards:
        pipeline.spawn(card.name, ["consumer", *prefix, *quiet, *card.args(model, args.time_scale)], env)
    console.print(f"topics {topics.prefix}.*, logs in {logs}")
    started = time.monotonic()
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            produce = bar.add_task("produce ", total=len(records))
            with TokenProducer(conf, topics) as producer:
                for i, r in enumerate(records):
                    producer.send(
                        r.id,
                        r.model,
                        synthetic_tokens(r.id, r.length),
                        shape=r.shape,
                        output_budget=r.output_length,
                    )
                    if i % 256 == 0:
                        bar.update(produce, completed=i)
            bar.update(produce, completed=len(records))
            complete = bar.add_task("complete", total=len(records))
            view = wait_until_done(
                conf,
                topics,
                len(records),
                pipeline,
                args.timeout_s,
                lambda done: bar.update(complete, completed=done),
            )
        elapsed = time.monotonic() - started
    finally:
        codes = pipeline.stop()
    final = _final_view(conf, topics) or view
    back = read_back(conf, topics, cards)
    print(_report(path, records, final, back, cards, elapsed, codes))
    if args.plot:
        _plot(records, cards, model, args.plot)
    balanced = (
        final.total("received_items") == final.total("routed_items") + final.total("queued_items")
        and back.duplicates == 0
        and back.mixed_shape_batches == 0
    )
    return 0 if balanced and all(c == 0 for c in codes.values()) else 1


def _plot(records: list[TraceRecord], cards: tuple[Card, ...], model: str, path: str) -> None:
    """What the same cards would have seen under each policy, in virtual time, as one PNG."""
    from processor.sim.simulator import POLICIES, parse_consumer_spec, simulate

    specs = [parse_consumer_spec(c.spec(model)) for c in cards]
    reports = [simulate(records, specs, policy, backlog=True) for policy in POLICIES]
    try:
        from processor.sim.plots import plot_simulation

        plot_simulation(reports, path)
    except (ValueError, OSError) as exc:  # no matplotlib, or not writable: the report stands alone
        print(f"no chart: {exc}", file=sys.stderr)
        return
    print(f"chart of every policy on this trace (simulated): {path}")


def _final_view(conf: dict[str, str], topics: TopicNames) -> StatusView:
    return gather(conf, topics)


def _report(
    path: Path,
    records: list[TraceRecord],
    view: StatusView,
    back: TopicReadback,
    cards: tuple[Card, ...],
    elapsed: float,
    codes: dict[str, int | None],
) -> str:
    t = view.total
    console = Console(record=True, width=110, file=io.StringIO())
    tokens = sum(r.length for r in records)
    console.print(
        f"[bold]tokenfabric demo[/bold]: {len(records):,} items, {tokens:,} tokens from {path.name}"
    )
    console.print(ledger_table(view, "ledger (processor checkpoint)"))
    balanced = t("received_tokens") == t("routed_tokens") + t("queued_tokens") and t("routed_tokens") == t(
        "completed_tokens"
    ) + t("failed_tokens") + t("in_flight_tokens")
    console.print(
        f"balanced: {'yes' if balanced else 'NO'}   "
        f"completions read back: {sum(back.completed_ids.values()):,} "
        f"({len(back.completed_ids):,} distinct items, {back.duplicates} duplicates)"
    )
    padded = sum(back.padded_tokens.values())
    real = sum(back.real_tokens.values())
    hits = sum(view.consumer_total(c.name, "cache_hits") for c in cards)
    lookups = sum(view.consumer_total(c.name, "cache_lookups") for c in cards)
    console.print(
        f"padding waste {((padded - real) / padded if padded else 0):.3%}   "
        f"cache hit rate {(hits / lookups if lookups else 0):.1%}   "
        f"shape switches {t('shape_switches'):,}   lanes in use (peak) {t('lanes_in_use_peak'):,}   "
        f"mixed-shape batches (read back) {back.mixed_shape_batches}   "
        f"over-budget batches {back.over_budget_batches}"
    )
    console.print(
        f"throughput {back.completed_tokens / elapsed:,.0f} tokens/s, "
        f"{len(back.completed_ids) / elapsed:,.0f} items/s over {elapsed:.1f} s wall"
    )
    per = Table(title="where each card's batches went (read back from its topic)", header_style="bold")
    for col in (
        "card",
        "budget",
        "batches",
        "items",
        "real tokens",
        "padded tokens",
        "padding waste",
        "budget fill",
        "shapes",
        "exit",
    ):
        per.add_column(col, justify="left" if col == "card" else "right")
    for c in cards:
        b, p, r = back.batches[c.name], back.padded_tokens[c.name], back.real_tokens[c.name]
        per.add_row(
            c.name,
            f"{c.budget:,}",
            f"{b:,}",
            f"{back.items[c.name]:,}",
            f"{r:,}",
            f"{p:,}",
            f"{(p - r) / p if p else 0:.3%}",
            f"{p / (b * c.budget) if b else 0:.1%}",
            f"{back.shapes[c.name]:,}",
            str(codes.get(c.name)),
        )
    console.print(per)
    console.print(f"processor exit code {codes.get('processor')}; nothing left running")
    return console.export_text()
