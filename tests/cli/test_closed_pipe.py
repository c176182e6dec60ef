"""Output into a pipe whose reader is gone (``tokenfabric ... | head``): no traceback, exit 141.

The command below really writes a megabyte to a pipe whose read end is already closed; the write
fails with EPIPE inside the command's ``run``, exactly as when ``head`` exits early.
"""

from __future__ import annotations

import subprocess
import sys

WRITES_A_MEGABYTE = """
import processor.cli.simulate as command
command.run = lambda args: print("x" * 1_000_000) or 0
from processor.cli.tokenfabric import main
raise SystemExit(main(["simulate", "--trace", "unused"]))
"""


def test_a_reader_that_went_away_ends_the_command_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITES_A_MEGABYTE], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""
