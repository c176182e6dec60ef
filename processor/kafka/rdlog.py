"""librdkafka's own log, through Python logging: one format with everything else, repeats rate-limited.

Every client tokenfabric creates passes :func:`with_kafka_logger` its settings, so librdkafka's lines
reach the ``tokenfabric.kafka`` logger (and from there the handler and format of ``--log-format``)
instead of librdkafka's own ``%3|1712...|FAIL|rdkafka#producer-1| ...`` lines on stderr.
tests/kafka/test_rdlog.py checks every ``Consumer``, ``Producer`` and ``AdminClient`` call in the
package for it. The one exception is :mod:`processor.kafka.reach`, whose probe keeps what librdkafka
says to quote it in its own one-line error.

Why rate-limited: librdkafka logs a failing connection on every reconnect attempt, about twenty lines
a second per client for an unreachable broker. :class:`RateLimit` lets each distinct message through
once per ``every_s`` (numbers aside: "after 0ms" and "after 1ms" are one message) and, when it next
lets it through, says how many like it it held back.

Logs are forwarded when the client is polled; a client that is never polled stays quiet.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

KAFKA_LOGGER = "tokenfabric.kafka"
#: How long one librdkafka message stays quiet after it was logged.
REPEAT_EVERY_S = 60.0


class RateLimit(logging.Filter):
    """Pass each distinct message at most once per ``every_s``; count the ones held back.

    Invariant: every record is either passed or counted in ``suppressed`` (and in its key's count,
    which the next passed record of that key reports and resets). ``max_keys`` bounds the memory:
    past it the table starts afresh (at worst a message passes early).
    """

    def __init__(
        self,
        every_s: float = REPEAT_EVERY_S,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.every_s = every_s
        self.max_keys = max_keys
        self.suppressed = 0
        self._clock = clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (last passed, held back since)

    @staticmethod
    def key(record: logging.LogRecord) -> tuple[str, str]:
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:  # confluent-kafka logs (facility, client, text)
            return str(args[0]), re.sub(r"\d+", "#", str(args[2]))
        return "", re.sub(r"\d+", "#", record.getMessage())

    def filter(self, record: logging.LogRecord) -> bool:
        key = self.key(record)
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.every_s:
            self._seen[key] = (last[0], last[1] + 1)
            self.suppressed += 1
            return False
        if last is not None and last[1]:
            record.msg = f"{record.getMessage()} ({last[1]} more like it in the last {now - last[0]:.0f} s)"
            record.args = None
        if len(self._seen) >= self.max_keys:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return True


#: librdkafka warnings that a healthy start gives and that clear by themselves: a fresh broker's
#: transaction coordinator still loading its state when the first ``init_transactions`` asks for a
#: producer id (librdkafka retries until it is loaded), or still aborting the transaction an outage
#: left open (processor.apps.ride). Logged at INFO, not WARNING.
TRANSIENT = (
    re.compile(r"Failed to acquire transactional PID .*(load in progress|not available).*retrying"),
    # after an outage: the last run's transaction is still being aborted when the next run starts
    re.compile(r"Failed to acquire transactional PID .*(concurrent operation|Not coordinator).*retrying"),
)


class DemoteTransient(logging.Filter):
    """Lower :data:`TRANSIENT` warnings to INFO, and drop them where the logger does not log INFO.

    Why a filter and not a level: the same facility (``GETPID``) also reports failures that do not
    clear (a refused transactional id), which must stay warnings.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not any(p.search(record.getMessage()) for p in TRANSIENT):
            return True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return logging.getLogger(KAFKA_LOGGER).isEnabledFor(logging.INFO)


#: What librdkafka says, client by client and thread by thread, while a broker is away: the lines an
#: outage makes by the page (issue 36). The long-running commands say the outage themselves, once
#: when it begins and once when it ends (processor.apps.ride), so they make these DEBUG
#: (:func:`demote_outage_lines`); elsewhere they are the only sign and stay as librdkafka says.
OUTAGE = (
    re.compile(
        r"Disconnected|Connect to .* failed|Connection refused|[Cc]onnection reset|ApiVersionRequest failed"
    ),
    re.compile(r"brokers are down|timed out in-flight|request\(s\) timed out|Timed out \d+ in-flight"),
    re.compile(
        r"session timed out|Failed to (add offsets|commit offsets|end transaction).*transport failure"
    ),
    # the broker aborted a transaction the outage kept open: the command says how its run ended
    re.compile(r"fenced by a newer instance"),
)


class DemoteOutage(logging.Filter):
    """Lower :data:`OUTAGE` lines to DEBUG, and drop them where the logger does not log DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not any(p.search(record.getMessage()) for p in OUTAGE):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(KAFKA_LOGGER).isEnabledFor(logging.DEBUG)


def kafka_logger() -> logging.Logger:
    """The Python logger librdkafka's own logs go to (``tokenfabric.kafka``), repeats rate-limited,
    warnings of a healthy start demoted (:class:`DemoteTransient`)."""
    logger = logging.getLogger(KAFKA_LOGGER)
    if not any(isinstance(f, DemoteTransient) for f in logger.filters):
        logger.addFilter(DemoteTransient())
    if not any(isinstance(f, RateLimit) for f in logger.filters):
        logger.addFilter(RateLimit())
    return logger


def demote_outage_lines() -> DemoteOutage:
    """Make :data:`OUTAGE` lines DEBUG in this process (the commands that ride outages out call it);
    returns the filter, which ``kafka_logger().removeFilter`` takes off again."""
    logger = kafka_logger()
    for f in logger.filters:
        if isinstance(f, DemoteOutage):
            return f
    demote = DemoteOutage()
    logger.addFilter(demote)
    return demote


def with_kafka_logger(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with librdkafka's logs routed to :func:`kafka_logger` (unless it names a logger)."""
    return {"logger": kafka_logger(), **conf}
