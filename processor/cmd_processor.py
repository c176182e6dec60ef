"""``tokenfabric processor``: run the stream processor until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .cli_options import add_kafka_arguments, add_lane_arguments, kafka_settings, lanes_from


def configure(p: argparse.ArgumentParser) -> None:
    add_kafka_arguments(p)
    p.add_argument("--instance", default="processor-0", help="this instance's id (names its checkpoints)")
    p.add_argument("--group", default="tokenfabric-processor", help="ingest consumer group")
    p.add_argument(
        "--commit-interval-ms", type=int, default=1000, help="how often ingest offsets are committed"
    )
    p.add_argument(
        "--checkpoint-interval-ms", type=int, default=2000, help="how often the ledger is checkpointed"
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_lane_arguments(p)


def run(args: argparse.Namespace) -> int:
    from .kafka_config import ConfigError
    from .service import ProcessorService, ProcessorSettings

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        conf, topics = kafka_settings(args)
        lanes, dispatch = lanes_from(args)
        for name in ("commit_interval_ms", "checkpoint_interval_ms"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        settings = ProcessorSettings(
            instance=args.instance,
            group_id=args.group,
            lanes=lanes,
            dispatch=dispatch,
            commit_interval_ms=args.commit_interval_ms,
            checkpoint_interval_ms=args.checkpoint_interval_ms,
        )
    except (ConfigError, ValueError) as exc:
        print(f"tokenfabric processor: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    service = ProcessorService(conf, topics, settings)
    service.run(stop)
    c = service.counters
    logging.getLogger("tokenfabric.processor").info(
        "stopped: consumed %d, dead-lettered %d, batches %d, completions %d",
        c.consumed,
        c.dead_lettered,
        c.batches_produced,
        c.completions,
    )
    return 0
