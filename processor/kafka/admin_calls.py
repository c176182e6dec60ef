"""An admin client that is never destroyed while one of its requests is still in flight.

Why: librdkafka aborts the whole process (``rd_kafka_enq_once_del_source_return: Assertion
`eonce->refcnt > 0' failed``, SIGABRT) when an admin client is destroyed while a request of its is
still waiting on a broker that does not answer. ``status --watch`` met it under a frozen broker
(tests/broker/test_broker_outage.py): a group description timed out on our side, the refresh was
abandoned, and the client went with it.

How: :class:`HeldAdmin` tracks the futures it hands out. On leaving its ``with`` block it waits a
little for those still pending (each was given a ``request_timeout``, so librdkafka fails it by
itself soon); a client whose requests still have not ended is parked, referenced by this module, and
released at a later call once every one of its requests has ended.

Invariant: a client built by :class:`HeldAdmin` is released only when all its tracked futures are done.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from processor.kafka.factory import KAFKA, AdminClientLike, ClientFactory, Settings

K = TypeVar("K")

#: How long leaving the block waits for requests still in flight before it parks the client.
SETTLE_S = 5.0

_parked: list[tuple[AdminClientLike, list[Future[Any]]]] = []
_lock = threading.Lock()


class HeldAdmin:
    """``with HeldAdmin(conf) as admin:`` build requests with ``admin.client`` and pass their futures
    through :meth:`track`; the client outlives every tracked request (module docstring)."""

    def __init__(self, conf: Settings, clients: ClientFactory = KAFKA, settle_s: float = SETTLE_S) -> None:
        self.client = clients.admin(dict(conf))
        self.settle_s = settle_s
        self._futures: list[Future[Any]] = []

    def track(self, futures: Mapping[K, Future[Any]]) -> Mapping[K, Future[Any]]:
        """``futures``, now tracked: the client is kept until each is done."""
        self._futures.extend(futures.values())
        return futures

    def __enter__(self) -> HeldAdmin:
        return self

    def __exit__(self, *_exc: object) -> None:
        pending = [f for f in self._futures if not f.done()]
        if pending:
            wait(pending, timeout=self.settle_s)
        with _lock:
            _parked[:] = [(c, fs) for c, fs in _parked if not all(f.done() for f in fs)]
            still = [f for f in pending if not f.done()]
            if still:
                _parked.append((self.client, still))


def parked() -> int:
    """Clients kept alive because a request of theirs had not ended at their last look (tests read it)."""
    with _lock:
        return len(_parked)
