"""Rebuild a processor's state from Kafka after a restart (exactly-once mode).

What a processor needs for the ingest partitions it is assigned was committed in one transaction
with their offsets: the changelog partitions of the same numbers (which ingest messages wait in
lanes, which batches are in flight). Restore reads those changelog partitions to their end, then
reads back from the ingest topic exactly the messages they refer to. Anything consumed after that
commit was not committed, so the ingest consumer reads it again. The ledger checkpoint is the
instance's own (``latest_checkpoint``); what the changelog holds is adopted into it (see
``processor/core/accounting.py``), so state can move between instances with its partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from processor.core.contract import Contract
from processor.kafka.exits import WrongSettings
from processor.kafka.factory import KAFKA, ClientFactory
from processor.kafka.reader import partitions_of, read_topic, read_topic_chunks
from processor.kafka.topics import TopicNames
from processor.state.changelog import ChangelogState
from processor.wire.control import decode_contract, decode_ledger_snapshot
from processor.wire.heads import ItemHead, decode_item_head
from processor.wire.records import LedgerSnapshotRecord

log = logging.getLogger("tokenfabric.restore")


@dataclass(slots=True)
class RestoredState:
    """What the changelog of some ingest partitions holds, with the ingest records it refers to."""

    partitions: list[int]
    changelog: ChangelogState
    records: dict[tuple[int, int], ItemHead]  # the items of in-flight batches
    contracts: dict[str, Contract]
    committed: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0


def latest_contracts(
    conf: Mapping[str, str], topics: TopicNames, clients: ClientFactory = KAFKA
) -> dict[str, Contract]:
    out: dict[str, Contract] = {}
    for msg in read_topic(conf, topics.contracts, clients=clients):
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            out.pop(key, None)
        else:
            out[key] = decode_contract(msg.value()).contract
    return out


def latest_checkpoint(
    conf: Mapping[str, str], topics: TopicNames, instance: str, clients: ClientFactory = KAFKA
) -> LedgerSnapshotRecord | None:
    """The instance's last committed ledger checkpoint (with the gauges taken beside it)."""
    latest: LedgerSnapshotRecord | None = None
    for msg in read_topic(conf, topics.accounting, clients=clients):
        if msg.key() != instance.encode():
            continue
        latest = decode_ledger_snapshot(msg.value())
    return latest


def committed_offsets(
    conf: Mapping[str, str],
    topic: str,
    group: str,
    clients: ClientFactory = KAFKA,
    only: list[int] | None = None,
    timeout_s: float = 30.0,
) -> dict[int, int]:
    """The group's committed offsets of partitions ``only`` (default: all), stable ones only
    (read_committed: KIP-447 waits out any open transaction that is committing offsets for them).
    Asking for only the partitions being restored matters: a dead instance's open transaction holds
    back the answer for its own partitions, not for the ones another instance keeps."""
    consumer = clients.consumer(
        {**conf, "group.id": group, "enable.auto.commit": "false", "isolation.level": "read_committed"}
    )
    try:
        partitions = (partitions_of(consumer, topic) or []) if only is None else only
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
    finally:
        consumer.close()


OnWaiting = Callable[[tuple[int, int], int, ItemHead, int], None]
"""``(ref, home, head, timestamp_ms)``: a waiting item, and its ingest message's Kafka timestamp (when
it was produced, or appended: the topic's ``message.timestamp.type``)."""


