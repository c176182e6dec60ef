"""A GPU consumer app: read batches from its own topic, run an engine, write the items' completions.

Lifecycle of :meth:`ConsumerApp.run`:

1. Create the consumer's batch topic if it is missing (the processor may start after the consumer).
2. Announce the contract on the contracts topic (compacted, keyed by consumer id) and wait for the
   broker's acknowledgement: the processor learns the consumer exists and what it accepts.
3. Read the batch topic in the group ``<prefix>-consumer-<id>`` (``read_committed``, so batches of
   an aborted processor transaction are never run; no auto-commit).
4. For each batch: decode it, check it against the consumer's *own* contract (by serving key: an
   adapter's consumer takes only that adapter's items, processor.apps.served), run the engine (with
   the batch's real model), produce its completions to the results topic, flush, and only then
   commit the batch's offset. By default
   (``completions="batch"``) that is one ``CompletionBatch`` message keyed by ``batch_id``, split into
   several only past ``MAX_COMPLETION_BYTES``; ``completions="item"`` writes one ``Completion`` per
   item keyed by ``item_id``, for results readers that only understand that record.

Delivery guarantee: **exactly-once** by default. A batch's completions and its batch-topic offset
commit in one transaction (``transactional.id`` ``<prefix>-consumer-<id>``, the pipeline's), so a
crash re-runs the batch and ``read_committed`` readers never see the first attempt's completions. With
``exactly_once=False`` (``--at-least-once``) completions are flushed before the offset moves: nothing
is lost, and a crash between the two writes a batch's completions a second time (same ``item_id``,
same ``batch_id``: readers dedupe on the pair).

What never happens silently: a batch that does not decode goes whole to the dead-letter topic (and
is committed past, so it cannot wedge the consumer); a batch that breaks the contract is answered
with every item ``rejected`` and the reason, never run; an engine that raises or returns the wrong
results answers every item ``failed`` with the error.

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
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from processor.apps.deadletters import dead_letter_of
from processor.apps.served import checked_view, engine_view
from processor.apps.settings import MAX_COMPLETION_BYTES, ConsumerSettings
from processor.core.accounting import prompt_split
from processor.core.contract import Contract, contract_violation
from processor.engines.base import Engine, ItemResult, retriable_error
from processor.kafka.clients import static_member, static_member_present
from processor.kafka.exits import (
    DeliveryFailed,
    TransientFailure,
    age_s,
    ended_by,
    fatal,
    kafka_cause,
    now_stamp,
    producer_fenced,
    taking_over,
)
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient, ProducerClient
from processor.kafka.pipelines import missing_pipeline
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.kafka.watchdog import SEND_OFFSETS_TIMEOUT_S, CallWatchdog, guarded
from processor.wire.completions import encode_completion, encode_completion_batches
from processor.wire.control import encode_contract, encode_dead_letter
from processor.wire.errors import DecodeError
from processor.wire.items import decode_batch
from processor.wire.records import (
    STATUSES,
    BatchRecord,
    CompletionBatchRecord,
    CompletionForm,
    CompletionRecord,
    ContractRecord,
    Status,
    TokenItemRecord,
)

log = logging.getLogger("tokenfabric.consumer")

#: Settings of the producer that writes completions, contracts and dead letters.
PRODUCER_SETTINGS: dict[str, str] = {"enable.idempotence": "true", "acks": "all", "linger.ms": "5"}
#: librdkafka's ``transaction.timeout.ms`` when the client settings do not name one.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


class ConsumerAppError(RuntimeError):
    """The app cannot go on (the broker cannot be reached, a contract cannot be published). A
    completion that was not delivered raises :class:`processor.kafka.exits.DeliveryFailed` instead."""


@dataclass(slots=True)
class ConsumerStats:
    """Counts since :meth:`ConsumerApp.run` started (batches include dead-lettered ones)."""

    batches: int = 0
    items: int = 0
    ok: int = 0
    failed: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    engine_ms: int = 0
    # For metrics (processor.ops.metrics): batches the engine ran, not those the contract check rejected.
    input_tokens: int = 0
    output_tokens: int = 0
    padded_tokens: int = 0
    cache_hits: int = 0
    cache_lookups: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens of ok items the engine served from its prefix cache (``Completion.cached_tokens``)."""

    def summary(self) -> str:
        return (
            f"{self.batches} batches, {self.items} items (ok {self.ok}, failed {self.failed}, "
            f"rejected {self.rejected}), {self.dead_lettered} dead-lettered, engine {self.engine_ms} ms"
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ConsumerApp:
    """One consumer: its contract, its engine, its batch topic. ``run`` it in any thread.

    ``conf`` is a :func:`processor.kafka.config.client_config` dict, shared by the Kafka consumer,
    producer and admin client. ``max_batches`` stops after that many batches (tests);
    ``idle_exit_s`` stops after that long without a batch (the demo). ``on_batch`` is called after
    each batch is committed, with the stats so far (progress display, tests). ``on_engine`` is called
    with the seconds the engine spent on each batch it ran (the metrics histogram), ``on_completed``
    with each batch whose completions were delivered and the epoch ms they were made at (end-to-end
    latency from each item's ``produced_ms``). ``completions``
    is the form completions are written in (``batch`` or ``item``, see the module docstring), and
    ``max_completion_bytes`` the size past which a batch's completions are split over messages.
    """

    def __init__(
        self,
        conf: Mapping[str, str],
        topics: TopicNames,
        contract: Contract,
        engine: Engine,
        *,
        max_batches: int | None = None,
        idle_exit_s: float | None = None,
        poll_timeout_s: float = 0.5,
        on_batch: Callable[[ConsumerStats], None] | None = None,
        on_engine: Callable[[float], None] | None = None,
        on_completed: Callable[[BatchRecord, int], None] | None = None,
        exactly_once: bool = True,
        watchdog: CallWatchdog | None = None,
        completions: CompletionForm = "batch",
        max_completion_bytes: int = MAX_COMPLETION_BYTES,
        clients: ClientFactory = KAFKA,
    ) -> None:
        self.settings = ConsumerSettings(max_batches, idle_exit_s, completions, max_completion_bytes)
        self.conf = dict(conf)
        self.clients = clients
        self.topics = topics
        self.contract = contract
        self.engine = engine
        self.poll_timeout_s = poll_timeout_s
        self.on_batch = on_batch
        self.on_engine = on_engine
        self.on_completed = on_completed
        self.exactly_once = exactly_once
        self.watchdog = watchdog
        self.batch_topic = topics.batches(contract.consumer)
        self.stats = ConsumerStats()
        self._producer: ProducerClient | None = None
        self._delivery_errors: list[tuple[str, KafkaError]] = []
        self._txn_began: tuple[float, float] | None = None  # monotonic and wall time of the open one

    # -- setup ----------------------------------------------------------------------------------

    def ensure_topic(self, timeout_s: float = 15.0) -> bool:
        """Create the batch topic if missing; True if this call created it.

        Looks first, so a consumer whose credentials may not create topics still starts when an
        operator created its topic, and an unreachable cluster fails in ``timeout_s`` with one line.
        Creates nothing while the pipeline's ingest topic is missing (a typo in ``--topic-prefix``, or
        the topics Job still running): :class:`TransientFailure` naming the prefixes that exist.
        """
        where = self.conf.get("bootstrap.servers", "?")
        try:
            existing = self.clients.admin(self.conf).list_topics(timeout=timeout_s).topics
        except KafkaException as exc:
            raise ConsumerAppError(f"cannot reach Kafka at {where} within {timeout_s:g} s: {exc}") from None
        if self.batch_topic in existing:
            return False
        refusal = missing_pipeline(self.topics, existing, self.conf)
        if refusal is not None:  # a typo in --topic-prefix, or the topics Job still running: create nothing
            raise TransientFailure(f"{refusal} (the consumer creates its own batch topic only)")
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
        value = encode_contract(ContractRecord(self.contract, _now_ms()))
        if self.exactly_once:
            self._txn().begin_transaction()
        self._produce(self.topics.contracts, self.contract.consumer.encode("utf-8"), value)
        self._flush("contract announcement")
        if self.exactly_once:
            self._txn().commit_transaction(60)

    def _txn(self) -> ProducerClient:
        assert self._producer is not None, "run() creates the producer"
        return self._producer

    def _commit_transaction(self, consumer: ConsumerClient, msg: Message) -> None:
        """The batch's completions and its offset in one transaction: a crash before this line re-runs
        the batch and read_committed readers never see the first attempt's completions."""
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        producer = self._txn()
        with guarded(self.watchdog, "the transaction commit"):
            with guarded(self.watchdog, "send_offsets_to_transaction", SEND_OFFSETS_TIMEOUT_S):
                producer.send_offsets_to_transaction(
                    [TopicPartition(self.batch_topic, partition, offset + 1)],
                    consumer.consumer_group_metadata(),
                    SEND_OFFSETS_TIMEOUT_S,
                )
            producer.commit_transaction(60)

    # -- the loop -------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> ConsumerStats:
        """Announce, then process batches until ``stop`` is set, ``max_batches`` or ``idle_exit_s``.

        Raises :class:`ConsumerAppError` or ``KafkaException`` when it cannot go on. The app owns the
        engine and closes it when ``run`` returns or raises, so call ``run`` once per app.
        """
        stop = stop or threading.Event()
        self.stats = ConsumerStats()
        producer_conf: dict[str, str | bool] = {**self.conf, **PRODUCER_SETTINGS}
        if self.exactly_once:
            # Stable per consumer id: a restarted app fences its predecessor's open transaction.
            producer_conf["transactional.id"] = self.topics.consumer_group(self.contract.consumer)
        self._producer = self.clients.producer(producer_conf)
        member = self.topics.consumer_group(self.contract.consumer)
        if static_member_present(self.conf, member, member, clients=self.clients):  # before fencing it
            log.warning("%s", taking_over(self._who(), member))
        if self.exactly_once:
            self._producer.init_transactions(60)
        consumer: ConsumerClient | None = None
        clean = False
        try:
            if self.ensure_topic():
                log.info("created topic %s", self.batch_topic)
            self.announce()
            consumer = self.clients.consumer(
                {
                    **self.conf,
                    "group.id": self.topics.consumer_group(self.contract.consumer),
                    **static_member(self.topics.consumer_group(self.contract.consumer)),
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
            self._loop(consumer, stop)
            clean = True
        except Exception as exc:
            ended = self._ended_by(exc)
            if ended is exc:
                raise
            raise ended from None
        finally:
            if consumer is not None:
                consumer.close()
            if self._producer is not None and clean:  # after a failure nothing more commits
                self._producer.flush(10.0)
            self.engine.close()
        return self.stats

    def _ended_by(self, exc: BaseException) -> BaseException:
        """``exc`` classified for the exit code: a twin, the broker's timeout abort of a transaction
        (this app was paused past ``transaction.timeout.ms``), or itself (processor.kafka.exits)."""
        age = 0.0 if self._txn_began is None else age_s(self._txn_began)
        timeout_s = int(self.conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)) / 1000
        group = self.topics.consumer_group(self.contract.consumer)  # also its transactional id
        return ended_by(
            exc, self._who(), age, timeout_s, {**self.conf, "group.id": group, "transactional.id": group}
        )

    def _who(self) -> str:
        return f"consumer {self.contract.consumer} of pipeline {self.topics.prefix}"

    def _loop(self, consumer: ConsumerClient, stop: threading.Event) -> None:
        settings = self.settings
        last_batch = time.monotonic()
        while not stop.is_set():
            if settings.max_batches is not None and self.stats.batches >= settings.max_batches:
                return
            if settings.idle_exit_s is not None and time.monotonic() - last_batch >= settings.idle_exit_s:
                log.info("no batch for %.1f s: exiting", settings.idle_exit_s)
                return
            msg = consumer.poll(self.poll_timeout_s)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                self._consumer_error(error)
                continue
            if not self.exactly_once:
                self.handle(msg)
                self._commit(consumer, msg)
            else:
                self._txn().begin_transaction()
                self._txn_began = now_stamp()
                try:
                    self.handle(msg)
                    self._commit_transaction(consumer, msg)
                except BaseException:
                    fenced = self._abort()
                    if fenced is not None:  # the cause of whatever failed (a purge, a failed commit)
                        raise fenced from None
                    raise
                self._txn_began = None
            last_batch = time.monotonic()
            if self.on_batch is not None:
                self.on_batch(self.stats)

    def _abort(self) -> KafkaException | None:
        """Abort the open transaction; returns the fencing error if the producer was fenced."""
        try:
            self._txn().abort_transaction(30)
        except (KafkaException, SystemError) as exc:  # fenced or broker gone: the broker aborts it anyway
            cause = kafka_cause(exc)
            log.debug("could not abort the open transaction: %s", cause)
            if isinstance(cause, KafkaException) and producer_fenced(cause):
                return cause
        return None

    def _consumer_error(self, error: KafkaError) -> None:
        if fatal(error):
            raise KafkaException(error)
        if error.code() == KafkaError._PARTITION_EOF:
            return
        # Transient (a topic still propagating, a broker restarting): librdkafka retries by itself.
        log.warning("consumer: %s", error.str())

    def _commit(self, consumer: ConsumerClient, msg: Message) -> None:
        try:
            consumer.commit(message=msg, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.fatal():
                raise
            # Lost the partition in a rebalance: its new owner re-runs the batch (at-least-once).
            log.warning(
                "commit of %s[%d]@%d failed (%s): the batch may run again",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                exc,
            )

    # -- one batch ------------------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        """Process one batch message up to durable completions (the caller commits)."""
        self.stats.batches += 1
        value = msg.value()
        try:
            batch = decode_batch(value)
        except DecodeError as exc:
            self._dead_letter(msg, exc)
            return
        if not batch.items:
            log.warning("batch %s has no items: nothing to answer", batch.batch_id)
            return
        violation = contract_violation(self.contract, checked_view(batch))
        engine_ms = 0
        if violation is not None:
            log.warning("batch %s rejected: %s", batch.batch_id, violation)
            results = [
                ItemResult(i.item_id, "rejected", b"", 0, f"contract: {violation}", False)
                for i in batch.items
            ]
        else:
            started = time.perf_counter()
            results = self._run_engine(batch)
            engine_s = time.perf_counter() - started
            engine_ms = round(engine_s * 1000)
            self._count_engine(batch, results, engine_s)
        completed_ms = _now_ms()
        records = [
            item_completion(batch, item, result, engine_ms, completed_ms, batch.attempt(i))
            for i, (item, result) in enumerate(zip(batch.items, results, strict=True))
        ]
        self._write_completions(batch.batch_id, records)
        for rec in records:
            self._count(rec.status)
        self.stats.items += len(batch.items)
        self.stats.engine_ms += engine_ms
        self._flush(f"completions of batch {batch.batch_id}")
        if self.on_completed is not None:
            self.on_completed(batch, completed_ms)
        log.debug("batch %s: %d items, %d ms", batch.batch_id, len(batch.items), engine_ms)

    def _write_completions(self, batch_id: str, records: list[CompletionRecord]) -> None:
        """One batch's completions, in the app's form: a CompletionBatch (key ``batch_id``) or one
        Completion per item (key ``item_id``). Either way they are produced, not yet flushed."""
        results = self.topics.results
        if self.settings.completions == "item":
            for rec in records:
                self._produce(results, rec.item_id.encode("utf-8"), encode_completion(rec))
            return
        key = batch_id.encode("utf-8")
        for value in encode_completion_batches(
            CompletionBatchRecord.of(records), self.settings.max_completion_bytes
        ):
            self._produce(results, key, value)

    def _run_engine(self, batch: BatchRecord) -> list[ItemResult]:
        """The engine's results, or every item failed with why (see processor.engines)."""
        try:
            results = self.engine.run(engine_view(batch))
        except Exception as exc:  # the engine contract: raising fails the whole batch, not the app
            log.warning(
                "batch %s failed in engine %s: %s: %s",
                batch.batch_id,
                self.engine.name,
                type(exc).__name__,
                exc,
            )
            return _all_failed(batch, f"engine error: {type(exc).__name__}: {exc}", retriable_error(exc))
        ids = [getattr(r, "item_id", None) for r in results] if isinstance(results, list) else None
        bad = ids is None or any(not isinstance(r, ItemResult) or r.status not in STATUSES for r in results)
        if bad or ids != [item.item_id for item in batch.items]:
            got = "not a list of ItemResult" if bad else f"{len(results)} results"
            reason = (
                f"engine-contract: {self.engine.name} returned {got} for {len(batch.items)} items "
                "(wanted one per item, same order, status ok|failed|rejected)"
            )
            log.warning("batch %s: %s", batch.batch_id, reason)
            return _all_failed(batch, reason)
        return results

    def _count_engine(self, batch: BatchRecord, results: list[ItemResult], engine_s: float) -> None:
        st = self.stats
        st.input_tokens += sum(item.token_count for item in batch.items)
        st.output_tokens += sum(r.output_tokens for r in results if r.status == "ok")
        st.padded_tokens += batch.padded_length * len(batch.items)
        st.cache_lookups += 1
        st.cache_hits += any(r.cache_hit for r in results)
        for item, r in zip(batch.items, results, strict=True):
            if r.status == "ok":
                st.cached_prompt_tokens += prompt_split(item.token_count, r.cached_tokens)[0]
        if self.on_engine is not None:
            self.on_engine(engine_s)

    def _count(self, status: Status) -> None:
        if status == "ok":
            self.stats.ok += 1
        elif status == "failed":
            self.stats.failed += 1
        else:
            self.stats.rejected += 1

    def _dead_letter(self, msg: Message, exc: DecodeError) -> None:
        log.warning(
            "%s[%d]@%d: undecodable batch (%s: %s): dead-lettered",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            exc.reason,
            exc,
        )
        topic, partition, offset = msg.topic() or self.batch_topic, msg.partition() or 0, msg.offset() or 0
        rec = dead_letter_of(msg, exc.reason, str(exc), topic, partition, offset)
        self._produce(self.topics.dead_letter, msg.key(), encode_dead_letter(rec))
        self._flush("dead letter")
        self.stats.dead_lettered += 1

    # -- producing ------------------------------------------------------------------------------

    def _produce(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        producer = self._producer
        if producer is None:
            raise ConsumerAppError("the app's producer is not open: call run()")
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=self._on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._delivery_errors.append((f"{msg.topic()}: {err.str()}", err))

    def _flush(self, what: str, timeout_s: float = 60.0) -> None:
        """Wait for every queued message; raise (so nothing is committed) if any was not delivered.

        Nothing was committed for the batch then, so a restarted app runs it again and the processor
        counts its completions once: the command exits 75 for this (processor.kafka.exits)."""
        assert self._producer is not None
        remaining = self._producer.flush(timeout_s)
        if self._delivery_errors:
            errors, self._delivery_errors = self._delivery_errors, []
            text, first = errors[0]
            raise DeliveryFailed(f"{what}: {len(errors)} messages not delivered; first: {text}", first)
        if remaining:
            raise DeliveryFailed(f"{what}: {remaining} messages still unacknowledged after {timeout_s:g} s")


def _all_failed(batch: BatchRecord, reason: str, retriable: bool = False) -> list[ItemResult]:
    return [ItemResult(item.item_id, "failed", b"", 0, reason, False, 0, retriable) for item in batch.items]


def item_completion(
    batch: BatchRecord,
    item: TokenItemRecord,
    result: ItemResult,
    engine_ms: int,
    completed_ms: int,
    attempt: int = 1,
) -> CompletionRecord:
    """``item``'s completion from its engine result. ``cached_tokens`` is the engine's count held to
    the prompt (``prompt_split``; 0 unless ok); ``cache_hit`` is ``cached_tokens > 0``, or the engine's
    own flag when it counts no tokens. ``attempt`` is the item's in the batch (``Batch.attempts``):
    the completion answers that attempt, so readers keep the last one's (docs/jobs.md)."""
    ok = result.status == "ok"
    produced_ms = item.produced_ms
    queued = batch.created_ms - produced_ms if 0 < produced_ms <= batch.created_ms else 0
    cached = prompt_split(item.token_count, result.cached_tokens)[0] if ok else 0
    return CompletionRecord(
        item_id=item.item_id,
        job_id=item.job_id,
        batch_id=batch.batch_id,
        consumer=batch.consumer,
        model=batch.model,
        status=result.status,
        reason=None if ok else (result.reason or result.status),
        input_tokens=item.token_count,
        output_tokens=result.output_tokens if ok else 0,
        padded_tokens=batch.padded_length,
        output=result.output if ok else b"",
        queued_ms=queued,
        engine_ms=engine_ms,
        completed_ms=completed_ms,
        cached_tokens=cached,
        cache_hit=result.cache_hit or cached > 0,
        retriable=result.retriable and result.status == "failed",
        attempt=attempt,
    )


def retire(
    conf: Mapping[str, str],
    topics: TopicNames,
    consumer: str,
    timeout_s: float = 30.0,
    clients: ClientFactory = KAFKA,
) -> None:
    """Withdraw a consumer: a tombstone for its id on the contracts topic, acknowledged by the broker.

    The processor stops routing to it; batches already on its topic stay there (a consumer started
    again with the same id announces itself and resumes them).
    """
    producer = clients.producer({**conf, **PRODUCER_SETTINGS})
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err.str())

    producer.produce(topics.contracts, None, consumer.encode("utf-8"), on_delivery=on_delivery)
    remaining = producer.flush(timeout_s)
    if errors or remaining:
        detail = errors[0] if errors else f"not acknowledged after {timeout_s:g} s"
        raise ConsumerAppError(f"retiring {consumer}: tombstone on {topics.contracts} lost: {detail}")
