"""Fixtures of the broker tests that start a broker of their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.local import broker as kafka_local


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A broker of the test's own (its state dir and bootstrap), for tests that restart or freeze it,
    which the shared ``KAFKA_BOOTSTRAP`` broker must never be."""
    state = tmp_path / "kafka"
    info = kafka_local.start_broker(state)
    try:
        yield state, info.bootstrap
    finally:
        kafka_local.stop_broker(state)
