"""What ``tokenfabric status`` reads from Kafka, as read: contracts, every instance's latest ledger
checkpoint, the ingest lag and each consumer's group (processor/ops/status.py judges it).

:func:`gather` is the one reader; :class:`StatusView` is its result, with the sums a report takes
over instances (``held`` counts a handed-over item once).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from processor.core.contract import Contract
from processor.core.ledger_keys import Scope, consumer_key, job_key, parse_key, stage_unit
from processor.kafka.factory import KAFKA
from processor.kafka.reader import passing, read_topic, reader_group, watermarks
from processor.kafka.topics import TopicNames
from processor.ops.contracts import read_announcements
from processor.wire.control import decode_ledger_snapshot
from processor.wire.records import LedgerSnapshotRecord

RETIRED = "retired_ms"
"""Counter set on a checkpoint rewritten by :func:`forget_processor`: the wall-clock time it was."""
_STAGE_NAMES = "received queued routed in_flight completed failed cancelled expired retried"
STAGES = tuple(_STAGE_NAMES.split())
"""The ledger's stages status shows: ``received = queued + routed + cancelled + expired`` and
``routed = in_flight + completed + failed`` (plus the adopted and released terms of a handover, and
``retried`` on both sides: items sent back to the lanes after a retriable failure)."""


@dataclass(slots=True)
class GroupFacts:
    """A consumer's group on its batch topic, as the broker reports it (None: not known)."""

    members: int | None = None
    committed: int | None = None
    end: int | None = None
    unread: int | None = None


@dataclass(slots=True)
class StatusView:
    contracts: dict[str, Contract] = field(default_factory=dict)
    checkpoints: dict[str, LedgerSnapshotRecord] = field(default_factory=dict)
    ingest_lag: int | None = None
    ingest_end: int = 0
    announced_ms: dict[str, int] = field(default_factory=dict)
    """When each contract was written (its message timestamp)."""
    groups: dict[str, GroupFacts] = field(default_factory=dict)
    read_ms: int = 0
    """Wall-clock time of the read; ages are measured from it."""

    def total(self, key: str) -> int:
        return sum(cp.counters.get(key, 0) for cp in self.checkpoints.values())

    def held(self, key: str) -> int:
        """``queued_*`` or ``in_flight_*`` summed over instances, less what was counted twice: state a
        crashed instance's last checkpoint still claims and another instance has adopted since
        (processor/core/accounting.py). A per-model key (``queued_items@m``) works the same."""
        parsed = parse_key(key)
        split = stage_unit(parsed.counter)
        if split is None:
            raise ValueError(f"held({key!r}): not a stage's items or tokens")
        stage, unit = split
        adopted, released = (parsed.renamed(f"{way}_{stage}_{unit}") for way in ("adopted", "released"))
        return self.total(key) - (self.total(adopted.encode()) - self.total(released.encode()))

    def consumer_total(self, consumer: str, key: str) -> int:
        return self.total(consumer_key(key, consumer))

    def retired(self, instance: str) -> bool:
        return self.checkpoints[instance].counters.get(RETIRED, 0) > 0

    def owners(self, scope: Scope, counter: str | None = None) -> list[str]:
        """The models, consumers or jobs (``scope``) some checkpoint has a key for (``counter``'s
        only, when given), sorted."""
        keys = (parse_key(key) for cp in self.checkpoints.values() for key in cp.counters)
        return sorted({k.owner for k in keys if k.scope == scope and counter in (None, k.counter)})

    def jobs(self) -> list[str]:
        """Every job a checkpoint counts (its ledger book, or its share: docs/shares.md)."""
        return self.owners("job")

    def job_total(self, job: str, key: str) -> int:
        """A job's counter (``routed_tokens``, ``padded_tokens``...) summed over instances."""
        return self.total(job_key(key, job))

    def job_policy(self, job: str) -> tuple[float, int, int, bool]:
        """(weight, tokens/s cap, total cap, capped now) as the newest checkpoint has them; -1: no cap."""
        newest = max(self.checkpoints.values(), key=lambda cp: cp.taken_ms, default=None)
        c = newest.counters if newest is not None else {}
        weight = c.get(job_key("weight_milli", job), 1000) / 1000
        capped = any(cp.counters.get(job_key("capped", job), 0) for cp in self.checkpoints.values())
        rate, total = c.get(job_key("max_tokens_per_s", job), -1), c.get(job_key("max_tokens", job), -1)
        return weight, rate, total, capped


def ingest_lag(
    conf: Mapping[str, str], topic: str, group: str, timeout_s: float = 10.0
) -> tuple[int | None, int]:
    """(messages the group has not committed past, messages ever written) on ``topic``."""
    consumer = KAFKA.consumer({**conf, "group.id": group, "enable.auto.commit": "false"})
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return None, 0
        tps = [TopicPartition(topic, p) for p in meta.partitions]
        try:
            committed: list[TopicPartition] | None = consumer.committed(tps, timeout=timeout_s)
        except KafkaException as exc:
            if not passing(exc):
                raise
            committed = None  # coordinator moving, or offsets held by an open transaction: unknown for now
        lag = end = 0
        for tp in committed if committed is not None else tps:
            low, high = watermarks(consumer, TopicPartition(topic, tp.partition), timeout_s)
            end += high
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return (lag if committed is not None else None), end
    finally:
        consumer.close()


