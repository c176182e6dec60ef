"""The jobs topic (compacted, keyed by job name): read every job, write one.

The latest record per key is the job; a tombstone forgets it. The topic is small (one record per job
after compaction, a few KB each), so every reader simply reads it whole.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, Message

from processor.core.shares import JobPolicy
from processor.jobs.codec import decode_job, encode_job, encode_job_share
from processor.jobs.model import JobRecord
from processor.kafka.factory import KAFKA
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.wire.errors import DecodeError
from processor.wire.job_share import JobShareRecord, decode_job_share_record

log = logging.getLogger(__name__)


class JobsTopicError(RuntimeError):
    """The jobs topic is missing or a write to it failed; the message says how to fix it."""


def read_jobs(conf: Mapping[str, str], topics: TopicNames, timeout_s: float = 30.0) -> dict[str, JobRecord]:
    """Every job on the jobs topic, by name (undecodable records are logged and skipped)."""
    jobs: dict[str, JobRecord] = {}
    for msg in read_topic(conf, topics.jobs, timeout_s=timeout_s):
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            jobs.pop(key, None)
            continue
        try:
            jobs[key] = decode_job(msg.value())
        except DecodeError as exc:
            log.warning("%s: skipping record at offset %s: %s", topics.jobs, msg.offset(), exc)
    return jobs


def read_job_share_records(
    conf: Mapping[str, str], topics: TopicNames, timeout_s: float = 30.0
) -> dict[str, JobShareRecord]:
    """Every job's record on the job-shares topic: its share policy and its lifecycle (cancelled,
    deadline); undecodable records are logged and skipped."""
    records: dict[str, JobShareRecord] = {}
    for msg in read_topic(conf, topics.job_shares, timeout_s=timeout_s):
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            records.pop(key, None)
            continue
        try:
            rec = decode_job_share_record(msg.value())
        except DecodeError as exc:
            log.warning("%s: skipping record at offset %s: %s", topics.job_shares, msg.offset(), exc)
            continue
        records[rec.job] = rec
    return records


def read_job_shares(
    conf: Mapping[str, str], topics: TopicNames, timeout_s: float = 30.0
) -> dict[str, JobPolicy]:
    """Every job's share policy on the job-shares topic (jobs with none have weight 1, no quota)."""
    return {job: rec.policy for job, rec in read_job_share_records(conf, topics, timeout_s).items()}


class JobWriter:
    """Writes job records, one at a time, each acknowledged before :meth:`write` returns.

    Job records are rare (a handful per job), so waiting for each ack is cheap and lets the caller
    say "recorded" only when it is.
    """

    def __init__(self, conf: Mapping[str, str], topics: TopicNames) -> None:
        self.topic = topics.jobs
        self.topics = topics
        self._producer = KAFKA.producer({**conf, "enable.idempotence": "true", "acks": "all"})
        self._error: str | None = None

    def check_topic(self, timeout_s: float = 10.0) -> None:
        meta = self._producer.list_topics(self.topic, timeout=timeout_s).topics.get(self.topic)
        if meta is None or meta.error is not None:
            raise JobsTopicError(
                f"topic {self.topic} does not exist: create it with 'tokenfabric topics create"
                f" --topic-prefix {self.topics.prefix}'"
            )

    def write(self, rec: JobRecord, timeout_s: float = 30.0) -> None:
        self._send(rec.name, encode_job(rec), timeout_s)

    def forget(self, name: str, timeout_s: float = 30.0) -> None:
        """A tombstone: compaction drops the job's records (results stay on the results topic)."""
        self._send(name, None, timeout_s)

    def write_share(
        self,
        job: str,
        policy: JobPolicy | None,
        set_ms: int,
        max_attempts: int | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """A new job's weight and quotas (and ``max_attempts``, None: the default) on the job-shares
        topic; None writes a tombstone (weight 1, no quota). Every processor instance applies it as
        it reads it (docs/shares.md). A job's later changes keep what they do not change
        (``processor.ops.lifecycle.change_job_share``)."""
        value = None if policy is None else encode_job_share(job, policy, set_ms, max_attempts)
        self._send(job, value, timeout_s, self.topics.job_shares)

    def _send(self, key: str, value: bytes | None, timeout_s: float, topic: str | None = None) -> None:
        topic = topic or self.topic
        self._error = None
        self._producer.produce(topic, value, key.encode("utf-8"), on_delivery=self._on_delivery)
        if self._producer.flush(timeout_s):
            raise JobsTopicError(f"job {key}: record not acknowledged by {topic} within {timeout_s:g} s")
        if self._error is not None:
            raise JobsTopicError(f"job {key}: writing {topic} failed: {self._error}")

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._error = err.str()

    def close(self) -> None:
        self._producer.flush(5.0)
