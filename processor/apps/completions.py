"""The processor's results reader: a consumer's completions applied to the core.

A results message holds one item's completion or several items of one batch. Applying it frees the
batch's slot when the batch is finished and tells the delivery mode's lane log (the batch finished)
or in-flight log (it progressed; some items went back to wait), so the next commit records it. The
results topic is read again after a handover (``ResultsCursor.rewind``): what was already applied
counts as a replay, never twice (``Scheduler.items_done`` is idempotent).
"""

from __future__ import annotations

import logging
from typing import Any

from processor.apps.observe import ServiceCounters, ServiceObserver
from processor.core.scheduler import Scheduler
from processor.state.credits import CreditBook
from processor.state.lane_log import InFlightLog, LaneLog
from processor.state.results import ResultsCursor
from processor.wire.completion_heads import decode_completions_head
from processor.wire.errors import DecodeError

log = logging.getLogger("tokenfabric.processor")


class CompletionReader:
    """Applies results messages; remembers each consumer's latest answer for the checkpoint."""

    def __init__(
        self,
        core: Scheduler,
        lanes: LaneLog,
        in_flight: InFlightLog,
        credits: CreditBook,
        results: ResultsCursor,
        counters: ServiceCounters,
        observer: ServiceObserver,
        instance: str,
    ) -> None:
        self.core = core
        self.lanes = lanes
        self.in_flight = in_flight
        self.credits = credits
        self.results = results
        self.counters = counters
        self.observer = observer
        self.instance = instance
        self.last_completion_ms: dict[str, int] = {}  # per consumer: its latest result's timestamp
        self._cache_hit: dict[str, bool] = {}

    def apply(self, msg: Any, now: int) -> None:
        """Apply a results message: one item's completion, or several items of one batch."""
        try:
            head = decode_completions_head(msg.value())
        except DecodeError as exc:
            log.error("results: undecodable completion at %d: %s", msg.offset(), exc)
            return
        replay = self.results.applied(msg.partition(), msg.offset())
        if not head.batch_id:  # the processor's own answers to items of a job that ended: no batch
            return
        batch_id, items, counters, core = head.batch_id, head.items, self.counters, self.core
        last = self.last_completion_ms
        last[head.consumer] = max(last.get(head.consumer, 0), msg.timestamp()[1])  # replays are older
        counters.completions += len(items)  # items, not messages: a message may hold a whole batch
        answered = core.in_flight_batch(batch_id)
        applied, finished = core.items_done(batch_id, items, now, head.cached_tokens, head.retriable)
        self.in_flight.retried(core.take_retried())  # they wait again (processor/core/retries.py)
        if applied and answered is not None:
            self.observer.answered(answered, applied, now)
        if applied < len(items):
            unknown = core.made_here(batch_id) and not core.handed_over(batch_id)
            counters.missed(len(items) - applied, replay, unknown)
        if not applied:
            return
        hit = self._cache_hit.setdefault(batch_id, items[0].cache_hit)  # the batch's first answer says
        if finished:
            core.cache_reported(head.consumer, hit)
            del self._cache_hit[batch_id]
            self.credits.free(batch_id)
            self.lanes.batch_finished(batch_id)
        else:
            self.in_flight.batch_progress(batch_id)
