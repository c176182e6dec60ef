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
  engine's card model); a batch hits when every shape in it is cached;
* cached prompt tokens, **measured** where the engine's server reports them (``openai`` against
  vLLM, SGLang or llama.cpp): each completed item's ``cached_tokens``, held to its prompt
  (``prompt_split``), and the prefill tokens computed, the rest of its prompt; output tokens as the
  engine reported them. 0 cached for engines that keep no prefix cache.

:class:`ResultsWatcher` follows a results topic as it grows, for the progress line and the end of a run.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from processor.core.accounting import cached_prompt_share, prompt_split
from processor.core.measures import budget_fill, padding_waste, percentile
from processor.kafka.factory import KAFKA
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.wire.completions import decode_completions
from processor.wire.items import decode_token_item
from processor.wire.records import CompletionRecord

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
    cached_prompt_tokens: int = 0
    prefill_tokens: int = 0
    output_tokens: int = 0

    @property
    def padding_waste(self) -> float:
        return padding_waste(self.real_tokens, self.padded_tokens) or 0.0

    @property
    def budget_fill(self) -> float:
        return budget_fill(self.fill_padded_tokens, self.fill_batches * self.budget) or 0.0

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
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "output_tokens": self.output_tokens,
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
    prefix_tokens: int = 0
    """The items' cacheable tokens, what a perfect prefix cache could serve: set by the caller, who
    knows the workload (the demo's generative backlog); 0 when not known."""
    latencies_ms: list[int] = field(default_factory=list)
    """Each ok item's time from dispatch (``produced_ms + queued_ms``) to its completion, sorted."""
    cards: dict[str, CardFigures] = field(default_factory=dict)

    def cards_sum(self, key: str) -> int:
        """A :class:`CardFigures` count summed over the cards."""
        return sum(getattr(c, key) for c in self.cards.values())

    @property
    def real_tokens_per_s(self) -> float:
        return self.completed_tokens / self.makespan_s if self.makespan_s else 0.0

    @property
    def padding_waste(self) -> float:
        return padding_waste(self.cards_sum("real_tokens"), self.cards_sum("padded_tokens")) or 0.0

    @property
    def budget_fill(self) -> float:
        room = sum(c.fill_batches * c.budget for c in self.cards.values())
        return budget_fill(self.cards_sum("fill_padded_tokens"), room) or 0.0

    @property
    def batches(self) -> int:
        return self.cards_sum("batches")

    @property
    def shape_switches(self) -> int:
        return self.cards_sum("shape_switches")

    @property
    def cache_hit_rate(self) -> float:
        return self.cards_sum("cache_hits") / self.batches if self.batches else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.cards_sum("output_tokens") / self.makespan_s if self.makespan_s else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        """Prompt tokens completed and output tokens generated, per second of makespan."""
        total = self.completed_tokens + self.cards_sum("output_tokens")
        return total / self.makespan_s if self.makespan_s else 0.0

    def latency_ms(self, q: float) -> float | None:
        """The ``q`` quantile of dispatch-to-completion times (None without an ok item)."""
        return percentile(self.latencies_ms, q) if self.latencies_ms else None

    @property
    def cached_share_of_prefix(self) -> float | None:
        """Cached prompt tokens over what a perfect cache could serve (None when that is unknown)."""
        return self.cards_sum("cached_prompt_tokens") / self.prefix_tokens if self.prefix_tokens else None

    @property
    def cached_prompt_share(self) -> float | None:
        """Measured: completed prompt tokens served from the engines' prefix caches, over all of them."""
        return cached_prompt_share(self.cards_sum("cached_prompt_tokens"), self.cards_sum("prefill_tokens"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "topic_prefix": self.topic_prefix,
            "items": self.items,
            "tokens": self.tokens,
            "prompt_tokens": self.tokens,
            "prefix_tokens": self.prefix_tokens,
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
            "mixed_shape_batches": self.cards_sum("mixed_shape_batches"),
            "cache_hit_rate": round(self.cache_hit_rate, 6),
            "cache_hits_source": f"modelled: LRU of {CACHE_SHAPES} shapes per card over the batches",
            "cached_prompt_tokens": self.cards_sum("cached_prompt_tokens"),
            "prefill_tokens": self.cards_sum("prefill_tokens"),
            "cached_prompt_share": _rounded(self.cached_prompt_share),
            "output_tokens": self.cards_sum("output_tokens"),
            "cached_share_of_prefix": _rounded(self.cached_share_of_prefix),
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
            "total_tokens": self.tokens + self.cards_sum("output_tokens"),
            "total_tokens_per_s": round(self.total_tokens_per_s, 1),
            "dispatch_to_completion_p50_ms": self.latency_ms(0.5),
            "dispatch_to_completion_p99_ms": self.latency_ms(0.99),
            "cards": {name: c.to_dict() for name, c in self.cards.items()},
        }


def _rounded(share: float | None) -> float | None:
    return None if share is None else round(share, 6)


@dataclass(frozen=True, slots=True)
class _Batch:
    card: str
    batch_id: str
    completed_ms: int
    padded_length: int
    real_tokens: int
    shapes: frozenset[int]
    items: int
    cached_prompt_tokens: int = 0
    prefill_tokens: int = 0
    output_tokens: int = 0


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
    produced: dict[str, int] = {}
    first_ms: int | None = None
    for msg in read_topic(conf, topics.ingest):
        rec = decode_token_item(msg.value())
        shape[rec.item_id] = rec.shape
        tokens[rec.item_id] = rec.token_count
        produced[rec.item_id] = rec.produced_ms
        first_ms = rec.produced_ms if first_ms is None else min(first_ms, rec.produced_ms)
    out.items, out.tokens = len(tokens), sum(tokens.values())
    outcomes: Counter[str] = Counter()
    ok: set[str] = set()
    grouped: dict[str, list[CompletionRecord]] = {}
    last_ms = first_ms or 0
    for msg in read_topic(conf, topics.results):
        for done in decode_completions(msg.value()):
            outcomes[done.item_id] += 1
            if outcomes[done.item_id] > 1:
                continue
            if done.status == "ok":
                ok.add(done.item_id)
                out.completed_tokens += done.input_tokens
                dispatched = produced.get(done.item_id, done.completed_ms) + done.queued_ms
                out.latencies_ms.append(max(0, done.completed_ms - dispatched))
            else:
                out.items_failed += 1
            last_ms = max(last_ms, done.completed_ms)
            grouped.setdefault(done.batch_id, []).append(done)
    out.items_completed_once = sum(1 for i in tokens if outcomes[i] == 1 and i in ok)
    out.duplicate_completions = sum(n - 1 for n in outcomes.values() if n > 1)
    out.lost_items = sum(1 for i in tokens if outcomes[i] == 0)
    out.makespan_s = (last_ms - first_ms) / 1000.0 if first_ms is not None else 0.0
    out.latencies_ms.sort()
    batches = [_batch(batch_id, recs, shape) for batch_id, recs in grouped.items()]
    for name, budget in budgets.items():
        out.cards[name] = _card(
            sorted((b for b in batches if b.card == name), key=lambda b: (b.completed_ms, b.batch_id)),
            budget,
            cache_shapes,
        )
    return out


def _batch(batch_id: str, recs: Sequence[CompletionRecord], shape: Mapping[str, int]) -> _Batch:
    """A batch as its first completions tell it; prompts and output of its ok items only."""
    served = [prompt_split(r.input_tokens, r.cached_tokens) for r in recs if r.status == "ok"]
    return _Batch(
        recs[0].consumer,
        batch_id,
        max(r.completed_ms for r in recs),
        recs[0].padded_tokens,
        sum(r.input_tokens for r in recs),
        frozenset(shape.get(r.item_id, 0) for r in recs),
        len(recs),
        sum(cached for cached, _computed in served),
        sum(computed for _cached, computed in served),
        sum(r.output_tokens for r in recs if r.status == "ok"),
    )


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
        f.cached_prompt_tokens += b.cached_prompt_tokens
        f.prefill_tokens += b.prefill_tokens
        f.output_tokens += b.output_tokens
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
    """Counts the distinct items completed on a results topic (read_committed) as it grows.

    ``topic`` is a pipeline's ``<prefix>.results`` (processor.kafka.topics); the watcher's group id
    is ``<prefix>-demo-watcher``, so one prefixed ACL covers every name a pipeline uses."""

    def __init__(self, conf: Mapping[str, str], topic: str) -> None:
        prefix = topic.removesuffix(".results")
        self._consumer = KAFKA.consumer(
            {
                **conf,
                "group.id": f"{prefix}-demo-watcher",
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
