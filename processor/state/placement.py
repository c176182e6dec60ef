"""Slot placement: how many of a consumer's in-flight slots this instance holds, and where a new
batch's changelog record goes. One of the roles a delivery mode is made of (processor/state/modes.py).

With a changelog (exactly-once) a consumer's slots are split between instances by the ingest
partitions each owns (processor/state/credits.py), and a batch's slot decides the changelog
partition its record goes to, so that the slot moves with that partition. Without one
(at-least-once) nothing moves between instances: :class:`AllSlots` is the null placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from processor.core.item import Batch
from processor.state.credits import CreditBook
from processor.state.results import ResultsCursor


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a new batch's changelog record goes and what it records besides its items."""

    partition: int
    slot: int
    results_from: tuple[tuple[int, int], ...]


class SlotPlacement(Protocol):
    """A consumer's share of in-flight slots, and a new batch's place in the changelog."""

    def slot_share(self, credits: CreditBook, max_inflight: int) -> int | None:
        """This instance's share of a consumer's in-flight slots (None: all of them)."""
        ...

    def place(
        self, batch: Batch, credits: CreditBook, max_inflight: int, cursor: ResultsCursor
    ) -> Placement | None:
        """Take a slot for a new batch and say where its changelog record goes (None: no changelog)."""
        ...


class PartitionSlots:
    """Exactly-once: slots follow the ingest partitions an instance owns."""

    def slot_share(self, credits: CreditBook, max_inflight: int) -> int | None:
        """Slots are split between instances by the ingest partitions each owns (state/credits.py)."""
        return credits.share(max_inflight)

    def place(
        self, batch: Batch, credits: CreditBook, max_inflight: int, cursor: ResultsCursor
    ) -> Placement | None:
        """A batch holds one of its consumer's slots, which decides the changelog partition its
        record goes to (the slot moves with that partition), and records where its completions can
        first appear (the results cursor now)."""
        slot, partition = credits.take(batch.consumer, max_inflight, batch.batch_id)
        return Placement(partition, slot, cursor.positions())


class AllSlots:
    """At-least-once, the null placement: one instance holds every slot and there is no changelog."""

    def slot_share(self, credits: CreditBook, max_inflight: int) -> int | None:
        return None

    def place(
        self, batch: Batch, credits: CreditBook, max_inflight: int, cursor: ResultsCursor
    ) -> Placement | None:
        return None
