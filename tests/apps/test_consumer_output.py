"""The consumer app's flush under an outage: it stops waiting once Kafka was seen to go away."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from processor.apps import consumer_output
from processor.apps.consumer_output import ConsumerOutput
from processor.kafka.exits import DeliveryFailed
from processor.kafka.outage import Abandoned, is_outage


class Unacknowledged:
    """A producer whose one queued message is never acknowledged (a broker frozen mid-flush)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def flush(self, timeout: float) -> int:
        self.waits.append(timeout)
        time.sleep(timeout)
        return 1


@pytest.fixture(autouse=True)
def short_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_output, "FLUSH_SLICE_S", 0.05)


def test_a_flush_caught_in_an_outage_is_abandoned_at_its_next_slice() -> None:
    producer = Unacknowledged()
    seen = iter([False, False, True])  # the lookout sees the outage during the third wait
    output = ConsumerOutput(stale=lambda: next(seen))
    output.open(cast(Any, producer))
    with pytest.raises(Abandoned, match="completions of batch b1: Kafka went away") as ended:
        output.flush("completions of batch b1", timeout_s=60.0)
    assert is_outage(ended.value)
    assert len(producer.waits) == 3 and max(producer.waits) <= 0.05  # gave up after 3 slices, not 60 s


def test_without_an_outage_a_flush_waits_its_whole_timeout_and_says_what_is_unacknowledged() -> None:
    producer = Unacknowledged()
    output = ConsumerOutput()
    output.open(cast(Any, producer))
    began = time.monotonic()
    with pytest.raises(DeliveryFailed, match=r"1 messages still unacknowledged after 0\.5 s"):
        output.flush("completions of batch b1", timeout_s=0.5)
    assert time.monotonic() - began >= 0.5 and len(producer.waits) > 1
