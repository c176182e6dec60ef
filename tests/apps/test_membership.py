"""A run an outage ended leaves the group once Kafka answers (processor/apps/membership.py, part_from).

Under the consumer protocol the group refuses a static member's id to a newer member until the
older one leaves: the run's member must outlive the outage and leave after it. Over the in-memory
Kafka: the service keeps its ingest member open when an outage ends its run, closes it when the run
ends otherwise, and ``part_from`` closes a kept member, bounded, whatever its close does.
"""

from __future__ import annotations

import logging
import threading
from typing import cast

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.apps.membership import part_from
from processor.apps.service import ProcessorService
from processor.kafka.memory import error
from processor.kafka.memory_clients import MemoryConsumer
from tests.apps.service_rig import Pipeline


def run_until_it_fails(p: Pipeline, err: KafkaError) -> ProcessorService:
    svc = p.service()
    p.mk.fail_next("consume", err)
    with pytest.raises(KafkaException):
        svc.run(threading.Event())
    return svc


def test_an_outage_keeps_the_runs_group_member_open_for_the_next_run_to_close() -> None:
    p = Pipeline()
    svc = run_until_it_fails(p, error(KafkaError._TRANSPORT, "broker went away"))
    member = cast(MemoryConsumer, svc.parting)
    assert member is svc.ingest and not member.closed
    assert cast(MemoryConsumer, svc.control).closed  # only the group member waits
    p.mk.fail_next("committed", error(KafkaError._TIMED_OUT, "no coordinator yet"))
    assert part_from(member, "p0", p.topics.ingest) is True  # its offset fetch failed: it leaves anyway
    assert member.closed


def test_a_failure_that_is_no_outage_closes_the_member_at_once() -> None:
    p = Pipeline()
    svc = run_until_it_fails(p, error(KafkaError._FATAL, "fenced", fatal=True))
    assert svc.parting is None and cast(MemoryConsumer, svc.ingest).closed


class _Member:
    def __init__(self, close: threading.Event | None = None, refuse: bool = False) -> None:
        self.release, self.refuse, self.closed = close, refuse, False

    def close(self) -> None:
        if self.release is not None:
            self.release.wait()
        if self.refuse:
            raise KafkaException(error(KafkaError._TRANSPORT, "no coordinator"))
        self.closed = True


def test_a_close_that_does_not_return_is_left_behind_and_said(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    with caplog.at_level(logging.WARNING, "tokenfabric.processor"):
        assert part_from(_Member(close=release), "p0", None, timeout_s=0.2) is False  # type: ignore[arg-type]
    release.set()
    assert "p0: the last run's group member did not leave within 0 s" in caplog.text


def test_a_refused_close_is_said_not_raised_and_no_member_is_nothing_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert part_from(None, "p0", "ingest") is True
    with caplog.at_level(logging.INFO, "tokenfabric.processor"):
        assert part_from(_Member(refuse=True), "p0", None) is True  # type: ignore[arg-type]
    assert "left with an error" in caplog.text
