"""Consumer credits shared between processor instances: each in-flight slot belongs to one partition.

A consumer promises to hold at most ``max_inflight`` batches. With one processor that is a counter;
with several, each instance must know which of those slots are its own, at every instant, including
while partitions move between instances. The rule: slot ``j`` of a consumer belongs to ingest
partition ``slot_partition(j, max_inflight, partitions)``, and only the instance that owns that
partition may fill it. The batch that holds a slot is recorded in that partition's changelog, so when
the partition moves, the batch and its slot move together: no two instances ever hold the same slot,
and the consumer never holds more than ``max_inflight`` batches, during a rebalance included.

The slots are spread evenly over the partitions. With contiguous partition ranges (Kafka's range
assignor), every instance owns at least one slot of every consumer when ``max_inflight >= instances``
and the number of instances divides the number of partitions, or whenever ``max_inflight >=
partitions`` (``tests/state/test_handover.py`` checks the first by property). Otherwise an instance can
own none (4 instances on 6 partitions with ``max_inflight`` 4: the slots sit on partitions 0, 2, 3
and 5), and cannot send that consumer work; ``tokenfabric status`` shows each instance's share.

No I/O: the processor service keeps one ``CreditBook`` and re-fills it on each assignment.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


def slot_partition(slot: int, max_inflight: int, partitions: int) -> int:
    """The ingest partition that owns ``slot`` (midpoints of ``max_inflight`` equal bands)."""
    if not 0 <= slot < max_inflight:
        raise ValueError(f"slot {slot} outside 0..{max_inflight - 1}")
    return ((2 * slot + 1) * partitions) // (2 * max_inflight)


@dataclass(slots=True)
class CreditBook:
    """Which slots of each consumer this instance owns, and which batch holds each."""

    partitions: int
    owned_partitions: frozenset[int] = frozenset()
    _held: dict[str, dict[int, str]] = field(default_factory=dict)  # consumer -> slot -> batch id
    _slot_of: dict[str, tuple[str, int]] = field(default_factory=dict)  # batch id -> (consumer, slot)
    _owned: dict[int, list[int]] = field(default_factory=dict)  # max_inflight -> owned slots (a cache)

    def owned_slots(self, max_inflight: int) -> list[int]:
        owned = self._owned.get(max_inflight)
        if owned is None:
            owned = self._owned[max_inflight] = [
                j
                for j in range(max_inflight)
                if slot_partition(j, max_inflight, self.partitions) in self.owned_partitions
            ]
        return owned

    def share(self, max_inflight: int) -> int:
        """How many of a consumer's ``max_inflight`` slots this instance may fill."""
        return len(self.owned_slots(max_inflight))

    def take(self, consumer: str, max_inflight: int, batch_id: str) -> tuple[int, int]:
        """The lowest free owned slot for a new batch, and the partition its record goes to."""
        held = self._held.setdefault(consumer, {})
        owned = self.owned_slots(max_inflight)
        if len(held) < len(owned):  # most often the next slot up is free: no scan from 0
            j = owned[len(held)]
            if j not in held:
                self.hold(consumer, j, batch_id)
                return j, slot_partition(j, max_inflight, self.partitions)
        for j in owned:
            if j not in held:
                self.hold(consumer, j, batch_id)
                return j, slot_partition(j, max_inflight, self.partitions)
        raise RuntimeError(
            f"consumer {consumer}: no free in-flight slot of the {self.share(max_inflight)} this "
            f"instance owns ({len(held)} held); the scheduler must not emit past its share"
        )

    def hold(self, consumer: str, slot: int, batch_id: str) -> None:
        """Record that ``batch_id`` holds ``slot`` (a new batch, or one adopted from the changelog)."""
        held = self._held.setdefault(consumer, {})
        if slot in held:
            raise RuntimeError(f"consumer {consumer}: slot {slot} is held by {held[slot]}, not free")
        held[slot] = batch_id
        self._slot_of[batch_id] = (consumer, slot)

    def adopt(self, consumer: str, slot: int, batch_id: str) -> int:
        """Hold the slot a restored batch recorded. A slot that no longer exists (the consumer
        re-announced a smaller ``max_inflight``) or is taken gets a placeholder key below zero: the
        batch still counts against the share until it finishes, so nothing new is sent in its place."""
        held = self._held.setdefault(consumer, {})
        if slot < 0 or slot in held:
            slot = -1 - len(held)
            while slot in held:
                slot -= 1
        self.hold(consumer, slot, batch_id)
        return slot

    def free(self, batch_id: str) -> None:
        entry = self._slot_of.pop(batch_id, None)
        if entry is not None:
            consumer, slot = entry
            del self._held[consumer][slot]

    def count_partitions(self, partitions: int) -> None:
        """The ingest topic's partition count, learnt when the processor starts (before any
        assignment: nothing is owned or held yet, and the slots' partitions follow the count)."""
        self.partitions = partitions
        self.reassign(frozenset())

    def reassign(self, owned_partitions: frozenset[int]) -> None:
        """A new assignment: nothing is held until restore adopts the batches of these partitions."""
        self.owned_partitions = owned_partitions
        self._owned.clear()
        self._held.clear()
        self._slot_of.clear()

    def extend(self, owned_partitions: frozenset[int]) -> None:
        """More partitions, none lost (an incremental assignment): the slots held stay held, and the
        new partitions' slots are free until restore adopts their batches."""
        self.owned_partitions = owned_partitions
        self._owned.clear()

    def narrow(self, owned_partitions: frozenset[int], let_go: Iterable[str]) -> None:
        """Fewer partitions, none added (a partial revocation): the batches ``let_go`` (those whose
        records live in the partitions that went) give up their slots with them; the slots of the
        batches kept stay held, in the partitions kept."""
        for batch_id in let_go:
            self.free(batch_id)
        self.extend(owned_partitions)

    def held(self, consumer: str) -> int:
        return len(self._held.get(consumer, {}))
