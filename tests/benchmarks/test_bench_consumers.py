"""benchmarks/bench_consumers.py: dispatch's cost per batch does not grow with the consumers that
are busy. Counted in Python calls (cProfile's count), which the machine's load does not move."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from tests.benchmarks.helpers import BENCHMARKS, run

_spec = importlib.util.spec_from_file_location("bench_consumers", BENCHMARKS / "bench_consumers.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_consumers"] = bench
_spec.loader.exec_module(bench)


def test_dispatch_calls_per_batch_are_flat_from_1_to_256_consumers() -> None:
    one, many = bench.run(1, 400, "calls"), bench.run(256, 400, "calls")
    assert many < 1.5 * one, (one, many)  # before: 66 calls a batch with 1, 1,088 with 256


def test_the_smoke_run_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    run("bench_consumers.py", "--smoke", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["consumers"] for r in rows] == [1, 64] and all(r["calls_per_batch"] > 0 for r in rows)
