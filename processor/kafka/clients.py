"""Named client settings for the processor's clients (librdkafka's log: processor.kafka.rdlog).

Every setting that a tokenfabric client adds to the operator's ``client_config`` is stated here once,
with the reason for it, so the apps build clients from names rather than from inline dicts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from processor.kafka.factory import KAFKA, ClientFactory
from processor.kafka.reader import LARGE_FETCH_QUEUE

GROUP_PROTOCOLS = ("consumer", "classic")
"""The rebalance protocols a processor's ingest group may use: KIP-848's ``consumer`` (the default:
the broker computes incremental, sticky assignments and only moved partitions stop) or ``classic``
(eager: every rebalance revokes every partition of every member)."""


BROKER_SESSION_TIMEOUT_MS = 45_000
"""The broker's default ``group.consumer.session.timeout.ms`` (and the classic client default)."""


def ingest_settings(
    conf: Mapping[str, str],
    group_id: str,
    session_timeout_ms: int,
    instance_id: str,
    group_protocol: str = "consumer",
) -> dict[str, str]:
    """The processor's ingest consumer: its own offsets (committed with its output), committed reads.

    A static member (``group.instance.id``, :func:`static_member`): a restart within the session
    timeout gets its partitions back without a rebalance of the other instances. Under the consumer
    protocol the session timeout is the group's (:func:`group_session_config`): librdkafka refuses
    ``session.timeout.ms`` there."""
    return {
        **conf,
        "group.id": group_id,
        **static_member(instance_id),
        **protocol_settings(group_protocol, session_timeout_ms),
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.max.bytes": str(64 * 1024 * 1024),
        **LARGE_FETCH_QUEUE,
    }


def protocol_settings(group_protocol: str, session_timeout_ms: int) -> dict[str, str]:
    """The client settings of a rebalance protocol. Classic: the session timeout is the client's.
    Consumer (KIP-848): ``session.timeout.ms``, ``heartbeat.interval.ms`` and
    ``partition.assignment.strategy`` are refused by the client (the broker holds them); the
    assignor is the broker's ``uniform`` (sticky) one."""
    if group_protocol == "classic":
        return {"group.protocol": "classic", "session.timeout.ms": str(session_timeout_ms)}
    if group_protocol == "consumer":
        return {"group.protocol": "consumer"}
    raise ValueError(f"group protocol must be one of {', '.join(GROUP_PROTOCOLS)}, got {group_protocol!r}")


