"""A pipeline's Kafka names (topics, consumer groups, transactional ids) and each topic's settings.

Every name derives from one prefix, the pipeline's name, so two pipelines can share a cluster without
fencing or reading each other: ``<prefix>.<topic>`` for topics, ``<prefix>-processor`` for the
processors' group (``<group>-<instance>`` their transactional ids, ``<group>-control-<instance>``
their control readers), ``<prefix>-consumer-<id>`` for a consumer app's group and transactional id.
The default prefix gives the names of earlier versions, so a deployed pipeline keeps its offsets.
docs/operations.md lists them for ACLs. Ingest is keyed by shape
signature, so a shape lives in one partition and processors scale out by partition. Contracts,
accounting and jobs are compacted: the latest value per key is the state, and a tombstone retires it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

DEFAULT_PREFIX = "tokenfabric"

DELIMITERS = ".-"
"""What follows the prefix in every name a pipeline owns: ``.`` in a topic's, ``-`` in a group's or a
transactional id's. An isolated prefix (:func:`unisolated`) contains neither, so the names of two
pipelines never start alike past their prefixes, and a prefixed ACL on ``<prefix>.`` or ``<prefix>-``
(processor.kafka.acls) covers only its own pipeline's names: ``teamA-`` cannot cover
``teamA-consumer-processor-p0``, because ``teamA-consumer`` is not an isolated prefix."""

_ISOLATED = re.compile(r"^[A-Za-z0-9_]{1,100}$")


def unisolated(prefix: str) -> str | None:
    """None if ``prefix`` is isolated (A-Z a-z 0-9 _), else the one line that says why not and the fix.

    Prefixes with ``.`` or ``-`` still name the pipelines that already use them (their names are
    unchanged); ``topics create`` refuses a new one and ``acls`` refuses to grant one rights.
    """
    if _ISOLATED.match(prefix):
        return None
    fix = re.sub(r"[^A-Za-z0-9_]", "_", prefix)[:100] or "p"
    return (
        f"--topic-prefix {prefix!r}: a prefix with '.' or '-' is not isolated (another pipeline's "
        f"ACLs on a shorter prefix would cover its names); use A-Z a-z 0-9 _, e.g. {fix!r}"
    )


if TYPE_CHECKING:
    from processor.kafka.factory import ClientFactory


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The names one pipeline owns on its cluster, all derived from ``prefix``."""

    prefix: str = DEFAULT_PREFIX

    @property
    def processor_group(self) -> str:
        """The processors' ingest consumer group (the default of ``--group``)."""
        return f"{self.prefix}-processor"

    def consumer_group(self, consumer: str) -> str:
        """A consumer app's group on its batch topic; also its transactional id."""
        return f"{self.prefix}-consumer-{consumer}"

    @property
    def ingest(self) -> str:
        return f"{self.prefix}.ingest"

    @property
    def results(self) -> str:
        return f"{self.prefix}.results"

    @property
    def contracts(self) -> str:
        return f"{self.prefix}.contracts"

    @property
    def accounting(self) -> str:
        return f"{self.prefix}.accounting"

    @property
    def changelog(self) -> str:
        return f"{self.prefix}.lanes-changelog"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dead-letter"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}.jobs"

    @property
    def job_shares(self) -> str:
        """Job weights and quotas (compacted, keyed by job: docs/shares.md)."""
        return f"{self.prefix}.job-shares"

    def batches(self, consumer: str) -> str:
        return f"{self.prefix}.batches.{consumer}"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    config: Mapping[str, str]
    replication_factor: int = -1
    """-1: the broker's ``default.replication.factor``."""


# Small segments so compaction keeps up with a checkpoint or changelog record per transaction.
COMPACTED = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.1",
    "segment.ms": "60000",
    "segment.bytes": str(4 * 1024 * 1024),
}
# Batches and results carry token payloads; a week of retention lets an audit replay them.
RETENTION_MS = 7 * 24 * 3600 * 1000
"""The retention ``topics create`` gives ingest, batches, results and dead letters."""
RETAINED = {"retention.ms": str(RETENTION_MS), "max.message.bytes": str(64 * 1024 * 1024)}


def topic_specs(
    names: TopicNames,
    *,
    ingest_partitions: int = 6,
    consumers: Iterable[str] = (),
    replication_factor: int = -1,
    min_insync_replicas: int | None = None,
) -> list[TopicSpec]:
    """Every topic of one pipeline. ``replication_factor`` -1 and ``min_insync_replicas`` None keep
    the broker's defaults; a production cluster wants 3 and 2, so that an acknowledged write (the
    processor's and consumers' transactions use ``acks=all``) survives the loss of one broker."""
    specs = [
        TopicSpec(names.ingest, ingest_partitions, RETAINED),
        TopicSpec(names.results, 3, RETAINED),
        TopicSpec(names.contracts, 1, COMPACTED),
        TopicSpec(names.accounting, 1, COMPACTED),
        # One changelog partition per ingest partition: a waiting item's record sits beside its shape.
        TopicSpec(names.changelog, ingest_partitions, COMPACTED),
        TopicSpec(names.dead_letter, 1, RETAINED),
        TopicSpec(names.jobs, 1, COMPACTED),
        TopicSpec(names.job_shares, 1, COMPACTED),
    ]
    specs.extend(TopicSpec(names.batches(c), 1, RETAINED) for c in consumers)
    durable = {} if min_insync_replicas is None else {"min.insync.replicas": str(min_insync_replicas)}
    return [TopicSpec(s.name, s.partitions, {**s.config, **durable}, replication_factor) for s in specs]


def create_topics(
    conf: Mapping[str, str],
    specs: Iterable[TopicSpec],
    timeout_s: float = 30.0,
    clients: ClientFactory | None = None,
) -> list[str]:
    """Create what does not exist yet; returns the names created. Existing topics are left alone.

    Returns once every named topic is in the cluster's metadata: a broker answers CreateTopics before
    its metadata cache holds the new topic, and a command run right after ``topics create`` (or a
    test's first check) must not be told the pipeline does not exist.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    from processor.kafka.factory import KAFKA

    admin = (clients or KAFKA).admin(conf)
    new = [
        NewTopic(
            s.name,
            num_partitions=s.partitions,
            replication_factor=s.replication_factor,
            config=dict(s.config),
        )
        for s in specs
    ]
    created: list[str] = []
    if not new:
        return created
    for name, future in admin.create_topics(new, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _await_metadata(admin, {t.topic for t in new}, timeout_s)
    return created


def _await_metadata(admin: Any, names: set[str], timeout_s: float, poll_s: float = 0.05) -> None:
    """Wait (at most ``timeout_s``) until every topic in ``names`` shows in metadata with a leader for
    each partition; a topic still missing then is left for the caller's own check to name."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = admin.list_topics(timeout=timeout_s).topics
        ready = all(
            n in listed and listed[n].partitions and all(p.leader >= 0 for p in listed[n].partitions.values())
            for n in names
        )
        if ready or time.monotonic() >= deadline:
            return
        time.sleep(poll_s)
