"""The producer library, the engine interface, the consumer app and their commands.

Unmarked tests need no broker: synthetic tokens, the sim engine, the contract check and the CLI's
one-line argument errors. Tests marked ``kafka`` run against the session broker
(``conftest.kafka_bootstrap``), each under its own topic prefix so they never see each other's data.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from confluent_kafka import Message

from processor import cli
from processor.apps.consumer import ConsumerApp, contract_violation, group_id
from processor.apps.producer import SYNTHETIC_VOCAB, shape_key, synthetic_tokens
from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.core.signature import shape_signature
from processor.engines.base import Engine, ItemResult, make_engine
from processor.engines.sim import SimEngine
from processor.kafka.topics import TopicNames
from processor.sim.cardmodel import CardSpec
from processor.wire.completions import decode_completions
from processor.wire.control import decode_contract, decode_dead_letter
from processor.wire.items import decode_batch, decode_token_item, encode_batch
from processor.wire.records import (
    BatchRecord,
    CompletionForm,
    CompletionRecord,
    TokenItemRecord,
    ids_from_tokens,
    tokens_from_ids,
    verify_shape,
)
from processor.wire.schemas import HEADERS, schema_of

TIMEOUT_S = 30.0
MODEL = "llama-test"


# ------------------------------------------------------------------------------------------------
# helpers


def _record(
    item_id: str,
    length: int,
    shape: int,
    *,
    model: str = MODEL,
    produced_ms: int = 1_000,
    output_budget: int | None = None,
) -> TokenItemRecord:
    return TokenItemRecord(
        item_id=item_id,
        job_id="job-1",
        model=model,
        shape=shape,
        token_count=length,
        tokens=synthetic_tokens(item_id, length),
        produced_ms=produced_ms,
        output_budget=output_budget,
    )


def _batch(
    batch_id: str,
    consumer: str,
    records: list[TokenItemRecord],
    *,
    padded_length: int,
    model: str = MODEL,
    created_ms: int = 1_500,
) -> Batch:
    """A processor-style Batch whose items carry TokenItemRecords (what encode_batch wants)."""
    items = [Item(r.item_id, r.model, r.shape, r.token_count, r.produced_ms, payload=r) for r in records]
    return Batch(
        batch_id=batch_id,
        consumer=consumer,
        model=model,
        shape=records[0].shape if records else 1,
        lane=0,
        pad_multiple=8,
        padded_length=padded_length,
        items=items,
        created_ms=created_ms,
    )


def _batch_record(batch: Batch) -> BatchRecord:
    return decode_batch(encode_batch(batch))


def _contract(consumer: str = "card-a", budget: int = 4096, items: int = 8) -> Contract:
    return Contract(consumer, MODEL, budget_tokens=budget, max_items=items, pad_multiple=8, max_inflight=2)


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
# engines


def test_sim_engine_at_time_scale_zero_is_instant_and_reports_cache_hits() -> None:
    engine = SimEngine(CardSpec(tokens_per_s=1_000.0, overhead_ms=100.0, cache=2), time_scale=0.0)
    shape_a, shape_b = shape_signature(["a"]), shape_signature(["b"])
    batch_a = _batch_record(
        _batch(
            "b1",
            "card-a",
            [_record("i1", 100, shape_a, output_budget=7), _record("i2", 50, shape_a)],
            padded_length=104,
        )
    )
    batch_b = _batch_record(_batch("b2", "card-a", [_record("i3", 10, shape_b)], padded_length=16))
    started = time.perf_counter()
    first = engine.run(batch_a)
    assert engine.last_batch_ms == pytest.approx(100.0 + 208 * 1000.0 / 1000.0)  # modelled, not slept
    second = engine.run(batch_a)
    other = engine.run(batch_b)
    assert time.perf_counter() - started < 0.1
    assert [r.item_id for r in first] == ["i1", "i2"]
    assert [r.cache_hit for r in first + second + other] == [False, False, True, True, False]
    assert first[0] == ItemResult("i1", "ok", b"sim:i1", 7, None, False)
    assert 1 <= first[1].output_tokens <= 64  # no budget: a small deterministic number
    assert second[1].output_tokens == first[1].output_tokens


def test_sim_engine_sleeps_the_scaled_model_time() -> None:
    engine = SimEngine(CardSpec(tokens_per_s=1_000.0, overhead_ms=0.0), time_scale=0.5)
    batch = _batch_record(_batch("b1", "card-a", [_record("i1", 100, 1)], padded_length=200))
    started = time.perf_counter()
    engine.run(batch)  # 200 tokens at 1000/s = 200 ms, halved
    assert 0.09 <= time.perf_counter() - started < 0.5


def test_make_engine_builds_sim_from_strings_and_refuses_the_rest() -> None:
    engine = make_engine("sim", {"tps": "2000", "overhead_ms": "1", "cache": "3", "time_scale": "0"})
    assert isinstance(engine, SimEngine)
    assert engine.card == CardSpec(tokens_per_s=2000.0, overhead_ms=1.0, cache=3)
    assert engine.time_scale == 0.0
    with pytest.raises(ValueError, match="unknown engine 'gpu'"):
        make_engine("gpu", {})
    with pytest.raises(ValueError, match="tps='fast' is not a number"):
        make_engine("sim", {"tps": "fast"})
    with pytest.raises(ValueError, match="unknown option"):
        make_engine("sim", {"batch": "1"})
    with pytest.raises(ValueError, match="tps must be > 0"):
        make_engine("sim", {"tps": "0"})


# ------------------------------------------------------------------------------------------------
# the consumer's own contract check


def test_contract_violation_names_what_is_wrong() -> None:
    c = _contract(budget=256, items=2)

    def batch(records: list[TokenItemRecord], padded_length: int, consumer: str = "card-a") -> BatchRecord:
        return _batch_record(_batch("b", consumer, records, padded_length=padded_length))

    ok = batch([_record("i1", 100, 1), _record("i2", 120, 1)], 128)
    assert contract_violation(c, ok) is None
    three = batch([_record(f"i{n}", 10, 1) for n in range(3)], 16)
    assert "3 items > contract max_items 2" in str(contract_violation(c, three))
    big = batch([_record("i1", 200, 1), _record("i2", 10, 1)], 200)
    assert "= 400 tokens > contract budget 256" in str(contract_violation(c, big))
    oversized = batch([_record("i1", 1000, 1)], 1000)
    assert contract_violation(c, oversized) is None  # a single oversized item travels alone
    other_model = _batch_record(
        _batch("b", "card-a", [_record("i1", 8, 1, model="m2")], padded_length=8, model="m2")
    )
    assert "batch model 'm2'" in str(contract_violation(c, other_model))
    misrouted = batch([_record("i1", 8, 1)], 8, consumer="card-b")
    assert "addressed to consumer 'card-b'" in str(contract_violation(c, misrouted))
    short = batch([_record("i1", 100, 1)], 64)
    assert "padded_length 64 < longest item 100" in str(contract_violation(c, short))


# ------------------------------------------------------------------------------------------------
# CLI: one stderr line, exit 2, no broker needed

CARD = ["consumer", "--id", "c1", "--model", "m", "--budget", "64", "--items", "4"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["consumer", "--id", "c1", "--budget", "100", "--items", "4"], "--model required"),
        (["consumer", "--id", "c1", "--model", "m", "--budget", "0", "--items", "4"], "budget_tokens"),
        (
            ["consumer", "--id", "c1", "--model", "m", "--budget", "64", "--items", "4", "--engine", "gpu"],
            "invalid choice: 'gpu'",
        ),
        (
            ["consumer", "--id", "c1", "--model", "m", "--budget", "64", "--items", "4", "--tps", "fast"],
            "tps='fast' is not a number",
        ),
        (["consumer", "--id", "bad id", "--model", "m", "--budget", "64", "--items", "4"], "--id 'bad id'"),
        ([*CARD, "--max-batches", "0"], "--max-batches must be >= 1"),
        ([*CARD, "--engine-opt", "novalue"], "expected KEY=VALUE"),
        (["consumer", "--model", "m"], "the following arguments are required: --id"),
        ([*CARD, "--completions", "each"], "argument --completions: invalid choice: 'each'"),
        (["produce", "--trace", "/nonexistent/trace.jsonl"], "no such file"),
        (["produce", "--trace", "x.jsonl", "--speed", "2", "--backlog"], "not allowed with argument"),
        (["produce", "--trace", "mooncake_synthetic", "--limit", "0"], "--limit must be >= 1"),
        (["produce", "--trace", "mooncake_synthetic", "--speed", "-1"], "--speed must be > 0"),
        (["produce", "--trace", "mooncake_synthetic", "--format", "csv"], "invalid choice: 'csv'"),
        (["produce", "--trace", "mooncake_synthetic", "--topic-prefix", "a b"], "--topic-prefix 'a b'"),
        (["topics", "create", "--ingest-partitions", "0"], "--ingest-partitions must be >= 1"),
        (["topics", "delete"], "invalid choice: 'delete'"),
        (["topics", "create", "--consumer", "no/slash"], "--consumer 'no/slash'"),
        (["kafka", "restart"], "unknown action 'restart'"),
        (["kafka"], "no action"),
    ],
)
def test_bad_arguments_get_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    needs_kafka = argv[0] in ("consumer", "produce", "topics")
    with_broker = [*argv, "--bootstrap", "127.0.0.1:1"] if needs_kafka else argv
    try:
        code = cli.main(with_broker)
    except SystemExit as exc:  # argparse's own errors exit from inside the parser
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


# ------------------------------------------------------------------------------------------------
# Kafka: reading topics back


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        ({}, 1),
        ({"retriable": True}, 75),
        ({"txn_requires_abort": True}, 75),
        ({"fatal": True, "retriable": True}, 1),  # fenced: a restart would fence the other instance
    ],
)
def test_a_kafka_error_exits_75_only_when_a_restart_recovers(flags: dict[str, bool], code: int) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from processor.kafka.exits import exit_code

    assert exit_code(KafkaException(KafkaError(KafkaError._TIMED_OUT, "x", **flags))) == code


def test_a_delivery_failure_exits_75_unless_no_restart_can_deliver() -> None:
    from confluent_kafka import KafkaError

    from processor.apps.consumer import ConsumerAppError
    from processor.kafka.exits import DeliveryFailed, exit_code

    assert exit_code(DeliveryFailed("broker away", KafkaError(KafkaError._MSG_TIMED_OUT))) == 75
    assert exit_code(DeliveryFailed("topic not there yet", KafkaError(KafkaError._UNKNOWN_TOPIC))) == 75
    assert exit_code(DeliveryFailed("3 still unacknowledged after 60 s")) == 75
    assert exit_code(DeliveryFailed("too large", KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))) == 1
    assert exit_code(DeliveryFailed("no rights", KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))) == 1
    assert exit_code(DeliveryFailed("fenced", KafkaError(KafkaError._FENCED, fatal=True))) == 1
    assert exit_code(ConsumerAppError("not open")) == 1
    assert exit_code(ValueError("a bug")) == 1


def _prefix() -> TopicNames:
    return TopicNames(f"t{uuid.uuid4().hex[:8]}")


def _conf(bootstrap: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap}


def _read(bootstrap: str, topic: str, expected: int, timeout_s: float = TIMEOUT_S) -> list[Message]:
    """At least ``expected`` messages of ``topic`` from the start (all partitions), and any beyond."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(
        {
            **_conf(bootstrap),
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": "false",
        }
    )
    out: list[Message] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if quiet_until is not None and time.monotonic() >= quiet_until:
                    return out
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                continue
            out.append(msg)
            if len(out) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + 0.5  # anything beyond what we expect shows up too
        raise AssertionError(f"{topic}: read {len(out)} of {expected} messages in {timeout_s} s")
    finally:
        consumer.close()


