"""Where the apps get their Kafka clients: one small factory, passed in.

Why: the processor service, the consumer app, the plain queue, the committers and the readers used to
build ``confluent_kafka`` clients themselves, so their loops and every failure path of a commit ran
only against a broker. They now receive a :class:`ClientFactory`. :class:`KafkaClients` is the real
one (librdkafka's log routed through Python logging, processor.kafka.rdlog);
:mod:`processor.kafka.memory` is a faithful in-memory stand-in with the same method names and error
types, for tests that need no broker.

The protocols below name exactly the client methods tokenfabric calls, with confluent-kafka's
signatures; anything implementing them can stand in for a client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from confluent_kafka import TopicPartition

from processor.kafka.rdlog import with_kafka_logger

Settings = Mapping[str, Any]
"""A librdkafka configuration: the operator's client settings plus what the role adds."""


class ConsumerClient(Protocol):
    """The consumer methods tokenfabric uses (``confluent_kafka.Consumer``'s names and arguments)."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Any, list[TopicPartition]], None] = ...,
        on_revoke: Callable[[Any, list[TopicPartition]], None] = ...,
        on_lost: Callable[[Any, list[TopicPartition]], None] = ...,
    ) -> None: ...
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def assignment(self) -> list[TopicPartition]: ...
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]: ...
    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]: ...
    def poll(self, timeout: float = -1) -> Any: ...
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...
    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def seek(self, partition: TopicPartition) -> None: ...
    def commit(self, *args: Any, **kwargs: Any) -> Any: ...
    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]: ...
    def consumer_group_metadata(self) -> Any: ...
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def close(self) -> None: ...


class ProducerClient(Protocol):
    """The producer methods tokenfabric uses (``confluent_kafka.Producer``'s names and arguments)."""

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None: ...
    def poll(self, timeout: float = -1) -> int: ...
    def flush(self, timeout: float = -1) -> int: ...
    def init_transactions(self, timeout: float = -1) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None: ...
    def commit_transaction(self, timeout: float = -1) -> None: ...
    def abort_transaction(self, timeout: float = -1) -> None: ...
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def __len__(self) -> int: ...


class AdminClientLike(Protocol):
    """The admin methods tokenfabric uses (``confluent_kafka.admin.AdminClient``'s)."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def describe_consumer_groups(self, group_ids: list[str], **kwargs: Any) -> dict[str, Any]: ...
    def create_topics(self, new_topics: list[Any], **kwargs: Any) -> dict[str, Any]: ...
    def describe_topics(self, topics: Any, **kwargs: Any) -> dict[str, Any]: ...
    def list_consumer_group_offsets(
        self, list_consumer_group_offsets_request: list[Any], **kwargs: Any
    ) -> dict[str, Any]: ...
    def incremental_alter_configs(self, resources: list[Any], **kwargs: Any) -> dict[Any, Any]: ...


class ClientFactory(Protocol):
    """Builds every client an app uses from its settings. Implementations must not change the
    settings' meaning: a stand-in honours the ones that decide semantics (``isolation.level``,
    ``transactional.id``, ``transaction.timeout.ms``, ``group.id``, ``auto.offset.reset``,
    ``enable.partition.eof``, ``delivery.report.only.error``)."""

    def consumer(self, settings: Settings) -> ConsumerClient: ...
    def producer(self, settings: Settings) -> ProducerClient: ...
    def admin(self, settings: Settings) -> AdminClientLike: ...


class KafkaClients:
    """The real clients, with librdkafka's log through Python logging (processor.kafka.rdlog)."""

    def consumer(self, settings: Settings) -> ConsumerClient:
        from confluent_kafka import Consumer

        return Consumer(with_kafka_logger(settings))

    def producer(self, settings: Settings) -> ProducerClient:
        from confluent_kafka import Producer

        return Producer(with_kafka_logger(settings))

    def admin(self, settings: Settings) -> AdminClientLike:
        from confluent_kafka.admin import AdminClient

        return AdminClient(with_kafka_logger(settings))


KAFKA = KafkaClients()
"""The default factory: real clients."""
