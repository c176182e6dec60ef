"""The in-memory Kafka's contract (tests/kafka/contract.py) over ``MemoryKafka``; the same checks run
over the real broker in tests/broker/test_memory_contract.py, so the fake cannot drift unseen."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kafka.contract import Side, as_tests, memory_side


@pytest.fixture(params=["memory"])
def side() -> Iterator[Side]:
    yield from memory_side()


as_tests(globals())
