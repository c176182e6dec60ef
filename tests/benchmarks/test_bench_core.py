"""The scheduling-core benchmark's per-call mode (benchmarks/bench_core.py --per-call) runs at a small
size and prints both figures; it checks its own streaming run (every item completed once). No figure
is held to a target here: the side-by-side with the first generation is in docs/benchmarks.md."""

from __future__ import annotations

import re

from tests.benchmarks.helpers import positive, run


def test_per_call_prints_one_item_submit_and_the_streaming_cost_per_batch() -> None:
    proc = run("bench_core.py", "--per-call", "--items", "2000")
    found = re.search(
        r"submit one item: ([\d.]+) us; streaming dispatch \+ complete: ([\d.]+) us", proc.stdout
    )
    assert found is not None, proc.stdout
    assert positive(float(found[1])) and positive(float(found[2]))
    assert "2,000 items" in proc.stdout
