"""TODO: docstring."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

KAFKA_LOGGER = "tokenfabric.kafka"


class _RepeatFilter(logging.Filter):
    """Let each distinct librdkafka message through once a minute.

    librdkafka logs a failing connection on every reconnect attempt (about 20 lines a second for an
    unreachable bootstrap server); one line says as much. Numbers are ignored when comparing, so
    "after 0ms" and "after 1ms" count as the same message.
    """

    def __init__(self, quiet_s: float = 60.0, max_keys: int = 1024) -> None:
        super().__init__()
        self.quiet_s = quiet_s
        self.max_keys = max_keys
        self._seen: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:  # confluent-kafka logs (fac, client name, text)
            key = (str(args[0]), re.sub(r"\d+", "#", str(args[2])))
        else:
            key = ("", record.getMessage())
        now = time.monotonic()
        last = self._seen.get(key)
        if last is not None and now - last < self.quiet_s:
            return False
        if len(self._seen) >= self.max_keys:
            self._seen.clear()
        self._seen[key] = now
        return True


def kafka_logger() -> logging.Logger:
    """The Python logger librdkafka's own logs go to (``tokenfabric.kafka``), repeats suppressed."""
    logger = logging.getLogger(KAFKA_LOGGER)
    if not any(isinstance(f, _RepeatFilter) for f in logger.filters):
        logger.addFilter(_RepeatFilter())
    return logger


def with_kafka_logger(conf: Mapping[str, str | bool]) -> dict[str, Any]:
    """``conf`` with librdkafka's logs routed to :func:`kafka_logger` (unless it names a logger).

    Logs are forwarded when the client is polled; a client that is never polled stays quiet.
    """
    return {"logger": kafka_logger(), **conf}
