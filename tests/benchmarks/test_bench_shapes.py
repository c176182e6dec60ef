"""The shape-scale benchmark (benchmarks/bench_shapes.py) runs at a small size, accounts for every row,
and checks its own runs (every item completed once: the script raises otherwise). No figure is held to
a target here: the 10^6-shape table is measured at full size (docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.helpers import positive, run


def test_shapes_benchmark_prints_both_packers_and_runs_for_every_shape_count(tmp_path: Path) -> None:
    out = tmp_path / "shapes.json"
    proc = run("bench_shapes.py", "--shapes", "100,1000", "--items", "2000", "--json", str(out))
    figures = json.loads(out.read_text())
    assert figures["shapes"] == [100, 1000]
    rows = figures["rows"]
    assert {(r["shapes"], r["packer"], r["run"]) for r in rows} == {
        (s, p, r) for s in (100, 1000) for p in ("lanes", "fifo") for r in ("backlog", "streaming")
    }
    for row in rows:
        assert row["items"] == 2000 and row["batches"] > 0
        assert positive(row["dispatch_us_per_batch"]) and positive(row["items_per_s"])
        assert positive(row["bytes_per_waiting_item"]) and positive(row["bytes_per_shape"])
        if row["shapes"] == 100:
            assert row["vs_smallest"] == 1.0
    lanes_streaming = [r for r in rows if r["packer"] == "lanes" and r["run"] == "streaming"]
    assert lanes_streaming[-1]["batches"] == 2000  # every item is its chunk's only one of its shape
    assert "dispatch per batch at 1,000 shapes is" in proc.stdout
