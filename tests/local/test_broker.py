"""The local broker's bookkeeping (processor/local/broker.py), no broker needed: a stale state file, the
cluster id, where state lives. Against a running broker: tests/broker/test_local_broker.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from processor.local import broker as kafka_local


def test_stale_state_file_is_not_a_running_broker(tmp_path: Path) -> None:
    # broker.json pointing at a live process that is not a Kafka JVM (this test process)
    record = {"bootstrap": "127.0.0.1:1", "pid": os.getpid(), "data_dir": "d", "log_dir": "l"}
    (tmp_path / "broker.json").write_text(json.dumps(record))
    assert kafka_local.broker_status(tmp_path) is None
    assert kafka_local.stop_broker(tmp_path) is False
    assert not (tmp_path / "broker.json").exists()


def test_cluster_id_has_kafka_uuid_form() -> None:
    for _ in range(200):
        cluster_id = kafka_local._random_cluster_id()
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert set(cluster_id) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_default_state_dir_follows_tokenfabric_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path))
    assert kafka_local.default_state_dir() == tmp_path / "kafka"
    monkeypatch.delenv("TOKENFABRIC_HOME")
    assert kafka_local.default_state_dir() == Path.home() / ".cache" / "tokenfabric" / "run" / "kafka"
