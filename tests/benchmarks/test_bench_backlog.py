"""The templated-backlog benchmark (benchmarks/bench_backlog.py) runs at a small size and accounts for
every row. No figure is held to a target here: the targets are measured at full size (docs/lanes.md)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.helpers import positive, run


def test_backlog_benchmark_prints_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "backlog.json"
    proc = run("bench_backlog.py", "--items", "3000", "--json", str(out))
    figures = json.loads(out.read_text())
    assert figures["items"] == 3000
    assert figures["compulsory"] >= figures["lower_bound"] > 0
    rows = figures["rows"]
    assert len(rows) == 4 and rows["oracle (shape-sorted offline)"]["makespan_vs_oracle"] == 1.0
    for label, row in rows.items():
        assert label in proc.stdout
        assert 0 <= row["padding_waste"] < 1 and 0 < row["budget_fill"] <= 1
        assert positive(row["makespan_ms"]) and row["batches"] > 0
