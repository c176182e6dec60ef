"""The processor's intake: an ingest message becomes an item to schedule, or is dead-lettered.

A message the processor cannot read (its reason and original bytes) and a producer's repeat within
the dedupe window (processor/state/dedupe.py) are dead-lettered whole; the lane log is told of each
(its offset may commit once the dead letter is durable), and of each new item.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException

from processor.apps.deadletters import dead_letter_of
from processor.apps.observe import ServiceCounters
from processor.core.scheduler import Scheduler
from processor.kafka.exits import fatal
from processor.kafka.topics import TopicNames
from processor.state.ingest import IngestItem
from processor.state.modes import DeliveryMode
from processor.wire.control import DUPLICATE_ITEM_ID, encode_dead_letter
from processor.wire.errors import DecodeError
from processor.wire.heads import ItemHead, decode_item_head

log = logging.getLogger("tokenfabric.processor")


class Intake:
    """Decodes ingest messages for the service's loop (its owner thread)."""

    def __init__(
        self,
        core: Scheduler,
        mode: DeliveryMode,
        topics: TopicNames,
        counters: ServiceCounters,
        dedupe_window_ms: int,
    ) -> None:
        self.core = core
        self.mode = mode
        self.topics = topics
        self.counters = counters
        self.dedupe_window_ms = dedupe_window_ms
        """Only to say it in a repeat's dead letter: the dedupe role holds the window itself."""

    def item(self, msg: Any, now: int) -> IngestItem | None:
        """Decode one ingest message: the item to schedule, or None (an error, a dead letter, a repeat)."""
        err = msg.error()
        if err is not None:
            if fatal(err):
                raise KafkaException(err)
            log.warning("ingest: %s", err)
            return None
        self.counters.consumed += 1
        partition, offset = msg.partition(), msg.offset()
        try:
            head = decode_item_head(msg.value())
        except DecodeError as exc:
            self._dead_letter(msg, exc.reason, str(exc), partition, offset)
            self.core.dead_lettered()
            return None
        if not self.mode.dedupe.first_seen(partition, head.item_id):
            self._duplicate(msg, head, partition, offset)
            return None
        item = IngestItem.from_head(head, now, partition, offset)
        self.mode.lane_log.item_seen(item)
        return item

    def _duplicate(self, msg: Any, head: ItemHead, partition: int, offset: int) -> None:
        """A producer's repeat: not scheduled, dead-lettered whole and counted as a duplicate."""
        window_s = self.dedupe_window_ms / 1000
        detail = (
            f"item_id {head.item_id!r} was already taken from partition {partition} within the dedupe "
            f"window ({window_s:g} s); this repeat is not scheduled"
        )
        self._dead_letter(msg, DUPLICATE_ITEM_ID, detail, partition, offset)
        self.core.duplicate(head.model, head.token_count, head.job)
        self.counters.duplicates += 1

    def _dead_letter(self, msg: Any, reason: str, detail: str, partition: int, offset: int) -> None:
        record = dead_letter_of(msg, reason, detail, msg.topic(), partition, offset)
        self.mode.durability.produce(
            self.topics.dead_letter,
            encode_dead_letter(record),
            msg.key(),
            self.mode.lane_log.dead_letter(partition, offset),
        )
        self.counters.dead_lettered += 1
        log.warning("dead-lettered %s[%d]@%d: %s: %s", msg.topic(), partition, offset, reason, detail)
