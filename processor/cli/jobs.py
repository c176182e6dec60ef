"""``tokenfabric jobs [NAME]``: the jobs on the jobs topic and how far each has got.

Cheap by default: it reads only the compacted jobs topic (one record per job, a few KB), so the
result counts are those the last ``collect`` or ``collector`` recorded, and the ``counted`` column
says when; where the processors' ledger (their checkpoints, read for the cost columns anyway) has
counted more results, as before any collect has run, the counts are the ledger's and ``counted``
reads ``ledger``. ``--scan`` counts results now, from the results topic, for the jobs not yet finished: it
reads the completions written since the oldest of them started (found by timestamp, not from the
topic's beginning), once for all of them.

With a NAME it prints that job in full, every bad row included.

Beside tokenfabric's state each job shows its OpenAI Batch API status (``openai``: validating,
in_progress, finalizing, completed, failed, expired, cancelling, cancelled) and request counts
(``requests``: total/completed/failed), mapped from the record by processor/jobs/states.py. A retry
attempt (``NAME.r2``, from ``submit --retry-failed``) is a job of its own, listed after its job.

Each job's token share and cost (docs/shares.md) come beside it: its weight and quotas from the
job-shares topic, and the tokens the processors routed and padded for it from their latest
checkpoints on the accounting topic (its tail, as ``tokenfabric status`` reads it), with the share
of its completed prompt tokens the engines served from their prefix caches (``cached``; ``-`` until
a processor counts them).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import TYPE_CHECKING

from processor.cli.options import add_kafka_arguments, kafka_settings
from processor.sim.columns import fitted, folded

if TYPE_CHECKING:
    from processor.jobs.model import JobRecord
    from processor.kafka.topics import TopicNames
    from processor.ops.status import StatusView
    from processor.wire.job_share import JobShareRecord

PROG = "tokenfabric jobs"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", default=None, help="show this job in full")
    p.add_argument("--scan", action="store_true", help="count results from the results topic (slower, exact)")
    add_kafka_arguments(p)


def _when(ms: int | None, short: bool = False) -> str:
    if ms is None:
        return "-"
    return time.strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _missing(job: JobRecord) -> str:
    return f"{max(0, job.items - job.results_ok - job.results_failed):,}" if job.is_submitted else "?"


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.jobs.collect import CollectError
    from processor.jobs.topic import read_job_share_records, read_jobs
    from processor.kafka.config import ConfigError
    from processor.ops.status import gather

    try:
        conf, topics = kafka_settings(args, pipeline=True)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        jobs = read_jobs(conf, topics)
        costs = _Costs(read_job_share_records(conf, topics), gather(conf, topics))
        if args.name is not None:
            jobs = {k: v for k, v in jobs.items() if k == args.name}
            if not jobs:
                print(f"{PROG}: error: no job {args.name!r} on {topics.jobs}", file=sys.stderr)
                return 2
        if args.scan:
            _count_results_now(conf, topics, jobs, costs)
        else:
            _count_from_the_ledger(jobs, costs)
    except CollectError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    if args.name is not None:
        _print_job(jobs[args.name], costs)
    elif not jobs:
        print(f"no jobs on {topics.jobs}")
    else:
        _print_table(jobs, costs)
    return 0


def _count_results_now(
    conf: dict[str, str], topics: TopicNames, jobs: dict[str, JobRecord], costs: _Costs
) -> None:
    """``--scan``: the result counts of the jobs not finished, from the results topic, into ``jobs``."""
    from dataclasses import replace

    from processor.jobs.collect import max_attempts_by_job
    from processor.jobs.progress_scan import scan_progress

    now_ms = time.time_ns() // 1_000_000
    open_jobs = {k: v for k, v in jobs.items() if v.state != "finished"}
    limits = max_attempts_by_job(costs.records)
    for name, p in scan_progress(conf, topics, open_jobs, max_attempts=limits).items():
        jobs[name] = replace(
            jobs[name],
            results_ok=p.ok,
            results_failed=p.failed,
            results_cancelled=p.cancelled,
            results_expired=p.expired,
            output_tokens=p.output_tokens,
            progress_ms=now_ms,
        )


def _count_from_the_ledger(jobs: dict[str, JobRecord], costs: _Costs) -> None:
    """Where the processors' ledger has counted more results for a job than the last ``collect``
    recorded (or none has run), its counts into ``jobs``: ``jobs`` never says "0 ok, 300 missing"
    while its own cost line says the job completed. The job's ``counted`` column then reads
    ``ledger``; output tokens stay as recorded (the ledger counts prompt tokens only)."""
    from dataclasses import replace

    t = costs.view.job_total
    for name, job in jobs.items():
        ok, failed = t(name, "completed_items"), t(name, "failed_items")
        cancelled, expired = t(name, "cancelled_items"), t(name, "expired_items")
        never_ran = failed + cancelled + expired
        if not job.is_submitted or ok + never_ran <= job.results_ok + job.results_failed:
            continue
        counted = job.with_progress(ok, never_ran, job.output_tokens, 0, cancelled=cancelled, expired=expired)
        jobs[name] = replace(counted, progress_ms=job.progress_ms, finished_ms=job.finished_ms)
        costs.from_ledger.add(name)


def _print_job(job: JobRecord, costs: _Costs) -> None:
    """One job in full, with its retries, share, cost and why rows are missing."""
    _detail(job, costs.cancelled(job.name), job.name in costs.from_ledger)
    print_field("retries", costs.retries(job.name))
    print_field("share", costs.share(job.name))
    print_field("cost", costs.cost(job.name))
    if job.is_submitted and job.items > job.results_ok + job.results_failed:
        from processor.ops.missing import why_missing

        for line in why_missing(costs.view, job.name, job.model):
            print_field("missing", line)


def print_field(label: str, value: str, columns: int | None = None) -> None:
    """``label`` and ``value``, the value folded to the terminal's width, its later lines under its
    first: ``jobs NAME`` fits 80 columns."""
    width = columns or shutil.get_terminal_size((80, 24)).columns
    print(folded(value, width, first=f"{label:<10} ", indent=11))


def _print_table(jobs: dict[str, JobRecord], costs: _Costs) -> None:
    """Every job, one line each, fitted to the terminal."""
    from processor.jobs.states import openai_view

    ordered = sorted(jobs.values(), key=lambda j: _listing_order(j, jobs))
    views = {job.name: openai_view(job, cancel_requested=costs.cancelled(job.name)) for job in ordered}
    header = (
        "job", "state", "openai", "requests", "rows", "bad", "ok", "failed", "missing", "tokens in",
        "counted", "share", "routed", "padded", "cached",
    )  # fmt: skip
    lines = [
        (
            job.name,
            job.state,
            views[job.name].status,
            views[job.name].counts,
            f"{job.rows:,}",
            f"{len(job.bad_rows):,}",
            f"{job.results_ok:,}",
            f"{job.results_failed:,}",
            _missing(job),
            f"{job.input_tokens:,}",
            "ledger" if job.name in costs.from_ledger else _when(job.progress_ms, short=True),
            costs.share(job.name),
            f"{costs.view.job_total(job.name, 'routed_tokens'):,}",
            f"{costs.view.job_total(job.name, 'padded_tokens'):,}",
            costs.cached_share(job.name),
        )
        for job in ordered
    ]
    for line in fitted([header, *lines], shutil.get_terminal_size((120, 24)).columns, left=(0, 1, 2, 10, 11)):
        print(line)


def _listing_order(job: JobRecord, jobs: dict[str, JobRecord]) -> tuple[int, int, str]:
    """Jobs by start, each job's retry attempts right after it."""
    base = jobs.get(job.retry_of) if job.retry_of is not None else None
    return ((base or job).started_ms, job.attempt, job.name)