def _create_all(bootstrap: str, names: TopicNames, consumers: tuple[str, ...] = ()) -> None:
    from processor.kafka.topics import create_topics, topic_specs

    create_topics(_conf(bootstrap), topic_specs(names, consumers=consumers))


@pytest.fixture
def names(kafka_bootstrap: str) -> Iterator[TopicNames]:
    names = _prefix()
    _create_all(kafka_bootstrap, names)
    yield names


# ------------------------------------------------------------------------------------------------
# Kafka: the producer


@pytest.mark.kafka
def test_producer_sends_items_keyed_by_shape(kafka_bootstrap: str, names: TopicNames) -> None:
    from processor.apps.producer import TokenProducer

    components = [["system: be brief"], ["system: be verbose", "tools: none"], []]
    sent: dict[str, tuple[int, bytes]] = {}
    with TokenProducer(_conf(kafka_bootstrap), names) as producer:
        producer.check_topic()
        for i in range(60):
            item_id = f"job:{i}"
            tokens = synthetic_tokens(item_id, 10 + i)
            shape = producer.send(
                item_id,
                MODEL,
                tokens,
                components=components[i % 3],
                job_id="job",
                output_budget=i,
                metadata={"i": str(i)},
            )
            sent[item_id] = (shape, tokens)
        producer.send("explicit", MODEL, tokens_from_ids([1, 2, 3]), shape=42)
        assert producer.flush(TIMEOUT_S) == 0
        assert producer.sent == 61 and producer.failed == 0
    messages = _read(kafka_bootstrap, names.ingest, 61)
    assert len(messages) == 61
    partitions_of_shape: dict[int, set[int | None]] = {}
    for msg in messages:
        rec = decode_token_item(msg.value())
        assert msg.key() == shape_key(rec.shape)
        assert rec.shape.to_bytes(8, "big") == msg.key()
        partitions_of_shape.setdefault(rec.shape, set()).add(msg.partition())
        if rec.item_id == "explicit":
            assert rec.shape == 42 and rec.shape_components is None and list(rec.token_ids()) == [1, 2, 3]
            continue
        shape, tokens = sent[rec.item_id]
        i = int(rec.item_id.split(":")[1])
        assert rec.shape == shape == shape_signature(components[i % 3])
        assert verify_shape(rec) is True
        assert rec.tokens == tokens and rec.token_count == 10 + i
        assert (rec.job_id, rec.model, rec.output_budget, rec.metadata) == ("job", MODEL, i, {"i": str(i)})
    assert all(len(p) == 1 for p in partitions_of_shape.values())  # a shape lives in one partition


