"""The processor's control plane: what the control consumer reads and what it means.

The control consumer is assigned by hand (never by a group): the contracts topic from the beginning
(compacted: the latest announcement per consumer), the job-shares topic from the beginning (every
job's policy and lifecycle), and the results topic from where the delivery mode's ownership says.
Contracts tell the core who may take work (with this instance's share of each consumer's slots, the
slot placement's to say); job shares set policies and end jobs, whose waiting items this plane
answers; completions (processor/apps/completions.py) free slots.

:class:`ControlPlane` works only on what its :class:`ControlContext` gives it, as the handover does
on its HandoverContext; the service owns both and calls them from its loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.apps.completions import CompletionReader
from processor.apps.endings import SharesCatchUp, answer_ended, apply_job_share_message
from processor.apps.observe import ServiceCounters, ServiceObserver
from processor.core.contract import Contract
from processor.core.scheduler import Scheduler
from processor.kafka.exits import fatal
from processor.kafka.factory import ConsumerClient
from processor.kafka.topics import TopicNames
from processor.state.credits import CreditBook
from processor.state.modes import DeliveryMode
from processor.state.results import ResultsCursor
from processor.wire.control import decode_contract
from processor.wire.errors import DecodeError

log = logging.getLogger("tokenfabric.processor")


@dataclass(frozen=True, slots=True)
class ControlContext:
    """Everything the control plane works on, passed in by the service that owns it."""

    control: ConsumerClient
    topics: TopicNames
    core: Scheduler
    mode: DeliveryMode
    credits: CreditBook
    results: ResultsCursor
    counters: ServiceCounters
    observer: ServiceObserver
    instance: str
    clock: Callable[[], float]
    """Monotonic seconds (the wait for the job-shares topic)."""
    results_schema_id: int | None = None
    """``--results-framing registry``: the answers to ended jobs' items registry-framed under it."""


class ControlPlane:
    """Reads contracts, job shares and completions, and answers the items of jobs that ended.

    ``shares_read``: the job-shares topic read to its end since the last (re)assignment, which
    dispatch waits for (:meth:`ready`). ``completions.last_completion_ms``: each consumer's latest
    answer, for the checkpoint.
    """

    def __init__(self, context: ControlContext) -> None:
        c = self.ctx = context
        self.shares_read = SharesCatchUp()
        self.completions = CompletionReader(
            c.core,
            c.mode.lane_log,
            c.mode.in_flight,
            c.credits,
            c.results,
            c.counters,
            c.observer,
            c.instance,
        )

    def partitions(self, topic: str) -> list[int]:
        """``topic``'s partitions, asked through the control consumer. It assigns the contracts and
        results topics by hand: a client that does not know a partition's leader yet when assigned
        a logical offset (``OFFSET_BEGINNING``) waits librdkafka's fixed 500 ms before it asks
        again, which delayed every start and handover by half a second."""
        meta = self.ctx.control.list_topics(topic, timeout=30)
        info = meta.topics.get(topic)
        if info is None or info.error is not None:
            raise KafkaException(info.error if info else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return sorted(info.partitions)

    def assign(self) -> None:
        """Contracts from the beginning (compacted: the latest announcement per consumer), results
        from where the ownership says (processor.state.ownership.Ownership.results_assignment)."""
        topics = self.ctx.topics
        assignment = [
            TopicPartition(topics.contracts, p, OFFSET_BEGINNING) for p in self.partitions(topics.contracts)
        ]
        assignment += self._job_shares_assignment()
        results = topics.results
        assignment += self.ctx.mode.ownership.results_assignment(
            results, self.partitions(results), self.ctx.results
        )
        self.ctx.control.assign(assignment)

    def ready(self) -> bool:
        """Whether dispatch may go on: the job-shares topic is read to its end (or the wait ran out)."""
        return self.shares_read.ready(self.ctx.control, self.ctx.clock())

    def read(self, now: int) -> None:
        """Everything the control consumer has now, applied in order."""
        topics = self.ctx.topics
        for msg in self.ctx.control.consume(num_messages=10_000, timeout=0):
            err = msg.error()
            if err is not None:
                if fatal(err):
                    raise KafkaException(err)
                continue
            if msg.topic() == topics.contracts:
                self._contract(msg, now)
            elif msg.topic() == topics.job_shares:
                self._job_share(msg, now)
            else:
                self.completions.apply(msg, now)

    def set_contract(self, contract: Contract) -> None:
        """Announce ``contract`` to the core, with this instance's share of its slots."""
        share = self.ctx.mode.placement.slot_share(self.ctx.credits, contract.max_inflight)
        self.ctx.core.set_contract(contract, share)

    def answer_ended(self, now_ms: int) -> None:
        """Answer the items of jobs that ended since the last call (processor/apps/endings.py)."""
        c = self.ctx
        c.counters.ended_items += answer_ended(
            c.core, c.mode.durability, c.mode.lane_log, c.topics, now_ms, c.results_schema_id
        )

    # -- job shares (docs/shares.md) -------------------------------------------------------------

    def _job_shares_assignment(self) -> list[TopicPartition]:
        """The job-shares topic from the beginning (compacted: every instance, a restarted one too,
        ends up with the latest policy and lifecycle per job), and where it ends now, which dispatch
        waits for (``shares_read``); none when the topic does not exist (a pipeline created before
        it: every job then has weight 1, until ``tokenfabric topics create``)."""
        topic = self.ctx.topics.job_shares
        try:
            parts = self.partitions(topic)
        except KafkaException as exc:
            log.warning("%s: %s; every job has weight 1, no quota", topic, exc)
            return []
        return self.shares_read.expect(self.ctx.control, topic, parts, self.ctx.clock())

    def _job_share(self, msg: Any, now: int) -> None:
        """A job's share and lifecycle (processor/apps/endings.py): its policy, its deadline, a cancel."""
        self.shares_read.read(msg.partition(), msg.offset())
        apply_job_share_message(self.ctx.core, msg, now, self.ctx.topics.job_shares)

    # -- contracts -------------------------------------------------------------------------------

    def _contract(self, msg: Any, now: int) -> None:
        value = msg.value()
        consumer = (msg.key() or b"").decode("utf-8", "replace")
        if value is None:
            self._retire(consumer, now)
            return
        try:
            rec = decode_contract(value)
        except DecodeError as exc:
            log.error("contracts: undecodable announcement for %r: %s", consumer, exc)
            return
        self.set_contract(rec.contract)
        self.ctx.counters.contracts += 1
        log.info("contract %s", rec.contract)

    def _retire(self, consumer: str, now: int) -> None:
        """A contract's tombstone: the consumer's batches in flight go back to their lanes."""
        core = self.ctx.core
        if core.view.contract(consumer) is None:
            return
        returned = core.retire(consumer, now)
        for batch in returned:
            self.ctx.credits.free(batch.batch_id)
            self.ctx.mode.lane_log.requeued(batch.batch_id, batch.items)
        log.info("consumer %s retired; %d batches go back to their lanes", consumer, len(returned))
