"""The plain Kafka queue: what a team runs without tokenfabric, as a baseline for the demo and benchmarks.

Not a product mode. Every card's app joins ONE consumer group on the ingest topic, so Kafka splits
the partitions between the cards, and each app packs what it reads **in arrival order** into batches
under the same contract a tokenfabric consumer announces (``Contract``: padded-token budget, most
items, pad multiple; the one ``BatchRule``), runs the same engine, and writes the same completion
records to the results topic. No lanes, no shape stickiness, no processor: the only difference from
tokenfabric is who decides what goes into a batch.

Packing: items are appended while the batch still fits the rule; the item that does not fit closes the
batch and opens the next one; a batch also closes at ``max_items`` or when no item arrived for
``linger_ms``. An item longer than the budget travels alone (as the processor sends it).

Delivery: exactly-once, as the consumer app (processor.apps.consumer): one batch's completions and the
ingest offsets just past its items commit in one transaction (``transactional.id``
``<prefix>-plain-<id>``), read ``read_committed``. Items read but not yet batched belong to no
transaction: when a rebalance takes their partition away they are dropped here and re-read by the new
owner from the committed offset, so every item completes once. An item that does not decode goes to the
dead-letter topic in the transaction of the batch it would have joined.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from processor.apps.consumer import PRODUCER_SETTINGS, ConsumerStats, item_completion
from processor.apps.deadletters import dead_letter_of
from processor.apps.settings import MAX_COMPLETION_BYTES, PlainQueueSettings
from processor.core.contract import BatchRule, Contract
from processor.engines.base import Engine, ItemResult
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient, ProducerClient
from processor.kafka.topics import TopicNames
from processor.wire.completions import encode_completion_batches
from processor.wire.control import encode_dead_letter
from processor.wire.errors import DecodeError
from processor.wire.items import decode_token_item
from processor.wire.records import BatchRecord, CompletionBatchRecord, TokenItemRecord

log = logging.getLogger("tokenfabric.plainqueue")


def plain_group(topics: TopicNames) -> str:
    """The one consumer group every card of the plain queue joins."""
    return f"{topics.prefix}-plain-queue"


@dataclass(frozen=True, slots=True)
class _Read:
    """One ingest message read and not yet committed: its position and its item (None: undecodable)."""

    partition: int
    offset: int
    item: TokenItemRecord | None
    msg: Message
    error: DecodeError | None = None


class PlainQueueApp:
    """One card of the plain queue. ``run`` it once, in any thread; ``stop`` ends it after a batch."""

    #: The first word of this app's batch ids (the share-group queue reuses the batch code).
    batch_prefix = "plain"

    def __init__(
        self,
        conf: Mapping[str, str],
        topics: TopicNames,
        contract: Contract,
        engine: Engine,
        *,
        linger_ms: float = 50.0,
        idle_exit_s: float | None = None,
        poll_timeout_s: float = 0.5,
        on_batch: Callable[[ConsumerStats], None] | None = None,
        clients: ClientFactory = KAFKA,
    ) -> None:
        self.settings = PlainQueueSettings(linger_ms, idle_exit_s)
        self.conf = dict(conf)
        self.clients = clients
        self.topics = topics
        self.contract = contract
        self.engine = engine
        self.rule: BatchRule = contract.rule
        self.poll_timeout_s = poll_timeout_s
        self.on_batch = on_batch
        self.stats = ConsumerStats()
        self._run_id = uuid.uuid4().hex[:8]
        self._pending: list[_Read] = []
        self._producer: ProducerClient | None = None

    # -- the loop -------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> ConsumerStats:
        stop = stop or threading.Event()
        producer_conf: dict[str, str] = {
            **self.conf,
            **PRODUCER_SETTINGS,
            "transactional.id": f"{self.topics.prefix}-plain-{self.contract.consumer}",
        }
        self._producer = self.clients.producer(producer_conf)
        self._producer.init_transactions(60)
        consumer = self.clients.consumer(
            {
                **self.conf,
                "group.id": plain_group(self.topics),
                "enable.auto.commit": "false",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.subscribe([self.topics.ingest], on_revoke=self._revoked, on_lost=self._revoked)
            log.info(
                "plain queue %s: budget %d, items %d, pad %d, engine %s; reading %s in group %s",
                self.contract.consumer,
                self.contract.budget_tokens,
                self.contract.max_items,
                self.contract.pad_multiple,
                self.engine.name,
                self.topics.ingest,
                plain_group(self.topics),
            )
            self._loop(consumer, stop)
            if self._pending:
                self._flush(consumer)
        finally:
            self._close(consumer)
        return self.stats

    def _close(self, consumer: ConsumerClient) -> None:
        """The consumer closed, what the producer holds delivered, the engine closed."""
        consumer.close()
        if self._producer is not None:
            self._producer.flush(10.0)
        self.engine.close()

    def _loop(self, consumer: ConsumerClient, stop: threading.Event) -> None:
        linger_s, idle_exit_s = self.settings.linger_ms / 1000.0, self.settings.idle_exit_s
        last_item = time.monotonic()
        while not stop.is_set():
            wait = linger_s if self._pending else self.poll_timeout_s
            msg = consumer.poll(wait)
            if msg is None:
                if self._pending:
                    self._flush(consumer)
                elif idle_exit_s is not None and time.monotonic() - last_item >= idle_exit_s:
                    log.info("no item for %.1f s: exiting", idle_exit_s)
                    return
                continue
            error = msg.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer: %s", error.str())
                continue
            last_item = time.monotonic()
            read = self._decode(msg)
            if read.item is not None and self._pending and not self._fits(read.item):
                self._flush(consumer)
            self._pending.append(read)
            if sum(1 for r in self._pending if r.item is not None) >= self.rule.max_items:
                self._flush(consumer)

    def _decode(self, msg: Message) -> _Read:
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        try:
            return _Read(partition, offset, decode_token_item(msg.value()), msg)
        except DecodeError as exc:
            log.warning("%s[%d]@%d: undecodable (%s): dead-lettered", msg.topic(), partition, offset, exc)
            return _Read(partition, offset, None, msg, exc)

    def _fits(self, item: TokenItemRecord) -> bool:
        """Whether the pending batch still fits the contract with ``item`` added (arrival order)."""
        items = [r.item for r in self._pending if r.item is not None] + [item]
        return self.rule.fits(len(items), max(i.token_count for i in items))

    def _revoked(self, _consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        """Items of a partition taken away are the new owner's: drop them (never completed here)."""
        gone = {p.partition for p in partitions}
        kept = [r for r in self._pending if r.partition not in gone]
        if len(kept) != len(self._pending):
            dropped = len(self._pending) - len(kept)
            log.info("rebalance: %d read items left to the partitions' new owner", dropped)
        self._pending = kept

    # -- one batch ------------------------------------------------------------------------------

    def _flush(self, consumer: ConsumerClient) -> None:
        """Run the pending batch and commit its completions with its ingest offsets, in one transaction."""
        reads, self._pending = self._pending, []
        producer = self._producer
        assert producer is not None
        producer.begin_transaction()
        try:
            self._write(reads)
            ends: dict[int, int] = {}
            for r in reads:
                ends[r.partition] = max(ends.get(r.partition, -1), r.offset + 1)
            offsets = [TopicPartition(self.topics.ingest, p, o) for p, o in sorted(ends.items())]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
        except BaseException:
            try:
                producer.abort_transaction(30)
            except KafkaException as exc:
                log.error("could not abort the open transaction: %s", exc)
            raise
        if self.on_batch is not None:
            self.on_batch(self.stats)

    def _write(self, reads: list[_Read]) -> None:
        """The batch's completions and its undecodable messages' dead letters, produced."""
        items = [r.item for r in reads if r.item is not None]
        if items:
            self._run_batch(items)
        for r in reads:
            if r.item is None:
                self._dead_letter(r)

    def _run_batch(self, items: list[TokenItemRecord]) -> None:
        self.stats.batches += 1
        longest = max(i.token_count for i in items)
        batch = BatchRecord(
            batch_id=f"{self.batch_prefix}-{self.contract.consumer}-{self._run_id}-{self.stats.batches}",
            consumer=self.contract.consumer,
            model=self.contract.model,
            shape=items[0].shape,
            lane=0,
            padded_length=self.rule.padded_length(longest),
            pad_multiple=self.contract.pad_multiple,
            created_ms=time.time_ns() // 1_000_000,
            oversized=not self.rule.fits(len(items), longest),
            items=items,
        )
        started = time.perf_counter()
        results = self._results(batch)
        engine_ms = round((time.perf_counter() - started) * 1000)
        completed_ms = time.time_ns() // 1_000_000
        records = [
            item_completion(batch, item, result, engine_ms, completed_ms)
            for item, result in zip(batch.items, results, strict=True)
        ]
        assert self._producer is not None
        key = batch.batch_id.encode("utf-8")
        for value in encode_completion_batches(CompletionBatchRecord.of(records), MAX_COMPLETION_BYTES):
            self._producer.produce(self.topics.results, value, key)
        st = self.stats
        st.items += len(items)
        st.engine_ms += engine_ms
        st.input_tokens += sum(i.token_count for i in items)
        st.padded_tokens += batch.padded_length * len(items)
        st.ok += sum(1 for r in records if r.status == "ok")
        st.failed += sum(1 for r in records if r.status == "failed")
        st.rejected += sum(1 for r in records if r.status == "rejected")

    def _results(self, batch: BatchRecord) -> list[ItemResult]:
        """The engine's results; an item of another model is refused, an engine error fails them all."""
        wrong = [i for i in batch.items if i.model != self.contract.model]
        if wrong:
            reason = f"contract: model {wrong[0].model!r}, this card serves {self.contract.model!r}"
            return [ItemResult(i.item_id, "rejected", b"", 0, reason, False) for i in batch.items]
        try:
            results = self.engine.run(batch)
        except Exception as exc:  # the engine contract: raising fails the whole batch, not the app
            log.warning("batch %s failed in engine %s: %s", batch.batch_id, self.engine.name, exc)
            reason = f"engine error: {type(exc).__name__}: {exc}"
            return [ItemResult(i.item_id, "failed", b"", 0, reason, False) for i in batch.items]
        if [r.item_id for r in results] != [i.item_id for i in batch.items]:
            reason = f"engine-contract: {self.engine.name} returned {len(results)} results"
            return [ItemResult(i.item_id, "failed", b"", 0, reason, False) for i in batch.items]
        return results

    def _dead_letter(self, r: _Read) -> None:
        assert self._producer is not None
        assert r.error is not None
        rec = dead_letter_of(r.msg, r.error.reason, str(r.error), self.topics.ingest, r.partition, r.offset)
        self._producer.produce(self.topics.dead_letter, encode_dead_letter(rec), r.msg.key())
        self.stats.dead_lettered += 1
