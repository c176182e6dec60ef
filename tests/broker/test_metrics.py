"""Metrics and health of a real ProcessorService and ConsumerApp against the session broker: the scraped
counters match what was produced, and a processor that never steps fails /healthz."""

from __future__ import annotations

import json
import random
import time
import uuid

import pytest

from processor.core.contract import Contract
from processor.ops.consumer_metrics import ConsumerMetrics
from processor.ops.health import ObservabilityServer, ProcessorHealth, ServingHealth
from processor.ops.metrics import processor_registry
from tests.broker.rig import in_process, wait_for
from tests.common import get
from tests.ops.helpers import Samples, parse, value

pytestmark = pytest.mark.kafka


@pytest.mark.kafka
def test_scraped_counters_match_what_was_produced(kafka_bootstrap: str) -> None:
    from processor.apps.producer import TokenProducer, synthetic_tokens

    contract = Contract("gpu0", "default", budget_tokens=8192, max_items=32, pad_multiple=8, max_inflight=2)
    consumer_metrics = ConsumerMetrics(contract.consumer)
    rig = in_process(
        kafka_bootstrap,
        [contract],
        letter="m",
        app_options={"on_engine": consumer_metrics.engine_ran},
        instance="mtest",
        commit_interval_ms=300,
    )
    conf, topics, service, (app,) = rig.conf, rig.topics, rig.processor, rig.apps
    consumer_metrics.watch(app)
    proc_server = ObservabilityServer(processor_registry(service), ProcessorHealth(service), "127.0.0.1", 0)
    app_server = ObservabilityServer(consumer_metrics.registry, ServingHealth(), "127.0.0.1", 0)
    errors = rig.errors  # a thread's exception, re-raised by the assertion at the end
    rig.start()
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
            key = ("tokenfabric_completed_tokens_total", frozenset({("model", "default")}))
            return m.get(key, 0) >= total

        wait_for(all_done, 120, "every item to complete", poll_s=0.25)
        m = scrape()
        assert value(m, "tokenfabric_received_tokens_total", model="default") == total
        assert value(m, "tokenfabric_received_items_total", model="default") == len(lengths)
        assert value(m, "tokenfabric_completed_tokens_total", model="default") == total
        assert value(m, "tokenfabric_completed_items_total", model="default") == len(lengths)
        assert value(m, "tokenfabric_routed_tokens", model="default") == total
        assert value(m, "tokenfabric_queued_tokens", model="default") == 0
        assert value(m, "tokenfabric_in_flight_tokens", model="default") == 0
        assert value(m, "tokenfabric_consumer_real_tokens_total", consumer="gpu0") == total
        for equation in ("received", "routed"):
            assert value(m, "tokenfabric_ledger_imbalance_tokens", model="default", equation=equation) == 0
        assert value(m, "tokenfabric_ledger_ok") == 1
        assert value(m, "tokenfabric_ingest_messages_total") == len(lengths)
        assert value(m, "tokenfabric_dead_lettered_messages_total") == 0
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
            poll_s=0.25,
        )
        a = app_scrape()
        batches = value(m, "tokenfabric_consumer_routed_batches_total", consumer="gpu0")
        assert value(a, "tokenfabric_consumer_app_batches_total", **key) == batches
        assert value(a, "tokenfabric_consumer_app_input_tokens_total", **key) == total
        assert value(a, "tokenfabric_consumer_app_padded_tokens_total", **key) == value(
            m, "tokenfabric_consumer_padded_tokens_total", consumer="gpu0"
        )
        assert value(a, "tokenfabric_consumer_app_engine_seconds_count", consumer="gpu0") == batches

        assert get(proc_server.url + "/healthz")[0] == 200
        code, body = get(proc_server.url + "/readyz")
        assert code == 200, body
    finally:
        rig.close()
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
