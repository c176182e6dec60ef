"""The token ledger: every item and token counted where it is, so a leak is a difference of two sums.

Two equations hold at every instant, in items and in tokens, per model and in total:

    received + adopted_queued + retried = queued + routed + cancelled + expired + released_queued
    routed   + adopted_in_flight = completed + in_flight + failed + retried + released_in_flight

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

A completed item's prompt was either served from the engine's prefix cache or computed (prefill), so
a third equation holds per model, consumer and job, in tokens (``PROMPTS``, :func:`check_prompts`):

    completed_tokens = cached_prompt_tokens + prefill_tokens

``cached_prompt_tokens`` is what the consumers reported (``Completion.cached_tokens``, held to each
item's prompt by :func:`prompt_split`); an answer that reports none counts its whole prompt as
computed. The models', consumers' and jobs' cached counts sum to the same total. A ledger whose
caller never passes cached counts (``finished(..., cached_tokens=None)``) still balances, every
prompt computed, but leaves the prompt counters out of its snapshot (``prompts_counted``): a
checkpoint then claims nothing about the cache, and the audit compares nothing.

``cancelled`` and ``expired`` are waiting items that left the lanes without being routed: their job
was cancelled (``tokenfabric cancel``), or its deadline passed first (``Scheduler.end_job``). The
processor answers each with a completion of that status; an item in flight when its job ends is not
touched, and ends completed or failed as any other.

``retried`` are items that came back failed for a reason worth another try (the consumer said so:
``Completion.retriable``) while their job allowed another attempt (``core/retries.py``): each such
answer moves the item from ``in_flight`` back to ``queued`` through ``retried``, which therefore
stands on both sides, once per retry. ``routed`` counts every attempt's dispatch (the engine did
the work), and the item's last attempt ends it as any other: completed, failed, cancelled or expired.

A producer's repeat of an item id (``duplicate``) is dead-lettered, never received: it is counted
beside the equations, in ``dead_lettered`` too.

Counters only; no I/O. A snapshot is a flat ``dict[str, int]`` so it can be checkpointed to a
compacted topic and compared by an audit; its keys' grammar is processor.core.ledger_keys.
"""

from __future__ import annotations

from processor.core.books import (
    CONSUMER_COUNTERS,
    CONSUMER_STAGES,
    ENDINGS,
    HANDOVER,
    JOB_COUNTERS,
    PROMPT_COUNTERS,
    RECEIVED,
    ROUTED,
    STAGES,
    BatchBooks,
    ConsumerBook,
    Equation,
    JobBook,
    LedgerImbalance,
    ModelBook,
    Tally,
    cached_prompt_share,
    check_prompts,
    prompt_split,
    sum_tallies,
)
from processor.core.ledger_checkpoint import adopt_unbooked_jobs, job_snapshot_of, restore_into, snapshot_of
from processor.core.ledger_checks import check_books, check_holdings, check_job_books

__all__ = [
    "CONSUMER_COUNTERS",
    "CONSUMER_STAGES",
    "ENDINGS",
    "HANDOVER",
    "JOB_COUNTERS",
    "PROMPT_COUNTERS",
    "RECEIVED",
    "ROUTED",
    "STAGES",
    "ConsumerBook",
    "Equation",
    "JobBook",
    "Ledger",
    "LedgerImbalance",
    "ModelBook",
    "Tally",
    "cached_prompt_share",
    "check_prompts",
    "prompt_split",
    "sum_tallies",
]


Released = dict[tuple[str | None, str | None], tuple[int, int]]
"""Waiting (items, tokens) let go, per (model, job): :meth:`Ledger.release`."""
ReleasedInFlight = dict[tuple[str | None, str | None, str | None], tuple[int, int]]
"""In-flight (items, tokens) let go, per (model, consumer, job): :meth:`Ledger.release`."""


