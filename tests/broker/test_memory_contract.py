"""The in-memory Kafka's contract (tests/kafka/contract.py) over the real broker: every property the
memory run checks on ``MemoryKafka`` holds here too. Needs a broker because it is the broker's word."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kafka.contract import Side, as_tests, broker_side

pytestmark = pytest.mark.kafka


@pytest.fixture(params=["broker"])
def side(kafka_bootstrap: str) -> Iterator[Side]:
    yield from broker_side(kafka_bootstrap)


as_tests(globals())
