"""Backpressure: the processor pauses its ingest consumer when too many tokens wait in the lanes.

Paused at the cap (``--max-waiting-tokens``), resumed once 10% of it has drained: the hysteresis
keeps it from flapping. A paused consumer stays in its group (it goes on polling), so a pause moves
no partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from processor.apps.observe import ServiceCounters
from processor.core.scheduler import Scheduler
from processor.kafka.factory import ConsumerClient

log = logging.getLogger("tokenfabric.processor")


class Backpressure:
    """Whether ingest is paused (``paused``, read from other threads for metrics)."""

    def __init__(
        self,
        ingest: ConsumerClient,
        cap: int,
        core: Scheduler,
        counters: ServiceCounters,
        restoring: Callable[[], frozenset[int]] = frozenset,
    ) -> None:
        self.ingest = ingest
        self.restoring = restoring
        """Partitions paused until their restore (processor/state/handover.py): never resumed here."""
        self.cap = cap
        """Tokens waiting at which ingest pauses (0: never)."""
        self.core = core
        self.counters = counters
        self.paused = False

    def update(self) -> None:
        """Pause at the cap, resume once 10% of it has drained; once per step of the loop."""
        cap = self.cap
        if not cap:
            return
        waiting = self.core.view.waiting().tokens
        assignment = self.ingest.assignment()
        if not self.paused and waiting >= cap and assignment:
            self.ingest.pause(assignment)
            self.paused = True
            self.counters.backpressure_pauses += 1
            log.warning("backpressure: %d tokens waiting >= cap %d; ingest paused", waiting, cap)
        elif self.paused and waiting <= cap * 0.9:
            held = self.restoring()
            self.ingest.resume([tp for tp in assignment if tp.partition not in held])
            self.paused = False
            log.info("backpressure: %d tokens waiting; ingest resumed", waiting)
