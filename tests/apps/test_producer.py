"""The producer library (processor/apps/producer.py) without a broker: synthetic tokens. Against a
broker: tests/broker/test_producer_consumer.py."""

from __future__ import annotations

import time

import pytest

from processor.apps.producer import SYNTHETIC_VOCAB, synthetic_tokens
from processor.wire.records import ids_from_tokens

# ------------------------------------------------------------------------------------------------
# synthetic tokens


def test_synthetic_tokens_are_deterministic_distinct_and_in_vocab() -> None:
    a = synthetic_tokens("job:1", 5000)
    assert len(a) == 4 * 5000
    assert a == synthetic_tokens("job:1", 5000)
    assert a != synthetic_tokens("job:2", 5000)
    assert synthetic_tokens("job:1", 10) == a[:40]  # a prefix of the same window
    assert max(ids_from_tokens(a)) < SYNTHETIC_VOCAB
    assert synthetic_tokens("x", 0) == b""
    longer = synthetic_tokens("x", 3_000_000)  # longer than the precomputed block
    assert len(longer) == 12_000_000
    with pytest.raises(ValueError, match="length"):
        synthetic_tokens("x", -1)


def test_synthetic_tokens_are_cheap() -> None:
    synthetic_tokens("warm-up", 1)  # builds the block once
    started = time.perf_counter()
    total = 0
    for i in range(25_000):
        total += len(synthetic_tokens(f"job:{i}", 4_000)) // 4
    elapsed = time.perf_counter() - started
    assert total == 100_000_000
    assert elapsed < 5.0, f"100M synthetic tokens took {elapsed:.2f} s"
