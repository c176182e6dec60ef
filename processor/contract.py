"""What a GPU consumer promises to accept: a model and four numbers.

A batch pads every item to its longest item rounded up to ``pad_multiple``; its cost is
``items x padded_length`` and must fit ``budget_tokens`` (the engine's padded-token budget for one
forward pass). ``max_inflight`` is how many batches the consumer holds at once: the processor never
sends more, so a slow card is never buried under work it cannot start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONSUMER_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def round_up(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    if length <= multiple:
        return multiple
    return -(-length // multiple) * multiple


@dataclass(frozen=True, slots=True)
class Contract:
    consumer: str
    model: str
    budget_tokens: int
    max_items: int
    pad_multiple: int = 8
    max_inflight: int = 2

    def __post_init__(self) -> None:
        if not CONSUMER_ID.match(self.consumer):
            raise ValueError(
                f"contract: consumer id {self.consumer!r} must be 1-200 of A-Z a-z 0-9 . _ - "
                "(it names the consumer's batch topic)"
            )
        if not self.model:
            raise ValueError(f"contract {self.consumer}: model must not be empty")
        for name in ("budget_tokens", "max_items", "pad_multiple", "max_inflight"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"contract {self.consumer}: {name} must be a positive integer, got {value!r}"
                )

    def padded_length(self, length: int) -> int:
        return round_up(length, self.pad_multiple)

    def batch_cost(self, n_items: int, longest: int) -> int:
        """Padded tokens of a batch of ``n_items`` whose longest item has ``longest`` tokens."""
        return n_items * self.padded_length(longest)

    def is_oversized(self, length: int) -> bool:
        """True if a single item of ``length`` tokens exceeds the whole budget."""
        return self.padded_length(length) > self.budget_tokens
