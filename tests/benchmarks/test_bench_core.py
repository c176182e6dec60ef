"""The scheduling-core benchmark's per-call mode (benchmarks/bench_core.py --per-call) runs at a small
size and prints both figures; it checks its own streaming run (every item completed once). No figure
is held to a target here: the side-by-side with the first generation is in docs/benchmarks.md."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.benchmarks.helpers import BENCHMARKS, positive, run


def test_per_call_prints_one_item_submit_and_the_streaming_cost_per_batch() -> None:
    proc = run("bench_core.py", "--per-call", "--items", "2000")
    found = re.search(
        r"submit one item: ([\d.]+) us; streaming dispatch \+ complete: ([\d.]+) us", proc.stdout
    )
    assert found is not None, proc.stdout
    assert positive(float(found[1])) and positive(float(found[2]))
    assert "2,000 items" in proc.stdout


def test_per_call_counts_the_calls_made_when_asked() -> None:
    """``--calls``: the same spans, in Python-level calls made (a figure the machine's load does not
    move); a streaming batch makes dozens, a one-item submit at least the call to ``submit``."""
    proc = run("bench_core.py", "--per-call", "--calls", "--items", "2000")
    found = re.search(
        r"submit one item: ([\d.]+) calls; streaming dispatch \+ complete: ([\d.]+) calls per batch",
        proc.stdout,
    )
    assert found is not None, proc.stdout
    assert float(found[1]) >= 1 and float(found[2]) >= 10
    assert "Python calls" in proc.stdout


def test_calls_without_per_call_is_one_line_saying_what_to_add() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_core.py"), "--calls"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "add --per-call" in proc.stderr and "Traceback" not in proc.stderr
