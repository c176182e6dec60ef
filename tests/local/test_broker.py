"""The local broker's bookkeeping (processor/local/broker.py), no broker needed: a stale state file, the
cluster id, where state lives. Against a running broker: tests/broker/test_local_broker.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from processor.local import broker as kafka_local
from processor.local import broker_files


def test_stale_state_file_is_not_a_running_broker(tmp_path: Path) -> None:
    # broker.json pointing at a live process that is not a Kafka JVM (this test process)
    record = {"bootstrap": "127.0.0.1:1", "pid": os.getpid(), "data_dir": "d", "log_dir": "l"}
    (tmp_path / "broker.json").write_text(json.dumps(record))
    assert kafka_local.broker_status(tmp_path) is None
    assert kafka_local.stop_broker(tmp_path) is False
    assert not (tmp_path / "broker.json").exists()


def test_cluster_id_has_kafka_uuid_form() -> None:
    for _ in range(200):
        cluster_id = broker_files.random_cluster_id()
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert set(cluster_id) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_default_state_dir_follows_tokenfabric_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path))
    assert kafka_local.default_state_dir() == tmp_path / "kafka"
    monkeypatch.delenv("TOKENFABRIC_HOME")
    assert kafka_local.default_state_dir() == Path.home() / ".cache" / "tokenfabric" / "run" / "kafka"


def test_users_need_a_secured_start_and_nothing_starts_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from processor.cli import kafka as kafka_cli

    assert kafka_cli.main(["--state-dir", str(tmp_path / "k"), "start", "--user", "alice"]) == 2
    assert "--user needs --secure" in capsys.readouterr().err
    assert not (tmp_path / "k" / "broker.json").exists()


def test_kafkas_tools_are_passed_their_arguments_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tokenfabric kafka [--state-dir D] consumer-groups ARGS``: ARGS go to ConsumerGroupCommand."""
    from processor.cli import kafka as kafka_cli
    from processor.local import jars

    monkeypatch.setattr(jars, "jars_dir", lambda: Path("/jars"))
    assert kafka_cli._tool_call(
        ["--state-dir", "/s", "transactions", "--bootstrap-server", "b:1", "list"]
    ) == (
        "transactions",
        ["--bootstrap-server", "b:1", "list"],
    )
    assert kafka_cli._tool_call(["start", "--port", "9092"]) is None
    command = jars.tool_command("java", "consumer-groups", ["--list", "--bootstrap-server", "b:1"])
    assert command[-4:] == [jars.TOOLS["consumer-groups"], "--list", "--bootstrap-server", "b:1"]
    assert command[command.index("-cp") + 1] == "/jars/*"