@pytest.mark.kafka
def test_producer_reports_missing_topic_and_failed_delivery(kafka_bootstrap: str) -> None:
    from processor.apps.producer import MissingTopicError, ProduceError, TokenProducer

    missing = _prefix()  # no topics created
    producer = TokenProducer({**_conf(kafka_bootstrap), "message.timeout.ms": "1500"}, missing)
    with pytest.raises(MissingTopicError, match=f"topic {missing.ingest} does not exist"):
        producer.check_topic()
    producer.send("a", MODEL, synthetic_tokens("a", 4))
    producer.send("b", MODEL, synthetic_tokens("b", 4))
    with pytest.raises(ProduceError, match=r"2 of 2 messages .* not delivered; first error: "):
        producer.flush(TIMEOUT_S)
    assert producer.failed == 2
    assert producer.flush(1.0) == 0  # reported once
    with pytest.raises(ValueError, match="not a multiple of 4"):
        producer.send("c", MODEL, b"\x00\x01\x02")


# ------------------------------------------------------------------------------------------------
# Kafka: the consumer app


class _Exploding(Engine):
    """The sim engine, except that batch ``boom`` raises and batch ``short`` loses an item."""

    name = "exploding"

    def __init__(self) -> None:
        self.inner = SimEngine(CardSpec(cache=4), time_scale=0.0)
        self.closed = False

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        if batch.batch_id == "boom":
            raise RuntimeError("CUDA out of memory")
        results = self.inner.run(batch)
        return results[:-1] if batch.batch_id == "short" else results

    def close(self) -> None:
        self.closed = True


