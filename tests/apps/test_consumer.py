"""The consumer app (processor/apps/consumer.py) without a broker: the completions it writes for a
batch, in either form. Against a broker: tests/broker/test_producer_consumer.py."""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import Message

from processor.apps.consumer import ConsumerApp, ConsumerSettings
from processor.core.signature import shape_signature
from processor.engines.base import Engine, ItemResult
from processor.engines.sim import SimEngine
from processor.kafka.topics import TopicNames
from processor.sim.cardmodel import CardSpec
from processor.wire.completions import decode_completions
from processor.wire.items import encode_batch
from processor.wire.records import BatchRecord, CompletionForm
from processor.wire.schemas import schema_of
from tests.apps.helpers import card_contract, outgoing_batch, token_record


class KeptProducer:
    """Stands in for the app's Kafka producer: keeps what is produced, delivers all of it at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: object = None) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout: float = 0) -> int:
        return 0


class BatchMessage:
    """The one method of a Kafka message that :meth:`ConsumerApp.handle` reads for a good batch."""

    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


@pytest.mark.parametrize(
    ("completions", "max_bytes", "messages"),
    [("batch", 900_000, 1), ("batch", 120, 3), ("item", 900_000, 5)],
    ids=["batch", "batch-split", "item"],
)
def test_the_consumer_app_writes_a_batchs_completions_in_its_form(
    completions: CompletionForm, max_bytes: int, messages: int
) -> None:
    """No broker: the app's producer is replaced and one batch of five items handed to ``handle``.
    At 120 bytes a CompletionBatch holds two of these items, so the batch goes out in three."""
    names = TopicNames("unit")
    engine = SimEngine(CardSpec(), time_scale=0.0)
    settings = ConsumerSettings(completions=completions, max_completion_bytes=max_bytes)
    app = ConsumerApp({}, names, card_contract("card-a"), engine, settings)
    kept = KeptProducer()
    app.output.producer = cast(Any, kept)
    records = [token_record(f"item-{n}", 8 + n, shape_signature(["s"])) for n in range(5)]
    batch = encode_batch(outgoing_batch("b-1", "card-a", records, padded_length=16))
    app.handle(cast(Message, BatchMessage(batch)))
    assert len(kept.sent) == messages
    done = [c for _topic, _key, value in kept.sent for c in decode_completions(value)]
    assert [c.item_id for c in done] == [r.item_id for r in records]  # every item once, in order
    assert {(c.batch_id, c.consumer, c.padded_tokens, c.status) for c in done} == {
        ("b-1", "card-a", 16, "ok")
    }
    form = "Completion" if completions == "item" else "CompletionBatch"
    for topic, key, value in kept.sent:
        first = decode_completions(value)[0]
        assert (topic, schema_of(value)) == (names.results, form)
        assert len(value) <= max_bytes
        assert key == (first.item_id if completions == "item" else first.batch_id).encode()
    assert (app.stats.items, app.stats.ok) == (5, 5)


def test_the_consumer_app_refuses_an_unknown_completions_form() -> None:
    engine = SimEngine(CardSpec(), time_scale=0.0)
    with pytest.raises(ValueError, match="completions must be one of batch, item, got 'each'"):
        ConsumerApp(
            {}, TopicNames("unit"), card_contract(), engine, ConsumerSettings(completions=cast(Any, "each"))
        )


class _ReportingEngine(Engine):
    """Reports cached prompt tokens as a generation server would: some too many, one item failed."""

    name = "reporting"

    def __init__(self, cached: list[int], failed: int) -> None:
        self.cached, self.failed = cached, failed

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        return [
            ItemResult(it.item_id, "failed", b"", 0, "boom", False, n)
            if i == self.failed
            else ItemResult(it.item_id, "ok", b"out", 2, None, False, n)
            for i, (it, n) in enumerate(zip(batch.items, self.cached, strict=True))
        ]


def test_the_consumer_app_writes_each_items_cached_tokens_held_to_its_prompt() -> None:
    """cached_tokens is the engine's count held to [0, the item's tokens], 0 unless ok; cache_hit
    follows it for old readers; the app's stats count the cached tokens of ok items."""
    app = ConsumerApp({}, TopicNames("unit"), card_contract("card-a"), _ReportingEngine([0, 5, 99, -3, 7], 4))
    kept = KeptProducer()
    app.output.producer = cast(Any, kept)
    records = [token_record(f"item-{n}", 10, shape_signature(["s"])) for n in range(5)]
    app.handle(
        cast(Message, BatchMessage(encode_batch(outgoing_batch("b-1", "card-a", records, padded_length=16))))
    )
    done = [c for _topic, _key, value in kept.sent for c in decode_completions(value)]
    assert [(c.cached_tokens, c.cache_hit) for c in done] == [
        (0, False),
        (5, True),
        (10, True),
        (0, False),
        (0, False),
    ]
    assert [c.status for c in done] == ["ok", "ok", "ok", "ok", "failed"]
    assert app.stats.cached_prompt_tokens == 15


class OneBatch:
    """A batch-topic consumer with one good message waiting."""

    def __init__(self, msg: object) -> None:
        self.msgs = [msg]

    def poll(self, timeout: float) -> object:
        return self.msgs.pop(0) if self.msgs else None


class GoodMessage(BatchMessage):
    def error(self) -> None:
        return None


def test_a_round_that_saw_kafka_go_away_ends_before_its_next_transaction() -> None:
    """librdkafka#5456/#5511: an app idle through a broker restart blocks for ever in its first
    ``send_offsets_to_transaction``. A round that saw an outage ends as one (the ride starts a
    round with fresh clients) before it delivers anything; one that saw none delivers."""
    from processor.kafka.exits import TransientFailure
    from processor.kafka.outage import is_outage

    engine = SimEngine(CardSpec(), time_scale=0.0)
    app = ConsumerApp({}, TopicNames("unit"), card_contract("card-a"), engine, ConsumerSettings())
    delivered: list[object] = []
    app.delivery.deliver = lambda consumer, msg, handle: delivered.append(msg)  # type: ignore[method-assign]
    msg = GoodMessage(b"")
    app.stale = lambda: True
    with pytest.raises(TransientFailure, match="Kafka went away meanwhile") as ended:
        app._loop(cast(Any, OneBatch(msg)), _stop_after_one())
    assert delivered == [] and is_outage(ended.value)
    app.stale = lambda: False
    app._loop(cast(Any, OneBatch(msg)), _stop_after_one())
    assert delivered == [msg]


def _stop_after_one() -> Any:
    """A stop event that is set once the loop has asked twice (one message, then an empty poll)."""

    class Stop:
        asked = 0

        def is_set(self) -> bool:
            self.asked += 1
            return self.asked > 2

    return Stop()
