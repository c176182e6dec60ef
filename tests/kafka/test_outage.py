"""Which failures are a broker outage (processor/kafka/outage.py): waited out in the process, while
every other failure keeps its exit code (processor/kafka/exits.py)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.kafka.exits import (
    BrokerUnreachable,
    DeliveryFailed,
    MissingTopics,
    Refused,
    Superseded,
    TransientFailure,
    WrongSettings,
)
from processor.kafka.outage import StuckCall, is_outage
from processor.kafka.reach import ClusterRefused


def kafka(
    code: int, *, fatal: bool = False, retriable: bool = False, abortable: bool = False
) -> KafkaException:
    return KafkaException(
        KafkaError(code, "x", fatal=fatal, retriable=retriable, txn_requires_abort=abortable)
    )


@pytest.mark.parametrize(
    "exc",
    [
        kafka(KafkaError._ALL_BROKERS_DOWN),
        kafka(KafkaError._TRANSPORT),
        kafka(KafkaError._TIMED_OUT),
        kafka(KafkaError._MSG_TIMED_OUT),
        kafka(KafkaError.REQUEST_TIMED_OUT),
        kafka(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
        kafka(KafkaError.NOT_COORDINATOR),
        kafka(KafkaError._UNKNOWN_PARTITION),
        kafka(KafkaError.UNKNOWN, abortable=True),  # a commit whose coordinator vanished
        kafka(KafkaError.UNKNOWN, retriable=True),
        SystemError("callback raised"),
        TransientFailure("its transaction was open 12 s, past the transaction timeout"),
        DeliveryFailed("not delivered", KafkaError(KafkaError._MSG_TIMED_OUT)),
        StuckCall("send_offsets_to_transaction has not returned for 25 s"),
        BrokerUnreachable("no Kafka broker answered at b:9092 within 10 s"),
        # the consumer protocol refuses a round's member while the last round's, whose leave never
        # reached the frozen broker, holds the instance id (seen in a CI rehearsal)
        KafkaException(
            KafkaError(
                KafkaError._FATAL,
                "Fatal error: Broker: The instance ID is still used by another member in the consumer "
                "group: ConsumerGroupHeartbeat fatal error",
                fatal=True,
            )
        ),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e)[:40],
)
def test_the_broker_being_away_is_an_outage(exc: BaseException) -> None:
    if isinstance(exc, SystemError):  # confluent-kafka's wrapping of a callback's KafkaException
        exc.__cause__ = kafka(KafkaError._TRANSPORT)
    assert is_outage(exc)


@pytest.mark.parametrize(
    "exc",
    [
        kafka(KafkaError._FENCED, fatal=True),
        kafka(KafkaError._TRANSPORT, fatal=True),
        kafka(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        kafka(KafkaError.MSG_SIZE_TOO_LARGE),
        Superseded("a newer process took over"),
        Refused("refused by the cluster's authorizer"),
        ClusterRefused("TLS handshake refused"),
        WrongSettings("--group contradicts the topics"),
        MissingTopics("missing topic(s) t"),
        DeliveryFailed("too large", KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
        ValueError("a bug"),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e)[:40],
)
def test_everything_else_keeps_its_exit_code(exc: BaseException) -> None:
    assert not is_outage(exc)
