"""``collect --wait`` stopped by SIGINT or SIGTERM ends the same way: output and journal written.

A job is submitted to a pipeline with no processor, so its rows never complete and ``collect
--wait`` would wait forever; each signal must end it with the rows it has (none), the file and the
journal on disk, the summary printed, and the conventional exit status of that signal (128 + its
number), never a traceback or a silent 143.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processor.cli.tokenfabric import main
from processor.jobs.collect import journal_path
from processor.local.pipeline import child_env
from tests.broker.rig import new_topics, review_job

pytestmark = pytest.mark.kafka


COLLECT = [sys.executable, "-m", "processor", "collect"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_collect_wait_stopped_by_a_signal_writes_what_it_has(
    kafka_bootstrap: str, tmp_path: Path, sig: signal.Signals
) -> None:
    _, topics = new_topics(kafka_bootstrap, "c", ["card"], ingest_partitions=1)
    data, template = review_job(tmp_path, 5)
    kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]
    submit = ["submit", str(data), "--job", "j1", "--template", str(template), "--no-progress"]
    assert main([*submit, *kafka]) == 0

    out = tmp_path / "out.jsonl"
    collect = subprocess.Popen(
        [*COLLECT, "--job", "j1", "--out", str(out), "--wait", "--poll-s", "0.2", "--no-progress", *kafka],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(kafka_bootstrap),
    )
    deadline = time.monotonic() + 60
    while not journal_path(out).exists():  # the journal is opened once the job is found
        assert collect.poll() is None, collect.communicate()
        assert time.monotonic() < deadline, "collect did not open its journal within 60 s"
        time.sleep(0.2)
    time.sleep(1.0)  # inside its wait loop
    collect.send_signal(sig)
    stdout, stderr = collect.communicate(timeout=30)
    assert collect.returncode == 128 + sig.value, stderr
    assert "Traceback" not in stderr
    assert f"wrote 0 rows to {out}" in stdout
    assert "job j1: 5 rows: 0 ok, 0 failed, 0 invalid, 5 missing" in stdout, stdout
    assert "missing: no consumer serves model 'default': the job's items wait until one" in stdout
    assert out.exists() and out.read_text(encoding="utf-8") == ""
    last = stderr.strip().splitlines()[-1]  # the last word: interrupted, what it wrote, how to go on
    assert last == (
        f"tokenfabric collect: interrupted by {sig.name}: wrote the 0 rows collected so far to {out}; "
        "run the same command again to go on from there"
    ), stderr
