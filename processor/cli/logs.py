"""One log format for the long-running commands (processor, consumer, collector): text or JSON lines.

``--log-format json`` writes one JSON object per line (``ts`` in UTC, ``level``, ``logger``,
``message``, ``exc`` when there is a traceback) for log collectors that parse fields; the default text
format is the same in every command, so one grep pattern serves them all. librdkafka's own lines
reach the same handler through the ``tokenfabric.kafka`` logger (processor/kafka/clients.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLines(logging.Formatter):
    """A record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def add_log_arguments(p: argparse.ArgumentParser, default_level: str = "INFO") -> None:
    p.add_argument(
        "--log-level",
        default=default_level,
        choices=LEVELS,
        help=f"least severe level logged (default: {default_level})",
    )
    p.add_argument(
        "--log-format", default="text", choices=FORMATS, help="text (default) or json: one object per line"
    )


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as logging's last resort does), so a
    caller that swaps stderr (pytest's capture, a redirecting wrapper) still gets the lines."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup_logging(level: str, form: str) -> None:
    """Route every logger to one stderr handler in the chosen format (replacing any set before)."""
    handler = _Stderr()
    handler.setFormatter(JsonLines() if form == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
