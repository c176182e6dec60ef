"""``tokenfabric collector --out-dir DIR``: collect every job on the jobs topic, for as long as it runs.

For each job it writes ``DIR/<job>.<format>`` when the job completes (every item has a result), and
keeps ``DIR/<job>.<format>.journal`` meanwhile: the rows collected so far, one JSON line each. It is
``tokenfabric collect`` for many jobs at once, with the same journal, so the two agree and a restart
of either resumes where it stopped. All jobs share one reader of the results topic, so each
completion is read once however many jobs are open.

``--format openai`` writes ``DIR/<job>.jsonl`` as the OpenAI batch output file and
``DIR/<job>.errors.jsonl`` as its error file. A job's retry attempts (``NAME.r2``, ...) are collected
into the job's own output, not files of their own; an attempt that appears after its job was
written reopens the job, whose output is then written again with the attempt's results.

Progress goes to the jobs topic (what ``tokenfabric jobs`` shows) at most every
``--progress-every-s`` per job, and when a job completes. A job whose dataset cannot be read here
(say, it was submitted from another machine) is logged once and skipped.

Stops on SIGTERM or Ctrl-C, after the read in progress; exit status 0, or 2 for bad arguments or a
``--topic-prefix`` with no pipeline behind it (one line naming the prefixes there), 1 if Kafka fails.
A broker outage is no failure: the collector says once that Kafka is away, waits, and resumes every
job from its journal once Kafka answers (processor.apps.ride); 1 only past ``--outage-exit-s``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from processor.cli.logs import add_log_arguments, setup_logging
from processor.cli.options import add_kafka_arguments, add_outage_argument, kafka_settings, ride_from
from processor.cli.serve import Serving

if TYPE_CHECKING:
    from processor.jobs.collect import Collection, JobCollector
    from processor.jobs.model import JobRecord
    from processor.jobs.topic import JobWriter
    from processor.kafka.topics import TopicNames

PROG = "tokenfabric collector"
log = logging.getLogger("tokenfabric.collector")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out-dir", required=True, help="folder for <job>.jsonl (or .parquet) and its journal")
    p.add_argument(
        "--format",
        choices=("jsonl", "parquet", "openai"),
        default="jsonl",
        help="output format (default: jsonl); openai: <job>.jsonl and <job>.errors.jsonl, the OpenAI "
        "batch output and error files",
    )
    p.add_argument("--poll-s", type=float, default=1.0, help="pause when nothing is new (default: 1)")
    p.add_argument(
        "--jobs-refresh-s", type=float, default=5.0, help="re-read the jobs topic this often (default: 5)"
    )
    p.add_argument(
        "--progress-every-s",
        type=float,
        default=10.0,
        help="write a job's progress at most this often (default: 10)",
    )
    p.add_argument("--once", action="store_true", help="collect what is there now, then exit")
    add_kafka_arguments(p)
    add_outage_argument(p)
    add_log_arguments(p)


class CollectorService:
    """The loop: find jobs, feed their collectors, finish the complete ones. One thread owns it."""

    def __init__(
        self,
        conf: Mapping[str, str],
        topics: TopicNames,
        out_dir: Path,
        fmt: str,
        *,
        progress_every_s: float = 10.0,
    ) -> None:
        from processor.jobs.collect import Collection
        from processor.jobs.topic import JobWriter

        self.conf = conf
        self.topics = topics
        self.out_dir = out_dir
        self.fmt = fmt
        self.progress_every_s = progress_every_s
        self.collection: Collection = Collection(conf, topics)
        self.writer: JobWriter = JobWriter(conf, topics)
        #: Jobs this run has nothing more to do for (complete), and jobs it cannot collect, with why.
        self.done: set[str] = set()
        self.skipped: dict[str, str] = {}
        self._progress_at: dict[str, float] = {}
        #: Per job written, the retry attempts its output includes.
        self._written_with: dict[str, set[str]] = {}
        #: Each job's ``max_attempts`` on the job-shares topic, as of the last :meth:`refresh`.
        self.max_attempts: dict[str, int] = {}

    def output(self, job: str) -> Path:
        return self.out_dir / f"{job}.{'jsonl' if self.fmt == 'openai' else self.fmt}"

    def refresh(self) -> None:
        """Read the jobs topic: start collecting new jobs, update the records of open ones, and
        hand each retry attempt to its job's collector (reopening a job already written)."""
        from processor.jobs.collect import attempts_of, max_attempts_by_job
        from processor.jobs.topic import read_job_share_records, read_jobs

        jobs = read_jobs(self.conf, self.topics)
        self.max_attempts = max_attempts_by_job(read_job_share_records(self.conf, self.topics))
        for name, job in jobs.items():
            if job.retry_of is not None:
                continue
            attempts = attempts_of(name, jobs)
            open_collector = self.collection.collectors.get(name)
            if open_collector is not None:
                open_collector.update(job)
                open_collector.max_attempts = self.max_attempts
                for attempt in attempts:
                    self.collection.add_attempt(attempt)
            elif name in self.done and any(a.name not in self._written_with.get(name, ()) for a in attempts):
                self.done.discard(name)  # a retry attempt since the output was written
                self._start(job, attempts)
            elif name not in self.done and name not in self.skipped:
                self._start(job, attempts)

    def _start(self, job: JobRecord, attempts: list[JobRecord]) -> None:
        from processor.jobs.collect import JobCollector, journal_path
        from processor.jobs.datasets import DatasetError
        from processor.jobs.journal import JournalError

        out = self.output(job.name)
        journal = journal_path(out)
        finished = all(rec.finished_ms is not None for rec in (job, *attempts))
        if finished and out.exists() and not _newer(journal, out):
            # written, from a journal that has not changed since (or was deleted)
            self.done.add(job.name)
            self._written_with[job.name] = {a.name for a in attempts}
            return
        try:
            collector = JobCollector.open(job, out, attempts=attempts, max_attempts=self.max_attempts)
        except (DatasetError, JournalError, OSError) as exc:
            self.skipped[job.name] = str(exc)
            log.error("job %s: not collected: %s", job.name, exc)
            return
        self.collection.add(collector)
        log.info("job %s: collecting into %s (%d rows so far)", job.name, out, collector.done)

    def step(self, max_s: float = 5.0) -> int:
        """One read of the results topic; finishes complete jobs. Returns the rows added."""
        added = self.collection.step(max_s)
        now = time.monotonic()
        for name, c in list(self.collection.collectors.items()):
            if c.complete:
                self._materialize(c)
                self._written_with[name] = set(c.attempts)
                self._write_progress(name)
                for line in c.summary().lines():
                    log.info("%s", line)
                log.info("job %s: complete, wrote %s", name, c.out)
                self.collection.remove(name)
                c.close()
                self.done.add(name)
            elif now - self._progress_at.get(name, 0.0) >= self.progress_every_s:
                self._write_progress(name)
        return added

    def _materialize(self, c: JobCollector) -> int:
        """Write ``c``'s output (and, for openai, its error file); returns the rows written."""
        if self.fmt == "openai":
            from processor.jobs.openai_output import errors_path

            return sum(c.materialize_openai(errors_path(c.out)))
        return c.materialize()

    def _write_progress(self, name: str) -> None:
        c = self.collection.collectors[name]
        self._progress_at[name] = time.monotonic()
        for rec in c.progress_records(time.time_ns() // 1_000_000):
            self.writer.write(rec)
            c.update(rec)

    def write_partial(self) -> None:
        """Write the outputs of the jobs still open, with the rows collected so far (``--once``)."""
        for name, c in self.collection.collectors.items():
            rows = self._materialize(c)
            self._write_progress(name)
            log.info("job %s: %d rows so far in %s", name, rows, c.out)

    def close(self) -> None:
        self.collection.close()
        self.writer.close()


def _newer(a: Path, b: Path) -> bool:
    """Whether ``a`` exists and was modified after ``b``."""
    return a.exists() and a.stat().st_mtime > b.stat().st_mtime


def run(args: argparse.Namespace) -> int:
    from processor.jobs.datasets import need_pyarrow
    from processor.kafka.config import ConfigError

    try:
        for name in ("poll_s", "jobs_refresh_s", "progress_every_s"):
            if not getattr(args, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
        if args.format == "parquet":
            need_pyarrow()
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        conf, topics = kafka_settings(args)
        ride_from(args)  # --outage-exit-s checked with the other arguments
    except (ValueError, ConfigError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    with Serving(PROG, log) as serving:
        return _collect(serving, conf, topics, out_dir, args)


def _collect(
    serving: Serving, conf: dict[str, str], topics: TopicNames, out_dir: Path, args: argparse.Namespace
) -> int:
    """Wait for the cluster, then collect until stopped; the exit status (the service is closed
    however it ends)."""
    from confluent_kafka import KafkaException

    from processor.apps.ride import Ride
    from processor.jobs.collect import CollectError
    from processor.jobs.topic import JobsTopicError
    from processor.kafka.exits import TransientFailure
    from processor.kafka.pipelines import NoSuchPipeline, check_pipeline

    try:
        if not serving.cluster_answered(conf):  # said once, retried until the cluster answers
            return 0
        try:
            check_pipeline(conf, topics)
        except NoSuchPipeline as exc:  # a typo in --topic-prefix: collect nothing under it
            serving.error(exc)
            return 2

        def collect_round(stop: threading.Event) -> None:
            """One round (processor.apps.ride): a fresh service resumes every job from its journal."""
            service = CollectorService(
                conf, topics, out_dir, args.format, progress_every_s=args.progress_every_s
            )
            try:
                serve(service, stop, poll_s=args.poll_s, jobs_refresh_s=args.jobs_refresh_s, once=args.once)
                open_jobs = sorted(service.collection.collectors)
                log.info(
                    "stopped: %d jobs complete, open: %s (their journals resume)",
                    len(service.done),
                    ", ".join(open_jobs) or "none",
                )
            finally:
                service.close()

        who = f"collector of pipeline {topics.prefix}"
        Ride(lambda: collect_round, conf, who, log, ride_from(args)).run(serving.stop)
    except (CollectError, JobsTopicError, KafkaException, TransientFailure) as exc:
        serving.error(exc)
        return 1 if isinstance(exc, (KafkaException, TransientFailure)) else 2  # the broker, or a job's state
    return 0


def serve(
    service: CollectorService, stop: threading.Event, *, poll_s: float, jobs_refresh_s: float, once: bool
) -> None:
    """Run ``service`` until ``stop`` is set (or, with ``once``, until a read finds nothing new)."""
    next_refresh = 0.0
    while not stop.is_set():
        if time.monotonic() >= next_refresh:
            service.refresh()
            next_refresh = time.monotonic() + jobs_refresh_s
        added = service.step()
        if once and not added:
            service.write_partial()
            return
        if not added:
            stop.wait(poll_s)
