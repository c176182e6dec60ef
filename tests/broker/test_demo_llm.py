"""``demo --engine llm``, small: the generative backlog through tokenfabric and both plain queues
(consumer group, share group) on real llama-servers, twice (``--repeat 2``), the JSON report's shape
(docs/demo.md) and its generation figures consistent with each other and read back from the topics,
each item held to its output length, and the printed report no wider than the terminal.

Which run caches more is the README's measured figure; a few items are too few to rank the runs
reliably, so here only tokenfabric's cache must have served something. The ``small`` model keeps
the six runs quick.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from processor.cli.llm import main as llm_main
from processor.cli.tokenfabric import main
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.local.llm.build import build_server
from processor.local.llm.server import running_servers, server_status
from processor.sim.generative import generative_rows, output_budget
from processor.wire.completions import decode_completions
from tests.common import ROOT

pytestmark = [pytest.mark.kafka, pytest.mark.llm]

ITEMS = 24
REPEAT = 2
COLUMNS = 80
HEADLINE = {
    "engine", "items", "items_completed_once", "audit_clean", "duplicates", "prompt_tokens",
    "prefix_tokens", "cached_prompt_tokens", "output_tokens", "makespan_s",
}  # fmt: skip


def test_the_generative_backlog_on_llama_servers_reports_measured_cache_figures(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    build_server(progress=lambda line: print(line, file=sys.stderr))  # cached by .ci/run (else ~14 min)
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path / "home"))  # the demo's servers live there
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    out = tmp_path / "report.json"
    argv = ["demo", "--engine", "llm", "--limit", str(ITEMS), "--llm-slots", "2", "--plot", ""]
    argv += ["--llm-model", "small", "--repeat", str(REPEAT)]
    code = main([*argv, "--json", str(out), "--bootstrap", kafka_bootstrap])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = printed.split("\nlogs in ")[0]  # then the paths of the logs and the JSON, unfoldable
    assert max(len(line) for line in report.splitlines()) <= COLUMNS, report
    assert "cached / cacheable" in printed and "padding waste" not in printed
    assert running_servers() == []  # every server the demo started is stopped
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"tokenfabric", "plain-queue", "share-queue"}
    lengths = sum(output_budget(row.record.output_length) for row in generative_rows(ITEMS))
    for name, doc in runs.items():
        assert set(doc) >= HEADLINE and len(doc["repeats"]) == REPEAT, name
        assert all(set(r) >= HEADLINE for r in doc["repeats"])
        low, high = doc["makespan_s_range"]
        assert low <= doc["makespan_s"] <= high
        for run in doc["repeats"]:
            _check_run(name, run, kafka_bootstrap, lengths)
    assert runs["tokenfabric"]["cached_prompt_tokens"] > 0


def _check_run(name: str, run: dict[str, Any], bootstrap: str, lengths: int) -> None:
    """One repeat: every item once, the figures consistent and equal to what the topics say."""
    assert run["engine"] == "llm", name
    assert run["audit_clean"] is (None if name == "share-queue" else True), name
    assert run["duplicates"] == 0  # no worker died: nothing redelivered
    assert run["items"] == run["items_completed_once"] == ITEMS
    assert 0 <= run["cached_prompt_tokens"] <= run["prefix_tokens"] < run["prompt_tokens"]
    assert run["cached_prompt_tokens"] + run["prefill_tokens"] == run["prompt_tokens"]
    assert run["output_tokens"] == lengths and run["real_tokens_per_s"] > 0  # held by ignore_eos
    assert run["dispatch_to_completion_p50_ms"] <= run["dispatch_to_completion_p99_ms"]
    conf, topics = {"bootstrap.servers": bootstrap}, TopicNames(run["topic_prefix"])
    done = [c for m in read_topic(conf, topics.results) for c in decode_completions(m.value())]
    assert sum(c.cached_tokens for c in done) == run["cached_prompt_tokens"]
    assert sum(c.output_tokens for c in done) == run["output_tokens"]


def test_the_endpoint_benchmark_runs_both_runs_against_servers_it_does_not_own(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/bench_openai_endpoint.py against two servers started here (as a user's GPU servers
    would run): both runs complete, the servers are left running, and the table is printed."""
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path / "home"))
    urls = []
    try:
        for name in ("given-a", "given-b"):
            assert (
                llm_main(["start", "--name", name, "--slots", "2", "--ctx-tokens", "8192", "--threads", "1"])
                == 0
            )
            info = server_status(name)
            assert info is not None
            urls.append(info.url)
        out = tmp_path / "r.json"
        bench = [sys.executable, str(ROOT / "benchmarks" / "bench_openai_endpoint.py"), "--items", "16"]
        bench += [f"--endpoint={u}" for u in urls] + ["--bootstrap", kafka_bootstrap, "--json", str(out)]
        done = subprocess.run(bench, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "| cached / cacheable |" in done.stdout
        runs = json.loads(out.read_text())["runs"]
        assert {r["items_completed_once"] for r in runs.values()} == {16}
        assert [r["audit_clean"] for r in runs.values()] == [True, True, None]  # share queue: no audit
        assert {info.name for info in running_servers()} == {"given-a", "given-b"}  # not the demo's to stop
    finally:
        for name in ("given-a", "given-b"):
            llm_main(["stop", "--name", name])
