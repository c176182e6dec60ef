"""Running the command line in-process, as the CLI tests do."""

from __future__ import annotations

import pytest

from processor import cli


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``tokenfabric ARGV`` in-process; returns (exit code, stdout, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors exit rather than return
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
