"""The processor service's settings, its counters and the hooks its observers implement.

Beside the service so that metrics, health and the CLI can name them without the service's clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.core.item import Batch
from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings
from processor.core.shares import ShareSettings
from processor.kafka.topics import RETENTION_MS


@dataclass(frozen=True, slots=True)
class ProcessorSettings:
    instance: str = "processor-0"
    """Names this instance's transactional id, checkpoints and batch ids: keep it stable across restarts."""
    group_id: str = ""
    """The ingest consumer group; empty means the pipeline's (``TopicNames.processor_group``)."""
    exactly_once: bool = True
    """Transactions, changelog and restore (see processor/state/commit.py); False is at-least-once."""
    consume_batch: int = 5000
    """Most ingest messages taken per ``consume`` call."""
    poll_timeout_ms: int = 20
    """How long one ``consume`` call may block when nothing arrives."""
    commit_interval_ms: int = 500
    """How often progress (a transaction, or offsets plus a checkpoint) is made durable; the ledger is
    checkpointed with every commit, so it always matches the committed state."""
    eager_commit_ms: int = 50
    """Exactly-once: with new batches in the open transaction, commit after this long instead (a batch
    reaches its consumer only when its transaction commits)."""
    transaction_timeout_ms: int = 10_000
    """Exactly-once: how long the broker waits before aborting an open transaction of a crashed
    process; the new owner of its partitions waits at most this long before it can restore them."""
    session_timeout_ms: int = 45_000
    """How long the group waits for a silent instance before handing its partitions to the others."""
    tick_interval_ms: int = 500
    max_waiting_tokens: int = 0
    """Backpressure: past this many tokens waiting in lanes, stop consuming ingest (the backlog stays in
    Kafka; nothing is dropped) until 10% has drained. 0 means no cap."""
    dedupe_window_ms: int = RETENTION_MS
    """Exactly-once: an item id an ingest partition took within this long is a producer's repeat,
    dead-lettered as ``duplicate-item-id`` instead of scheduled (docs/producers.md). At least the
    ingest topic's retention (the default is the retention ``topics create`` sets); 0 turns it off."""
    dedupe_max_ids: int = 4_000_000
    """Most ids one ingest partition remembers (about 15-24 bytes each); past it the oldest are
    forgotten early, so the window is shorter. 0 means no cap."""
    lanes: LaneSettings = field(default_factory=LaneSettings)
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)
    shares: ShareSettings = field(default_factory=ShareSettings)
    """Token shares between jobs (docs/shares.md); the jobs' weights and quotas come from the
    job-shares topic."""


@dataclass(slots=True)
class ServiceCounters:
    consumed: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    batches_produced: int = 0
    batches_delivered: int = 0
    completions: int = 0
    unknown_completions: int = 0
    contracts: int = 0
    commits: int = 0
    checkpoints: int = 0
    backpressure_pauses: int = 0
    restored_items: int = 0
    restored_batches: int = 0
    restore_seconds: float = 0.0
    assignments: int = 0
    replayed_completions: int = 0


class ServiceObserver:
    """Hooks the metrics layer implements; the default observes nothing.

    Called from the owner thread, so implementations must be quick and must not call back into the
    service.
    """

    def committed(self, seconds: float) -> None:
        """An ingest offset commit (or a transaction commit, with exactly-once) took ``seconds``."""

    def checkpointed(self, seconds: float) -> None:
        """A ledger checkpoint was produced; ``seconds`` is the time to build and queue it."""

    def dispatched(self, batch: Batch, now_ms: int) -> None:
        """``batch`` was emitted at core time ``now_ms``; its items' ``arrival_ms`` say when they came."""

    def answered(self, batch: Batch, items: int, now_ms: int) -> None:
        """``items`` items of ``batch`` (emitted at ``batch.created_ms``) were answered at ``now_ms``."""


#: How long a model's items must wait with no contract for it before the processor says so: contracts
#: are read from the beginning at every start, a step or two after the first ingest messages.
UNSERVED_GRACE_MS = 5_000


class UnservedWatch:
    """Which models to warn about, once: items wait and no consumer has a contract for the model.

    :meth:`update` takes ``Scheduler.unserved()`` and returns the models that have just been unserved
    for ``grace_ms``. A model is named again only after it was served (or had nothing waiting) in
    between, so a log carries one line per change, not one per tick.
    """

    def __init__(self, grace_ms: int = UNSERVED_GRACE_MS) -> None:
        self.grace_ms = grace_ms
        self._since: dict[str, int] = {}
        self._said: set[str] = set()

    def update(self, unserved: dict[str, tuple[int, int]], now_ms: int) -> list[tuple[str, int, int]]:
        """(model, items, tokens) of each model to warn about now."""
        for model in [m for m in self._since if m not in unserved]:
            del self._since[model]
            self._said.discard(model)
        out: list[tuple[str, int, int]] = []
        for model, (items, tokens) in sorted(unserved.items()):
            since = self._since.setdefault(model, now_ms)
            if model not in self._said and now_ms - since >= self.grace_ms:
                self._said.add(model)
                out.append((model, items, tokens))
        return out
