"""Metrics and health: what /metrics, /healthz and /readyz say, checked against what was done.

The unit tests drive the real scheduling core behind a stand-in service (no Kafka) and read the
exposition text back through prometheus_client's own parser. The ``kafka`` tests run a real
ProcessorService and ConsumerApp in threads against the session broker, produce items, and check the
scraped counters against what was produced; then a processor that never steps fails /healthz.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from processor.apps.consumer import ConsumerApp
from processor.apps.observe import ServiceCounters, ServiceObserver
from processor.core.accounting import Ledger
from processor.core.contract import Contract
from processor.core.item import Item
from processor.core.scheduler import Scheduler
from processor.ops.health import (
    HttpSettings,
    ObservabilityServer,
    ProcessorHealth,
    ServingHealth,
    http_settings,
    start_http,
)
from processor.ops.metrics import ConsumerMetrics, processor_registry
from processor.sim.cardmodel import CardSpec

ROOT = Path(__file__).resolve().parent.parent
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# -- helpers ------------------------------------------------------------------------------------


@dataclass
class FakeService:
    """The attributes processor.ops.metrics and processor.ops.health read, around a real Scheduler."""

    core: Scheduler = field(default_factory=lambda: Scheduler(ledger=Ledger()))
    counters: ServiceCounters = field(default_factory=ServiceCounters)
    lag: dict[int, int] = field(default_factory=dict)
    last_step_s: float = field(default_factory=time.monotonic)
    last_broker_ok_s: float = field(default_factory=time.monotonic)
    ledger_error: str | None = None
    restoring_since_s: float | None = None
    observer: ServiceObserver = field(default_factory=ServiceObserver)
    clock_ms: int = 0

    def now_ms(self) -> int:
        return self.clock_ms


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} not exposed; have {sorted(n for n, _ in samples if name in n)}"
    return samples[key]


def read_registry(registry: CollectorRegistry) -> Samples:
    return parse(generate_latest(registry).decode())


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


# -- the collector on the real core -------------------------------------------------------------


def test_the_collector_reports_the_ledger_lanes_and_consumers() -> None:
    svc = FakeService()
    core = svc.core
    core.set_contract(Contract("card", "m1", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=1))
    lengths = {"m1": [100, 120, 130, 700], "m2": [50, 60]}
    for model, ls in lengths.items():
        for n, length in enumerate(ls):
            core.submit(Item(f"{model}-{n}", model, 0xA + n % 2, length, arrival_ms=1000 + n), 1000 + n)
    svc.clock_ms = 6000
    (batch,) = core.dispatch(2000)  # one slot: one batch, the rest waits
    for it in batch.items[:-1]:
        assert core.item_done(batch.batch_id, it.id, True, 2500) is False
    assert core.item_done(batch.batch_id, batch.items[-1].id, False, 2500) is True
    core.ledger.cache("card", True)
    svc.counters.consumed = 6
    svc.lag = {0: 3, 1: 0}
    registry = processor_registry(svc)
    svc.observer.committed(0.004)
    svc.observer.checkpointed(0.0002)

    m = read_registry(registry)
    for model, ls in lengths.items():
        assert value(m, "tokenfabric_tokens_received_total", model=model) == sum(ls)
        assert value(m, "tokenfabric_items_received_total", model=model) == len(ls)
    done = batch.items
    assert value(m, "tokenfabric_tokens_completed_total", model="m1") == sum(it.length for it in done[:-1])
    assert value(m, "tokenfabric_tokens_failed_total", model="m1") == done[-1].length
    assert value(m, "tokenfabric_tokens_routed", model="m1") == sum(it.length for it in done)
    waiting = sum(sum(ls) for ls in lengths.values()) - sum(it.length for it in done)
    assert value(m, "tokenfabric_waiting_tokens") == waiting
    assert value(m, "tokenfabric_tokens_queued", model="m1") + value(
        m, "tokenfabric_tokens_queued", model="m2"
    ) == (waiting)
    assert value(m, "tokenfabric_real_tokens_total", consumer="card") == batch.real_tokens
    assert value(m, "tokenfabric_padded_tokens_total", consumer="card") == batch.padded_tokens
    assert value(m, "tokenfabric_batches_total", consumer="card") == 1
    assert value(m, "tokenfabric_consumer_items_routed_total", consumer="card") == len(done)
    assert value(m, "tokenfabric_prefix_cache_hits_total", consumer="card") == 1
    assert value(m, "tokenfabric_prefix_cache_lookups_total", consumer="card") == 1
    assert value(m, "tokenfabric_consumer_free_slots", consumer="card", model="m1") == 1
    assert value(m, "tokenfabric_consumer_in_flight_batches", consumer="card", model="m1") == 0
    for model in lengths:
        for equation in ("received", "routed"):
            assert value(m, "tokenfabric_ledger_imbalance_tokens", model=model, equation=equation) == 0
    assert value(m, "tokenfabric_ledger_ok") == 1
    # m2 has no consumer: its first item (arrived at 1000 ms) has waited 5 s at 6000 ms.
    assert value(m, "tokenfabric_oldest_waiting_age_seconds", model="m2") == pytest.approx(5.0)
    assert value(m, "tokenfabric_lanes_in_use") == core.table.stats.lanes_in_use
    assert value(m, "tokenfabric_lane_budget") == core.table.settings.lane_budget
    assert value(m, "tokenfabric_lanes_new_total") == core.table.stats.new_lanes
    assert value(m, "tokenfabric_ingest_messages_total") == 6
    assert value(m, "tokenfabric_ingest_lag_messages", partition="0") == 3
    assert value(m, "tokenfabric_commit_seconds_count") == 1
    assert value(m, "tokenfabric_checkpoint_seconds_count") == 1
    assert value(m, "process_cpu_seconds_total") >= 0


def test_a_ledger_that_does_not_balance_reads_non_zero() -> None:
    svc = FakeService()
    svc.core.submit(Item("a", "m", 1, 100, 0), 0)
    svc.core.ledger.models["m"].queued.tokens -= 7  # a leak: tokens counted received, held nowhere
    m = read_registry(processor_registry(svc))
    assert value(m, "tokenfabric_ledger_imbalance_tokens", model="m", equation="received") == 7
    assert value(m, "tokenfabric_ledger_imbalance_tokens", model="m", equation="routed") == 0


def test_oldest_waiting_age_skips_dispatched_items() -> None:
    svc = FakeService()
    core = svc.core
    core.set_contract(Contract("c", "m", budget_tokens=1024, max_items=1, pad_multiple=8, max_inflight=1))
    core.submit(Item("old", "m", 1, 100, 0), 0)
    core.submit(Item("young", "m", 1, 100, 4000), 4000)
    (batch,) = core.dispatch(4000)
    assert [it.id for it in batch.items] == ["old"]
    svc.clock_ms = 10_000
    m = read_registry(processor_registry(svc))
    assert value(m, "tokenfabric_oldest_waiting_age_seconds", model="m") == pytest.approx(6.0)
    core.item_done(batch.batch_id, "old", True, 10_000)
    core.dispatch(10_000)  # "young" leaves too: nothing waits
    m = read_registry(processor_registry(svc))
    assert value(m, "tokenfabric_oldest_waiting_age_seconds", model="m") == 0


def test_consumer_app_metrics_read_the_apps_stats() -> None:
    from processor.engines.sim import SimEngine
    from processor.kafka.topics import TopicNames

    contract = Contract("card", "m", budget_tokens=4096, max_items=8)
    metrics = ConsumerMetrics("card")
    app = ConsumerApp(
        {"bootstrap.servers": "127.0.0.1:1"},
        TopicNames(),
        contract,
        SimEngine(CardSpec(), 0.0),
        on_engine=metrics.engine_ran,
    )
    metrics.watch(app)
    app.stats.ok, app.stats.rejected, app.stats.batches = 5, 2, 3
    app.stats.input_tokens, app.stats.padded_tokens, app.stats.cache_hits = 500, 640, 1
    metrics.engine_ran(0.02)
    m = read_registry(metrics.registry)
    key = {"consumer": "card", "model": "m"}
    assert value(m, "tokenfabric_consumer_app_items_total", status="ok", **key) == 5
    assert value(m, "tokenfabric_consumer_app_items_total", status="rejected", **key) == 2
    assert value(m, "tokenfabric_consumer_app_batches_total", **key) == 3
    assert value(m, "tokenfabric_consumer_app_padded_tokens_total", **key) == 640
    assert value(m, "tokenfabric_consumer_app_engine_seconds_count", consumer="card") == 1
    app.engine.close()


def test_docs_metrics_lists_every_metric_and_no_other() -> None:
    """docs/metrics.md is the reference: every exposed name is in its tables, and nothing else is."""
    svc = FakeService()
    svc.core.set_contract(Contract("c", "m", budget_tokens=1024, max_items=4))
    svc.core.submit(Item("a", "m", 1, 10, 0), 0)
    svc.core.dispatch(0)
    svc.lag = {0: 0}
    exposed = {
        f.name for f in text_string_to_metric_families(generate_latest(processor_registry(svc)).decode())
    }
    consumer = ConsumerMetrics("c")
    consumer.watch(ConsumerApp({}, _names(), Contract("c", "m", 1, 1), _NullEngine()))
    exposed |= {f.name for f in text_string_to_metric_families(generate_latest(consumer.registry).decode())}
    # prometheus_client adds a ``_created`` gauge per histogram (its start time): not ours to document
    ours = {n for n in exposed if n.startswith("tokenfabric_") and not n.endswith("_created")}
    text = (ROOT / "docs" / "metrics.md").read_text()
    documented = {n.removesuffix("_total") for n in re.findall(r"^\| `(tokenfabric_[a-z_]+)`", text, re.M)}
    assert ours - documented == set(), "exposed but not documented"
    assert documented - ours == set(), "documented but not exposed"


def _names():  # type: ignore[no-untyped-def]
    from processor.kafka.topics import TopicNames

    return TopicNames()


class _NullEngine:
    name = "null"

    def run(self, batch):  # type: ignore[no-untyped-def]
        return []

    def close(self) -> None:
        pass


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


# -- against a broker ---------------------------------------------------------------------------


@pytest.mark.kafka
def test_scraped_counters_match_what_was_produced(kafka_bootstrap: str) -> None:
    from processor.apps.observe import ProcessorSettings
    from processor.apps.producer import TokenProducer, synthetic_tokens
    from processor.apps.service import ProcessorService
    from processor.engines.sim import SimEngine
    from processor.kafka.topics import TopicNames, create_topics, topic_specs

    conf = {"bootstrap.servers": kafka_bootstrap}
    topics = TopicNames(f"m{uuid.uuid4().hex[:8]}")
    contract = Contract("gpu0", "default", budget_tokens=8192, max_items=32, pad_multiple=8, max_inflight=2)
    create_topics(conf, topic_specs(topics, ingest_partitions=3, consumers=[contract.consumer]))

    consumer_metrics = ConsumerMetrics(contract.consumer)
    app = ConsumerApp(
        conf,
        topics,
        contract,
        SimEngine(CardSpec(tokens_per_s=1e9, overhead_ms=0), 0.0),
        poll_timeout_s=0.05,
        on_engine=consumer_metrics.engine_ran,
    )
    consumer_metrics.watch(app)
    service = ProcessorService(
        conf,
        topics,
        ProcessorSettings(instance="mtest", group_id=f"{topics.prefix}-proc", commit_interval_ms=300),
    )
    proc_server = ObservabilityServer(processor_registry(service), ProcessorHealth(service), "127.0.0.1", 0)
    app_server = ObservabilityServer(consumer_metrics.registry, ServingHealth(), "127.0.0.1", 0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(target: Callable[[threading.Event], object]) -> Callable[[], None]:
        def body() -> None:
            try:
                target(stop)
            except BaseException as exc:  # re-raised by the assertion at the end
                errors.append(exc)
                stop.set()

        return body

    threads = [
        threading.Thread(target=guarded(f), name=n) for f, n in ((app.run, "app"), (service.run, "proc"))
    ]
    for t in threads:
        t.start()
    try:
        rng = random.Random(5)
        lengths = [rng.randint(20, 900) for _ in range(400)]
        with TokenProducer(conf, topics) as producer:
            for n, length in enumerate(lengths):
                item_id = f"x{n}"
                producer.send(item_id, "default", synthetic_tokens(item_id, length), components=[f"t{n % 3}"])
        total = sum(lengths)

        def scrape() -> Samples:
            code, text = get(proc_server.url + "/metrics")
            assert code == 200
            return parse(text)

        def all_done() -> bool:
            if errors:
                raise errors[0]
            m = scrape()
            key = ("tokenfabric_tokens_completed_total", frozenset({("model", "default")}))
            return m.get(key, 0) >= total

        wait_for(all_done, 120, "every item to complete")
        m = scrape()
        assert value(m, "tokenfabric_tokens_received_total", model="default") == total
        assert value(m, "tokenfabric_items_received_total", model="default") == len(lengths)
        assert value(m, "tokenfabric_tokens_completed_total", model="default") == total
        assert value(m, "tokenfabric_items_completed_total", model="default") == len(lengths)
        assert value(m, "tokenfabric_tokens_routed", model="default") == total
        assert value(m, "tokenfabric_tokens_queued", model="default") == 0
        assert value(m, "tokenfabric_tokens_in_flight", model="default") == 0
        assert value(m, "tokenfabric_waiting_tokens") == 0
        assert value(m, "tokenfabric_real_tokens_total", consumer="gpu0") == total
        for equation in ("received", "routed"):
            assert value(m, "tokenfabric_ledger_imbalance_tokens", model="default", equation=equation) == 0
        assert value(m, "tokenfabric_ledger_ok") == 1
        assert value(m, "tokenfabric_ingest_messages_total") == len(lengths)
        assert value(m, "tokenfabric_items_dead_lettered_total") == 0
        assert "tokenfabric_commit_seconds_count" in {name for name, _ in m}

        # The consumer app's own count agrees with the processor's.
        def app_scrape() -> Samples:
            return parse(get(app_server.url + "/metrics")[1])

        key = {"consumer": "gpu0", "model": "default"}
        wait_for(
            lambda: (
                app_scrape().get(
                    ("tokenfabric_consumer_app_items_total", frozenset({**key, "status": "ok"}.items())), 0
                )
                >= len(lengths)
            ),
            30,
            "the consumer app's counters",
        )
        a = app_scrape()
        batches = value(m, "tokenfabric_batches_total", consumer="gpu0")
        assert value(a, "tokenfabric_consumer_app_batches_total", **key) == batches
        assert value(a, "tokenfabric_consumer_app_input_tokens_total", **key) == total
        assert value(a, "tokenfabric_consumer_app_padded_tokens_total", **key) == value(
            m, "tokenfabric_padded_tokens_total", consumer="gpu0"
        )
        assert value(a, "tokenfabric_consumer_app_engine_seconds_count", consumer="gpu0") == batches

        assert get(proc_server.url + "/healthz")[0] == 200
        code, body = get(proc_server.url + "/readyz")
        assert code == 200, body
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        proc_server.close()
        app_server.close()
    assert not errors, f"a thread failed: {errors[0]!r}"


@pytest.mark.kafka
def test_a_processor_that_stops_stepping_fails_healthz(kafka_bootstrap: str) -> None:
    from processor.apps.observe import ProcessorSettings
    from processor.apps.service import ProcessorService
    from processor.kafka.topics import TopicNames

    topics = TopicNames(f"s{uuid.uuid4().hex[:8]}")
    service = ProcessorService(
        {"bootstrap.servers": kafka_bootstrap}, topics, ProcessorSettings(instance="stuck")
    )
    server = ObservabilityServer(
        processor_registry(service), ProcessorHealth(service, step_timeout_s=30), "127.0.0.1", 0
    )
    try:
        code, body = get(server.url + "/healthz")  # built, never run: still starting
        assert code == 503 and "starting" in json.loads(body)["reason"], body
        service.last_step_s = time.monotonic()  # as if a first step completed ...
        assert get(server.url + "/healthz")[0] == 200
        service.last_step_s = time.monotonic() - 45  # ... and the loop never came back
        code, body = get(server.url + "/healthz")
        assert code == 503, body
        assert "stuck" in json.loads(body)["reason"]
        assert get(server.url + "/readyz")[0] == 503
        assert value(parse(get(server.url + "/metrics")[1]), "tokenfabric_step_age_seconds") >= 45
    finally:
        server.close()
        service.ingest.close()
        service.control.close()
