"""The token ledger: every item and token counted where it is, so a leak is a difference of two sums.

Two equations hold at every instant, in items and in tokens, per model and in total:

    received = queued + routed
    routed   = completed + in_flight + failed

``queued`` and ``in_flight`` are kept as running counters *and* can be recounted from the structures
that hold the items (the lanes, the scheduler's in-flight batches): ``Scheduler.check`` compares the
two, which is how a phantom (a counter that says items wait that are not there) is caught.

Counters only; no I/O. A snapshot is a flat ``dict[str, int]`` so it can be checkpointed to a
compacted topic and compared by an audit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields


class LedgerImbalance(AssertionError):
    """The ledger's equations do not hold; the message carries both sides."""


@dataclass(slots=True)
class Tally:
    """Items and tokens at one stage of one model or consumer."""

    items: int = 0
    tokens: int = 0

    def add(self, items: int, tokens: int) -> None:
        self.items += items
        self.tokens += tokens


@dataclass(slots=True)
class ModelBook:
    received: Tally
    queued: Tally
    routed: Tally
    completed: Tally
    failed: Tally
    in_flight: Tally

    @classmethod
    def empty(cls) -> ModelBook:
        return cls(*(Tally() for _ in fields(cls)))


@dataclass(slots=True)
class ConsumerBook:
    routed: Tally
    completed: Tally
    failed: Tally
    in_flight: Tally
    redelivered: Tally
    batches: int = 0
    padded_tokens: int = 0
    oversized: int = 0
    cache_hits: int = 0
    cache_lookups: int = 0

    @classmethod
    def empty(cls) -> ConsumerBook:
        return cls(Tally(), Tally(), Tally(), Tally(), Tally())


STAGES = ("received", "queued", "routed", "completed", "failed", "in_flight")


