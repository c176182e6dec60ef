"""What the processor service and the handover ask of a delivery mode (the :class:`Committer`
protocol), and the small types its methods take. The two implementations are in
processor/state/commit.py; keeping the protocol apart lets a reader see the seam without either
mode's code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import KafkaError, TopicPartition

from processor.core.item import Batch, Item
from processor.kafka.factory import ProducerClient
from processor.kafka.watchdog import CallWatchdog
from processor.state.credits import CreditBook
from processor.state.ingest import IngestItem
from processor.state.results import ResultsCursor

if TYPE_CHECKING:
    from processor.state.commit import TransactionalCommitter

Deliver = Callable[[Any, Any], None]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a new batch's changelog record goes and what it records besides its items."""

    partition: int
    slot: int
    results_from: tuple[tuple[int, int], ...]


TakeOver = Callable[["TransactionalCommitter", list[int]], None]
"""Restores the lane state of some partitions through a committer that logs it (the handover's)."""


class Committer(Protocol):
    """One delivery mode: how progress becomes durable, and everything else that differs between
    the modes, asked by the service and the handover instead of branching on the mode."""

    producer: ProducerClient
    undelivered: KafkaError | None
    watchdog: CallWatchdog | None
    batches_delivered: int
    """Batches known to have reached their topic: at their delivery report (at-least-once) or when
    their transaction commits (exactly-once)."""

    def on_start(self, resume: Callable[[], None]) -> None:
        """Before the group assigns partitions: call ``resume`` (load the ledger checkpoint, read
        results from the topic's end) when lane state moves with partitions, as in exactly-once."""
        ...

    def results_assignment(
        self, topic: str, partitions: list[int], cursor: ResultsCursor
    ) -> list[TopicPartition]:
        """Where the results reader starts: the cursor's positions, or the group's committed ones."""
        ...

    def slot_share(self, credits: CreditBook, max_inflight: int) -> int | None:
        """This instance's share of a consumer's in-flight slots (None: all of them)."""
        ...

    def place(
        self, batch: Batch, credits: CreditBook, max_inflight: int, cursor: ResultsCursor
    ) -> Placement | None:
        """Take a slot for a new batch and say where its changelog record goes (None: no changelog)."""
        ...

    def revoked(self, partitions: list[int], let_go: Callable[[], None]) -> None:
        """After the forced commit of a revocation: what letting go of ``partitions`` means here."""
        ...

    def assigned(self, partitions: list[int], take_over: TakeOver) -> None:
        """An assignment: restore the partitions' lane state through ``take_over``, or nothing."""
        ...

    def transaction_age_s(self) -> float:
        """How long the open transaction has been open (0 without transactions)."""
        ...

    def check_delivered(self) -> None: ...

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: Deliver | None = None,
        partition: int | None = None,
    ) -> None: ...
    def start(self) -> None: ...
    def item_seen(self, item: IngestItem) -> None: ...
    def first_seen(self, partition: int, item_id: str) -> bool: ...
    def dead_letter(self, partition: int, offset: int) -> Deliver: ...
    def batch_emitted(self, batch: Batch, placement: Placement | None = None) -> Deliver: ...
    def batch_finished(self, batch_id: str) -> None: ...
    def batch_progress(self, batch_id: str) -> None: ...
    def requeued(self, batch_id: str, items: Iterable[Item]) -> None: ...
    def retried(self, items: Sequence[Item]) -> None:
        """Items that failed retriably went back to the lanes (``Scheduler.take_retried``; often
        none): exactly-once records them waiting again, in the transaction that checkpoints the
        ledger counting them ``retried``; at-least-once holds their offsets until they run again."""
        ...

    def withdrawn(self, items: Iterable[Item]) -> Deliver:
        """Waiting items of a job that ended left the lanes, answered by the message this returns the
        delivery callback of: their waiting-set records go in the same transaction (exactly-once),
        or their ingest offsets may pass once it is delivered (at-least-once)."""
        ...

    def due(self, now_ms: int) -> bool: ...
    def commit(self, snapshot: Callable[[], bytes]) -> float: ...
    def remembered_ids(self) -> int: ...
