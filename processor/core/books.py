"""The ledger's books and equations: what one model, consumer or job has at each stage, and the sums
that must balance (processor/core/accounting.py's docstring says which and why).

Kept apart from the :class:`~processor.core.accounting.Ledger` that writes them, so the checks, the
metrics' imbalance gauges and the audit ask the same equations; counters only, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from processor.core.ledger_keys import Scope, keys_of, stage_unit


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
    adopted_queued: Tally
    adopted_in_flight: Tally
    released_queued: Tally
    released_in_flight: Tally
    duplicate: Tally
    """A producer's repeats of an item id within the dedupe window: dead-lettered, never received,
    so outside both equations."""
    cancelled: Tally
    """Items of a cancelled job that left the lanes undispatched (``Scheduler.end_job``): answered by
    the processor with a ``cancelled`` completion, never routed."""
    expired: Tally
    """Items of a job whose deadline passed before they were dispatched: as ``cancelled``, status
    ``expired``."""
    retried: Tally
    """Items that came back failed with a retriable reason (``Scheduler.items_done(retriable=...)``)
    and went back to the lanes for another attempt: they leave ``in_flight`` on the right of
    ``ROUTED`` and come back to ``queued`` on the left of ``RECEIVED``. Each retry counts once, so an
    item tried three times counts 2 here; its tokens are counted on every ``routed``."""
    cached_prompt_tokens: int = 0
    """Prompt tokens of completed items the engine served from its prefix cache."""
    prefill_tokens: int = 0
    """Prompt tokens of completed items the engine computed: ``completed.tokens - cached_prompt_tokens``."""

    @classmethod
    def empty(cls) -> ModelBook:
        t = Tally  # one per stage (written out: the int counters follow them)
        return cls(t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t())


@dataclass(slots=True)
class ConsumerBook:
    routed: Tally
    completed: Tally
    failed: Tally
    in_flight: Tally
    redelivered: Tally
    adopted_in_flight: Tally
    released_in_flight: Tally
    retried: Tally
    """Items its engine failed with a retriable reason that went back to the lanes (``ModelBook.retried``)."""
    batches: int = 0
    padded_tokens: int = 0
    oversized: int = 0
    oversized_padded_tokens: int = 0
    """Padded tokens of the single-item batches too long for the budget (``oversized``), which
    ``padded_tokens`` includes: a budget fill is ``padded_tokens`` less these over the other batches."""
    cache_hits: int = 0
    cache_lookups: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens of completed items its engine served from its prefix cache."""
    prefill_tokens: int = 0
    """Prompt tokens of completed items its engine computed."""

    @classmethod
    def empty(cls) -> ConsumerBook:
        return cls(Tally(), Tally(), Tally(), Tally(), Tally(), Tally(), Tally(), Tally())


@dataclass(slots=True)
class JobBook(ModelBook):
    """One job's items and tokens at each stage, over all its models, counted as a model's book counts
    them (``duplicate``: the job's producer repeats), and the padding its batches cost."""

    batches: int = 0
    padded_tokens: int = 0

    @classmethod
    def empty(cls) -> JobBook:
        t = Tally  # one per ModelBook stage (written out: the int counters follow them)
        return cls(t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t())


