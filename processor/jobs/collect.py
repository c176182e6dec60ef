"""Collecting a job's results: read completions, keep one per row, write them next to the input rows.

Pieces, each with one job:

* :class:`ResultsTail` reads the results topic (``read_committed``) with one long-lived consumer, from
  given offsets to the end, again and again (``collect --wait``, the collector service).
* :class:`JobCollector` is one job's side: it takes the completions whose item ids are the job's or
  one of its retry attempts' (``NAME.r2:<row>``, processor/jobs/retry.py), keeps one per row in its
  :class:`~processor.jobs.journal.Journal` (the first, unless a later attempt or try supersedes it),
  and writes the output file from the journal joined with the dataset.
* Results come in two forms (docs/wire-format.md): a ``Completion`` keyed by its item id, routed by
  the key and decoded only when its job still needs the row, and a ``CompletionBatch`` keyed by its
  batch id, whose items may belong to several jobs: it is decoded once and each completion routed by
  its item id.
* :class:`Collection` runs several collectors over one tail, so the collector service reads each
  completion once however many jobs are open.

The tail and :class:`CollectError` live in processor/jobs/results_tail.py (re-exported here); counting
progress from the results topic alone is processor/jobs/progress_scan.py.

Where reading starts: from the journal's checkpoint when there is one; otherwise from the results
written since the job started (``offsets_for_times(started_ms - START_SLACK_MS)``), not from the
beginning of a topic that keeps a week of every job's outputs. The slack covers clocks that disagree
between the submitting machine and the consumer apps that stamp the completions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processor.core.retries import DEFAULT_MAX_ATTEMPTS, may_retry
from processor.jobs.datasets import Dataset, DatasetError, file_sha256, output_format, write_output
from processor.jobs.journal import Journal
from processor.jobs.model import (
    JobRecord,
    JobSummary,
    RowResult,
    invalid_result,
    job_of,
    row_of,
    summarize,
)
from processor.jobs.openai_output import request_of_job, write_openai
from processor.jobs.results_tail import START_SLACK_MS, CollectError, ResultsTail
from processor.kafka.reader import position
from processor.kafka.topics import TopicNames
from processor.wire.completions import COMPLETION_BATCH_HEADERS, decode_completions
from processor.wire.errors import DecodeError
from processor.wire.job_share import JobShareRecord
from processor.wire.records import CompletionRecord
from processor.wire.registry_framing import is_registry_framed
from processor.wire.schemas import HEADER_SIZE

__all__ = [
    "START_SLACK_MS",
    "CollectError",
    "Collection",
    "JobCollector",
    "ResultsTail",
    "attempts_of",
    "journal_path",
    "max_attempts_by_job",
    "provisional",
    "row_result",
]


def row_result(row: int, c: CompletionRecord, attempt: int) -> RowResult:
    """``c`` as the result of ``row`` from job attempt ``attempt``; ``tries`` is the completion's
    attempt count where the wire carries one (retries inside the pipeline), else 1."""
    tries = getattr(c, "attempt", 1)
    return RowResult(
        row=row,
        attempt=attempt,
        tries=tries if isinstance(tries, int) and tries > 0 else 1,
        cached_tokens=c.cached_tokens,
        item_id=c.item_id,
        status=c.status,
        reason=c.reason,
        output=bytes(c.output),
        input_tokens=c.input_tokens,
        output_tokens=c.output_tokens,
        padded_tokens=c.padded_tokens,
        batch_id=c.batch_id,
        consumer=c.consumer,
        completed_ms=c.completed_ms,
    )


def provisional(c: CompletionRecord, max_attempts: int) -> bool:
    """Whether ``c`` is not its item's last completion: it failed retriably (``Completion.retriable``)
    on an attempt its job's ``max_attempts`` allows a next one after, so the processor sends the item
    again (processor/core/retries.py decides with the same function) and a later completion is the
    row's result. A reader neither counts such a completion as the row's result nor writes it."""
    return c.status == "failed" and c.retriable and may_retry(c.attempt, max_attempts)


def journal_path(out: Path) -> Path:
    return out.with_name(out.name + ".journal")


@dataclass
class JobCollector:
    """One job's results: what is in its journal, and the output file written from it."""

    job: JobRecord
    out: Path
    journal: Journal
    dataset: Dataset
    #: Per partition, the offset from which this job still needs messages.
    starts: dict[int, int] = field(default_factory=dict)
    stray: int = 0
    undecodable: int = 0
    #: The job's retry attempts by job name (``NAME.r2``, ...), merged into its output.
    attempts: dict[str, JobRecord] = field(default_factory=dict)
    #: Each job name's ``max_attempts`` (its JobShare record, :func:`max_attempts_by_job`); a name
    #: not here has the processors' default.
    max_attempts: dict[str, int] = field(default_factory=dict)
    #: Completions passed over because a later attempt of their item follows (:func:`provisional`).
    provisional: int = 0
    _pending: list[RowResult] = field(default_factory=list)
    _bad: frozenset[int] = frozenset()

    @classmethod
    def open(
        cls,
        job: JobRecord,
        out: str | Path,
        dataset: str | Path | None = None,
        attempts: Iterable[JobRecord] = (),
        max_attempts: Mapping[str, int] | None = None,
    ) -> JobCollector:
        """Check the output name and the dataset, then open (and lock) the journal beside the output.

        ``attempts``: the job's retry attempts known now (:func:`attempts_of`); more can be added
        later with :meth:`add_attempt`. ``max_attempts``: each job name's (:func:`max_attempts_by_job`)."""
        target = Path(out)
        output_format(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        ds = Dataset(dataset or job.dataset)
        if file_sha256(ds.path) != job.dataset_sha256:
            raise DatasetError(
                f"dataset {ds.path} changed since job {job.name} was submitted (SHA-256 differs): rows "
                "would be joined to the wrong results; pass the original file with --dataset"
            )
        journal = Journal.open(journal_path(target), job)
        c = cls(job, target, journal, ds)
        c._bad = frozenset(b.row for b in job.bad_rows)
        c.max_attempts = dict(max_attempts or {})
        for attempt in attempts:
            c.add_attempt(attempt)
        return c

    def update(self, job: JobRecord) -> None:
        """A newer record of the same submission (submit finished, or another collector's progress),
        or of one of its attempts."""
        if job.name in self.attempts:
            self.add_attempt(job)
        elif job.name == self.job.name and job.started_ms == self.job.started_ms:
            self.job = job
            self._bad = frozenset(b.row for b in job.bad_rows)

    def add_attempt(self, attempt: JobRecord) -> bool:
        """Take in (or update) a retry attempt of this job; True when it is one this collector did
        not know, so its results must be read from where it started (:meth:`rewind_for`)."""
        if attempt.retry_of != self.job.name or attempt.started_ms < self.job.started_ms:
            return False  # another job's, or an attempt of an earlier job of the same name
        new = attempt.name not in self.attempts
        self.attempts[attempt.name] = attempt
        return new

    def attempt_number(self, job_name: str) -> int | None:
        """The attempt an item of job ``job_name`` belongs to: 1 for this job, k for ``NAME.rk``."""
        if job_name == self.job.name:
            return 1
        attempt = self.attempts.get(job_name)
        return None if attempt is None else attempt.attempt

    def resume_from(self, tail: ResultsTail) -> dict[int, int]:
        """Where this job's reading starts: its checkpoint, or the results since it started; and
        from where each attempt the checkpoint does not cover started."""
        saved = self.journal.checkpoint
        base = saved if saved is not None else tail.offsets_at(self.job.started_ms - START_SLACK_MS)
        self.starts = {p: base.get(p, 0) for p in tail.partitions()}
        for name in self.attempts:
            if saved is not None and name not in self.journal.attempts:
                self.rewind_for(self.attempts[name], tail)
        return self.starts

    def rewind_for(self, attempt: JobRecord, tail: ResultsTail) -> None:
        """Read again from where ``attempt`` started: its completions may have been passed over
        before this collector knew the attempt (the journal drops what it already has)."""
        since = tail.offsets_at(attempt.started_ms - START_SLACK_MS)
        self.starts = {p: min(o, since.get(p, o)) for p, o in self.starts.items()}

    def offer(self, partition: int, offset: int, item: str, value: bytes | None) -> None:
        """A message whose key names one of this job's items: decoded only if that row is still open."""
        if self._open_row(partition, offset, item) is None:
            return
        try:
            completions = decode_completions(value)
        except DecodeError:
            self.undecodable += 1
            return
        for completion in completions:
            self.take(partition, offset, completion)

    def take(self, partition: int, offset: int, completion: CompletionRecord) -> None:
        """A decoded completion of one of this job's items (from either form of results message)."""
        opened = self._open_row(partition, offset, completion.item_id)
        if opened is not None and provisional(completion, self.attempts_allowed(job_of(completion.item_id))):
            self.provisional += 1  # the item goes out again: its next completion is the row's
        elif opened is not None:
            row, attempt = opened
            self._pending.append(row_result(row, completion, attempt))

    def attempts_allowed(self, job_name: str) -> int:
        """The ``max_attempts`` of the items of job ``job_name`` (this job or one of its attempts)."""
        return self.max_attempts.get(job_name, DEFAULT_MAX_ATTEMPTS)

    def _open_row(self, partition: int, offset: int, item: str) -> tuple[int, int] | None:
        """(row, attempt) of ``item`` if its result may still be this job's, for a row that has none
        or one an attempt at least as late could supersede; counts stray item ids."""
        if offset < self.starts.get(partition, 0):
            return None  # already accounted for by this job's checkpoint
        name = job_of(item)
        attempt = self.attempt_number(name)
        row = None if attempt is None else row_of(name, item)
        if (
            attempt is None
            or row is None
            or row in self._bad
            or (self.job.is_submitted and row >= self.job.rows)
        ):
            self.stray += 1
            return None
        held = self.journal.results.get(row)
        if held is None or attempt > held.attempt or (attempt == held.attempt and held.status != "ok"):
            return row, attempt  # a later try of a failed item may still come within one attempt
        return None

    def commit(self, positions: Mapping[int, int]) -> int:
        """Append what was offered and the new checkpoint to the journal; returns the new rows."""
        checkpoint = {p: max(self.starts.get(p, 0), positions.get(p, 0)) for p in self.starts}
        new = self.journal.add(self._pending, checkpoint, frozenset(self.attempts))
        self._pending.clear()
        self.starts = checkpoint
        return new

    @property
    def done(self) -> int:
        return len(self.journal.results)

    @property
    def complete(self) -> bool:
        """Every row has a result, and every attempt's rows have theirs from it (or a later one)."""
        if not (self.job.is_submitted and self.done >= self.job.items):
            return False
        return not self.attempts or self.summary().complete

    def summary(self) -> JobSummary:
        extra = {
            "stray completions": self.stray,
            "undecodable completions": self.undecodable,
            "retried completions (a later attempt answers)": self.provisional,
        }
        return summarize(self.job, self.journal.results.values(), extra, self.attempts.values())

    def progress_records(self, now_ms: int) -> list[JobRecord]:
        """The records with new counts: this job's (every row's latest result) and each attempt's
        (the results of its rows from it or a later attempt); none that has nothing new to say."""
        results = self.journal.results.values()
        out: list[JobRecord] = []
        for rec in (self.job, *sorted(self.attempts.values(), key=lambda a: a.attempt)):
            if not rec.is_submitted:
                continue
            mine = results if rec is self.job else [r for r in results if r.attempt >= rec.attempt]
            s = summarize(rec, mine)
            new = rec.with_progress(
                s.ok, s.failed, s.output_tokens, now_ms, cancelled=s.cancelled, expired=s.expired
            )
            if _counts(new) != _counts(rec):
                out.append(new)
        return out

    def joined(self) -> Iterator[tuple[RowResult, dict[str, Any] | None]]:
        """Each row's result (or ``invalid`` for a bad row) with its input values, in dataset row
        order; rows with no result yet are left out."""
        results = self.journal.results
        bad = {b.row: b for b in self.job.bad_rows}
        for drow in self.dataset.rows():
            r = results.get(drow.row)
            if r is None and drow.row in bad:
                r = invalid_result(bad[drow.row])
            if r is not None:
                yield r, drow.values

    def materialize(self) -> int:
        """(Re)write the output from the journal, in dataset row order; returns the rows written."""
        return write_output(self.out, self.joined(), self.dataset)

    def materialize_openai(self, errors: Path) -> tuple[int, int]:
        """(Re)write the output as the OpenAI batch output file and ``errors`` as its error file
        (processor/jobs/openai_output.py); returns the lines written to each."""
        return write_openai(
            self.out, errors, self.joined(), job=self.job.name, request_of=request_of_job(self.job)
        )

    def close(self) -> None:
        self.journal.close()


def _counts(rec: JobRecord) -> tuple[object, ...]:
    """What a progress write changes: a record whose counts are these already needs none."""
    return (
        rec.results_ok,
        rec.results_failed,
        rec.results_cancelled,
        rec.results_expired,
        rec.output_tokens,
        rec.state,
    )


def max_attempts_by_job(shares: Mapping[str, JobShareRecord]) -> dict[str, int]:
    """Each job's ``max_attempts`` from its job-shares record (``read_job_share_records``), for the
    jobs whose record names one."""
    return {job: rec.max_attempts for job, rec in shares.items() if rec.max_attempts is not None}


def attempts_of(job: str, jobs: Mapping[str, JobRecord]) -> list[JobRecord]:
    """The retry attempts of ``job`` among ``jobs`` (the jobs topic), in attempt order."""
    return sorted((j for j in jobs.values() if j.retry_of == job), key=lambda j: j.attempt)


class Collection:
    """Several job collectors fed by one :class:`ResultsTail` (each completion is read once).

    Completions are routed by their item id's job name: a job's own, or one of its retry
    attempts', both to the job's collector."""

    def __init__(self, conf: Mapping[str, str], topics: TopicNames) -> None:
        self.tail = ResultsTail(conf, topics)
        self.collectors: dict[str, JobCollector] = {}
        self._routes: dict[str, JobCollector] = {}
        self._reassign = True

    def add(self, collector: JobCollector) -> None:
        collector.resume_from(self.tail)
        self.collectors[collector.job.name] = collector
        self._routes[collector.job.name] = collector
        for name in collector.attempts:
            self._routes[name] = collector
        self._reassign = True

    def add_attempt(self, attempt: JobRecord) -> bool:
        """A retry attempt of an open job: routed to its collector, read from where it started.
        False when its job is not open here."""
        collector = self.collectors.get(attempt.retry_of or "")
        if collector is None:
            return False
        if collector.add_attempt(attempt):
            collector.rewind_for(attempt, self.tail)
            self._routes[attempt.name] = collector
            self._reassign = True
        return True

    def remove(self, name: str) -> JobCollector | None:
        collector = self.collectors.pop(name, None)
        if collector is not None:
            for attempt in (name, *collector.attempts):
                self._routes.pop(attempt, None)
        return collector

    def step(self, max_s: float = 5.0) -> int:
        """Read what is new and hand it to the collectors; returns the rows added over all jobs."""
        if not self.collectors:
            return 0
        if self._reassign:
            starts: dict[int, int] = {}
            for c in self.collectors.values():
                for p, o in c.starts.items():
                    starts[p] = min(o, starts.get(p, o))
            self.tail.assign(starts)
            self._reassign = False
        for msg in self.tail.drain(max_s):
            value = msg.value()
            batch = value is not None and value[:HEADER_SIZE] in COMPLETION_BATCH_HEADERS
            if batch or (value is not None and is_registry_framed(value)):
                self._offer_batch(*position(msg), value)
                continue
            key = msg.key()
            item = key.decode("utf-8", "replace") if key else ""
            collector = self._routes.get(job_of(item))
            if collector is not None:
                collector.offer(*position(msg), item, value)
        positions = self.tail.positions
        return sum(c.commit(positions) for c in self.collectors.values())

    def _offer_batch(self, partition: int, offset: int, value: bytes) -> None:
        """A CompletionBatch: its items may be several jobs', so it is routed item by item."""
        try:
            completions = decode_completions(value)
        except DecodeError:
            return  # keyed by a batch id: no job to count it against
        for completion in completions:
            collector = self._routes.get(job_of(completion.item_id))
            if collector is not None:
                collector.take(partition, offset, completion)

    def close(self) -> None:
        for c in self.collectors.values():
            c.close()
        self.collectors.clear()
        self._routes.clear()
        self.tail.close()