def _counted(job: JobRecord, from_ledger: bool) -> str:
    if from_ledger:
        return "from the processors' ledger (no collect has counted them yet)"
    return _when(job.progress_ms)


def _detail(job: JobRecord, cancel_requested: bool, from_ledger: bool = False) -> None:
    from processor.jobs.model import bad_rows_text
    from processor.jobs.states import openai_view

    view = openai_view(job, cancel_requested=cancel_requested)
    never_ran = f"{job.results_cancelled:,} cancelled, {job.results_expired:,} expired"
    for label, value in (
        ("job", job.name + (f" (attempt {job.attempt} of {job.retry_of})" if job.retry_of else "")),
        ("state", job.state + (f" ({job.error})" if job.error else "")),
        (
            "openai",
            f"{view.status}: request_counts total {view.total:,}, completed {view.completed:,}, "
            f"failed {view.failed:,}",
        ),
        ("dataset", f"{job.dataset} (sha256 {job.dataset_sha256[:16]}...)"),
        ("template", job.template),
        ("model", job.model),
        ("tokenizer", job.tokenizer),
        ("shape", f"{job.shape:016x}"),
        ("rows", f"{job.rows:,} read, {job.items:,} submitted, {len(job.bad_rows):,} bad"),
        (
            "results",
            f"{job.results_ok:,} ok, {job.results_failed:,} failed ({never_ran}), {_missing(job)} missing",
        ),
        ("tokens", f"{job.input_tokens:,} in, {job.output_tokens:,} out"),
        ("started", _when(job.started_ms)),
        ("submitted", _when(job.submitted_ms)),
        ("counted", _counted(job, from_ledger)),
        ("finished", _when(job.finished_ms)),
    ):
        print_field(label, value)
    for line in bad_rows_text(job.bad_rows, limit=len(job.bad_rows)):
        print_field("  bad", line)


