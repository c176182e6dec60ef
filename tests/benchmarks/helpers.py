"""Running a benchmark script as a program, and what a sane figure is."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from types import ModuleType

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


def load_script(name: str) -> ModuleType:
    """A benchmark script imported by its path (``benchmarks`` is no package), as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
