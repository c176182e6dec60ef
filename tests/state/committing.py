"""A delivery mode's roles wired as the processor service wires them, over the in-memory Kafka: the
same client settings (processor/kafka/clients.py), a real scheduler behind ``is_in_flight`` and
``done_items``, and helpers to consume items, dispatch them and read back what ``read_committed``
readers see."""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.core.contract import Contract
from processor.core.item import Batch
from processor.core.scheduler import Scheduler
from processor.kafka.clients import batch_producer_settings, control_settings, ingest_settings
from processor.kafka.factory import ConsumerClient, ProducerClient
from processor.kafka.memory import MemoryKafka
from processor.kafka.topics import TopicNames, topic_specs
from processor.state import modes
from processor.state.credits import CreditBook
from processor.state.durability import CommitClients
from processor.state.ingest import IngestItem
from processor.state.modes import DeliveryMode, ExactlyOnceOptions
from processor.state.placement import Placement
from processor.state.results import ResultsCursor
from processor.wire.heads import decode_item_head
from processor.wire.items import encode_token_item
from processor.wire.records import new_token_item

CONSUMER = "card"
MODEL = "m"
TXN_TIMEOUT_MS = 10_000
CONTRACT = Contract(CONSUMER, MODEL, budget_tokens=4096, max_items=2, pad_multiple=8, max_inflight=4)


@dataclass
class Clock:
    """Monotonic and wall-clock seconds for a transaction's age; tests move it."""

    t: float = 1_000.0

    def stamp(self) -> tuple[float, float]:
        return self.t, self.t


@dataclass
class Rig:
    mk: MemoryKafka
    topics: TopicNames
    producer: ProducerClient
    ingest: ConsumerClient
    control: ConsumerClient
    core: Scheduler
    clock: Clock
    mode: DeliveryMode
    credits: CreditBook = field(default_factory=lambda: CreditBook(2))
    results: ResultsCursor = field(default_factory=ResultsCursor)

    def produce_items(self, partition: int, ids: list[str], length: int = 4) -> None:
        producer = self.mk.clients().producer({})
        for item_id in ids:
            rec = new_token_item(item_id, MODEL, range(1, length + 1), 0, shape_components=["sys"])
            producer.produce(
                self.topics.ingest, encode_token_item(rec), item_id.encode(), partition=partition
            )
        producer.flush()

    def consume(self, n: int = 100) -> list[IngestItem]:
        """The next ingest messages as the service makes items of them, told to the lane log."""
        items = []
        for msg in self.ingest.consume(n, 0):
            head = decode_item_head(msg.value())
            item = IngestItem.from_head(head, 0, msg.partition(), msg.offset())
            self.mode.lane_log.item_seen(item)
            items.append(item)
        self.core.submit_many(items, [0] * len(items))
        return items

    def dispatch(self) -> list[Batch]:
        """Dispatch as the service's ``_send_batch`` does: a placement, then the produce."""
        batches = self.core.dispatch(0)
        for batch in batches:
            placement = self.mode.placement.place(batch, self.credits, CONTRACT.max_inflight, self.results)
            self.mode.lane_log.batch_emitted(batch, placement)
            delivered = self.mode.durability.batch_delivery()
            self.mode.durability.produce(
                self.topics.batches(CONSUMER), b"batch", batch.batch_id.encode(), delivered
            )
        return batches

    def commit(self) -> float:
        return self.mode.durability.commit(lambda: b"checkpoint")

    def visible(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) of what a read_committed reader of ``topic`` would see."""
        return [(r.key, r.value) for _p, _o, r in self.mk.records(topic)]

    def committed_offsets(self) -> dict[int, int]:
        return {
            p: o
            for (t, p), o in self.mk.groups[self.topics.processor_group].committed.items()
            if t == self.topics.ingest
        }


def rig(exactly_once: bool = True, dedupe_window_ms: int = 0, partitions: int = 2) -> Rig:
    """A delivery mode of either kind with its clients, subscribed to a fresh pipeline's ingest topic."""
    mk = MemoryKafka()
    topics = TopicNames("mem")
    mk.create_topics(topic_specs(topics, ingest_partitions=partitions, consumers=[CONSUMER]))
    clients = mk.clients()
    group = topics.processor_group
    ingest = clients.consumer(ingest_settings({}, group, 45_000, "p0"))
    control = clients.consumer(control_settings({}, f"{group}-control-p0"))
    core = Scheduler()
    clock = Clock()
    if exactly_once:
        producer = clients.producer(batch_producer_settings({}, f"{group}-p0", TXN_TIMEOUT_MS))
        options = ExactlyOnceOptions(
            is_in_flight=core.is_in_flight,
            done_items=core.done_items,
            eager_ms=50,
            dedupe_window_ms=dedupe_window_ms,
            dedupe_max_ids=1_000,
            wall_ms=lambda: int(clock.t * 1000),
            stamp=clock.stamp,
        )
        mode = modes.exactly_once(CommitClients(producer, ingest, control), topics, "p0", 500, options)
    else:
        producer = clients.producer(batch_producer_settings({}))
        mode = modes.at_least_once(CommitClients(producer, ingest, control), topics, "p0", 500)
    out = Rig(mk, topics, producer, ingest, control, core, clock, mode, CreditBook(partitions))
    ingest.subscribe([topics.ingest])
    ingest.consume(0, 0)  # joins the group: every partition is this member's
    out.credits.reassign(frozenset(range(partitions)))
    core.set_contract(CONTRACT, mode.placement.slot_share(out.credits, CONTRACT.max_inflight))
    mode.durability.start(None)
    return out


__all__ = ["CONSUMER", "CONTRACT", "MODEL", "TXN_TIMEOUT_MS", "Placement", "Rig", "rig"]