class BatchBooks:
    """The books one batch event of a (model, consumer, job) writes (None: its name was None, no
    book), with their tallies gathered stage by stage: ``routed`` holds the model's, consumer's and
    job's ``routed``, ``queued`` the model's and job's ``queued`` (a consumer has no such stage).
    The ledger keeps one per triple (``Ledger.batch_routed``), so an event moves each stage's
    tallies in a loop over ``Tally`` objects, with no lookup per book and no call.

    Safe to keep only because a book and its tallies, once made, stay the same objects for the
    ledger's life: every writer (``move_tally``, ``restore_counter``) writes into them."""

    __slots__ = (
        "adopted_queued",
        "books",
        "completed",
        "consumer",
        "failed",
        "in_flight",
        "job",
        "queued",
        "received",
        "routed",
    )

    def __init__(self, model: ModelBook | None, consumer: ConsumerBook | None, job: JobBook | None) -> None:
        self.consumer = consumer
        self.job = job
        waiting = [b for b in (model, job) if b is not None]  # the books with RECEIVED's stages
        self.books: tuple[ModelBook | ConsumerBook, ...] = tuple(
            b for b in (model, consumer, job) if b is not None
        )
        self.received = tuple(b.received for b in waiting)
        self.adopted_queued = tuple(b.adopted_queued for b in waiting)
        self.queued = tuple(b.queued for b in waiting)
        self.routed = tuple(b.routed for b in self.books)
        self.in_flight = tuple(b.in_flight for b in self.books)
        self.completed = tuple(b.completed for b in self.books)
        self.failed = tuple(b.failed for b in self.books)


HANDOVER = ("adopted_queued", "adopted_in_flight", "released_queued", "released_in_flight")
ENDINGS = ("cancelled", "expired")
"""How a waiting item leaves the lanes without being routed (its job was cancelled, or its deadline
passed): a stage of models and jobs each, on the right of ``RECEIVED``."""
STAGES = (
    "received",
    "queued",
    "routed",
    "completed",
    "failed",
    "in_flight",
    *HANDOVER,
    "duplicate",
    *ENDINGS,
    "retried",
)
PROMPT_COUNTERS = ("cached_prompt_tokens", "prefill_tokens")
"""How completed prompts were served, in every book (``PROMPTS``): from the prefix cache, or computed."""
JOB_COUNTERS = ("batches", "padded_tokens")
"""A job book's counters beside its stages (and ``PROMPT_COUNTERS``)."""
CONSUMER_COUNTERS = (
    "batches",
    "padded_tokens",
    "oversized",
    "oversized_padded_tokens",
    "cache_hits",
    "cache_lookups",
)
"""A consumer book's counters beside its stages (and ``PROMPT_COUNTERS``)."""
CONSUMER_STAGES = (
    "routed",
    "completed",
    "failed",
    "in_flight",
    "redelivered",
    "adopted_in_flight",
    "released_in_flight",
    "retried",
)


def stage_counters(stages: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"{stage}_{unit}" for stage in stages for unit in ("items", "tokens"))


STAGE_COUNTERS = stage_counters(STAGES)
CONSUMER_SNAPSHOT = (*stage_counters(CONSUMER_STAGES), *CONSUMER_COUNTERS)
JOB_SNAPSHOT = (*STAGE_COUNTERS, *JOB_COUNTERS)


@dataclass(frozen=True, slots=True)
class Equation:
    """One of the ledger's two equations, ``sum(left) = sum(right)`` over a book's stages.

    The only place either is written: :meth:`Ledger.check` and :meth:`Ledger.check_jobs` hold every
    book to both, and the metrics publish each one's :meth:`gap` (0 while it holds)."""

    name: str
    left: tuple[str, ...]
    right: tuple[str, ...]

    def gap(self, book: ModelBook | ConsumerBook) -> Tally:
        """Left side minus right side, items and tokens: zero in both while the equation holds."""
        gap = Tally()
        for stage in self.left:
            t: Tally = getattr(book, stage)
            gap.add(t.items, t.tokens)
        for stage in self.right:
            t = getattr(book, stage)
            gap.add(-t.items, -t.tokens)
        return gap

    def check(self, where: str, book: ModelBook | ConsumerBook) -> None:
        """Raise ``LedgerImbalance`` with both sides when the equation fails for ``book``."""
        balance(
            where,
            "+".join(self.left),
            sum_tallies(getattr(book, stage) for stage in self.left),
            "+".join(self.right),
            (getattr(book, stage) for stage in self.right),
        )


RECEIVED = Equation(
    "received",
    ("received", "adopted_queued", "retried"),
    ("queued", "routed", *ENDINGS, "released_queued"),
)
"""What arrived (or was adopted, or came back to be tried again) waits, went out, ended unrouted
(cancelled or expired), or was handed over: models and jobs."""

