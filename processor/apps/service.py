"""The processor: one owner thread drives the scheduling core from Kafka and back.

Each step of the loop, in order:

1. consume up to ``consume_batch`` ingest messages; decode each into an item (or dead-letter it with
   its reason and original bytes) and submit it to the core;
2. read contracts (compacted, from the beginning) and completions, which tell the core who may take
   work and which in-flight slots are free;
3. ask the core for batches and produce each to its consumer's topic;
4. every ``commit_interval_ms``: make all of that durable through the delivery mode's durability
   (``processor/state/durability.py``: one Kafka transaction in exactly-once mode) with a ledger checkpoint.

Step 2 is the control plane's (``processor/apps/control.py``); what differs between the delivery modes
is the roles' (``processor/state/modes.py``).

At start-up in exactly-once mode the processor first fences any older process with its transactional
id and loads its last ledger checkpoint. Lane state belongs to ingest partitions, not to instances:
whenever the group moves partitions (at start, or when instances join or leave) the rebalance
callbacks record what moved and the loop restores the changelog of the partitions it now owns, the
others dispatching meanwhile (``processor/state/handover.py``, ``processor/state/restore.py``);
consumer in-flight slots move with them (``processor/state/credits.py``).

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

from confluent_kafka import TopicPartition

from processor.apps.backpressure import Backpressure
from processor.apps.checkpoint import checkpoint_record, share_counters
from processor.apps.control import ControlContext, ControlPlane
from processor.apps.intake import Intake
from processor.apps.membership import set_group_session, wait_for_own_id
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
from processor.kafka.exits import MissingTopics, ended_by, taking_over
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient, ProducerClient
from processor.kafka.outage import is_outage
from processor.kafka.pipelines import raise_if_hidden
from processor.kafka.reader import watermarks
from processor.kafka.topics import TopicNames
from processor.kafka.watchdog import CLOSE_TIMEOUT_S, CallWatchdog, guarded
from processor.state.credits import CreditBook
from processor.state.durability import CommitClients
from processor.state.handover import HandoverContext, PartitionHandover, Restored
from processor.state.ingest import IngestItem
from processor.state.modes import DeliveryMode, ExactlyOnceOptions, at_least_once, exactly_once
from processor.state.restore import OnWaiting, RestoredState, latest_checkpoint, restore, transactional_id
from processor.state.results import ResultsCursor
from processor.wire.control import encode_ledger_snapshot
from processor.wire.items import encode_batch
from processor.wire.records import LedgerSnapshotRecord
from processor.wire.registry_framing import RegistryFraming

log = logging.getLogger("tokenfabric.processor")

__all__ = ["IngestItem", "ProcessorService", "ProcessorSettings", "ServiceCounters", "ServiceObserver"]


class ProcessorService:
    """The processor's owner thread and its Kafka clients.

    Its collaborators are passed in or built from what is passed in: the Kafka clients come from
    ``clients`` (a :class:`~processor.kafka.factory.ClientFactory`: the real one by default, the
    in-memory stand-in in tests), the delivery mode is ``mode``, a composition of roles
    (``settings.exactly_once`` picks it once, here: processor/state/modes.py), the control
    consumer's reading a :class:`ControlPlane` and the rebalance callbacks a
    :class:`PartitionHandover`, each on a context of what it works on.

    Read-only views for metrics and health (safe to read from another thread, values may be a step
    old): ``core`` (the scheduler: read its ``view``), ``status`` (ingest partitions owned and their
    lag, taken at each commit), ``counters``, ``lag`` (ingest messages not yet consumed, per partition),
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
        framing: RegistryFraming | None = None,
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
        self._observer = ServiceObserver()
        self.lag: dict[int, int] = {}
        self.status = ServiceStatus()  # what metrics read (ServiceStatus): taken at each commit
        self.last_step_s = clock()
        self.last_broker_ok_s = clock()
        self.ledger_error: str | None = None
        self._checkpoint_seq = 0
        self._last_tick = -1 << 62
        self.unserved_watch = UnservedWatch()
        self.credits = CreditBook(0)
        self.results = ResultsCursor()
        self.watchdog: CallWatchdog | None = None
        """Set by the CLI: ends the process if a commit blocks forever (processor/kafka/watchdog.py)."""
        self.resuming = False
        """Set on a ride's later rounds (processor.apps.ride): a member under this id is its own."""
        self.parting: ConsumerClient | None = None
        """The group member of a run an outage ended, left open to leave once Kafka answers (part_from)."""

        self.identity = transactional_id(s.instance, s.group_id)
        """Its transactional id and its group.instance.id: one identity, fenced as one by a twin."""
        self.ingest: ConsumerClient = clients.consumer(
            ingest_settings(self.conf, s.group_id, s.session_timeout_ms, self.identity, s.group_protocol)
        )
        self.control: ConsumerClient = clients.consumer(
            control_settings(self.conf, f"{s.group_id}-control-{s.instance}")
        )
        self.producer, self.mode = self._delivery_mode(s)
        self.control_plane = ControlPlane(self._control_context())
        self.intake = Intake(
            self.core, self.mode, topics, self.counters, s.dedupe_window_ms, framing, self.ingest, clock
        )
        self.handover = PartitionHandover(self._handover_context())
        self.backpressure = Backpressure(
            self.ingest, s.max_waiting_tokens, self.core, self.counters, lambda: self.handover.pending
        )

    @property
    def observer(self) -> ServiceObserver:
        """The hooks that time commits, checkpoints, dispatches and answers (processor/ops/metrics.py
        installs its histograms here once the service is built)."""
        return self._observer

    @observer.setter
    def observer(self, observer: ServiceObserver) -> None:
        """Installs ``observer`` here and in the results reader, which reports the answers: one
        observer for the whole service, whenever it is set."""
        self._observer = observer
        self.control_plane.completions.observer = observer

    def _delivery_mode(self, s: ProcessorSettings) -> tuple[ProducerClient, DeliveryMode]:
        """The delivery mode and its batch producer, chosen once: everything else asks the mode's
        roles what the mode means."""
        if not s.exactly_once:
            producer = self.clients.producer(batch_producer_settings(self.conf))
            clients = CommitClients(producer, self.ingest, self.control)
            return producer, at_least_once(clients, self.topics, s.instance, s.commit_interval_ms)
        producer_settings = batch_producer_settings(self.conf, self.identity, s.transaction_timeout_ms)
        producer = self.clients.producer(producer_settings)
        options = ExactlyOnceOptions(
            is_in_flight=self.core.is_in_flight,
            done_items=self.core.done_items,
            eager_ms=s.eager_commit_ms,
            dedupe_window_ms=s.dedupe_window_ms,
            dedupe_max_ids=s.dedupe_max_ids,
        )
        clients = CommitClients(producer, self.ingest, self.control)
        return producer, exactly_once(clients, self.topics, s.instance, s.commit_interval_ms, options)

    def _control_context(self) -> ControlContext:
        return ControlContext(
            control=self.control,
            topics=self.topics,
            core=self.core,
            mode=self.mode,
            credits=self.credits,
            results=self.results,
            counters=self.counters,
            observer=self._observer,
            instance=self.settings.instance,
            clock=self._clock,
            results_schema_id=self.settings.results_schema_id,
        )

    def _handover_context(self) -> HandoverContext:
        return HandoverContext(
            core=self.core,
            ownership=self.mode.ownership,
            credits=self.credits,
            results=self.results,
            restore=self._restore,
            commit=lambda: self._commit(force=True),
            set_contract=self.control_plane.set_contract,
            reassign_results=self.control_plane.assign,
            now_ms=self.now_ms,
            clock=self._clock,
            on_restored=self._restored,
            ingest_topic=self.topics.ingest,
            incremental=self.settings.group_protocol == "consumer",
        )

    def _restore(
        self,
        partitions: list[int],
        on_contracts: Callable[[dict[str, Contract]], None],
        on_waiting: OnWaiting,
        wait_s: float,
    ) -> RestoredState:
        where = (self.conf, self.topics, self.settings.group_id)
        return restore(
            *where, partitions, on_contracts, on_waiting, self.clients, self.intake.decode_head, wait_s
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
    def ingest_paused(self) -> bool:
        """Whether backpressure holds ingest paused now."""
        return self.backpressure.paused

    @property
    def restoring_since_s(self) -> float | None:
        """Set while assigned partitions are being restored (health: live, not ready)."""
        return self.handover.restoring_since_s

    @property
    def registry_down_since_s(self) -> float | None:
        """Since when ingest is held because the schema registry does not answer (health: not ready)."""
        return self.intake.held_since

    # -- lifecycle -----------------------------------------------------------------------------

    def now_ms(self) -> int:
        """The core's clock: epoch milliseconds, advancing with the monotonic ``clock``.

        Epoch, because its readings leave the process: a batch's ``created_ms`` is on the wire (the
        consumer's ``queued_ms`` subtracts the item's ``produced_ms``) and in the changelog (a successor
        adopts it: both count from one origin). Anchored once at start and advanced by the monotonic
        clock, so that a wall-clock step (NTP) never moves the core's time backwards."""
        return self._wall_at_t0 + int((self._clock() - self._t0) * 1000)

    def start(self) -> None:
        """Fence older instances and load the last checkpoint (exactly-once), then subscribe; lane
        state arrives with the partitions the group assigns (``_on_assign``).

        The service owns its process: the hot path allocates an item, its body and a few strings a
        message and no reference cycles of its own, so the cyclic collector runs its first generation
        every 50,000 allocations, not 700 (it took 8-13% of the loop, 1/3 of restore: docs/benchmarks.md)."""
        gc.set_threshold(50_000, 20, 100)
        self._check_topics()
        member = self.identity
        present = static_member_present(self.conf, self.settings.group_id, member, clients=self.clients)
        if present and not self.resuming:  # a ride's own last round is no twin (processor.apps.ride)
            log.warning("%s", taking_over(self._who(), member))  # said before this process fences it
        self.mode.durability.start(self.watchdog)  # fences a live twin's transactions: it exits
        if (present or self.resuming) and self.settings.group_protocol == "consumer":
            wait_for_own_id(self.conf, self.settings, member, self.topics.ingest, self._who(), self.clients)
        self.credits.count_partitions(len(self.control_plane.partitions(self.topics.ingest)))
        self.mode.ownership.on_start(self._resume)
        set_group_session(self.conf, self.settings, self.clients)
        h = self.handover
        self.ingest.subscribe(
            [self.topics.ingest], on_assign=h.on_assign, on_revoke=h.on_revoke, on_lost=h.on_lost
        )
        self.control_plane.assign()

    def _resume(self) -> None:
        """Lane state moves with partitions: resume the ledger from the last checkpoint, and read
        completions from the results topic's end (everything before it belongs to batches this
        instance does not hold; those restored later are found by rewinding the cursor)."""
        self.handover.resume(latest_checkpoint(self.conf, self.topics, self.settings.instance, self.clients))
        ends = {}
        for p in self.control_plane.partitions(self.topics.results):
            _low, ends[p] = watermarks(self.control, TopicPartition(self.topics.results, p), 30)
        self.results.start_at(ends)

    def run(self, stop: threading.Event) -> None:
        """Process until ``stop`` is set, then make everything durable and close.

        On an exception nothing more is committed: the open transaction is abandoned (the broker
        aborts it) and a restart resumes from the last commit.
        """
        try:
            self.start()  # a refused group or transactional id is classified below: exit 77, no restart
            try:
                while not stop.is_set():
                    self.step()
            except BaseException as exc:
                self._close(commit=False, parting=is_outage(exc))
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
        age = self.mode.durability.transaction_age_s()
        named = {**self.conf, "group.id": self.settings.group_id, "transactional.id": self.identity}
        return ended_by(exc, self._who(), age, self.settings.transaction_timeout_ms / 1000, named)

    def _who(self) -> str:
        return f"processor {self.settings.instance} of pipeline {self.topics.prefix}"

    def _close(self, commit: bool, parting: bool = False) -> None:
        """After a failure nothing more is committed, so nothing is flushed: a flush would only run
        delivery callbacks on a producer that may be fatally fenced, where confluent-kafka makes
        every callback raise (processor.kafka.exits.kafka_cause). ``parting`` (an outage): the group
        member stays open, for the ride's next round to close once Kafka answers (part_from)."""
        log.info("processor %s: shutting down", self.settings.instance)
        self.handover.closing = True
        if commit:
            self._commit(force=True)
            self.core.check(deep=True)
            self.producer.flush(30)
        with guarded(self.watchdog, "closing the Kafka clients", CLOSE_TIMEOUT_S):
            if not parting:
                self.ingest.close()
            self.control.close()
        self.parting = self.ingest if parting else None

    def _check_topics(self) -> None:
        """Raise :class:`MissingTopics` naming every topic the processor needs that does not exist."""
        t = self.topics
        needed = (t.ingest, t.results, t.contracts, t.accounting, t.changelog, t.dead_letter)
        existing = self.control.list_topics(timeout=30).topics
        missing = [name for name in needed if name not in existing]
        if missing:  # hidden by the authorizer is not missing: exit 77, not a restart loop
            raise_if_hidden(self.clients.admin(self.conf), missing[0], self.conf, timeout_s=30)
            raise MissingTopics(
                f"missing topic(s) {', '.join(missing)} on {self.conf.get('bootstrap.servers', '?')}: "
                f"create them with 'tokenfabric topics create --topic-prefix {t.prefix}' (the topics Job)"
            )

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> int:
        """One pass of the loop; returns how many ingest messages it took."""
        s = self.settings
        msgs = self.ingest.consume(num_messages=s.consume_batch, timeout=s.poll_timeout_ms / 1000)
        self.handover.raise_if_lost(self._who())  # before anything more goes into the open transaction
        self.handover.restore_pending(self.ingest)  # what the group just assigned (paused till then)
        now = self.now_ms()
        self.intake.release_held(self.handover.pending)
        items = self.intake.items(msgs, now)
        if msgs:
            self.intake.registry_answered()
        if items:  # one pass for the poll's items, as ``submit`` on each in turn would place them
            self.core.submit_many(items, [now] * len(items))
        self.control_plane.read(now)
        if self.control_plane.ready():
            for batch in self.core.dispatch(now):
                self._send_batch(batch)
                self._observer.dispatched(batch, now)
        self.control_plane.answer_ended(self.now_ms())
        self.producer.poll(0)
        self.mode.durability.check_delivered()
        self.counters.batches_delivered = self.mode.durability.batches_delivered
        if now - self._last_tick >= s.tick_interval_ms:
            self.core.tick(now)
            self._last_tick = now
            self._say_unserved(now)
        self.backpressure.update()
        self._commit()
        self.last_step_s = self._clock()
        return len(msgs)

    def _say_unserved(self, now: int) -> None:
        """One WARNING per model whose items wait with no contract for it (``UnservedWatch``)."""
        for model, items, tokens in self.unserved_watch.update(self.core.unserved(), now):
            log.warning(
                "model %s: %d items (%d tokens) wait and no consumer serves it (no contract for the model)",
                model,
                items,
                tokens,
            )

    def _send_batch(self, batch: Batch) -> None:
        contract = self.core.view.contract(batch.consumer)
        assert contract is not None  # dispatch made the batch for this consumer a moment ago
        mode = self.mode
        placement = mode.placement.place(batch, self.credits, contract.max_inflight, self.results)
        mode.lane_log.batch_emitted(batch, placement)
        mode.durability.produce(
            self.topics.batches(batch.consumer),
            encode_batch(batch),
            batch.batch_id.encode(),
            mode.durability.batch_delivery(),
        )
        self.counters.batches_produced += 1

    # -- commits and checkpoints ---------------------------------------------------------------

    def _commit(self, force: bool = False) -> None:
        now = self.now_ms()
        durability = self.mode.durability
        if not durability.due(now) and not force:
            return
        try:
            self.core.check(deep=False)
            self.ledger_error = None
        except LedgerImbalance as exc:
            self.ledger_error = str(exc)
            raise
        self.control_plane.answer_ended(self.now_ms())  # the checkpoint below counts them: answers go with it
        with guarded(self.watchdog, "the transaction commit"):
            seconds = durability.commit(self._snapshot_bytes)
        self.counters.batches_delivered = durability.batches_delivered
        self.last_broker_ok_s = self._clock()
        self.counters.commits += 1
        self._observer.committed(seconds)
        self._update_lag()

    def _snapshot_bytes(self) -> bytes:
        started = time.monotonic()
        value = encode_ledger_snapshot(self.snapshot())
        self.counters.checkpoints += 1
        self._observer.checkpointed(time.monotonic() - started)
        return value

    def _update_lag(self) -> None:
        """The ingest lag per partition and, with it, the :attr:`status` metrics read: at each commit,
        not each step (lag moves with the committed positions; a revocation commits, and the next
        commit, ``commit_interval_ms`` later, sees an assignment). Owned partitions: the handover's
        (exactly-once: lane state restored), else the assignment."""
        assignment = self.ingest.assignment()
        for tp in self.ingest.position(assignment) if assignment else ():
            if tp.offset < 0:
                continue
            _low, high = self.ingest.get_watermark_offsets(tp, cached=True)
            if high is not None and high >= 0:
                self.lag[tp.partition] = max(0, high - tp.offset)
        owned = self.owned if self.settings.exactly_once else frozenset(tp.partition for tp in assignment)
        self.status = ServiceStatus.of(owned, self.lag)

    def snapshot(self) -> LedgerSnapshotRecord:
        """The ledger plus the gauges ``status`` shows, as one checkpoint record."""
        self._checkpoint_seq += 1
        extra = {
            "unknown_completions": self.counters.unknown_completions,
            "ingest_paused": int(self.ingest_paused),
            "owned_partitions": len(self.owned),
            "ingest_partitions": self.credits.partitions,
            "replayed_completions": self.counters.replayed_completions,
            "remembered_ids": self.mode.dedupe.remembered_ids(),
            **share_counters(self.core.view, self.now_ms()),
        }
        return checkpoint_record(
            self.core,
            self.settings.instance,
            self._checkpoint_seq,
            extra,
            self.control_plane.completions.last_completion_ms,
        )
