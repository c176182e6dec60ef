"""Rebuild a processor's state from Kafka after a restart (exactly-once mode).

What a restarted processor needs was committed in one transaction with the ingest offsets: the
changelog (which ingest messages wait in lanes, which batches are in flight), and the ledger
checkpoint under its instance id. Restore reads the changelog to its end, then reads back from the
ingest topic exactly the messages it refers to, and hands the core the same items, the same batches
and the same counts it had at its last commit. Anything consumed after that commit was not
committed, so the ingest consumer reads it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from . import codec
from .accounting import Ledger
from .changelog import ChangelogState
from .contract import Contract
from .replay import partitions_of, position, read_topic
from .topics import TopicNames

log = logging.getLogger("tokenfabric.restore")


@dataclass(slots=True)
class RestoredState:
    ledger: Ledger | None
    changelog: ChangelogState
    records: dict[tuple[int, int], codec.TokenItemRecord]
    contracts: dict[str, Contract]
    committed: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0


def latest_contracts(conf: Mapping[str, str], topics: TopicNames) -> dict[str, Contract]:
    out: dict[str, Contract] = {}
    for msg in read_topic(conf, topics.contracts):
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            out.pop(key, None)
        else:
            out[key] = codec.decode_contract(msg.value()).contract
    return out


def latest_ledger(conf: Mapping[str, str], topics: TopicNames, instance: str) -> Ledger | None:
    latest: codec.LedgerSnapshotRecord | None = None
    for msg in read_topic(conf, topics.accounting):
        if msg.key() != instance.encode():
            continue
        latest = codec.decode_ledger_snapshot(msg.value())
    return None if latest is None else Ledger.restore(latest.counters)


def committed_offsets(conf: Mapping[str, str], topic: str, group: str) -> dict[int, int]:
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": "false"})
    try:
        partitions = partitions_of(consumer, topic) or []
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
    finally:
        consumer.close()


def restore(conf: Mapping[str, str], topics: TopicNames, instance: str, group: str) -> RestoredState:
    started = time.monotonic()
    contracts = latest_contracts(conf, topics)
    ledger = latest_ledger(conf, topics, instance)
    state = ChangelogState()
    for msg in read_topic(conf, topics.changelog):
        state.apply(msg.key(), msg.value())
    committed = committed_offsets(conf, topics.ingest, group)
    refs = state.refs()
    records: dict[tuple[int, int], codec.TokenItemRecord] = {}
    if refs:
        starts: dict[int, int] = {}
        for partition, offset in refs:
            starts[partition] = min(offset, starts.get(partition, offset))
        stops = {p: committed.get(p, 0) for p in starts}
        for msg in read_topic(conf, topics.ingest, starts, stops):
            ref = position(msg)
            if ref in refs:
                records[ref] = codec.decode_token_item(msg.value())
        missing = refs - records.keys()
        if missing:
            raise RuntimeError(
                f"restore: {len(missing):,} changelog entries refer to ingest messages that are gone "
                f"(first: partition {min(missing)[0]} offset {min(missing)[1]}); was the ingest retention "
                "shorter than the time items waited?"
            )
    seconds = time.monotonic() - started
    log.info(
        "restored %s: %d waiting, %d batches in flight, %d changelog records, %.2f s",
        instance,
        len(state.waiting),
        len(state.batches),
        state.records,
        seconds,
    )
    return RestoredState(ledger, state, records, contracts, committed, seconds)


def transactional_id(instance: str, group: str) -> str:
    """Stable per instance: a replacement with the same instance id fences the process it replaces."""
    return f"{group}-{instance}"
