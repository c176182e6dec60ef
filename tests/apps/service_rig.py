"""A processor service over the in-memory Kafka, and the other side of the pipeline played by hand.

``Pipeline`` owns one :class:`~processor.kafka.memory.MemoryKafka` with a pipeline's topics; it
produces items and contracts as producers and consumer apps would, answers batches with completions,
and reads back what ``read_committed`` readers see. Services are built with the cluster's client
factory and a clock the test moves, so every step of the loop runs as in production, without a broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.apps.service import ProcessorService
from processor.apps.settings import ProcessorSettings
from processor.core.contract import Contract
from processor.kafka.memory import MemoryKafka
from processor.kafka.topics import TopicNames, topic_specs
from processor.wire.completions import encode_completion_batch
from processor.wire.control import decode_dead_letter, decode_ledger_snapshot, encode_contract
from processor.wire.items import decode_batch, encode_token_item
from processor.wire.records import (
    BatchRecord,
    CompletionBatchRecord,
    ContractRecord,
    DeadLetterRecord,
    ItemOutcomeRecord,
    LedgerSnapshotRecord,
    new_token_item,
)

MODEL = "m"
CARD = "card"
#: What a service's wall clock reads at its start, unless a test says otherwise (2023-11-14).
EPOCH_MS = 1_700_000_000_000


def contract(consumer: str = CARD, *, items: int = 2, inflight: int = 4, budget: int = 4096) -> Contract:
    return Contract(
        consumer, MODEL, budget_tokens=budget, max_items=items, pad_multiple=8, max_inflight=inflight
    )


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Pipeline:
    partitions: int = 2
    consumers: tuple[str, ...] = (CARD,)
    mk: MemoryKafka = field(default_factory=MemoryKafka)
    topics: TopicNames = field(default_factory=lambda: TopicNames("svc"))
    clock: Clock = field(default_factory=Clock)

    def __post_init__(self) -> None:
        self.mk.create_topics(
            topic_specs(self.topics, ingest_partitions=self.partitions, consumers=self.consumers)
        )
        self._producer = self.mk.clients().producer({})

    def service(self, instance: str = "p0", wall_ms: int = EPOCH_MS, **settings: object) -> ProcessorService:
        """A service whose wall clock read ``wall_ms`` when it started (its core's clock then moves
        with the rig's monotonic clock)."""
        s = ProcessorSettings(instance=instance, group_id=self.topics.processor_group, **settings)  # type: ignore[arg-type]
        return ProcessorService(
            {}, self.topics, s, clock=self.clock, clients=self.mk.clients(), wall_ms=lambda: wall_ms
        )

    def started(self, instance: str = "p0", wall_ms: int = EPOCH_MS, **settings: object) -> ProcessorService:
        svc = self.service(instance, wall_ms, **settings)
        svc.start()
        return svc

    # -- the producers' and consumers' side ----------------------------------------------------

    def produce(self, ids: list[str], partition: int = 0, length: int = 4, model: str = MODEL) -> None:
        for item_id in ids:
            rec = new_token_item(item_id, model, range(1, length + 1), 0, shape_components=["sys"])
            self.send(self.topics.ingest, encode_token_item(rec), item_id.encode(), partition)

    def send(self, topic: str, value: bytes | None, key: bytes | None, partition: int = -1) -> None:
        self._producer.produce(topic, value, key, partition=partition)
        self._producer.flush()

    def announce(self, c: Contract) -> None:
        self.send(self.topics.contracts, encode_contract(ContractRecord(c, 0)), c.consumer.encode())

    def retire(self, consumer: str) -> None:
        self.send(self.topics.contracts, None, consumer.encode())

    def batches(self, consumer: str = CARD) -> list[BatchRecord]:
        return [decode_batch(r.value) for _p, _o, r in self.mk.records(self.topics.batches(consumer))]

    def answer(self, batch: BatchRecord, ok: bool = True, only: int | None = None) -> None:
        """The consumer's completions of ``batch`` (its first ``only`` items), one message."""
        items = batch.items if only is None else batch.items[:only]
        outcomes = [
            ItemOutcomeRecord(
                item_id=it.item_id,
                status="ok" if ok else "failed",
                input_tokens=it.token_count,
                reason=None if ok else "engine error",
            )
            for it in items
        ]
        rec = CompletionBatchRecord(
            batch_id=batch.batch_id,
            consumer=batch.consumer,
            model=batch.model,
            padded_tokens=batch.padded_length * len(items),
            completed_ms=5,
            items=outcomes,
        )
        self.send(self.topics.results, encode_completion_batch(rec), batch.batch_id.encode(), 0)

    def dead_letters(self) -> list[DeadLetterRecord]:
        return [decode_dead_letter(r.value) for _p, _o, r in self.mk.records(self.topics.dead_letter)]

    def checkpoints(self, instance: str = "p0") -> list[LedgerSnapshotRecord]:
        return [
            decode_ledger_snapshot(r.value)
            for _p, _o, r in self.mk.records(self.topics.accounting)
            if r.key == instance.encode()
        ]

    def steps(self, svc: ProcessorService, n: int = 3, ms: int = 600) -> None:
        """``n`` loop steps, the clock moving ``ms`` before each (past the commit interval)."""
        for _ in range(n):
            self.clock.t += ms / 1000
            svc.step()
