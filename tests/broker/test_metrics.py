"""Metrics and health of a real ProcessorService and ConsumerApp against the session broker: the scraped
counters and histograms match what was produced, the Grafana dashboard's metrics are all in the live
scrapes, and a processor that never steps fails /healthz."""

from __future__ import annotations

import json
import random
import time
import uuid

import pytest
from prometheus_client import generate_latest

from processor.core.contract import Contract
from processor.ops.consumer_metrics import ConsumerMetrics
from processor.ops.health import ObservabilityServer, ProcessorHealth, ServingHealth
from processor.ops.kafka_stats import KafkaStats
from processor.ops.metrics import processor_registry
from tests.broker.rig import InProcess, new_topics, wait_for
from tests.common import get
from tests.k8s.test_dashboard import dashboard, queried
from tests.ops.helpers import OPENMETRICS_ACCEPT, Samples, parse, parse_openmetrics, value
from tests.ops.helpers import scrape as scrape_url

pytestmark = pytest.mark.kafka


@pytest.mark.kafka
def test_scraped_counters_match_what_was_produced(kafka_bootstrap: str) -> None:
    """The processor's and the consumer app's /metrics on a real pipeline: counters, histograms,
    librdkafka's statistics, OpenMetrics, and every metric the Grafana dashboard queries."""
    from processor.apps.producer import TokenProducer, synthetic_tokens
    from processor.apps.service import ProcessorService
    from processor.apps.settings import ProcessorSettings

    contract = Contract("gpu0", "default", budget_tokens=8192, max_items=32, pad_multiple=8, max_inflight=2)
    conf, topics = new_topics(kafka_bootstrap, "m", [contract.consumer])
    proc_stats = KafkaStats(interval_ms=500)
    settings = ProcessorSettings(group_id=f"{topics.prefix}-proc", instance="mtest", commit_interval_ms=300)
    service = ProcessorService(proc_stats.attach(conf), topics, settings)
    consumer_metrics = ConsumerMetrics(contract.consumer, stats_interval_ms=500)
    rig = InProcess(consumer_metrics.kafka_conf(conf), topics, service)
    app = rig.add_consumer(contract, **consumer_metrics.hooks())
    consumer_metrics.watch(app)
    registry = processor_registry(service, extra=[proc_stats])
    proc_server = ObservabilityServer(registry, ProcessorHealth(service), "127.0.0.1", 0)
    app_server = ObservabilityServer(consumer_metrics.registry, ServingHealth(), "127.0.0.1", 0)
    errors = rig.errors  # a thread's exception, re-raised by the assertion at the end
    rig.start()
    try:
        rng = random.Random(5)
        lengths = [rng.randint(20, 900) for _ in range(400)]
        unserved = 3  # items for a model no consumer serves: they wait
        with TokenProducer(conf, topics) as producer:
            for n, length in enumerate(lengths):
                item_id = f"x{n}"
                producer.send(item_id, "default", synthetic_tokens(item_id, length), components=[f"t{n % 3}"])
            for n in range(unserved):
                producer.send(f"u{n}", "nobody", synthetic_tokens(f"u{n}", 50))
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
        assert value(m, "tokenfabric_ingest_messages_total") == len(lengths) + unserved
        assert value(m, "tokenfabric_dead_lettered_messages_total") == 0
        assert value(m, "tokenfabric_unserved_waiting_items", model="nobody") == unserved
        assert "tokenfabric_commit_seconds_count" in {name for name, _ in m}
        # The histograms: every item waited once and was answered once, every batch counted once.
        batches = value(m, "tokenfabric_consumer_routed_batches_total", consumer="gpu0")
        assert value(m, "tokenfabric_item_queued_seconds_count", model="default") == len(lengths)
        assert value(m, "tokenfabric_item_in_flight_seconds_count", model="default") == len(lengths)
        assert value(m, "tokenfabric_batch_size_items_count", consumer="gpu0") == batches
        assert value(m, "tokenfabric_batch_size_items_sum", consumer="gpu0") == len(lengths)
        padded = value(m, "tokenfabric_consumer_padded_tokens_total", consumer="gpu0")
        assert value(m, "tokenfabric_consumer_padding_waste_ratio", consumer="gpu0") == pytest.approx(
            1 - total / padded
        )

        # The pipeline as status reads it, exported by the processor: the same figures as status.
        from processor.ops.status import gather, report

        completed = ("tokenfabric_pipeline_tokens", frozenset({("stage", "completed")}))
        wait_for(lambda: scrape().get(completed) == total, 30, "the pipeline view to catch up", poll_s=0.5)
        rep = report(gather(conf, topics, settings.group_id), topics)
        m = scrape()
        for stage, tally in rep.ledger.items():
            assert value(m, "tokenfabric_pipeline_tokens", stage=stage) == tally.tokens, stage
            assert value(m, "tokenfabric_pipeline_items", stage=stage) == tally.items, stage
        assert value(m, "tokenfabric_pipeline_unserved_items", model="nobody") == unserved
        assert value(m, "tokenfabric_pipeline_processor_stale", processor="mtest") == 0
        assert value(m, "tokenfabric_pipeline_ingest_partitions") == 3
        assert value(m, "tokenfabric_ingest_owned_partitions") == 3
        group_lag = [v for (name, _), v in m.items() if name == "tokenfabric_pipeline_ingest_lag_messages"]
        assert len(group_lag) == 3 and sum(group_lag) == rep.ingest.uncommitted_messages == 0

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
        assert value(a, "tokenfabric_consumer_app_batches_total", **key) == batches
        assert value(a, "tokenfabric_consumer_app_input_tokens_total", **key) == total
        assert value(a, "tokenfabric_consumer_app_padded_tokens_total", **key) == padded
        assert value(a, "tokenfabric_consumer_app_engine_seconds_count", consumer="gpu0") == batches
        assert value(a, "tokenfabric_consumer_app_end_to_end_seconds_count", consumer="gpu0") == len(lengths)

        # librdkafka's statistics arrive every 500 ms; then the app has read every batch: lag 0.
        def stats_in() -> bool:
            names = {name for name, _ in app_scrape()} & {name for name, _ in scrape()}
            return {
                "tokenfabric_kafka_broker_rtt_seconds",
                "tokenfabric_kafka_consumer_lag_messages",
            } <= names

        wait_for(stats_in, 30, "librdkafka statistics in both scrapes", poll_s=0.5)
        wait_for(
            lambda: app_scrape().get(("tokenfabric_consumer_app_lag_batches", frozenset(key.items()))) == 0,
            30,
            "the consumer app's lag to read 0",
            poll_s=0.5,
        )

        # Every metric the Grafana dashboard queries is a series of one of the two live scrapes, in
        # OpenMetrics as Prometheus asks for it (the strict parser rejects a malformed exposition).
        live = {
            name
            for server in (proc_server, app_server)
            for name, _ in parse_openmetrics(scrape_url(server.url + "/metrics", OPENMETRICS_ACCEPT).text)
        }
        missing = sorted(queried(dashboard()) - live)
        assert not missing, f"the dashboard queries metrics no scrape has: {missing}"

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
    from processor.apps.service import ProcessorService
    from processor.apps.settings import ProcessorSettings
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


