"""The share-group queue: the plain baseline a team would try first on Kafka 4.2 and later (KIP-932).

Not a product mode. Every card's workers join ONE share group on the ingest topic: the broker hands
each record to one member at a time (many members per partition, no partition assignment, so no
rebalance pauses), and a member acknowledges each record it acquired. Each card packs the records of a
poll **in arrival order** into batches under the same contract as the consumer-group plain queue
(processor/apps/plainqueue.py, whose batch code it reuses), runs the same engine and writes the same
completion records to the results topic, then ACCEPTs the batch's records (REJECTs an undecodable one
after dead-lettering it); when its completions could not be written it RELEASEs them for another
delivery.

Delivery: **at-least-once**. A share consumer cannot join a Kafka transaction (KIP-932 has no
``sendOffsetsToTransaction`` for share groups: acknowledgements are not offsets), so the completions
are written, flushed, and only then acknowledged; a worker that dies in between leaves its records to
be acquired again when their lock (``group.share.record.lock.duration.ms``) runs out, and their
completions reach the results topic twice. The demo counts such duplicates from the results topic.

In explicit acknowledgement mode every record of a poll must be acknowledged before the next poll, so
a batch never spans two polls: a batch closes at the contract's limits or at the end of its poll. A
poll takes at most the contract's ``max_items`` records (``max.poll.records``) and the group's lock
is 60 s (processor/kafka/share_groups.py): the records a worker holds are one batch, whose engine time
must fit in the lock, or they are delivered again to another worker (and completed twice).
Share groups start at the log's end by default; ``read_from_earliest``
(processor/kafka/share_groups.py) sets the group's ``share.auto.offset.reset`` to ``earliest`` first,
so no record produced before a worker joined is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException, Message

from processor.apps.consumer import PRODUCER_SETTINGS, ConsumerStats
from processor.apps.plainqueue import PlainQueueApp, _Read
from processor.kafka.share_groups import read_from_earliest
from processor.kafka.share_groups import share_consumer as new_share_consumer
from processor.kafka.topics import TopicNames

log = logging.getLogger("tokenfabric.sharequeue")

#: Logged once a card's first poll returned: its member is in the share group (no admin call lists
#: share groups' members in this client).
JOINED = "share queue joined"
#: How long a commit of acknowledgements may block (s).
ACK_TIMEOUT_S = 30.0


def share_group(topics: TopicNames) -> str:
    """The one share group every card of the share-group queue joins."""
    return f"{topics.prefix}-share-queue"


class ShareQueueApp(PlainQueueApp):
    """One card of the share-group queue. ``run`` it once; ``stop`` ends it after the current poll.

    ``share_consumer`` builds the client (confluent-kafka's ``ShareConsumer``); passed in for tests.
    """

    batch_prefix = "share"

    def __init__(
        self, *args: Any, share_consumer: Callable[[dict[str, Any]], Any] = new_share_consumer, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self._make_consumer = share_consumer
        self.released = 0
        """Records released for redelivery because their completions were not written."""
        self._undelivered: list[str] = []
        """Delivery errors of the batch being written (the producer's ``on_delivery`` appends them)."""

    def _delivered(self, error: Any, _msg: Message) -> None:
        if error is not None:
            self._undelivered.append(str(error))

    def run(self, stop: threading.Event | None = None) -> ConsumerStats:
        stop = stop or threading.Event()
        group = share_group(self.topics)
        read_from_earliest(self.conf, group)
        self._producer = self.clients.producer(
            {**self.conf, **PRODUCER_SETTINGS, "on_delivery": self._delivered}
        )
        consumer = self._make_consumer(
            {
                **self.conf,
                "group.id": group,
                "share.acknowledgement.mode": "explicit",
                "max.poll.records": str(self.rule.max_items),  # a poll is one batch: it fits the lock
                "log_level": "3",
            }
        )
        try:
            consumer.subscribe([self.topics.ingest])
            log.info(
                "share queue %s: budget %d, items %d, engine %s; reading %s in share group %s",
                self.contract.consumer,
                self.contract.budget_tokens,
                self.contract.max_items,
                self.engine.name,
                self.topics.ingest,
                group,
            )
            self._share_loop(consumer, stop)
        finally:
            self._close(consumer)
        return self.stats

    def _share_loop(self, consumer: Any, stop: threading.Event) -> None:
        last_item = time.monotonic()
        idle_exit_s = self.settings.idle_exit_s
        joined = False
        while not stop.is_set():
            records: list[Message] = []
            polled = consumer.poll(self.poll_timeout_s)
            if not joined:  # the demo waits for this line: the member has joined its share group
                log.info("%s %s: %s", JOINED, self.contract.consumer, share_group(self.topics))
                joined = True
            for msg in polled:
                error = msg.error()
                if error is None:
                    records.append(msg)
                elif error.fatal():
                    raise KafkaException(error)
                else:
                    log.warning("share consumer: %s", error.str())
            if not records:
                if idle_exit_s is not None and time.monotonic() - last_item >= idle_exit_s:
                    log.info("no item for %.1f s: exiting", idle_exit_s)
                    return
                continue
            last_item = time.monotonic()
            for reads in self._packed([self._decode(m) for m in records]):
                self._write_then_acknowledge(consumer, reads)
            consumer.commit_sync(ACK_TIMEOUT_S)

    def _packed(self, reads: Sequence[_Read]) -> Iterator[list[_Read]]:
        """One poll's records in arrival order, cut into batches that fit the contract."""
        self._pending = []
        for read in reads:
            if read.item is not None and self._pending and not self._fits(read.item):
                yield self._take()
            self._pending.append(read)
            if sum(1 for r in self._pending if r.item is not None) >= self.rule.max_items:
                yield self._take()
        if self._pending:
            yield self._take()

    def _take(self) -> list[_Read]:
        batch, self._pending = self._pending, []
        return batch

    def _write_then_acknowledge(self, consumer: Any, reads: list[_Read]) -> None:
        """Completions written and flushed, then ACCEPT (REJECT for a dead letter); RELEASE on failure."""
        producer = self._producer
        assert producer is not None
        self._undelivered.clear()
        try:
            self._write(reads)
            if producer.flush(ACK_TIMEOUT_S) != 0:
                raise KafkaException("completions not delivered within the flush timeout")
            if self._undelivered:
                raise KafkaException(f"completions not delivered: {self._undelivered[0]}")
        except Exception as exc:
            log.warning("batch of %d records not written (%s): released for redelivery", len(reads), exc)
            for r in reads:
                consumer.acknowledge(r.msg, AcknowledgeType.RELEASE)
            self.released += len(reads)
            return
        for r in reads:
            consumer.acknowledge(r.msg, AcknowledgeType.ACCEPT if r.item else AcknowledgeType.REJECT)
        if self.on_batch is not None:
            self.on_batch(self.stats)
