"""Batch jobs, the pure part: job names and item ids, the job record, row results and summaries.

A *job* turns a dataset into items (``tokenfabric submit``) and the items' completions back into one
result per dataset row (``tokenfabric collect``). Everything here is plain Python over plain data so
the commands, the collector service and the tests share one set of rules; no Kafka, no files.

Rules that the rest of the job machinery relies on:

* A job name is 1-100 of ``A-Z a-z 0-9 . _ -``: it is the key on the jobs topic, part of every item
  id, and a file name in the collector's output folder.
* Item ids are ``<job>:<row>``, ``row`` being the 0-based index of the row among the dataset's data
  rows. Job names hold no ``:``, so :func:`row_of` recovers the row from any id without ambiguity.
* Templates (how a row becomes a prompt) are in :mod:`processor.jobs.templates`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from processor.core.measures import padding_waste

JOB_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
#: The most bad rows a job record lists; submit stops (the job is ``aborted``) past ``--max-bad-rows``,
#: which may not exceed this, so every bad row of a submitted job is in its record.
MAX_BAD_ROWS = 1000

JobState = Literal["submitting", "submitted", "aborted", "finished"]
JOB_STATES: tuple[JobState, ...] = ("submitting", "submitted", "aborted", "finished")
#: Row outcomes in a collected output: a completion's status, or ``invalid`` (refused by submit).
#: ``cancelled`` (``tokenfabric cancel``) and ``expired`` (the job's window passed before the item was
#: dispatched) are completions the processor writes for items that never ran.
RowStatus = Literal["ok", "failed", "rejected", "cancelled", "expired", "invalid"]
ROW_STATUSES: tuple[RowStatus, ...] = ("ok", "failed", "rejected", "cancelled", "expired", "invalid")
#: The outcomes ``submit --retry-failed`` runs again (processor/jobs/retry.py): the item ran and
#: failed, or never ran before the window passed. Not ``rejected`` (the server refused the prompt and
#: would refuse it again), ``cancelled`` (stopped on purpose) or ``invalid`` (submit refused the row).
RETRIED_STATUSES: frozenset[RowStatus] = frozenset({"failed", "expired"})


def check_job_name(name: str) -> str:
    """``name`` if it is a valid job name; ``ValueError`` saying what is allowed otherwise."""
    if not JOB_NAME.match(name):
        raise ValueError(
            f"job name {name!r}: use 1-100 of A-Z a-z 0-9 . _ - (it keys the jobs topic and names files)"
        )
    return name


def item_id(job: str, row: int) -> str:
    """The item id of ``row`` of ``job``: ``<job>:<row>``."""
    return f"{job}:{row}"


def job_of(item: str) -> str:
    """The job an item id names (the part before its first colon; job names have none)."""
    return item.partition(":")[0]


def row_of(job: str, item: str) -> int | None:
    """The row an item id of ``job`` names, or None when the id is not one of this job's."""
    prefix = job + ":"
    if not item.startswith(prefix):
        return None
    digits = item[len(prefix) :]
    if not digits.isdigit() or not digits.isascii() or (len(digits) > 1 and digits[0] == "0"):
        return None
    return int(digits)


