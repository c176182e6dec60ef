"""``tokenfabric collect --job NAME --out FILE``: a job's results, one per row, next to the input rows.

Reads the results topic (``read_committed``) for the job's completions, keeps one per row (the
first, unless a later attempt's supersedes it), and writes ``FILE`` (``.jsonl`` or ``.parquet``) in
dataset row order: each row's result fields and its input row under ``input``. Rows submit refused
are there too, with status ``invalid``; rows with no result yet are not (the summary counts them as
missing).

``--format openai`` writes ``FILE`` as the OpenAI Batch API's output file (the ok rows) and
``--errors`` (default ``FILE`` with ``.errors.jsonl`` for ``.jsonl``) as its error file (every other
row), one line per row keyed by ``custom_id`` (processor/jobs/openai_output.py).

A job's retry attempts (``submit --retry-failed NAME``: jobs ``NAME.r2``, ...) are collected with it:
each row's result is the one from the last attempt that ran it (processor/jobs/retry.py).

Restarts are safe and cheap: ``FILE.journal`` keeps every row collected and the offsets read so far
(processor/jobs/journal.py), so a second run reads only what is new, never writes a row twice, and
rewrites ``FILE`` atomically from the journal. Running it again on a complete job rewrites the same
file. Keep the journal while the job runs; once complete it can be deleted (a later run then reads
the results again, while the topic still holds them).

Exit status: 0 every row has a result; 3 some rows are still missing (run again, or use ``--wait``);
2 bad arguments, unknown job, changed dataset, the output in use by another collect; 1 Kafka failed;
130 or 143 stopped by SIGINT or SIGTERM: both end the same way, the output written with what was
collected and the journal kept, and a last line on stderr saying it was interrupted, what it wrote
and that the same command goes on (a second signal aborts at once). The progress bar counts every
row of the dataset, the invalid ones included.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from processor.cli.hints import kafka_flags
from processor.cli.options import add_kafka_arguments, install_stop_handlers, kafka_settings

if TYPE_CHECKING:
    from processor.jobs.collect import Collection, JobCollector
    from processor.jobs.model import JobRecord, JobSummary
    from processor.jobs.topic import JobWriter
    from processor.kafka.topics import TopicNames

PROG = "tokenfabric collect"
#: How often a collect waiting for ``submit`` to finish re-reads the job record.
JOB_REFRESH_S = 2.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job name (as given to submit)")
    p.add_argument(
        "--out", required=True, help="output file, .jsonl or .parquet (FILE.journal sits beside it)"
    )
    p.add_argument(
        "--format",
        choices=("jsonl", "parquet", "openai"),
        default=None,
        help="output format (default: from --out's extension); openai: the OpenAI batch output file, "
        "with the error file at --errors",
    )
    p.add_argument(
        "--errors",
        default=None,
        help="with --format openai: the error file (default: --out with .errors.jsonl)",
    )
    p.add_argument("--dataset", default=None, help="the job's dataset, if not at the path submit recorded")
    p.add_argument("--wait", action="store_true", help="keep collecting until every row has a result")
    p.add_argument("--timeout-s", type=float, default=None, help="with --wait: give up after this long")
    p.add_argument("--poll-s", type=float, default=1.0, help="with --wait: pause between reads (default: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_kafka_arguments(p)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.jobs.collect import (
        CollectError,
        Collection,
        JobCollector,
        attempts_of,
        max_attempts_by_job,
    )
    from processor.jobs.datasets import DatasetError
    from processor.jobs.journal import JournalError
    from processor.jobs.topic import JobsTopicError, JobWriter, read_job_share_records, read_jobs
    from processor.kafka.config import ConfigError

    try:
        conf, topics = _settings(args)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    collection: Collection | None = None
    writer: JobWriter | None = None
    try:
        jobs = read_jobs(conf, topics)
        job = jobs.get(args.job)
        if job is None or job.retry_of is not None:
            print(f"{PROG}: error: {_not_a_job(args.job, job, topics, kafka_flags(args))}", file=sys.stderr)
            return 2
        try:
            limits = max_attempts_by_job(read_job_share_records(conf, topics))
            collector = JobCollector.open(job, args.out, args.dataset, attempts_of(job.name, jobs), limits)
        except (DatasetError, JournalError, OSError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        collection = Collection(conf, topics)
        collection.add(collector)
        writer = JobWriter(conf, topics)
        stopped_by: list[signal.Signals] = []
        stop = threading.Event()
        install_stop_handlers(stop, announce=stopped_by.append)
        try:
            _collect(collection, collector, topics, conf, args, stop)
        except KeyboardInterrupt:  # a second signal, or SIGINT from an embedding caller
            stopped_by.append(signal.SIGINT)
        written, errors = _materialize(collector, args)
        _record_progress(writer, collector)
    except (CollectError, JobsTopicError, KafkaException) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, KafkaException) else 2  # the broker, or this job's state
    finally:
        if collection is not None:
            collection.close()
        if writer is not None:
            writer.close()
    complete = _print_summary(collector, conf, topics, args, written, errors)
    if stopped_by:
        print(f"{PROG}: {interrupted_line(stopped_by[0], written, args.out)}", file=sys.stderr)
        return 128 + stopped_by[0].value
    return 0 if complete else 3


def _settings(args: argparse.Namespace) -> tuple[dict[str, str], TopicNames]:
    """The Kafka settings, once the flags and the output's format are checked (ValueError says what)."""
    from processor.jobs.datasets import need_pyarrow, output_format

    if args.timeout_s is not None and not args.timeout_s > 0:
        raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}")
    if not args.poll_s > 0:
        raise ValueError(f"--poll-s must be > 0, got {args.poll_s}")
    _check_format(args)
    if output_format(args.out) == "parquet":
        need_pyarrow()
    return kafka_settings(args, pipeline=True)