ROUTED = Equation(
    "routed",
    ("routed", "adopted_in_flight"),
    ("completed", "in_flight", "failed", "retried", "released_in_flight"),
)
"""What went out (or was adopted in flight) completed, is in flight, failed, came back to be tried
again, or was handed over: models, jobs and consumers."""


def prompt_split(input_tokens: int, cached_tokens: int) -> tuple[int, int]:
    """``(cached, computed)`` prompt tokens of one answer: the engine's reported cached count held to
    ``[0, input_tokens]``, and the rest, the prefill the engine computed. The one formula every report
    (the consumer app, the ledger, the audit, the demo's read-back) uses."""
    cached = min(max(cached_tokens, 0), input_tokens)
    return cached, input_tokens - cached


def cached_prompt_share(cached_tokens: int, prefill_tokens: int) -> float | None:
    """The share of completed prompt tokens served from the prefix cache; None when none completed."""
    prompt_tokens = cached_tokens + prefill_tokens
    return cached_tokens / prompt_tokens if prompt_tokens > 0 else None


def check_prompts(where: str, book: ModelBook | ConsumerBook) -> None:
    """``PROMPTS`` for ``book``: its completed tokens are its cached plus its computed prompt tokens."""
    balance(
        where,
        "completed",
        Tally(book.completed.items, book.completed.tokens),
        "cached_prompt+prefill",
        (Tally(0, book.cached_prompt_tokens), Tally(book.completed.items, book.prefill_tokens)),
    )


def book_prompts(book: ModelBook | ConsumerBook, ok_tokens: int, cached_tokens: int) -> None:
    cached, computed = prompt_split(ok_tokens, cached_tokens)
    book.cached_prompt_tokens += cached
    book.prefill_tokens += computed


def prompt_keys(book: ModelBook | ConsumerBook, scope: Scope, owner: str) -> dict[str, int]:
    """A book's prompt counters, keyed for ``scope`` and ``owner`` (processor.core.ledger_keys)."""
    values = [getattr(book, k) for k in PROMPT_COUNTERS]
    return dict(zip(keys_of(PROMPT_COUNTERS, scope, owner), values, strict=True))


def stage_values(book: ModelBook | ConsumerBook, stages: Iterable[str]) -> list[int]:
    """Items then tokens of each stage, in the order of ``stage_counters(stages)``."""
    values: list[int] = []
    for stage in stages:
        t: Tally = getattr(book, stage)
        values += (t.items, t.tokens)
    return values


def restore_counter(book: ModelBook | ConsumerBook, counter: str, value: int) -> None:
    """Set one counter of ``book``: a stage's items or tokens (``routed_tokens``), else a plain
    counter (``padded_tokens``, which merely ends in _tokens)."""
    split = stage_unit(counter)
    if split is not None and is_stage(book, counter):
        setattr(getattr(book, split[0]), split[1], value)
    else:
        setattr(book, counter, value)


def is_stage(book: ModelBook | ConsumerBook, counter: str) -> bool:
    """``counter`` is the items or tokens of one of ``book``'s stages (a ``Tally``)."""
    split = stage_unit(counter)
    return split is not None and isinstance(getattr(book, split[0], None), Tally)


def balance(where: str, left_name: str, left: Tally, right_name: str, parts: Iterable[Tally]) -> None:
    items = tokens = 0
    for p in parts:
        items += p.items
        tokens += p.tokens
    if (left.items, left.tokens) != (items, tokens):
        raise LedgerImbalance(
            f"{where} out of balance: {left_name} {left.items:,} items / {left.tokens:,} tokens, "
            f"{right_name} {items:,} items / {tokens:,} tokens"
        )


def move_tally(source: Tally, target: Tally) -> None:
    target.add(source.items, source.tokens)
    source.items = source.tokens = 0


def sum_tallies(tallies: Iterable[Tally]) -> Tally:
    out = Tally()
    for t in tallies:
        out.add(t.items, t.tokens)
    return out
