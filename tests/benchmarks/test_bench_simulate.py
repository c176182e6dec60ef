"""The simulate-vs-plain benchmark (benchmarks/bench_simulate.py) runs at a small size: both programs
read the whole trace and the ratio is what their CPU times say. No speed is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import positive, run


def test_simulate_benchmark_times_both_programs(tmp_path: Path) -> None:
    out = tmp_path / "simulate.json"
    proc = run("bench_simulate.py", "--items", "2000", "--reps", "1", "--json", str(out))
    figures = json.loads(out.read_text())
    assert figures["items"] == 2000 and set(figures["cpu_s"]) == {"simulate", "plain"}
    cpu = {name: values[0] for name, values in figures["cpu_s"].items()}
    assert all(positive(v) for v in cpu.values())
    assert figures["ratio"] == pytest.approx(cpu["simulate"] / cpu["plain"])
    assert "simulate / plain" in proc.stdout


def test_the_plain_packer_reads_every_item(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"t_ms": i, "model": "m", "shape": 1, "length": 100 + i}) + "\n" for i in range(300)
        )
    )
    proc = run("bench_simulate.py", "--plain", str(trace))
    assert "300 items" in proc.stdout
