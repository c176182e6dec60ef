"""``tokenfabric plain-queue``: one card of the plain Kafka queue baseline (processor.apps.plainqueue).

A baseline for ``tokenfabric demo`` and the benchmarks, not a way to run tokenfabric: the cards join
one consumer group on the ingest topic and each packs what it reads in arrival order under its
contract. Exit status: 0 after a clean stop (SIGTERM/SIGINT or ``--idle-exit-s``); 2 for bad arguments
or Kafka settings; 1 when Kafka fails at run time.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import TYPE_CHECKING

from processor.cli.logs import add_log_arguments, setup_logging
from processor.cli.options import (
    SIM_FLAGS,
    add_kafka_arguments,
    engine_options,
    install_stop_handlers,
    kafka_settings,
)
from processor.engines.base import ENGINES

if TYPE_CHECKING:
    from processor.apps.plainqueue import PlainQueueApp

PROG = "tokenfabric plain-queue"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", help="card id (required): names its transactional id and its completions")
    p.add_argument("--model", help="the model this card serves (required)")
    p.add_argument("--budget", type=int, help="padded tokens per batch (required)")
    p.add_argument("--items", type=int, help="most items per batch (required)")
    p.add_argument("--pad", type=int, default=8, help="pad multiple (default: 8)")
    p.add_argument(
        "--linger-ms",
        type=float,
        default=50.0,
        help="close a batch after this long idle (default: %(default)s)",
    )
    p.add_argument("--engine", default="sim", choices=sorted(ENGINES), help="engine (default: sim)")
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE", help="an engine option")
    sim = p.add_argument_group("sim engine (as tokenfabric consumer)")
    for flag in SIM_FLAGS:
        sim.add_argument(f"--{flag.replace('_', '-')}", help=f"sim engine option {flag}")
    p.add_argument("--idle-exit-s", type=float, help="exit after S seconds without an item")
    add_log_arguments(p)
    add_kafka_arguments(p)


def run(args: argparse.Namespace) -> int:
    from processor.apps.plainqueue import PlainQueueApp

    return run_card(args, PROG, PlainQueueApp)


def run_card(args: argparse.Namespace, prog: str, app_class: type[PlainQueueApp]) -> int:
    """One baseline card (``plain-queue`` or ``share-queue``: same flags, same contract and engine)."""
    from confluent_kafka import KafkaException

    from processor.core.contract import CONSUMER_ID, Contract
    from processor.engines.base import make_engine
    from processor.kafka.config import ConfigError

    try:
        missing = [f"--{n}" for n in ("id", "model", "budget", "items") if getattr(args, n) is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)} required")
        if not CONSUMER_ID.match(args.id):
            raise ValueError(f"--id {args.id!r}: use 1-200 of A-Z a-z 0-9 . _ -")
        contract = Contract(args.id, args.model, args.budget, args.items, args.pad, 1)
        engine = make_engine(args.engine, engine_options(args))
        conf, topics = kafka_settings(args)  # last: arguments are checked before any cluster is looked for
        app = app_class(
            conf, topics, contract, engine, linger_ms=args.linger_ms, idle_exit_s=args.idle_exit_s
        )
    except (ValueError, ConfigError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    stop = threading.Event()
    install_stop_handlers(stop)
    try:
        stats = app.run(stop)
    except KafkaException as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: aborted; the unfinished batch runs again on restart", file=sys.stderr)
        return 130
    print(f"{prog.removeprefix('tokenfabric ')} {args.id}: {stats.summary()}")
    return 0
