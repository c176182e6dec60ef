"""The ledger as a checkpoint: a flat ``dict[str, int]`` (the keys' grammar: core/ledger_keys.py),
and the ledger rebuilt from one, including checkpoints written before the job books and the prompt
counters existed.

``Ledger.snapshot``, ``Ledger.restore`` and ``Ledger.adopt_unbooked_jobs`` call these.
"""

from __future__ import annotations

from processor.core.books import (
    CONSUMER_COUNTERS,
    CONSUMER_SNAPSHOT,
    CONSUMER_STAGES,
    JOB_COUNTERS,
    JOB_SNAPSHOT,
    PROMPT_COUNTERS,
    STAGE_COUNTERS,
    STAGES,
    ConsumerBook,
    ModelBook,
    is_stage,
    prompt_keys,
    restore_counter,
    stage_values,
    sum_tallies,
)
from processor.core.ledger_face import LedgerBooks
from processor.core.ledger_keys import keys_of, parse_key


def snapshot_of(ledger: LedgerBooks) -> dict[str, int]:
    """Flat counters: ``stage_items``/``stage_tokens`` totals, then per model, consumer and job
    (the keys' grammar: processor.core.ledger_keys)."""
    out: dict[str, int] = {"dead_lettered_items": ledger.dead_lettered}
    for stage in STAGES:
        t = ledger.total(stage)
        out[f"{stage}_items"] = t.items
        out[f"{stage}_tokens"] = t.tokens
    if ledger.prompts_counted:
        for counter in PROMPT_COUNTERS:
            out[counter] = sum(getattr(b, counter) for b in ledger.models.values())
    for model, b in ledger.models.items():
        out.update(zip(keys_of(STAGE_COUNTERS, "model", model), stage_values(b, STAGES), strict=True))
        if ledger.prompts_counted:
            out.update(prompt_keys(b, "model", model))
    for name, c in ledger.consumers.items():
        values = stage_values(c, CONSUMER_STAGES) + [getattr(c, k) for k in CONSUMER_COUNTERS]
        out.update(zip(keys_of(CONSUMER_SNAPSHOT, "consumer", name), values, strict=True))
        if ledger.prompts_counted:
            out.update(prompt_keys(c, "consumer", name))
    out.update(job_snapshot_of(ledger))
    return out


def job_snapshot_of(ledger: LedgerBooks) -> dict[str, int]:
    """Per-job counters, keyed ``job:<stage>_items:<job>`` (processor.core.ledger_keys)."""
    out: dict[str, int] = {}
    for job, b in ledger.jobs.items():
        values = [*stage_values(b, STAGES), *(getattr(b, k) for k in JOB_COUNTERS)]
        out.update(zip(keys_of(JOB_SNAPSHOT, "job", job), values, strict=True))
        if ledger.prompts_counted:
            out.update(prompt_keys(b, "job", job))
    return out


def restore_into(ledger: LedgerBooks, snapshot: dict[str, int]) -> None:
    """Fill a new ``ledger`` from ``snapshot`` (the inverse of :func:`snapshot_of`).

    A checkpoint without prompt counters (written before they existed, or by a ledger whose caller
    passed no cached counts) had every completed prompt computed, as far as it knows: its books
    get ``prefill_tokens`` equal to their completed tokens, so ``PROMPTS`` holds from the start,
    and ``prompts_counted`` stays False until a caller passes a count."""
    ledger.dead_lettered = snapshot.get("dead_lettered_items", 0)
    for key, value in snapshot.items():
        parsed = parse_key(key)
        book: ModelBook | ConsumerBook
        if parsed.scope == "job":
            book = ledger.job(parsed.owner)  # a job the checkpoint names only by its share too
            if not is_stage(book, parsed.counter) and parsed.counter not in _JOB_BOOK_COUNTERS:
                continue  # the share policy's gauges (``job:weight_milli:<job>``): not the ledger's
        elif parsed.scope == "model":
            book = ledger.model(parsed.owner)
        elif parsed.scope == "consumer":
            book = ledger.consumer(parsed.owner)
        else:
            continue
        restore_counter(book, parsed.counter, value)
    ledger.prompts_counted = "prefill_tokens" in snapshot
    if not ledger.prompts_counted:
        books: list[ModelBook | ConsumerBook] = [*ledger.models.values(), *ledger.consumers.values()]
        for b in [*books, *ledger.jobs.values()]:
            b.prefill_tokens = b.completed.tokens - b.cached_prompt_tokens


def adopt_unbooked_jobs(ledger: LedgerBooks) -> None:
    """A checkpoint written before jobs were counted has model books and no job books: its
    counts go to job "" (no job), so the per-job equations hold from the first new item on."""
    if ledger.jobs or not ledger.models:
        return
    book = ledger.job("")
    for stage in STAGES:
        t = sum_tallies(getattr(b, stage) for b in ledger.models.values())
        getattr(book, stage).add(t.items, t.tokens)
    for counter in PROMPT_COUNTERS:
        setattr(book, counter, sum(getattr(b, counter) for b in ledger.models.values()))


_JOB_BOOK_COUNTERS = (*JOB_COUNTERS, *PROMPT_COUNTERS)
