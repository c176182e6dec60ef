"""The dedupe benchmark (benchmarks/bench_dedupe.py) runs at smoke size and restores every id it made.

No speed or size is asserted: only that the counts match and the figures are positive and finite."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.helpers import positive, run


def test_dedupe_benchmark_restores_every_remembered_id(tmp_path: Path) -> None:
    out = tmp_path / "dedupe.json"
    run("bench_dedupe.py", "--smoke", "--json", str(out))
    figures = json.loads(out.read_text())
    assert figures["ids"] == 20_000
    assert 8 <= figures["changelog_bytes_per_id"] < 8.01  # a hash each, and a format byte per record
    for key in (
        "bytes_per_id",
        "restore_ids_per_s",
        "first_new_us",
        "first_repeat_us",
        "decode_item_head_us",
    ):
        assert positive(figures[key]), (key, figures[key])
