"""librdkafka statistics (processor/ops/kafka_stats.py): the kept figures of a statistics document,
as gauges, and what is left out. The document below has the shape librdkafka emits (STATISTICS.md;
a real one from the session broker goes through it in tests/broker/test_metrics.py)."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from processor.ops.kafka_stats import KafkaStats, parse_stats
from tests.ops.helpers import parse, value


def _doc(name: str = "rdkafka#consumer-1") -> str:
    return json.dumps(
        {
            "name": name,
            "client_id": "rdkafka",
            "type": "consumer",
            "replyq": 2,
            "msg_cnt": 0,
            "brokers": {
                "GroupCoordinator": {"nodeid": -1, "outbuf_cnt": 0, "waitresp_cnt": 1, "rtt": {"cnt": 0}},
                "127.0.0.1:9092/1": {
                    "nodeid": 1,
                    "outbuf_cnt": 3,
                    "waitresp_cnt": 1,
                    "rtt": {"cnt": 12, "avg": 1500, "p99": 9000},
                },
                "127.0.0.1:9093/2": {"nodeid": 2, "outbuf_cnt": 0, "waitresp_cnt": 0, "rtt": {"cnt": 0}},
            },
            "topics": {
                "tokenfabric.batches.gpu0": {
                    "partitions": {
                        "0": {"fetchq_cnt": 4, "consumer_lag": -1, "consumer_lag_stored": 7},
                        "1": {"fetchq_cnt": 1, "consumer_lag": -1, "consumer_lag_stored": -1},
                        "2": {"fetchq_cnt": 0, "consumer_lag": 3, "consumer_lag_stored": -1},
                        "-1": {"fetchq_cnt": 0, "consumer_lag": -1, "consumer_lag_stored": -1},
                    }
                }
            },
        }
    )


def test_a_statistics_document_keeps_lag_rtt_and_queue_depths() -> None:
    stats = parse_stats(_doc())
    assert stats.client == "rdkafka#consumer-1" and stats.kind == "consumer"
    # lag from the stored position (0), else the committed offset (2); partition 1's is not known
    # yet (-1), and the -1 pseudo partition is not a partition
    topic = "tokenfabric.batches.gpu0"
    assert stats.lag == ((topic, "0", 7), (topic, "2", 3))
    # brokers without a node id (the coordinator alias) or without requests in the window are left out
    assert stats.rtt == (("127.0.0.1:9092/1", 0.0015, 0.009),)
    assert stats.queues == {"producer": 0, "events": 2, "outbuf": 3, "waitresp": 2, "fetch": 5}


def test_the_gauges_carry_the_client_and_the_constant_labels() -> None:
    kafka = KafkaStats(labels={"consumer": "gpu0"})
    conf = kafka.attach({"bootstrap.servers": "x:1"})
    assert conf["statistics.interval.ms"] == "15000" and conf["stats_cb"] == kafka.on_stats
    assert kafka.attach({"statistics.interval.ms": "0"})["statistics.interval.ms"] == "0"  # the operator's
    slow = KafkaStats()
    assert slow.attach({"statistics.interval.ms": "60000"})["statistics.interval.ms"] == "60000"
    assert slow.interval_ms == 60_000  # clients are forgotten after 3 of the operator's intervals
    conf["stats_cb"](_doc())
    registry = CollectorRegistry()
    registry.register(kafka)
    m = parse(generate_latest(registry).decode())
    key = {"consumer": "gpu0", "client": "rdkafka#consumer-1"}
    lag = value(
        m, "tokenfabric_kafka_consumer_lag_messages", topic="tokenfabric.batches.gpu0", partition="0", **key
    )
    assert lag == 7
    assert (
        value(m, "tokenfabric_kafka_broker_rtt_seconds", broker="127.0.0.1:9092/1", stat="p99", **key)
        == 0.009
    )
    assert value(m, "tokenfabric_kafka_queue_depth", queue="fetch", **key) == 5


def test_a_document_it_cannot_read_is_dropped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    kafka = KafkaStats()
    kafka.on_stats("{not json")
    kafka.on_stats(json.dumps({"no": "name"}))
    assert kafka.clients == {}
    assert len([r for r in caplog.records if "not understood" in r.getMessage()]) == 1


def test_a_client_that_went_quiet_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = KafkaStats(interval_ms=1000)
    kafka.on_stats(_doc("rdkafka#consumer-9"))
    assert any(family.samples for family in kafka.collect())  # reported while fresh
    seen = kafka._seen["rdkafka#consumer-9"]
    monkeypatch.setattr("processor.ops.kafka_stats.time.monotonic", lambda: seen + 3.5)
    assert all(not family.samples for family in kafka.collect())
    assert kafka.clients == {}


def test_partitions_the_client_gave_up_leave_at_once_and_positions_are_kept() -> None:
    """After a rebalance librdkafka still reports a revoked partition (fetch_state ``none``) with its
    last lag: it must not be exported. Fetched partitions give their position and stable end."""
    doc = json.loads(_doc())
    parts = doc["topics"]["tokenfabric.batches.gpu0"]["partitions"]
    parts["0"] |= {"fetch_state": "active", "app_offset": 10, "ls_offset": 17}
    parts["2"] |= {"fetch_state": "none", "app_offset": 4, "ls_offset": 7}  # revoked
    parts["1"] |= {"fetch_state": "active", "app_offset": -1, "ls_offset": 3}  # no position yet
    # handed back, as a real document shows it after a rebalance (tests/broker/test_metrics.py)
    parts["3"] = {"fetch_state": "stopped", "consumer_lag_stored": 611, "app_offset": -1001, "ls_offset": 8}
    stats = parse_stats(json.dumps(doc))
    topic = "tokenfabric.batches.gpu0"
    assert stats.lag == ((topic, "0", 7),)
    assert [(p.partition, p.position, p.stable_end) for p in stats.positions] == [(0, 10, 17)]
