"""benchmarks/bench_consumers_pipeline.py: the processor's whole loop (over the in-memory Kafka) costs
the same per item with 1 or 64 busy consumers; only its commit, once an interval, visits each one.
Counted in Python calls (cProfile's count), which the machine's load does not move."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.helpers import load_script, run

bench = load_script("bench_consumers_pipeline")


def test_the_loop_costs_the_same_per_item_with_64_consumers_and_the_commit_grows_with_them() -> None:
    one, many = bench.run(1, 300, profiled=True), bench.run(64, 300, profiled=True)
    assert many["loop_calls_per_item"] < 1.1 * one["loop_calls_per_item"], (one, many)
    # the ledger check and checkpoint of a commit visit every consumer: what the docs' table says
    assert many["commit_calls"] > 2 * one["commit_calls"], (one, many)


def test_the_smoke_run_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    run("bench_consumers_pipeline.py", "--smoke", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["consumers"] for r in rows] == [1, 16]
    assert all(r["loop_cpu_us_per_batch"] > 0 and r["commit_calls"] > 0 for r in rows)
