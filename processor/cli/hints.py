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
import os
from collections.abc import Mapping

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


def cluster_flags(args: argparse.Namespace) -> str:
    """`` --bootstrap B --kafka-config F`` as far as ``args`` were given them, else ""."""
    flags = [
        f" --bootstrap {args.bootstrap}" if getattr(args, "bootstrap", None) else "",
        f" --kafka-config {args.kafka_config}" if getattr(args, "kafka_config", None) else "",
    ]
    return "".join(flags)


def kafka_flags(args: argparse.Namespace) -> str:
    """The cluster and pipeline flags ``args`` were given (``--bootstrap``, ``--kafka-config``, a
    ``--topic-prefix`` other than the default), to append to a suggested command: "" if none."""
    return cluster_flags(args) + prefix_flag(args)


def start_command(args: argparse.Namespace) -> str:
    """What starts a cluster for this command: the whole local stack on the jobs path, else a broker."""
    if getattr(args, "command", None) in JOBS_PATH:
        return f"tokenfabric local up{prefix_flag(args)}"
    return "tokenfabric kafka start"


def create_command(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> str:
    """What creates the pipeline ``args`` name: ``local up`` on the jobs path against the local
    broker; ``topics create`` (with the cluster flags given) on a cluster of one's own or by hand."""
    env = os.environ if env is None else env
    own_cluster = bool(getattr(args, "bootstrap", None) or env.get("KAFKA_BOOTSTRAP"))
    if getattr(args, "command", None) in JOBS_PATH and not own_cluster:
        return f"tokenfabric local up{prefix_flag(args)}"
    prefix = getattr(args, "topic_prefix", DEFAULT_PREFIX)
    return f"tokenfabric topics create{cluster_flags(args)} --topic-prefix {prefix}"


def no_cluster(args: argparse.Namespace) -> BrokerUnreachable:
    """The refusal for a command given no cluster while no local broker runs: exit 69 (README)."""
    return BrokerUnreachable(
        f"no Kafka to talk to: start one with '{start_command(args)}', "
        "or name yours with --bootstrap HOST:PORT or KAFKA_BOOTSTRAP"
    )
