"""Reading topics from a point to their current end: restore, status, audit and the demo's read-back.

Reads are ``read_committed`` (aborted transactions are invisible) and end at each partition's end as
the broker reports it with ``enable.partition.eof``, so transaction markers at the tail, which take
offsets but carry no message, never make a reader wait for a message that will not come.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.kafka.exits import authorization_refused, refusal
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient
from processor.kafka.topics import TopicNames

#: The fixed ends of a pipeline's topic names (``TopicNames("")``'s), to find a topic's prefix.
_SUFFIXES = tuple(
    getattr(TopicNames(""), name)
    for name in (
        "ingest",
        "results",
        "contracts",
        "accounting",
        "changelog",
        "dead_letter",
        "jobs",
        "job_shares",
    )
)
_BATCHES = TopicNames("").batches("")

#: A consumer that must keep up with a fast topic (the processor's ingest, restore's reader): a large
#: local queue, and when it is full librdkafka stops fetching for ``fetch.queue.backoff.ms``, 1 s by
#: default, so after a backlog the last messages waited up to a second; 20 ms here.
LARGE_FETCH_QUEUE: Mapping[str, str] = {
    "queued.max.messages.kbytes": str(256 * 1024),
    "fetch.queue.backoff.ms": "20",
}

#: Errors that the same call gets past a moment later: a partition's leader or a group's coordinator
#: moving or still loading (a broker restarting, a topic just created), and a group's offsets held
#: back by an open transaction (a processor that died mid-transaction: the coordinator aborts it
#: within ``transaction.timeout.ms``; librdkafka retries until its own timeout, then says _TIMED_OUT).
_PASSING = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.UNSTABLE_OFFSET_COMMIT,
    KafkaError._TIMED_OUT,
)


def pipeline_prefix(topic: str) -> str:
    """The prefix of the pipeline ``topic`` belongs to (``p`` of ``p.ingest`` or ``p.batches.gpu0``);
    a topic of no pipeline is its own prefix."""
    if _BATCHES in topic:
        return topic[: topic.index(_BATCHES)]
    return next((topic[: -len(s)] for s in _SUFFIXES if topic.endswith(s) and len(topic) > len(s)), topic)


def reader_group(topic: str) -> str:
    """A throwaway reader's group id: ``<prefix>-reader-<8 hex>``, inside the pipeline's prefix so that
    a prefixed group ACL on ``<prefix>-`` covers it. The reader never joins it nor commits, so it
    needs no group ACL at all (processor.kafka.acls)."""
    return f"{pipeline_prefix(topic)}-reader-{uuid.uuid4().hex[:8]}"


def passing(exc: KafkaException) -> bool:
    """True for an error that a retry a moment later can get past (retriable, or something moving)."""
    error = exc.args[0]
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in _PASSING)


def position(msg: Any) -> tuple[int, int]:
    """(partition, offset) of a consumed message (both always set on consumed messages)."""
    partition, offset = msg.partition(), msg.offset()
    return (-1 if partition is None else partition), (-1 if offset is None else offset)


def partitions_of(consumer: ConsumerClient, topic: str, timeout_s: float = 10.0) -> list[int] | None:
    """The topic's partitions; None when it does not exist. A topic the principal may not even
    describe raises (its metadata error), rather than reading as a missing topic."""
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is not None and meta.error is not None and authorization_refused(meta.error):
        raise KafkaException(meta.error)
    if meta is None or meta.error is not None:
        return None
    return sorted(meta.partitions)


def watermarks(consumer: ConsumerClient, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """Low and high watermark, retrying the errors a just-created topic or a moving leader gives."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=max(0.5, deadline - time.monotonic()))
            return int(low), int(high)
        except KafkaException as exc:
            if not passing(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_topic(
    conf: Mapping[str, str],
    topic: str,
    starts: Mapping[int, int] | None = None,
    stops: Mapping[int, int] | None = None,
    timeout_s: float = 30.0,
    tail: int | None = None,
    clients: ClientFactory = KAFKA,
) -> Iterator[Any]:
    """Messages of ``topic`` from ``starts`` (default: the beginning) to its end at the time of the
    call, or to ``stops`` if that comes first.

    ``stops[p]`` is exclusive. Partitions missing from ``starts`` (when given) are not read. ``tail``
    reads only the last ``tail`` offsets of each partition (the latest checkpoints, say).
    """
    for chunk in read_topic_chunks(conf, topic, starts, stops, timeout_s, tail, clients):
        yield from chunk


def read_topic_chunks(
    conf: Mapping[str, str],
    topic: str,
    starts: Mapping[int, int] | None = None,
    stops: Mapping[int, int] | None = None,
    timeout_s: float = 30.0,
    tail: int | None = None,
    clients: ClientFactory = KAFKA,
) -> Iterator[list[Any]]:
    """:func:`read_topic`'s messages as the lists one ``consume`` call returns (up to 5,000).

    For readers that do little per message (restore): a generator step per message cost as much as
    the rest of reading it (docs/benchmarks.md, "Restore").

    A read the authorizer refuses raises :class:`~processor.kafka.exits.Refused`, naming the topic.
    """
    group = reader_group(topic)
    try:
        yield from _read_chunks(conf, topic, group, starts, stops, timeout_s, tail, clients)
    except KafkaException as exc:
        # a throwaway reader only looks its group's coordinator up: Describe, not Read, on the group
        where = {**conf, "group.id": group}
        refused = refusal(exc, where, operation={"topic": "Read", "group": "Describe"}, topic=topic)
        if refused is not None:
            raise refused from None
        raise


def _read_chunks(
    conf: Mapping[str, str],
    topic: str,
    group: str,
    starts: Mapping[int, int] | None,
    stops: Mapping[int, int] | None,
    timeout_s: float,
    tail: int | None,
    clients: ClientFactory,
) -> Iterator[list[Any]]:
    consumer = clients.consumer(
        {
            **conf,
            "group.id": group,
            "enable.auto.commit": "false",
            "enable.partition.eof": "true",
            "fetch.wait.max.ms": "100",
            "isolation.level": "read_committed",
            # a restore reads whole partitions: large fetches, fewer round trips (docs/benchmarks.md)
            "max.partition.fetch.bytes": str(16 * 1024 * 1024),
            "fetch.max.bytes": str(64 * 1024 * 1024),
            **LARGE_FETCH_QUEUE,
        }
    )
    try:
        partitions = partitions_of(consumer, topic)
        if partitions is None:
            return
        if starts is not None:
            partitions = [p for p in partitions if p in starts]
        open_partitions = set(partitions)
        # Stop at the end as it is now: a topic written to while we read (checkpoints every few hundred
        # ms) would otherwise keep a long-polling fetch busy and never report its end.
        ends: dict[int, int] = {}
        begin: dict[int, int] = {}
        for p in partitions:
            low, high = watermarks(consumer, TopicPartition(topic, p), timeout_s)
            ends[p] = min(high, (stops or {}).get(p, 1 << 62))
            first = low if starts is None else max(low, starts[p])
            if tail is not None:
                first = max(first, ends[p] - tail)
            begin[p] = first
            if first >= ends[p]:
                open_partitions.discard(p)  # nothing to read: no EOF would ever be needed
        if not open_partitions:
            return
        consumer.assign(
            [
                TopicPartition(topic, p, OFFSET_BEGINNING if starts is None and tail is None else begin[p])
                for p in sorted(open_partitions)
            ]
        )
        deadline = time.monotonic() + timeout_s
        while open_partitions:
            # consume() waits for its whole timeout unless it fills num_messages: keep the wait short.
            msgs = consumer.consume(num_messages=5000, timeout=0.2)
            if not msgs:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic}: no progress in {timeout_s:.0f} s")
                continue
            deadline = time.monotonic() + timeout_s
            chunk: list[Any] = []
            keep = chunk.append
            for msg in msgs:
                err = msg.error()
                partition, offset = position(msg)
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(partition)
                        continue
                    raise KafkaException(err)
                end = ends[partition] if partition in open_partitions else -1
                if offset < end:
                    keep(msg)
                if offset + 1 >= end:
                    open_partitions.discard(partition)
            if chunk:
                yield chunk
    finally:
        consumer.close()
