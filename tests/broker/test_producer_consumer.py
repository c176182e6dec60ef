"""The producer library, the consumer app and their commands against a real broker.

Each test runs under its own topic prefix (the session broker, ``conftest.kafka_bootstrap``), so tests
never see each other's data. What needs no broker is in tests/apps, tests/engines and tests/cli."""

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

import pytest
from confluent_kafka import Message

from processor import cli
from processor.apps.consumer import ConsumerApp, ConsumerHooks, ConsumerSettings
from processor.apps.producer import shape_key, synthetic_tokens
from processor.core.signature import shape_signature
from processor.engines.base import Engine, ItemResult
from processor.engines.sim import SimEngine
from processor.kafka.topics import TopicNames
from processor.sim.cardmodel import CardSpec
from processor.wire.completions import decode_completions
from processor.wire.control import decode_contract, decode_dead_letter
from processor.wire.items import decode_token_item, encode_batch
from processor.wire.records import (
    BatchRecord,
    CompletionForm,
    CompletionRecord,
    tokens_from_ids,
    verify_shape,
)
from processor.wire.schemas import HEADERS, schema_of
from tests.apps.helpers import MODEL, card_contract, outgoing_batch, token_record
from tests.broker.rig import wait_for
from tests.common import ROOT

pytestmark = pytest.mark.kafka
TIMEOUT_S = 30.0


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