@pytest.mark.kafka
def test_partitions_handed_to_a_second_instance_leave_the_first_ones_gauges(kafka_bootstrap: str) -> None:
    """p0 owns all four ingest partitions; p1 joins and the group gives it two. From then on p0's
    scrape has lag gauges (its own and librdkafka's) for its two partitions only."""
    from processor.apps.producer import TokenProducer, synthetic_tokens
    from processor.apps.service import ProcessorService
    from processor.apps.settings import ProcessorSettings
    from tests.broker.rig import Threads

    conf, topics = new_topics(kafka_bootstrap, "h", [], ingest_partitions=4)
    with TokenProducer(conf, topics) as producer:
        for n in range(40):
            producer.send(f"h{n}", "default", synthetic_tokens(f"h{n}", 30), shape=1 + n)  # every partition
    services, registries = {}, {}
    runner = Threads()
    for instance in ("p0", "p1"):
        stats = KafkaStats(interval_ms=300)
        settings = ProcessorSettings(
            group_id=f"{topics.prefix}-proc",
            instance=instance,
            commit_interval_ms=200,
            session_timeout_ms=6000,
        )
        services[instance] = ProcessorService(stats.attach(conf), topics, settings)
        registries[instance] = processor_registry(services[instance], extra=[stats])

    def partitions(instance: str, name: str, **labels: str) -> set[str]:
        m = parse(generate_latest(registries[instance]).decode())
        return {
            dict(key)["partition"]
            for (metric, key) in m
            if metric == name and labels.items() <= dict(key).items()
        }

    ingest = {"topic": topics.ingest}
    try:
        runner.start(services["p0"].run, "p0")
        wait_for(lambda: len(services["p0"].owned) == 4, 60, "p0 to own every partition")
        wait_for(
            lambda: len(partitions("p0", "tokenfabric_kafka_consumer_lag_messages", **ingest)) == 4,
            30,
            "p0's librdkafka lag on four partitions",
        )
        runner.start(services["p1"].run, "p1")
        wait_for(
            lambda: len(services["p0"].owned) == 2 and len(services["p1"].owned) == 2,
            60,
            "the partitions split between p0 and p1",
        )
        mine = {str(p) for p in services["p0"].owned}

        def only_mine() -> bool:
            if runner.errors:
                raise runner.errors[0]
            kafka = partitions("p0", "tokenfabric_kafka_consumer_lag_messages", **ingest)
            own = partitions("p0", "tokenfabric_ingest_lag_messages")
            return kafka == mine and own <= mine

        wait_for(only_mine, 10, "p0's lag gauges to drop the partitions it gave up", poll_s=0.3)
        m = parse(generate_latest(registries["p0"]).decode())
        assert value(m, "tokenfabric_ingest_owned_partitions") == 2
    finally:
        runner.join(60)
    assert not runner.errors, runner.errors
