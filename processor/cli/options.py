"""Options several commands share, declared once so they read and fail the same way everywhere."""

from __future__ import annotations

import argparse
import re

from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings
from processor.kafka.config import ConfigError
from processor.kafka.topics import DEFAULT_PREFIX, TopicNames
from processor.kafka.watchdog import CallWatchdog

_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def add_kafka_arguments(p: argparse.ArgumentParser) -> None:
    """``--bootstrap``, ``--kafka-config``, ``--topic-prefix`` (see processor.kafka.config)."""
    p.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP or the local broker)",
    )
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka properties file (security settings, overrides of the defaults)",
    )
    p.add_argument(
        "--topic-prefix",
        default=DEFAULT_PREFIX,
        metavar="P",
        help=f"topic names start with P (default: {DEFAULT_PREFIX})",
    )


def kafka_settings(args: argparse.Namespace, *, reach: bool = False) -> tuple[dict[str, str], TopicNames]:
    """The client config and topic names the Kafka options ask for; raises ``ConfigError``.

    ``reach``: a short command first checks that the cluster answers, and raises
    :class:`~processor.kafka.reach.BrokerUnreachable` (one line, exit 69, from :func:`main`) if not.
    """
    from processor.kafka.config import client_config
    from processor.kafka.reach import probe
    from processor.local.broker import local_bootstrap

    if not _PREFIX.match(args.topic_prefix):
        raise ConfigError(
            f"--topic-prefix {args.topic_prefix!r}: 1-100 of A-Z a-z 0-9 . _ - (it starts each topic name)"
        )
    conf = client_config(args.bootstrap, args.kafka_config, fallback=local_bootstrap)
    if reach:
        probe(conf)
    return conf, TopicNames(args.topic_prefix)


def add_trace_reading_arguments(p: argparse.ArgumentParser) -> None:
    """How a trace file becomes items (shared by ``simulate`` and ``produce``)."""
    p.add_argument(
        "--shape-blocks",
        type=int,
        default=1,
        help="mooncake: leading hash ids that make the shape (default: 1)",
    )
    p.add_argument("--model", default="default", help="model of mooncake/azure items (default: default)")
    p.add_argument("--limit", type=int, default=None, help="take only the first N items of the trace")


def add_lane_arguments(p: argparse.ArgumentParser) -> None:
    d = LaneSettings()
    g = p.add_argument_group("lanes (docs/lanes.md)")
    g.add_argument("--lane-budget", type=int, default=d.lane_budget, help="lanes per (model, shape)")
    g.add_argument("--floor-tokens", type=int, default=d.floor_tokens, help="padding that never opens a lane")
    g.add_argument(
        "--cap-tokens", type=int, default=d.cap_tokens, help="padding never accepted while a lane can open"
    )
    g.add_argument("--start-ratio", type=float, default=d.start_ratio, help="threshold/length with no lanes")
    g.add_argument(
        "--full-ratio", type=float, default=d.full_ratio, help="threshold/length with the budget full"
    )
    g.add_argument("--idle-ms", type=int, default=d.idle_ms, help="empty lanes go quiet after this long")
    g.add_argument(
        "--lane-pad-multiple",
        type=int,
        default=d.pad_multiple,
        help="rounding used to measure padding when choosing a lane (1 for consumers that pad to 1)",
    )
    g.add_argument(
        "--max-wait-ms",
        type=int,
        default=DispatchSettings().max_wait_ms,
        help="an item waiting this long overrides shape stickiness",
    )


def lanes_from(args: argparse.Namespace) -> tuple[LaneSettings, DispatchSettings]:
    """Raises ValueError naming the bad setting."""
    lanes = LaneSettings(
        lane_budget=args.lane_budget,
        floor_tokens=args.floor_tokens,
        cap_tokens=args.cap_tokens,
        start_ratio=args.start_ratio,
        full_ratio=args.full_ratio,
        idle_ms=args.idle_ms,
        pad_multiple=args.lane_pad_multiple,
    )
    return lanes, DispatchSettings(max_wait_ms=args.max_wait_ms)


def add_watchdog_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stuck-exit-s",
        type=float,
        default=180.0,
        help="exit with code 75 when a transaction commit blocks this long, so the supervisor restarts "
        "the process (works around librdkafka#5456; default: 180; 0 disables)",
    )


def watchdog_from(args: argparse.Namespace) -> CallWatchdog | None:
    """The process's watchdog, or None when disabled; ValueError names the flag when it is bad."""
    if args.stuck_exit_s < 0:
        raise ValueError(f"--stuck-exit-s must be >= 0 (0 disables), got {args.stuck_exit_s:g}")
    return CallWatchdog(args.stuck_exit_s) if args.stuck_exit_s else None
