"""The processor's side of a job's lifecycle: the job-shares record applied to the core, the
completions it writes for the items of a job that ended, and the wait for the records at start.

The core withdraws the waiting items of a cancelled or expired job (processor/core/endings.py); the
processor answers each with a completion of that status on the results topic, in the transaction
that also drops the items from the changelog's waiting sets and checkpoints the ledger that counts
them (``LaneLog.withdrawn``), so a crash either keeps the items waiting and unanswered (the
restarted processor withdraws and answers them again) or has done all three. Their
``CompletionBatch`` has ``batch_id`` "" and ``consumer`` "": no batch held them, and the processor,
which reads the results topic, passes over its own answers by that empty ``batch_id``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from processor.apps.settings import MAX_COMPLETION_BYTES
from processor.core.endings import Ending
from processor.core.item import Item
from processor.core.scheduler import Scheduler
from processor.core.shares import JobPolicy
from processor.kafka.factory import ConsumerClient
from processor.kafka.reader import watermarks
from processor.kafka.topics import TopicNames
from processor.state.durability import Durability
from processor.state.lane_log import LaneLog
from processor.wire.completions import encode_completion_batches
from processor.wire.errors import DecodeError
from processor.wire.job_share import JobShareRecord, decode_job_share_record
from processor.wire.records import CompletionBatchRecord, ItemOutcomeRecord
from processor.wire.registry_framing import frame_single_object

log = logging.getLogger("tokenfabric.processor")

REASONS: dict[Ending, str] = {
    "cancelled": "job cancelled before the item was dispatched (tokenfabric cancel)",
    "expired": "the job's deadline passed before the item was dispatched",
}
"""The ``reason`` of each ending's completions."""


def apply_job_share(core: Scheduler, job: str, rec: JobShareRecord | None, now_ms: int) -> None:
    """One job-shares record (None: a tombstone) applied to the core: the policy, the deadline, the
    attempts its items get (``max_attempts``), and a cancel, which is final (a later record without
    it does not revive the job)."""
    if rec is None:
        core.set_policy(job, JobPolicy())
        core.set_deadline(job, None, now_ms)
        core.set_max_attempts(job, None)
        return
    core.set_policy(job, rec.policy)
    core.set_max_attempts(job, rec.max_attempts)
    if rec.cancelled_ms is not None:
        core.end_job(job, "cancelled", now_ms)
    core.set_deadline(job, rec.deadline_ms, now_ms)


def apply_job_share_message(core: Scheduler, msg: Any, now_ms: int, topic: str) -> None:
    """A message of the job-shares topic applied (a record it cannot read is logged and skipped)."""
    job = (msg.key() or b"").decode("utf-8", "replace")
    if msg.value() is None:
        apply_job_share(core, job, None, now_ms)
        log.info("job %r: share cleared (weight 1, no quota)", job)
        return
    try:
        rec = decode_job_share_record(msg.value())
    except DecodeError as exc:
        log.error("%s: undecodable share for %r: %s", topic, job, exc)
        return
    apply_job_share(core, rec.job, rec, now_ms)
    ended = core.view.ended(rec.job)
    log.info("job %r: share %s%s", rec.job, rec.policy, f" ({ended})" if ended else "")


def answer_ended(
    core: Scheduler, durability: Durability, lanes: LaneLog, topics: TopicNames, now_ms: int,
    schema_id: int | None = None,
) -> int:  # fmt: skip
    """Answer every item the core withdrew since the last call with a completion of its job's
    ending, told to the lane log ``lanes`` (which drops them from the changelog's waiting sets in
    the same transaction); returns how many. ``schema_id``: registry-framed under it
    (``--results-framing registry``)."""
    ended = core.take_ended()
    results = topics.results
    for key, values, items in ended_messages(ended, now_ms, MAX_COMPLETION_BYTES):
        if schema_id is not None:
            values = [frame_single_object(schema_id, v) for v in values]
        for value in values[:-1]:
            durability.produce(results, value, key)
        durability.produce(results, values[-1], key, lanes.withdrawn(items))
    return len(ended)


def ended_messages(
    ended: Sequence[tuple[Item, Ending]], completed_ms: int, max_bytes: int
) -> Iterator[tuple[bytes, list[bytes], list[Item]]]:
    """The results messages answering ``ended``: (key, values, the items they answer), one
    ``CompletionBatch`` per job, model and ending (split past ``max_bytes`` into several values, in
    order, under one key: one partition), keyed by the job."""

    def group(entry: tuple[Item, Ending]) -> tuple[str, str, str]:
        return entry[0].job, entry[0].model, entry[1]

    for (job, model, name), entries in groupby(sorted(ended, key=group), key=group):
        ending = cast(Ending, name)
        items = [item for item, _ in entries]
        outcomes = [
            ItemOutcomeRecord(
                item_id=item.id, status=ending, job_id=job, reason=REASONS[ending], input_tokens=item.length
            )
            for item in items
        ]
        rec = CompletionBatchRecord(
            batch_id="", consumer="", model=model, completed_ms=completed_ms, items=outcomes
        )
        yield job.encode("utf-8"), encode_completion_batches(rec, max_bytes), items


CATCH_UP_WAIT_S = 10.0
"""How long dispatch waits at most for the job-shares topic to be read to its end: past it, it goes
on with what it has read (a WARNING says so), so that a topic whose last offsets hold no message any
more (compaction) cannot stop the processor."""


class SharesCatchUp:
    """Whether the control consumer has read the job-shares topic up to where it ended when it was
    (re)assigned: until it has, the processor does not dispatch, so that no item of a job cancelled
    (or expired) before a restart or a handover goes out before the record that ends it is read.
    Reading a compacted topic of one record per job takes milliseconds; ``CATCH_UP_WAIT_S`` bounds it."""

    def __init__(self) -> None:
        self.topic = ""
        self.pending: dict[int, int] = {}
        """Per job-shares partition: the end offset still to reach."""
        self.since_s = 0.0

    def expect(
        self, control: ConsumerClient, topic: str, partitions: list[int], now_s: float
    ) -> list[TopicPartition]:
        """Expect ``topic``'s partitions read to where they end now; returns them assigned from the
        beginning, for the control consumer."""
        self.topic = topic
        self.since_s = now_s
        ends = {p: watermarks(control, TopicPartition(topic, p), 30)[1] for p in partitions}
        self.pending = {p: end for p, end in ends.items() if end > 0}
        return [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]

    def read(self, partition: int, offset: int) -> None:
        end = self.pending.get(partition)
        if end is not None and offset + 1 >= end:
            del self.pending[partition]

    def ready(self, control: ConsumerClient, now_s: float) -> bool:
        """True once every partition is read to its end (asked of the consumer's position too), or
        once ``CATCH_UP_WAIT_S`` has passed."""
        if not self.pending:
            return True
        parts = [TopicPartition(self.topic, p) for p in self.pending]
        for tp in control.position(parts):
            if tp.offset >= 0 and tp.offset >= self.pending.get(tp.partition, 0):
                del self.pending[tp.partition]
        if self.pending and now_s - self.since_s > CATCH_UP_WAIT_S:
            log.warning(
                "%s: not read to its end (%s) after %.0f s; dispatching with the records read so far",
                self.topic,
                self.pending,
                CATCH_UP_WAIT_S,
            )
            self.pending.clear()
        return not self.pending