def _completions(bootstrap: str, names: TopicNames, messages: int) -> dict[str, list[CompletionRecord]]:
    """The completions on the results topic by batch, read from (at least) ``messages`` messages: a
    Completion keyed by its item id or a CompletionBatch keyed by its batch id."""
    by_batch: dict[str, list[CompletionRecord]] = {}
    for msg in _read(bootstrap, names.results, messages):
        records = decode_completions(msg.value())
        single = schema_of(msg.value()) == "Completion"
        assert msg.key() == (records[0].item_id if single else records[0].batch_id).encode()
        for rec in records:
            by_batch.setdefault(rec.batch_id, []).append(rec)
    return by_batch


class _KeptProducer:
    """Stands in for the app's Kafka producer: keeps what is produced, delivers all of it at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: object = None) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout: float = 0) -> int:
        return 0


class _BatchMessage:
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
    app = ConsumerApp(
        {}, names, _contract("card-a"), engine, completions=completions, max_completion_bytes=max_bytes
    )
    kept = _KeptProducer()
    app._producer = cast(Any, kept)
    records = [_record(f"item-{n}", 8 + n, shape_signature(["s"])) for n in range(5)]
    batch = encode_batch(_batch("b-1", "card-a", records, padded_length=16))
    app.handle(cast(Message, _BatchMessage(batch)))
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
        ConsumerApp({}, TopicNames("unit"), _contract(), engine, completions=cast(Any, "each"))


@pytest.mark.kafka
@pytest.mark.parametrize(("completions", "messages"), [("batch", 6), ("item", 9)])
def test_consumer_app_answers_every_item_then_commits(
    kafka_bootstrap: str, names: TopicNames, completions: CompletionForm, messages: int
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    contract = _contract("card-a", budget=256, items=4)
    engine = _Exploding()
    app = ConsumerApp(
        _conf(kafka_bootstrap),
        names,
        contract,
        engine,
        max_batches=7,
        poll_timeout_s=0.2,
        completions=completions,
    )
    assert app.ensure_topic() is True  # creates the batch topic ...
    assert app.ensure_topic() is False  # ... once
    shape, other_shape = shape_signature(["sys"]), shape_signature(["other"])
    good = [_record("g1", 100, shape, output_budget=5), _record("g2", 60, shape, produced_ms=0)]
    batches = [
        encode_batch(_batch("good", "card-a", good, padded_length=104)),
        encode_batch(
            _batch(
                "too-big", "card-a", [_record("r1", 200, shape), _record("r2", 200, shape)], padded_length=200
            )
        ),
        HEADERS["Batch"] + b"not avro",  # a Batch header on a body that does not decode
        encode_batch(_batch("boom", "card-a", [_record("x1", 8, shape)], padded_length=8)),
        encode_batch(
            _batch("short", "card-a", [_record("s1", 8, shape), _record("s2", 8, shape)], padded_length=8)
        ),
        encode_batch(_batch("again", "card-a", [_record("a1", 16, shape)], padded_length=16)),
        encode_batch(_batch("new-shape", "card-a", [_record("n1", 16, other_shape)], padded_length=16)),
    ]
    producer = Producer(_conf(kafka_bootstrap))
    for i, value in enumerate(batches):
        producer.produce(names.batches("card-a"), value, f"k{i}".encode())
    assert producer.flush(TIMEOUT_S) == 0

    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    thread.join(60.0)
    assert not thread.is_alive(), "the app did not stop after --max-batches"
    assert engine.closed
    stats = app.stats
    assert (stats.batches, stats.items, stats.dead_lettered) == (7, 9, 1)
    assert (stats.ok, stats.failed, stats.rejected) == (4, 3, 2)

    done = _completions(kafka_bootstrap, names, messages)
    assert sum(len(v) for v in done.values()) == 9  # one completion per item, no more
    g1, g2 = done["good"]
    assert (g1.item_id, g1.status, g1.output, g1.output_tokens, g1.reason) == ("g1", "ok", b"sim:g1", 5, None)
    assert (g1.job_id, g1.consumer, g1.model, g1.input_tokens, g1.padded_tokens) == (
        "job-1",
        "card-a",
        MODEL,
        100,
        104,
    )
    assert g1.queued_ms == 500 and g2.queued_ms == 0  # created_ms - produced_ms, 0 when unknown
    assert not g1.cache_hit and g1.completed_ms > 0
    for rec in done["too-big"]:
        assert rec.status == "rejected" and rec.output == b"" and rec.output_tokens == 0
        assert "contract: 2 items x padded_length 200 = 400 tokens > contract budget 256" in str(rec.reason)
    (boom,) = done["boom"]
    assert boom.status == "failed" and boom.reason == "engine error: RuntimeError: CUDA out of memory"
    assert [r.status for r in done["short"]] == ["failed", "failed"]
    assert "engine-contract" in str(done["short"][0].reason)
    assert done["again"][0].cache_hit  # the shape served by "good" (and "short") is cached
    assert not done["new-shape"][0].cache_hit

    (dead,) = _read(kafka_bootstrap, names.dead_letter, 1)
    letter = decode_dead_letter(dead.value())
    assert (letter.reason, letter.source_topic, letter.offset) == ("avro-decode", names.batches("card-a"), 2)
    assert letter.original == batches[2] and letter.original_key == b"k2"

    (announced,) = _read(kafka_bootstrap, names.contracts, 1)
    assert announced.key() == b"card-a"
    assert decode_contract(announced.value()).contract == contract

    reader = Consumer({**_conf(kafka_bootstrap), "group.id": group_id("card-a")})
    try:
        (committed,) = reader.committed([TopicPartition(names.batches("card-a"), 0)], timeout=TIMEOUT_S)
    finally:
        reader.close()
    assert committed.offset == 7  # every batch, the dead-lettered one included


@pytest.mark.kafka
def test_consumer_app_stops_on_event_then_resumes_after_its_commit(
    kafka_bootstrap: str, names: TopicNames
) -> None:
    from confluent_kafka import Producer

    contract = _contract("card-b")
    topic = names.batches("card-b")
    _create_all(kafka_bootstrap, names, ("card-b",))
    producer = Producer(_conf(kafka_bootstrap))
    shape = shape_signature(["s"])
    producer.produce(
        topic, encode_batch(_batch("first", "card-b", [_record("f1", 8, shape)], padded_length=8))
    )
    assert producer.flush(TIMEOUT_S) == 0

    stop = threading.Event()
    seen: list[int] = []

    def on_batch(stats: object) -> None:
        seen.append(1)
        stop.set()  # as SIGTERM would, right after the first batch is committed

    app = ConsumerApp(
        _conf(kafka_bootstrap),
        names,
        contract,
        SimEngine(CardSpec(), time_scale=0.0),
        poll_timeout_s=0.2,
        on_batch=on_batch,
    )
    thread = threading.Thread(target=app.run, args=(stop,), daemon=True)
    thread.start()
    thread.join(60.0)
    assert not thread.is_alive() and seen == [1]

    producer.produce(
        topic, encode_batch(_batch("second", "card-b", [_record("s1", 8, shape)], padded_length=8))
    )
    assert producer.flush(TIMEOUT_S) == 0
    again = ConsumerApp(
        _conf(kafka_bootstrap),
        names,
        contract,
        SimEngine(CardSpec(), time_scale=0.0),
        poll_timeout_s=0.2,
        idle_exit_s=3.0,
    )
    stats = again.run()  # resumes after "first": runs "second" only, then idles out
    assert (stats.batches, stats.ok) == (1, 1)
    done = _completions(kafka_bootstrap, names, 2)
    assert sorted(done) == ["first", "second"] and all(len(v) == 1 for v in done.values())


@contextmanager
def _consumer_command(
    bootstrap: str, names: TopicNames, consumer: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``tokenfabric consumer`` in its own process, instant sim engine; killed on the way out if the
    test left it running."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, "-m", "processor", "consumer", "--id", consumer, "--model", MODEL]
    argv += ["--budget", "1024", "--items", "8", "--time-scale", "0", "--metrics-port", "0"]
    argv += ["--bootstrap", bootstrap, "--topic-prefix", names.prefix]
    proc = subprocess.Popen(
        argv,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _send_batch(bootstrap: str, names: TopicNames, consumer: str, batch_id: str, items: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer(_conf(bootstrap))
    records = [_record(item, 8, 7) for item in items]
    producer.produce(
        names.batches(consumer), encode_batch(_batch(batch_id, consumer, records, padded_length=8))
    )
    assert producer.flush(TIMEOUT_S) == 0


@pytest.mark.kafka
def test_consumer_command_finishes_its_batch_on_sigterm(kafka_bootstrap: str, names: TopicNames) -> None:
    with _consumer_command(kafka_bootstrap, names, "card-d") as proc:
        _read(kafka_bootstrap, names.contracts, 1)  # announced: its batch topic exists now
        _send_batch(kafka_bootstrap, names, "card-d", "b1", ["d1", "d2"])
        assert len(_completions(kafka_bootstrap, names, 1)["b1"]) == 2  # one CompletionBatch message
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, err
    assert out.startswith("consumer card-d: 1 batches, 2 items (ok 2, failed 0, rejected 0), 0 dead-lettered")
    assert "SIGTERM: finishing the current batch" in err


@pytest.mark.kafka
def test_consumer_command_exits_75_when_completions_cannot_be_delivered(
    kafka_bootstrap: str, names: TopicNames
) -> None:
    """What a broker restart can do to an app: its completions time out and its transaction does
    not commit. It exits 75 (restart me), not 1, and the restarted app runs the batch exactly once."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_conf(kafka_bootstrap))
    quick = {"TOKENFABRIC_KAFKA_MESSAGE_TIMEOUT_MS": "2000"}
    with _consumer_command(kafka_bootstrap, names, "card-e", env=quick) as proc:
        _read(kafka_bootstrap, names.contracts, 1)  # announced: its batch topic exists now
        for future in admin.delete_topics([names.results]).values():
            future.result(TIMEOUT_S)
        _send_batch(kafka_bootstrap, names, "card-e", "b1", ["e1", "e2"])
        _out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 75, err
    assert "messages not delivered" in err and "exit 75: a restart recovers" in err
    _create_all(kafka_bootstrap, names)  # the results topic is back (the others exist: refused, kept)
    with _consumer_command(kafka_bootstrap, names, "card-e") as again:
        done = _completions(kafka_bootstrap, names, 1)
        again.send_signal(signal.SIGTERM)
        out, err = again.communicate(timeout=TIMEOUT_S)
    assert again.returncode == 0, err
    assert sorted(done) == ["b1"] and sorted(c.item_id for c in done["b1"]) == ["e1", "e2"]
    assert out.startswith("consumer card-e: 1 batches, 2 items (ok 2,")


