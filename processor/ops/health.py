"""Liveness and readiness, served with ``/metrics`` by one small HTTP server per process.

``/healthz`` (live): the processor's owner loop completed a step within ``step_timeout_s`` (30 s).
A loop stuck in a call that never returns, or dead with the process still up, fails it, and
Kubernetes restarts the pod. Nothing else is checked here: a broker outage must not restart
processors in a loop, so it only makes the pod unready. (That holds while the loop's Kafka calls
return within their timeouts; a call that blocks longer than ``step_timeout_s`` does fail liveness.)
Start-up (fencing, loading the checkpoint) happens before the first step; ``/healthz`` answers 503
``starting`` until the first step completes, so a startup probe on ``/healthz`` holds the liveness
probe off until the processor really runs. Restoring lane state happens inside a step, whenever the
group assigns partitions (at start and at every rebalance), and can take long: while it runs the
processor is live (up to ``restore_timeout_s``, 10 minutes) and not ready.

``/readyz`` (ready): live, the broker answered within ``broker_timeout_s`` (60 s), and the last
ledger check passed (``service.ledger_error is None``). The service stops on an imbalance; readiness
reports it for as long as the process is still up.

Each answers 200 or 503 with one line of JSON: ``{"ok": true, "reason": "..."}``.

Why the standard library's ``http.server``: three paths, scraped every few seconds, by Prometheus
and the kubelet. A ``ThreadingHTTPServer`` in a daemon thread is enough, adds no dependency, and
never touches the owner thread: it only reads attributes (see processor.ops.metrics on why that is
safe). ``/metrics`` is encoded by prometheus-client's own exposition: ``choose_encoder`` picks the
Prometheus text format or OpenMetrics from the ``Accept`` header, the body is gzipped when the
scraper accepts it, and ``?name[]=...`` restricts the answer to the named series. It binds
127.0.0.1 unless told otherwise; in a pod, pass ``--metrics-addr 0.0.0.0`` so the kubelet and
Prometheus can reach it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from processor.apps.ride import BrokerWatch

log = logging.getLogger("tokenfabric.http")

#: Default ports: Prometheus exporters' customary 9464 for the processor, the next one for consumers.
PROCESSOR_PORT = 9464
CONSUMER_PORT = 9465
DEFAULT_ADDR = "127.0.0.1"
STEP_TIMEOUT_S = 30.0
BROKER_TIMEOUT_S = 60.0
RESTORE_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str

    def body(self) -> bytes:
        return (json.dumps({"ok": self.ok, "reason": self.reason}) + "\n").encode()


class HealthCheck(Protocol):
    def live(self) -> Verdict: ...

    def ready(self) -> Verdict: ...


class HealthView(Protocol):
    """What the checks read of a :class:`processor.apps.service.ProcessorService`."""

    last_step_s: float
    last_broker_ok_s: float
    ledger_error: str | None

    @property
    def restoring_since_s(self) -> float | None: ...

    @property
    def registry_down_since_s(self) -> float | None:
        """Since when ingest is held because the schema registry does not answer (None: it answers)."""
        ...


class ProcessorHealth:
    """The processor's checks; ``clock`` must be the service's (monotonic by default)."""

    def __init__(
        self,
        service: HealthView,
        step_timeout_s: float = STEP_TIMEOUT_S,
        broker_timeout_s: float = BROKER_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        restore_timeout_s: float = RESTORE_TIMEOUT_S,
    ) -> None:
        if not step_timeout_s > 0 or not broker_timeout_s > 0 or not restore_timeout_s > 0:
            raise ValueError("health timeouts must be > 0")
        self.restore_timeout_s = restore_timeout_s
        self.service = service
        self._born_step_s = service.last_step_s  # the service sets it when built; the loop, per step
        self.step_timeout_s = step_timeout_s
        self.broker_timeout_s = broker_timeout_s
        self.clock = clock

    def live(self) -> Verdict:
        restoring = self.service.restoring_since_s
        if restoring is not None:
            took = self.clock() - restoring
            if took > self.restore_timeout_s:
                return Verdict(False, f"restore stuck: {took:.1f} s (limit {self.restore_timeout_s:g} s)")
            return Verdict(True, f"restoring assigned partitions for {took:.1f} s")
        last = self.service.last_step_s
        age = self.clock() - last
        if last == self._born_step_s:
            return Verdict(False, f"starting: no step completed yet, {age:.1f} s after start")
        if age > self.step_timeout_s:
            return Verdict(
                False, f"owner loop stuck: last step {age:.1f} s ago (limit {self.step_timeout_s:g} s)"
            )
        return Verdict(True, f"last step {age:.1f} s ago")

    def ready(self) -> Verdict:
        live = self.live()
        if not live.ok or self.service.restoring_since_s is not None:
            return Verdict(False, live.reason)
        down = self.service.registry_down_since_s
        if down is not None:
            return Verdict(False, f"schema registry silent for {self.clock() - down:.1f} s: ingest held")
        error = self.service.ledger_error
        if error is not None:
            return Verdict(False, f"ledger check failed: {error}")
        age = self.clock() - self.service.last_broker_ok_s
        if age > self.broker_timeout_s:
            return Verdict(
                False, f"broker silent: last answer {age:.1f} s ago (limit {self.broker_timeout_s:g} s)"
            )
        return Verdict(True, f"broker answered {age:.1f} s ago, ledger balanced")


class ServingHealth:
    """For processes with nothing more to check (the consumer app): alive while the server answers."""

    def live(self) -> Verdict:
        return Verdict(True, "serving")

    def ready(self) -> Verdict:
        return Verdict(True, "serving")


class RideHealth:
    """``inner``'s checks while the broker answers; while it is away (processor.apps.ride), live and
    not ready: the process waits for it by itself, a restart would not bring it back sooner."""

    def __init__(self, inner: HealthCheck, watch: BrokerWatch) -> None:
        self.inner = inner
        self.watch = watch

    def live(self) -> Verdict:
        if not self.watch.reachable:
            return Verdict(True, f"waiting for Kafka: away for {self.watch.away_for_s():.0f} s")
        return self.inner.live()

    def ready(self) -> Verdict:
        if not self.watch.reachable:
            return Verdict(False, f"Kafka unreachable for {self.watch.away_for_s():.0f} s")
        return self.inner.ready()


class ObservabilityServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one address, in a daemon thread.

    ``port=0`` binds a free port (tests); :attr:`port` says which. ``close`` stops it.
    """

    def __init__(self, registry: CollectorRegistry, health: HealthCheck, addr: str, port: int) -> None:
        handler = _handler(registry, health)
        server_class = _Server6 if ":" in addr else _Server
        self.httpd = server_class((addr, port), handler)
        self.httpd.daemon_threads = True
        self.addr = addr
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-http", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class _Server(ThreadingHTTPServer):
    """A client that went away before its answer was written (a scrape that timed out while this
    process was paused, a probe's connection reset) is routine: one debug line, not the traceback
    ``socketserver`` prints to stderr for any error of a request. Other errors keep the traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        gone = sys.exc_info()[1]
        if isinstance(gone, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
            log.debug("client %s went away before its answer was written: %s", client_address, gone)
            return
        super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _handler(registry: CollectorRegistry, health: HealthCheck) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "tokenfabric"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            path = url.path
            if path == "/metrics":
                self._metrics(parse_qs(url.query).get("name[]"))
            elif path in ("/healthz", "/readyz"):
                verdict = health.live() if path == "/healthz" else health.ready()
                self._send(200 if verdict.ok else 503, "application/json", verdict.body())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz, /readyz\n")

        def _metrics(self, names: list[str] | None) -> None:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(_Only(registry, names) if names else registry)
            except Exception as exc:  # a collector bug must not kill the server: say it, answer 500
                log.exception("collecting metrics failed")
                self._send(500, "text/plain; charset=utf-8", f"collecting metrics failed: {exc}\n".encode())
                return
            gzipped = gzip_accepted(self.headers.get("Accept-Encoding", ""))
            self._send(200, content_type, gzip.compress(body) if gzipped else body, gzipped)

        def _send(self, code: int, content_type: str, body: bytes, gzipped: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes arrive every few seconds; the default handler would write each to stderr.
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


class _Only(Collector):
    """``registry`` restricted to the samples named in ``?name[]=`` (as prometheus-client's own
    server does; its ``restricted_registry`` misses collectors without a ``describe``)."""

    def __init__(self, registry: CollectorRegistry, names: list[str]) -> None:
        self.registry = registry
        self.names = set(names)

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            samples = [s for s in metric.samples if s.name in self.names]
            if samples:
                kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                kept.samples = samples
                yield kept


# -- command-line wiring ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpSettings:
    addr: str
    port: int
    explicit: bool
    """The port was given on the command line: failing to bind it is an error, not a warning."""
    step_timeout_s: float = STEP_TIMEOUT_S
    broker_timeout_s: float = BROKER_TIMEOUT_S


def add_http_arguments(p: argparse.ArgumentParser, default_port: int, *, health_checks: bool) -> None:
    """``--metrics-addr``, ``--metrics-port`` and, for the processor, the health check limits."""
    g = p.add_argument_group("metrics and health (docs/metrics.md)")
    g.add_argument(
        "--metrics-addr",
        default=DEFAULT_ADDR,
        metavar="ADDR",
        help=f"address of /metrics, /healthz, /readyz (default: {DEFAULT_ADDR}; 0.0.0.0 in a pod)",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help=f"their port (default: {default_port}, skipped with a warning if taken; 0: no server)",
    )
    if health_checks:
        g.add_argument(
            "--healthz-step-s",
            type=float,
            default=STEP_TIMEOUT_S,
            metavar="S",
            help=f"/healthz fails when the loop completed no step for S s (default: {STEP_TIMEOUT_S:g})",
        )
        g.add_argument(
            "--readyz-broker-s",
            type=float,
            default=BROKER_TIMEOUT_S,
            metavar="S",
            help=f"/readyz fails when the broker has not answered for S s (default: {BROKER_TIMEOUT_S:g})",
        )


def http_settings(args: argparse.Namespace, default_port: int) -> HttpSettings | None:
    """The server the flags ask for, or None for ``--metrics-port 0``; raises ValueError."""
    explicit = args.metrics_port is not None
    port = args.metrics_port if explicit else default_port
    if port == 0:
        return None
    if not 0 < port < 65536:
        raise ValueError(f"--metrics-port must be 0 (no server) or 1-65535, got {port}")
    step = getattr(args, "healthz_step_s", STEP_TIMEOUT_S)
    broker = getattr(args, "readyz_broker_s", BROKER_TIMEOUT_S)
    if not step > 0 or not broker > 0:
        raise ValueError("--healthz-step-s and --readyz-broker-s must be > 0")
    return HttpSettings(args.metrics_addr, port, explicit, step, broker)


def start_http(
    settings: HttpSettings | None, registry: CollectorRegistry, health: HealthCheck
) -> ObservabilityServer | None:
    """Start the server; a default port that is taken only warns (several consumers on one host).

    Raises OSError when a port given on the command line cannot be bound.
    """
    if settings is None:
        return None
    try:
        server = ObservabilityServer(registry, health, settings.addr, settings.port)
    except OSError as exc:
        if settings.explicit:
            raise OSError(
                f"--metrics-port {settings.port} on {settings.addr}: {exc.strerror or exc}"
            ) from exc
        log.warning(
            "metrics and health not served: %s:%d: %s (choose one with --metrics-port, 0 turns them off)",
            settings.addr,
            settings.port,
            exc.strerror or exc,
        )
        return None
    log.info("metrics on %s/metrics, health on /healthz and /readyz", server.url)
    return server
