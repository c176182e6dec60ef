"""The ledger's checks: its equations per model, consumer and job, the books summing to one another,
and the running ``queued`` and ``in_flight`` counters against what the lanes and batches hold.

What the equations say, and why a leak shows as a difference of two sums: core/accounting.py.
``Ledger.check``, ``check_jobs`` and ``check_holdings`` call these; ``Scheduler.check`` asks the last.
"""

from __future__ import annotations

from processor.core.books import (
    RECEIVED,
    ROUTED,
    STAGES,
    LedgerImbalance,
    Tally,
    balance,
    check_prompts,
    sum_tallies,
)
from processor.core.ledger_face import LedgerBooks


def check_books(ledger: LedgerBooks) -> None:
    """Raise ``LedgerImbalance`` with both sides if any equation fails anywhere."""
    for model, b in ledger.models.items():
        RECEIVED.check(f"model {model}", b)
        ROUTED.check(f"model {model}", b)
    for name, c in ledger.consumers.items():
        ROUTED.check(f"consumer {name}", c)
    for stage in (
        "routed",
        "completed",
        "failed",
        "in_flight",
        "adopted_in_flight",
        "released_in_flight",
        "retried",
    ):
        by_model = ledger.total(stage)
        by_consumer = Tally()
        for c in ledger.consumers.values():
            t = getattr(c, stage)
            by_consumer.add(t.items, t.tokens)
        balance("ledger", f"{stage} by model", by_model, f"{stage} by consumer", (by_consumer,))
    for model, b in ledger.models.items():
        check_prompts(f"model {model}", b)
    for name, c in ledger.consumers.items():
        check_prompts(f"consumer {name}", c)
    by_consumer_cached = Tally(0, sum(c.cached_prompt_tokens for c in ledger.consumers.values()))
    balance(
        "ledger",
        "cached_prompt by model",
        ledger.cached_total(),
        "cached_prompt by consumer",
        (by_consumer_cached,),
    )


def check_job_books(ledger: LedgerBooks) -> None:
    """Both equations per job, and the jobs' books summing to the models' at every stage
    (``Scheduler.check`` asks after comparing the models' books with the lanes).

    Skipped while no job has a book: a ledger restored from a checkpoint written before jobs were
    counted has none, and counts its jobs from then on only once it starts afresh."""
    if not ledger.jobs:
        return
    for job, b in ledger.jobs.items():
        RECEIVED.check(f"job {job!r}", b)
        ROUTED.check(f"job {job!r}", b)
    for stage in STAGES:
        by_jobs = sum_tallies(getattr(b, stage) for b in ledger.jobs.values())
        balance("ledger", f"{stage} by model", ledger.total(stage), f"{stage} by job", (by_jobs,))
    for job, b in ledger.jobs.items():
        check_prompts(f"job {job!r}", b)
    by_job = Tally(0, sum(b.cached_prompt_tokens for b in ledger.jobs.values()))
    balance("ledger", "cached_prompt by model", ledger.cached_total(), "cached_prompt by job", (by_job,))


def check_holdings(ledger: LedgerBooks, waiting: tuple[int, int], in_flight: tuple[int, int] | None) -> None:
    """:func:`check_books`, then ``queued`` against the ``(items, tokens)`` the lanes hold, the jobs'
    books (:func:`check_job_books`), and ``in_flight`` against what the batches in flight hold
    (None: not recounted). ``Scheduler.check`` passes what it recounted."""
    ledger.check()
    queued = ledger.total("queued")
    if (queued.items, queued.tokens) != waiting:
        raise LedgerImbalance(
            f"ledger says {queued.items:,} items / {queued.tokens:,} tokens queued, lanes hold "
            f"{waiting[0]:,} / {waiting[1]:,}"
        )
    ledger.check_jobs()
    held = ledger.total("in_flight")
    if in_flight is not None and (held.items, held.tokens) != in_flight:
        raise LedgerImbalance(
            f"ledger says {held.items:,} items / {held.tokens:,} tokens in flight, "
            f"batches hold {in_flight[0]:,} / {in_flight[1]:,}"
        )
