"""A healthy start's librdkafka warnings are INFO; the same facility's real failures stay warnings."""

from __future__ import annotations

import logging

import pytest

from processor.kafka.rdlog import KAFKA_LOGGER, kafka_logger

FAILED = "[thrd:main]: Failed to acquire transactional PID from broker TxnCoordinator/1: Broker: "
LOADING = FAILED + "Coordinator load in progress: retrying"
REFUSED = FAILED + "Transactional Id authorization failed"


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])
def test_a_loading_coordinator_is_info_and_a_refusal_stays_a_warning(
    level: int, caplog: pytest.LogCaptureFixture
) -> None:
    logger = kafka_logger()  # repeats are rate-limited: each case logs texts of its own
    case = f" (case {logging.getLevelName(level)})"
    with caplog.at_level(level, logger=KAFKA_LOGGER):
        logger.warning("%s [%s] %s", "GETPID", "rdkafka#producer-1", LOADING + case)
        logger.warning("%s [%s] %s", "GETPID", "rdkafka#producer-1", REFUSED + case)
    seen = [(r.levelname, "load in progress" in r.getMessage()) for r in caplog.records]
    expected = [("INFO", True)] if level == logging.INFO else []
    assert seen == [*expected, ("WARNING", False)]
