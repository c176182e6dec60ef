"""``wait_for_cluster``: the long-running commands' wait for a broker that is not there (yet)."""

from __future__ import annotations

import logging
import threading

import pytest

from processor.kafka.reach import wait_for_cluster

DEAD = {"bootstrap.servers": "127.0.0.1:1"}


def test_it_says_so_once_however_often_it_retries(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    log = logging.getLogger("tokenfabric.test.reach")
    attempts = 0
    real_wait = stop.wait

    def counting_wait(timeout: float | None = None) -> bool:
        nonlocal attempts
        attempts += 1
        if attempts == 3:
            stop.set()  # stopped during the third pause: three probes failed
        return real_wait(timeout)

    stop.wait = counting_wait  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger=log.name):
        assert wait_for_cluster(DEAD, stop, log, timeout_s=0.5, retry_s=0.05) is False
    assert attempts == 3
    said = [r for r in caplog.records if r.name == log.name]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.WARNING
    message = said[0].getMessage()
    assert message.startswith("no Kafka broker answered at 127.0.0.1:1 within ")
    assert "(Connect to ipv4#127.0.0.1:1 failed: Connection refused" in message
    assert message.endswith("retrying every 0.05 s until it answers")


def test_a_stop_before_the_first_probe_returns_at_once(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    stop.set()
    with caplog.at_level(logging.INFO):
        assert wait_for_cluster(DEAD, stop, logging.getLogger("tokenfabric.test.reach")) is False
    assert not caplog.records


@pytest.mark.parametrize(
    ("said", "line"),
    [
        (
            "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: "
            "broker certificate could not be verified, verify that ssl.ca.location is correctly "
            "configured (after 5ms)",
            "the broker's certificate is not signed by the CA this client trusts (ssl.ca.location=/ca.pem)",
        ),
        (
            "Receive failed: error:0A000416:SSL routines::ssl/tls alert certificate unknown: "
            "SSL alert number 46",
            "it does not accept this client's certificate (/me.p12): expired",
        ),
        (
            "SASL authentication error: Authentication failed during authentication due to "
            "invalid credentials with SASL mechanism SCRAM-SHA-512 (after 318ms in state AUTH_REQ)",
            "SASL login refused for user 'carol' (SCRAM-SHA-512)",
        ),
    ],
)
def test_a_refused_handshake_or_login_is_named_from_what_librdkafka_said(said: str, line: str) -> None:
    from processor.kafka.reach import refused_line

    conf = {
        "ssl.ca.location": "/ca.pem",
        "ssl.keystore.location": "/me.p12",
        "sasl.username": "carol",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": "hunter2",
    }
    found = refused_line(["Connect to ipv4#127.0.0.1:9 failed: Connection refused", said], conf)
    assert found is not None and line in found and "hunter2" not in found
    assert refused_line(["Connect to ipv4#127.0.0.1:9 failed: Connection refused"], conf) is None
