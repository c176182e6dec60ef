"""``tokenfabric share JOB``: show or change a job's token share (weight and quotas), running or not.

The policy goes to the compacted job-shares topic keyed by the job's name; every processor instance
reads that topic from the beginning and applies each record as it arrives, so all of them, and one
restarted later, agree (docs/shares.md). The record also carries the job's lifecycle (cancelled, its
deadline: processor/ops/lifecycle.py), which a change of share keeps. ``--clear`` puts the job back to
weight 1, no quota: a tombstone, or, for a job cancelled or with a deadline, a record that keeps those.
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

    from processor.core.shares import JobPolicy
    from processor.kafka.config import ConfigError
    from processor.ops.lifecycle import (
        LifecycleError,
        change_job_share,
        describe_lifecycle,
        read_job_share,
        write_job_share,
    )

    try:
        policy = job_policy_from(args)
        if policy is not None and args.clear:
            raise ValueError("--clear takes no --weight or quota")
        conf, topics = kafka_settings(args, pipeline=True)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        current = read_job_share(conf, topics, args.job)
        if policy is None and not args.clear:
            shown = describe_policy(current.policy) if current else "weight 1 (default), no quota"
            lifecycle = describe_lifecycle(current)
            print(f"job {args.job}: {shown}{'; ' + lifecycle if lifecycle else ''}")
            return 0
        now_ms = time.time_ns() // 1_000_000
        if policy is None and (
            current is None
            or (current.cancelled_ms, current.deadline_ms, current.max_attempts) == (None,) * 3
        ):
            write_job_share(conf, topics, None, args.job)
        else:
            change_job_share(conf, topics, args.job, now_ms, policy=policy or JobPolicy())
    except (KafkaException, LifecycleError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"job {args.job}: {describe_policy(policy) if policy else 'weight 1, no quota'} ({topics.job_shares})"
    )
    return 0
