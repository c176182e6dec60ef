"""How a consumer app makes a batch's completions and its offset durable: the two delivery guarantees
as two strategies behind one protocol, so the app asks and never branches on the mode.

- :class:`TransactionalDelivery` (the default, **exactly-once**): a batch's completions and its
  batch-topic offset commit in one transaction (``transactional.id`` ``<prefix>-consumer-<id>``, the
  pipeline's), so a crash re-runs the batch and ``read_committed`` readers never see the first
  attempt's completions. Its contract announcement is a transaction of its own.
- :class:`AtLeastOnceDelivery` (``--at-least-once``): completions are flushed before the offset moves.
  Nothing is lost, and a crash between the two writes a batch's completions a second time (same
  ``item_id``, same ``batch_id``: readers dedupe on the pair).

Invariant of both: :meth:`ConsumerDelivery.deliver` commits a batch's offset only after ``handle``
returned, that is after its completions were flushed (processor.apps.consumer_output); when it raises,
nothing of the batch was committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from processor.apps.consumer_output import ConsumerOutput
from processor.kafka.exits import age_s, kafka_cause, now_stamp, producer_fenced
from processor.kafka.factory import ConsumerClient
from processor.kafka.outage import Abandoned
from processor.kafka.watchdog import ABORT_TIMEOUT_S, SEND_OFFSETS_TIMEOUT_S, CallWatchdog, guarded

log = logging.getLogger("tokenfabric.consumer")


class ConsumerDelivery(Protocol):
    """One consumer app's delivery guarantee, from opening its producer to committing each batch."""

    def producer_conf(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """``conf`` for the app's producer (a transactional id, or none)."""
        ...

    def open(self) -> None:
        """Ready the open producer (fences a predecessor's open transaction, if any)."""
        ...

    def publish(self, write: Callable[[], None]) -> None:
        """Run ``write`` (produce and flush) so its messages are visible once it returns."""
        ...

    def deliver(self, consumer: ConsumerClient, msg: Message, handle: Callable[[Message], None]) -> None:
        """``handle`` one batch message, then commit its offset."""
        ...

    def open_for_s(self) -> float:
        """How long the open transaction has been open (0 when none is)."""
        ...


class AtLeastOnceDelivery:
    """Flush, then commit the offset: a crash between the two runs the batch again."""

    def __init__(self, output: ConsumerOutput) -> None:
        self.output = output

    def producer_conf(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        return dict(conf)

    def open(self) -> None:
        """Nothing to ready: the producer is not transactional."""

    def publish(self, write: Callable[[], None]) -> None:
        write()

    def deliver(self, consumer: ConsumerClient, msg: Message, handle: Callable[[Message], None]) -> None:
        handle(msg)
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

    def open_for_s(self) -> float:
        return 0.0


class TransactionalDelivery:
    """Each batch's completions and its offset in one transaction (exactly-once).

    ``transactional_id`` is stable per consumer id, so a restarted app fences its predecessor's open
    transaction; ``watchdog`` bounds the commit (processor.kafka.watchdog)."""

    def __init__(
        self,
        output: ConsumerOutput,
        transactional_id: str,
        batch_topic: str,
        watchdog: CallWatchdog | None = None,
    ) -> None:
        self.output = output
        self.transactional_id = transactional_id
        self.batch_topic = batch_topic
        self.watchdog = watchdog
        self._began: tuple[float, float] | None = None  # monotonic and wall time of the open transaction

    def producer_conf(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        return {**conf, "transactional.id": self.transactional_id}

    def open(self) -> None:
        self.output.client().init_transactions(60)

    def publish(self, write: Callable[[], None]) -> None:
        producer = self.output.client()
        producer.begin_transaction()
        write()
        producer.commit_transaction(60)

    def deliver(self, consumer: ConsumerClient, msg: Message, handle: Callable[[Message], None]) -> None:
        self.output.client().begin_transaction()
        self._began = now_stamp()
        try:
            handle(msg)
            self._commit(consumer, msg)
        except Abandoned:
            raise  # no call on these clients: the next round's init_transactions aborts it
        except BaseException:
            fenced = self._abort()
            if fenced is not None:  # the cause of whatever failed (a purge, a failed commit)
                raise fenced from None
            raise
        self._began = None

    def open_for_s(self) -> float:
        return 0.0 if self._began is None else age_s(self._began)

    def _commit(self, consumer: ConsumerClient, msg: Message) -> None:
        """The batch's completions and its offset in one transaction: a crash before this line re-runs
        the batch and read_committed readers never see the first attempt's completions."""
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        producer = self.output.client()
        with guarded(self.watchdog, "the transaction commit"):
            with guarded(self.watchdog, "send_offsets_to_transaction", SEND_OFFSETS_TIMEOUT_S):
                producer.send_offsets_to_transaction(
                    [TopicPartition(self.batch_topic, partition, offset + 1)],
                    consumer.consumer_group_metadata(),
                    SEND_OFFSETS_TIMEOUT_S,
                )
            producer.commit_transaction(60)

    def _abort(self) -> KafkaException | None:
        """Abort the open transaction; returns the fencing error if the producer was fenced."""
        try:
            with guarded(self.watchdog, "abort_transaction", ABORT_TIMEOUT_S):
                self.output.client().abort_transaction(ABORT_TIMEOUT_S)
        except (KafkaException, SystemError) as exc:  # fenced or broker gone: the broker aborts it anyway
            cause = kafka_cause(exc)
            log.debug("could not abort the open transaction: %s", cause)
            if isinstance(cause, KafkaException) and producer_fenced(cause):
                return cause
        return None


def delivery_for(
    exactly_once: bool,
    output: ConsumerOutput,
    transactional_id: str,
    batch_topic: str,
    watchdog: CallWatchdog | None = None,
) -> ConsumerDelivery:
    """The strategy for the app's ``exactly_once`` setting: the one place the mode is read."""
    if exactly_once:
        return TransactionalDelivery(output, transactional_id, batch_topic, watchdog)
    return AtLeastOnceDelivery(output)
