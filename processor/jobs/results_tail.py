"""Reading the results topic for collectors: one ``read_committed`` consumer, assigned, from given
offsets to the end, again and again (processor/jobs/collect.py routes what it reads to jobs)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.kafka.factory import KAFKA
from processor.kafka.reader import position
from processor.kafka.topics import TopicNames

#: How far before a job's ``started_ms`` a fresh collect starts reading results.
START_SLACK_MS = 10 * 60 * 1000


class CollectError(RuntimeError):
    """Collecting cannot start (missing topic, changed dataset, ...); the message says what to do."""


class ResultsTail:
    """One ``read_committed`` consumer over the results topic, assigned (not in a group), never committing.

    Its throwaway group id starts with the pipeline's prefix (``<prefix>-collect-<hex>``), so one
    prefixed ACL covers every pipeline's collectors (docs/operations.md)."""

    def __init__(self, conf: Mapping[str, str], topics: TopicNames) -> None:
        self.topic = topics.results
        self._consumer = KAFKA.consumer(
            {
                **conf,
                "group.id": f"{topics.prefix}-collect-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": "false",
                "enable.partition.eof": "true",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": "100",
            }
        )
        self._eof: dict[int, bool] = {}
        self._positions: dict[int, int] = {}

    def partitions(self, timeout_s: float = 10.0) -> list[int]:
        meta = self._consumer.list_topics(self.topic, timeout=timeout_s).topics.get(self.topic)
        if meta is None or meta.error is not None:
            raise CollectError(
                f"topic {self.topic} does not exist: create it with 'tokenfabric topics create'"
            )
        return sorted(meta.partitions)

    def offsets_at(self, ms: int, timeout_s: float = 10.0) -> dict[int, int]:
        """Per partition, the first offset whose timestamp is ``ms`` or later (the end when none is)."""
        wanted = [TopicPartition(self.topic, p, max(0, ms)) for p in self.partitions()]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = self._consumer.offsets_for_times(wanted, timeout=timeout_s)
                break
            except KafkaException:  # e.g. a topic created a moment ago has no leader yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        out: dict[int, int] = {}
        for tp in found:
            if tp.offset >= 0:
                out[tp.partition] = tp.offset
            else:
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, tp.partition), timeout=timeout_s
                )
                out[tp.partition] = high
        return out

    def assign(self, starts: Mapping[int, int]) -> None:
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in sorted(starts.items())])
        self._eof = {p: False for p in starts}
        self._positions = dict(starts)

    @property
    def positions(self) -> dict[int, int]:
        """Per partition, the offset after the last message read (what a checkpoint records)."""
        return dict(self._positions)

    def drain(self, max_s: float = 5.0) -> Iterator[Any]:
        """Messages from where the last call stopped to the end of every partition (or ``max_s``).

        A generator, so a long backlog streams through instead of piling up in memory; ``positions``
        covers exactly the messages yielded so far.
        """
        deadline = time.monotonic() + max_s
        while True:
            for msg in self._consumer.consume(num_messages=5000, timeout=0.2):
                err = msg.error()
                partition, offset = position(msg)
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        self._eof[partition] = True
                        continue
                    raise KafkaException(err)
                self._eof[partition] = False
                yield msg
                self._positions[partition] = offset + 1
            if all(self._eof.values()) or time.monotonic() >= deadline:
                return

    def close(self) -> None:
        self._consumer.close()
