"""The processor's group membership at start, under the consumer group protocol (KIP-848).

Two things the classic protocol did in the client are the group's there: the session timeout (a
group config, :func:`set_group_session`) and who wins when two members share a
``group.instance.id`` (the older one now: :func:`wait_for_own_id` waits out a predecessor that died
without leaving, instead of failing fatally). docs/operations.md, "Static membership under the
consumer protocol".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from processor.apps.settings import ProcessorSettings
from processor.kafka.clients import (
    BROKER_SESSION_TIMEOUT_MS,
    group_session_config,
    ingest_settings,
    wait_for_instance_id,
)
from processor.kafka.exits import TransientFailure
from processor.kafka.factory import ClientFactory, ConsumerClient

log = logging.getLogger("tokenfabric.processor")

#: How long the next round waits for the last round's member to leave the group once Kafka answers.
PART_TIMEOUT_S = 15.0


def wait_for_own_id(
    conf: Mapping[str, str], s: ProcessorSettings, identity: str, topic: str, who: str, clients: ClientFactory
) -> None:
    """The group refuses ``identity`` while the member that had it is not gone (a crash leaves it
    there for the session timeout): wait for it, saying so once; past the session timeout plus 15 s,
    a transient failure (exit 75: a restart tries again)."""
    settings = ingest_settings(conf, s.group_id, s.session_timeout_ms, identity, s.group_protocol)
    wait_s = max(s.session_timeout_ms, BROKER_SESSION_TIMEOUT_MS) / 1000 + 15
    if wait_for_instance_id(settings, topic, 0.0, clients):
        return
    log.warning(
        "%s: the group still holds instance id %s for a member that did not leave (a crash?); "
        "waiting up to %.0f s for its session to time out",
        who,
        identity,
        wait_s,
    )
    if not wait_for_instance_id(settings, topic, wait_s, clients):
        raise TransientFailure(f"{who}: instance id {identity} still held after {wait_s:.0f} s")


def set_group_session(conf: Mapping[str, str], s: ProcessorSettings, clients: ClientFactory) -> None:
    """The session timeout is the group's config, not the client's: set it when it is not the
    broker's default (45 s), and say once if the broker refused it."""
    if s.group_protocol != "consumer" or s.session_timeout_ms == BROKER_SESSION_TIMEOUT_MS:
        return
    refused = group_session_config(conf, s.group_id, s.session_timeout_ms, clients)
    if refused is not None:
        log.warning(
            "group %s keeps the broker's session timeout: consumer.session.timeout.ms=%d refused (%s)",
            s.group_id,
            s.session_timeout_ms,
            refused,
        )


def part_from(
    member: ConsumerClient | None, who: str, topic: str | None, timeout_s: float = PART_TIMEOUT_S
) -> bool:
    """Close the group member of a round an outage ended, now that Kafka answers again, once its
    own client reaches the group's coordinator (an offset fetch of ``topic`` through it answers;
    None: at once, as under the classic protocol, whose static members send no leave); True once it
    closed, each step within ``timeout_s`` (or there was none).

    Why: closed during the outage, or while its client still looks for the coordinator, a member's
    leave is not sent (librdkafka: "leave: ConsumerGroupHeartbeat response error in state
    query-coord: Local: Waiting for coordinator"; a connection it opened to a frozen broker first
    waits out its ApiVersion request, 10 s), and under the consumer protocol the group then refuses
    its instance id to the next round until the session times out (45 s by default:
    :func:`wait_for_own_id` waits it out; closed as soon as a fresh client reached the coordinator,
    5 runs of 8 still waited). Closed after, it leaves as a static member leaves, and the next round
    takes its id and partitions at once (in 5 of 6 runs of a 20 s freeze; docs/operations.md). The
    close runs in a thread of its own: one that never returns (librdkafka#5511) is left behind, and
    the next round waits for the id as before."""
    if member is None:
        return True
    from confluent_kafka import KafkaException, TopicPartition

    try:  # an offset fetch goes through the member's own coordinator connection; no callbacks run
        if topic is not None:
            member.committed([TopicPartition(topic, 0)], timeout=timeout_s)
    except KafkaException as exc:  # still unstable (an open transaction) or unreached: leave anyway
        log.info("%s: the last run's group member reached no coordinator (%s); it leaves anyway", who, exc)
    closing = threading.Thread(target=_leave, args=(member, who), name="parting-member", daemon=True)
    closing.start()
    closing.join(timeout_s)
    if closing.is_alive():
        log.warning("%s: the last run's group member did not leave within %.0f s", who, timeout_s)
        return False
    return True


def _leave(member: ConsumerClient, who: str) -> None:
    from confluent_kafka import KafkaException

    try:
        member.close()
    except (KafkaException, RuntimeError) as exc:  # closed already, or refused: its session ends it
        log.info("%s: the last run's group member left with an error: %s", who, exc)
