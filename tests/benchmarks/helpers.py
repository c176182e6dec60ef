"""Running a benchmark script as a program, and what a sane figure is."""

from __future__ import annotations

import math
import subprocess
import sys

from tests.common import ROOT

BENCHMARKS = ROOT / "benchmarks"


def run(script: str, *args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0
