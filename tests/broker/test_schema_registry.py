"""Producers as they are: confluent-kafka's ``AvroSerializer`` against a real schema registry
(Apicurio Registry, processor/local/registry.py), a processor that reads the Confluent framing, and
the audit.

The producer here is only the serializer, with a TokenItem schema of its own (another namespace, one
extra optional field); every item completes once and the audit is clean. An unknown schema id and a
writer schema that cannot be resolved are dead-lettered with their reasons. A registry that stops
answering (SIGSTOP: the JVM is frozen, so lookups time out) holds ingest instead: nothing is
dead-lettered, and every item completes once it answers again. Out: a consumer writing its results
registry-framed (``--results-framing registry``) is read by the processor, ``collect`` and the audit, and
by confluent-kafka's ``AvroDeserializer`` as a team's own reader would.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from processor.apps.producer import shape_key, synthetic_tokens
from processor.apps.schema_registry import RegistryClient, RegistrySettings
from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.core.signature import to_signed
from processor.jobs.datasets import read_output
from processor.kafka.reader import read_topic
from processor.ops.audit import audit
from processor.sim.tracegen import synthetic_records
from processor.wire.completions import decode_completions
from processor.wire.control import decode_dead_letter
from processor.wire.registry_framing import UNKNOWN_SCHEMA_ID, UNRESOLVABLE_SCHEMA, RegistryFraming, frame
from processor.wire.schemas import CANONICAL_FORMS, schema_dir
from tests.broker.rig import InProcess, new_topics, review_job, running_in_process, wait_for

pytestmark = pytest.mark.kafka

ITEMS = int(os.environ.get("TOKENFABRIC_REGISTRY_ITEMS", "1000"))
OUTAGE_S = float(os.environ.get("TOKENFABRIC_REGISTRY_OUTAGE_S", "10"))
CARD = Contract("card", "default", budget_tokens=8192, max_items=64, pad_multiple=8, max_inflight=4)

_OURS = json.loads((schema_dir() / "TokenItem.avsc").read_text())
TEAM_SCHEMA = {
    **_OURS,
    "namespace": "com.acme.inference",
    "fields": [*_OURS["fields"], {"name": "team", "type": ["null", "string"], "default": None}],
}
"""A producer's own TokenItem: its namespace, and one extra optional field."""


def serializer(url: str, schema: dict[str, Any]) -> AvroSerializer:
    return AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))


def team_values(
    url: str, topic: str, n: int, seed: int, prefix: str, schema: dict[str, Any] = TEAM_SCHEMA, **extra: Any
) -> list[tuple[bytes, bytes, str, int]]:
    """``n`` items written by the serializer alone: (key, value, item_id, token_count)."""
    ser = serializer(url, schema)
    context = SerializationContext(topic, MessageField.VALUE)
    out = []
    for r in synthetic_records(n, seed=seed, shapes=12, min_len=16, max_len=400, rate_per_s=None):
        item_id = f"{prefix}{r.id}"
        record = {
            "item_id": item_id, "job_id": "", "model": r.model, "shape": to_signed(r.shape),
            "token_count": r.length,
            "tokens": synthetic_tokens(item_id, r.length), "shape_components": None,
            "produced_ms": int(time.time() * 1000), "output_budget": None, "metadata": None,
            "request": None, "team": "search", **extra,
        }  # fmt: skip
        out.append((shape_key(r.shape), ser(record, context), item_id, r.length))
    return out


def send(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes, str, int]] | list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for m in messages:
        key, value = (m[0], m[1]) if isinstance(m, tuple) else (None, m)
        producer.produce(topic, value, key)
        producer.poll(0)
    assert producer.flush(30) == 0


def completions(rig: InProcess) -> Counter[str]:
    return Counter(
        c.item_id for msg in read_topic(rig.conf, rig.topics.results) for c in decode_completions(msg.value())
    )