def consumer_groups(
    conf: Mapping[str, str], topics: TopicNames, consumers: list[str], timeout_s: float = 10.0
) -> dict[str, GroupFacts]:
    """Members, committed offset and unread batches of each consumer's group on its batch topic.

    Read without the admin API's group requests: librdkafka 2.16 aborts the whole process when the
    connection under one of them fails (librdkafka#4605, fix proposed in #5397; ``status --watch``
    died of it, SIGABRT, in 4 of about 30 runs with a broker frozen under load). Members come from
    the classic DescribeGroups (``list_groups``), committed offsets from a consumer of the group's
    own id that never joins it; both are bounded by :func:`_bounded`.

    What the broker will not say (no rights to describe a group, a topic not created yet) stays None.
    """
    out = {c: GroupFacts() for c in consumers}
    if not consumers:
        return out
    admin = KAFKA.admin({**conf, **_bounded(timeout_s)})
    # a throwaway reader's group: the status role's prefixed Describe covers it (no denial logged)
    ends = KAFKA.consumer({**conf, "group.id": reader_group(topics.ingest), "enable.auto.commit": "false"})
    try:
        for c in consumers:
            group, tp = topics.consumer_group(c), TopicPartition(topics.batches(c), 0)
            with contextlib.suppress(KafkaException):  # no right to describe it: members unknown
                out[c].members = _members(admin, group, timeout_s)
            try:
                committed = _committed(conf, group, tp, timeout_s)
                low, high = watermarks(ends, tp, timeout_s)
            except KafkaException:
                continue
            facts = out[c]
            facts.end = high
            facts.committed = committed if committed >= 0 else None
            start = max(low, committed)
            facts.unread = (
                0 if start >= high else sum(1 for _ in read_topic(conf, topics.batches(c), starts={0: start}))
            )
    finally:
        ends.close()
    return out


def _members(admin: Any, group: str, timeout_s: float) -> int | None:
    """How many members ``group`` has (0 when it has none or does not exist), None when not said."""
    with warnings.catch_warnings():  # deprecated for the admin API's group requests, which abort
        warnings.simplefilter("ignore", DeprecationWarning)
        groups = admin.list_groups(group=group, timeout=timeout_s)
    for found in groups:
        if found.id == group:
            return len(found.members) if found.error is None else None
    return 0


def _committed(conf: Mapping[str, str], group: str, tp: TopicPartition, timeout_s: float) -> int:
    """``group``'s committed offset of ``tp`` (negative: none), as the last committed transaction
    left it: read uncommitted, so an open transaction's offset is not waited for."""
    settings = {"group.id": group, "enable.auto.commit": "false", "isolation.level": "read_uncommitted"}
    reader = KAFKA.consumer({**conf, **_bounded(timeout_s), **settings})  # its close waits on its requests
    try:
        offset: int = reader.committed([tp], timeout=timeout_s)[0].offset
        return offset
    finally:
        reader.close()


def _bounded(timeout_s: float) -> dict[str, str]:
    """Client settings that fail each request after ``timeout_s``: ``list_groups`` and a consumer's
    close wait for their requests with no deadline of their own (status --watch stayed silent past a
    20 s freeze), and librdkafka fails a request after ``socket.timeout.ms``."""
    return {"socket.timeout.ms": str(int(timeout_s * 1000))}


def gather(conf: Mapping[str, str], topics: TopicNames, group: str = "", groups: bool = False) -> StatusView:
    """Contracts, every instance's latest checkpoint, ingest lag; with ``groups``, each consumer's
    group too (its members and lag: one more request per consumer)."""
    view = StatusView()
    for name, announced in read_announcements(conf, topics).items():
        view.contracts[name] = announced.contract
        view.announced_ms[name] = announced.timestamp_ms
    # Compacted: the whole topic is the latest checkpoint per instance plus the last minute or so of
    # uncompacted ones; an instance dead for long is still found, wherever its checkpoint sits.
    for msg in read_topic(conf, topics.accounting):
        if msg.value() is None:
            view.checkpoints.pop((msg.key() or b"").decode("utf-8", "replace"), None)
            continue
        cp = decode_ledger_snapshot(msg.value())
        previous = view.checkpoints.get(cp.instance)
        if previous is None or (cp.taken_ms, cp.sequence) >= (previous.taken_ms, previous.sequence):
            view.checkpoints[cp.instance] = cp
    view.ingest_lag, view.ingest_end = ingest_lag(conf, topics.ingest, group or topics.processor_group)
    if groups:
        view.groups = consumer_groups(conf, topics, sorted(view.contracts))
    view.read_ms = int(time.time() * 1000)
    return view


# -- the report -----------------------------------------------------------------------------------
