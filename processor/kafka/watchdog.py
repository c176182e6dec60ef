"""A last resort for a blocking Kafka call that never returns: end the process so its supervisor
restarts it.

Why this exists: in librdkafka 2.16 (the newest confluent-kafka wheel), ``send_offsets_to_transaction``
can block forever, past its own timeout, once the group coordinator's broker has gone away and come
back (confluentinc/librdkafka#5456: the call's timeout is never checked, and #5511: the coordinator's
broker object was decommissioned, so nothing wakes the request; both open upstream).
``tests/broker/test_broker_restart.py`` hits it when it restarts its single broker. That call is
guarded with its own, short, limit (:data:`SEND_OFFSETS_TIMEOUT_S`), the rest of a commit with the
process's ``--stuck-exit-s``. A thread stuck inside the C library cannot be interrupted, and every
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
from typing import Any

from processor.kafka.exits import EXIT_TEMPFAIL

log = logging.getLogger("tokenfabric.watchdog")


def _exit(what: str, stuck_s: float) -> None:
    log.critical(
        "%s has not returned for %.0f s: exiting with %d so a restart recovers", what, stuck_s, EXIT_TEMPFAIL
    )
    logging.shutdown()
    os._exit(EXIT_TEMPFAIL)


#: How long past its own timeout a Kafka call that takes one may run before it counts as stuck.
PAST_TIMEOUT_S = 10.0
#: The timeout given to ``send_offsets_to_transaction``. The call normally takes milliseconds (the
#: group coordinator is known, two requests); a broker away for longer makes it fail with a retriable
#: error, which ends the run with 75 anyway. Its guard (:func:`guarded` with ``timeout_s``) ends a call
#: stuck in librdkafka#5456 this timeout plus :data:`PAST_TIMEOUT_S` after it began, 25 s, well before
#: the default watchdog (180 s): after a broker restart completions flow again within 60 s
#: (tests/broker/test_broker_restart.py measures it).
SEND_OFFSETS_TIMEOUT_S = 15.0
#: How long closing a round's clients may take (plus :data:`PAST_TIMEOUT_S`): a consumer's close after
#: an outage waits on a coordinator that may never answer, and a round that never ends would leave a
#: process up but silent, with nothing to restart it.
CLOSE_TIMEOUT_S = 30.0
#: ``abort_transaction``'s timeout, guarded like ``send_offsets_to_transaction``: a call stuck past it
#: ends the process with 75 rather than leave a consumer silent.
ABORT_TIMEOUT_S = 30.0


class CallWatchdog:
    """Calls ``on_stuck`` (default: exit the process) when a guarded call runs past its limit:
    ``limit_s``, or less for a call guarded with its own timeout. Guards nest (a commit and the
    ``send_offsets_to_transaction`` inside it): each has its own start and limit."""

    def __init__(self, limit_s: float, on_stuck: Callable[[str, float], None] = _exit) -> None:
        if not limit_s > 0:
            raise ValueError(f"watchdog limit must be > 0 seconds, got {limit_s}")
        self.limit_s = limit_s
        self._on_stuck = on_stuck
        self._lock = threading.Lock()
        self._open: list[
            list[Any]
        ] = []  # [what, since, limit, reported, thread] per open guard, outermost first
        self._thread = threading.Thread(target=self._watch, name="call-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: str, limit_s: float | None = None) -> Iterator[None]:
        """Guard the block; ``limit_s`` (capped at the watchdog's own) for a call with a known bound."""
        limit = min(self.limit_s, limit_s or self.limit_s)
        entry: list[Any] = [what, time.monotonic(), limit, False, threading.get_ident()]
        with self._lock:
            self._open.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._open.remove(entry)

    def open_since(self, thread_id: int | None) -> float | None:
        """When the oldest guarded call of thread ``thread_id`` still open began (monotonic), or
        None: a ride asks whether its round is blocked in a call older than the broker's return."""
        with self._lock:
            return min((e[1] for e in self._open if e[4] == thread_id), default=None)

    def _watch(self) -> None:
        tick = min(1.0, self.limit_s / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self._lock:
                due = [e for e in self._open if not e[3] and now - e[1] > e[2]]
                for e in due:
                    e[3] = True  # a test's on_stuck returns: report each stuck call once
            for what, since, *_rest in due:
                self._on_stuck(what, now - since)


@contextmanager
def guarded(watchdog: CallWatchdog | None, what: str, timeout_s: float | None = None) -> Iterator[None]:
    """``watchdog.guard(what)``, or nothing when there is no watchdog (library use, tests).

    ``timeout_s``: the timeout the guarded Kafka call was given; past it by :data:`PAST_TIMEOUT_S` the
    call is stuck (it should have returned an error by then), whatever the watchdog's own limit."""
    if watchdog is None:
        yield
    else:
        limit = None if timeout_s is None else timeout_s + PAST_TIMEOUT_S
        with watchdog.guard(what, limit):
            yield