def dead_letters(rig: InProcess) -> list[str]:
    return [decode_dead_letter(msg.value()).reason for msg in read_topic(rig.conf, rig.topics.dead_letter)]


@contextmanager
def registry_pipeline(
    bootstrap: str, url: str
) -> Iterator[tuple[InProcess, RegistryFraming, RegistryClient]]:
    """A processor reading registry-framed items through ``url``, and one instant consumer, running."""
    client = RegistryClient(RegistrySettings(url), timeout_s=2.0)
    reader = RegistryFraming(client)
    with running_in_process(bootstrap, [CARD], letter="r", framing=reader, commit_interval_ms=300) as rig:
        yield rig, reader, client


def test_a_producer_that_is_only_avro_serializer_has_every_item_completed_once(
    kafka_bootstrap: str, schema_registry_url: str
) -> None:
    with registry_pipeline(kafka_bootstrap, schema_registry_url) as (rig, reader, client):
        messages = team_values(schema_registry_url, rig.topics.ingest, ITEMS, seed=39, prefix="")
        started = time.monotonic()
        send(kafka_bootstrap, rig.topics.ingest, messages)
        wanted = {m[2] for m in messages}
        wait_for(lambda: set(completions(rig)) >= wanted, 120, f"{ITEMS} completions")
        print(f"{ITEMS} registry-framed items completed in {time.monotonic() - started:.1f} s")
    done = completions(rig)
    assert set(done) == wanted and max(done.values()) == 1
    assert dead_letters(rig) == []
    assert client.lookups == 1  # one writer schema, fetched once
    report = audit(rig.conf, rig.topics, f"{rig.topics.prefix}-proc", framing=reader)
    assert report.clean, "\n".join(report.lines())
    assert (report.received_items, report.completed_items) == (ITEMS, ITEMS)
    assert report.received_tokens == sum(m[3] for m in messages)