@pytest.mark.kafka
def test_retire_publishes_a_tombstone(
    kafka_bootstrap: str, names: TopicNames, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "consumer",
        "--id",
        "card-c",
        "--retire",
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        names.prefix,
    ]
    assert cli.main(argv) == 0
    assert "retired consumer card-c" in capsys.readouterr().out
    (tombstone,) = _read(kafka_bootstrap, names.contracts, 1)
    assert tombstone.key() == b"card-c" and tombstone.value() is None


@pytest.mark.kafka
def test_produce_command_replays_a_trace(
    kafka_bootstrap: str, names: TopicNames, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            f'{{"t_ms": {i * 10}, "model": "{MODEL}", "components": ["c{i % 2}"], "length": {5 + i}, '
            f'"id": "r{i}", "output_length": 3}}'
            for i in range(20)
        )
        + "\n"
    )
    argv = [
        "produce",
        "--trace",
        str(trace),
        "--job",
        "j1",
        "--speed",
        "50",
        "--no-progress",
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        names.prefix,
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("produced 20 items, 290 tokens in ") and out.endswith(f"to {names.ingest}, job j1")
    records = [decode_token_item(m.value()) for m in _read(kafka_bootstrap, names.ingest, 20)]
    assert sorted(r.item_id for r in records) == sorted(f"j1:r{i}" for i in range(20))
    assert {r.job_id for r in records} == {"j1"} and {r.output_budget for r in records} == {3}
    assert {r.shape for r in records} == {shape_signature(["c0"]), shape_signature(["c1"])}
