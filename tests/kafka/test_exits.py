"""Exit codes (processor/kafka/exits.py): 75 (restart me) only where a restart can recover."""

from __future__ import annotations

import pytest

# ------------------------------------------------------------------------------------------------
# exit codes


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        ({}, 1),
        ({"retriable": True}, 75),
        ({"txn_requires_abort": True}, 75),
        ({"fatal": True, "retriable": True}, 1),  # fenced: a restart would fence the other instance
    ],
)
def test_a_kafka_error_exits_75_only_when_a_restart_recovers(flags: dict[str, bool], code: int) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from processor.kafka.exits import exit_code

    assert exit_code(KafkaException(KafkaError(KafkaError._TIMED_OUT, "x", **flags))) == code


def test_a_delivery_failure_exits_75_unless_no_restart_can_deliver() -> None:
    from confluent_kafka import KafkaError

    from processor.apps.consumer import ConsumerAppError
    from processor.kafka.exits import DeliveryFailed, exit_code

    assert exit_code(DeliveryFailed("broker away", KafkaError(KafkaError._MSG_TIMED_OUT))) == 75
    assert exit_code(DeliveryFailed("topic not there yet", KafkaError(KafkaError._UNKNOWN_TOPIC))) == 75
    assert exit_code(DeliveryFailed("3 still unacknowledged after 60 s")) == 75
    assert exit_code(DeliveryFailed("too large", KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))) == 1
    assert exit_code(DeliveryFailed("no rights", KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))) == 1
    assert exit_code(DeliveryFailed("fenced", KafkaError(KafkaError._FENCED, fatal=True))) == 1
    assert exit_code(ConsumerAppError("not open")) == 1
    assert exit_code(ValueError("a bug")) == 1
