"""``tokenfabric status``: one screen of what the pipeline holds, read from its topics."""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console, Group
from rich.table import Table

from processor.cli.options import add_kafka_arguments, kafka_settings
from processor.ops.status import StatusView, gather
from processor.wire.records import LedgerSnapshotRecord


def configure(p: argparse.ArgumentParser) -> None:
    add_kafka_arguments(p)
    p.add_argument(
        "--group", default="",
        help="the processors' ingest consumer group (default: <topic prefix>-processor)"
    )
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    p.add_argument("--interval-s", type=float, default=2.0, help="refresh interval with --watch (default: 2)")


def _ratio(num: int, den: int) -> str:
    return f"{num / den:.2%}" if den else "-"


def ledger_table(view: StatusView, title: str) -> Table:
    """Items and tokens at each stage of the ledger, summed over the processors' checkpoints."""
    t = view.total
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("items", justify="right")
    table.add_column("tokens", justify="right")
    for stage in ("received", "queued", "routed", "in_flight", "completed", "failed"):
        count = view.held if stage in ("queued", "in_flight") else t
        table.add_row(
            stage.replace("_", " "), f"{count(stage + '_items'):,}", f"{count(stage + '_tokens'):,}"
        )
    table.add_row("dead-lettered", f"{t('dead_lettered_items'):,}", "")
    return table


def _count(cp: LedgerSnapshotRecord, key: str) -> int:
    return cp.counters.get(key, 0)


def _shares(view: StatusView, consumer: str) -> str:
    """Each instance's share of the consumer's in-flight slots, when more than one instance has one."""
    shares = {
        name: cp.per_consumer[consumer]["slots"]
        for name, cp in sorted(view.checkpoints.items())
        if "slots" in cp.per_consumer.get(consumer, {})
    }
    if len(shares) < 2:
        return ""
    return " (" + " ".join(f"{name}:{n}" for name, n in shares.items()) + ")"


def render(view: StatusView) -> Group:
    t = view.total
    summary = ledger_table(view, "tokenfabric")
    padded = sum(view.consumer_total(c, "padded_tokens") for c in view.contracts)
    real = sum(view.consumer_total(c, "routed_tokens") for c in view.contracts)
    hits = sum(view.consumer_total(c, "cache_hits") for c in view.contracts)
    lookups = sum(view.consumer_total(c, "cache_lookups") for c in view.contracts)
    capacity = t("shapes") * t("lane_budget") // max(1, len(view.checkpoints))
    figures = Table(show_header=False, box=None)
    figures.add_row("padding waste", _ratio(padded - real, padded))
    figures.add_row("cache hit rate", _ratio(hits, lookups))
    figures.add_row("lanes in use", f"{t('lanes_in_use'):,} (pressure {_ratio(t('lanes_in_use'), capacity)})")
    figures.add_row("shape switches", f"{t('shape_switches'):,}")
    lag = "-" if view.ingest_lag is None else f"{view.ingest_lag:,} of {view.ingest_end:,} messages"
    figures.add_row("ingest not yet committed", lag)
    figures.add_row(
        "ingest", "PAUSED by backpressure (--max-waiting-tokens)" if t("ingest_paused") else "flowing"
    )
    figures.add_row(
        "processors",
        ", ".join(
            f"{name} ({_count(cp, 'owned_partitions')}/{_count(cp, 'ingest_partitions')} partitions)"
            for name, cp in sorted(view.checkpoints.items())
        )
        or "none has checkpointed",
    )

    per = Table(title="consumers", header_style="bold")
    for col in (
        "consumer",
        "model",
        "budget/items/pad",
        "in flight",
        "routed tokens",
        "completed tokens",
        "padding waste",
        "budget fill",
        "cache hits",
        "switches",
    ):
        per.add_column(col, justify="left" if col in ("consumer", "model") else "right")
    for name, c in sorted(view.contracts.items()):
        batches = view.consumer_total(name, "batches")
        padded_c = view.consumer_total(name, "padded_tokens")
        routed_c = view.consumer_total(name, "routed_tokens")
        per.add_row(
            name,
            c.model,
            f"{c.budget_tokens:,}/{c.max_items}/{c.pad_multiple}",
            f"{view.consumer_gauge(name, 'in_flight_batches')}/{c.max_inflight}" + _shares(view, name),
            f"{routed_c:,}",
            f"{view.consumer_total(name, 'completed_tokens'):,}",
            _ratio(padded_c - routed_c, padded_c),
            _ratio(padded_c, batches * c.budget_tokens),
            _ratio(view.consumer_total(name, "cache_hits"), view.consumer_total(name, "cache_lookups")),
            f"{view.consumer_gauge(name, 'shape_switches'):,}",
        )
    return Group(summary, figures, per)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.kafka.config import ConfigError

    try:
        if not args.interval_s > 0:
            raise ConfigError(f"--interval-s must be > 0, got {args.interval_s:g}")
        conf, topics = kafka_settings(args, reach=True)
    except ConfigError as exc:
        print(f"tokenfabric status: error: {exc}", file=sys.stderr)
        return 2
    console = Console()
    try:
        if not args.watch:
            console.print(render(gather(conf, topics, args.group)))
            return 0
        from rich.live import Live

        with Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(render(gather(conf, topics, args.group)), refresh=True)
                time.sleep(args.interval_s)
    except KafkaException as exc:
        print(f"tokenfabric status: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
