"""The main job's two runs, measured the same way: from the ingest and results topics alone.

tokenfabric (processor, lanes, consumer apps) and the plain Kafka queue (processor.apps.plainqueue)
write the same completion records, so one reading serves both and neither is measured by its own
claims. :func:`measure` reads a run's ingest topic (item id -> shape, tokens, produce time) and its
results topic (every completion: batch id, card, padded length, completion time) back, read_committed,
and derives:

* items completed once: ingest items with exactly one completion, ``ok``; duplicates and lost items;
* makespan: first item produced to last completion (wall clock of the producer and the cards);
* real tokens/s: prompt tokens completed ``ok`` / makespan;
* per batch (completions grouped by batch id): padded tokens (items x padded length), real tokens,
  the shapes in it. Padding waste = (padded - real) / padded; budget fill = padded / (batches x the card's
  budget), over batches that are not single oversized items;
* shape switches: batches whose shapes differ from the card's previous batch's, in completion order;
* cache hits, **modelled** (no engine here keeps a prefix cache: MiniLM has none, ``sim`` models one
  per batch shape): each card keeps the ``cache_shapes`` most recently used shapes (LRU, as the sim
  engine's card model); a batch hits when every shape in it is cached.

:class:`ResultsWatcher` follows a results topic as it grows, for the progress line and the end of a run.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from processor.core.measures import padding_waste
from processor.kafka.factory import KAFKA
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.wire.completions import decode_completions
from processor.wire.items import decode_token_item

#: Shapes a card's prefix cache holds in the modelled cache hit rate (the sim engine's default).
CACHE_SHAPES = 4


@dataclass(slots=True)
class CardFigures:
    """Where one card's batches went, read back from the results topic."""

    budget: int
    batches: int = 0
    items: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    fill_batches: int = 0
    fill_padded_tokens: int = 0
    shapes: int = 0
    shape_switches: int = 0
    mixed_shape_batches: int = 0
    cache_hits: int = 0

    @property
    def padding_waste(self) -> float:
        return padding_waste(self.real_tokens, self.padded_tokens) or 0.0

    @property
    def budget_fill(self) -> float:
        return self.fill_padded_tokens / (self.fill_batches * self.budget) if self.fill_batches else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "batches": self.batches,
            "items": self.items,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "padding_waste": round(self.padding_waste, 6),
            "budget_fill": round(self.budget_fill, 6),
            "shapes": self.shapes,
            "shape_switches": self.shape_switches,
            "mixed_shape_batches": self.mixed_shape_batches,
            "cache_hits": self.cache_hits,
        }


@dataclass(slots=True)
class RunFigures:
    """One run, as the topics tell it. ``audit_clean`` is set by the caller (see the demo)."""

    engine: str
    topic_prefix: str = ""
    items: int = 0
    tokens: int = 0
    items_completed_once: int = 0
    items_failed: int = 0
    duplicate_completions: int = 0
    lost_items: int = 0
    audit_clean: bool = False
    makespan_s: float = 0.0
    completed_tokens: int = 0
    cards: dict[str, CardFigures] = field(default_factory=dict)

    def _sum(self, key: str) -> int:
        return sum(getattr(c, key) for c in self.cards.values())

    @property
    def real_tokens_per_s(self) -> float:
        return self.completed_tokens / self.makespan_s if self.makespan_s else 0.0

    @property
    def padding_waste(self) -> float:
        return padding_waste(self._sum("real_tokens"), self._sum("padded_tokens")) or 0.0

    @property
    def budget_fill(self) -> float:
        room = sum(c.fill_batches * c.budget for c in self.cards.values())
        return self._sum("fill_padded_tokens") / room if room else 0.0

    @property
    def batches(self) -> int:
        return self._sum("batches")

    @property
    def shape_switches(self) -> int:
        return self._sum("shape_switches")

    @property
    def cache_hit_rate(self) -> float:
        return self._sum("cache_hits") / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "topic_prefix": self.topic_prefix,
            "items": self.items,
            "tokens": self.tokens,
            "items_completed_once": self.items_completed_once,
            "items_failed": self.items_failed,
            "duplicate_completions": self.duplicate_completions,
            "lost_items": self.lost_items,
            "audit_clean": self.audit_clean,
            "makespan_s": round(self.makespan_s, 3),
            "real_tokens_per_s": round(self.real_tokens_per_s, 1),
            "padding_waste": round(self.padding_waste, 6),
            "budget_fill": round(self.budget_fill, 6),
            "batches": self.batches,
            "shape_switches": self.shape_switches,
            "mixed_shape_batches": self._sum("mixed_shape_batches"),
            "cache_hit_rate": round(self.cache_hit_rate, 6),
            "cache_hits_source": f"modelled: LRU of {CACHE_SHAPES} shapes per card over the batches",
            "cards": {name: c.to_dict() for name, c in self.cards.items()},
        }


