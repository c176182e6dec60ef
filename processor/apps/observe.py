"""The processor service's settings, its counters and the hooks its observers implement.

Beside the service so that metrics, health and the CLI can name them without the service's clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings
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
