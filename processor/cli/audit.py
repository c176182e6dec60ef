"""``tokenfabric audit``: re-derive the ledger from the topics; exit 1 on any difference."""

from __future__ import annotations

import argparse
import sys

from processor.cli.options import add_kafka_arguments, kafka_settings
from processor.cli.schemas import add_registry_argument, framing_from


def configure(p: argparse.ArgumentParser) -> None:
    add_kafka_arguments(p)
    add_registry_argument(p)
    p.add_argument(
        "--group",
        default="",
        help="the processors' ingest consumer group (default: <topic prefix>-processor)",
    )


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.kafka.config import ConfigError
    from processor.ops.audit import audit
    from processor.wire.registry_framing import RegistryUnavailable

    try:
        conf, topics = kafka_settings(args, pipeline=True)
        framing = framing_from(args)
    except ConfigError as exc:
        print(f"tokenfabric audit: error: {exc}", file=sys.stderr)
        return 2
    from rich.console import Console

    try:
        with Console(stderr=True).status("auditing") as status:
            report = audit(conf, topics, args.group, lambda topic: status.update(f"reading {topic}"), framing)
    except (KafkaException, TimeoutError, RegistryUnavailable) as exc:
        print(f"tokenfabric audit: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    if report.undecodable_ingest and framing is None:
        print("(undecodable ingest: if its producers write registry-framed Avro, pass --registry URL)")
    return 0 if report.clean else 1
