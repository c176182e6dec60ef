"""``tokenfabric submit --retry-failed NAME``: a new attempt for the rows of a finished job that failed.

The job's rows whose result, after every earlier attempt, is ``failed`` or ``expired`` are rendered
again from its dataset with the options it was submitted with, and produced as the job
``NAME.r<k>`` (processor/jobs/retry.py says why and how the rows map back). ``collect --job NAME``
then merges the attempt into ``NAME``'s output: each row's result is its last attempt's.

Steps: read the job and its attempts from the jobs topic; read their results from the results topic
(the same merge ``collect`` does, into a throwaway journal); refuse while any row is still without
its result; pick the rows; submit them as the next attempt (``submit``'s own code, so the items are
exactly what the original rows were), with the job's share (docs/shares.md) copied to the attempt.

Exit status: 0 an attempt was submitted, or there was nothing to retry; 2 no such job, an attempt
named instead of its job, rows still running, a changed dataset; 1 Kafka failed or submit aborted;
3 some rows were bad this time (the dataset is checked by SHA-256, so only if the options were lost).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from processor.cli.hints import kafka_flags
from processor.jobs.topic import JobWriter
from processor.sim.columns import folded

if TYPE_CHECKING:
    from collections.abc import Sequence

    from processor.cli.submit_plan import SubmitPlan
    from processor.jobs.model import JobRecord, JobSummary, RowResult
    from processor.kafka.topics import TopicNames

PROG = "tokenfabric submit --retry-failed"
#: How long the read of a job's results may take before the retry gives up (one pass to the end).
SCAN_MAX_S = 300.0


class AttemptWriter(JobWriter):
    """Writes the records ``submit`` makes as those of a retry attempt: ``retry_of``, ``attempt`` and
    the original job's options stamped on each."""

    def __init__(
        self, conf: dict[str, str], topics: TopicNames, *, retry_of: JobRecord, attempt: int
    ) -> None:
        super().__init__(conf, topics)
        self.retry_of = retry_of
        self.attempt = attempt

    def write(self, rec: JobRecord, timeout_s: float = 30.0) -> None:
        stamped = replace(
            rec, retry_of=self.retry_of.name, attempt=self.attempt, options=self.retry_of.options
        )
        super().write(stamped, timeout_s)


def merged_results(
    conf: dict[str, str],
    topics: TopicNames,
    job: JobRecord,
    attempts: list[JobRecord],
    dataset: str | None,
) -> tuple[dict[int, RowResult], JobSummary]:
    """Each row's latest result over ``job`` and its ``attempts``, read from the results topic as
    ``collect`` reads them (into a journal in a temporary folder, deleted after), and the summary.
    A row the pipeline is still retrying has no result yet, so it is not retried here too."""
    from processor.jobs.collect import Collection, JobCollector, max_attempts_by_job
    from processor.jobs.topic import read_job_share_records

    limits = max_attempts_by_job(read_job_share_records(conf, topics))
    with tempfile.TemporaryDirectory(prefix="tokenfabric-retry-") as folder:
        collector = JobCollector.open(job, Path(folder) / "scan.jsonl", dataset, attempts, limits)
        collection = Collection(conf, topics)
        try:
            collection.add(collector)
            collection.step(max_s=SCAN_MAX_S)
            return dict(collector.journal.results), collector.summary()
        finally:
            collection.close()


