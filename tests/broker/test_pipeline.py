"""The pipeline end to end on a real broker: producer -> processor -> two cards -> results.

The processor and both consumer apps run in threads of this process, each with its own Kafka
clients, exactly as the services run them (tests/broker/rig.py). Every assertion is made on what is
read back from the topics, not on what the processor believes.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterator

import fastavro
import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.core.contract import Contract
from processor.kafka.reader import read_topic
from processor.local.pipeline import read_back
from processor.ops.status import gather
from processor.sim.traces import read_shipped
from processor.wire.control import decode_dead_letter
from processor.wire.items import decode_batch, encode_token_item
from processor.wire.records import DeadLetterRecord, new_token_item
from processor.wire.schemas import CANONICAL_FORMS, HEADERS, MAGIC, parsed_schema, rabin_fingerprint
from tests.broker.rig import InProcess, running_in_process, wait_for

pytestmark = pytest.mark.kafka

SMALL = Contract("card16", "default", budget_tokens=8192, max_items=32, pad_multiple=8, max_inflight=2)
LARGE = Contract("card32", "default", budget_tokens=16384, max_items=64, pad_multiple=16, max_inflight=2)
Running = InProcess  # the tests' name for the rig


@pytest.fixture
def pipeline(kafka_bootstrap: str) -> Iterator[Running]:
    """Both cards and a processor in threads (tests/broker/rig.py); every thread must end cleanly."""
    with running_in_process(
        kafka_bootstrap, (SMALL, LARGE), instance="itest", commit_interval_ms=300
    ) as running:
        yield running


def test_a_real_trace_goes_from_producer_to_results_exactly_once(pipeline: Running) -> None:
    records = read_shipped("azure_conv", limit=10_000)
    # Two models' worth of shapes: split the trace into 4 prompt templates.
    with TokenProducer(pipeline.conf, pipeline.topics) as producer:
        for r in records:
            producer.send(
                r.id, "default", synthetic_tokens(r.id, r.length), components=[f"template-{int(r.id) % 4}"]
            )
    sent_tokens = sum(r.length for r in records)

    def all_completed() -> bool:
        view = gather(pipeline.conf, pipeline.topics, group=f"{pipeline.topics.prefix}-proc")
        return view.total("completed_items") >= len(records)

    wait_for(all_completed, 300, "every item to complete")
    pipeline.stop.set()
    for t in pipeline.threads:
        t.join(60)

    back = read_back(pipeline.conf, pipeline.topics, [_card(SMALL), _card(LARGE)])
    assert set(back.completed_ids) == {r.id for r in records}
    assert back.duplicates == 0
    assert back.completed_ok == len(records)
    assert back.completed_tokens == sent_tokens
    assert back.mixed_shape_batches == 0
    assert back.over_budget_batches == 0
    assert back.batches[SMALL.consumer] > 10 and back.batches[LARGE.consumer] > 10, back.batches
    _assert_batches_within_contracts(pipeline)

    pipeline.processor.core.check(deep=False)
    ledger = pipeline.processor.core.view
    for stage, expected in (("received", sent_tokens), ("routed", sent_tokens), ("completed", sent_tokens)):
        assert ledger.total(stage).tokens == expected, stage
    assert ledger.total("received").items == ledger.total("completed").items == len(records)
    final = gather(pipeline.conf, pipeline.topics, group=f"{pipeline.topics.prefix}-proc")
    assert final.total("completed_tokens") == sent_tokens
    assert final.ingest_lag == 0


def test_malformed_messages_are_dead_lettered_and_the_processor_keeps_going(pipeline: Running) -> None:
    good = new_token_item("good-1", "default", [1, 2, 3], 0, shape_components=["x"])
    body = encode_token_item(good)
    bad = {
        b"not avro at all": "bad-magic",
        _raw_item(token_count=-5, tokens=b"\x01\x00\x00\x00" * 3): "negative-token-count",
        _raw_item(token_count=2, tokens=b"\x01\x00\x00\x00" * 3): "token-count-mismatch",
        _with_unknown_field(): "unknown-schema",
        body[:14]: "avro-decode",
        body + b"\x00": "trailing-bytes",
    }
    from confluent_kafka import Producer

    producer = Producer(pipeline.conf)
    for value in bad:
        producer.produce(pipeline.topics.ingest, value=value, key=b"k")
    producer.produce(pipeline.topics.ingest, value=body, key=b"k")
    producer.flush(30)

    def dead_letters() -> list[DeadLetterRecord]:
        return [decode_dead_letter(m.value()) for m in read_topic(pipeline.conf, pipeline.topics.dead_letter)]

    wait_for(lambda: len(dead_letters()) >= len(bad), 60, "the dead letters")
    letters = dead_letters()
    assert {bytes(d.original) for d in letters} == set(bad)
    for d in letters:
        expected = bad[d.original]
        if expected is not None:
            assert d.reason.startswith(expected), d.reason
            assert d.reason == expected and d.detail, (d.reason, d.detail)  # the code alone, then why
        assert d.source_topic == pipeline.topics.ingest
    wait_for(lambda: pipeline.processor.core.view.total("completed").items >= 1, 60, "the good item")
    assert pipeline.processor.core.view.dead_lettered() == len(bad)


def _item_fields(**overrides: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "item_id": "bad",
        "job_id": "",
        "model": "default",
        "shape": 7,
        "token_count": 1,
        "tokens": b"\x01\x00\x00\x00",
        "shape_components": None,
        "produced_ms": 0,
        "output_budget": None,
        "metadata": None,
    }
    fields.update(overrides)
    return fields


def _raw_item(**overrides: object) -> bytes:
    """A TokenItem written by a producer that skips validation (any language's plain Avro writer)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed_schema("TokenItem"), _item_fields(**overrides))
    return HEADERS["TokenItem"] + out.getvalue()


def _with_unknown_field() -> bytes:
    """A record from a schema with an extra field: its fingerprint is not one the processor knows."""
    schema = json.loads(CANONICAL_FORMS["TokenItem"])
    schema["fields"].append({"name": "surprise", "type": "string"})
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), {**_item_fields(), "surprise": "!"})
    header = MAGIC + rabin_fingerprint(json.dumps(schema).encode()).to_bytes(8, "little")
    return header + out.getvalue()


def _card(contract: Contract):  # type: ignore[no-untyped-def]
    from processor.local.pipeline import Card

    return Card(
        contract.consumer, contract.budget_tokens, contract.max_items, tps=1, pad=contract.pad_multiple
    )


def _assert_batches_within_contracts(pipeline: Running) -> None:
    for contract in (SMALL, LARGE):
        sizes: Counter[int] = Counter()
        for msg in read_topic(pipeline.conf, pipeline.topics.batches(contract.consumer)):
            batch = decode_batch(msg.value())
            assert batch.consumer == contract.consumer
            assert len(batch.items) <= contract.max_items
            assert batch.padded_length % contract.pad_multiple == 0
            assert batch.padded_length >= max(it.token_count for it in batch.items)
            if len(batch.items) > 1:
                assert batch.padded_length * len(batch.items) <= contract.budget_tokens
            sizes[len(batch.items)] += 1
        assert sizes, f"{contract.consumer} got no batches"
