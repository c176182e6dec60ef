"""``tokenfabric cancel JOB``: stop a job. Its waiting items never go out, batches in flight finish.

The cancel is a field of the job's record on the compacted job-shares topic (processor/ops/lifecycle.py
keeps the job's weight and deadline), which every processor instance reads from the beginning: each
withdraws the job's waiting items from its lanes and answers every one with a ``cancelled``
completion, and drops the job's items still in the ingest topic as they arrive, the same way. A
restarted instance, or one that takes over partitions, reads the record again before it dispatches.
``collect`` then writes every row once (docs/jobs.md, "Lifecycle"). Cancelling again changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time

from processor.cli.options import add_kafka_arguments, kafka_settings

PROG = "tokenfabric cancel"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job to cancel (a submitted job's name; TokenItem.job_id)")
    add_kafka_arguments(p)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.jobs.model import check_job_name
    from processor.jobs.topic import read_jobs
    from processor.kafka.config import ConfigError
    from processor.ops.lifecycle import LifecycleError, change_job_share, utc

    try:
        check_job_name(args.job)
        conf, topics = kafka_settings(args, pipeline=True)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.job not in read_jobs(conf, topics):  # a typo, or items a producer labelled itself
            print(
                f"{PROG}: warning: no job {args.job!r} on {topics.jobs}; items whose job_id is "
                f"{args.job!r} are cancelled all the same",
                file=sys.stderr,
            )
        rec = change_job_share(conf, topics, args.job, time.time_ns() // 1_000_000, cancel=True)
    except (KafkaException, LifecycleError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    assert rec.cancelled_ms is not None
    print(
        f"job {args.job}: cancelled at {utc(rec.cancelled_ms)} ({topics.job_shares}); its waiting items "
        "end 'cancelled' as each processor reads this, batches in flight finish"
    )
    return 0
