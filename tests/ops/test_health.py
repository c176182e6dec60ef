"""Health (processor/ops/health.py): /healthz and /readyz answer 200 or 503 with a reason, and the
metrics server's port and flags."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from processor.ops.health import (
    HttpSettings,
    ObservabilityServer,
    ProcessorHealth,
    ServingHealth,
    http_settings,
    start_http,
)
from processor.ops.metrics import processor_registry
from tests.common import get
from tests.ops.helpers import FakeService

# -- health -------------------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[FakeService, ObservabilityServer]]:
    svc = FakeService()
    server = ObservabilityServer(processor_registry(svc), ProcessorHealth(svc), "127.0.0.1", 0)
    try:
        code, body = get(server.url + "/healthz")
        assert code == 503 and json.loads(body)["reason"].startswith("starting"), body
        assert get(server.url + "/readyz")[0] == 503
        svc.last_step_s = time.monotonic() + 1e-3  # the loop completed its first step
        yield svc, server
    finally:
        server.close()


def test_health_endpoints_answer_200_or_503_with_a_reason(
    served: tuple[FakeService, ObservabilityServer],
) -> None:
    svc, server = served
    code, body = get(server.url + "/healthz")
    assert code == 200 and json.loads(body)["ok"] is True
    assert get(server.url + "/readyz")[0] == 200

    svc.ledger_error = "model m out of balance: received 10 tokens, queued+routed 3"
    code, body = get(server.url + "/readyz")
    assert code == 503 and "ledger check failed" in json.loads(body)["reason"]
    assert get(server.url + "/healthz")[0] == 200  # a bad ledger is not a reason to restart
    svc.ledger_error = None

    svc.last_broker_ok_s = time.monotonic() - 600
    code, body = get(server.url + "/readyz")
    assert code == 503 and "broker silent" in json.loads(body)["reason"]
    assert get(server.url + "/healthz")[0] == 200  # nor is a broker outage

    svc.last_broker_ok_s = time.monotonic()
    svc.restoring_since_s = time.monotonic() - 5  # a long restore of assigned partitions
    code, body = get(server.url + "/healthz")
    assert code == 200 and "restoring" in json.loads(body)["reason"]
    assert get(server.url + "/readyz")[0] == 503  # live but not ready while restoring
    svc.restoring_since_s = time.monotonic() - 3600
    assert get(server.url + "/healthz")[0] == 503  # a restore that never ends is stuck
    svc.restoring_since_s = None

    svc.last_step_s = time.monotonic() - 600
    code, body = get(server.url + "/healthz")
    assert code == 503 and "stuck" in json.loads(body)["reason"]
    assert body.count("\n") == 1
    assert get(server.url + "/readyz")[0] == 503

    code, body = get(server.url + "/metrics")
    assert code == 200 and "tokenfabric_step_age_seconds" in body
    assert get(server.url + "/nope")[0] == 404


def test_a_taken_default_port_warns_but_an_explicit_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    first = ObservabilityServer(registry, ServingHealth(), "127.0.0.1", 0)
    try:
        taken = HttpSettings("127.0.0.1", first.port, explicit=False)
        with caplog.at_level("WARNING", logger="tokenfabric.http"):
            assert start_http(taken, registry, ServingHealth()) is None
        assert "not served" in caplog.text
        with pytest.raises(OSError, match="--metrics-port"):
            start_http(HttpSettings("127.0.0.1", first.port, explicit=True), registry, ServingHealth())
    finally:
        first.close()


def test_metrics_flags() -> None:
    from processor.cli.tokenfabric import build_parser

    parser = build_parser("processor")
    args = parser.parse_args(["processor"])
    settings = http_settings(args, 9464)
    assert settings == HttpSettings("127.0.0.1", 9464, False, 30.0, 60.0)
    assert http_settings(parser.parse_args(["processor", "--metrics-port", "0"]), 9464) is None
    with pytest.raises(ValueError, match="--metrics-port"):
        http_settings(parser.parse_args(["processor", "--metrics-port", "70000"]), 9464)
    with pytest.raises(ValueError, match="healthz"):
        http_settings(parser.parse_args(["processor", "--healthz-step-s", "0"]), 9464)
    consumer = build_parser("consumer").parse_args(["consumer", "--id", "c", "--metrics-addr", "0.0.0.0"])
    assert http_settings(consumer, 9465) == HttpSettings("0.0.0.0", 9465, False, 30.0, 60.0)
