"""Health (processor/ops/health.py): /healthz and /readyz answer 200 or 503 with a reason, and the
metrics server's port and flags."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from processor import __version__
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
from tests.ops.helpers import OPENMETRICS_ACCEPT, FakeService, parse, parse_openmetrics, scrape, value

# -- health -------------------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[FakeService, ObservabilityServer]]:
    svc = FakeService()
    server = ObservabilityServer(
        processor_registry(svc, pipeline_in_background=False), ProcessorHealth(svc), "127.0.0.1", 0
    )
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


# -- the exposition -----------------------------------------------------------------------------


def test_metrics_negotiate_the_prometheus_text_format_or_openmetrics(
    served: tuple[FakeService, ObservabilityServer],
) -> None:
    """prometheus-client's own encoders, chosen on Accept; both parse with prometheus_client's parsers."""
    svc, server = served
    svc.lag = {0: 4}
    url = server.url + "/metrics"
    plain = scrape(url)
    assert plain.content_type.startswith("text/plain; version=0.0.4"), plain.content_type
    assert plain.encoding is None
    assert value(parse(plain.text), "tokenfabric_ingest_lag_messages", partition="0") == 4

    om = scrape(url, accept=OPENMETRICS_ACCEPT, gzipped=True)
    assert om.content_type.startswith("application/openmetrics-text; version=1.0.0"), om.content_type
    assert om.encoding == "gzip"
    assert om.text.endswith("# EOF\n")
    samples = parse_openmetrics(om.text)  # the strict parser: raises on anything OpenMetrics forbids
    assert value(samples, "tokenfabric_ingest_lag_messages", partition="0") == 4
    assert value(samples, "tokenfabric_ledger_ok") == 1
    assert value(samples, "tokenfabric_build_info", version=__version__) == 1
    assert ("tokenfabric_offset_commits_total", frozenset()) in samples

    only = scrape(url + "?name[]=tokenfabric_ledger_ok&name[]=tokenfabric_step_age_seconds")
    assert {name for name, _ in parse(only.text)} == {"tokenfabric_ledger_ok", "tokenfabric_step_age_seconds"}
    # health answers stay one JSON line whatever the scraper asks for
    code, body = get(server.url + "/healthz")
    assert code == 200 and body.count("\n") == 1 and json.loads(body)["ok"] is True


def test_a_collector_that_fails_answers_500_and_health_still_answers() -> None:
    class Broken:
        def collect(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Broken())  # type: ignore[arg-type]
    server = ObservabilityServer(registry, ServingHealth(), "127.0.0.1", 0)
    try:
        code, body = get(server.url + "/metrics")
        assert code == 500 and "boom" in body
        assert get(server.url + "/healthz")[0] == 200
    finally:
        server.close()


class _Big:
    """A collector whose exposition is megabytes: its answer cannot fit a socket's buffers."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        fam = GaugeMetricFamily("tokenfabric_test_big", "x" * 100, labels=["n"])
        for n in range(20_000):
            fam.add_metric([f"{n:0>2000}"], n)
        yield fam


def test_a_client_that_went_away_leaves_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """A scrape that gave up (as Prometheus does while the process is paused) and reset its connection:
    writing the answer fails with BrokenPipeError or ConnectionResetError, and the server logs it at
    debug level instead of printing socketserver's traceback."""
    import socket
    import struct

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Big())
    server = ObservabilityServer(registry, ServingHealth(), "127.0.0.1", 0)
    errors: list[BaseException | None] = []
    handle = server.httpd.handle_error

    def seen(request: Any, address: Any) -> None:
        errors.append(sys.exc_info()[1])
        handle(request, address)

    server.httpd.handle_error = seen  # type: ignore[method-assign]
    try:
        client = socket.create_connection(("127.0.0.1", server.port))
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        client.recv(1)  # the answer has started
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, not a polite close
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.close()
    assert errors and isinstance(errors[0], (BrokenPipeError, ConnectionResetError)), errors
    assert "Traceback" not in capfd.readouterr().err


def test_other_request_errors_keep_their_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    server = ObservabilityServer(CollectorRegistry(), ServingHealth(), "127.0.0.1", 0)
    try:
        try:
            raise ValueError("a bug")
        except ValueError:
            server.httpd.handle_error(None, ("127.0.0.1", 1))
    finally:
        server.close()
    assert "ValueError: a bug" in capfd.readouterr().err


def test_a_broker_away_leaves_the_process_live_and_unready_and_says_so_in_metrics() -> None:
    """processor/apps/ride.py: while it waits for Kafka the process must not be restarted (live),
    must get no traffic (not ready), and exports ``tokenfabric_broker_reachable 0``."""
    from processor.apps.ride import BrokerWatch
    from processor.ops.broker_metrics import BrokerCollector
    from processor.ops.health import RideHealth, Verdict

    class Stuck:  # the round's own checks fail: the round is gone, its loop no longer steps
        def live(self) -> Verdict:
            return Verdict(False, "owner loop stuck")

        def ready(self) -> Verdict:
            return Verdict(False, "owner loop stuck")

    now = [50.0]
    watch = BrokerWatch(clock=lambda: now[0])
    health = RideHealth(Stuck(), watch)
    registry = CollectorRegistry()
    registry.register(BrokerCollector(watch))
    assert not health.live().ok  # reachable: the round's own verdict
    assert registry.get_sample_value("tokenfabric_broker_reachable") == 1
    watch.went_away()
    now[0] += 42
    live, ready = health.live(), health.ready()
    assert live.ok and "away for 42 s" in live.reason
    assert not ready.ok and ready.reason == "Kafka unreachable for 42 s"
    assert registry.get_sample_value("tokenfabric_broker_reachable") == 0
    assert registry.get_sample_value("tokenfabric_broker_unreachable_seconds") == 42
    assert registry.get_sample_value("tokenfabric_broker_outages_total") == 1
    watch.came_back()
    assert not health.live().ok and registry.get_sample_value("tokenfabric_broker_unreachable_seconds") == 0
