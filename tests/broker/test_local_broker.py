"""The local single-node broker (processor/local/broker.py) serves what the processor needs.

The tests run against the session broker from ``conftest.kafka_bootstrap`` (the CLI test starts its
own). They cover metadata, topic creation, produce/consume in a consumer group, and transactions:
commit, abort, and ``read_committed`` isolation. Transactions are the part that fails on a single node
unless ``transaction.state.log.replication.factor`` and ``.min.isr`` are 1."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from processor.cli import kafka as kafka_cli
from processor.local import broker as kafka_local

pytestmark = pytest.mark.kafka
TIMEOUT_S = 30.0


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _create_topic(bootstrap: str, partitions: int = 1) -> str:
    topic = _unique("tf-test")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(TIMEOUT_S)
    return topic


def _consume_to_end(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> list[bytes]:
    """Every value a new consumer group reads from the start of *topic* until the end (one partition)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _unique("tf-test-group"),
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return values
                raise AssertionError(f"consumer error: {error}")
            value = msg.value()
            assert value is not None
            values.append(value)
        raise AssertionError(f"end of {topic} not reached in {TIMEOUT_S} s; read {values!r}")
    finally:
        consumer.close()


@pytest.mark.kafka
def test_broker_answers_metadata(kafka_bootstrap: str) -> None:
    metadata = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=TIMEOUT_S)
    assert len(metadata.brokers) == 1
    assert metadata.cluster_id


@pytest.mark.kafka
def test_produce_and_consume(kafka_bootstrap: str) -> None:
    topic = _create_topic(kafka_bootstrap)
    sent = [f"message-{i}".encode() for i in range(5)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for value in sent:
        producer.produce(topic, value=value, key=b"k")
    assert producer.flush(TIMEOUT_S) == 0

    assert _consume_to_end(kafka_bootstrap, topic) == sent


@pytest.mark.kafka
def test_transactions_commit_abort_and_read_committed(kafka_bootstrap: str) -> None:
    topic = _create_topic(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": _unique("tf-test-tx")})
    producer.init_transactions(TIMEOUT_S)  # times out on one broker without the transaction.state.log.* = 1

    producer.begin_transaction()
    producer.produce(topic, value=b"committed-1")
    producer.produce(topic, value=b"committed-2")
    producer.commit_transaction(TIMEOUT_S)

    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    assert producer.flush(TIMEOUT_S) == 0  # make sure it reaches the log before the abort
    producer.abort_transaction(TIMEOUT_S)

    producer.begin_transaction()
    producer.produce(topic, value=b"committed-3")
    producer.commit_transaction(TIMEOUT_S)

    committed = [b"committed-1", b"committed-2", b"committed-3"]
    assert _consume_to_end(kafka_bootstrap, topic, "read_committed") == committed
    # The aborted record is really in the log; only read_committed hides it.
    assert _consume_to_end(kafka_bootstrap, topic, "read_uncommitted") == [
        b"committed-1",
        b"committed-2",
        b"aborted",
        b"committed-3",
    ]


@pytest.mark.kafka
@pytest.mark.skipif(shutil.which("java") is None, reason="the local broker needs Java 17+")
def test_cli_start_is_idempotent_then_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--state-dir", str(tmp_path)]
    try:
        assert kafka_cli.main([*state, "start", "--heap-mb", "384"]) == 0
        first = capsys.readouterr().out
        assert first.startswith("bootstrap=127.0.0.1:")
        info = kafka_local.broker_status(tmp_path)
        assert info is not None
        assert first.splitlines()[0] == f"bootstrap={info.bootstrap}"

        assert kafka_cli.main([*state, "start"]) == 0  # already running: same broker, no new JVM
        assert capsys.readouterr().out == first
        assert kafka_cli.main([*state, "status"]) == 0
        assert capsys.readouterr().out == first
    finally:
        assert kafka_cli.main([*state, "stop"]) == 0
    assert capsys.readouterr().out == "stopped\n"
    assert kafka_local.broker_status(tmp_path) is None
    assert kafka_cli.main([*state, "status"]) == 1
    assert kafka_cli.main([*state, "stop"]) == 0
    assert capsys.readouterr().out == "not running\nnot running\n"


@pytest.mark.kafka
def test_cli_restart_keeps_the_port_the_topics_and_the_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ["--state-dir", str(tmp_path)]
    try:
        assert kafka_cli.main([*state, "start", "--heap-mb", "384"]) == 0
        first = capsys.readouterr().out.splitlines()
        bootstrap = first[0].removeprefix("bootstrap=")
        topic = _create_topic(bootstrap)
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, b"kept across the restart")
        assert producer.flush(TIMEOUT_S) == 0

        assert kafka_cli.main([*state, "restart", "--heap-mb", "384"]) == 0
        again = capsys.readouterr().out.splitlines()
        assert again[0] == f"bootstrap={bootstrap}"  # the same port: clients reconnect by themselves
        assert again[1] != first[1]  # a new JVM
        assert _consume_to_end(bootstrap, topic) == [b"kept across the restart"]
    finally:
        assert kafka_cli.main([*state, "stop"]) == 0


def test_kafkas_own_tools_run_from_the_local_jars(
    kafka_bootstrap: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """``tokenfabric kafka consumer-groups|transactions`` pass their arguments to Kafka's
    ConsumerGroupCommand and TransactionsCommand (the ``kafka-tools`` jar), as docs/operations.md
    uses them; the exit code is the tool's."""
    from processor.local.jars import jars_dir

    assert any(jars_dir().glob("kafka-tools-*.jar")), "kafka-tools is not among the jars"
    topic = _create_topic(kafka_bootstrap)
    group = _unique("tf-tools")
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()
    capfd.readouterr()
    assert (
        kafka_cli.main(
            ["consumer-groups", "--bootstrap-server", kafka_bootstrap, "--describe", "--group", group]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert group in out and topic in out, out
    assert kafka_cli.main(["transactions", "--bootstrap-server", kafka_bootstrap, "list"]) == 0
    assert "TransactionalId" in capfd.readouterr().out
    assert kafka_cli.main(["consumer-groups", "--bootstrap-server", kafka_bootstrap, "--no-such-option"]) != 0
