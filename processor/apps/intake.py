"""The processor's intake: an ingest message becomes an item to schedule, or is dead-lettered.

A message the processor cannot read (its reason and original bytes) and a producer's repeat within
the dedupe window (processor/state/dedupe.py) are dead-lettered whole; the lane log is told of each
(its offset may commit once the dead letter is durable), and of each new item.

A registry-framed message (processor/wire/registry_framing.py) is read through the ``framing`` passed
in. When the schema registry does not answer, the message is not bad input: its partition is held
(the consumer seeks back to it and pauses the partition, so nothing after it is read or committed
past it) and resumed when the registry client's retry time has passed, to be read again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from processor.apps.deadletters import dead_letter_of
from processor.apps.observe import ServiceCounters
from processor.core.scheduler import Scheduler
from processor.kafka.exits import fatal
from processor.kafka.factory import ConsumerClient
from processor.kafka.topics import TopicNames
from processor.state.ingest import IngestItem
from processor.state.modes import DeliveryMode
from processor.wire.control import DUPLICATE_ITEM_ID, encode_dead_letter
from processor.wire.errors import DecodeError
from processor.wire.heads import ItemHead, decode_item_head
from processor.wire.registry_framing import RegistryFraming, RegistryUnavailable, decode_ingest_head

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
        framing: RegistryFraming | None = None,
        ingest: ConsumerClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.mode = mode
        self.topics = topics
        self.counters = counters
        self.dedupe_window_ms = dedupe_window_ms
        """Only to say it in a repeat's dead letter: the dedupe role holds the window itself."""
        self.framing = framing
        self.ingest = ingest
        """The ingest consumer, to hold a partition while the schema registry does not answer."""
        self.clock = clock
        self.held: dict[int, tuple[str, int]] = {}
        """Partition -> (topic, offset) held while the registry is down; read again from there."""
        self.held_since: float | None = None
        """When the first partition now held was held (health: not ready meanwhile)."""
        self._retry_at = 0.0
        self._decode: Callable[[bytes | None], ItemHead] = (
            decode_item_head if framing is None else self.decode_head
        )
        """The head's decode per message: without a framing, the single-object decode itself."""

    def decode_head(self, value: bytes | None) -> ItemHead:
        """An ingest message's head, in either framing; raises DecodeError or RegistryUnavailable."""
        return decode_ingest_head(value, self.framing)

    def items(self, msgs: list[Any], now: int) -> list[IngestItem]:
        """The items of one poll's messages, in order (see :meth:`item`); the dedupe window's wall
        clock is read once for the poll, not once per message."""
        first_seen = self.mode.dedupe.poll_check()
        item = self.item
        out: list[IngestItem] = []  # a plain loop: no generator to resume per message
        for msg in msgs:
            it = item(msg, now, first_seen)
            if it is not None:
                out.append(it)
        return out

    def item(
        self, msg: Any, now: int, first_seen: Callable[[int, str], bool] | None = None
    ) -> IngestItem | None:
        """Decode one ingest message: the item to schedule, or None (an error, a dead letter, a repeat).
        ``first_seen``: the dedupe window's check for this poll (None: no window)."""
        err = msg.error()
        if err is not None:
            if fatal(err):
                raise KafkaException(err)
            log.warning("ingest: %s", err)
            return None
        self.counters.consumed += 1
        partition, offset = msg.partition(), msg.offset()
        if partition in self.held:  # after a held message: read again once the partition resumes
            return None
        try:
            head = self._decode(msg.value())
        except RegistryUnavailable as exc:
            self._hold(msg.topic(), partition, offset, str(exc))
            return None
        except DecodeError as exc:
            self._dead_letter(msg, exc.reason, str(exc), partition, offset)
            self.core.dead_lettered()
            return None
        if first_seen is not None and not first_seen(partition, head.item_id):
            self._duplicate(msg, head, partition, offset)
            return None
        item = IngestItem.from_head(head, now, partition, offset)
        self.mode.lane_log.item_seen(item)
        return item

    def _hold(self, topic: str, partition: int, offset: int, why: str) -> None:
        """Seek back to ``offset`` and pause its partition: not one message of it is lost or skipped."""
        self.held[partition] = (topic, offset)
        now = self.clock()
        if self.held_since is None:
            self.held_since = now
            log.warning("ingest partition %d held at offset %d: %s", partition, offset, why)
        self._retry_at = now + 1.0
        tp = TopicPartition(topic, partition, offset)
        assert self.ingest is not None, "an Intake given a framing is given its ingest consumer"
        self.ingest.pause([tp])
        self.ingest.seek(tp)

    def release_held(self, pending: Collection[int] = ()) -> None:
        """Resume the held partitions once a second, to read their message again (once per step).

        A partition ``pending`` a restore (processor/state/handover.py: the group moved it since it
        was held) is only forgotten: the handover resumes it once restored, from its committed
        offset, and a registry still silent then holds it again. Resuming it here would read it
        before its lane state is back."""
        if not self.held or self.clock() < self._retry_at:
            return
        parts = [TopicPartition(t, p, offset) for p, (t, offset) in self.held.items() if p not in pending]
        self.held.clear()
        if self.ingest is not None:
            self.ingest.resume(parts)

    def registry_answered(self) -> None:
        """Called after a step that held nothing new: the outage, if any, is over."""
        if self.held_since is not None and not self.held:
            log.info("schema registry answers again; ingest resumed")
            self.held_since = None

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
