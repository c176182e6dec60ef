"""The processor: one owner thread drives the scheduling core from Kafka and back.

Each step of the loop, in order:

1. consume up to ``consume_batch`` ingest messages; decode each into an item (or dead-letter it with
   its reason and original bytes) and submit it to the core;
2. read contracts (compacted, from the beginning) and completions, which tell the core who may take
   work and which in-flight slots are free;
3. ask the core for batches and produce each to its consumer's topic;
4. every ``commit_interval_ms``: make all of that durable through the committer
   (``processor/state/commit.py``: one Kafka transaction in exactly-once mode) with a ledger checkpoint.

At start-up in exactly-once mode the processor first fences any older process with its transactional
id and loads its last ledger checkpoint. Lane state belongs to ingest partitions, not to instances:
whenever the group assigns partitions (at start, or when instances join or leave) the processor
commits, releases everything it held, and restores the changelog of the partitions it now owns
(``processor/state/handover.py``, ``processor/state/restore.py``); consumer in-flight slots move with them
(``processor/state/credits.py``).

librdkafka's own threads do the network I/O; everything that touches lanes or the ledger runs here,
so nothing on the hot path takes a lock. The core is unaware of Kafka; this module is the adapter.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.apps.checkpoint import checkpoint_record, share_counters
from processor.apps.deadletters import dead_letter_of
from processor.apps.endings import SharesCatchUp, answer_ended, apply_job_share_message
from processor.apps.observe import ServiceCounters, ServiceObserver, ServiceStatus, UnservedWatch
from processor.apps.settings import ProcessorSettings
from processor.core.accounting import Ledger, LedgerImbalance
from processor.core.contract import Contract
from processor.core.item import Batch
from processor.core.scheduler import Scheduler
from processor.core.shares import Shares
from processor.kafka.clients import (
    batch_producer_settings,
    control_settings,
    ingest_settings,
    static_member_present,
)
from processor.kafka.exits import MissingTopics, ended_by, fatal, taking_over
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient
from processor.kafka.reader import watermarks
from processor.kafka.topics import TopicNames
from processor.kafka.watchdog import CallWatchdog, guarded
from processor.state.commit import AtLeastOnceCommitter, TransactionalCommitter
from processor.state.committer import Committer
from processor.state.credits import CreditBook
from processor.state.handover import HandoverContext, PartitionHandover, Restored
from processor.state.ingest import IngestItem
from processor.state.restore import OnWaiting, RestoredState, latest_checkpoint, restore, transactional_id
from processor.state.results import ResultsCursor
from processor.wire.completion_heads import decode_completions_head
from processor.wire.control import (
    DUPLICATE_ITEM_ID,
    decode_contract,
    encode_dead_letter,
    encode_ledger_snapshot,
)
from processor.wire.errors import DecodeError
from processor.wire.heads import ItemHead, decode_item_head
from processor.wire.items import encode_batch
from processor.wire.records import LedgerSnapshotRecord

log = logging.getLogger("tokenfabric.processor")

__all__ = ["IngestItem", "ProcessorService", "ProcessorSettings", "ServiceCounters", "ServiceObserver"]


class ProcessorService:
    """The processor's owner thread and its Kafka clients.

    Its collaborators are passed in or built from what is passed in: the Kafka clients come from
    ``clients`` (a :class:`~processor.kafka.factory.ClientFactory`: the real one by default, the
    in-memory stand-in in tests), the delivery mode is the committer (``settings.exactly_once``
    picks it once, here), the rebalance callbacks a :class:`PartitionHandover` on a HandoverContext.

    Read-only views for metrics and health (safe to read from another thread, values may be a step
    old): ``core`` (the scheduler: read its ``view``), ``status`` (ingest partitions owned and their
    lag, taken each step), ``counters``, ``lag`` (ingest messages not yet consumed, per partition),
    ``last_step_s`` (monotonic time the loop last completed a step), ``last_broker_ok_s`` (last time
    the broker answered), ``ledger_error`` (why the last ledger check failed, or None),
    ``restoring_since_s`` and ``owned`` (the handover's).
    """

    def __init__(
        self,
        conf: dict[str, str],
        topics: TopicNames,
        settings: ProcessorSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        clients: ClientFactory = KAFKA,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.conf = dict(conf)
        self.clients = clients
        self.topics = topics
        s = settings or ProcessorSettings()
        if not s.group_id:
            s = replace(s, group_id=topics.processor_group)
        self.settings = s
        self._clock = clock
        self._t0 = clock()
        self._wall_at_t0 = wall_ms()
        self.core = Scheduler(
            s.lanes,
            s.dispatch,
            ledger=Ledger(),
            batch_prefix=f"{s.instance}-{int(time.time() * 1000)}",
            shares=Shares(s.shares),
        )
        self.counters = ServiceCounters()
        self.observer = ServiceObserver()
        self.lag: dict[int, int] = {}
        self.status = ServiceStatus()  # what metrics read (ServiceStatus): taken each step
        self.last_step_s = clock()
        self.last_broker_ok_s = clock()
        self.ledger_error: str | None = None
        self._checkpoint_seq = 0
        self._cache_hit: dict[str, bool] = {}
        self._last_tick = -1 << 62
        self.unserved_watch = UnservedWatch()
        self._last_completion_ms: dict[str, int] = {}  # per consumer: its latest result's timestamp
        self.ingest_paused = False
        self.credits = CreditBook(0)
        self.results = ResultsCursor()
        self.shares_read = SharesCatchUp()
        """The job-shares topic read to its end since the last (re)assignment: dispatch waits for it."""
        self.watchdog: CallWatchdog | None = None
        """Set by the CLI: ends the process if a commit blocks forever (processor/kafka/watchdog.py)."""

        self.identity = transactional_id(s.instance, s.group_id)
        """Its transactional id and its group.instance.id: one identity, fenced as one by a twin."""
        self.ingest: ConsumerClient = clients.consumer(
            ingest_settings(self.conf, s.group_id, s.session_timeout_ms, self.identity)
        )
        self.control: ConsumerClient = clients.consumer(
            control_settings(self.conf, f"{s.group_id}-control-{s.instance}")
        )
        self.committer = self._committer(s)
        self.producer = self.committer.producer
        self.handover = PartitionHandover(self._handover_context())

    def _committer(self, s: ProcessorSettings) -> Committer:
        """The delivery mode, chosen once: everything else asks the committer what the mode means."""
        args = (self.ingest, self.control, self.topics, s.instance, s.commit_interval_ms)
        if not s.exactly_once:
            return AtLeastOnceCommitter(self.clients.producer(batch_producer_settings(self.conf)), *args)
        producer_settings = batch_producer_settings(self.conf, self.identity, s.transaction_timeout_ms)
        return TransactionalCommitter(
            self.clients.producer(producer_settings),
            *args,
            is_in_flight=self.core.is_in_flight,
            done_items=self.core.done_items,
            eager_ms=s.eager_commit_ms,
            dedupe_window_ms=s.dedupe_window_ms,
            dedupe_max_ids=s.dedupe_max_ids,
        )

    def _handover_context(self) -> HandoverContext:
        return HandoverContext(
            core=self.core,
            committer=self.committer,
            credits=self.credits,
            results=self.results,
            restore=self._restore,
            commit=lambda: self._commit(force=True),
            set_contract=self._set_contract,
            reassign_results=self._assign_control,
            now_ms=self.now_ms,
            clock=self._clock,
            on_restored=self._restored,
        )

    def _restore(
        self,
        partitions: list[int],
        on_contracts: Callable[[dict[str, Contract]], None],
        on_waiting: OnWaiting,
    ) -> RestoredState:
        return restore(
            self.conf, self.topics, self.settings.group_id, partitions, on_contracts, on_waiting, self.clients
        )

    def _restored(self, done: Restored) -> None:
        c = self.counters
        c.assignments += 1
        c.restored_items += done.waiting_items
        c.restored_batches += done.batches
        c.restore_seconds += done.seconds
        self.last_step_s = self._clock()
        log.info(
            "processor %s: assigned ingest partitions %s; adopted %d waiting items and %d batches in %.2f s",
            self.settings.instance,
            done.partitions,
            done.waiting_items,
            done.batches,
            done.seconds,
        )

    @property
    def owned(self) -> frozenset[int]:
        """The ingest partitions whose lane state this instance holds (exactly-once)."""
        return self.handover.owned

    @property
    def restoring_since_s(self) -> float | None:
        """Set while assigned partitions are being restored (health: live, not ready)."""
        return self.handover.restoring_since_s

    # -- lifecycle -----------------------------------------------------------------------------

    def now_ms(self) -> int:
        """The core's clock: epoch milliseconds, advancing with the monotonic ``clock``.

        Epoch, because its readings leave the process: a batch's ``created_ms`` is on the wire
        (the consumer's ``queued_ms`` subtracts the item's ``produced_ms`` from it) and in the
        changelog (a restarted or succeeding instance adopts it, so both must count from the same
        origin). Anchored once at start and advanced by the monotonic clock, so that a wall-clock
        step (NTP) never moves the core's time backwards.
        """
        return self._wall_at_t0 + int((self._clock() - self._t0) * 1000)

    def start(self) -> None:
        """Fence older instances and load the last checkpoint (exactly-once), then subscribe; lane
        state arrives with the partitions the group assigns (``_on_assign``).

        The service owns its process: the hot path allocates an item, its body and a few strings a
        message and no reference cycles of its own, so the cyclic collector runs its first generation
        every 50,000 allocations, not 700 (it took 8-13% of the loop, 1/3 of restore: docs/benchmarks.md)."""
        gc.set_threshold(50_000, 20, 100)
        self._check_topics()
        self.committer.watchdog = self.watchdog
        member = self.identity
        if static_member_present(self.conf, self.settings.group_id, member, clients=self.clients):
            log.warning("%s", taking_over(self._who(), member))  # said before this process fences it
        self.committer.start()
        self.credits.count_partitions(len(self._partitions(self.topics.ingest)))
        self.committer.on_start(self._resume)
        self.ingest.subscribe(
            [self.topics.ingest], on_assign=self.handover.on_assign, on_revoke=self.handover.on_revoke
        )
        self._assign_control()

    def _resume(self) -> None:
        """Lane state moves with partitions: resume the ledger from the last checkpoint, and read
        completions from the results topic's end (everything before it belongs to batches this
        instance does not hold; those restored later are found by rewinding the cursor)."""
        self.handover.resume(latest_checkpoint(self.conf, self.topics, self.settings.instance, self.clients))
        ends = {}
        for p in self._partitions(self.topics.results):
            _low, ends[p] = watermarks(self.control, TopicPartition(self.topics.results, p), 30)
        self.results.start_at(ends)

    def _assign_control(self) -> None:
        """Contracts from the beginning (compacted: the latest announcement per consumer), results
        from where the committer says (processor.state.committer.Committer.results_assignment)."""
        assignment = [
            TopicPartition(self.topics.contracts, p, OFFSET_BEGINNING)
            for p in self._partitions(self.topics.contracts)
        ]
        assignment += self._job_shares_assignment()
        results = self.topics.results
        assignment += self.committer.results_assignment(results, self._partitions(results), self.results)
        self.control.assign(assignment)

    def run(self, stop: threading.Event) -> None:
        """Process until ``stop`` is set, then make everything durable and close.

        On an exception nothing more is committed: the open transaction is abandoned (the broker
        aborts it) and a restart resumes from the last commit.
        """
        self.start()
        try:
            try:
                while not stop.is_set():
                    self.step()
            except BaseException:
                self._close(commit=False)
                raise
            self._close(commit=True)
        except Exception as exc:
            ended = self._ended_by(exc)
            if ended is exc:
                raise
            raise ended from None

    def _ended_by(self, exc: BaseException) -> BaseException:
        """``exc`` classified for the exit code: a twin, the broker's timeout abort, or itself
        (processor.kafka.exits.ended_by)."""
        age = self.committer.transaction_age_s()
        named = {**self.conf, "group.id": self.settings.group_id, "transactional.id": self.identity}
        return ended_by(exc, self._who(), age, self.settings.transaction_timeout_ms / 1000, named)

    def _who(self) -> str:
        return f"processor {self.settings.instance} of pipeline {self.topics.prefix}"

    def _close(self, commit: bool) -> None:
        """After a failure nothing more is committed, so nothing is flushed: a flush would only run
        delivery callbacks on a producer that may be fatally fenced, where confluent-kafka makes
        every callback raise (processor.kafka.exits.kafka_cause)."""
        log.info("processor %s: shutting down", self.settings.instance)
        self.handover.closing = True
        if commit:
            self._commit(force=True)
            self.core.check(deep=True)
            self.producer.flush(30)
        self.ingest.close()
        self.control.close()

    def _set_contract(self, contract: Contract) -> None:
        self.core.set_contract(contract, self.committer.slot_share(self.credits, contract.max_inflight))

    def _check_topics(self) -> None:
        """Raise :class:`MissingTopics` naming every topic the processor needs that does not exist."""
        t = self.topics
        needed = (t.ingest, t.results, t.contracts, t.accounting, t.changelog, t.dead_letter)
        existing = self.control.list_topics(timeout=30).topics
        missing = [name for name in needed if name not in existing]
        if missing:
            raise MissingTopics(
                f"missing topic(s) {', '.join(missing)} on {self.conf.get('bootstrap.servers', '?')}: "
                f"create them with 'tokenfabric topics create --topic-prefix {t.prefix}' (the topics Job)"
            )

    def _partitions(self, topic: str) -> list[int]:
        """``topic``'s partitions, asked through the control consumer. It assigns the contracts and
        results topics by hand: a client that does not know a partition's leader yet when assigned
        a logical offset (``OFFSET_BEGINNING``) waits librdkafka's fixed 500 ms before it asks
        again, which delayed every start and handover by half a second."""
        meta = self.control.list_topics(topic, timeout=30)
        info = meta.topics.get(topic)
        if info is None or info.error is not None:
            raise KafkaException(info.error if info else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return sorted(info.partitions)

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> int:
        """One pass of the loop; returns how many ingest messages it took."""
        s = self.settings
        msgs = self.ingest.consume(num_messages=s.consume_batch, timeout=s.poll_timeout_ms / 1000)
        now = self.now_ms()
        items = [item for item in (self._ingest(msg, now) for msg in msgs) if item is not None]
        if items:  # one pass for the poll's items, as ``submit`` on each in turn would place them
            self.core.submit_many(items, [now] * len(items))
        self._control(now)
        if self.shares_read.ready(self.control, self._clock()):
            for batch in self.core.dispatch(now):
                self._send_batch(batch)
                self.observer.dispatched(batch, now)
        self._answer_ended()
        self.producer.poll(0)
        self.committer.check_delivered()
        self.counters.batches_delivered = self.committer.batches_delivered
        if now - self._last_tick >= s.tick_interval_ms:
            self.core.tick(now)
            self._last_tick = now
            self._say_unserved(now)
        self._backpressure()
        self._commit()
        self.status = ServiceStatus.of(self._owned_now(), self.lag)
        self.last_step_s = self._clock()
        return len(msgs)

    def _owned_now(self) -> frozenset[int]:
        """The ingest partitions owned now (for :attr:`status`, on this thread): the handover's
        (exactly-once: lane state restored), else the assignment; a closed consumer owns nothing."""
        if self.settings.exactly_once:
            return self.owned
        try:
            return frozenset(tp.partition for tp in self.ingest.assignment())
        except RuntimeError:  # "Consumer closed": the service is stopping
            return frozenset()

    def _say_unserved(self, now: int) -> None:
        """One WARNING per model whose items wait with no contract for it (``UnservedWatch``)."""
        for model, items, tokens in self.unserved_watch.update(self.core.unserved(), now):
            log.warning(
                "model %s: %d items (%d tokens) wait and no consumer serves it (no contract for the model)",
                model,
                items,
                tokens,
            )

    def _backpressure(self) -> None:
        """Pause ingest at the cap, resume once 10% of it has drained (hysteresis: no flapping)."""
        cap = self.settings.max_waiting_tokens
        if not cap:
            return
        waiting = self.core.view.waiting().tokens
        assignment = self.ingest.assignment()
        if not self.ingest_paused and waiting >= cap and assignment:
            self.ingest.pause(assignment)
            self.ingest_paused = True
            self.counters.backpressure_pauses += 1
            log.warning("backpressure: %d tokens waiting >= cap %d; ingest paused", waiting, cap)
        elif self.ingest_paused and waiting <= cap * 0.9:
            self.ingest.resume(assignment)
            self.ingest_paused = False
            log.info("backpressure: %d tokens waiting; ingest resumed", waiting)

    def _ingest(self, msg: Any, now: int) -> IngestItem | None:
        """Decode one ingest message: the item to schedule, or None (an error, a dead letter, a repeat)."""
        err = msg.error()
        if err is not None:
            if fatal(err):
                raise KafkaException(err)
            log.warning("ingest: %s", err)
            return None
        self.counters.consumed += 1
        partition, offset = msg.partition(), msg.offset()
        try:
            head = decode_item_head(msg.value())
        except DecodeError as exc:
            self._dead_letter(msg, exc.reason, str(exc), partition, offset)
            self.core.dead_lettered()
            return None
        if not self.committer.first_seen(partition, head.item_id):
            self._duplicate(msg, head, partition, offset)
            return None
        item = IngestItem.from_head(head, now, partition, offset)
        self.committer.item_seen(item)
        return item

    def _duplicate(self, msg: Any, head: ItemHead, partition: int, offset: int) -> None:
        """A producer's repeat: not scheduled, dead-lettered whole and counted as a duplicate."""
        window_s = self.settings.dedupe_window_ms / 1000
        detail = (
            f"item_id {head.item_id!r} was already taken from partition {partition} within the dedupe "
            f"window ({window_s:g} s); this repeat is not scheduled"
        )
        self._dead_letter(msg, DUPLICATE_ITEM_ID, detail, partition, offset)
        self.core.duplicate(head.model, head.token_count, head.job)
        self.counters.duplicates += 1

    def _dead_letter(self, msg: Any, reason: str, detail: str, partition: int, offset: int) -> None:
        record = dead_letter_of(msg, reason, detail, msg.topic(), partition, offset)
        self.committer.produce(
            self.topics.dead_letter,
            encode_dead_letter(record),
            msg.key(),
            self.committer.dead_letter(partition, offset),
        )
        self.counters.dead_lettered += 1
        log.warning("dead-lettered %s[%d]@%d: %s: %s", msg.topic(), partition, offset, reason, detail)

    def _control(self, now: int) -> None:
        for msg in self.control.consume(num_messages=10_000, timeout=0):
            err = msg.error()
            if err is not None:
                if fatal(err):
                    raise KafkaException(err)
                continue
            if msg.topic() == self.topics.contracts:
                self._contract(msg, now)
            elif msg.topic() == self.topics.job_shares:
                self._job_share(msg, now)
            else:
                self._completion(msg, now)

    # -- job shares (docs/shares.md) -------------------------------------------------------------

    def _job_shares_assignment(self) -> list[TopicPartition]:
        """The job-shares topic from the beginning (compacted: every instance, a restarted one too,
        ends up with the latest policy and lifecycle per job), and where it ends now, which dispatch
        waits for (``shares_read``); none when the topic does not exist (a pipeline created before
        it: every job then has weight 1, until ``tokenfabric topics create``)."""
        topic = self.topics.job_shares
        try:
            parts = self._partitions(topic)
        except KafkaException as exc:
            log.warning("%s: %s; every job has weight 1, no quota", topic, exc)
            return []
        return self.shares_read.expect(self.control, topic, parts, self._clock())

    def _job_share(self, msg: Any, now: int) -> None:
        """A job's share and lifecycle (processor/apps/endings.py): its policy, its deadline, a cancel."""
        self.shares_read.read(msg.partition(), msg.offset())
        apply_job_share_message(self.core, msg, now, self.topics.job_shares)

    def _answer_ended(self) -> None:
        """Answer the items of jobs that ended since the last call (processor/apps/endings.py)."""
        self.counters.ended_items += answer_ended(self.core, self.committer, self.topics, self.now_ms())

    def _contract(self, msg: Any, now: int) -> None:
        value = msg.value()
        consumer = (msg.key() or b"").decode("utf-8", "replace")
        if value is None:
            if self.core.view.contract(consumer) is not None:
                returned = self.core.retire(consumer, now)
                for batch in returned:
                    self.credits.free(batch.batch_id)
                    self.committer.requeued(batch.batch_id, batch.items)
                log.info("consumer %s retired; %d batches go back to their lanes", consumer, len(returned))
            return
        try:
            rec = decode_contract(value)
        except DecodeError as exc:
            log.error("contracts: undecodable announcement for %r: %s", consumer, exc)
            return
        self._set_contract(rec.contract)
        self.counters.contracts += 1
        log.info("contract %s", rec.contract)

    def _completion(self, msg: Any, now: int) -> None:
        """Apply a results message: one item's completion, or several items of one batch."""
        try:
            head = decode_completions_head(msg.value())
        except DecodeError as exc:
            log.error("results: undecodable completion at %d: %s", msg.offset(), exc)
            return
        replay = self.results.applied(msg.partition(), msg.offset())
        if not head.batch_id:  # the processor's own answers to items of a job that ended: no batch
            return
        batch_id, items, counters = head.batch_id, head.items, self.counters
        last = self._last_completion_ms
        last[head.consumer] = max(last.get(head.consumer, 0), msg.timestamp()[1])  # replays are older
        counters.completions += len(items)  # items, not messages: a message may hold a whole batch
        answered = self.core.in_flight_batch(batch_id)
        applied, finished = self.core.items_done(batch_id, items, now, head.cached_tokens, head.retriable)
        self.committer.retried(self.core.take_retried())  # they wait again (processor/core/retries.py)
        if applied and answered is not None:
            self.observer.answered(answered, applied, now)
        if applied < len(items):
            counters.missed(len(items) - applied, batch_id, self.settings.instance, replay)
        if not applied:
            return
        hit = self._cache_hit.setdefault(batch_id, items[0].cache_hit)  # the batch's first answer says
        if finished:
            self.core.cache_reported(head.consumer, hit)
            del self._cache_hit[batch_id]
            self.credits.free(batch_id)
            self.committer.batch_finished(batch_id)
        else:
            self.committer.batch_progress(batch_id)

    def _send_batch(self, batch: Batch) -> None:
        contract = self.core.view.contract(batch.consumer)
        assert contract is not None  # dispatch made the batch for this consumer a moment ago
        placement = self.committer.place(batch, self.credits, contract.max_inflight, self.results)
        delivered = self.committer.batch_emitted(batch, placement)
        self.committer.produce(
            self.topics.batches(batch.consumer), encode_batch(batch), batch.batch_id.encode(), delivered
        )
        self.counters.batches_produced += 1

    # -- commits and checkpoints ---------------------------------------------------------------

    def _commit(self, force: bool = False) -> None:
        now = self.now_ms()
        if not self.committer.due(now) and not force:
            return
        try:
            self.core.check(deep=False)
            self.ledger_error = None
        except LedgerImbalance as exc:
            self.ledger_error = str(exc)
            raise
        self._answer_ended()  # the ledger checkpointed below counts them: their answers go with it
        with guarded(self.watchdog, "the transaction commit"):
            seconds = self.committer.commit(self._snapshot_bytes)
        self.counters.batches_delivered = self.committer.batches_delivered
        self.last_broker_ok_s = self._clock()
        self.counters.commits += 1
        self.observer.committed(seconds)
        self._update_lag()

    def _snapshot_bytes(self) -> bytes:
        started = time.monotonic()
        value = encode_ledger_snapshot(self.snapshot())
        self.counters.checkpoints += 1
        self.observer.checkpointed(time.monotonic() - started)
        return value

    def _update_lag(self) -> None:
        assignment = self.ingest.assignment()
        if not assignment:
            return
        for tp in self.ingest.position(assignment):
            if tp.offset < 0:
                continue
            _low, high = self.ingest.get_watermark_offsets(tp, cached=True)
            if high is not None and high >= 0:
                self.lag[tp.partition] = max(0, high - tp.offset)

    def snapshot(self) -> LedgerSnapshotRecord:
        """The ledger plus the gauges ``status`` shows, as one checkpoint record."""
        self._checkpoint_seq += 1
        extra = {
            "unknown_completions": self.counters.unknown_completions,
            "ingest_paused": int(self.ingest_paused),
            "owned_partitions": len(self.owned),
            "ingest_partitions": self.credits.partitions,
            "replayed_completions": self.counters.replayed_completions,
            "remembered_ids": self.committer.remembered_ids(),
            **share_counters(self.core.view, self.now_ms()),
        }
        return checkpoint_record(
            self.core, self.settings.instance, self._checkpoint_seq, extra, self._last_completion_ms
        )
