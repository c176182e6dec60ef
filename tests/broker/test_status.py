"""``tokenfabric status`` against a real pipeline: a killed processor and a stopped consumer are shown
stale, work for a model nobody serves is named (and logged once by the processor), the text fits 80
columns in a pipe, ``--json`` follows its schema, and the gone can be retired for good."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.local.pipeline import child_env
from processor.ops.audit import audit
from processor.ops.status import SCHEMA_PATH, StatusReport, gather, report
from tests.broker.rig import CARDS, Rig, produce, running_rig, wait_for

pytestmark = pytest.mark.kafka

STALE_S = 3.0


def read_lines(proc: subprocess.Popen[str], into: list[str]) -> None:
    """Every line ``proc`` writes, as it writes it, until it closes its output."""
    assert proc.stdout is not None
    for line in proc.stdout:
        into.append(line)


def view(rig: Rig) -> StatusReport:
    """The status report as ``tokenfabric status`` builds it."""
    return report(gather(rig.conf, rig.topics, rig.group, groups=True), rig.topics, STALE_S)


def status_cli(rig: Rig, *extra: str) -> subprocess.CompletedProcess[str]:
    """The real command, its stdout a pipe (no TTY), 80 columns."""
    env = {**child_env(rig.bootstrap), "COLUMNS": "80"}
    args = ["--topic-prefix", rig.topics.prefix, "--group", rig.group, "--stale-s", str(STALE_S)]
    return subprocess.run(
        [sys.executable, "-m", "processor", "status", *args, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_status_with_a_dead_processor_a_stale_consumer_and_an_unserved_model(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    small = CARDS[0]
    with running_rig(kafka_bootstrap, tmp_path, consumer_threads=False) as rig:
        # a static member stays in its group for session.timeout.ms after it stops (45 s by default)
        rig.spawn_consumer("small", small, env={"TOKENFABRIC_KAFKA_SESSION_TIMEOUT_MS": "6000"})
        rig.spawn_processor("processor", instance="p0")
        ids, _tokens = produce(rig, 300, seed=3)
        with TokenProducer(rig.conf, rig.topics) as producer:
            for i in range(5):
                producer.send(f"orphan-{i}", "orphan", synthetic_tokens(f"orphan-{i}", 40), shape=1)
        rig.wait_completed(len(ids), timeout_s=120)
        log = tmp_path / "processor.log"
        wait_for(lambda: "model orphan" in log.read_text(), 30, "the processor's unserved warning")

        # alive: the instance live, the consumer up, its lag read, the orphan model named
        rep = report(gather(rig.conf, rig.topics, rig.group, groups=True), rig.topics, STALE_S)
        assert [(p.instance, p.state) for p in rep.processors] == [("p0", "live")]
        (row,) = rep.consumers
        assert (row.consumer, row.state, row.members, row.unread_batches) == ("small", "up", 1, 0)
        assert row.last_completion_age_s is not None and row.completed_tokens > 0
        assert row.budget_fill is not None and 0 < row.budget_fill <= 1
        assert [(u.model, u.items, u.tokens, u.consumers) for u in rep.unserved] == [("orphan", 5, 200, [])]

        # the processor killed, the consumer stopped (its group drops it after its session timeout)
        rig.pipeline.procs["processor"].send_signal(signal.SIGKILL)
        consumer = rig.pipeline.procs["small"]
        consumer.send_signal(signal.SIGTERM)
        assert rig.pipeline.procs["processor"].wait(30) == -signal.SIGKILL
        assert consumer.wait(60) == 0
        wait_for(
            lambda: not gather(rig.conf, rig.topics, rig.group, groups=True).groups["small"].members,
            30,
            "the stopped consumer's session to time out",
        )
        wait_for(  # the last checkpoint older than STALE_S (was a fixed STALE_S + 1 s sleep)
            lambda: [(p.instance, p.state) for p in view(rig).processors] == [("p0", "stale")],
            30,
            "p0 to read as stale",
        )

        done = status_cli(rig)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80, "\n".join(lines)
        words = done.stdout.split()
        for name in ("p0", "small", "orphan"):
            assert name in words, done.stdout
        p0_line = next(line for line in lines if line.split()[:1] == ["p0"])
        assert "STALE" in p0_line
        assert "STALLED: no live processor" in done.stdout
        life = lines[lines.index(next(line for line in lines if line.split()[:1] == ["small"])) + 1]
        assert life.split()[0] == "STALE:" and "not in its group" in life
        assert "UNSERVED" in done.stdout and "(no contract)" in done.stdout
        assert log.read_text().count("model orphan") == 1  # said once, not at every tick
        print(done.stdout)  # docs/operations.md shows one (pytest -s)

        done = status_cli(rig, "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        jsonschema.validate(doc, json.loads(SCHEMA_PATH.read_text()))
        assert [(p["instance"], p["state"]) for p in doc["processors"]] == [("p0", "stale")]
        assert [(c["consumer"], c["state"]) for c in doc["consumers"]] == [("small", "stale")]
        assert doc["unserved"] == [{"model": "orphan", "items": 5, "tokens": 200, "consumers": []}]

        # --watch into a pipe: every refresh whole, the consumers included, and from the second on
        # the time, the rates and the ETA
        args = ["--topic-prefix", rig.topics.prefix, "--group", rig.group, "--watch", "--interval-s", "0.5"]
        watch = subprocess.Popen(
            [sys.executable, "-m", "processor", "status", *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**child_env(rig.bootstrap), "COLUMNS": "80"},
        )
        seen: list[str] = []
        reader = threading.Thread(target=read_lines, args=(watch, seen), daemon=True)
        reader.start()  # a thread: a readline in this one would block past any deadline
        try:
            wait_for(lambda: "".join(seen).count("tokenfabric status  ") >= 3, 30, "three refreshes")
            watch.send_signal(signal.SIGINT)
            assert watch.wait(30) == 0  # a SIGINT while it waits for the next refresh ends it cleanly
        finally:
            if watch.poll() is None:
                watch.kill()
        reader.join(10)
        out = "".join(seen)
        refreshes = out.split("tokenfabric status  ")[1:]
        assert len(refreshes) >= 2, out
        assert all("consumers (" in r and "  small  model default" in r for r in refreshes)
        assert "rates    received 0 tok/s, completed 0 tok/s" in refreshes[1]
        assert "backlog  200 tokens queued or in flight, ETA - (nothing completes)" in refreshes[1]
        assert max(len(line) for line in out.splitlines()) <= 80

        # retire both; they do not come back, and the ledger still counts what p0 did
        received = doc["ledger"]["received"]["items"]
        for flag, name in (("--forget-processor", "p0"), ("--retire-consumer", "small")):
            done = status_cli(rig, flag, name)
            assert done.returncode == 0, done.stderr
        refused = status_cli(rig, "--forget-processor", "nobody")
        assert refused.returncode == 1 and "no processor instance 'nobody'" in refused.stderr
        time.sleep(1)  # a negative check: nothing re-announces them within a second (none is running)
        for _ in range(2):
            rep = report(gather(rig.conf, rig.topics, rig.group, groups=True), rig.topics, STALE_S)
            assert (rep.processors, rep.retired_processors, rep.consumers) == ([], ["p0"], [])
            assert rep.ledger["received"].items == received == len(ids) + 5
        text = status_cli(rig).stdout
        assert "retired (--forget-processor): p0" in text and "none has announced a contract" in text
    audit_report = audit(rig.conf, rig.topics, rig.group)
    assert audit_report.clean, "\n".join(audit_report.lines())