def _not_a_job(name: str, job: JobRecord | None, topics: TopicNames, flags: str = "") -> str:
    """Why ``name`` cannot be collected: no such job, or it is a retry attempt of another."""
    why = (
        f"('tokenfabric jobs{flags}' lists them)"
        if job is None
        else f"is attempt {job.attempt} of job {job.retry_of}: 'collect --job {job.retry_of}' "
        "merges it into that job's output"
    )
    return f"no job {name!r} on {topics.jobs} {why}"


def _print_summary(
    collector: JobCollector,
    conf: dict[str, str],
    topics: TopicNames,
    args: argparse.Namespace,
    written: int,
    errors: int | None,
) -> bool:
    """The job's figures, why rows are missing, what was written; returns whether it is complete."""
    summary = collector.summary()
    for line in summary.lines():
        print(line)
    if summary.missing:
        for line in _why_missing(conf, topics, collector.job.name, collector.job.model):
            print(f"missing: {line}")
    if errors is None:
        print(f"wrote {written:,} rows to {args.out}")
    else:
        print(f"wrote {written:,} rows to {args.out} and {errors:,} to {_errors_path(args)}")
    return summary.complete


def _collect(
    collection: Collection,
    collector: JobCollector,
    topics: TopicNames,
    conf: dict[str, str],
    args: argparse.Namespace,
    stop: threading.Event,
) -> None:
    """Read until the job is complete, or once (without ``--wait``), or until the timeout or ``stop``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from processor.jobs.collect import attempts_of, max_attempts_by_job
    from processor.jobs.topic import read_job_share_records, read_jobs

    deadline = None if args.timeout_s is None else time.monotonic() + args.timeout_s
    next_refresh = time.monotonic() + JOB_REFRESH_S
    progress = Progress(
        TextColumn(f"collecting {collector.job.name}"),
        BarColumn(bar_width=20),  # the line fits 80 columns with a 20-character job name
        MofNCompleteColumn(),
        TextColumn("rows, {task.fields[counts]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=args.no_progress,
    )
    with progress:
        task = progress.add_task("collect", total=None, counts="0 ok")
        while True:
            collection.step(max_s=5.0)
            s = collector.summary()
            done, total = progress_counts(s, collector.job)
            progress.update(task, completed=done, total=total, counts=progress_text(s))
            if collector.complete or not args.wait or stop.is_set():
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            if time.monotonic() >= next_refresh and _waits_for_a_record(collector):
                jobs = read_jobs(conf, topics)
                for rec in (jobs.get(collector.job.name), *attempts_of(collector.job.name, jobs)):
                    if rec is not None and not collection.add_attempt(rec):
                        collector.update(rec)
                collector.max_attempts = max_attempts_by_job(read_job_share_records(conf, topics))
                next_refresh = time.monotonic() + JOB_REFRESH_S
            stop.wait(args.poll_s)


def progress_counts(summary: JobSummary, job: JobRecord) -> tuple[int, int | None]:
    """The progress bar's rows done and rows in all: every row of the dataset, the invalid ones
    (submit refused them, so they have their result already) as done (None: submit still runs)."""
    done = summary.ok + summary.failed + summary.invalid
    return done, (job.rows if job.is_submitted else None)


def progress_text(summary: JobSummary) -> str:
    """``300 ok``, with ``failed`` and ``invalid`` counts only once there are some (80 columns)."""
    parts = [f"{summary.ok:,} ok"]
    parts += [f"{n:,} {what}" for n, what in ((summary.failed, "failed"), (summary.invalid, "invalid")) if n]
    return ", ".join(parts)


def interrupted_line(sig: signal.Signals, written: int, out: str) -> str:
    """What a collect stopped by a signal says last: that it was interrupted, what it wrote, how to
    go on (the journal keeps what was read, so the same command resumes)."""
    return (
        f"interrupted by {sig.name}: wrote the {written:,} rows collected so far to {out}; "
        "run the same command again to go on from there"
    )


def _waits_for_a_record(collector: JobCollector) -> bool:
    """Whether the job or one of its attempts is still being submitted (its counts are not final)."""
    return not all(rec.is_submitted for rec in (collector.job, *collector.attempts.values()))


def _check_format(args: argparse.Namespace) -> None:
    """ValueError unless ``--format`` fits ``--out`` (openai writes JSON lines) and ``--errors``
    is given only with openai."""
    from processor.jobs.datasets import output_format

    inferred = output_format(args.out)
    wanted = "jsonl" if args.format == "openai" else args.format
    if wanted is not None and wanted != inferred:
        raise ValueError(f"--format {args.format} writes {wanted}, but --out {args.out} is {inferred}")
    if args.errors is not None and args.format != "openai":
        raise ValueError("--errors is the OpenAI error file: give it with --format openai")


def _errors_path(args: argparse.Namespace) -> str:
    from processor.jobs.openai_output import errors_path

    return str(args.errors or errors_path(args.out))


def _materialize(collector: JobCollector, args: argparse.Namespace) -> tuple[int, int | None]:
    """Write the output (and, for openai, the error file); the rows in each (None: no error file)."""
    from pathlib import Path

    if args.format == "openai":
        return collector.materialize_openai(Path(_errors_path(args)))
    return collector.materialize(), None


def _why_missing(conf: dict[str, str], topics: TopicNames, job: str, model: str) -> list[str]:
    """Why rows have no result yet (processor/ops/missing.py), read now from the pipeline's topics."""
    from confluent_kafka import KafkaException

    from processor.ops.missing import why_missing
    from processor.ops.status import gather

    try:
        return why_missing(gather(conf, topics), job, model)
    except KafkaException as exc:
        return [f"the pipeline's state could not be read to say why: {exc}"]


def _record_progress(writer: JobWriter, collector: JobCollector) -> None:
    """Put this collect's counts on the jobs topic (what ``tokenfabric jobs`` shows).

    Only a courtesy to ``jobs``: the output is already written, so a failure is a warning.
    """
    from confluent_kafka import KafkaException

    from processor.jobs.topic import JobsTopicError

    try:
        for rec in collector.progress_records(time.time_ns() // 1_000_000):
            writer.write(rec)
    except (JobsTopicError, KafkaException) as exc:
        print(f"{PROG}: warning: progress not recorded on the jobs topic: {exc}", file=sys.stderr)