class Ledger:
    """Counts per model and per consumer; the scheduler is its only writer."""

    def __init__(self) -> None:
        self.models: dict[str, ModelBook] = {}
        self.consumers: dict[str, ConsumerBook] = {}
        self.dead_lettered = 0

    def _model(self, model: str) -> ModelBook:
        book = self.models.get(model)
        if book is None:
            book = self.models[model] = ModelBook.empty()
        return book

    def consumer(self, consumer: str) -> ConsumerBook:
        book = self.consumers.get(consumer)
        if book is None:
            book = self.consumers[consumer] = ConsumerBook.empty()
        return book

    # -- events ---------------------------------------------------------------------------------

    def received(self, model: str, tokens: int) -> None:
        book = self._model(model)
        book.received.add(1, tokens)
        book.queued.add(1, tokens)

    def routed(
        self, model: str, consumer: str, items: int, tokens: int, padded_tokens: int, oversized: bool
    ) -> None:
        book = self._model(model)
        book.queued.add(-items, -tokens)
        book.routed.add(items, tokens)
        book.in_flight.add(items, tokens)
        c = self.consumer(consumer)
        c.routed.add(items, tokens)
        c.in_flight.add(items, tokens)
        c.batches += 1
        c.padded_tokens += padded_tokens
        c.oversized += oversized

    def finished(
        self, model: str, consumer: str, ok_items: int, ok_tokens: int, failed_items: int, failed_tokens: int
    ) -> None:
        """A batch came back: some items completed, the rest failed."""
        book = self._model(model)
        c = self.consumer(consumer)
        items, tokens = ok_items + failed_items, ok_tokens + failed_tokens
        book.in_flight.add(-items, -tokens)
        c.in_flight.add(-items, -tokens)
        book.completed.add(ok_items, ok_tokens)
        c.completed.add(ok_items, ok_tokens)
        book.failed.add(failed_items, failed_tokens)
        c.failed.add(failed_items, failed_tokens)

    def requeued(self, model: str, consumer: str, items: int, tokens: int) -> None:
        """A batch came back undone (its consumer left): its items wait again and count as redelivered."""
        book = self._model(model)
        c = self.consumer(consumer)
        book.in_flight.add(-items, -tokens)
        c.in_flight.add(-items, -tokens)
        book.routed.add(-items, -tokens)
        c.routed.add(-items, -tokens)
        book.queued.add(items, tokens)
        c.redelivered.add(items, tokens)

    def cache(self, consumer: str, hit: bool) -> None:
        c = self.consumer(consumer)
        c.cache_lookups += 1
        c.cache_hits += hit

    # -- totals and checks ----------------------------------------------------------------------

    def total(self, stage: str) -> Tally:
        out = Tally()
        for book in self.models.values():
            t: Tally = getattr(book, stage)
            out.add(t.items, t.tokens)
        return out

    def check(self) -> None:
        """Raise ``LedgerImbalance`` with both sides if either equation fails anywhere."""
        for model, b in self.models.items():
            _balance(f"model {model}", "received", b.received, "queued+routed", (b.queued, b.routed))
            _balance(
                f"model {model}",
                "routed",
                b.routed,
                "completed+in_flight+failed",
                (b.completed, b.in_flight, b.failed),
            )
        for name, c in self.consumers.items():
            _balance(
                f"consumer {name}",
                "routed",
                c.routed,
                "completed+in_flight+failed",
                (c.completed, c.in_flight, c.failed),
            )
        for stage in ("routed", "completed", "failed", "in_flight"):
            by_model = self.total(stage)
            by_consumer = Tally()
            for c in self.consumers.values():
                t = getattr(c, stage)
                by_consumer.add(t.items, t.tokens)
            _balance("ledger", f"{stage} by model", by_model, f"{stage} by consumer", (by_consumer,))

    def snapshot(self) -> dict[str, int]:
        """Flat counters: ``stage_items``/``stage_tokens`` totals, then ``@model``/``#consumer`` keys."""
        out: dict[str, int] = {"dead_lettered_items": self.dead_lettered}
        for stage in STAGES:
            t = self.total(stage)
            out[f"{stage}_items"] = t.items
            out[f"{stage}_tokens"] = t.tokens
        for model, b in self.models.items():
            for stage in STAGES:
                t = getattr(b, stage)
                out[f"{stage}_items@{model}"] = t.items
                out[f"{stage}_tokens@{model}"] = t.tokens
        for name, c in self.consumers.items():
            for stage in ("routed", "completed", "failed", "in_flight", "redelivered"):
                t = getattr(c, stage)
                out[f"{stage}_items#{name}"] = t.items
                out[f"{stage}_tokens#{name}"] = t.tokens
            for counter in ("batches", "padded_tokens", "oversized", "cache_hits", "cache_lookups"):
                out[f"{counter}#{name}"] = getattr(c, counter)
        return out

    @classmethod
    def restore(cls, snapshot: dict[str, int]) -> Ledger:
        """Rebuild a ledger from ``snapshot`` (the inverse of ``snapshot``)."""
        ledger = cls()
        ledger.dead_lettered = snapshot.get("dead_lettered_items", 0)
        for key, value in snapshot.items():
            for sep, getter in (("@", ledger._model), ("#", ledger.consumer)):
                if sep not in key:
                    continue
                name, owner = key.split(sep, 1)
                book = getter(owner)
                stage, _, unit = name.rpartition("_")
                # a Tally stage (``routed_tokens``), not a plain counter that merely ends in _tokens
                if unit in ("items", "tokens") and isinstance(getattr(book, stage, None), Tally):
                    setattr(getattr(book, stage), unit, value)
                else:
                    setattr(book, name, value)
                break
        return ledger


def _balance(where: str, left_name: str, left: Tally, right_name: str, parts: Iterable[Tally]) -> None:
    items = tokens = 0
    for p in parts:
        items += p.items
        tokens += p.tokens
    if (left.items, left.tokens) != (items, tokens):
        raise LedgerImbalance(
            f"{where} out of balance: {left_name} {left.items:,} items / {left.tokens:,} tokens, "
            f"{right_name} {items:,} items / {tokens:,} tokens"
        )


def sum_tallies(tallies: Iterable[Tally]) -> Tally:
    out = Tally()
    for t in tallies:
        out.add(t.items, t.tokens)
    return out
