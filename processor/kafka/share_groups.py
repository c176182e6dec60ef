"""Kafka share groups (KIP-932) for the share-group queue baseline: its consumer and its start offset.

Why here: apps get their clients from processor/kafka (every client logs through rdlog), and
confluent-kafka's ``ShareConsumer`` and the group-config call are not part of the ``ClientFactory``
the product's apps use (the share queue is a baseline, not a product mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processor.kafka.rdlog import with_kafka_logger


def share_consumer(conf: Mapping[str, Any]) -> Any:
    """confluent-kafka's ``ShareConsumer`` (a preview client in 2.16) with librdkafka's log routed."""
    from confluent_kafka import ShareConsumer

    return ShareConsumer(with_kafka_logger(conf))


#: The acquisition lock the share-group queue asks for (ms): a batch's engine time must fit in it, or
#: its records are delivered again to another worker (the broker's default is 30 s, its ceiling,
#: ``group.share.max.record.lock.duration.ms``, 60 s by default).
LOCK_MS = 60_000


def read_from_earliest(conf: Mapping[str, str], group: str, timeout_s: float = 30.0) -> None:
    """Set share group ``group``'s ``share.auto.offset.reset`` to ``earliest`` (the default is ``latest``:
    a group would skip what was produced before its first member joined) and its records' lock to
    :data:`LOCK_MS` (``share.record.lock.duration.ms``)."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entries = [
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry(
            "share.record.lock.duration.ms", str(LOCK_MS), incremental_operation=AlterConfigOpType.SET
        ),
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = AdminClient(with_kafka_logger({**conf, "log_level": "3"}))
    admin.incremental_alter_configs([resource])[resource].result(timeout_s)
