"""benchmarks/bench_consumers.py: dispatch's cost per batch does not grow with the consumers that
are busy. Counted in Python calls (cProfile's count), which the machine's load does not move."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.helpers import load_script, run

bench = load_script("bench_consumers")


def test_dispatch_calls_per_batch_are_flat_from_1_to_256_consumers() -> None:
    one, many = bench.run(1, 400, "calls"), bench.run(256, 400, "calls")
    assert many < 1.5 * one, (one, many)  # before: 66 calls a batch with 1, 1,088 with 256


def test_the_smoke_run_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    run("bench_consumers.py", "--smoke", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["consumers"] for r in rows] == [1, 64] and all(r["calls_per_batch"] > 0 for r in rows)
