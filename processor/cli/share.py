"""``tokenfabric share JOB``: show or change a job's token share (weight and quotas), running or not.

The policy goes to the compacted job-shares topic keyed by the job's name; every processor instance
reads that topic from the beginning and applies each record as it arrives, so all of them, and one
restarted later, agree (docs/shares.md). ``--clear`` writes a tombstone: weight 1, no quota.
"""

from __future__ import annotations

import argparse
import sys
import time

from processor.cli.options import (
    add_job_policy_arguments,
    add_kafka_arguments,
    describe_policy,
    job_policy_from,
    kafka_settings,
)

PROG = "tokenfabric share"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job (TokenItem.job_id; a submitted job's name)")
    add_job_policy_arguments(p)
    p.add_argument("--clear", action="store_true", help="back to weight 1, no quota")
    add_kafka_arguments(p)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.jobs.topic import JobsTopicError, JobWriter, read_job_shares
    from processor.kafka.config import ConfigError

    try:
        policy = job_policy_from(args)
        if policy is not None and args.clear:
            raise ValueError("--clear takes no --weight or quota")
        conf, topics = kafka_settings(args, pipeline=True)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        if policy is None and not args.clear:
            current = read_job_shares(conf, topics).get(args.job)
            print(
                f"job {args.job}: {describe_policy(current) if current else 'weight 1 (default), no quota'}"
            )
            return 0
        writer = JobWriter(conf, topics)
        try:
            writer.write_share(args.job, policy, time.time_ns() // 1_000_000)
        finally:
            writer.close()
    except (KafkaException, JobsTopicError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"job {args.job}: {describe_policy(policy) if policy else 'weight 1, no quota'} ({topics.job_shares})"
    )
    return 0