@dataclass(frozen=True, slots=True)
class _Batch:
    card: str
    batch_id: str
    completed_ms: int
    padded_length: int
    real_tokens: int
    shapes: frozenset[int]
    items: int


def measure(
    conf: Mapping[str, str],
    topics: TopicNames,
    budgets: Mapping[str, int],
    engine: str,
    cache_shapes: int = CACHE_SHAPES,
) -> RunFigures:
    """The figures of one run (``budgets``: card id -> padded-token budget), from its topics alone."""
    out = RunFigures(engine, topics.prefix)
    shape: dict[str, int] = {}
    tokens: dict[str, int] = {}
    first_ms: int | None = None
    for msg in read_topic(conf, topics.ingest):
        rec = decode_token_item(msg.value())
        shape[rec.item_id] = rec.shape
        tokens[rec.item_id] = rec.token_count
        first_ms = rec.produced_ms if first_ms is None else min(first_ms, rec.produced_ms)
    out.items, out.tokens = len(tokens), sum(tokens.values())
    outcomes: Counter[str] = Counter()
    ok: set[str] = set()
    grouped: dict[str, list[Any]] = {}
    last_ms = first_ms or 0
    for msg in read_topic(conf, topics.results):
        for done in decode_completions(msg.value()):
            outcomes[done.item_id] += 1
            if outcomes[done.item_id] > 1:
                continue
            if done.status == "ok":
                ok.add(done.item_id)
                out.completed_tokens += done.input_tokens
            else:
                out.items_failed += 1
            last_ms = max(last_ms, done.completed_ms)
            grouped.setdefault(done.batch_id, []).append(done)
    out.items_completed_once = sum(1 for i in tokens if outcomes[i] == 1 and i in ok)
    out.duplicate_completions = sum(n - 1 for n in outcomes.values() if n > 1)
    out.lost_items = sum(1 for i in tokens if outcomes[i] == 0)
    out.makespan_s = (last_ms - first_ms) / 1000.0 if first_ms is not None else 0.0
    batches = [
        _Batch(
            recs[0].consumer,
            batch_id,
            max(r.completed_ms for r in recs),
            recs[0].padded_tokens,
            sum(r.input_tokens for r in recs),
            frozenset(shape.get(r.item_id, 0) for r in recs),
            len(recs),
        )
        for batch_id, recs in grouped.items()
    ]
    for name, budget in budgets.items():
        out.cards[name] = _card(
            sorted((b for b in batches if b.card == name), key=lambda b: (b.completed_ms, b.batch_id)),
            budget,
            cache_shapes,
        )
    return out


def _card(batches: Sequence[_Batch], budget: int, cache_shapes: int) -> CardFigures:
    f = CardFigures(budget)
    cache: OrderedDict[int, None] = OrderedDict()
    previous: frozenset[int] | None = None
    seen: set[int] = set()
    for b in batches:
        padded = b.items * b.padded_length
        f.batches += 1
        f.items += b.items
        f.real_tokens += b.real_tokens
        f.padded_tokens += padded
        if b.items > 1 or padded <= budget:
            f.fill_batches += 1
            f.fill_padded_tokens += padded
        f.mixed_shape_batches += len(b.shapes) > 1
        f.shape_switches += previous is not None and b.shapes != previous
        previous = b.shapes
        seen |= b.shapes
        f.cache_hits += all(s in cache for s in b.shapes)
        for s in b.shapes:
            cache[s] = None
            cache.move_to_end(s)
        while len(cache) > cache_shapes:
            cache.popitem(last=False)
    f.shapes = len(seen)
    return f


class ResultsWatcher:
    """Counts the distinct items completed on a results topic (read_committed) as it grows."""

    def __init__(self, conf: Mapping[str, str], topic: str) -> None:
        self._consumer = KAFKA.consumer(
            {
                **conf,
                "group.id": "tokenfabric-demo-watcher",
                "enable.auto.commit": "false",
                "isolation.level": "read_committed",
            }
        )
        partitions = self._consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self._consumer.assign([TopicPartition(topic, p, 0) for p in sorted(partitions)])
        self.done: set[str] = set()
        self.tokens = 0

    def poll(self, timeout_s: float = 0.5) -> int:
        """Read what arrived (waiting up to ``timeout_s``); the distinct items completed so far."""
        for msg in self._consumer.consume(1000, timeout_s):
            if msg.error() is not None:
                continue
            for rec in decode_completions(msg.value()):
                if rec.item_id not in self.done:
                    self.done.add(rec.item_id)
                    self.tokens += rec.input_tokens
        return len(self.done)

    def close(self) -> None:
        self._consumer.close()
