"""The apps' settings (processor, consumer app, plain queue): every knob, its default, its unit, and
what it refuses.

Settings validate themselves (``__post_init__``), so the CLI and a library user building
:class:`ProcessorSettings` get the same one-line ``ValueError``; the messages name the CLI flag, which
is the field's name in kebab case.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.core.lanes import LaneSettings
from processor.core.scheduler import DispatchSettings
from processor.core.shares import ShareSettings
from processor.kafka.clients import GROUP_PROTOCOLS
from processor.kafka.topics import RETENTION_MS
from processor.wire.records import COMPLETION_FORMS, CompletionForm

#: Most bytes of one CompletionBatch message: under Kafka's default 1 MB message limit (broker
#: ``message.max.bytes``, producer ``message.max.bytes``), with room for the record batch overhead.
MAX_COMPLETION_BYTES = 900_000


@dataclass(frozen=True, slots=True)
class ProcessorSettings:
    instance: str = "processor-0"
    """Names this instance's transactional id, checkpoints and batch ids: keep it stable across restarts."""
    group_id: str = ""
    """The ingest consumer group; empty means the pipeline's (``TopicNames.processor_group``)."""
    exactly_once: bool = True
    """Transactions, changelog and restore (see processor/state/modes.py); False is at-least-once."""
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
    """How long the group waits for a silent instance before handing its partitions to the others.
    Classic protocol: a client setting. Consumer protocol: the group's ``consumer.session.timeout.ms``,
    set through the admin API at start within the broker's bounds (docs/operations.md)."""
    group_protocol: str = "consumer"
    """``consumer`` (KIP-848, Kafka 4.0+: incremental, only moved partitions stop) or ``classic``
    (eager: every rebalance stops every instance; for brokers older than 4.0)."""
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
    results_schema_id: int | None = None
    """``--results-framing registry``: the registry's id of our ``CompletionBatch`` under
    ``<prefix>.results-value``; the processor's own answers (items of ended jobs) are framed under it."""
    lanes: LaneSettings = field(default_factory=LaneSettings)
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)
    shares: ShareSettings = field(default_factory=ShareSettings)
    """Token shares between jobs (docs/shares.md); the jobs' weights and quotas come from the
    job-shares topic."""

    def __post_init__(self) -> None:
        """Refuse settings that cannot work, with the same one line the CLI prints for its flag."""
        if not self.instance:
            raise ValueError("--instance (instance) must not be empty: it names the transactional id")
        if self.consume_batch < 1:
            raise ValueError(f"consume_batch must be >= 1, got {self.consume_batch}")
        if self.poll_timeout_ms < 0:
            raise ValueError(f"poll_timeout_ms must be >= 0, got {self.poll_timeout_ms}")
        if self.commit_interval_ms < 1:
            raise ValueError("--commit-interval-ms must be >= 1")
        if self.eager_commit_ms < 0:
            raise ValueError(f"eager_commit_ms must be >= 0, got {self.eager_commit_ms}")
        if self.tick_interval_ms < 1:
            raise ValueError(f"tick_interval_ms must be >= 1, got {self.tick_interval_ms}")
        if self.max_waiting_tokens < 0:
            raise ValueError("--max-waiting-tokens must be >= 0 (0 means no cap)")
        if self.session_timeout_ms < 1000:
            raise ValueError("--session-timeout-ms must be >= 1000 (brokers usually require >= 6000)")
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(
                f"--group-protocol must be one of {', '.join(GROUP_PROTOCOLS)}, got {self.group_protocol!r}"
            )
        if self.dedupe_window_ms < 0 or self.dedupe_max_ids < 0:
            raise ValueError("--dedupe-window-ms and --dedupe-max-ids must be >= 0 (0: off, no cap)")
        if self.transaction_timeout_ms <= self.commit_interval_ms:
            raise ValueError("--transaction-timeout-ms must be longer than --commit-interval-ms")


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """How a consumer app runs (its contract is what it promises the processor; these are its own)."""

    max_batches: int | None = None
    """Stop after this many batches (tests); None: run until stopped."""
    idle_exit_s: float | None = None
    """Stop after this long without a batch (the demo); None: never."""
    completions: CompletionForm = "batch"
    """One results message per batch, or one per item (docs/consumers.md)."""
    results_schema_id: int | None = None
    """``--results-framing registry``: the registry's id of our ``CompletionBatch`` under
    ``<prefix>.results-value``, framed into each results message (docs/schema-registry.md)."""
    max_completion_bytes: int = MAX_COMPLETION_BYTES
    """Past this size a batch's completions are split over several messages."""
    exactly_once: bool = True
    """A batch's completions and its offset in one transaction (processor.apps.consumer_delivery);
    False (``--at-least-once``) flushes the completions, then commits the offset."""
    poll_timeout_s: float = 0.5
    """How long one poll of the batch topic may block when nothing arrives (also how soon a set
    ``stop`` is noticed)."""

    def __post_init__(self) -> None:
        if self.completions not in COMPLETION_FORMS:
            raise ValueError(
                f"--completions must be one of {', '.join(COMPLETION_FORMS)}, got {self.completions!r}"
            )
        if self.results_schema_id is not None and self.completions != "batch":
            raise ValueError(
                "--results-framing registry writes CompletionBatch messages: use --completions batch"
            )
        if self.max_completion_bytes < 1:
            raise ValueError(f"max_completion_bytes must be >= 1, got {self.max_completion_bytes}")
        if self.max_batches is not None and self.max_batches < 1:
            raise ValueError(f"--max-batches must be >= 1, got {self.max_batches}")
        if not self.poll_timeout_s >= 0:
            raise ValueError(f"poll_timeout_s must be >= 0, got {self.poll_timeout_s}")
        check_idle_exit(self.idle_exit_s)


@dataclass(frozen=True, slots=True)
class PlainQueueSettings:
    """How one card of the plain-queue baseline packs what it reads (processor/apps/plainqueue.py)."""

    linger_ms: float = 50.0
    """How long a card waits for more items before it runs a batch that is not full."""
    idle_exit_s: float | None = None
    """Stop after this long without an item; None: never."""

    def __post_init__(self) -> None:
        if not self.linger_ms > 0:
            raise ValueError(f"--linger-ms must be > 0, got {self.linger_ms}")
        check_idle_exit(self.idle_exit_s)


def check_idle_exit(idle_exit_s: float | None) -> None:
    if idle_exit_s is not None and not idle_exit_s > 0:
        raise ValueError(f"--idle-exit-s must be > 0, got {idle_exit_s}")
