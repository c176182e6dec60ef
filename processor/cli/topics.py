"""``tokenfabric topics create``: create the topics a deployment needs, leaving existing ones alone."""

from __future__ import annotations

import argparse
import sys

from processor.cli.options import add_kafka_arguments, kafka_settings
from processor.cli.schemas import add_registry_argument
from processor.core.contract import CONSUMER_ID
from processor.kafka.config import ConfigError
from processor.kafka.pipelines import refuse_new_nested_pipeline
from processor.kafka.topics import TopicNames


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["create"], help="create: make every missing topic")
    p.add_argument(
        "--ingest-partitions",
        type=int,
        default=6,
        help="partitions of the ingest topic: the processor's unit of scale-out (default: 6)",
    )
    p.add_argument(
        "--consumer",
        action="append",
        default=[],
        metavar="ID",
        help="also create the batch topic of consumer ID (repeatable)",
    )
    p.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        help="replicas of every topic (default: the broker's default.replication.factor; production: 3)",
    )
    p.add_argument(
        "--min-insync-replicas",
        type=int,
        default=None,
        help="replicas that must hold a write before it is acknowledged "
        "(default: the broker's; production: 2)",
    )
    add_kafka_arguments(p)
    add_registry_argument(p)


def run(args: argparse.Namespace) -> int:
    prog = "tokenfabric topics"
    from confluent_kafka import KafkaException

    from processor.kafka.rdlog import with_kafka_logger
    from processor.kafka.topics import create_topics, topic_specs

    try:
        if args.ingest_partitions < 1:
            raise ConfigError(f"--ingest-partitions must be >= 1, got {args.ingest_partitions}")
        for consumer in args.consumer:
            if not CONSUMER_ID.match(consumer):
                raise ConfigError(f"--consumer {consumer!r}: a consumer id is 1-200 of A-Z a-z 0-9 . _ -")
        _check_durability(args.replication_factor, args.min_insync_replicas)
        conf, names = kafka_settings(args, reach=True)
        refuse_new_nested_pipeline(conf, names)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    specs = topic_specs(
        names,
        ingest_partitions=args.ingest_partitions,
        consumers=args.consumer,
        replication_factor=-1 if args.replication_factor is None else args.replication_factor,
        min_insync_replicas=args.min_insync_replicas,
    )
    try:
        created = set(create_topics(with_kafka_logger(conf), specs))
    except (KafkaException, TimeoutError) as exc:
        from processor.kafka.exits import refusal

        refused = refusal(exc, conf, operation="Create", resource=f"topic '{names.prefix}.*'")
        if refused is not None:
            raise refused from None  # one line and exit 77 (tokenfabric's main)
        detail = str(exc) or "no answer in 30 s"
        print(f"{prog}: error: creating topics on {conf['bootstrap.servers']}: {detail}", file=sys.stderr)
        return 1
    for spec in specs:
        state = "created" if spec.name in created else "exists "
        print(f"{state} {spec.name} ({spec.partitions} partition{'s' if spec.partitions != 1 else ''})")
    if args.registry:
        return _register(args, names)
    return 0


def _register(args: argparse.Namespace, names: TopicNames) -> int:
    """``--registry URL``: the schemas under the topics' subjects, BACKWARD (processor/cli/schemas.py)."""
    from processor.apps.schema_registry import RegistryRefused, register_schemas
    from processor.cli.schemas import print_registered, registry_settings
    from processor.wire.registry_framing import RegistryUnavailable

    try:
        settings = registry_settings(args)
        assert settings is not None, "--registry names one"
        print_registered(register_schemas(settings, names, "BACKWARD"), "BACKWARD")
    except ConfigError as exc:
        print(f"tokenfabric topics: error: {exc}", file=sys.stderr)
        return 2
    except (RegistryUnavailable, RegistryRefused) as exc:
        print(f"tokenfabric topics: error: registering the schemas: {exc}", file=sys.stderr)
        return 1
    return 0


def _check_durability(replication_factor: int | None, min_insync_replicas: int | None) -> None:
    if replication_factor is not None and replication_factor < 1:
        raise ConfigError(f"--replication-factor must be >= 1, got {replication_factor}")
    if min_insync_replicas is None:
        return
    if min_insync_replicas < 1:
        raise ConfigError(f"--min-insync-replicas must be >= 1, got {min_insync_replicas}")
    if replication_factor is not None and min_insync_replicas > replication_factor:
        raise ConfigError(
            f"--min-insync-replicas {min_insync_replicas} exceeds --replication-factor {replication_factor}: "
            "no write could ever be acknowledged"
        )
