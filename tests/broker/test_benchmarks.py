"""The benchmark harness (benchmarks/run_all.py) runs end to end at smoke size against the session
broker and reports well-formed, sane numbers.

Nothing here asserts a speed: on a shared CI machine wall-clock rates say nothing. What is checked is
that every benchmark ran, that every count matches what was produced (an item lost or doubled would
make any rate meaningless), that rates and ratios are positive and finite, and that the document
run_all.py writes has its sections and the placeholder the lead merges into."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.helpers import BENCHMARKS, positive, run

pytestmark = pytest.mark.kafka


@pytest.mark.kafka
def test_run_all_at_smoke_size_writes_a_sane_document(kafka_bootstrap: str, tmp_path: Path) -> None:
    doc, out = tmp_path / "benchmarks.md", tmp_path / "all.json"
    args = [
        "--smoke",
        "--bootstrap",
        kafka_bootstrap,
        "--skip",
        "memory",
        "--out",
        str(doc),
        "--json",
        str(out),
    ]
    run("run_all.py", *args, timeout_s=120)
    results = json.loads(out.read_text())
    _check_pipeline(results["pipeline"])
    local_broker = _broker_is_local(kafka_bootstrap)
    if local_broker:  # the CPU table: its processes and the broker's, per item
        _check_machine_cpu(results["pipeline"])
    _check_restore(results["restore"])
    assert "backlog: combined" in results["core"]

    text = doc.read_text()
    for heading in (
        "## Machine and versions",
        "## Targets",
        "## Commands",
        "## Pipeline",
        "## Restore",
        "## Where the time goes",
        "## Real compute: embed engine, lanes vs fifo",
    ):
        assert f"\n{heading}" in text, heading
    assert "(merged from docs/benchmarks-embed.md)" in text
    assert "python benchmarks/bench_pipeline.py --smoke" in text
    assert ("machine CPU ratio" in text) == local_broker


def _broker_is_local(bootstrap: str) -> bool:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from common import BrokerCpu
    finally:
        sys.path.remove(str(BENCHMARKS))
    return BrokerCpu.find(bootstrap) is not None


def _check_machine_cpu(pipeline: dict[str, Any]) -> None:
    for entry in pipeline["sizes"]:
        for mode in entry["modes"].values():
            for run_ in mode["runs"]:
                for side in (run_["ceiling"], run_["processor"]):
                    # read in clock ticks: a smoke-sized span can be shorter than one
                    assert side["broker_cpu_s"] >= 0
            s = mode["summary"]
            for side, parts in (
                ("ceiling", ("ceiling_cpu_us_per_item", "ceiling_broker_us_per_item")),
                (
                    "processor",
                    ("processor_cpu_us_per_item", "drainer_cpu_us_per_item", "processor_broker_us_per_item"),
                ),
            ):
                machine = s[f"{side}_machine_us_per_item"]
                assert machine["low"] > 0 and machine["low"] <= machine["median"] <= machine["high"]
                if machine["n"] == 1:  # one run: the total is exactly the sum of its parts
                    assert machine["median"] == pytest.approx(sum(s[k]["median"] for k in parts))


def _check_pipeline(pipeline: dict[str, Any]) -> None:
    assert pipeline["sizes"], "no pipeline sizes ran"
    for entry in pipeline["sizes"]:
        n = entry["items"]
        assert set(entry["modes"]) == {"eos", "alo"}
        for mode in entry["modes"].values():
            for run_ in mode["runs"]:
                ceiling, proc = run_["ceiling"], run_["processor"]
                assert ceiling["items"] == n and ceiling["tokens"] == entry["input_tokens"]
                assert (proc["items"], proc["consumed"], proc["tokens"]) == (n, n, entry["input_tokens"])
                assert proc["dead_lettered"] == 0 and proc["batches"] >= 1
                drained = proc["drainer"]
                assert (drained["items"], drained["distinct"], drained["violations"]) == (n, n, 0)
                assert all(positive(side[k]) for side in (ceiling, proc) for k in ("seconds", "cpu_s"))
            ratio = mode["summary"]["ratio"]
            assert positive(ratio["median"]) and ratio["low"] <= ratio["median"] <= ratio["high"]


def _check_restore(restore: dict[str, Any]) -> None:
    n = restore["items"]
    assert restore["fill"]["items"] == n and restore["fill"]["tokens"] == restore["input_tokens"]
    for r in restore["restores"]:
        assert (r["restored_items"], r["waiting_items"], r["waiting_tokens"]) == (
            n,
            n,
            restore["input_tokens"],
        )
        assert positive(r["seconds"]) and r["read_seconds"] <= r["seconds"]
    assert positive(restore["start_items_per_s"]["median"])
