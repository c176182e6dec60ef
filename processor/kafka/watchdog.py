"""A last resort for a blocking Kafka call that never returns: end the process so its supervisor
restarts it.

Why this exists: in librdkafka 2.16 (the newest confluent-kafka wheel), ``send_offsets_to_transaction``
can block forever, past its own timeout, once the group coordinator's broker has gone away and come
back (confluentinc/librdkafka#5456 and #5511, open upstream). ``tests/broker/test_broker_restart.py`` hits it
when it restarts its single broker. A thread stuck inside the C library cannot be interrupted, and every
piece of progress is transactional, so a crash is the one recovery that is always correct: the
restarted process fences the stuck transaction, restores from the last commit and goes on
(docs/reliability.md). Exit code 75 (``EX_TEMPFAIL``) tells a supervisor (Kubernetes restarts the
pod) or a human that a restart is the fix.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from processor.kafka.exits import EXIT_TEMPFAIL

log = logging.getLogger("tokenfabric.watchdog")


def _exit(what: str, stuck_s: float) -> None:
    log.critical(
        "%s has not returned for %.0f s: exiting with %d so a restart recovers", what, stuck_s, EXIT_TEMPFAIL
    )
    logging.shutdown()
    os._exit(EXIT_TEMPFAIL)


class CallWatchdog:
    """Calls ``on_stuck`` (default: exit the process) when a guarded call runs past ``limit_s``."""

    def __init__(self, limit_s: float, on_stuck: Callable[[str, float], None] = _exit) -> None:
        if not limit_s > 0:
            raise ValueError(f"watchdog limit must be > 0 seconds, got {limit_s}")
        self.limit_s = limit_s
        self._on_stuck = on_stuck
        self._lock = threading.Lock()
        self._what: str | None = None
        self._since = 0.0
        self._thread = threading.Thread(target=self._watch, name="call-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        with self._lock:
            self._what, self._since = what, time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._what = None

    def _watch(self) -> None:
        tick = min(1.0, self.limit_s / 4)
        while True:
            time.sleep(tick)
            with self._lock:
                what, since = self._what, self._since
            if what is not None and time.monotonic() - since > self.limit_s:
                self._on_stuck(what, time.monotonic() - since)
                with self._lock:
                    if self._what == what and self._since == since:
                        self._what = None  # a test's on_stuck returns: report each stuck call once


@contextmanager
def guarded(watchdog: CallWatchdog | None, what: str) -> Iterator[None]:
    """``watchdog.guard(what)``, or nothing when there is no watchdog (library use, tests)."""
    if watchdog is None:
        yield
    else:
        with watchdog.guard(what):
            yield