def run_retry_failed(args: argparse.Namespace) -> int:
    """``submit --retry-failed NAME`` (module docstring); ``args`` are submit's, ``args.retry_failed``
    the job. Submit's options given on the command line count only where the job recorded none."""
    from confluent_kafka import KafkaException

    from processor.apps.producer import MissingTopicError, ProduceError, TokenProducer
    from processor.cli.options import kafka_settings
    from processor.cli.submission import Aborted, submit
    from processor.jobs.collect import CollectError, attempts_of
    from processor.jobs.datasets import DatasetError
    from processor.jobs.journal import JournalError
    from processor.jobs.retry import attempt_name, next_attempt, retry_problem, rows_to_retry
    from processor.jobs.topic import JobsTopicError, read_jobs
    from processor.kafka.config import ConfigError

    name = args.retry_failed
    try:
        conf, topics = kafka_settings(args, pipeline=True)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    writer: AttemptWriter | None = None
    try:
        jobs = read_jobs(conf, topics)
        job = jobs.get(name)
        if job is None:
            print(f"{PROG}: error: no job {name!r} on {topics.jobs}", file=sys.stderr)
            return 2
        attempts = attempts_of(name, jobs)
        dataset = getattr(args, "dataset", None) or job.dataset
        results, summary = merged_results(conf, topics, job, attempts, dataset)
        problem = retry_problem(job, summary)
        if problem is not None:
            print(f"{PROG}: error: {problem}", file=sys.stderr)
            return 2
        rows = rows_to_retry(results.values())
        if not rows:
            print(f"job {name}: no failed or expired rows, nothing to retry")
            return 0
        attempt = next_attempt(attempts)
        attempt_job = attempt_name(name, attempt)
        if attempt_job in jobs:
            print(
                f"{PROG}: error: job {attempt_job} already exists and is not an attempt of {name}",
                file=sys.stderr,
            )
            return 2
        plan = _attempt_plan(args, job, attempt_job, dataset, rows)
        producer = TokenProducer(conf, topics)
        producer.check_topic()
        writer = AttemptWriter(conf, topics, retry_of=job, attempt=attempt)
        _write_attempt_share(conf, topics, args, name, attempt_job, writer)
        final = submit(plan, producer, writer)
    except (ValueError, DatasetError, JournalError, CollectError, MissingTopicError, JobsTopicError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (Aborted, KafkaException, ProduceError) as exc:
        print(f"{PROG}: error: job {name}: the attempt aborted: {exc}", file=sys.stderr)
        return 1
    finally:
        if writer is not None:
            writer.close()
    said = (
        f"submitted attempt {attempt} of job {name} as job {attempt_job}: {final.items:,} of {len(rows):,} "
        f"failed or expired rows, {final.input_tokens:,} tokens; "
        f"'tokenfabric collect --job {name} --out FILE{kafka_flags(args)}' merges it"
    )
    print(folded(said, shutil.get_terminal_size((80, 24)).columns))
    return 3 if final.bad_rows else 0


def _attempt_plan(
    args: argparse.Namespace, job: JobRecord, attempt_job: str, dataset: str, rows: Sequence[int]
) -> SubmitPlan:
    """The attempt's plan: ``job``'s recorded options over the command line's, only ``rows``."""
    from processor.cli.submit_plan import plan_from
    from processor.jobs.retry import RowSubset, options_namespace, recorded_options

    settings = options_namespace(vars(args), recorded_options(job))
    plan = plan_from(argparse.Namespace(**{**settings, "job": attempt_job, "dataset": dataset}))
    return replace(plan, dataset=RowSubset(plan.dataset.path, rows))


def _write_attempt_share(
    conf: dict[str, str],
    topics: TopicNames,
    args: argparse.Namespace,
    name: str,
    attempt_job: str,
    writer: AttemptWriter,
) -> None:
    """From the attempt's first item: the job's share, and its attempts (``--max-attempts`` over the
    job's own), when it has either."""
    from processor.core.shares import JobPolicy
    from processor.jobs.topic import read_job_share_records
    from processor.ops.lifecycle import max_attempts_from

    share = read_job_share_records(conf, topics).get(name)
    max_attempts = max_attempts_from(getattr(args, "max_attempts", None))
    if max_attempts is None and share is not None:
        max_attempts = share.max_attempts
    if share is not None or max_attempts is not None:
        policy = share.policy if share is not None else JobPolicy()
        writer.write_share(attempt_job, policy, time.time_ns() // 1_000_000, max_attempts)
