"""The producer library (processor/apps/producer.py) without a broker: synthetic tokens. Against a
broker: tests/broker/test_producer_consumer.py."""

from __future__ import annotations

import time

import pytest

from processor.apps.producer import SYNTHETIC_VOCAB, TokenProducer, synthetic_tokens
from processor.kafka.memory import MemoryKafka
from processor.kafka.topics import TopicNames
from processor.wire.heads import decode_item_head
from processor.wire.items import decode_token_item
from processor.wire.records import ids_from_tokens
from processor.wire.request import GenerationRequest

# ------------------------------------------------------------------------------------------------
# synthetic tokens


def test_synthetic_tokens_are_deterministic_distinct_and_in_vocab() -> None:
    a = synthetic_tokens("job:1", 5000)
    assert len(a) == 4 * 5000
    assert a == synthetic_tokens("job:1", 5000)
    assert a != synthetic_tokens("job:2", 5000)
    assert synthetic_tokens("job:1", 10) == a[:40]  # a prefix of the same window
    assert max(ids_from_tokens(a)) < SYNTHETIC_VOCAB
    assert synthetic_tokens("x", 0) == b""
    longer = synthetic_tokens("x", 3_000_000)  # longer than the precomputed block
    assert len(longer) == 12_000_000
    with pytest.raises(ValueError, match="length"):
        synthetic_tokens("x", -1)


def test_synthetic_tokens_are_cheap() -> None:
    synthetic_tokens("warm-up", 1)  # builds the block once
    started = time.perf_counter()
    total = 0
    for i in range(25_000):
        total += len(synthetic_tokens(f"job:{i}", 4_000)) // 4
    elapsed = time.perf_counter() - started
    assert total == 100_000_000
    assert elapsed < 5.0, f"100M synthetic tokens took {elapsed:.2f} s"


# ------------------------------------------------------------------------------------------------
# a generation request per item


def test_send_puts_the_items_request_on_the_wire_and_refuses_an_invalid_one() -> None:
    """``TokenProducer.send(request=...)`` writes the request into the TokenItem, so the processor
    schedules it under its serving key; an invalid request is refused before anything is sent."""
    cluster = MemoryKafka()
    topics = TopicNames()
    cluster.create_topic(topics.ingest)
    request = GenerationRequest(adapter="support-tone", temperature=0.0, seed=7, choices=("yes", "no"))
    with TokenProducer({}, topics, clients=cluster.clients()) as producer:
        producer.send("a", "llama-3-8b", synthetic_tokens("a", 5), request=request)
        producer.send("b", "llama-3-8b", synthetic_tokens("b", 5))
        with pytest.raises(ValueError, match="invalid request: top_p 0"):
            producer.send("c", "llama-3-8b", synthetic_tokens("c", 5), request=GenerationRequest(top_p=0.0))
    values = [record.value for _p, _o, record in cluster.records(topics.ingest)]
    assert [decode_token_item(v).request for v in values] == [request, None]
    assert [decode_item_head(v).model for v in values] == ["llama-3-8b@support-tone", "llama-3-8b"]
    assert producer.sent == 2
