"""Where the processor reads completions from, per results partition.

Why a component: the loop applies completions in order, and a partition handover must rewind the
reader to where an adopted batch's completions can first appear (exactly-once). Both touch the same
two positions, so they live in one object both are given, instead of private dicts of the service.

Invariants: ``seen[p] >= 1 + the highest offset of partition p ever applied``; a completion read at an
offset below ``seen[p]`` is a replay (read again after a rewind), which the core answers idempotently.
``next[p]`` is where reading resumes after the reader is re-assigned.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ResultsCursor:
    next: dict[int, int] = field(default_factory=dict)
    """Next completion to apply, per results partition (exactly-once: where the reader is assigned)."""
    seen: dict[int, int] = field(default_factory=dict)
    """Highest offset applied + 1, per partition: below it, a completion is a replay."""

    def start_at(self, ends: dict[int, int]) -> None:
        """Begin at the topic's current ends: everything before belongs to batches not held here."""
        for p, end in ends.items():
            self.next[p] = self.seen[p] = max(end, 0)

    def applied(self, partition: int, offset: int) -> bool:
        """Record that the completion at ``offset`` was read; True when it is a replay."""
        replay = offset < self.seen.get(partition, 0)
        self.next[partition] = offset + 1
        if not replay:
            self.seen[partition] = offset + 1
        return replay

    def rewind(self, targets: dict[int, int]) -> bool:
        """Move back to ``targets`` where they are earlier than the next offset; True when the reader
        must be re-assigned."""
        lower = {p: o for p, o in targets.items() if o < self.next.get(p, o + 1)}
        self.next.update(lower)
        return bool(lower)

    def positions(self) -> tuple[tuple[int, int], ...]:
        """Where each partition's reading stands, sorted: recorded with a batch so that a restore
        knows where its completions can first appear."""
        return tuple(sorted(self.next.items()))
