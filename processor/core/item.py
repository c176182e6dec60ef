"""The values the scheduling core moves around: a waiting item, an emitted batch, an item's outcome.

Items are the hot-path object (a million may wait at once), so they are msgspec Structs rather than
dataclasses: built in C at half the cost of a Python ``__init__``, and left out of the cyclic garbage
collector (``gc=False``), which they cannot need: an item holds strings, ints and bytes, never an
object that could lead back to it. The core never looks at ``payload``, which is whatever the adapter
that created the item needs to send it on (the input message, in the processor; the dispatch time,
in the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import msgspec

NO_LANE = -1


class Item(msgspec.Struct, eq=False, gc=False):
    """One tokenised request waiting to be scheduled.

    ``output_budget`` is the most tokens the request may generate (``TokenItem.output_budget``), or
    None when the producer left it to the consumer; memory-mode contracts count it (their
    ``default_output_tokens`` when None) because generation fills the KV cache too. ``job`` is the
    job the item belongs to (``TokenItem.job_id``; "" for none): lanes never mix jobs, so every
    batch holds one job's items, which is what lets token shares (``core/shares.py``) be counted
    per batch. ``attempt`` counts its retries (processor/core/retries.py). Items compare by
    identity (``eq=False``): two requests with equal fields are still two.
    """

    id: str
    model: str
    shape: int
    length: int
    arrival_ms: int
    payload: Any = None
    output_budget: int | None = None
    job: str = ""
    lane: int = NO_LANE
    dispatched: bool = False
    attempt: int = 1
    """Which dispatch of the item this is or will be: 1 at first, one more each time a retriable
    failure sends it back to the lanes (processor/core/retries.py)."""

    def __repr__(self) -> str:
        return f"Item({self.id!r}, model={self.model!r}, shape={self.shape:#x}, length={self.length})"


@dataclass(slots=True)
class Batch:
    """Items sent to one consumer in one go.

    Invariant (checked when the batch is emitted): one model, one shape, one lane, and within the
    consumer's batching rule (``contract.BatchRule.fits``) unless the batch is a single oversized item.
    """

    batch_id: str
    consumer: str
    model: str
    shape: int
    lane: int
    pad_multiple: int
    padded_length: int
    items: list[Item]
    created_ms: int
    oversized: bool = False

    @property
    def padded_tokens(self) -> int:
        return self.padded_length * len(self.items)

    @property
    def real_tokens(self) -> int:
        tokens = 0
        for item in self.items:
            tokens += item.length
        return tokens


class ItemOutcome(NamedTuple):
    """How one item of an in-flight batch was answered (the core's reading of a wire ``ItemOutcome``).

    A named tuple, so it is interchangeable with the plain ``(item_id, ok, cache_hit)`` tuples the
    wire heads build (processor/wire/heads.py builds plain ones: cheaper per item, measured):
    :meth:`~processor.core.scheduler.Scheduler.items_done` takes either. The core does not read
    ``cache_hit``: the consumer writes it per item, the processor counts one per batch (its first
    answered item's) and passes it to :meth:`~processor.core.scheduler.Scheduler.cache_reported`
    when the batch finishes (docs/consumers.md).
    """

    item_id: str
    ok: bool
    cache_hit: bool = False


Outcome: TypeAlias = ItemOutcome | tuple[str, bool, bool]
"""What the completion methods accept: an :class:`ItemOutcome` or the plain tuple in its field order."""
