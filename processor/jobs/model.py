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
RowStatus = Literal["ok", "failed", "rejected", "invalid"]


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

    @property
    def is_submitted(self) -> bool:
        """Whether ``rows``, ``items`` and ``bad_rows`` are final (so missing rows can be counted).

        True once submit is done, whether every row went out (``submitted_ms`` set) or it stopped
        early (``aborted``: the items it did produce are still collected).
        """
        return self.submitted_ms is not None or self.state == "aborted"

    def with_progress(self, ok: int, failed: int, output_tokens: int, now_ms: int) -> JobRecord:
        """This record with a collector's counts; ``finished`` once every item has a result.

        An aborted job keeps its state (and error) and only gets ``finished_ms``.
        """
        done = self.is_submitted and ok + failed >= self.items
        state: JobState = self.state
        if done and state == "submitted":
            state = "finished"
        return replace(
            self,
            results_ok=ok,
            results_failed=failed,
            output_tokens=output_tokens,
            progress_ms=now_ms,
            state=state,
            finished_ms=(self.finished_ms or now_ms) if done else None,
        )


# --------------------------------------------------------------------------------------------------
# Row results and summaries


@dataclass(frozen=True, slots=True, kw_only=True)
class RowResult:
    """The outcome of one row, as a collected output holds it (next to the row's input)."""

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
        )


def invalid_result(bad: BadRow) -> RowResult:
    return RowResult(row=bad.row, status="invalid", reason=bad.reason)


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What a collect reports at the end: rows by outcome, tokens, and the padding its batches paid.

    ``padding_waste`` (:func:`processor.core.measures.padding_waste`) is taken over the completions
    that were batched (``padded_tokens > 0``): the share of the GPU's padded tokens this job's rows
    did not use; None when none was batched.
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

    @property
    def padding_waste(self) -> float | None:
        return padding_waste(self.batched_input_tokens, self.padded_tokens)

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def lines(self) -> list[str]:
        rows = "?" if self.rows is None else f"{self.rows:,}"
        missing = "? (submit still running)" if self.missing is None else f"{self.missing:,}"
        waste = "-" if self.padding_waste is None else f"{self.padding_waste:.2%}"
        out = [
            f"job {self.job}: {rows} rows: {self.ok:,} ok, {self.failed:,} failed, "
            f"{self.invalid:,} invalid, {missing} missing",
            f"tokens: {self.input_tokens:,} in, {self.output_tokens:,} out; padding waste {waste} "
            f"({self.batched_input_tokens:,} prompt tokens in {self.padded_tokens:,} padded)",
        ]
        if any(self.extra.values()):
            out.append("ignored: " + ", ".join(f"{v:,} {k}" for k, v in self.extra.items() if v))
        return out


def summarize(
    job: JobRecord, results: Iterable[RowResult], extra: Mapping[str, int] | None = None
) -> JobSummary:
    """Summary of ``job`` from its completions' results (bad rows come from the job record)."""
    ok = failed = tokens_in = tokens_out = padded = batched_in = 0
    for r in results:
        if r.status == "ok":
            ok += 1
        else:
            failed += 1
        tokens_in += r.input_tokens
        tokens_out += r.output_tokens
        if r.padded_tokens > 0:
            padded += r.padded_tokens
            batched_in += r.input_tokens
    missing = max(0, job.items - ok - failed) if job.is_submitted else None
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
    )


def bad_rows_text(bad: Sequence[BadRow], limit: int = 20) -> list[str]:
    """One line per bad row (the first ``limit``), then how many more."""
    lines = [f"row {b.row}: {b.reason}" for b in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"... and {len(bad) - limit:,} more bad rows")
    return lines
