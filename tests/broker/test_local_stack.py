"""``tokenfabric local up|status|down`` as a newcomer runs it: a job through it, then everything it
started stopped and nothing else; ``down`` refuses, in one line, to discard a job not yet collected.

The stack gets its own ``TOKENFABRIC_HOME``, so ``up`` starts a broker of its own there (the test
session's broker at ``KAFKA_BOOTSTRAP`` is not the local default and must survive ``down``), and a
bystander process started by the test must survive too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from processor.local.broker import broker_status
from processor.local.processes import process_argv
from processor.local.stack import Stack, StackProcess
from tests.broker.rig import review_job

pytestmark = pytest.mark.kafka


def _tokenfabric(env: dict[str, str], *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )


def test_local_up_runs_a_job_and_down_stops_exactly_what_up_started(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "TOKENFABRIC_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("KAFKA_BOOTSTRAP", None)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        up = _tokenfabric(env, "local", "up", "--consumers", "2", "--topic-prefix", "trial")
        assert up.returncode == 0, up.stderr + up.stdout
        assert "starting the local Kafka broker" in up.stdout
        stack = Stack.load(home / "local")
        assert stack is not None and stack.started_broker
        assert [p.name for p in stack.processes] == ["processor", "card1", "card2"]
        assert all(p.alive() for p in stack.processes)
        assert "--template FILE --topic-prefix trial\n" in up.stdout and "--bootstrap" not in up.stdout

        # a second up is refused while this one runs
        again = _tokenfabric(env, "local", "up")
        assert again.returncode == 1
        assert again.stderr == (
            "tokenfabric local: error: a local stack is already up (prefix trial): "
            "'tokenfabric local down' first\n"
        )
        status = _tokenfabric(env, "local", "status")
        assert status.returncode == 0
        assert status.stdout.count(" up  ") == 4, status.stdout  # the broker too
        assert (
            "  kafka      up    pid " in status.stdout and "(started by up; down stops it)" in status.stdout
        )

        # the job path the docs give, word for word but for the files
        data, template = review_job(tmp_path, 20)
        kafka = ["--bootstrap", stack.bootstrap, "--topic-prefix", "trial"]
        submit = _tokenfabric(env, "submit", str(data), "--job", "try", "--template", str(template), *kafka)
        assert submit.returncode == 0, submit.stderr
        assert "warning" not in submit.stderr  # the stack's consumers serve the default model
        out = tmp_path / "out.jsonl"
        collect = _tokenfabric(
            env, "collect", "--job", "try", "--out", str(out), "--wait", "--timeout-s", "120", *kafka
        )
        assert collect.returncode == 0, collect.stderr + collect.stdout
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert len(rows) == 20 and {r["status"] for r in rows} == {"ok"}

        # a job not yet collected: down refuses to discard it without a word, and names the two ways on
        pending = _tokenfabric(
            env, "submit", str(data), "--job", "later", "--template", str(template), *kafka
        )
        assert pending.returncode == 0, pending.stderr
        refused = _tokenfabric(env, "local", "down")
        assert refused.returncode == 1 and refused.stdout == "", refused.stdout
        assert refused.stderr.startswith("tokenfabric local: error: stopping the broker 'up' started "), (
            refused
        )
        assert "1 have results not yet collected (later)" in refused.stderr, refused.stderr
        assert (
            "--out FILE --topic-prefix trial' first, or 'tokenfabric local down --discard'\n"
            in refused.stderr
        )
        assert len(refused.stderr.splitlines()) == 1 and all(p.alive() for p in stack.processes)

        down = _tokenfabric(env, "local", "down", "--discard")
        assert down.returncode == 0, down.stderr
        assert down.stdout == "stopped: card2, card1, processor, kafka\n"
        assert not any(p.alive() for p in stack.processes)
        assert broker_status(home / "kafka") is None
        assert Stack.load(home / "local") is None
        assert bystander.poll() is None  # not ours: untouched
        assert _tokenfabric(env, "local", "down").stdout == "no local stack was up\n"
    finally:
        _tokenfabric(env, "local", "down")
        bystander.kill()
        bystander.wait()


def test_a_recorded_pid_now_running_another_program_is_not_the_stack_s() -> None:
    """Pids are reused: ``down`` signals a pid only while it runs the recorded command line."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        mine = StackProcess("card1", other.pid, [sys.executable, "-m", "processor", "consumer"], "card1.log")
        assert not mine.alive()
        assert StackProcess("sleep", other.pid, process_argv(other.pid), "x.log").alive()
    finally:
        other.kill()
        other.wait()
