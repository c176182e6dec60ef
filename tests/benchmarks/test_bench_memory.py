"""The memory benchmark (benchmarks/bench_memory.py) runs at smoke size and counts every waiting item.

Nothing here asserts a speed or a size limit of its own: what is checked is that the counts match what
was put in and the figures are positive and finite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import positive, run


def test_memory_benchmark_counts_every_waiting_item(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    run("bench_memory.py", "--items", "5000", "--json", str(out))
    sizes = json.loads(out.read_text())["sizes"]
    assert [s["tokens_per_item"] for s in sizes] == [100, 1000]
    for s in sizes:
        assert s["items"] == 5000
        assert s["waiting_tokens"] * 4 == s["raw_token_bytes"]
        assert positive(s["bytes_per_item"]) and positive(s["bytes_per_token"])
        assert s["allowed_per_item"] == pytest.approx(1.3 * s["raw_token_bytes"] / s["items"] + 300)
