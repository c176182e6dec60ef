"""A healthy start's librdkafka warnings are INFO; the same facility's real failures stay warnings."""

from __future__ import annotations

import logging

import pytest

from processor.kafka.rdlog import KAFKA_LOGGER, demote_outage_lines, kafka_logger

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


def test_an_outage_is_not_a_page_of_librdkafka_lines(caplog: pytest.LogCaptureFixture) -> None:
    """What a frozen or restarting broker makes every client log is DEBUG: the command says the
    outage itself, once (processor/apps/ride.py); a real failure of the same facility stays."""
    logger = kafka_logger()
    demote = demote_outage_lines()
    outage = [
        ("FAIL", "127.0.0.1:9/1: Disconnected: connection reset by peer (after 57187ms in state UP)"),
        ("FAIL", "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused"),
        ("SESSTMOUT", "Consumer group session timed out (in join-state steady) after 45125 ms"),
        ("REQTMOUT", "127.0.0.1:9/1: Timed out 1 in-flight, 0 retry-queued, 0 out-queue requests"),
        ("FAIL", "127.0.0.1:9/1: ApiVersionRequest failed: Local: Timed out: probably due to broker version"),
        ("ADDOFFSETS", "Failed to add offsets to transaction on broker 1: Local: Broker transport failure"),
    ]
    with caplog.at_level(logging.INFO, logger=KAFKA_LOGGER):
        for fac, text in outage:
            logger.error("%s [%s] %s", fac, "rdkafka#consumer-9", text + " (outage case)")
        logger.error("%s [%s] %s", "FAIL", "rdkafka#consumer-9", "SSL handshake failed (outage case)")
    logger.removeFilter(demote)
    assert [r.getMessage().split("] ")[-1] for r in caplog.records] == ["SSL handshake failed (outage case)"]
