"""The long-running commands log in one format: the same text everywhere, or JSON lines on request."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from processor.cli.logs import TEXT_FORMAT, setup_logging
from processor.cli.tokenfabric import build_parser

LONG_RUNNING = ("processor", "consumer", "collector")


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield None
    root.handlers[:], root.level = saved[0], saved[1]


@pytest.mark.parametrize("command", LONG_RUNNING)
def test_every_long_running_command_takes_the_same_log_options(command: str) -> None:
    required = {
        "processor": [],
        "consumer": ["--id", "c", "--model", "m", "--budget", "1024", "--items", "4"],
        "collector": ["--out-dir", "out"],
    }[command]
    chosen = ["--log-level", "WARNING", "--log-format", "json"]
    args = build_parser(command).parse_args([command, *required, *chosen])
    assert (args.log_level, args.log_format) == ("WARNING", "json")
    defaults = build_parser(command).parse_args([command, *required])
    assert (defaults.log_level, defaults.log_format) == ("INFO", "text")


def test_json_lines_carry_time_level_logger_message_and_traceback(
    restore_root_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("INFO", "json")
    log = logging.getLogger("tokenfabric.test")
    log.debug("not at INFO")
    log.warning("ledger %s", "balanced")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert (first["level"], first["logger"]) == ("WARNING", "tokenfabric.test")
    assert first["message"] == "ledger balanced"
    assert first["ts"].endswith("Z") and first["ts"][10] == "T"
    assert second["message"] == "it failed" and "ValueError: boom" in second["exc"]


def test_text_is_one_format_for_all(restore_root_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO", "text")
    logging.getLogger("tokenfabric.consumer").info("contract announced")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(" INFO tokenfabric.consumer: contract announced")
    assert TEXT_FORMAT.endswith("%(name)s: %(message)s")
