"""A job's lifecycle on the job-shares topic: cancel it, give it a deadline, change its share.

Every change reads the job's current ``JobShare`` record and writes it back whole with one field
changed (processor/wire/job_share.py says why the lifecycle rides on the share record), so a
``share --weight`` after a ``cancel`` keeps the job cancelled, and a cancel keeps its weight. Two
people changing one job at the same instant may lose one change (the topic has no compare-and-set);
cancel is idempotent, so running it again is always safe.

``submit`` calls :func:`record_deadline` with the deadline :func:`deadline_from` makes of its
``--window`` or ``--deadline`` (docs/jobs.md, "Lifecycle").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from confluent_kafka import KafkaError, Message

from processor.core.retries import check_max_attempts
from processor.core.shares import JobPolicy
from processor.kafka.factory import KAFKA, ClientFactory
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.wire.errors import DecodeError
from processor.wire.job_share import JobShareRecord, decode_job_share_record, encode_job_share_record

_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class LifecycleError(RuntimeError):
    """A lifecycle record could not be read or written; the message says why."""


def window_ms(text: str) -> int:
    """``24h``, ``90m``, ``1.5d``, ``30s``, ``500ms`` (the OpenAI form is ``24h``) in milliseconds;
    ``ValueError`` for anything else, or for a window that is not positive."""
    m = _WINDOW.match(text)
    if m is None:
        raise ValueError(f"window {text!r}: expected a number and a unit (ms, s, m, h, d), e.g. 24h")
    ms = int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    if ms <= 0:
        raise ValueError(f"window {text!r} must be positive")
    return ms


def deadline_ms_of(text: str) -> int:
    """An ISO 8601 time (``2026-12-04T06:00:00Z``, ``2026-12-04 06:00+01:00``) as epoch milliseconds;
    a time without a zone is UTC. ``ValueError`` for anything else."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"deadline {text!r}: expected an ISO 8601 time, e.g. 2026-12-04T06:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def deadline_from(window: str | None, deadline: str | None, now_ms: int) -> int | None:
    """The deadline ``submit --window`` (from ``now_ms``) or ``--deadline`` asks for; None for
    neither, ``ValueError`` for both or for a malformed one."""
    if window is not None and deadline is not None:
        raise ValueError("give --window or --deadline, not both")
    if window is not None:
        return now_ms + window_ms(window)
    return None if deadline is None else deadline_ms_of(deadline)


def max_attempts_from(value: str | None) -> int | None:
    """``submit --max-attempts``: the dispatches each of the job's items gets in all (None: not
    given, the processors' default); ``ValueError`` with how to fix it for anything but an integer
    >= 1."""
    if value is None:
        return None
    try:
        return check_max_attempts(int(value))
    except ValueError:
        raise ValueError(
            f"--max-attempts must be a whole number >= 1 (1: never retry a failed item), got {value!r}"
        ) from None


def read_job_share(
    conf: Mapping[str, str], topics: TopicNames, job: str, clients: ClientFactory = KAFKA
) -> JobShareRecord | None:
    """The job's latest record on the job-shares topic (None: none, or a tombstone)."""
    latest: JobShareRecord | None = None
    key = job.encode("utf-8")
    for msg in read_topic(conf, topics.job_shares, clients=clients):
        if msg.key() != key:
            continue
        if msg.value() is None:
            latest = None
            continue
        try:
            latest = decode_job_share_record(msg.value())
        except DecodeError as exc:
            raise LifecycleError(f"{topics.job_shares}: job {job!r}: unreadable record: {exc}") from None
    return latest


def write_job_share(
    conf: Mapping[str, str],
    topics: TopicNames,
    rec: JobShareRecord | None,
    job: str,
    timeout_s: float = 30.0,
    clients: ClientFactory = KAFKA,
) -> None:
    """Write ``rec`` (None: a tombstone for ``job``) and wait for the broker's acknowledgement."""
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err.str())

    producer = clients.producer({**conf, "enable.idempotence": "true", "acks": "all"})
    value = None if rec is None else encode_job_share_record(rec)
    producer.produce(topics.job_shares, value, job.encode("utf-8"), on_delivery=delivered)
    if producer.flush(timeout_s):
        raise LifecycleError(
            f"job {job}: record not acknowledged by {topics.job_shares} within {timeout_s:g} s"
        )
    if errors:
        raise LifecycleError(f"job {job}: writing {topics.job_shares} failed: {errors[0]}")


def change_job_share(
    conf: Mapping[str, str],
    topics: TopicNames,
    job: str,
    now_ms: int,
    *,
    policy: JobPolicy | None = None,
    cancel: bool = False,
    deadline_ms: int | None = None,
    max_attempts: int | None = None,
    clients: ClientFactory = KAFKA,
) -> JobShareRecord:
    """Read the job's record, change what is given (a policy, a cancel, a deadline, the attempts its
    items get), keep the rest, write it back; returns what was written. A cancel keeps the first
    cancel time."""
    if not job:
        raise ValueError("a job needs a name")
    current = read_job_share(conf, topics, job, clients) or JobShareRecord(job, JobPolicy(), now_ms)
    rec = replace(current, set_ms=now_ms)
    if policy is not None:
        rec = replace(rec, policy=policy)
    if cancel and rec.cancelled_ms is None:
        rec = replace(rec, cancelled_ms=now_ms)
    if deadline_ms is not None:
        rec = replace(rec, deadline_ms=deadline_ms)
    if max_attempts is not None:
        rec = replace(rec, max_attempts=max_attempts)
    write_job_share(conf, topics, rec, job, clients=clients)
    return rec


def record_deadline(
    conf: Mapping[str, str],
    topics: TopicNames,
    job: str,
    deadline_ms: int | None,
    now_ms: int,
    clients: ClientFactory = KAFKA,
    max_attempts: int | None = None,
) -> JobShareRecord:
    """``submit``'s call: the job's items not dispatched by ``deadline_ms`` end ``expired``, and each
    gets ``max_attempts`` dispatches (None for either: not changed). Write it before the job's first
    item, as the share is, so that no processor sees an item without it."""
    return change_job_share(
        conf, topics, job, now_ms, deadline_ms=deadline_ms, max_attempts=max_attempts, clients=clients
    )


def describe_lifecycle(rec: JobShareRecord | None) -> str:
    """``cancelled at 2026-12-03 21:05:00 UTC``, ``deadline 2026-12-04 21:00:00 UTC``, both, or ""."""
    parts = []
    if rec is not None and rec.cancelled_ms is not None:
        parts.append(f"cancelled at {utc(rec.cancelled_ms)}")
    if rec is not None and rec.deadline_ms is not None:
        parts.append(f"deadline {utc(rec.deadline_ms)}")
    return ", ".join(parts)


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
