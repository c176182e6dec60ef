"""An in-memory Kafka for tests: the client methods tokenfabric uses, with Kafka's semantics.

:class:`MemoryKafka` is one cluster; :meth:`MemoryKafka.clients` is a
:class:`~processor.kafka.factory.ClientFactory` whose consumers, producers and admin clients read and
write it. Like Bytewax's ``testing`` module it ships with the package, so a user's tests of code
built on tokenfabric's apps need no broker either.

What it keeps faithful (each has a test in tests/kafka/test_memory.py; the properties the adapters
rely on are also run against the real broker by tests/kafka/contract.py, so the fake cannot drift):

- Partitioned logs with offsets; a message's partition is the one asked, else a hash of its key.
- Transactions: what a transactional producer writes is pending until ``commit_transaction``;
  ``read_committed`` consumers read only up to the last stable offset (the first pending message)
  and never see an aborted message; offsets sent with ``send_offsets_to_transaction`` become the
  group's committed offsets only when the transaction commits. Watermarks asked by a
  ``read_committed`` consumer end at the last stable offset, as the broker's ListOffsets does.
- Fencing: ``init_transactions`` under a transactional id aborts the previous producer's open
  transaction, and that producer's next transactional call raises a fatal ``_FENCED``.
- The broker's own abort of a transaction open past ``transaction.timeout.ms``
  (:meth:`MemoryKafka.expire_transactions`, on the cluster's clock): its producer is fenced too.
- Delivery reports run from ``poll``/``flush``/``commit_transaction``, never from ``produce``;
  with ``delivery.report.only.error`` only failures are reported.
- Consumer groups: subscribed members share the partitions (a static member, ``group.instance.id``,
  takes the place of an older member with its id, which is fenced), rebalances call ``on_revoke`` then
  ``on_assign`` from inside ``consume`` (as librdkafka does from ``poll``), committed offsets decide
  where a new owner starts, ``enable.partition.eof`` reports each partition's end once.
  ``commit(message=m)`` commits ``m``'s partition at ``m.offset() + 1`` only, as the client does.
- Errors are real ``KafkaException(KafkaError(...))`` objects, so code classifies them as it would
  the client's (processor.kafka.exits).

Faults are scripted: :meth:`MemoryKafka.fail_next` makes the next call of a method raise a given
error, :meth:`MemoryKafka.fail_deliveries` fails the deliveries to a topic. Not modelled: control
records taking offsets, replication, quotas, message size limits, wall-clock timeouts (a call that
"times out" is a scripted fault), and headers.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from processor.kafka.factory import Settings
from processor.kafka.memory_clients import MemoryConsumer, MemoryProducer
from processor.kafka.memory_cluster import ABORTED, COMMITTED, PENDING, Group, MemoryCluster, Record, error

__all__ = [
    "ABORTED",
    "COMMITTED",
    "PENDING",
    "Group",
    "MemoryAdmin",
    "MemoryClients",
    "MemoryCluster",
    "MemoryKafka",
    "Record",
    "error",
]


class MemoryKafka(MemoryCluster):
    """One in-memory cluster (:class:`~processor.kafka.memory_cluster.MemoryCluster`) and the client
    factory over it. Not thread-safe: tests drive it from one thread, like the apps' loops."""

    def clients(self) -> MemoryClients:
        """A client factory over this cluster."""
        return MemoryClients(self)


class MemoryClients:
    """The :class:`~processor.kafka.factory.ClientFactory` of a :class:`MemoryKafka`."""

    def __init__(self, cluster: MemoryKafka) -> None:
        self.cluster = cluster

    def consumer(self, settings: Settings) -> MemoryConsumer:
        from processor.kafka.memory_clients import MemoryConsumer

        return MemoryConsumer(self.cluster, settings)

    def producer(self, settings: Settings) -> MemoryProducer:
        from processor.kafka.memory_clients import MemoryProducer

        return MemoryProducer(self.cluster, settings)

    def admin(self, settings: Settings) -> MemoryAdmin:
        return MemoryAdmin(self.cluster)


class MemoryAdmin:
    def __init__(self, cluster: MemoryKafka) -> None:
        self.cluster = cluster

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.cluster._call("list_topics")
        return self.cluster.metadata(topic)

    def create_topics(self, new_topics: list[Any], **kwargs: Any) -> dict[str, Any]:
        """Futures per topic name, as the real admin client returns: ``TOPIC_ALREADY_EXISTS`` for one
        that exists (its settings are left alone)."""
        self.cluster._call("create_topics")
        out: dict[str, Any] = {}
        for new in new_topics:
            future: Future[Any] = Future()
            if new.topic in self.cluster.topics:
                future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
            else:
                self.cluster.create_topic(new.topic, new.num_partitions, dict(new.config))
                future.set_result(None)
            out[new.topic] = future
        return out

    def describe_topics(self, topics: Any, **kwargs: Any) -> dict[str, Any]:
        """Futures per topic name (``topics`` a ``TopicCollection``): ``UNKNOWN_TOPIC_OR_PART`` for one
        not there; the memory cluster has no authorizer, so nothing is ever refused."""
        self.cluster._call("describe_topics")
        out: dict[str, Any] = {}
        for name in topics.topic_names:
            future: Future[Any] = Future()
            if name in self.cluster.topics:
                future.set_result(SimpleNamespace(name=name))
            else:
                future.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
            out[name] = future
        return out

    def describe_consumer_groups(self, group_ids: list[str], **kwargs: Any) -> dict[str, Any]:
        self.cluster._call("describe_consumer_groups")
        out: dict[str, Any] = {}
        for group in group_ids:
            future: Future[Any] = Future()
            members = [
                SimpleNamespace(group_instance_id=m.settings.get("group.instance.id"))
                for m in self.cluster.groups[group].members
            ]
            future.set_result(SimpleNamespace(group_id=group, members=members))
            out[group] = future
        return out

    def incremental_alter_configs(self, resources: list[Any], **kwargs: Any) -> dict[Any, Any]:
        """Group configs (a consumer-protocol group's session timeout): accepted, and kept nowhere
        (the in-memory group has no session clock)."""
        self.cluster._call("incremental_alter_configs")
        out: dict[Any, Any] = {}
        for resource in resources:
            future: Future[Any] = Future()
            future.set_result(None)
            out[resource] = future
        return out
