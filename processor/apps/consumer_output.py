"""A consumer app's producer: what it writes (completions, its contract, dead letters) and the one
rule for writing it: queue, then flush and raise if anything was not delivered.

Why a class of its own: the batch handler (processor.apps.consumer_batches) produces, the delivery
strategy (processor.apps.consumer_delivery) runs transactions on the same producer, and the app
(processor.apps.consumer) opens it; each gets this object instead of reaching into the others.

Invariant: :meth:`ConsumerOutput.flush` returns only when every message queued since the last flush
was acknowledged; otherwise it raises :class:`DeliveryFailed` and forgets the errors it reported, so
the caller commits nothing for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError, Message

from processor.kafka.exits import DeliveryFailed, refusal
from processor.kafka.factory import KAFKA, ClientFactory, ProducerClient
from processor.kafka.outage import Abandoned
from processor.kafka.topics import TopicNames

#: How long one wait of :meth:`ConsumerOutput.flush` lasts before it looks at ``stale`` again.
FLUSH_SLICE_S = 1.0

#: Settings of the producer that writes completions, contracts and dead letters.
PRODUCER_SETTINGS: dict[str, str] = {"enable.idempotence": "true", "acks": "all", "linger.ms": "5"}


class ConsumerAppError(RuntimeError):
    """The app cannot go on (the broker cannot be reached, a contract cannot be published). A
    completion that was not delivered raises :class:`processor.kafka.exits.DeliveryFailed` instead."""


class ConsumerOutput:
    """The app's producer once :meth:`open` gave it one (``run`` does); tests set :attr:`producer`."""

    def __init__(self, stale: Callable[[], bool] = lambda: False) -> None:
        self.producer: ProducerClient | None = None
        self.stale = stale
        """Whether Kafka went away since the app's round began (processor.apps.consumer: the ride's)."""
        self._delivery_errors: list[tuple[str, KafkaError]] = []

    def open(self, producer: ProducerClient) -> ProducerClient:
        self.producer = producer
        self._delivery_errors = []
        return producer

    def client(self) -> ProducerClient:
        """The open producer (the delivery strategy runs its transactions on it)."""
        if self.producer is None:
            raise ConsumerAppError("the app's producer is not open: call run()")
        return self.producer

    def produce(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Queue one message, waiting for room when the producer's queue is full."""
        producer = self.client()
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=self._on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._delivery_errors.append((f"{msg.topic()}: {err.str()}", err))

    def flush(self, what: str, timeout_s: float = 60.0) -> None:
        """Wait for every queued message; raise (so nothing is committed) if any was not delivered.

        Nothing was committed for the batch then, so a restarted app runs it again and the processor
        counts its completions once: the command exits 75 for this (processor.kafka.exits).

        Waits in slices of :data:`FLUSH_SLICE_S` and raises :class:`Abandoned` as soon as ``stale``
        says Kafka went away meanwhile: a flush caught in an outage could otherwise wait out the
        messages' timeout (60 s and more past the broker's return, seen under a 20 s freeze) and
        leave the round's clients to a transaction coordinator they may never reach again."""
        deadline = time.monotonic() + timeout_s
        remaining = self.client().flush(min(FLUSH_SLICE_S, timeout_s))
        while remaining and time.monotonic() < deadline:
            if self.stale():
                raise Abandoned(f"{what}: Kafka went away while it was written: fresh clients first")
            remaining = self.client().flush(min(FLUSH_SLICE_S, max(0.0, deadline - time.monotonic())))
        if self._delivery_errors:
            errors, self._delivery_errors = self._delivery_errors, []
            text, first = errors[0]
            raise DeliveryFailed(f"{what}: {len(errors)} messages not delivered; first: {text}", first)
        if remaining:
            raise DeliveryFailed(f"{what}: {remaining} messages still unacknowledged after {timeout_s:g} s")


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
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    producer.produce(topics.contracts, None, consumer.encode("utf-8"), on_delivery=on_delivery)
    remaining = producer.flush(timeout_s)
    refused = refusal(errors[0], conf, operation="Write", topic=topics.contracts) if errors else None
    if refused is not None:
        raise refused
    if errors or remaining:
        detail = errors[0].str() if errors else f"not acknowledged after {timeout_s:g} s"
        raise ConsumerAppError(f"retiring {consumer}: tombstone on {topics.contracts} lost: {detail}")
