"""``tokenfabric share``: bad weights and quotas are one-line errors, before any broker is asked
(the broker side is tests/broker/test_shares.py)."""

from __future__ import annotations

import pytest

from tests.cli.helpers import run_cli as cli

UNREACHABLE = ["--bootstrap", "127.0.0.1:1"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--weight", "0"], "weight must be > 0, got 0.0"),
        (["--max-tokens-per-s", "-5"], "max_tokens_per_s must be > 0 or None, got -5.0"),
        (["--max-tokens", "-1"], "max_tokens must be >= 0 or None, got -1"),
        (["--weight", "2", "--clear"], "--clear takes no --weight or quota"),
    ],
)
def test_bad_share_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    code, out, err = cli(capsys, "share", "nightly", *flags, *UNREACHABLE)
    assert (code, out) == (2, "")
    assert err.strip() == f"tokenfabric share: error: {message}"
