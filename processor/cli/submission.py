"""Producing a job: a checked :class:`~processor.cli.submit_plan.SubmitPlan`'s good rows as items, and
the job record written before the first item and after the last (``submitted`` or ``aborted``).

Shared by ``tokenfabric submit`` (processor/cli/submit.py) and ``submit --retry-failed``
(processor/cli/retry_failed.py), which submits a job's failed rows again as a new attempt; kept
apart from both so neither imports the other's command.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from processor.cli.submit_plan import SubmitPlan
from processor.jobs.model import MAX_BAD_ROWS, BadRow, JobRecord, item_id
from processor.jobs.prepare import JobRows, prepare

if TYPE_CHECKING:
    from processor.apps.producer import TokenProducer
    from processor.jobs.datasets import DatasetRow
    from processor.jobs.topic import JobWriter

__all__ = ["CHUNK_ROWS", "Aborted", "submit"]

CHUNK_ROWS = 512


class Aborted(RuntimeError):
    """Submit stopped early; the job record says ``aborted`` with this message as its error."""


def _chunks(rows: Iterable[DatasetRow], size: int) -> Iterator[list[DatasetRow]]:
    it = iter(rows)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class _Counts:
    """What a submission has read and produced so far (the job record's figures)."""

    rows: int = 0
    items: int = 0
    tokens: int = 0
    bad: list[BadRow] = field(default_factory=list)


def submit(
    plan: SubmitPlan,
    producer: TokenProducer,
    writer: JobWriter,
    *,
    on_bad: Callable[[BadRow], None] = lambda b: None,
    on_rows: Callable[[int, int], None] = lambda rows, tokens: None,
) -> JobRecord:
    """Produce every good row of ``plan``'s dataset and record the job; returns the final record.

    Raises :class:`Aborted` past ``max_bad_rows`` (after recording the job as aborted); Kafka errors
    propagate after the same attempt to record it.
    """
    job_rows = plan.job_rows
    record = _submitting(plan, job_rows)
    writer.write(record)
    counts = _Counts()

    def finish(state: str, error: str | None) -> JobRecord:
        return _finish(writer, record, counts, state, error)

    try:
        for chunk in _chunks(plan.dataset.rows(), CHUNK_ROWS):
            _produce_chunk(plan, job_rows, chunk, producer, counts, on_bad)
            on_rows(counts.rows, counts.tokens)
            if len(counts.bad) > plan.max_bad_rows:
                raise Aborted(f"more than {plan.max_bad_rows} bad rows (--max-bad-rows): check the template")
        producer.close(timeout=120.0)
    except BaseException as exc:
        _record_failure(producer, finish, exc)
        raise
    return finish("submitted", None)


def _submitting(plan: SubmitPlan, job_rows: JobRows) -> JobRecord:
    """The job record written before the first item: state ``submitting``, no figures yet."""
    from processor.jobs.datasets import file_sha256

    return JobRecord(
        name=plan.job,
        state="submitting",
        dataset=str(plan.dataset.path),
        dataset_sha256=file_sha256(plan.dataset.path),
        template=job_rows.source,
        shape=job_rows.shape,
        options=plan.options,
        model=plan.model,
        tokenizer=str(plan.tokenizer.path),
        started_ms=_now_ms(),
    )


def _produce_chunk(
    plan: SubmitPlan,
    job_rows: JobRows,
    chunk: list[DatasetRow],
    producer: TokenProducer,
    counts: _Counts,
    on_bad: Callable[[BadRow], None],
) -> None:
    """Prepare ``chunk``'s rows; produce each good one as an item, count and report each bad one."""
    from processor.engines.openai_choices import OUTPUT_METADATA_KEY
    from processor.jobs.openai_input import TEMPLATE_PREFIX
    from processor.wire.records import tokens_from_ids

    # an OpenAI line's output file says the server's finish_reason: the engine's JSON object carries it
    metadata = {OUTPUT_METADATA_KEY: "json"} if job_rows.source.startswith(TEMPLATE_PREFIX) else None
    counts.rows += len(chunk)
    ready, found = prepare([job_rows.reader.read(drow) for drow in chunk], plan.tokenizer, job_rows.shaper)
    for item in ready:
        budget = item.settings.output_budget
        producer.send(
            item_id(plan.job, item.row),
            plan.model,
            tokens_from_ids(item.ids),
            shape=item.shape,
            job_id=plan.job,
            output_budget=plan.output_budget if budget is None else budget,
            request=item.settings.request,
            metadata=metadata,
        )
        counts.items += 1
        counts.tokens += len(item.ids)
    for b in found:
        counts.bad.append(b)
        on_bad(b)


def _finish(
    writer: JobWriter, record: JobRecord, counts: _Counts, state: str, error: str | None
) -> JobRecord:
    """Write and return ``record`` with ``counts``, ``submitted`` or (any other ``state``) ``aborted``."""
    listed = tuple(sorted(counts.bad, key=lambda b: b.row)[:MAX_BAD_ROWS])
    final = replace(
        record, rows=counts.rows, items=counts.items, input_tokens=counts.tokens, bad_rows=listed, error=error
    )
    if state == "submitted":
        final = replace(final, state="submitted", submitted_ms=_now_ms())
    else:
        final = replace(final, state="aborted")
    writer.write(final)
    return final


def _record_failure(
    producer: TokenProducer, finish: Callable[[str, str | None], JobRecord], exc: BaseException
) -> None:
    """Deliver what was queued and mark the job aborted; never hides the original error."""
    reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc) or type(exc).__name__
    # The original error is the one to report; these are best effort.
    with contextlib.suppress(Exception):
        producer.flush(60.0)
    with contextlib.suppress(Exception):
        finish("aborted", reason)