@pytest.mark.kafka
@pytest.mark.parametrize(("completions", "messages"), [("batch", 6), ("item", 9)])
def test_consumer_app_answers_every_item_then_commits(
    kafka_bootstrap: str, names: TopicNames, completions: CompletionForm, messages: int
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    contract = card_contract("card-a", budget=256, items=4)
    engine = _Exploding()
    app = ConsumerApp(
        _conf(kafka_bootstrap),
        names,
        contract,
        engine,
        ConsumerSettings(max_batches=7, poll_timeout_s=0.2, completions=completions),
    )
    assert app.ensure_topic() is True  # creates the batch topic ...
    assert app.ensure_topic() is False  # ... once
    shape, other_shape = shape_signature(["sys"]), shape_signature(["other"])
    good = [token_record("g1", 100, shape, output_budget=5), token_record("g2", 60, shape, produced_ms=0)]
    batches = [
        encode_batch(outgoing_batch("good", "card-a", good, padded_length=104)),
        encode_batch(
            outgoing_batch(
                "too-big",
                "card-a",
                [token_record("r1", 200, shape), token_record("r2", 200, shape)],
                padded_length=200,
            )
        ),
        HEADERS["Batch"] + b"not avro",  # a Batch header on a body that does not decode
        encode_batch(outgoing_batch("boom", "card-a", [token_record("x1", 8, shape)], padded_length=8)),
        encode_batch(
            outgoing_batch(
                "short",
                "card-a",
                [token_record("s1", 8, shape), token_record("s2", 8, shape)],
                padded_length=8,
            )
        ),
        encode_batch(outgoing_batch("again", "card-a", [token_record("a1", 16, shape)], padded_length=16)),
        encode_batch(
            outgoing_batch("new-shape", "card-a", [token_record("n1", 16, other_shape)], padded_length=16)
        ),
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

    reader = Consumer({**_conf(kafka_bootstrap), "group.id": names.consumer_group("card-a")})
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

    contract = card_contract("card-b")
    topic = names.batches("card-b")
    _create_all(kafka_bootstrap, names, ("card-b",))
    producer = Producer(_conf(kafka_bootstrap))
    shape = shape_signature(["s"])
    producer.produce(
        topic,
        encode_batch(outgoing_batch("first", "card-b", [token_record("f1", 8, shape)], padded_length=8)),
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
        ConsumerSettings(poll_timeout_s=0.2),
        hooks=ConsumerHooks(on_batch=on_batch),
    )
    thread = threading.Thread(target=app.run, args=(stop,), daemon=True)
    thread.start()
    thread.join(60.0)
    assert not thread.is_alive() and seen == [1]

    producer.produce(
        topic,
        encode_batch(outgoing_batch("second", "card-b", [token_record("s1", 8, shape)], padded_length=8)),
    )
    assert producer.flush(TIMEOUT_S) == 0
    again = ConsumerApp(
        _conf(kafka_bootstrap),
        names,
        contract,
        SimEngine(CardSpec(), time_scale=0.0),
        ConsumerSettings(poll_timeout_s=0.2, idle_exit_s=3.0),
    )
    stats = again.run()  # resumes after "first": runs "second" only, then idles out
    assert (stats.batches, stats.ok) == (1, 1)
    done = _completions(kafka_bootstrap, names, 2)
    assert sorted(done) == ["first", "second"] and all(len(v) == 1 for v in done.values())


@contextmanager
def _consumer_command(
    bootstrap: str,
    names: TopicNames,
    consumer: str,
    env: dict[str, str] | None = None,
    time_scale: str = "0",
    extra: tuple[str, ...] = (),
) -> Iterator[subprocess.Popen[str]]:
    """``tokenfabric consumer`` in its own process, sim engine (instant unless ``time_scale``); killed
    on the way out if the test left it running."""
    argv = [sys.executable, "-m", "processor", "consumer", "--id", consumer, "--model", MODEL]
    argv += ["--budget", "1024", "--items", "8", "--time-scale", time_scale, "--metrics-port", "0", *extra]
    argv += ["--bootstrap", bootstrap, "--topic-prefix", names.prefix]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
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


def _wait_assigned(bootstrap: str, group: str) -> None:
    """Until the consumer group is stable with a member holding partitions (where a fixed 10 s sleep
    used to stand: the join takes from well under a second to several on a loaded machine)."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_conf(bootstrap))

    def assigned() -> bool:
        found = admin.describe_consumer_groups([group])[group].result(TIMEOUT_S)
        return found.state == ConsumerGroupState.STABLE and any(
            m.assignment.topic_partitions for m in found.members
        )

    wait_for(assigned, TIMEOUT_S, f"group {group} assigned")


def _send_batch(bootstrap: str, names: TopicNames, consumer: str, batch_id: str, items: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer(_conf(bootstrap))
    records = [token_record(item, 8, 7) for item in items]
    producer.produce(
        names.batches(consumer), encode_batch(outgoing_batch(batch_id, consumer, records, padded_length=8))
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
def test_consumer_command_aborts_on_a_second_sigterm_and_exits_130(
    kafka_bootstrap: str, names: TopicNames
) -> None:
    """The engine takes a minute a batch: the first SIGTERM waits for it, the second aborts; nothing
    of the batch was committed, so it runs again on restart."""
    slow = ("--overhead-ms", "60000")
    with _consumer_command(kafka_bootstrap, names, "card-g", time_scale="1", extra=slow) as proc:
        _read(kafka_bootstrap, names.contracts, 1)
        _send_batch(kafka_bootstrap, names, "card-g", "b1", ["g1"])
        _wait_assigned(kafka_bootstrap, names.consumer_group("card-g"))
        time.sleep(1)  # assigned, its batch waiting in the topic: one fetch and the engine is at work
        proc.send_signal(signal.SIGTERM)
        time.sleep(1)  # the first signal handled before the second comes (two signals, two meanings)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130, err
    assert "aborted; the unfinished batch runs again on restart" in err and "Traceback" not in err


@pytest.mark.kafka
def test_consumer_command_exits_75_when_completions_cannot_be_delivered(
    kafka_bootstrap: str, names: TopicNames
) -> None:
    """What a broker restart can do to an app: its completions time out and its transaction does
    not commit. It exits 75 (restart me), not 1, and the restarted app runs the batch exactly once."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_conf(kafka_bootstrap))
    quick = {"TOKENFABRIC_KAFKA_MESSAGE_TIMEOUT_MS": "2000"}
    # The exit itself, without the ride: riding on (the default), the app first tries three fresh
    # runs, each failing while Kafka answers, then exits 75 the same way (tests/apps/test_ride.py),
    # which took about as long as this test's 30 s in a CI rehearsal.
    at_once = ("--outage-exit-s", "0")
    with _consumer_command(kafka_bootstrap, names, "card-e", env=quick, extra=at_once) as proc:
        _read(kafka_bootstrap, names.contracts, 1)  # announced: its batch topic exists now
        for future in admin.delete_topics([names.results]).values():
            future.result(TIMEOUT_S)
        _send_batch(kafka_bootstrap, names, "card-e", "b1", ["e1", "e2"])
        # start, join, a 2 s message timeout and an abort: under three loaded workers it once passed 30 s,
        # and once 60 s (its output was lost): past 60 s, its stacks say where it waits
        err = _stderr_within(proc, 2 * TIMEOUT_S)
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


def _stderr_within(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The command's stderr once it ends; past ``timeout_s``, a failure quoting its threads' stacks
    (SIGUSR2, processor.cli.serve.STACKS_SIGNAL) and its last lines."""
    try:
        return proc.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR2)
        time.sleep(2)
        proc.kill()
        err = proc.communicate()[1]
        said = f"still running after {timeout_s:.0f} s; its stderr ends:\n{err[-6000:]}"
        raise AssertionError(said) from None


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
