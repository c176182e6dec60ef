"""Every command checks its arguments before it looks for a cluster.

With no broker named anywhere (no ``--bootstrap``, no ``KAFKA_BOOTSTRAP``, no local broker), a
command given a bad argument must name that argument, not say "no Kafka to talk to": the person would
start a broker only to meet the real error next. Exit 2 (bad arguments), one line, no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import run_cli

CASES = {
    "consumer-budget-0": (
        ["consumer", "--id", "c", "--model", "m", "--budget", "0", "--items", "4"],
        "budget",
    ),
    "consumer-no-model": (["consumer", "--id", "c", "--budget", "64", "--items", "4"], "--model"),
    "consumer-max-batches": (
        ["consumer", "--id", "c", "--model", "m", "--budget", "64", "--items", "4", "--max-batches", "0"],
        "--max-batches",
    ),
    "consumer-engine-opt": (
        ["consumer", "--id", "c", "--model", "m", "--budget", "64", "--items", "4", "--engine-opt", "x"],
        "--engine-opt",
    ),
    "processor-commit-interval": (["processor", "--commit-interval-ms", "0"], "--commit-interval-ms"),
    "processor-stuck-exit": (["processor", "--stuck-exit-s", "-1"], "--stuck-exit-s"),
    "produce-no-trace": (["produce", "--trace", "/nope"], "/nope"),
    "status-interval": (["status", "--interval-s", "-1"], "--interval-s"),
    "topics-partitions": (["topics", "create", "--ingest-partitions", "0"], "--ingest-partitions"),
    "topics-replication": (["topics", "create", "--replication-factor", "0"], "--replication-factor"),
    "topics-min-insync": (
        ["topics", "create", "--replication-factor", "2", "--min-insync-replicas", "3"],
        "--min-insync-replicas 3 exceeds --replication-factor 2",
    ),
    "local-consumers": (["local", "up", "--consumers", "0"], "--consumers"),
    "acls-principal": (["acls", "--principal", "alice"], "--principal"),
    "local-engine-opt": (["local", "up", "--engine-opt", "url"], "--engine-opt"),
    "collect-poll": (["collect", "--job", "j", "--out", "r.jsonl", "--poll-s", "0"], "--poll-s"),
    "collector-poll": (["collector", "--out-dir", "{tmp}/out", "--poll-s", "0"], "--poll-s"),
    "plain-queue-budget-0": (
        ["plain-queue", "--id", "c", "--model", "m", "--budget", "0", "--items", "4"],
        "budget",
    ),
    "share-queue-items-0": (
        ["share-queue", "--id", "c", "--model", "m", "--budget", "64", "--items", "0"],
        "items",
    ),
    "share-weight": (["share", "j", "--weight", "0"], "weight"),
    "cancel-bad-name": (["cancel", "bad name!"], "job name"),
    "schemas-compatibility": (["schemas", "register", "--compatibility", "SOMETIMES"], "--compatibility"),
    "processor-registry-url": (["processor", "--registry", "ftp://r"], "--registry"),
    "submit-no-dataset": (["submit", "/nope.jsonl", "--job", "j", "--template", "/nope.toml"], "/nope"),
}


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("TOKENFABRIC_KAFKA_CONFIG", raising=False)
    monkeypatch.delenv("TOKENFABRIC_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path / "home"))  # no local broker there


def test_without_a_cluster_the_commands_say_so(capsys: pytest.CaptureFixture[str], no_cluster: None) -> None:
    """The control: good arguments and no cluster do get "no Kafka to talk to" (exit 69, README)."""
    code, _, err = run_cli(capsys, "status")
    assert code == 69 and "no Kafka to talk to" in err, err


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_reported_before_the_missing_cluster(
    case: str, capsys: pytest.CaptureFixture[str], no_cluster: None, tmp_path: Path
) -> None:
    argv, named = CASES[case]
    code, _, err = run_cli(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert code == 2, err
    assert "no Kafka to talk to" not in err, err
    assert named in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_every_command_with_arguments_of_its_own_is_covered() -> None:
    """audit and jobs take only Kafka options (checked before any connection by ``kafka_settings``);
    simulate, demo, kafka, llm and registry need no cluster to be named."""
    from processor.cli.tokenfabric import COMMANDS

    covered = {argv[0] for argv, _ in CASES.values()}
    assert covered == set(COMMANDS) - {"audit", "jobs", "simulate", "demo", "kafka", "llm", "registry"}
