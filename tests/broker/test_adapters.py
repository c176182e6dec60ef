"""Adapters are part of the cache key, against a real broker (issue #26, processor/core/serving.py).

Items of one model and one shape go out for the base model, two LoRA adapters and a third adapter
no consumer serves. Only the adapter tells them apart, so a scheduler keying by model alone would
mix them in one batch. Three in-process consumer apps serve the base model and the two adapters.
Every batch read back from each batch topic holds only its consumer's serving key; every served
item is dispatched once and completes ok under its key; the fourth adapter's items wait and
``status`` names them unserved as ``model@adapter``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.apps.served import item_serving_key
from processor.core.contract import Contract
from processor.core.serving import serving_key
from processor.kafka.reader import read_topic
from processor.ops.status import gather, report
from processor.wire.completions import decode_completions
from processor.wire.items import decode_batch
from processor.wire.request import GenerationRequest
from tests.broker.rig import running_in_process, wait_for

pytestmark = pytest.mark.kafka

MODEL = "llama-test"
SHAPE = 7
ADAPTERS = ("", "support-tone", "legal")
UNSERVED = "french"
PER_KEY = 40


def contract(consumer: str, adapter: str) -> Contract:
    return Contract(consumer, serving_key(MODEL, adapter), budget_tokens=2048, max_items=16, max_inflight=2)


CONTRACTS = {serving_key(MODEL, a): contract(f"card-{a or 'base'}", a) for a in ADAPTERS}


def test_items_of_two_adapters_and_the_base_model_never_share_a_batch_and_unserved_adapters_show(
    kafka_bootstrap: str,
) -> None:
    sent: dict[str, str] = {}  # item id -> its serving key
    with running_in_process(
        kafka_bootstrap, CONTRACTS.values(), letter="a", instance="adapters", commit_interval_ms=300
    ) as rig:
        with TokenProducer(rig.conf, rig.topics) as producer:
            for i in range(PER_KEY):  # interleaved, one shape: only the adapter separates them
                for adapter in (*ADAPTERS, UNSERVED):
                    item_id = f"{adapter or 'base'}-{i}"
                    request = GenerationRequest(adapter=adapter, seed=i) if adapter else None
                    tokens = synthetic_tokens(item_id, 20 + i % 30)
                    producer.send(item_id, MODEL, tokens, shape=SHAPE, request=request)
                    sent[item_id] = serving_key(MODEL, adapter)
        served = {item_id for item_id, key in sent.items() if key in CONTRACTS}

        def completed() -> list[tuple[str, str, str]]:
            return [
                (c.item_id, c.model, c.status)
                for msg in read_topic(rig.conf, rig.topics.results)
                for c in decode_completions(msg.value())
            ]

        wait_for(lambda: {c[0] for c in completed()} >= served, 90, "every served item's completion")
        unserved_key = serving_key(MODEL, UNSERVED)

        def unserved() -> list[tuple[str, int, list[str]]]:
            rep = report(gather(rig.conf, rig.topics, f"{rig.topics.prefix}-proc"), rig.topics)
            return [(u.model, u.items, u.consumers) for u in rep.unserved]

        wait_for(lambda: unserved() == [(unserved_key, PER_KEY, [])], 30, "status to name the adapter")

    dispatched: Counter[str] = Counter()
    batches = 0
    for key, c in CONTRACTS.items():
        for msg in read_topic(rig.conf, rig.topics.batches(c.consumer)):
            batch = decode_batch(msg.value())
            batches += 1
            assert (batch.consumer, batch.model) == (c.consumer, key)
            keys = {item_serving_key(it) for it in batch.items}
            assert keys == {key}, f"batch {batch.batch_id} for {key} holds items of {sorted(keys)}"
            assert all(it.model == MODEL for it in batch.items)  # items keep their base model on the wire
            dispatched.update(it.item_id for it in batch.items)
    assert batches >= len(CONTRACTS)
    assert set(dispatched) == served and max(dispatched.values()) == 1
    done = completed()
    assert sorted(done) == sorted((i, sent[i], "ok") for i in served)  # once each, ok, under its key
