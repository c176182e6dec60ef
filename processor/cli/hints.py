"""The next command to suggest, fitted to the path the person is on, with the flags they gave kept.

Why: a hint that names the wrong path costs a newcomer a detour. Someone running ``submit``,
``collect`` or ``jobs`` with no broker is on the jobs path (docs/jobs.md), where ``tokenfabric local
up`` starts the broker, the topics, a processor and consumers in one go; someone running
``topics create``, ``processor`` or ``consumer`` is assembling a pipeline by hand, where ``tokenfabric
kafka start`` (a broker only) fits. Either hint keeps a ``--topic-prefix`` that is not the default, so
the command suggested makes the pipeline the person asked for.
"""

from __future__ import annotations

import argparse

from processor.kafka.exits import BrokerUnreachable
from processor.kafka.topics import DEFAULT_PREFIX

#: Commands that use a running pipeline (processor and consumers included) rather than build one.
JOBS_PATH = frozenset(
    {"submit", "collect", "collector", "jobs", "cancel", "status", "audit", "produce", "share"}
)


def prefix_flag(args: argparse.Namespace) -> str:
    """`` --topic-prefix P`` when ``args`` name a prefix other than the default, else ""."""
    prefix = getattr(args, "topic_prefix", DEFAULT_PREFIX)
    return f" --topic-prefix {prefix}" if prefix != DEFAULT_PREFIX else ""


def kafka_flags(args: argparse.Namespace) -> str:
    """The cluster and pipeline flags ``args`` were given (``--bootstrap``, ``--kafka-config``, a
    ``--topic-prefix`` other than the default), to append to a suggested command: "" if none."""
    flags = [
        f" --bootstrap {args.bootstrap}" if getattr(args, "bootstrap", None) else "",
        f" --kafka-config {args.kafka_config}" if getattr(args, "kafka_config", None) else "",
        prefix_flag(args),
    ]
    return "".join(flags)


def start_command(args: argparse.Namespace) -> str:
    """What starts a cluster for this command: the whole local stack on the jobs path, else a broker."""
    if getattr(args, "command", None) in JOBS_PATH:
        return f"tokenfabric local up{prefix_flag(args)}"
    return "tokenfabric kafka start"


def create_command(args: argparse.Namespace) -> str:
    """What creates the pipeline ``args`` name: ``local up`` on the jobs path, else ``topics create``."""
    if getattr(args, "command", None) in JOBS_PATH:
        return f"tokenfabric local up{prefix_flag(args)}"
    return f"tokenfabric topics create --topic-prefix {getattr(args, 'topic_prefix', DEFAULT_PREFIX)}"


def no_cluster(args: argparse.Namespace) -> BrokerUnreachable:
    """The refusal for a command given no cluster while no local broker runs: exit 69 (README)."""
    return BrokerUnreachable(
        f"no Kafka to talk to: start one with '{start_command(args)}', "
        "or name yours with --bootstrap HOST:PORT or KAFKA_BOOTSTRAP"
    )
