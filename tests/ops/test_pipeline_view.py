"""The pipeline as status reads it, exported by every processor (processor/ops/pipeline_view.py), over
the in-memory Kafka: a dead instance's share stays in the figures, its partitions' lag is the group's,
its unserved items stay, and the figures are status's own."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition

from processor.core.contract import Contract
from processor.ops.metrics import processor_registry
from processor.ops.pipeline_view import GroupLag, PipelineCollector, PipelineReader
from processor.ops.status import report
from processor.wire.control import encode_contract, encode_ledger_snapshot
from processor.wire.records import ContractRecord, LedgerSnapshotRecord
from tests.ops.helpers import FakeService, read_registry, value


def checkpoint(instance: str, age_s: float, counters: dict[str, int]) -> bytes:
    taken = int(time.time() * 1000 - age_s * 1000)
    return encode_ledger_snapshot(
        LedgerSnapshotRecord(
            instance=instance, taken_ms=taken, sequence=1, counters=counters, per_model={}, per_consumer={}
        )
    )


def a_pipeline_with_a_dead_instance() -> FakeService:
    """p0 checkpointed a moment ago, p1 two minutes ago (killed holding 3 partitions, 40 waiting
    items of which 10 are of model ``nobody``, for which no contract exists); the group committed
    offset 5 on ingest partition 0 of 12 messages, nothing on partition 1 (7 messages)."""
    svc = FakeService()
    kafka, topics = svc.kafka, svc.topics
    producer = svc.clients.producer({})
    contract = Contract("gpu0", "m", budget_tokens=1024, max_items=4)
    producer.produce(topics.contracts, encode_contract(ContractRecord(contract, 1)), b"gpu0")
    base = {"received_items": 50, "received_tokens": 5000, "owned_partitions": 3, "ingest_partitions": 6}
    p0 = {**base, "queued_items": 0, "queued_tokens": 0, "queued_items@m": 0, "queued_tokens@m": 0}
    p1 = {**base, "queued_items": 40, "queued_tokens": 4000, "queued_items@m": 30, "queued_tokens@m": 3000}
    p1 |= {"queued_items@nobody": 10, "queued_tokens@nobody": 1000}
    producer.produce(topics.accounting, checkpoint("p0", 0.5, p0), b"p0")
    producer.produce(topics.accounting, checkpoint("p1", 120, p1), b"p1")
    for partition, messages in ((0, 12), (1, 7)):
        for _ in range(messages):
            producer.produce(topics.ingest, b"x", b"k", partition=partition)
    producer.flush()
    group = svc.clients.consumer({"group.id": svc.settings.group_id})
    group.commit(offsets=[TopicPartition(topics.ingest, 0, 5)], asynchronous=False)
    assert kafka.topics[topics.ingest][0]
    return svc


def test_every_instance_exports_the_whole_pipeline_as_status_reads_it() -> None:
    svc = a_pipeline_with_a_dead_instance()
    m = read_registry(processor_registry(svc, pipeline_in_background=False))
    # p1 died two minutes ago: still there, STALE, its share in the sums
    assert value(m, "tokenfabric_pipeline_checkpoint_age_seconds", processor="p1") >= 119
    assert value(m, "tokenfabric_pipeline_checkpoint_age_seconds", processor="p0") < 30
    assert value(m, "tokenfabric_pipeline_processor_stale", processor="p1") == 1
    assert value(m, "tokenfabric_pipeline_processor_stale", processor="p0") == 0
    assert value(m, "tokenfabric_pipeline_owned_partitions", processor="p1") == 3
    assert value(m, "tokenfabric_pipeline_tokens", stage="received") == 10_000
    assert value(m, "tokenfabric_pipeline_tokens", stage="queued") == 4000
    assert value(m, "tokenfabric_pipeline_items", stage="queued") == 40
    assert value(m, "tokenfabric_pipeline_processor_tokens", processor="p1", stage="queued") == 4000
    assert value(m, "tokenfabric_pipeline_processor_tokens", processor="p0", stage="received") == 5000
    # the dead instance's waiting items of a model nobody serves
    assert value(m, "tokenfabric_pipeline_unserved_items", model="nobody") == 10
    assert ("tokenfabric_pipeline_unserved_items", frozenset({("model", "m")})) not in m
    # the group's lag: partition 0 from its commit, partition 1 (never committed) from its start
    assert value(m, "tokenfabric_pipeline_ingest_lag_messages", partition="0") == 7
    assert value(m, "tokenfabric_pipeline_ingest_lag_messages", partition="1") == 7
    assert value(m, "tokenfabric_pipeline_ingest_lag_messages", partition="2") == 0
    assert value(m, "tokenfabric_pipeline_ingest_partitions") == 3
    assert value(m, "tokenfabric_pipeline_read_age_seconds") >= 0


def test_the_reader_holds_what_status_gathers() -> None:
    """What ``processor.ops.status.gather`` reads (the broker test compares the two on Kafka)."""
    svc = a_pipeline_with_a_dead_instance()
    reader = PipelineReader(svc.conf, svc.topics, svc.settings.group_id, svc.clients)
    reader.refresh(int(time.time() * 1000))
    view = reader.view
    assert sorted(view.checkpoints) == ["p0", "p1"] and sorted(view.contracts) == ["gpu0"]
    assert view.ingest_lag == 14 and view.ingest_end == 19
    rep = report(view, svc.topics)
    assert [(p.instance, p.state) for p in rep.processors] == [("p0", "live"), ("p1", "stale")]


def test_a_refresh_reads_only_what_was_appended_and_keeps_the_newest_checkpoint() -> None:
    svc = a_pipeline_with_a_dead_instance()
    reader = PipelineReader(svc.conf, svc.topics, svc.settings.group_id, svc.clients)
    reader.refresh(1)
    producer = svc.clients.producer({})
    producer.produce(svc.topics.accounting, checkpoint("p1", 0.1, {"received_tokens": 7}), b"p1")
    producer.produce(svc.topics.contracts, None, b"gpu0")  # the consumer retired: a tombstone
    producer.flush()
    reader.refresh(2)
    assert reader.view.checkpoints["p1"].counters == {"received_tokens": 7}
    assert reader.view.contracts == {}
    assert reader.view.read_ms == 2


def test_a_broker_that_does_not_answer_keeps_the_last_figures() -> None:
    svc = a_pipeline_with_a_dead_instance()
    collector = PipelineCollector(
        PipelineReader(svc.conf, svc.topics, svc.settings.group_id, svc.clients),
        background=False,
        refresh_s=0,
    )
    first = collector.figures()
    assert first is not None
    from confluent_kafka import KafkaError

    from processor.kafka.memory import error

    svc.kafka.fail_next("committed", error(KafkaError._TRANSPORT, "broker down"))
    assert collector.figures() is first


def test_the_lag_counts_from_the_commit_or_the_start() -> None:
    lag = GroupLag(committed={0: 5, 1: -1}, start={0: 0, 1: 3}, end={0: 12, 1: 10, 2: 4})
    assert [lag.messages(p) for p in (0, 1, 2)] == [7, 7, 4]


def test_figures_wait_until_the_topics_were_read_to_their_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first read cut short by its time budget (a long accounting topic) publishes nothing: a view
    missing instances would show a STALE instance as absent and the ledger short."""
    import processor.ops.pipeline_view as pipeline_view

    svc = a_pipeline_with_a_dead_instance()
    monkeypatch.setattr(pipeline_view, "READ_BUDGET_S", 0.0)  # no time to read anything
    reader = PipelineReader(svc.conf, svc.topics, svc.settings.group_id, svc.clients)
    collector = PipelineCollector(reader, background=False, refresh_s=0)
    assert collector.figures() is None and not reader.caught_up
    monkeypatch.setattr(pipeline_view, "READ_BUDGET_S", 1.0)
    figures = collector.figures()
    assert figures is not None and [p.instance for p in figures.report.processors] == ["p0", "p1"]
