"""The processor: one owner thread drives the scheduling core from Kafka and back.

Each step of the loop, in order:

1. consume up to ``consume_batch`` ingest messages; decode each into an item (or dead-letter it with
   its reason and original bytes) and submit it to the core;
2. read contracts (compacted, from the beginning) and completions (from the end at start-up), which
   tell the core who may take work and which in-flight slots are free;
3. ask the core for batches and produce each to its consumer's topic; the delivery report marks its
   items' ingest offsets safe;
4. on their intervals: retire quiet lanes, commit the ingest offsets below the oldest unsafe message,
   and checkpoint the ledger to the compacted accounting topic.

librdkafka's own threads do the network I/O; everything that touches lanes or the ledger runs here,
so nothing on the hot path takes a lock. The core is unaware of Kafka; this module is the adapter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from . import codec
from .accounting import Ledger
from .dispatch import DispatchSettings, Scheduler
from .item import Batch, Item
from .lanes import LaneSettings
from .offsets import DeadMark, OffsetTracker
from .topics import TopicNames

log = logging.getLogger("tokenfabric.processor")


class IngestItem(Item):
    """An item that remembers where it came from, so its offset can be committed once it is safe."""

    __slots__ = ("offset", "partition", "safe")

    def __init__(self, rec: codec.TokenItemRecord, now_ms: int, partition: int, offset: int) -> None:
        super().__init__(rec.item_id, rec.model, rec.shape, rec.token_count, now_ms, rec)
        self.partition = partition
        self.offset = offset
        self.safe = False


@dataclass(frozen=True, slots=True)
class ProcessorSettings:
    instance: str = "processor-0"
    group_id: str = "tokenfabric-processor"
    consume_batch: int = 5000
    """Most ingest messages taken per ``consume`` call."""
    poll_timeout_ms: int = 20
    """How long one ``consume`` call may block when nothing arrives."""
    commit_interval_ms: int = 1000
    checkpoint_interval_ms: int = 2000
    tick_interval_ms: int = 500
    lanes: LaneSettings = field(default_factory=LaneSettings)
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)


@dataclass(slots=True)
class ServiceCounters:
    consumed: int = 0
    dead_lettered: int = 0
    batches_produced: int = 0
    batches_delivered: int = 0
    completions: int = 0
    unknown_completions: int = 0
    contracts: int = 0
    commits: int = 0
    checkpoints: int = 0


class ServiceObserver:
    """Hooks the metrics layer implements; the default observes nothing.

    Called from the owner thread, so implementations must be quick and must not call back into the
    service.
    """

    def committed(self, seconds: float) -> None:
        """An ingest offset commit (or a transaction commit, with exactly-once) took ``seconds``."""

    def checkpointed(self, seconds: float) -> None:
        """A ledger checkpoint was produced; ``seconds`` is the time to build and queue it."""


class ProcessorService:
    """The processor's owner thread and its Kafka clients.

    Read-only views for metrics and health (safe to read from another thread, values may be a step
    old): ``core`` (the scheduler, its ``ledger`` and lane ``table``), ``counters``, ``lag`` (ingest
    messages not yet consumed, per partition), ``last_step_s`` (monotonic time the loop last completed
    a step), ``last_broker_ok_s`` (last time the broker answered), ``ledger_error`` (why the last
    ledger check failed, or None).
    """

    def __init__(
        self,
        conf: dict[str, str],
        topics: TopicNames,
        settings: ProcessorSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conf = dict(conf)
        self.topics = topics
        self.settings = settings or ProcessorSettings()
        self._clock = clock
        self._t0 = clock()
        epoch = int(time.time() * 1000)
        self.core = Scheduler(
            self.settings.lanes,
            self.settings.dispatch,
            ledger=Ledger(),
            batch_prefix=f"{self.settings.instance}-{epoch}",
        )
        self.offsets = OffsetTracker()
        self.counters = ServiceCounters()
        self._fatal: BaseException | None = None
        self._checkpoint_seq = 0
        self._cache_hit: dict[str, bool] = {}
        self._last_commit = self._last_checkpoint = self._last_tick = -1 << 62
        self.observer = ServiceObserver()
        self.lag: dict[int, int] = {}
        self.last_step_s = clock()
        self.last_broker_ok_s = clock()
        self.ledger_error: str | None = None

        self.ingest = Consumer(
            {
                **self.conf,
                "group.id": self.settings.group_id,
                "enable.auto.commit": "false",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "fetch.max.bytes": str(64 * 1024 * 1024),
                "queued.max.messages.kbytes": str(256 * 1024),
            }
        )
        self.control = Consumer(
            {
                **self.conf,
                "group.id": f"{self.settings.group_id}-control-{self.settings.instance}",
                "enable.auto.commit": "false",
                "isolation.level": "read_committed",
            }
        )
        self.producer = Producer(
            {
                **self.conf,
                "enable.idempotence": "true",
                "linger.ms": "5",
                "batch.size": str(1024 * 1024),
                "message.max.bytes": str(64 * 1024 * 1024),
            }
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int((self._clock() - self._t0) * 1000)

    def start(self) -> None:
        self.ingest.subscribe([self.topics.ingest], on_revoke=self._on_revoke)
        assignment = [
            TopicPartition(self.topics.contracts, p, OFFSET_BEGINNING)
            for p in self._partitions(self.topics.contracts)
        ]
        assignment += [
            TopicPartition(self.topics.results, p, OFFSET_END) for p in self._partitions(self.topics.results)
        ]
        self.control.assign(assignment)

    def run(self, stop: threading.Event) -> None:
        """Process until ``stop`` is set, then shut down cleanly (flush, commit, checkpoint)."""
        self.start()
        try:
            while not stop.is_set():
                self.step()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        log.info("processor %s: shutting down", self.settings.instance)
        remaining = self.producer.flush(30)
        if remaining:
            log.error("processor %s: %d messages undelivered at shutdown", self.settings.instance, remaining)
        self._raise_fatal()
        self._commit(force=True)
        self._checkpoint(force=True)
        self.producer.flush(30)
        self.ingest.close()
        self.control.close()

    def _partitions(self, topic: str) -> list[int]:
        meta = self.ingest.list_topics(topic, timeout=30)
        info = meta.topics.get(topic)
        if info is None or info.error is not None:
            raise KafkaException(info.error if info else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return sorted(info.partitions)

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> int:
        """One pass of the loop; returns how many ingest messages it took."""
        s = self.settings
        msgs = self.ingest.consume(num_messages=s.consume_batch, timeout=s.poll_timeout_ms / 1000)
        now = self.now_ms()
        for msg in msgs:
            self._ingest(msg, now)
        self._control(now)
        self._dispatch(now)
        self.producer.poll(0)
        self._raise_fatal()
        if now - self._last_tick >= s.tick_interval_ms:
            self.core.tick(now)
            self._last_tick = now
        self._commit()
        self._checkpoint()
        self.last_step_s = self._clock()
        return len(msgs)

    def _ingest(self, msg: Any, now: int) -> None:
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            log.warning("ingest: %s", err)
            return
        self.counters.consumed += 1
        partition, offset = msg.partition(), msg.offset()
        try:
            rec = codec.decode_token_item(msg.value())
        except codec.DecodeError as exc:
            self._dead_letter(msg, f"{exc.reason}: {exc}", partition, offset)
            return
        item = IngestItem(rec, now, partition, offset)
        self.offsets.seen(partition, item)
        self.core.submit(item, now)

    def _dead_letter(self, msg: Any, reason: str, partition: int, offset: int) -> None:
        mark = DeadMark(offset)
        self.offsets.seen(partition, mark)
        value = msg.value() or b""
        record = codec.DeadLetterRecord(
            reason=reason,
            source_topic=msg.topic(),
            partition=partition,
            offset=offset,
            original=bytes(value),
            original_key=msg.key(),
            dead_ms=int(time.time() * 1000),
        )

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self._fatal = KafkaException(err)
            else:
                mark.safe = True

        self._produce(self.topics.dead_letter, codec.encode_dead_letter(record), msg.key(), delivered)
        self.core.ledger.dead_lettered += 1
        self.counters.dead_lettered += 1
        log.warning("dead-lettered %s[%d]@%d: %s", msg.topic(), partition, offset, reason)

    def _control(self, now: int) -> None:
        for msg in self.control.consume(num_messages=10_000, timeout=0):
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                continue
            if msg.topic() == self.topics.contracts:
                self._contract(msg, now)
            else:
                self._completion(msg, now)

    def _contract(self, msg: Any, now: int) -> None:
        value = msg.value()
        consumer = (msg.key() or b"").decode("utf-8", "replace")
        if value is None:
            if consumer in self.core.consumers:
                returned = self.core.retire(consumer, now)
                log.info("consumer %s retired; %d batches go back to their lanes", consumer, len(returned))
            return
        try:
            rec = codec.decode_contract(value)
        except codec.DecodeError as exc:
            log.error("contracts: undecodable announcement for %r: %s", consumer, exc)
            return
        self.core.set_contract(rec.contract)
        self.counters.contracts += 1
        log.info("contract %s", rec.contract)

    def _completion(self, msg: Any, now: int) -> None:
        try:
            rec = codec.decode_completion(msg.value())
        except codec.DecodeError as exc:
            log.error("results: undecodable completion at %d: %s", msg.offset(), exc)
            return
        self.counters.completions += 1
        hit = self._cache_hit.setdefault(rec.batch_id, rec.cache_hit)
        done = self.core.item_done(rec.batch_id, rec.item_id, rec.status == "ok", now)
        if done is None:
            self.counters.unknown_completions += 1
        elif done:
            self.core.ledger.cache(rec.consumer, hit)
            self._cache_hit.pop(rec.batch_id, None)

    def _dispatch(self, now: int) -> None:
        for batch in self.core.dispatch(now):
            self._send_batch(batch)

    def _send_batch(self, batch: Batch) -> None:
        items = batch.items

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self._fatal = KafkaException(err)
                return
            self.counters.batches_delivered += 1
            for item in items:
                item.safe = True  # type: ignore[attr-defined]

        self._produce(
            self.topics.batches(batch.consumer), codec.encode_batch(batch), batch.batch_id.encode(), delivered
        )
        self.counters.batches_produced += 1

    def _produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: Callable[[Any, Any], None]
    ) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise RuntimeError(
                f"processor {self.settings.instance}: a produce failed: {self._fatal}"
            ) from self._fatal

    # -- offsets and checkpoints ---------------------------------------------------------------

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._commit(force=True)
        for tp in partitions:
            self.offsets.drop(tp.partition)

    def _commit(self, force: bool = False) -> None:
        now = self.now_ms()
        if not force and now - self._last_commit < self.settings.commit_interval_ms:
            return
        self._last_commit = now
        offsets = self.offsets.committable()
        if not offsets:
            return
        tps = [TopicPartition(self.topics.ingest, p, o) for p, o in offsets.items()]
        try:
            self.ingest.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            log.warning("ingest commit failed (will retry): %s", exc)
            return
        self.offsets.committed(offsets)
        self.counters.commits += 1

    def snapshot(self) -> codec.LedgerSnapshotRecord:
        """The ledger plus the gauges ``status`` shows, as one checkpoint record."""
        core = self.core
        counters = core.ledger.snapshot()
        st = core.table.stats
        counters.update(
            {
                "waiting_items": core.table.waiting_items,
                "waiting_tokens": core.table.waiting_tokens,
                "lanes_in_use": st.lanes_in_use,
                "lanes_in_use_peak": st.lanes_in_use_peak,
                "lane_budget": core.table.settings.lane_budget,
                "shapes": len(core.table.shapes),
                "lane_reuses": st.reuses,
                "new_lanes": st.new_lanes,
                "idle_reclaims": st.idle_reclaims,
                "shape_switches": core.shape_switches,
                "oversized": core.oversized,
                "unknown_completions": self.counters.unknown_completions,
                "unsafe_offsets": self.offsets.unsafe(),
            }
        )
        per_consumer: dict[str, dict[str, int]] = {}
        for name, state in core.consumers.items():
            c = state.contract
            per_consumer[name] = {
                "in_flight_batches": len(state.in_flight),
                "max_inflight": c.max_inflight,
                "budget_tokens": c.budget_tokens,
                "max_items": c.max_items,
                "pad_multiple": c.pad_multiple,
                "shape_switches": state.shape_switches,
            }
        self._checkpoint_seq += 1
        return codec.LedgerSnapshotRecord(
            instance=self.settings.instance,
            taken_ms=int(time.time() * 1000),
            sequence=self._checkpoint_seq,
            counters=counters,
            per_model={},
            per_consumer=per_consumer,
        )

    def _checkpoint(self, force: bool = False) -> None:
        now = self.now_ms()
        if not force and now - self._last_checkpoint < self.settings.checkpoint_interval_ms:
            return
        self._last_checkpoint = now
        self.core.check(deep=force)

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                log.error("accounting checkpoint not delivered: %s", err)

        self._produce(
            self.topics.accounting,
            codec.encode_ledger_snapshot(self.snapshot()),
            self.settings.instance.encode(),
            delivered,
        )
        self.counters.checkpoints += 1
