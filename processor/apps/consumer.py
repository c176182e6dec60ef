"""A GPU consumer app: read batches from its own topic, run an engine, write the items' completions.

Lifecycle of :meth:`ConsumerApp.run`:

1. Create the consumer's batch topic if it is missing (the processor may start after the consumer).
2. Announce the contract on the contracts topic (compacted, keyed by consumer id) and wait for the
   broker's acknowledgement: the processor learns the consumer exists and what it accepts.
3. Read the batch topic in the group ``<prefix>-consumer-<id>`` (``read_committed``, so batches of
   an aborted processor transaction are never run; no auto-commit).
4. For each batch: answer it (processor.apps.consumer_batches: decode, check the contract, run the
   engine, produce and flush its completions), and only then commit the batch's offset.

The app is composed like the processor's service: :class:`processor.apps.settings.ConsumerSettings`
holds its knobs (validated), :class:`processor.apps.consumer_batches.BatchHandler` answers batches,
:class:`processor.apps.consumer_output.ConsumerOutput` owns its producer, and the delivery strategy
(processor.apps.consumer_delivery) makes each batch durable: **exactly-once** by default (the batch's
completions and its offset in one transaction), at-least-once with ``exactly_once=False``.

Stopping: set the ``stop`` event (``tokenfabric consumer`` sets it on SIGTERM/SIGINT). The current
batch finishes and is committed, then the app leaves its group and returns. The contract stays
announced, so the processor keeps routing to this consumer's topic and a restart resumes where it
stopped; :func:`retire` publishes the tombstone that withdraws it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError, KafkaException, Message

from processor.apps.consumer_batches import (
    BatchHandler,
    ConsumerHooks,
    ConsumerStats,
    item_completion,
    now_ms,
)
from processor.apps.consumer_delivery import ConsumerDelivery, delivery_for
from processor.apps.consumer_output import PRODUCER_SETTINGS, ConsumerAppError, ConsumerOutput, retire
from processor.apps.settings import MAX_COMPLETION_BYTES, ConsumerSettings
from processor.core.contract import Contract
from processor.engines.base import Engine
from processor.kafka.clients import static_member, static_member_present
from processor.kafka.exits import MissingTopics, ended_by, fatal, taking_over
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient
from processor.kafka.outage import Abandoned
from processor.kafka.pipelines import missing_pipeline, raise_if_hidden
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.kafka.watchdog import CLOSE_TIMEOUT_S, CallWatchdog, guarded
from processor.wire.control import encode_contract
from processor.wire.records import ContractRecord

__all__ = [
    "MAX_COMPLETION_BYTES",
    "PRODUCER_SETTINGS",
    "ConsumerApp",
    "ConsumerAppError",
    "ConsumerHooks",
    "ConsumerSettings",
    "ConsumerStats",
    "item_completion",
    "retire",
]

log = logging.getLogger("tokenfabric.consumer")

#: librdkafka's ``transaction.timeout.ms`` when the client settings do not name one.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


class ConsumerApp:
    """One consumer: its contract, its engine, its batch topic. ``run`` it in any thread.

    ``conf`` is a :func:`processor.kafka.config.client_config` dict, shared by the Kafka consumer,
    producer and admin client; ``settings`` how it runs (``max_batches``, ``idle_exit_s``, the
    completions' form, the delivery guarantee, the poll timeout); ``hooks`` whom it tells of each
    batch (processor.apps.consumer_batches.ConsumerHooks); ``watchdog`` bounds its transaction
    commits; ``clients`` builds its Kafka clients (tests pass the in-memory Kafka's).
    """

    def __init__(
        self,
        conf: Mapping[str, str],
        topics: TopicNames,
        contract: Contract,
        engine: Engine,
        settings: ConsumerSettings | None = None,
        *,
        hooks: ConsumerHooks | None = None,
        watchdog: CallWatchdog | None = None,
        clients: ClientFactory = KAFKA,
    ) -> None:
        self.settings = settings or ConsumerSettings()
        self.conf = dict(conf)
        self.clients = clients
        self.topics = topics
        self.contract = contract
        self.engine = engine
        self.hooks = hooks or ConsumerHooks()
        self.batch_topic = topics.batches(contract.consumer)
        self.group = topics.consumer_group(contract.consumer)
        """The consumer group, static member id and transactional id: one name, the pipeline's."""
        self.output = ConsumerOutput(stale=lambda: self.stale())
        self.batches = BatchHandler(topics, contract, engine, self.settings, self.output, self.hooks)
        self.watchdog = watchdog
        self.delivery: ConsumerDelivery = delivery_for(
            self.settings.exactly_once, self.output, self.group, self.batch_topic, watchdog
        )
        self.resuming = False
        """Set on the rounds after the first of a ride (processor.apps.ride): the member the group
        still has under this id is this process's own last round, not a twin: nothing to say."""
        self.stale: Callable[[], bool] = lambda: False
        """Set by the ride's CLI: whether Kafka went away since this round began. Clients that
        lived through an outage can block for ever in their next ``send_offsets_to_transaction``
        (librdkafka#5456/#5511: the coordinator's old broker object is never woken), so such a round
        ends (:class:`Abandoned`) before a batch's transaction, while its completions are flushed
        (processor.apps.consumer_output) and after they are, and the ride starts one with fresh
        clients."""

    @property
    def stats(self) -> ConsumerStats:
        """Counts since :meth:`run` started (``run`` replaces them: read this each time)."""
        return self.batches.stats

    def handle(self, msg: Message) -> None:
        """Process one batch message up to durable completions (the delivery strategy commits)."""
        self.batches.handle(msg)

    # -- setup ----------------------------------------------------------------------------------

    def ensure_topic(self, timeout_s: float = 15.0) -> bool:
        """Create the batch topic if missing; True if this call created it.

        Looks first, so a consumer whose credentials may not create topics still starts when an
        operator created its topic, and an unreachable cluster fails in ``timeout_s`` with one line.
        Creates nothing while the pipeline's ingest topic is missing (a typo in ``--topic-prefix``, or
        the topics Job still running): :class:`MissingTopics` naming the prefixes that exist.
        """
        where = self.conf.get("bootstrap.servers", "?")
        try:
            existing = self.clients.admin(self.conf).list_topics(timeout=timeout_s).topics
        except KafkaException as exc:
            raise ConsumerAppError(f"cannot reach Kafka at {where} within {timeout_s:g} s: {exc}") from None
        if self.batch_topic in existing:
            return False
        raise_if_hidden(self.clients.admin(self.conf), self.batch_topic, self.conf, timeout_s)
        refusal = missing_pipeline(self.topics, existing, self.conf)
        if refusal is not None:  # a typo in --topic-prefix, or the topics Job still running: create nothing
            raise MissingTopics(f"{refusal} (the consumer creates its own batch topic only)")
        all_specs = topic_specs(self.topics, consumers=[self.contract.consumer])
        specs = [s for s in all_specs if s.name == self.batch_topic]
        try:
            return bool(create_topics(self.conf, specs, timeout_s=timeout_s, clients=self.clients))
        except TimeoutError:
            raise ConsumerAppError(
                f"creating {self.batch_topic} on {where}: no answer in {timeout_s:g} s"
            ) from None

    def announce(self) -> None:
        """Publish the contract (keyed by consumer id) and wait until the broker has it."""
        value = encode_contract(ContractRecord(self.contract, now_ms()))

        def write() -> None:
            self.output.produce(self.topics.contracts, self.contract.consumer.encode("utf-8"), value)
            self.output.flush("contract announcement")

        self.delivery.publish(write)

    # -- the loop -------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> ConsumerStats:
        """Announce, then process batches until ``stop`` is set, ``max_batches`` or ``idle_exit_s``.

        Raises :class:`ConsumerAppError` or ``KafkaException`` when it cannot go on. The app owns the
        engine and closes it when ``run`` returns or raises, so call ``run`` once per app.
        """
        stop = stop or threading.Event()
        self.batches.stats = ConsumerStats()
        producer = self.output.open(
            self.clients.producer(self.delivery.producer_conf({**self.conf, **PRODUCER_SETTINGS}))
        )
        # Before the delivery strategy fences it (a transactional producer fences its twin).
        if not self.resuming and static_member_present(
            self.conf, self.group, self.group, clients=self.clients
        ):
            log.warning("%s", taking_over(self._who(), self.group))
        consumer: ConsumerClient | None = None
        clean = abandoned = False
        try:
            self.delivery.open()  # init_transactions: a refused transactional id is classified below
            if self.ensure_topic():
                log.info("created topic %s", self.batch_topic)
            self.announce()
            consumer = self._subscribe()
            self._loop(consumer, stop)
            clean = True
        except Exception as exc:
            abandoned = isinstance(exc, Abandoned)
            ended = self._ended_by(exc)
            if ended is exc:
                raise
            raise ended from None
        finally:
            if consumer is not None:
                self._close(consumer, aside=abandoned)
            if clean:  # after a failure nothing more commits
                producer.flush(10.0)
            self.engine.close()
        return self.stats

    def _close(self, consumer: ConsumerClient, aside: bool) -> None:
        """Close the batch consumer; ``aside`` (a round abandoned after an outage), in a thread of its
        own, unwaited: its close may wait for ever on the coordinator as its send_offsets would
        (librdkafka#5511), and the next round must not wait on it. That member commits nothing (offsets
        go through the transactional producer) and the next round's, with the same static instance
        id, replaces it in the group."""
        if aside:
            threading.Thread(target=consumer.close, name=f"{self.group}-closing", daemon=True).start()
            return
        with guarded(self.watchdog, "closing the consumer", CLOSE_TIMEOUT_S):
            consumer.close()

    def _subscribe(self) -> ConsumerClient:
        """The group's consumer of the batch topic (a static member: a restart keeps its partition)."""
        consumer = self.clients.consumer(
            {
                **self.conf,
                "group.id": self.group,
                **static_member(self.group),
                "enable.auto.commit": "false",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([self.batch_topic])
        log.info(
            "contract announced (model %s, budget %d, items %d, engine %s); reading %s",
            self.contract.model,
            self.contract.budget_tokens,
            self.contract.max_items,
            self.engine.name,
            self.batch_topic,
        )
        return consumer

    def _ended_by(self, exc: BaseException) -> BaseException:
        """``exc`` classified for the exit code: a twin, the broker's timeout abort of a transaction
        (this app was paused past ``transaction.timeout.ms``), or itself (processor.kafka.exits)."""
        timeout_s = int(self.conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)) / 1000
        conf = {**self.conf, "group.id": self.group, "transactional.id": self.group}
        return ended_by(exc, self._who(), self.delivery.open_for_s(), timeout_s, conf)

    def _who(self) -> str:
        return f"consumer {self.contract.consumer} of pipeline {self.topics.prefix}"

    def _loop(self, consumer: ConsumerClient, stop: threading.Event) -> None:
        settings, on_batch = self.settings, self.hooks.on_batch
        last_batch = time.monotonic()
        while not stop.is_set():
            if settings.max_batches is not None and self.stats.batches >= settings.max_batches:
                return
            if settings.idle_exit_s is not None and time.monotonic() - last_batch >= settings.idle_exit_s:
                log.info("no batch for %.1f s: exiting", settings.idle_exit_s)
                return
            msg = consumer.poll(settings.poll_timeout_s)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                _consumer_error(error)
                continue
            self._abandon_if_stale()  # nothing of this batch is written: the next round reads it again
            self.delivery.deliver(consumer, msg, self._answer)
            last_batch = time.monotonic()
            if on_batch is not None:
                on_batch(self.stats)

    def _answer(self, msg: Message) -> None:
        """Answer the batch in the open transaction; then, before the offsets go to the transaction
        coordinator, end the round if Kafka went away meanwhile (a flush blocked through an outage,
        then ``send_offsets_to_transaction`` blocked for ever on these clients: exit 75 in a 20 s freeze)."""
        self.batches.handle(msg)
        self._abandon_if_stale()

    def _abandon_if_stale(self) -> None:
        if self.stale():
            raise Abandoned(f"{self._who()}: Kafka went away meanwhile: fresh clients first")


def _consumer_error(error: KafkaError) -> None:
    if fatal(error):
        raise KafkaException(error)
    if error.code() == KafkaError._PARTITION_EOF:
        return
    # Transient (a topic still propagating, a broker restarting): librdkafka retries by itself.
    log.warning("consumer: %s", error.str())
