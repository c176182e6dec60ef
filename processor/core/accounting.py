"""The token ledger: every item and token counted where it is, so a leak is a difference of two sums.

Two equations hold at every instant, in items and in tokens, per model and in total:

    received + adopted_queued  = queued + routed + released_queued
    routed   + adopted_in_flight = completed + in_flight + failed + released_in_flight

They are written once, as ``RECEIVED`` and ``ROUTED`` (:class:`Equation`): the checks below and the
metrics' imbalance gauges both ask them.

The ``adopted``/``released`` terms are state that moved between processor instances with its ingest
partitions (a rebalance, or a restart: docs/reliability.md): the instance that gives up a partition
releases what waited or was in flight there, the one that takes it adopts what the changelog holds.
A single instance that never hands anything over has all four at zero, or equal pairs after a
restart. Across instances, ``Σ queued - (Σ adopted_queued - Σ released_queued)`` is what waits
even while a crashed instance's last checkpoint still claims what another one adopted.

``queued`` and ``in_flight`` are kept as running counters *and* can be recounted from the structures
that hold the items (the lanes, the scheduler's in-flight batches): ``Scheduler.check`` compares the
two, which is how a phantom (a counter that says items wait that are not there) is caught.

The same two equations hold per job (``JobBook``: a job's cost in tokens, padding included), and the
jobs' books sum to the models' (``check``). The job of an item that names none is "".

A producer's repeat of an item id (``duplicate``) is dead-lettered, never received: it is counted
beside the equations, in ``dead_lettered`` too.

Counters only; no I/O. A snapshot is a flat ``dict[str, int]`` so it can be checkpointed to a
compacted topic and compared by an audit; its keys' grammar is processor.core.ledger_keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from processor.core.ledger_keys import keys_of, parse_key, stage_unit


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
    adopted_in_flight: Tally
    released_in_flight: Tally
    batches: int = 0
    padded_tokens: int = 0
    oversized: int = 0
    oversized_padded_tokens: int = 0
    """Padded tokens of the single-item batches too long for the budget (``oversized``), which
    ``padded_tokens`` includes: a budget fill is ``padded_tokens`` less these over the other batches."""
    cache_hits: int = 0
    cache_lookups: int = 0

    @classmethod
    def empty(cls) -> ConsumerBook:
        return cls(Tally(), Tally(), Tally(), Tally(), Tally(), Tally(), Tally())


@dataclass(slots=True)
class JobBook(ModelBook):
    """One job's items and tokens at each stage, over all its models, counted as a model's book counts
    them (``duplicate``: the job's producer repeats), and the padding its batches cost."""

    batches: int = 0
    padded_tokens: int = 0

    @classmethod
    def empty(cls) -> JobBook:
        t = Tally  # one per ModelBook stage (written out: the int counters follow them)
        return cls(t(), t(), t(), t(), t(), t(), t(), t(), t(), t(), t())


HANDOVER = ("adopted_queued", "adopted_in_flight", "released_queued", "released_in_flight")
STAGES = ("received", "queued", "routed", "completed", "failed", "in_flight", *HANDOVER, "duplicate")
JOB_COUNTERS = ("batches", "padded_tokens")
"""A job book's counters beside its stages (in ``JobBook``'s order)."""
CONSUMER_COUNTERS = (
    "batches",
    "padded_tokens",
    "oversized",
    "oversized_padded_tokens",
    "cache_hits",
    "cache_lookups",
)
"""A consumer book's counters beside its stages."""
CONSUMER_STAGES = (
    "routed",
    "completed",
    "failed",
    "in_flight",
    "redelivered",
    "adopted_in_flight",
    "released_in_flight",
)


def _stage_counters(stages: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"{stage}_{unit}" for stage in stages for unit in ("items", "tokens"))


_STAGE_COUNTERS = _stage_counters(STAGES)
_CONSUMER_SNAPSHOT = (*_stage_counters(CONSUMER_STAGES), *CONSUMER_COUNTERS)
_JOB_SNAPSHOT = (*_STAGE_COUNTERS, *JOB_COUNTERS)


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
        _balance(
            where,
            "+".join(self.left),
            sum_tallies(getattr(book, stage) for stage in self.left),
            "+".join(self.right),
            (getattr(book, stage) for stage in self.right),
        )


RECEIVED = Equation("received", ("received", "adopted_queued"), ("queued", "routed", "released_queued"))
"""What arrived (or was adopted) waits, went out, or was handed over: models and jobs."""

ROUTED = Equation(
    "routed",
    ("routed", "adopted_in_flight"),
    ("completed", "in_flight", "failed", "released_in_flight"),
)
"""What went out (or was adopted in flight) completed, is in flight, failed, or was handed over:
models, jobs and consumers."""


class Ledger:
    """Counts per model and per consumer; the scheduler is its only writer."""

    def __init__(self) -> None:
        self.models: dict[str, ModelBook] = {}
        self.consumers: dict[str, ConsumerBook] = {}
        self.jobs: dict[str, JobBook] = {}
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

    def job(self, job: str) -> JobBook:
        book = self.jobs.get(job)
        if book is None:
            book = self.jobs[job] = JobBook.empty()
        return book

    # -- events ---------------------------------------------------------------------------------

    def received(self, model: str, tokens: int, items: int = 1) -> None:
        book = self._model(model)
        book.received.add(items, tokens)
        book.queued.add(items, tokens)

    def duplicate(self, model: str, tokens: int, job: str = "") -> None:
        """A repeat of an item id already taken: dead-lettered instead of received."""
        self._model(model).duplicate.add(1, tokens)
        self.job(job).duplicate.add(1, tokens)
        self.dead_lettered += 1

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
        if oversized:
            c.oversized_padded_tokens += padded_tokens

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

    def adopted_waiting(self, model: str, tokens: int, items: int = 1) -> None:
        """Items another instance (or this one before a restart) counted now wait here."""
        book = self._model(model)
        book.queued.add(items, tokens)
        book.adopted_queued.add(items, tokens)

    def adopted_in_flight(self, model: str, consumer: str, items: int, tokens: int) -> None:
        """Outstanding items of a batch another instance routed; they finish here."""
        book = self._model(model)
        c = self.consumer(consumer)
        for t in (book.in_flight, book.adopted_in_flight, c.in_flight, c.adopted_in_flight):
            t.add(items, tokens)

    def release_all(self) -> None:
        """Give up everything waiting and in flight (its partitions go, or are about to be restored):
        the counts move to ``released_*`` so the equations keep holding."""
        for book in self.models.values():
            _move(book.queued, book.released_queued)
            _move(book.in_flight, book.released_in_flight)
        for c in self.consumers.values():
            _move(c.in_flight, c.released_in_flight)
        self._release_jobs()

    def handover_delta(self) -> dict[str, tuple[int, int]]:
        """Per model: (items, tokens) adopted minus released, waiting and in flight together."""
        out: dict[str, tuple[int, int]] = {}
        for model, b in self.models.items():
            items = b.adopted_queued.items + b.adopted_in_flight.items
            items -= b.released_queued.items + b.released_in_flight.items
            tokens = b.adopted_queued.tokens + b.adopted_in_flight.tokens
            tokens -= b.released_queued.tokens + b.released_in_flight.tokens
            out[model] = (items, tokens)
        return out

    def cache(self, consumer: str, hit: bool) -> None:
        c = self.consumer(consumer)
        c.cache_lookups += 1
        c.cache_hits += hit

    # -- per-job events (the scheduler calls one beside each model event above) ------------------

    def job_received(self, job: str, items: int, tokens: int, adopted: bool = False) -> None:
        book = self.jobs.get(job) or self.job(job)  # once per item: the lookup inlined
        t = book.adopted_queued if adopted else book.received
        t.items += items
        t.tokens += tokens
        t = book.queued
        t.items += items
        t.tokens += tokens

    def job_routed(self, job: str, items: int, tokens: int, padded_tokens: int) -> None:
        book = self.job(job)
        book.queued.add(-items, -tokens)
        book.routed.add(items, tokens)
        book.in_flight.add(items, tokens)
        book.batches += 1
        book.padded_tokens += padded_tokens

    def job_finished(
        self, job: str, ok_items: int, ok_tokens: int, failed_items: int, failed_tokens: int
    ) -> None:
        book = self.job(job)
        book.in_flight.add(-ok_items - failed_items, -ok_tokens - failed_tokens)
        book.completed.add(ok_items, ok_tokens)
        book.failed.add(failed_items, failed_tokens)

    def job_requeued(self, job: str, items: int, tokens: int) -> None:
        book = self.job(job)
        book.in_flight.add(-items, -tokens)
        book.routed.add(-items, -tokens)
        book.queued.add(items, tokens)

    def job_adopted_in_flight(self, job: str, items: int, tokens: int) -> None:
        book = self.job(job)
        book.in_flight.add(items, tokens)
        book.adopted_in_flight.add(items, tokens)

    def _release_jobs(self) -> None:
        for book in self.jobs.values():
            _move(book.queued, book.released_queued)
            _move(book.in_flight, book.released_in_flight)

    def check_jobs(self) -> None:
        """Both equations per job, and the jobs' books summing to the models' at every stage
        (``Scheduler.check`` asks after comparing the models' books with the lanes).

        Skipped while no job has a book: a ledger restored from a checkpoint written before jobs were
        counted has none, and counts its jobs from then on only once it starts afresh."""
        if not self.jobs:
            return
        for job, b in self.jobs.items():
            RECEIVED.check(f"job {job!r}", b)
            ROUTED.check(f"job {job!r}", b)
        for stage in STAGES:
            by_jobs = sum_tallies(getattr(b, stage) for b in self.jobs.values())
            _balance("ledger", f"{stage} by model", self.total(stage), f"{stage} by job", (by_jobs,))

    def job_snapshot(self) -> dict[str, int]:
        """Per-job counters, keyed ``job:<stage>_items:<job>`` (processor.core.ledger_keys)."""
        out: dict[str, int] = {}
        for job, b in self.jobs.items():
            values = [*_stage_values(b, STAGES), b.batches, b.padded_tokens]
            out.update(zip(keys_of(_JOB_SNAPSHOT, "job", job), values, strict=True))
        return out

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
            RECEIVED.check(f"model {model}", b)
            ROUTED.check(f"model {model}", b)
        for name, c in self.consumers.items():
            ROUTED.check(f"consumer {name}", c)
        for stage in (
            "routed",
            "completed",
            "failed",
            "in_flight",
            "adopted_in_flight",
            "released_in_flight",
        ):
            by_model = self.total(stage)
            by_consumer = Tally()
            for c in self.consumers.values():
                t = getattr(c, stage)
                by_consumer.add(t.items, t.tokens)
            _balance("ledger", f"{stage} by model", by_model, f"{stage} by consumer", (by_consumer,))

    def snapshot(self) -> dict[str, int]:
        """Flat counters: ``stage_items``/``stage_tokens`` totals, then per model, consumer and job
        (the keys' grammar: processor.core.ledger_keys)."""
        out: dict[str, int] = {"dead_lettered_items": self.dead_lettered}
        for stage in STAGES:
            t = self.total(stage)
            out[f"{stage}_items"] = t.items
            out[f"{stage}_tokens"] = t.tokens
        for model, b in self.models.items():
            out.update(zip(keys_of(_STAGE_COUNTERS, "model", model), _stage_values(b, STAGES), strict=True))
        for name, c in self.consumers.items():
            values = _stage_values(c, CONSUMER_STAGES) + [getattr(c, k) for k in CONSUMER_COUNTERS]
            out.update(zip(keys_of(_CONSUMER_SNAPSHOT, "consumer", name), values, strict=True))
        out.update(self.job_snapshot())
        return out

    @classmethod
    def restore(cls, snapshot: dict[str, int]) -> Ledger:
        """Rebuild a ledger from ``snapshot`` (the inverse of ``snapshot``)."""
        ledger = cls()
        ledger.dead_lettered = snapshot.get("dead_lettered_items", 0)
        for key, value in snapshot.items():
            parsed = parse_key(key)
            book: ModelBook | ConsumerBook
            if parsed.scope == "job":
                book = ledger.job(parsed.owner)  # a job the checkpoint names only by its share too
                if not _is_stage(book, parsed.counter) and parsed.counter not in JOB_COUNTERS:
                    continue  # the share policy's gauges (``job:weight_milli:<job>``): not the ledger's
            elif parsed.scope == "model":
                book = ledger._model(parsed.owner)
            elif parsed.scope == "consumer":
                book = ledger.consumer(parsed.owner)
            else:
                continue
            _restore_counter(book, parsed.counter, value)
        return ledger

    def adopt_unbooked_jobs(self) -> None:
        """A checkpoint written before jobs were counted has model books and no job books: its
        counts go to job "" (no job), so the per-job equations hold from the first new item on."""
        if self.jobs or not self.models:
            return
        book = self.job("")
        for stage in STAGES:
            t = sum_tallies(getattr(b, stage) for b in self.models.values())
            getattr(book, stage).add(t.items, t.tokens)


def _stage_values(book: ModelBook | ConsumerBook, stages: Iterable[str]) -> list[int]:
    """Items then tokens of each stage, in the order of ``_stage_counters(stages)``."""
    values: list[int] = []
    for stage in stages:
        t: Tally = getattr(book, stage)
        values += (t.items, t.tokens)
    return values


def _restore_counter(book: ModelBook | ConsumerBook, counter: str, value: int) -> None:
    """Set one counter of ``book``: a stage's items or tokens (``routed_tokens``), else a plain
    counter (``padded_tokens``, which merely ends in _tokens)."""
    split = stage_unit(counter)
    if split is not None and _is_stage(book, counter):
        setattr(getattr(book, split[0]), split[1], value)
    else:
        setattr(book, counter, value)


def _is_stage(book: ModelBook | ConsumerBook, counter: str) -> bool:
    """``counter`` is the items or tokens of one of ``book``'s stages (a ``Tally``)."""
    split = stage_unit(counter)
    return split is not None and isinstance(getattr(book, split[0], None), Tally)


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


def _move(source: Tally, target: Tally) -> None:
    target.add(source.items, source.tokens)
    source.items = source.tokens = 0


def sum_tallies(tallies: Iterable[Tally]) -> Tally:
    out = Tally()
    for t in tallies:
        out.add(t.items, t.tokens)
    return out