# --------------------------------------------------------------------------------------------------
# The job record (the jobs topic, compacted, keyed by job name)


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row submit could not turn into an item, with why (shown to people, written to the output)."""

    row: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    """One job as the jobs topic holds it.

    ``submit`` writes it twice: ``submitting`` when it starts and ``submitted`` (or ``aborted``) once
    every item is acknowledged. After that only collectors write it, to record progress
    (``results_ok``, ``results_failed``, ``output_tokens``, ``progress_ms``) and, when every item has a
    result, ``finished``. So there is one writer at a time and no lost update.
    ``rows`` counts the dataset rows read; ``items`` the ones produced (``rows - len(bad_rows)``).

    A retry attempt (``submit --retry-failed NAME``, processor/jobs/retry.py) is a job of its own,
    ``NAME.r<attempt>``, with ``retry_of = NAME`` and ``attempt >= 2``: its items are the rows of
    ``NAME`` that ended failed or expired, under their own row numbers, so ``collect --job NAME``
    merges them into ``NAME``'s output. ``rows`` of an attempt counts the rows it ran again.
    ``results_failed`` counts every result that is not ok; ``results_cancelled`` and
    ``results_expired`` are the parts of it that never ran.
    """

    name: str
    state: JobState
    dataset: str
    dataset_sha256: str
    template: str
    shape: int
    model: str
    tokenizer: str
    rows: int = 0
    items: int = 0
    input_tokens: int = 0
    bad_rows: tuple[BadRow, ...] = ()
    started_ms: int
    submitted_ms: int | None = None
    error: str | None = None
    results_ok: int = 0
    results_failed: int = 0
    output_tokens: int = 0
    progress_ms: int | None = None
    finished_ms: int | None = None
    retry_of: str | None = None
    attempt: int = 1
    results_cancelled: int = 0
    results_expired: int = 0
    options: str | None = None
    """The submit options that decide how rows become items, as JSON text (processor/jobs/retry.py)."""

    @property
    def is_submitted(self) -> bool:
        """Whether ``rows``, ``items`` and ``bad_rows`` are final (so missing rows can be counted).

        True once submit is done, whether every row went out (``submitted_ms`` set) or it stopped
        early (``aborted``: the items it did produce are still collected).
        """
        return self.submitted_ms is not None or self.state == "aborted"

    def with_progress(
        self,
        ok: int,
        failed: int,
        output_tokens: int,
        now_ms: int,
        *,
        cancelled: int = 0,
        expired: int = 0,
    ) -> JobRecord:
        """This record with a collector's counts; ``finished`` once every item has a result.

        ``failed`` counts every result that is not ok, ``cancelled`` and ``expired`` included. An
        aborted job keeps its state (and error) and only gets ``finished_ms``.
        """
        done = self.is_submitted and ok + failed >= self.items
        state: JobState = self.state
        if done and state == "submitted":
            state = "finished"
        return replace(
            self,
            results_ok=ok,
            results_failed=failed,
            results_cancelled=cancelled,
            results_expired=expired,
            output_tokens=output_tokens,
            progress_ms=now_ms,
            state=state,
            finished_ms=(self.finished_ms or now_ms) if done else None,
        )


# --------------------------------------------------------------------------------------------------
# Row results and summaries


@dataclass(frozen=True, slots=True, kw_only=True)
class RowResult:
    """The outcome of one row, as a collected output holds it (next to the row's input).

    ``attempt`` is the job attempt that produced it (1: the job itself; ``k``: its retry job
    ``NAME.rk``) and ``tries`` the dispatches of the item within that attempt (the completion's
    attempt count; 1 when the completion carries none). A row has one result: the one with the
    greatest ``(attempt, tries)`` (:meth:`supersedes`).
    """

    row: int
    status: RowStatus
    reason: str | None = None
    output: bytes = b""
    input_tokens: int = 0
    output_tokens: int = 0
    padded_tokens: int = 0
    batch_id: str = ""
    consumer: str = ""
    completed_ms: int | None = None
    attempt: int = 1
    tries: int = 1
    cached_tokens: int = 0
    item_id: str = ""

    @property
    def order(self) -> tuple[int, int]:
        """Which of two results of a row is the later one: ``(attempt, tries)``."""
        return (self.attempt, self.tries)

    def supersedes(self, other: RowResult | None) -> bool:
        """Whether this result replaces ``other`` as its row's result (a duplicate does not)."""
        return other is None or self.order > other.order

    def to_journal(self) -> dict[str, Any]:
        """The output's fields and where the result came from: one journal line (journal.py)."""
        return {
            **self.to_json(),
            "attempt": self.attempt,
            "tries": self.tries,
            "cached_tokens": self.cached_tokens,
            "item_id": self.item_id,
        }

    def to_json(self) -> dict[str, Any]:
        """Plain JSON fields. ``output`` is text when it is UTF-8, else ``output_base64``."""
        try:
            text: str | None = self.output.decode("utf-8")
            b64 = None
        except UnicodeDecodeError:
            text, b64 = None, base64.b64encode(self.output).decode("ascii")
        return {
            "row": self.row,
            "status": self.status,
            "reason": self.reason,
            "output": text,
            "output_base64": b64,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "padded_tokens": self.padded_tokens,
            "batch_id": self.batch_id,
            "consumer": self.consumer,
            "completed_ms": self.completed_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RowResult:
        if d.get("output_base64") is not None:
            output = base64.b64decode(d["output_base64"])
        else:
            output = (d.get("output") or "").encode("utf-8")
        return cls(
            row=int(d["row"]),
            status=d["status"],
            reason=d.get("reason"),
            output=output,
            input_tokens=int(d.get("input_tokens", 0)),
            output_tokens=int(d.get("output_tokens", 0)),
            padded_tokens=int(d.get("padded_tokens", 0)),
            batch_id=d.get("batch_id", ""),
            consumer=d.get("consumer", ""),
            completed_ms=d.get("completed_ms"),
            attempt=int(d.get("attempt", 1)),
            tries=int(d.get("tries", 1)),
            cached_tokens=int(d.get("cached_tokens", 0)),
            item_id=d.get("item_id", ""),
        )


def invalid_result(bad: BadRow) -> RowResult:
    return RowResult(row=bad.row, status="invalid", reason=bad.reason)


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What a collect reports at the end: rows by outcome, tokens, and the padding its batches paid.

    ``padding_waste`` (:func:`processor.core.measures.padding_waste`) is taken over the completions
    that were batched (``padded_tokens > 0``): the share of the GPU's padded tokens this job's rows
    did not use; None when none was batched.

    ``failed`` counts every row whose result is not ok; ``cancelled`` and ``expired`` are parts of it.
    ``retrying`` counts the rows a retry attempt carries that have no result from it yet (None while
    an attempt's submit is still running): their earlier result stands until the attempt's arrives.
    """

    job: str
    rows: int | None
    ok: int
    failed: int
    invalid: int
    missing: int | None
    input_tokens: int
    output_tokens: int
    padded_tokens: int
    batched_input_tokens: int
    extra: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0
    expired: int = 0
    retrying: int | None = 0
    attempts: int = 1

    @property
    def padding_waste(self) -> float | None:
        return padding_waste(self.batched_input_tokens, self.padded_tokens)

    @property
    def complete(self) -> bool:
        """Every row has its result, from the last attempt that carries it."""
        return self.missing == 0 and self.retrying == 0

    def lines(self) -> list[str]:
        rows = "?" if self.rows is None else f"{self.rows:,}"
        missing = "? (submit still running)" if self.missing is None else f"{self.missing:,}"
        waste = "-" if self.padding_waste is None else f"{self.padding_waste:.2%}"
        never_ran = ", ".join(
            f"{n:,} {what}" for n, what in ((self.cancelled, "cancelled"), (self.expired, "expired")) if n
        )
        out = [
            f"job {self.job}: {rows} rows: {self.ok:,} ok, {self.failed:,} failed"
            + (f" ({never_ran})" if never_ran else "")
            + f", {self.invalid:,} invalid, {missing} missing",
            f"tokens: {self.input_tokens:,} in, {self.output_tokens:,} out; padding waste {waste} "
            f"({self.batched_input_tokens:,} prompt tokens in {self.padded_tokens:,} padded)",
        ]
        if self.attempts > 1:
            retrying = (
                "? (an attempt's submit is still running)" if self.retrying is None else f"{self.retrying:,}"
            )
            out.append(f"attempts: {self.attempts}, rows still being retried: {retrying}")
        if any(self.extra.values()):
            out.append("ignored: " + ", ".join(f"{v:,} {k}" for k, v in self.extra.items() if v))
        return out


def summarize(
    job: JobRecord,
    results: Iterable[RowResult],
    extra: Mapping[str, int] | None = None,
    attempts: Iterable[JobRecord] = (),
) -> JobSummary:
    """Summary of ``job`` from its rows' results (bad rows come from the job record).

    ``results`` holds one result per row, each from the latest attempt that produced one;
    ``attempts`` are the job's retry attempts (:attr:`JobRecord.retry_of`), whose rows still
    waiting for a result count as ``retrying``.
    """
    ok = failed = cancelled = expired = tokens_in = tokens_out = padded = batched_in = 0
    from_attempt: dict[int, int] = {}
    for r in results:
        if r.status == "ok":
            ok += 1
        else:
            failed += 1
            cancelled += r.status == "cancelled"
            expired += r.status == "expired"
        from_attempt[r.attempt] = from_attempt.get(r.attempt, 0) + 1
        tokens_in += r.input_tokens
        tokens_out += r.output_tokens
        if r.padded_tokens > 0:
            padded += r.padded_tokens
            batched_in += r.input_tokens
    missing = max(0, job.items - ok - failed) if job.is_submitted else None
    retries = sorted(attempts, key=lambda a: a.attempt)
    return JobSummary(
        job=job.name,
        rows=job.rows if job.is_submitted else None,
        ok=ok,
        failed=failed,
        invalid=len(job.bad_rows),
        missing=missing,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        padded_tokens=padded,
        batched_input_tokens=batched_in,
        extra=dict(extra or {}),
        cancelled=cancelled,
        expired=expired,
        retrying=_retrying(retries, from_attempt),
        attempts=1 + len(retries),
    )


def _retrying(retries: Sequence[JobRecord], from_attempt: Mapping[int, int]) -> int | None:
    """Rows of the retry attempts still waiting for a result (None while an attempt is being
    submitted); ``from_attempt`` counts the results by the attempt that produced them."""
    if not all(a.is_submitted for a in retries):
        return None
    # Rows of attempt k are a subset of attempt k-1's (docs/jobs.md, "Retrying failed rows"), so
    # every result from attempt k or later is one of attempt k's rows.
    return sum(max(0, a.items - sum(n for k, n in from_attempt.items() if k >= a.attempt)) for a in retries)


def bad_rows_text(bad: Sequence[BadRow], limit: int = 20) -> list[str]:
    """One line per bad row (the first ``limit``), then how many more."""
    lines = [f"row {b.row}: {b.reason}" for b in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"... and {len(bad) - limit:,} more bad rows")
    return lines
