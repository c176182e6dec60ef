"""A consumer of one adapter (processor/apps/served.py, processor/apps/consumer.py), without a broker.

The batch names its serving key (``model@adapter``); each item names its base model and its request's
adapter. The consumer checks the items' serving keys against its contract, so it runs only its own
adapter's items, and it hands the engine the batch with the real model. Against a broker:
tests/broker/test_adapters.py.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import Message

from processor.apps.consumer import ConsumerApp
from processor.apps.producer import synthetic_tokens
from processor.apps.served import checked_view, engine_view, item_serving_key
from processor.core.contract import Contract, contract_violation
from processor.core.item import Batch, Item
from processor.core.serving import serving_key
from processor.core.signature import shape_signature
from processor.engines.base import Engine, ItemResult
from processor.kafka.topics import TopicNames
from processor.wire.completions import decode_completions
from processor.wire.items import encode_batch
from processor.wire.records import BatchRecord, TokenItemRecord
from processor.wire.request import GenerationRequest
from tests.apps.test_consumer import BatchMessage, KeptProducer

MODEL = "llama-test"
TONE = serving_key(MODEL, "support-tone")
SHAPE = shape_signature(["You are a support agent."])


def item(item_id: str, adapter: str = "") -> TokenItemRecord:
    """A base-model item, or one whose request names ``adapter``."""
    return TokenItemRecord(
        item_id=item_id,
        job_id="job-1",
        model=MODEL,
        shape=SHAPE,
        token_count=6,
        tokens=synthetic_tokens(item_id, 6),
        produced_ms=1_000,
        request=GenerationRequest(adapter=adapter, temperature=0.0) if adapter else None,
    )


def batch_of(key: str, items: list[TokenItemRecord], consumer: str = "card-tone") -> BatchRecord:
    return BatchRecord(
        batch_id="b-1",
        consumer=consumer,
        model=key,
        shape=SHAPE,
        lane=0,
        padded_length=8,
        pad_multiple=8,
        created_ms=1_500,
        items=items,
    )


def contract(key: str = TONE, consumer: str = "card-tone") -> Contract:
    return Contract(consumer, key, budget_tokens=4096, max_items=8)


def test_an_items_serving_key_is_its_model_and_its_requests_adapter() -> None:
    assert item_serving_key(item("a")) == MODEL
    assert item_serving_key(item("b", "support-tone")) == TONE
    plain = TokenItemRecord(**{**_fields(item("c")), "request": GenerationRequest(temperature=0.5)})
    assert item_serving_key(plain) == MODEL  # a request without an adapter is base-model work


def _fields(rec: TokenItemRecord) -> dict[str, Any]:
    return {name: getattr(rec, name) for name in TokenItemRecord.__dataclass_fields__}


def test_an_adapters_consumer_accepts_its_own_adapters_batch() -> None:
    batch = batch_of(TONE, [item("a", "support-tone"), item("b", "support-tone")])
    assert contract_violation(contract(), checked_view(batch)) is None


@pytest.mark.parametrize(
    ("key", "items", "named"),
    [
        (TONE, [item("a", "support-tone"), item("b")], f"items of model(s) {MODEL} in a batch for {TONE!r}"),
        (TONE, [item("a", "support-tone"), item("b", "legal")], f"{MODEL}@legal in a batch for {TONE!r}"),
        (MODEL, [item("a"), item("b", "support-tone")], f"{TONE} in a batch for {MODEL!r}"),
    ],
    ids=["base-item-in-adapter-batch", "other-adapter", "adapter-item-in-base-batch"],
)
def test_an_item_of_another_serving_key_breaks_the_contract(
    key: str, items: list[TokenItemRecord], named: str
) -> None:
    """Checked by serving key: the base model's items and another adapter's are another key."""
    violation = contract_violation(contract(key), checked_view(batch_of(key, items)))
    assert violation is not None and named in violation


def test_a_batch_for_another_serving_key_breaks_the_contract() -> None:
    batch = batch_of(serving_key(MODEL, "legal"), [item("a", "legal")])
    violation = contract_violation(contract(), checked_view(batch))
    assert violation == f"batch model {MODEL + '@legal'!r}, contract model {TONE!r}"


def test_the_engine_gets_the_base_model_and_the_items_untouched() -> None:
    items = [item("a", "support-tone"), item("b", "support-tone")]
    batch = batch_of(TONE, items)
    run = engine_view(batch)
    assert run.model == MODEL and run.items is batch.items and run.batch_id == batch.batch_id
    base = batch_of(MODEL, [item("c")])
    assert engine_view(base) is base and checked_view(base) is base


class _Recording(Engine):
    """Answers every item ok and keeps the batches it was handed."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[BatchRecord] = []

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        self.seen.append(batch)
        return [ItemResult(it.item_id, "ok", b"out", 2, None, False) for it in batch.items]


def _handle(app: ConsumerApp, batch: Batch) -> tuple[KeptProducer, list[Any]]:
    kept = KeptProducer()
    app.output.producer = cast(Any, kept)
    app.handle(cast(Message, BatchMessage(encode_batch(batch))))
    return kept, [c for _topic, _key, value in kept.sent for c in decode_completions(value)]


def _wire_batch(key: str, records: list[TokenItemRecord]) -> Batch:
    """What the processor writes: a batch of ``key`` whose items are the producers' records."""
    items = [
        Item(r.item_id, item_serving_key(r), r.shape, r.token_count, r.produced_ms, payload=r)
        for r in records
    ]
    return Batch("b-1", "card-tone", key, SHAPE, 0, 8, 8, items, 1_500)


def test_the_app_runs_its_adapters_batch_with_the_real_model_and_answers_under_the_serving_key() -> None:
    engine = _Recording()
    app = ConsumerApp({}, TopicNames("unit"), contract(), engine)
    _kept, done = _handle(app, _wire_batch(TONE, [item("a", "support-tone"), item("b", "support-tone")]))
    assert [b.model for b in engine.seen] == [MODEL]
    assert [i.request.adapter for i in engine.seen[0].items if i.request] == ["support-tone"] * 2
    assert [(c.item_id, c.status, c.model) for c in done] == [("a", "ok", TONE), ("b", "ok", TONE)]


def test_the_app_rejects_a_batch_holding_another_adapters_item_and_never_runs_it() -> None:
    engine = _Recording()
    app = ConsumerApp({}, TopicNames("unit"), contract(), engine)
    _kept, done = _handle(app, _wire_batch(TONE, [item("a", "support-tone"), item("b", "legal")]))
    assert engine.seen == []
    assert {c.status for c in done} == {"rejected"}
    assert all(c.reason and f"{MODEL}@legal" in c.reason for c in done)
    assert app.stats.rejected == 2
