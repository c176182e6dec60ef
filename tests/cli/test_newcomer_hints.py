"""A newcomer's mistakes each get one line naming the fix that fits their path, with their flags kept,
and the README's exit codes (issue 38).

No broker named anywhere and none running locally: on the jobs path (``submit``, ``collect``,
``jobs``, ...) the fix is ``tokenfabric local up`` (the broker, topics, processor and consumers),
with a ``--topic-prefix`` kept; assembling a pipeline by hand (``topics create``) it is ``tokenfabric
kafka start``. Either way exit 69, "no broker answers", as the README's table says.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from processor.cli.hints import create_command, kafka_flags, start_command
from processor.kafka.exits import EXIT_UNREACHABLE
from tests.cli.helpers import run_cli


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("KAFKA_BOOTSTRAP", "TOKENFABRIC_KAFKA_CONFIG", "TOKENFABRIC_KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path / "home"))  # no local broker there


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["jobs"], "'tokenfabric local up'"),
        (["jobs", "--topic-prefix", "teamx"], "'tokenfabric local up --topic-prefix teamx'"),
        (["collect", "--job", "j", "--out", "{tmp}/o.jsonl"], "'tokenfabric local up'"),
        (["status", "--topic-prefix", "teamx"], "'tokenfabric local up --topic-prefix teamx'"),
        (["topics", "create"], "'tokenfabric kafka start'"),
    ],
)
def test_no_broker_names_the_start_command_of_the_path_and_exits_69(
    argv: list[str], fix: str, no_cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert code == EXIT_UNREACHABLE, err
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"tokenfabric {argv[0]}: no Kafka to talk to: start one with {fix}"), err
    assert "--bootstrap HOST:PORT or KAFKA_BOOTSTRAP" in err, err


def _args(command: str, **kw: str | None) -> argparse.Namespace:
    base: dict[str, str | None] = {"bootstrap": None, "kafka_config": None, "topic_prefix": "tokenfabric"}
    return argparse.Namespace(command=command, **{**base, **kw})


def test_follow_up_hints_keep_the_flags_given() -> None:
    args = _args("submit", bootstrap="k:9092", kafka_config="c.properties", topic_prefix="teamx")
    assert kafka_flags(args) == " --bootstrap k:9092 --kafka-config c.properties --topic-prefix teamx"
    assert kafka_flags(_args("submit")) == ""  # the defaults: the next command finds them by itself
    local: dict[str, str] = {}
    own = {"KAFKA_BOOTSTRAP": "k:9092"}
    assert (
        create_command(_args("jobs", topic_prefix="teamx"), local)
        == "tokenfabric local up --topic-prefix teamx"
    )
    assert (
        create_command(_args("jobs", topic_prefix="t"), own) == "tokenfabric topics create --topic-prefix t"
    )
    on_flags = _args("jobs", bootstrap="k:9092", topic_prefix="t")
    assert create_command(on_flags, local) == "tokenfabric topics create --bootstrap k:9092 --topic-prefix t"
    assert (
        create_command(_args("topics", topic_prefix="t"), local)
        == "tokenfabric topics create --topic-prefix t"
    )
    assert start_command(_args("processor")) == "tokenfabric kafka start"