class _Costs:
    """A job's share (the job-shares topic) and its tokens (the processors' checkpoints)."""

    def __init__(self, records: dict[str, JobShareRecord], view: StatusView) -> None:
        self.shares = {job: rec.policy for job, rec in records.items()}
        self.records = records
        self.view = view
        self.from_ledger: set[str] = set()
        """The jobs whose result counts come from the ledger, not from a collect."""

    def cancelled(self, job: str) -> bool:
        """Whether ``tokenfabric cancel`` has cancelled ``job`` (OpenAI's ``cancelling`` until its rows
        come back ``cancelled``)."""
        rec = self.records.get(job)
        return rec is not None and rec.cancelled_ms is not None

    def share(self, job: str) -> str:
        from processor.cli.options import describe_policy

        policy = self.shares.get(job)
        text = describe_policy(policy) if policy is not None else "weight 1"
        return text + (" CAPPED" if self.view.job_policy(job)[3] else "")

    def retries(self, job: str) -> str:
        """Dispatches of the job's items after a retriable failure (the ledger's ``retried``), and
        how many attempts each item gets (docs/jobs.md, "Retries inside the pipeline")."""
        from processor.core.retries import DEFAULT_MAX_ATTEMPTS

        rec = self.records.get(job)
        limit = rec.max_attempts if rec is not None and rec.max_attempts is not None else DEFAULT_MAX_ATTEMPTS
        n = self.view.job_total(job, "retried_items")
        return f"{n:,} items sent back to the lanes after a retriable failure; max_attempts {limit}"

    def cost(self, job: str) -> str:
        t = self.view.job_total
        return (
            f"{t(job, 'received_tokens'):,} tokens received, {t(job, 'routed_tokens'):,} routed, "
            f"{t(job, 'completed_tokens'):,} completed, {t(job, 'padded_tokens'):,} padded "
            f"in {t(job, 'batches'):,} batches; completed prompts: "
            f"{t(job, 'cached_prompt_tokens'):,} tokens from the prefix cache, "
            f"{t(job, 'prefill_tokens'):,} computed ({self.cached_share(job)} cached)"
        )

    def cached_share(self, job: str) -> str:
        """The share of the job's completed prompt tokens served from the prefix cache, or ``-``."""
        from processor.core.accounting import cached_prompt_share

        t = self.view.job_total
        share = cached_prompt_share(t(job, "cached_prompt_tokens"), t(job, "prefill_tokens"))
        return "-" if share is None else f"{share:.1%}"
