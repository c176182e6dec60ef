"""A broker that requires SASL: clients without credentials are refused, env-configured ones work.

This file starts its **own** broker (``kafka_local.start_broker(..., sasl_users=...)``: a
SASL_PLAINTEXT listener with the PLAIN mechanism) in a temp dir and stops it at the end, whatever
the session broker is. Every tokenfabric process here gets its credentials only from the
``TOKENFABRIC_KAFKA_*`` environment variables (processor.kafka.config.client_config), the way a
Kubernetes Secret reaches it, and no output may contain the password.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from processor.cli.tokenfabric import main as cli_main
from processor.kafka.config import client_config, describe, redacted
from processor.local.broker import BrokerInfo, start_broker, stop_broker
from processor.wire.items import decode_token_item
from tests.common import ROOT
from tests.common import get as _get

pytestmark = pytest.mark.kafka

USER = "alice"
PASSWORD = "alice-" + uuid.uuid4().hex  # unique, so finding it in any output is unambiguous


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInfo]:
    state = tmp_path_factory.mktemp("kafka-sasl")
    info = start_broker(state, heap_mb=384, sasl_users={USER: PASSWORD})
    try:
        yield info
    finally:
        stop_broker(state)


@pytest.fixture
def sasl_env(sasl_broker: BrokerInfo, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The variables a pod would get: bootstrap plus SASL settings, the password from a Secret."""
    env = {
        "KAFKA_BOOTSTRAP": sasl_broker.bootstrap,
        "TOKENFABRIC_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "TOKENFABRIC_KAFKA_SASL_MECHANISM": "PLAIN",
        "TOKENFABRIC_KAFKA_SASL_USERNAME": USER,
        "TOKENFABRIC_KAFKA_SASL_PASSWORD": PASSWORD,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def _metadata_error(conf: dict[str, object]) -> tuple[KafkaException | None, list[KafkaError]]:
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": errors.append, "log_level": 0})
    try:
        admin.list_topics(timeout=5)
    except KafkaException as exc:
        admin.poll(0.5)
        return exc, errors
    return None, errors


def test_the_broker_is_marked_sasl(sasl_broker: BrokerInfo) -> None:
    assert sasl_broker.security_protocol == "SASL_PLAINTEXT"
    record = (sasl_broker.data_dir.parent / "broker.json").read_text()
    assert PASSWORD not in record
    properties = sasl_broker.data_dir.parent / "server.properties"
    assert properties.stat().st_mode & 0o077 == 0, "the broker's properties hold passwords: owner only"


def test_a_client_without_credentials_is_refused(sasl_broker: BrokerInfo) -> None:
    exc, _ = _metadata_error({"bootstrap.servers": sasl_broker.bootstrap})
    assert exc is not None, "a PLAINTEXT client got metadata from the SASL listener"

    wrong = {
        "bootstrap.servers": sasl_broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": USER,
        "sasl.password": "not-the-password",
    }
    exc, errors = _metadata_error(wrong)
    assert exc is not None, "a wrong password got metadata"
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), [e.str() for e in errors]


def test_env_credentials_create_topics_produce_consume_and_status(
    sasl_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"sasl{uuid.uuid4().hex[:6]}"
    assert cli_main(["topics", "create", "--topic-prefix", prefix, "--consumer", "gpu0"]) == 0
    assert (
        cli_main(
            ["produce", "--trace", "azure_conv", "--limit", "25", "--topic-prefix", prefix, "--no-progress"]
        )
        == 0
    )
    assert cli_main(["status", "--topic-prefix", prefix]) == 0
    out = capsys.readouterr()
    assert f"created {prefix}.ingest" in out.out
    assert "produced 25 items" in out.out
    assert PASSWORD not in out.out + out.err

    conf = client_config()
    assert conf["sasl.password"] == PASSWORD  # handed to librdkafka ...
    assert redacted(conf)["sasl.password"] == "***"  # ... and never printed
    assert PASSWORD not in describe(conf)
    consumer = Consumer({**conf, "group.id": f"{prefix}-read", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([f"{prefix}.ingest"])
        items = []
        deadline = time.monotonic() + 30
        while len(items) < 25 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                items.append(decode_token_item(msg.value()))
    finally:
        consumer.close()
    assert len(items) == 25


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def _spawn(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "processor", *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_processor_and_consumer_commands_run_on_env_credentials(
    sasl_env: dict[str, str], tmp_path: Path
) -> None:
    """The CLI processes, configured only by the environment, move items end to end and serve metrics."""
    prefix = f"sasl{uuid.uuid4().hex[:6]}"
    assert cli_main(["topics", "create", "--topic-prefix", prefix, "--consumer", "gpu0"]) == 0
    proc_port, app_port = _free_port(), _free_port()
    common = ["--topic-prefix", prefix]
    processor_args = ["processor", *common, "--group", f"{prefix}-proc", "--metrics-port", str(proc_port)]
    consumer_args = ["consumer", "--id", "gpu0", "--model", "default", "--budget", "16384", "--items", "64"]
    consumer_args += ["--time-scale", "0", "--metrics-port", str(app_port), *common]
    with (
        _spawn(processor_args, tmp_path / "processor.log") as proc,
        _spawn(consumer_args, tmp_path / "consumer.log") as app,
    ):
        base = f"http://127.0.0.1:{proc_port}"
        deadline = time.monotonic() + 60
        while _get(base + "/readyz")[0] != 200:
            assert proc.poll() is None, (tmp_path / "processor.log").read_text()[-3000:]
            assert time.monotonic() < deadline, _get(base + "/readyz")
            time.sleep(0.3)
        assert cli_main(["produce", "--trace", "azure_conv", "--limit", "40", "--no-progress", *common]) == 0
        from processor.sim.traces import read_shipped

        total = sum(r.length for r in read_shipped("azure_conv", limit=40))
        needle = f'tokenfabric_completed_tokens_total{{model="default"}} {float(total)}'
        deadline = time.monotonic() + 90
        while needle not in _get(base + "/metrics")[1]:
            assert proc.poll() is None and app.poll() is None, "a process exited early"
            assert time.monotonic() < deadline, "items did not complete"
            time.sleep(0.5)
        code, body = _get(f"http://127.0.0.1:{app_port}/metrics")
        assert (
            code == 200
            and 'tokenfabric_consumer_app_items_total{consumer="gpu0",model="default",status="ok"} 40.0'
            in body
        )
        assert json.loads(_get(base + "/healthz")[1])["ok"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    logs = (tmp_path / "processor.log").read_text() + (tmp_path / "consumer.log").read_text()
    assert "sasl.password=***" in logs  # the settings in force are logged, redacted
    assert PASSWORD not in logs
    assert os.environ["TOKENFABRIC_KAFKA_SASL_PASSWORD"] == PASSWORD
