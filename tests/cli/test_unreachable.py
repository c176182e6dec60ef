"""A short command pointed at a broker that is not there says so in one line and exits 69.

Every command that talks to Kafka and then ends (status, audit, jobs, topics, produce, submit,
collect) probes the cluster first (processor/kafka/reach.py). Port 1 on loopback refuses every
connection, so each command here meets the same dead cluster; they run side by side to keep the test
to one probe's time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from processor.kafka.reach import EXIT_UNREACHABLE
from tests.common import ROOT

DEAD = "127.0.0.1:1"


def test_every_short_command_gives_one_line_and_exit_69_when_no_broker_answers(tmp_path: Path) -> None:
    dataset, template = tmp_path / "rows.jsonl", tmp_path / "t.toml"
    dataset.write_text('{"text": "hello"}\n')
    template.write_text('[[parts]]\nname = "q"\ntext = "{text}"\n')
    out = tmp_path / "results.jsonl"
    commands = {
        "status": ["status"],
        "audit": ["audit"],
        "jobs": ["jobs"],
        "topics": ["topics", "create"],
        "produce": ["produce", "--trace", "mooncake_synthetic", "--limit", "5"],
        "submit": ["submit", str(dataset), "--job", "j1", "--template", str(template)],
        "collect": ["collect", "--job", "j1", "--out", str(out)],
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFABRIC_KAFKA_")}
    env["KAFKA_BOOTSTRAP"] = DEAD
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "processor", *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, argv in commands.items()
    }
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=60)
        lines = output.strip().splitlines()
        assert proc.returncode == EXIT_UNREACHABLE, (name, output)
        assert len(lines) == 1, (name, output)
        line = lines[0]
        assert line.startswith(f"tokenfabric {name}: no Kafka broker answered at {DEAD}"), line
        assert "Connection refused" in line, line  # what librdkafka saw, said once
        assert "check --bootstrap or KAFKA_BOOTSTRAP" in line, line
        assert "%3|" not in output and "KafkaError{" not in output, output
    assert not out.exists(), "collect wrote its output before knowing the cluster answers"
