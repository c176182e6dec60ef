"""A ``--topic-prefix`` with no pipeline behind it is one line and exit 2 for every command that reads
or feeds a pipeline, naming the close prefixes that do exist as what was meant; nothing is created
under the typo, and creating it is not advised.

Before, ``jobs`` and ``status`` printed empty tables and exited 0, and ``audit`` blamed the processor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from processor.cli.tokenfabric import main
from tests.broker.rig import new_topics

pytestmark = pytest.mark.kafka

COMMANDS = {
    "status": ["status"],
    "jobs": ["jobs"],
    "audit": ["audit"],
    "collect": ["collect", "--job", "j", "--out", "{tmp}/out.jsonl"],
    "collector": ["collector", "--out-dir", "{tmp}/out", "--once"],
    "share": ["share", "j", "--weight", "2"],
    "produce": ["produce", "--trace", "data/traces/templated_trace.jsonl.gz", "--limit", "1"],
    "submit": ["submit", "{tmp}/rows.jsonl", "--job", "j", "--template", "{tmp}/t.toml"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_prefix_with_no_pipeline_is_refused_in_one_line(
    command: str, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, real = new_topics(kafka_bootstrap, "r", [], ingest_partitions=1)
    (tmp_path / "rows.jsonl").write_text('{"review": "fine"}\n', encoding="utf-8")
    (tmp_path / "t.toml").write_text('[[parts]]\nname = "r"\ntext = "{review}"\n', encoding="utf-8")
    typo = real.prefix[:-1] + ("x" if real.prefix[-1] != "x" else "y")  # one character off
    argv = [a.replace("{tmp}", str(tmp_path)) for a in COMMANDS[command]]
    code = main([*argv, "--bootstrap", kafka_bootstrap, "--topic-prefix", typo])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == ""
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, err
    assert line.startswith(f"tokenfabric {command}: error: --topic-prefix {typo!r}: no pipeline on "), line
    assert f"no topic {typo}.ingest)" in line and real.prefix in line, line
    assert f"did you mean {real.prefix}" in line, line  # a typo: the fix, not advice to create it
    assert "create" not in line, line
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(typo)]


def test_a_consumer_under_a_prefix_with_no_pipeline_creates_nothing_and_exits_75(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, real = new_topics(kafka_bootstrap, "r", [], ingest_partitions=1)
    typo = real.prefix[:-1] + ("x" if real.prefix[-1] != "x" else "y")
    card = [
        "consumer",
        "--id",
        "card",
        "--model",
        "m",
        "--budget",
        "64",
        "--items",
        "4",
        "--metrics-port",
        "0",
    ]
    code = main([*card, "--bootstrap", kafka_bootstrap, "--topic-prefix", typo])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 75, err
    assert f"--topic-prefix {typo!r}: no pipeline on " in err and real.prefix in err, err
    assert err.endswith("(the consumer creates its own batch topic only) (exit 75: a restart recovers)"), err
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(typo)]