def group_session_config(
    conf: Mapping[str, str], group_id: str, session_timeout_ms: int, clients: ClientFactory = KAFKA
) -> str | None:
    """Under the consumer protocol, set the group's ``consumer.session.timeout.ms`` (a group config,
    KIP-848). Returns None when set, else the broker's one-line reason (a value outside the broker's
    ``group.consumer.min/max.session.timeout.ms``, or no answer): the group then keeps the broker's
    default, and the caller says so once."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entry = ConfigEntry(
        "consumer.session.timeout.ms", str(session_timeout_ms), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=[entry])
    admin = clients.admin(conf)
    try:
        admin.incremental_alter_configs([resource], request_timeout=10)[resource].result(timeout=15)
    except (KafkaException, TimeoutError, ValueError) as exc:
        cause = exc.args[0] if exc.args else exc
        return str(getattr(cause, "str", lambda: cause)())
    return None


def static_member(instance_id: str) -> dict[str, str]:
    """Static group membership under ``instance_id`` (the process's transactional id: one identity).

    Why: with dynamic membership a restarted process is a new member, so the group rebalances when
    the old one leaves and again when the new one joins, and a SIGKILLed one is waited for until
    ``session.timeout.ms`` while its replacement already asks to join. A static member that comes
    back within the session timeout takes its place at once, and the broker fences an older process
    still using the id (``FENCED_INSTANCE_ID``: processor.kafka.exits). The price: a member that stops
    for good (even cleanly: static members do not leave the group on close) keeps its partitions
    unassigned until the session timeout; docs/operations.md says so.
    """
    return {"group.instance.id": instance_id}


def static_member_present(
    conf: Mapping[str, str],
    group_id: str,
    instance_id: str,
    timeout_s: float = 5.0,
    clients: ClientFactory = KAFKA,
) -> bool:
    """Whether ``group_id`` has a member under ``instance_id`` now: another process using this id, or
    one that stopped less than its session timeout ago (Kafka cannot tell the two apart). Asked at
    start, before this process fences it, so that the newer process says in its log whom it displaces.
    False when the group cannot be described in ``timeout_s`` (the start goes on regardless)."""
    from confluent_kafka import KafkaException

    admin = clients.admin(conf)
    try:
        future = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id]
        members = future.result(timeout=timeout_s).members
    except (KafkaException, TimeoutError, ValueError):
        return False
    return any(m.group_instance_id == instance_id for m in members)


def control_settings(conf: Mapping[str, str], group_id: str) -> dict[str, str]:
    """The processor's reader of contracts and results (assigned, never subscribed)."""
    return {
        **conf,
        "group.id": group_id,
        "enable.auto.commit": "false",
        # at-least-once without a committed position: from the beginning, or completions
        # written while the processor starts would be missed and their slots never freed
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }


def batch_producer_settings(
    conf: Mapping[str, str], transactional_id: str | None = None, transaction_timeout_ms: int = 0
) -> dict[str, str | bool]:
    """The producer of batches, dead letters, changelog and checkpoints; transactional when given an id."""
    out: dict[str, str | bool] = {
        **conf,
        "enable.idempotence": "true",
        "linger.ms": "5",
        "batch.size": str(1024 * 1024),
        "message.max.bytes": str(64 * 1024 * 1024),
    }
    if transactional_id is not None:
        out["transactional.id"] = transactional_id
        out["transaction.timeout.ms"] = str(transaction_timeout_ms)
        # The committed transaction is the delivery report. A successful report would copy each
        # batch back into Python to say so: a third copy of every token (docs/benchmarks.md).
        out["delivery.report.only.error"] = True
    return out


UNRELEASED_INSTANCE_ID = "instance ID is still used by another member"
"""librdkafka's fatal error under the consumer protocol when a static member joins with the id of a
member the group has not let go of yet (KIP-848: the older member keeps it, the newer is refused)."""


def wait_for_instance_id(
    settings: Mapping[str, str],
    topic: str,
    timeout_s: float,
    clients: ClientFactory = KAFKA,
    probe_s: float = 3.0,
) -> bool:
    """Consumer protocol: join ``settings``' group under its ``group.instance.id`` with a throwaway
    member until the broker accepts the id, then leave; True once accepted, False after ``timeout_s``.

    Why: under KIP-848 a static member that died without leaving (SIGKILL, a lost node) keeps its id
    until its session times out, and a replacement with the same id fails fatally (the classic
    protocol let the newer one in and fenced the older). A process restarted in that window waits
    here instead of crash-looping. The probe leaves as a static member leaves (temporarily), so the
    real member that joins next takes the same id and partitions without a rebalance."""
    import time

    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    refused: list[str] = []
    quiet = logging.getLogger("tokenfabric.kafka.probe")  # its refusals are said once, by the caller
    quiet.setLevel(logging.CRITICAL + 1)
    watched = {**settings, "error_cb": lambda e: refused.append(str(e)), "logger": quiet}
    while True:
        refused.clear()
        probe = clients.consumer(watched)
        try:
            probe.subscribe([topic])
            until = time.monotonic() + probe_s
            while time.monotonic() < until and not refused and not probe.assignment():
                try:
                    msgs = probe.consume(num_messages=1, timeout=0.2)
                except KafkaException as exc:  # the fatal error, raised rather than reported
                    refused.append(str(exc))
                    break
                refused += [str(m.error()) for m in msgs if m.error() is not None]
        finally:
            probe.close()
        if not any(UNRELEASED_INSTANCE_ID in why for why in refused):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
