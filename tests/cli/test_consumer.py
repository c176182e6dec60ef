"""``tokenfabric consumer`` flags (processor/cli/consumer.py): batching options fail in one line."""

from __future__ import annotations

import pytest

from tests.cli.helpers import run_cli


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--batching", "memory", "--items", "8"],
            "--batching memory needs --memory-bytes and --kv-bytes-per-token",
        ),
        (
            ["--budget", "64", "--items", "8", "--memory-bytes", "100"],
            "--memory-bytes applies to --batching memory",
        ),
        (["--batching", "rows"], "--items required to run a consumer"),
        (
            ["--batching", "memory", "--items", "8", "--memory-bytes", "0", "--kv-bytes-per-token", "1"],
            "memory_bytes must be >= 1 in memory batching",
        ),
        (
            [
                "--batching",
                "memory",
                "--items",
                "8",
                "--memory-bytes",
                "9",
                "--kv-bytes-per-token",
                "1",
                "--default-output-tokens",
                "-1",
            ],
            "default_output_tokens must be an integer >= 0",
        ),
        (["--batching", "pages", "--items", "8"], "invalid choice: 'pages'"),
        (["--batching", "memory", "--items", "8", "--memory-bytes", "1GB"], "invalid int value: '1GB'"),
    ],
)
def test_consumer_batching_flags_fail_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, _out, err = run_cli(
        capsys, "consumer", "--id", "c1", "--model", "m", *argv, "--bootstrap", "127.0.0.1:1"
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err
    assert "--budget" not in err or "--memory-bytes applies" in err