def restore(
    conf: Mapping[str, str],
    topics: TopicNames,
    group: str,
    partitions: list[int] | None,
    on_contracts: Callable[[dict[str, Contract]], None],
    on_waiting: OnWaiting,
    clients: ClientFactory = KAFKA,
    decode: Callable[[bytes | None], ItemHead] = decode_item_head,
    offsets_wait_s: float = 30.0,
) -> RestoredState:
    """The state of ``partitions`` (default: all) as their last committed transactions left it; the
    waiting items go to ``on_waiting``, the heads of in-flight batches' items to ``records``.

    Order matters. The committed ingest offsets are fetched first: with ``read_committed`` the broker
    answers only once no transaction that sends offsets for them is still open (KIP-447), so a
    previous owner's last transaction is committed or aborted before the changelog is read, and the
    changelog read then sees exactly the records that committed with those offsets.

    ``on_contracts`` gets the contracts before any item is read, and ``on_waiting`` each waiting
    item (its ref, home, head and message timestamp) as its message arrives: the caller fills its
    lanes while the next fetches are in flight, instead of after the last one (the reading loop waits
    on fetches for about as long as it works; docs/benchmarks.md, "Restore"). A restored message is
    validated again, as it was when first consumed: a topic recreated under the same name is refused,
    not adopted. ``decode`` reads an ingest message (the intake's, so a registry-framed one reads too).
    ``offsets_wait_s`` bounds the wait for the committed offsets: past it a ``_TIMED_OUT``
    KafkaException, which the handover tries again later (processor/state/handover.py).
    """
    started = time.monotonic()
    committed = committed_offsets(conf, topics.ingest, group, clients, partitions, offsets_wait_s)
    contracts = latest_contracts(conf, topics, clients)
    on_contracts(contracts)
    state = ChangelogState()
    starts = None if partitions is None else dict.fromkeys(partitions, 0)
    if starts != {}:
        for msg in read_topic(conf, topics.changelog, starts, clients=clients):
            state.apply(msg.key(), msg.value(), msg.partition())
    changelog_read = time.monotonic()
    waiting = state.waiting
    wanted = state.batch_refs()
    records: dict[tuple[int, int], ItemHead] = {}
    if waiting or wanted:
        first: dict[int, int] = {}
        for partition, offset in (*waiting, *wanted):
            first[partition] = min(offset, first.get(partition, offset))
        others = sorted(first.keys() - set(partitions or first))  # a batch's items from elsewhere
        if others:
            committed.update(committed_offsets(conf, topics.ingest, group, clients, others))
        if not any(p in committed for p in first):
            raise WrongSettings(
                f"restore: the changelog of {topics.prefix} holds {len(waiting) + len(wanted):,} items of "
                f"ingest partitions {sorted(first)}, but group {group!r} has committed no offset on them: "
                "--group is not the group that processed these topics (default: <topic prefix>-processor), "
                "or its offsets expired (offsets.retention.minutes); run with that group or a new "
                "--topic-prefix"
            )
        stops = {p: committed.get(p, 0) for p in first}
        adopted: list[tuple[int, int]] = []
        found = adopted.append
        for chunk in read_topic_chunks(conf, topics.ingest, first, stops, clients=clients):
            for msg in chunk:
                ref = (msg.partition(), msg.offset())  # both always set on a consumed message
                home = waiting.get(ref)
                if home is not None:
                    head = decode(msg.value())
                    on_waiting(ref, home, head, msg.timestamp()[1])
                    found(ref)
                    if ref in wanted:
                        records[ref] = head
                elif ref in wanted:
                    records[ref] = decode(msg.value())
        if len(adopted) != len(waiting) or len(records) != len(wanted):
            missing = (waiting.keys() - set(adopted)) | (wanted - records.keys())
            raise RuntimeError(
                f"restore: {len(missing):,} changelog entries refer to ingest messages that are gone "
                f"(first: partition {min(missing)[0]} offset {min(missing)[1]}); was the ingest retention "
                "shorter than the time items waited?"
            )
    seconds = time.monotonic() - started
    log.info(
        "restored partitions %s: %d waiting, %d batches in flight, %d changelog records, %.2f s "
        "(offsets, contracts and changelog %.2f s, ingest messages %.2f s)",
        "all" if partitions is None else partitions,
        len(state.waiting),
        len(state.batches),
        state.records,
        seconds,
        changelog_read - started,
        seconds - (changelog_read - started),
    )
    return RestoredState(
        sorted(partitions) if partitions is not None else [], state, records, contracts, committed, seconds
    )


def transactional_id(instance: str, group: str) -> str:
    """Stable per instance: a replacement with the same instance id fences the process it replaces."""
    return f"{group}-{instance}"