def test_an_unknown_id_and_an_unresolvable_writer_schema_are_dead_lettered_with_their_reasons(
    kafka_bootstrap: str, schema_registry_url: str
) -> None:
    with registry_pipeline(kafka_bootstrap, schema_registry_url) as (rig, reader, _client):
        bad_fields = [{**f, "type": "long"} if f["name"] == "model" else f for f in _OURS["fields"]]
        bad_schema = {**_OURS, "name": "TokenItem", "namespace": "com.acme.broken", "fields": bad_fields}
        ser = serializer(schema_registry_url, bad_schema)
        record = {
            "item_id": "broken-1", "job_id": "", "model": 5, "shape": 1, "token_count": 1,
            "tokens": b"\0\0\0\0", "shape_components": None, "produced_ms": 1, "output_budget": None,
            "metadata": None, "request": None,
        }  # fmt: skip
        unresolvable = ser(record, SerializationContext(f"{rig.topics.prefix}.other", MessageField.VALUE))
        good = team_values(schema_registry_url, rig.topics.ingest, 20, seed=7, prefix="g")
        send(kafka_bootstrap, rig.topics.ingest, [frame(2_000_000_000, b"\2a"), unresolvable])
        send(kafka_bootstrap, rig.topics.ingest, good)
        wait_for(lambda: len(dead_letters(rig)) == 2 and len(completions(rig)) == 20, 60, "2 dead letters")
    assert sorted(dead_letters(rig)) == sorted([UNKNOWN_SCHEMA_ID, UNRESOLVABLE_SCHEMA])
    report = audit(rig.conf, rig.topics, f"{rig.topics.prefix}-proc", framing=reader)
    assert report.clean, "\n".join(report.lines())


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A registry of this test alone (it is frozen under load): its URL and pid."""
    from processor.local.registry import start_registry, stop_registry

    info = start_registry(tmp_path / "registry")
    try:
        yield info.url, info.pid
    finally:
        os.kill(info.pid, signal.SIGCONT)
        stop_registry(tmp_path / "registry")


def test_a_registry_that_stops_answering_under_load_holds_ingest_and_loses_nothing(
    kafka_bootstrap: str, own_registry: tuple[str, int]
) -> None:
    url, pid = own_registry
    with registry_pipeline(kafka_bootstrap, url) as (rig, reader, client):
        before = team_values(url, rig.topics.ingest, 200, seed=1, prefix="a")
        evolved = {
            **TEAM_SCHEMA,
            "fields": [*TEAM_SCHEMA["fields"], {"name": "tier", "type": "int", "default": 0}],
        }
        # registered now, before the outage; the processor has not seen its id yet
        during = team_values(url, rig.topics.ingest, 200, seed=2, prefix="b", schema=evolved, tier=1)
        send(kafka_bootstrap, rig.topics.ingest, before)
        wait_for(lambda: len(completions(rig)) == 200, 60, "the first 200 completions")
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        send(kafka_bootstrap, rig.topics.ingest, during)
        wait_for(lambda: rig.processor.registry_down_since_s is not None, 30, "ingest held")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))
        assert dead_letters(rig) == [] and len(completions(rig)) == 200
        os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        wait_for(lambda: len(completions(rig)) == 400, 90, "every item once the registry answers")
        took = time.monotonic() - resumed
        print(f"registry frozen {resumed - stopped:.1f} s; the rest completed {took:.1f} s later")
        wait_for(lambda: rig.processor.registry_down_since_s is None, 30, "ready again")
    done = completions(rig)
    assert set(done) == {m[2] for m in before + during} and max(done.values()) == 1
    assert dead_letters(rig) == []
    assert client.lookups >= 3  # the first schema, then the second: asked until it answered
    report = audit(rig.conf, rig.topics, f"{rig.topics.prefix}-proc", framing=reader)
    assert report.clean, "\n".join(report.lines())


def test_results_written_registry_framed_are_read_by_the_pipeline_collect_audit_and_avro_deserializer(
    kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf, topics = new_topics(kafka_bootstrap, "o", [CARD.consumer], ingest_partitions=2)
    subject = f"{topics.results}-value"
    schema_id = RegistryClient(RegistrySettings(schema_registry_url)).register(
        subject, CANONICAL_FORMS["CompletionBatch"]
    )
    framed = {"results_schema_id": schema_id}
    kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]
    data, template = review_job(tmp_path, 200)
    out = tmp_path / "out.jsonl"
    with running_in_process(
        kafka_bootstrap,
        [CARD],
        topics=(conf, topics),
        app_options=framed,
        commit_interval_ms=300,
        results_schema_id=schema_id,
    ) as rig:
        assert (
            main(["submit", str(data), "--job", "j1", "--template", str(template), "--no-progress", *kafka])
            == 0
        )
        collect = [
            "collect",
            "--job",
            "j1",
            "--out",
            str(out),
            "--wait",
            "--timeout-s",
            "120",
            "--no-progress",
        ]
        assert main([*collect, *kafka]) == 0, capsys.readouterr().err
        wait_for(lambda: rig.processor.counters.completions >= 200, 30, "the processor applies them")
    rows = read_output(out)
    assert len(rows) == 200 and all(r["status"] == "ok" for r in rows)
    values = [msg.value() for msg in read_topic(conf, topics.results)]
    assert values and all(v[:1] == b"\0" and int.from_bytes(v[1:5], "big") == schema_id for v in values)
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": schema_registry_url}))
    context = SerializationContext(topics.results, MessageField.VALUE)
    theirs = Counter(i["item_id"] for v in values for i in deserialize(v, context)["items"])
    assert len(theirs) == 200 and max(theirs.values()) == 1
    assert completions(rig) == theirs  # our readers and theirs read the same items
    report = audit(conf, topics, f"{topics.prefix}-proc")
    assert report.clean, "\n".join(report.lines())
    assert report.completed_items == 200
