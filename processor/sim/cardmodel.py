"""A model of one GPU card's cost and prefix cache, shared by the simulator and the ``sim`` engine.

Cost of a batch: ``overhead_ms + padded_tokens / tokens_per_s``. Padding is paid in full, which is the
point: a padded token costs the same compute as a real one. The prefix cache holds the last
``cache`` shapes the card served (LRU); a batch hits when every shape in it is cached. A shape is
any hashable key: the simulator keys a LoRA adapter's prefixes by ``(serving key, shape)``, since a
prefix cached under one adapter is no use to another.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


class PrefixCache:
    """LRU set of the shapes whose prefix KV a card still holds."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._shapes: OrderedDict[Hashable, None] = OrderedDict()

    def serve(self, shapes: Iterable[Hashable]) -> bool:
        """Record serving a batch of ``shapes``; True if all of them were cached before."""
        cached = self._shapes
        wanted = list(dict.fromkeys(shapes))
        hit = bool(wanted)
        for s in wanted:  # a plain loop: a batch has one shape or a few
            if s not in cached:
                hit = False
                break
        if self.capacity == 0:
            return False
        for s in wanted:
            cached[s] = None
            cached.move_to_end(s)
        while len(cached) > self.capacity:
            cached.popitem(last=False)
        return hit


@dataclass(frozen=True, slots=True)
class CardSpec:
    tokens_per_s: float = 50_000.0
    overhead_ms: float = 5.0
    cache: int = 4
    jitter: float = 0.0
    """Engine time is scaled by a uniform factor in [1 - jitter, 1 + jitter] (seeded)."""

    def __post_init__(self) -> None:
        if self.tokens_per_s <= 0:
            raise ValueError(f"tps must be > 0, got {self.tokens_per_s}")
        if self.overhead_ms < 0:
            raise ValueError(f"overhead_ms must be >= 0, got {self.overhead_ms}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")


class CardModel:
    def __init__(self, spec: CardSpec, seed: int = 0) -> None:
        self.spec = spec
        self.cache = PrefixCache(spec.cache)
        self._rng = random.Random(seed)

    def batch_ms(self, padded_tokens: int) -> float:
        ms = self.spec.overhead_ms + padded_tokens * 1000.0 / self.spec.tokens_per_s
        if self.spec.jitter:
            ms *= 1 + self._rng.uniform(-self.spec.jitter, self.spec.jitter)
        return ms
