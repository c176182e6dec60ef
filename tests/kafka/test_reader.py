"""Which Kafka errors the readers (restore, status, audit) wait out rather than fail on."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.kafka.reader import passing


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,  # a leader moving
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,  # a broker restarting
        KafkaError.NOT_COORDINATOR,
        KafkaError.UNSTABLE_OFFSET_COMMIT,  # a dead processor's transaction holds the group's offsets
        KafkaError._TIMED_OUT,  # what librdkafka says once it gave up waiting for the above
    ],
)
def test_errors_that_go_away_are_waited_out(code: int) -> None:
    assert passing(KafkaException(KafkaError(code)))


def test_other_errors_are_not_and_a_retriable_flag_is_honoured() -> None:
    assert not passing(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not passing(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    assert passing(KafkaException(KafkaError(KafkaError.UNKNOWN, retriable=True)))
