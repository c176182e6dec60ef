"""Per-item generation requests through a real broker and the real processor (issue #26, the wire):
an item's request reaches its consumer inside the batch byte for byte, an item written before
``request`` existed still runs, and an invalid request or a model holding ``@`` goes to the
dead-letter topic with its reason while the good items complete."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.core.contract import Contract
from processor.kafka.reader import read_topic
from processor.wire.control import decode_dead_letter
from processor.wire.fastavro_io import PREVIOUS_TOKEN_ITEM
from processor.wire.items import decode_batch
from processor.wire.records import DeadLetterRecord, TokenItemRecord
from processor.wire.request import GenerationRequest
from processor.wire.request_codec import request_to_avro
from tests.broker.rig import InProcess, running_in_process, wait_for
from tests.wire.helpers import item_dict, raw_item

pytestmark = pytest.mark.kafka

CARD = Contract("card-req", "default", budget_tokens=8192, max_items=32, pad_multiple=8, max_inflight=2)

REQUEST = GenerationRequest(temperature=0.0, seed=7, stop=("\n",), json_schema='{"type":"object"}')


@pytest.fixture
def pipeline(kafka_bootstrap: str) -> Iterator[InProcess]:
    with running_in_process(kafka_bootstrap, (CARD,), letter="rq", commit_interval_ms=300) as running:
        yield running


def test_requests_travel_to_the_consumer_and_invalid_ones_are_dead_lettered(pipeline: InProcess) -> None:
    bad = {
        raw_item(
            item_id="bad-request", model="default", request=request_to_avro(GenerationRequest(top_p=0.0))
        ): (
            "invalid-request",
            "top_p 0.0 is not in (0, 1]",
        ),
        raw_item(item_id="bad-model", model="default@tone"): ("invalid-model", "contains '@'"),
    }
    old = TokenItemRecord(
        item_id="written-before-requests",
        model="default",
        shape=7,
        token_count=3,
        tokens=synthetic_tokens("old", 3),
        produced_ms=1,
    )
    raw = Producer(pipeline.conf)
    for value in bad:
        raw.produce(pipeline.topics.ingest, value=value, key=b"k")
    raw.produce(pipeline.topics.ingest, value=PREVIOUS_TOKEN_ITEM.encode(item_dict(old)), key=b"k")
    raw.flush(30)
    with TokenProducer(pipeline.conf, pipeline.topics) as producer:
        producer.send("with-request", "default", synthetic_tokens("with", 5), shape=7, request=REQUEST)
        producer.send("without-request", "default", synthetic_tokens("without", 4), shape=7)

    def dead_letters() -> list[DeadLetterRecord]:
        return [decode_dead_letter(m.value()) for m in read_topic(pipeline.conf, pipeline.topics.dead_letter)]

    wait_for(lambda: len(dead_letters()) >= len(bad), 60, "the dead letters")
    letters = {bytes(d.original): d for d in dead_letters()}
    assert set(letters) == set(bad)
    for value, (reason, why) in bad.items():
        assert letters[value].reason == reason
        assert why in (letters[value].detail or ""), letters[value].detail
    wait_for(lambda: pipeline.processor.core.view.total("completed").items >= 3, 60, "the good items")

    items = {
        item.item_id: item
        for m in read_topic(pipeline.conf, pipeline.topics.batches(CARD.consumer))
        for item in decode_batch(m.value()).items
    }
    assert items["with-request"].request == REQUEST
    assert items["without-request"].request is None
    assert items["written-before-requests"] == old  # spliced into a current batch, read with no request