class Ledger:
    """Counts per model and per consumer; the scheduler is its only writer."""

    def __init__(self) -> None:
        self.models: dict[str, ModelBook] = {}
        self.consumers: dict[str, ConsumerBook] = {}
        self.jobs: dict[str, JobBook] = {}
        self.dead_lettered = 0
        self.prompts_counted = False
        """A caller passed cached counts (or the checkpoint resumed from had them): the snapshot
        carries the prompt counters."""
        self._batch_books: dict[tuple[str | None, str | None, str | None], BatchBooks] = {}
        """A batch event's books by (model, consumer, job): :meth:`_books`."""

    def model(self, model: str) -> ModelBook:
        """The book of ``model``, made on first use (as :meth:`consumer` and :meth:`job`)."""
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

    def _books(self, model: str | None, consumer: str | None, job: str | None) -> BatchBooks:
        """The books a batch's event writes (None where its name is None), made where missing, and
        kept in ``_batch_books`` for the next batch of the same model, consumer and job. Safe to keep:
        a book, once made, stays in its dict for the ledger's life (nothing replaces or removes one;
        a restore makes a new ledger). The keeping is bounded: past ``_KEPT_BOOKS`` triples it
        starts afresh."""
        if len(self._batch_books) >= _KEPT_BOOKS:
            self._batch_books.clear()
        books = self._batch_books[model, consumer, job] = BatchBooks(
            None if model is None else self.model(model),
            None if consumer is None else self.consumer(consumer),
            None if job is None else self.job(job),
        )
        return books

    # -- events ---------------------------------------------------------------------------------

    def received(self, model: str, tokens: int, items: int = 1) -> None:
        """Items arrived: the model's book (:meth:`batch_received`, no job's)."""
        self.batch_received(model, None, items, tokens)

    def batch_received(
        self, model: str | None, job: str | None, items: int, tokens: int, adopted: bool = False
    ) -> None:
        """Items of ``model`` and ``job`` arrived (``adopted``: were adopted from the changelog, what
        another instance, or this one before a restart, counted) and wait: ``received`` (or
        ``adopted_queued``) and ``queued`` in the model's and the job's books (a name that is None:
        no book, as for :meth:`batch_routed`). The one formula of arrivals, one call per model and
        job of a submit (issue 25, part 3)."""
        try:
            books = self._batch_books[model, None, job]
        except KeyError:
            books = self._books(model, None, job)
        for t in books.adopted_queued if adopted else books.received:
            t.items += items
            t.tokens += tokens
        for t in books.queued:
            t.items += items
            t.tokens += tokens

    def duplicate(self, model: str, tokens: int, job: str = "") -> None:
        """A repeat of an item id already taken: dead-lettered instead of received."""
        self.model(model).duplicate.add(1, tokens)
        self.job(job).duplicate.add(1, tokens)
        self.dead_lettered += 1

    def ended(self, model: str, job: str, ending: str, items: int, tokens: int) -> None:
        """Waiting items of ``job`` left the lanes unrouted: ``ending`` is ``cancelled`` or ``expired``
        (``ENDINGS``), the stage of the model's book and the job's they move to from ``queued``."""
        if ending not in ENDINGS:
            raise ValueError(f"ending {ending!r} is not one of {ENDINGS}")
        for book in (self.model(model), self.job(job)):
            book.queued.add(-items, -tokens)
            getattr(book, ending).add(items, tokens)

    def routed(
        self, model: str, consumer: str, items: int, tokens: int, padded_tokens: int, oversized: bool
    ) -> None:
        """A batch went out: the model's and consumer's books (:meth:`batch_routed`, no job's)."""
        self.batch_routed(model, consumer, None, items, tokens, padded_tokens, oversized)

    def finished(
        self,
        model: str,
        consumer: str,
        ok_items: int,
        ok_tokens: int,
        failed_items: int,
        failed_tokens: int,
        cached_tokens: int | None = None,
    ) -> None:
        """A batch came back: the model's and consumer's books (:meth:`batch_finished`, no job's)."""
        self.batch_finished(
            model, consumer, None, ok_items, ok_tokens, failed_items, failed_tokens, cached_tokens
        )

    def batch_routed(
        self,
        model: str | None,
        consumer: str | None,
        job: str | None,
        items: int,
        tokens: int,
        padded_tokens: int,
        oversized: bool,
    ) -> None:
        """A batch of ``items`` items, ``tokens`` real tokens and ``padded_tokens`` padded went out:
        ``queued`` to ``routed`` and ``in_flight`` in the model's and the job's books, ``routed`` and
        ``in_flight`` in the consumer's; the batch and its padding counted for the consumer and the
        job. A name that is None has no book written (:meth:`routed` writes no job's, a batch that
        mixes jobs is booked item by item: :meth:`job_routed`).

        The one formula of a routed batch, in one call: the scheduler pays it once per batch (issue
        25, part 3: the books' tallies come from one lookup, :class:`BatchBooks`; docs/benchmarks.md)."""
        try:
            books = self._batch_books[model, consumer, job]
        except KeyError:
            books = self._books(model, consumer, job)
        for t in books.queued:
            t.items -= items
            t.tokens -= tokens
        for t in books.routed:
            t.items += items
            t.tokens += tokens
        for t in books.in_flight:
            t.items += items
            t.tokens += tokens
        c = books.consumer
        if c is not None:
            c.batches += 1
            c.padded_tokens += padded_tokens
            if oversized:
                c.oversized += 1
                c.oversized_padded_tokens += padded_tokens
        j = books.job
        if j is not None:
            j.batches += 1
            j.padded_tokens += padded_tokens

    def batch_finished(
        self,
        model: str | None,
        consumer: str | None,
        job: str | None,
        ok_items: int,
        ok_tokens: int,
        failed_items: int,
        failed_tokens: int,
        cached_tokens: int | None = None,
    ) -> None:
        """A batch came back, some items completed and the rest failed: ``in_flight`` to
        ``completed`` and ``failed``, the completed prompts split into cached and computed
        (``prompt_split``), in the model's, consumer's and job's books (a name that is None: no book,
        as for :meth:`batch_routed`). ``cached_tokens``: how many of the completed items' prompt
        tokens the engine served from its prefix cache (the rest it computed); None from a caller
        that does not count them (every prompt computed, ``prompts_counted`` kept).

        The one formula of a finished batch, one call per batch as :meth:`batch_routed`; counters
        that would gain 0 (no failure, nothing cached) are left as they are."""
        try:
            books = self._batch_books[model, consumer, job]
        except KeyError:
            books = self._books(model, consumer, job)
        if cached_tokens is not None:
            self.prompts_counted = True
        # prompt_split(ok_tokens, 0) is (0, ok_tokens): the split is asked only of a cache report
        cached, computed = prompt_split(ok_tokens, cached_tokens) if cached_tokens else (0, ok_tokens)
        items, tokens = ok_items + failed_items, ok_tokens + failed_tokens
        for t in books.in_flight:
            t.items -= items
            t.tokens -= tokens
        for t in books.completed:
            t.items += ok_items
            t.tokens += ok_tokens
        if failed_items or failed_tokens:
            for t in books.failed:
                t.items += failed_items
                t.tokens += failed_tokens
        for book in books.books:
            book.prefill_tokens += computed
            if cached:
                book.cached_prompt_tokens += cached

    def requeued(self, model: str, consumer: str, items: int, tokens: int) -> None:
        """A batch came back undone (its consumer left): its items wait again and count as redelivered."""
        book = self.model(model)
        c = self.consumer(consumer)
        book.in_flight.add(-items, -tokens)
        c.in_flight.add(-items, -tokens)
        book.routed.add(-items, -tokens)
        c.routed.add(-items, -tokens)
        book.queued.add(items, tokens)
        c.redelivered.add(items, tokens)

    def retried(self, model: str, consumer: str, items: int, tokens: int) -> None:
        """Items of a batch failed retriably and wait again for another attempt: out of ``in_flight``
        into ``retried``, and from there back into ``queued`` (``RECEIVED``, ``ROUTED``)."""
        book = self.model(model)
        c = self.consumer(consumer)
        book.in_flight.add(-items, -tokens)
        c.in_flight.add(-items, -tokens)
        book.retried.add(items, tokens)
        c.retried.add(items, tokens)
        book.queued.add(items, tokens)

    def adopted_waiting(self, model: str, tokens: int, items: int = 1) -> None:
        """Items another instance (or this one before a restart) counted now wait here: the model's
        book (:meth:`batch_received`, no job's)."""
        self.batch_received(model, None, items, tokens, adopted=True)

    def adopted_in_flight(self, model: str, consumer: str, items: int, tokens: int) -> None:
        """Outstanding items of a batch another instance routed; they finish here."""
        book = self.model(model)
        c = self.consumer(consumer)
        for t in (book.in_flight, book.adopted_in_flight, c.in_flight, c.adopted_in_flight):
            t.add(items, tokens)

    def release_all(self) -> None:
        """Give up everything waiting and in flight (its partitions go, or are about to be restored):
        the counts move to ``released_*`` so the equations keep holding (:meth:`release`, whole)."""
        held = _held
        queued: Released = {(m, None): held(b.queued) for m, b in self.models.items()}
        queued.update({(None, j): held(b.queued) for j, b in self.jobs.items()})
        in_flight: ReleasedInFlight = {(m, None, None): held(b.in_flight) for m, b in self.models.items()}
        in_flight.update({(None, c, None): held(b.in_flight) for c, b in self.consumers.items()})
        in_flight.update({(None, None, j): held(b.in_flight) for j, b in self.jobs.items()})
        self.release(queued, in_flight)

    def release(self, queued: Released, in_flight: ReleasedInFlight) -> None:
        """Give up part of what waits and is in flight (the ingest partitions it belongs to go while
        others stay): (items, tokens) per (model, job) waiting and per (model, consumer, job) in
        flight move to ``released_*``, in every book named (None: no book of that kind)."""
        for (model, job), (items, tokens) in queued.items():
            for book in self._books(model, None, job).books:
                assert isinstance(book, ModelBook)  # no consumer named: a model's or a job's book
                _move(book.queued, book.released_queued, items, tokens)
        for (model, consumer, job), (items, tokens) in in_flight.items():
            for book in self._books(model, consumer, job).books:
                _move(book.in_flight, book.released_in_flight, items, tokens)

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
        """Items of ``job`` arrived: its book only (:meth:`batch_received`)."""
        self.batch_received(None, job, items, tokens, adopted)

    def job_routed(self, job: str, items: int, tokens: int, padded_tokens: int) -> None:
        """A batch of ``job`` went out: its book only (:meth:`batch_routed`)."""
        self.batch_routed(None, None, job, items, tokens, padded_tokens, False)

    def job_finished(
        self,
        job: str,
        ok_items: int,
        ok_tokens: int,
        failed_items: int,
        failed_tokens: int,
        cached_tokens: int | None = None,
    ) -> None:
        """Items of ``job`` came back: its book only (:meth:`batch_finished`)."""
        self.batch_finished(None, None, job, ok_items, ok_tokens, failed_items, failed_tokens, cached_tokens)

    def job_requeued(self, job: str, items: int, tokens: int) -> None:
        book = self.job(job)
        book.in_flight.add(-items, -tokens)
        book.routed.add(-items, -tokens)
        book.queued.add(items, tokens)

    def job_retried(self, job: str, items: int, tokens: int) -> None:
        book = self.job(job)
        book.in_flight.add(-items, -tokens)
        book.retried.add(items, tokens)
        book.queued.add(items, tokens)

    def job_adopted_in_flight(self, job: str, items: int, tokens: int) -> None:
        book = self.job(job)
        book.in_flight.add(items, tokens)
        book.adopted_in_flight.add(items, tokens)

    # -- totals and checks ----------------------------------------------------------------------

    def total(self, stage: str) -> Tally:
        out = Tally()
        for book in self.models.values():
            t: Tally = getattr(book, stage)
            out.add(t.items, t.tokens)
        return out

    def cached_total(self) -> Tally:
        """Cached prompt tokens over every model (``tokens``; ``items`` is 0)."""
        return Tally(0, sum(b.cached_prompt_tokens for b in self.models.values()))

    def job_snapshot(self) -> dict[str, int]:
        """Per-job counters, keyed ``job:<stage>_items:<job>`` (core/ledger_checkpoint.py)."""
        return job_snapshot_of(self)

    def check(self) -> None:
        """Raise ``LedgerImbalance`` with both sides if an equation fails anywhere (core/ledger_checks.py)."""
        check_books(self)

    def check_jobs(self) -> None:
        """Both equations per job, and the jobs' books summing to the models' (core/ledger_checks.py)."""
        check_job_books(self)

    def check_holdings(self, waiting: tuple[int, int], in_flight: tuple[int, int] | None) -> None:
        """:meth:`check`, then what the lanes and batches in flight hold (core/ledger_checks.py)."""
        check_holdings(self, waiting, in_flight)

    def snapshot(self) -> dict[str, int]:
        """Flat counters, to checkpoint (core/ledger_checkpoint.py; the keys: core/ledger_keys.py)."""
        return snapshot_of(self)

    @classmethod
    def restore(cls, snapshot: dict[str, int]) -> Ledger:
        """Rebuild a ledger from ``snapshot``, the inverse of :meth:`snapshot` (core/ledger_checkpoint.py)."""
        ledger = cls()
        restore_into(ledger, snapshot)
        return ledger

    def adopt_unbooked_jobs(self) -> None:
        """A checkpoint's counts from before jobs were counted go to job "" (core/ledger_checkpoint.py)."""
        adopt_unbooked_jobs(self)


def _held(t: Tally) -> tuple[int, int]:
    return t.items, t.tokens


def _move(source: Tally, target: Tally, items: int, tokens: int) -> None:
    """``items`` and ``tokens`` leave ``source`` for ``target`` (a release: the one formula)."""
    source.add(-items, -tokens)
    target.add(items, tokens)


_KEPT_BOOKS = 4096
"""How many (model, consumer, job) triples a ledger keeps the books of before it starts afresh."""
