"""``submit`` of an OpenAI batch input holds a chunk of lines at a time, not the file: the small
version of benchmarks/bench_openai_file.py (which submits 50,000 lines, about 200 MB).

Two files of about 4 kB a line, one six times the other (4 MB and 24 MB), each submitted by a fresh
``tokenfabric submit`` process to fresh topics; the larger one's peak RSS exceeds the smaller's by less
than half the 20 MB between them. Holding the parsed lines (a Python list of ints per line is several
times its JSON) or every produced item's token bytes would exceed it several times over.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_openai_file import submit_measured, write_file

pytestmark = pytest.mark.kafka


def test_a_file_six_times_larger_does_not_grow_submits_memory_with_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    write_file(small, 1_000, 4_000)
    write_file(large, 6_000, 4_000)
    low = submit_measured(small, kafka_bootstrap, "mem-small")
    high = submit_measured(large, kafka_bootstrap, "mem-large")
    assert "6,000 of 6,000 rows" in high["said"], high
    grown_mib = high["peak_rss_mib"] - low["peak_rss_mib"]
    between_mb = (high["file_bytes"] - low["file_bytes"]) / 1e6
    assert between_mb > 19
    assert grown_mib < between_mb / 2, (low, high)
